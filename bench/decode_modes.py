"""Suite `decode-modes`: whole decodes under each `cached_steps` mode, the threshold rule
among them (issue #43). `bench static-steps` times the fixed schedule's steps, whose reuse
passes keep their rows for a whole block; under the threshold rule at many rows the rows of
a pass change at many steps, which refills the static buffers and, under `graphs`, may
capture a new shape (each capture step cost 65-121 ms on an H200 where the pass held at most
2,048 queries, the most a captured pass now holds). This suite says which mode a
whole decode is fastest in, so that `cached_steps=auto` (graphs on CUDA) can be judged.

    # on the CPU (a tiny LLaDA: its times mean nothing; the tokens are checked)
    .venv/bin/python -m bench decode-modes --tiny --rows 1 4
    # on a lent GPU (bench/gpu_session.sh's `decode_modes` part): LLaDA-8B's shape, bfloat16
    python3 -m bench decode-modes --device cuda --json $OUT/decode_modes.json
    # here: the section from its JSON
    .venv/bin/python -m bench decode-modes --report-only --json FILE --section decode_modes_h200

The model and prompts are `bench fastdllm`'s (a random-weight LLaDA whose head gives logits
of spread `--logit-std`, so that the 0.9 threshold is met at some positions), and so are the
schedules: `threshold` (our `decoder=confidence`, threshold 0.9) and `fixed` (one token a
step). Cells: rows x schedule x cache (`prefix`, `dual`; `--caches` adds `none`, whose full
passes `graphs` captures too, up to 2,048 tokens) x mode (`dynamic`, `static`, and `graphs`
on a GPU; `--modes` adds `compiled`). Each cell runs one whole warm-up decode (the first
kernels' loading), then `--repeats` timed ones (the median and range kept; a GPU
synchronised around each).
Every mode's tokens are compared with `dynamic`'s, and NFE (passes per row, the mean over
rows) is recorded. Each decode builds its own decoder (`generate`), so each pays its own
captures, as a harness run pays one for every new shape of the reuse pass (rows, query
length, key width; `static_steps.py` keeps `GRAPHS_KEPT` of them) whose fill holds for two
steps (`CAPTURE_ON_STEADY_STEP`; a shape refilled at every step runs eagerly, and so does a
pass of more than `CAPTURE_TOKENS` queries): under `prefix` every block is a new shape (its
pass covers the rest of the answer, which shrinks), under `dual` a change in the number of
rows in the pass or in the spread of their blocks (the threshold rule at many rows, whose
rows finish blocks at different steps). A capture costs several steps (65-121 ms on an H200)
and the threshold rule's blocks take few steps, so each capture is replayed fewer times than
under the fixed schedule.
What it does not show: random weights (a real model's confidences, and so the threshold
rule's steps per block, differ); the harness's scheduler (rows entering as others finish).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from typing import Any, Iterator

import torch

from bench.common import (
    RESULTS,
    add_modes_flag,
    add_output_flags,
    add_section_flag,
    is_cuda,
    markers,
    refused_capture,
    run_or_report,
    save_json,
    step_modes,
    timed_call,
)
from bench.fastdllm_bench import cell_settings, llada_config, model_shape, our_model, random_prompts
from lm_eval_dvoting.core.decoding import generate as our_generate
from lm_eval_dvoting.core.decoding import static_steps
from lm_eval_dvoting.core.decoding.static_steps import CAPTURED

SECTION = "decode_modes"
Results = dict[str, Any]
SCHEDULES = ("threshold", "fixed")
CACHES = ("prefix", "dual", "none")  # none: its full passes captured under graphs too
DEFAULT_CACHES = ("prefix", "dual")


def timed_decode(model: Any, prompts: torch.Tensor, cache: str, kwargs: Results) -> Results:
    """One whole decode: its seconds (the GPU synchronised around it), tokens and NFE, and
    its reuse passes over static buffers and their refills (`counted_refills`)."""
    decode = lambda: our_generate(model, prompts, cache=cache, **kwargs)  # noqa: E731
    with counted_refills() as counts:
        seconds, result = timed_call(decode, prompts.device)
    found = {"seconds": seconds, "tokens": result.tokens.tolist(), "nfe": result.nfe.tolist()}
    return found | counts


@contextlib.contextmanager
def counted_refills() -> Iterator[dict[str, int]]:
    """Within it, the reuse passes over static buffers (`StaticSteps.run`: modes `static`,
    `graphs`, `compiled`) and the refills among them (`static_steps._fill`: the rows of the
    pass or what they keep changed, so every row's kept keys were copied in again, and a
    graph cannot be replayed at that step): how often a decode refills is the same on any
    device, so the CPU says it too."""
    counts = {"reuse_passes": 0, "refills": 0}
    run, fill = static_steps.StaticSteps.run, static_steps._fill

    def counted_run(self: Any, *args: Any) -> torch.Tensor:
        counts["reuse_passes"] += 1
        return run(self, *args)

    def counted_fill(*args: Any) -> None:
        counts["refills"] += 1
        fill(*args)

    static_steps.StaticSteps.run, static_steps._fill = counted_run, counted_fill
    try:
        yield counts
    finally:
        static_steps.StaticSteps.run, static_steps._fill = run, fill


def measure_cell(
    model: Any, prompts: torch.Tensor, cell: tuple[int, str, str, str], args: argparse.Namespace
) -> Results:
    """A cell's timed decodes after one warm-up decode; its tokens must repeat."""
    rows, schedule, cache, mode = cell
    model.cached_steps = mode
    _, ours = cell_settings(schedule, args, int(model.mask_token_id))
    batch = prompts[:rows]
    first = timed_decode(model, batch, cache, ours)  # the warm-up: the first kernels' loading
    runs = [timed_decode(model, batch, cache, ours) for _ in range(args.repeats)]
    seconds = [r["seconds"] for r in runs]
    return {
        "rows": rows,
        "schedule": schedule,
        "cache": cache,
        "mode": mode,
        "warm_up_s": first["seconds"],
        "seconds": seconds,
        "median_s": statistics.median(seconds),
        "nfe": statistics.fmean(first["nfe"]),
        "reuse_passes": first["reuse_passes"],
        "refills": first["refills"],
        "tokens": first["tokens"],
        "repeatable": all(r["tokens"] == first["tokens"] for r in runs),
    }


def cells(args: argparse.Namespace) -> list[tuple[int, str, str, str]]:
    """Every (rows, schedule, cache, mode), `dynamic` first in each group."""
    return [
        (rows, schedule, cache, mode)
        for rows in sorted(args.rows)
        for schedule in args.schedules
        for cache in args.caches
        for mode in step_modes(args)
    ]


def run(args: argparse.Namespace, results: Results) -> None:
    """Build the model and prompts, then every cell in turn (`--json` after each)."""
    shape = model_shape(args)
    dtype = getattr(torch, args.dtype or ("bfloat16" if is_cuda(args.device) else "float32"))
    config = llada_config(shape)
    model = our_model(config, args.logit_std, args.device, dtype)
    prompts = random_prompts(args, config["mask_token_id"], torch.device(args.device))
    results.update(shape=shape, dtype=str(dtype).removeprefix("torch."), cells=[])
    for cell in cells(args):
        results["cells"].append(measured_or_refused(model, prompts, cell, args))
        print(cell_line(results["cells"][-1]), flush=True)
        save_json(args.json, results)


def measured_or_refused(
    model: Any, prompts: torch.Tensor, cell: tuple[int, str, str, str], args: argparse.Namespace
) -> Results:
    """`measure_cell`, or the record of a capture `graphs` or `compiled` refused (said, the
    run goes on)."""
    try:
        return measure_cell(model, prompts, cell, args)
    except RuntimeError as error:
        if not refused_capture(error):
            raise  # anything else (out of memory, even inside a capture; a bug) stops the run
        rows, schedule, cache, mode = cell
        return {
            "rows": rows,
            "schedule": schedule,
            "cache": cache,
            "mode": mode,
            "refused": str(error),
        }


def cell_line(cell: Results) -> str:
    """One cell, as printed while the run goes."""
    name = f"{cell['rows']:>3} rows {cell['schedule']:>9} {cell['cache']:>6} {cell['mode']:>7}"
    if "refused" in cell:
        return f"{name}: {cell['refused']}"
    return (
        f"{name}: {cell['median_s']:.3f} s (warm-up {cell['warm_up_s']:.3f} s), "
        f"NFE {cell['nfe']:.1f}"
    )


# ------------------------------------------------------------------ the section


def _mode_seconds(cell: Results | None) -> str:
    """A mode's median (range) of seconds; or that it did not run or was refused."""
    if cell is None:
        return "not run"
    if "refused" in cell:
        return "refused (a capture failed)"
    spread = f"{min(cell['seconds']):.3f}-{max(cell['seconds']):.3f}"
    return f"{cell['median_s']:.3f} ({spread})"


def table(results: Results) -> list[str]:
    """One row per (rows, schedule, cache): each mode's median seconds, the fastest, and
    whether every mode gave `dynamic`'s tokens (and its own again)."""
    names = step_modes(results["args"])
    lines = [
        "| rows | schedule | cache | "
        + " | ".join(f"{m} s" for m in names)
        + " | fastest | NFE | refills / reuse passes | tokens as `dynamic`'s |",
        "|---:|---|---|" + "---:|" * len(names) + "---|---:|---|---|",
    ]
    groups: dict[tuple[int, str, str], dict[str, Results]] = {}
    for cell in results["cells"]:
        groups.setdefault((cell["rows"], cell["schedule"], cell["cache"]), {})[cell["mode"]] = cell
    for (rows, schedule, cache), by_mode in groups.items():
        ran = [m for m in names if m in by_mode and "refused" not in by_mode[m]]
        times = [_mode_seconds(by_mode.get(m)) for m in names]
        fastest = min(ran, key=lambda m: by_mode[m]["median_s"])
        dynamic = by_mode.get("dynamic", {}).get("tokens")
        same = all(by_mode[m]["tokens"] == dynamic and by_mode[m]["repeatable"] for m in ran)
        nfe = by_mode[ran[0]]["nfe"]
        lines.append(
            f"| {rows} | {schedule} | {cache} | "
            + " | ".join(times)
            + f" | {fastest} | {nfe:.1f} | {_refills(by_mode, ran)} | {'yes' if same else 'NO'} |"
        )
    return lines


def _refills(by_mode: dict[str, Results], ran: list[str]) -> str:
    """Each buffered mode's refills over its reuse passes in the first decode (`-`: none, or
    a run from before they were counted)."""
    said = [
        f"{mode} {by_mode[mode]['refills']}/{by_mode[mode]['reuse_passes']}"
        for mode in ran
        if mode != "dynamic" and "refills" in by_mode[mode]
    ]
    return "; ".join(said) or "-"


def warm_up_lines(results: Results) -> list[str]:
    """The warm-up decodes under `graphs` or `compiled` (none on the CPU): a first decode's
    extra cost (captures; under `compiled` its compilations too)."""
    warm = [c for c in results["cells"] if c["mode"] in CAPTURED and "refused" not in c]
    if not warm:
        return []
    said = ", ".join(
        f"{c['rows']} rows {c['schedule']} {c['cache']} {c['mode']} {c['warm_up_s']:.2f} s"
        for c in warm
    )
    return [f"The warm-up decodes under `graphs` and `compiled`: {said}.", ""]


def section(results: Results, name: str = SECTION) -> list[str]:
    """The run's section of BENCHMARKS.md, between the markers `name`."""
    meta, args, shape = results["meta"], results["args"], results["shape"]
    gpu = meta["facts"].get("gpu")
    where = f" on the {gpu}, {results['dtype']}" if gpu else f" on the CPU, {results['dtype']}"
    start, end = markers(name)
    return [
        start,
        f"## Whole decodes under each `cached_steps` mode (`decode-modes`){where}",
        "",
        f"Written by `python -m bench decode-modes`, {results['date']}: a random-weight LLaDA, "
        f"d_model {shape['d_model']}, {shape['n_layers']} layers, vocabulary "
        f"{shape['vocab_size']:,}, logit spread {args['logit_std']}; prompt "
        f"{args['prompt_length']} + answer {args['gen_length']}, block {args['block']}, "
        f"temperature 0; seconds per whole decode of all the rows, median (range) of "
        f"{args['repeats']} after one warm-up decode.",
        "",
        f"- command: `{meta['command']}`",
        *[f"- {key}: {value}" for key, value in meta["facts"].items()],
        "",
        *table(results),
        "",
        *warm_up_lines(results),
        "Each decode builds its decoder and pays its own captures, as a harness run does for "
        "each new shape of the reuse pass whose fill holds two steps (`prefix`: every block; "
        "`dual`: a change in the number of rows in the pass or the spread of their blocks). "
        "*Refills / reuse passes*: in a mode's first decode, the reuse passes over static "
        "buffers and how many of them found the rows of the pass, or what they keep, changed, "
        "so that every row's kept keys were copied in again and no graph could replay "
        "(`graphs` keeps two shapes' buffers, `static` one). "
        "What it does not show: random weights (a "
        "real model's confidences, and so the threshold rule's steps per block, differ); the "
        "harness's scheduler (rows entering as others finish).",
        end,
    ]


# ------------------------------------------------------------------ flags


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The flags."""
    p = argparse.ArgumentParser(prog="python -m bench decode-modes", description=__doc__)
    p.add_argument("--tiny", action="store_true", help="a tiny LLaDA and lengths, for the CPU")
    p.add_argument("--layers", type=int, help="layers (default: LLaDA-8B's 32, --tiny 2)")
    p.add_argument("--prompt-length", type=int, help="default 256 (--tiny 32)")
    p.add_argument("--gen-length", type=int, help="answer length, default 256 (--tiny 32)")
    p.add_argument("--block", type=int, help="block length, default 32 (--tiny 8)")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    p.add_argument("--caches", nargs="+", choices=CACHES, default=list(DEFAULT_CACHES))
    p.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES))
    p.add_argument("--threshold", type=float, default=0.9)
    p.add_argument("--logit-std", type=float, default=16.0, help="spread of the random logits")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=2, help="the prompts' seed")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--dtype", choices=("bfloat16", "float32"), help="bfloat16 on a GPU, else float32"
    )
    add_output_flags(p, RESULTS / "decode_modes.json")
    add_section_flag(p, SECTION)
    add_modes_flag(p)
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats {args.repeats}: give 1 or more (timed decodes per cell)")
    step_modes(args)  # a mode the device cannot run is refused before any model work
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the suite (or, with `--report-only`, only write its section from `--json`)."""
    argv = sys.argv[1:] if argv is None else argv
    return run_or_report("decode-modes", argv, parse_args(argv), run, section)
