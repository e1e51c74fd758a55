"""Suite `temporal`: what `strategy=temporal` costs over `single` at the same settings: wall time,
on the demo and on the real-shape proxy. Writes its own section of BENCHMARKS.md.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench temporal       # the full run (about 15 min)
    OMP_NUM_THREADS=1 .venv/bin/python -m bench temporal --quick --out /tmp/B.md   # a smoke run

Both strategies decode with the TSCV paper's settings (fixed schedule, block 32, steps L/2,
temperature 0), so `temporal` makes exactly `single`'s forward passes and commits (checked
here: equal NFE and equal tokens) and differs only in what it adds: at every step the
output head over every still-masked position of the whole generation region (the rules'
request for the block's positions is then served from those logits), the argmax, and
the answer of each changed prediction.

Demo: `tiny-arith` and `tiny-arith-dream`, the first `--questions` test problems, 16 rows
per pass, generation length 32 (the `dvoting_arith` task's), answers read as the harness
reads them (tokenizer decode up to the first end token, then the number).

Real shape: a random-weight LLaDA at LLaDA-8B's width (d_model 4096, 32 heads, MLP 12,288,
vocabulary 126,464) with `--layers` of its 32 layers, one row, prompt 32 + generation 64.
Random weights give no text, so the answer is read from the token ids written out as
numbers (`extract_answer` over 64 numbers: a parse of about the length of a real answer,
run at every step whose prediction changed; the tokenizer's decode is not in it). With one
layer of 32 the output head weighs 32x more than in the real model, so the extra head
work shows much more than it would there: the section also gives the ratio extrapolated
to 32 layers from the measured time per layer (an estimate, not a measurement).

The cells of a repeat alternate (single, temporal / temporal, single), so the drifting
load of the shared machine hits both alike; medians over the repeats. Results go to
`--json` as each cell finishes, the section between `<!-- temporal_bench:start -->` and
`<!-- temporal_bench:end -->` of `--out`.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from typing import Any, Callable

import torch

from bench.caches_bench import answer_extractor, demo_inputs
from bench.common import (
    RESULTS,
    add_output_flags,
    add_quick_flag,
    add_real_shape_arguments,
    add_threads_flag,
    args_record,
    command_line,
    load_average,
    load_json,
    markers,
    run_facts,
    save_json,
    write_section,
)
from bench.timing import TimedModel
from bench.workloads import random_llada, real_vocab_config
from lm_eval_dvoting.core.answers import extract_answer
from lm_eval_dvoting.core.strategies import StrategySettings, decode_questions

START, END = markers("temporal_bench")
STRATEGIES = ("single", "temporal")
FULL_DEPTH = 32  # LLaDA-8B's layers, for the extrapolated ratio
Results = dict[str, Any]


def settings_for(strategy: str, gen_length: int) -> StrategySettings:
    """The TSCV paper's settings, written out so that both strategies run them."""
    block = min(32, gen_length)
    return StrategySettings(
        strategy=strategy,
        gen_length=gen_length,
        block_length=block,
        steps=gen_length // 2,
        temperature=0.0,
    )


def run_once(
    model: TimedModel,
    prompts: list[torch.Tensor],
    extract: Callable[[torch.Tensor], Any],
    strategy: str,
    gen_length: int,
    max_rows: int,
) -> dict[str, Any]:
    """One decode of every prompt: wall, forward and head time, head calls, NFE, a token digest."""
    model.reset()
    start = time.perf_counter()
    results = decode_questions(
        model,
        prompts,
        settings_for(strategy, gen_length),
        extract,
        list(range(len(prompts))),
        max_rows=max_rows,
    )
    wall = time.perf_counter() - start
    digest = hashlib.sha256(b"".join(r.samples.numpy().tobytes() for r in results)).hexdigest()[:16]
    return {
        "wall": wall,
        "forward": model.seconds,
        "head": model.head_seconds,
        "head_calls": model.head_calls,
        "passes": model.passes,
        "nfe": sum(r.nfe for r in results) / len(results),
        "digest": digest,
    }


def run_pair(
    name: str,
    model: TimedModel,
    prompts: list[torch.Tensor],
    extract: Callable[[torch.Tensor], Any],
    gen_length: int,
    max_rows: int,
    repeats: int,
    results: Results,
    save: Callable[[], None],
) -> None:
    """`repeats` runs of each strategy, alternating which goes first."""
    run_once(model, prompts[:1], extract, "single", gen_length, 1)  # warm-up, not recorded
    cells = results.setdefault("cells", {}).setdefault(name, {s: [] for s in STRATEGIES})
    for repeat in range(repeats):
        for strategy in STRATEGIES if repeat % 2 == 0 else STRATEGIES[::-1]:
            run = run_once(model, prompts, extract, strategy, gen_length, max_rows)
            cells[strategy].append(run)
            print(
                f"  [{name}] {strategy:8s} {run['wall']:7.2f} s, NFE {run['nfe']:.1f}, "
                f"head calls {run['head_calls']}",
                flush=True,
            )
            save()


def demo_workloads(
    args: argparse.Namespace,
) -> list[tuple[str, TimedModel, list[torch.Tensor], Any, str]]:
    loads = []
    for name in args.models:
        inputs = demo_inputs(name, args.questions)
        prompts = [ids[mask.bool()] for ids, mask in zip(inputs["ids"], inputs["mask"])]
        extract = answer_extractor(inputs["tokenizer"], inputs["model"].end_token_ids)
        loads.append(
            (
                name,
                inputs["model"],
                prompts,
                extract,
                f"demo `{name}`, {len(prompts)} questions, "
                f"generation length {args.demo_gen_length}, {args.max_rows} rows per pass",
            )
        )
    return loads


def real_workload(args: argparse.Namespace) -> tuple[str, TimedModel, list[torch.Tensor], Any, str]:
    config = real_vocab_config(
        d_model=args.width, n_layers=args.layers, n_heads=args.heads, mlp=3 * args.width
    )
    model = TimedModel(random_llada(config, seed=1, std=0.05))
    prompt = torch.randint(
        0, 126_000, (args.prompt_length,), generator=torch.Generator().manual_seed(2)
    )

    def extract(
        tokens: torch.Tensor,
    ) -> str | None:  # a parse of about an answer's length (module docstring)
        return extract_answer(" ".join(map(str, tokens.tolist())), "number")

    return (
        "real-shape",
        model,
        [prompt],
        extract,
        f"random-weight LLaDA, d_model {args.width}, {args.layers} of 32 layers, {args.heads} "
        f"heads, MLP {3 * args.width}, vocabulary 126,464; one row, prompt {args.prompt_length} "
        f"+ generation {args.gen_length}",
    )


# ----------------------------------------------------------------- the section


def medians(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def extrapolated_ratio(cell: dict[str, list[dict[str, Any]]], layers: int) -> float:
    """temporal / single wall time if the model had FULL_DEPTH layers: each missing layer adds
    the measured time per layer of every pass (the forward time outside the head, over the
    layers) to both strategies alike."""
    single, temporal = cell["single"], cell["temporal"]
    per_layer = (medians(single, "forward") - medians(single, "head")) / layers
    extra = per_layer * (FULL_DEPTH - layers)
    return (medians(temporal, "wall") + extra) / (medians(single, "wall") + extra)


def paired_ratios(cell: dict[str, list[dict[str, Any]]]) -> list[float]:
    """temporal / single wall time within each repeat (the two ran back to back)."""
    return [t["wall"] / s["wall"] for s, t in zip(cell["single"], cell["temporal"])]


def table(results: Results) -> list[str]:
    lines = [
        "| workload | strategy | runs | wall s (median) | forward s | of it head s | head calls "
        "| NFE / question | temporal / single: median of repeats (range) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, cell in results["cells"].items():
        ratios = paired_ratios(cell)
        spread = f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
        for strategy in STRATEGIES:
            runs = cell[strategy]
            lines.append(
                f"| {name} | {strategy} | {len(runs)} | {medians(runs, 'wall'):.3f} | "
                f"{medians(runs, 'forward'):.3f} | {medians(runs, 'head'):.3f} | "
                f"{runs[0]['head_calls']} | {runs[0]['nfe']:.1f} | "
                f"{spread if strategy == 'temporal' else ''} |"
            )
    return lines


def same_decoding(cell: dict[str, list[dict[str, Any]]]) -> bool:
    """Equal NFE and tokens in every run of both strategies."""
    runs = cell["single"] + cell["temporal"]
    return len({(run["nfe"], run["digest"]) for run in runs}) == 1


def workload_lines(results: Results) -> list[str]:
    """Per workload: what it is and whether temporal decoded exactly as single; the
    real shape's ratio extrapolated to the full depth."""
    meta, cells = results["meta"], results["cells"]
    lines = [
        f"- {name}: {meta['workloads'][name]}; identical NFE and tokens in every run: "
        f"{'yes' if same_decoding(cell) else 'NO'}."
        for name, cell in cells.items()
    ]
    if "real-shape" in cells:
        layers = results["args"]["layers"]
        lines.append(
            f"- real shape extrapolated to {FULL_DEPTH} layers (each of the "
            f"{FULL_DEPTH - layers} missing layers adds single's measured time per layer to "
            f"both): temporal / single {extrapolated_ratio(cells['real-shape'], layers):.3f} "
            "(an estimate, not a measurement)."
        )
    return lines


def machine_lines(meta: Results) -> list[str]:
    return [
        "",
        "Machine and command:",
        "",
        f"- command: `{meta['command']}` (from the repository root)",
        *[f"- {k}: {v}" for k, v in meta["facts"].items()],
        f"- load average before: {meta['load_before']}, after: {meta.get('load_after')}; the 2 "
        "cores are shared with other work, so single runs vary by several percent (see the "
        "repeats in the JSON)",
        f"- wall time of the whole run: {meta.get('elapsed', 0) / 60:.1f} min",
    ]


def section(results: Results) -> list[str]:
    """The section between the markers: what runs, the table, each workload, the machine."""
    intro = [
        "## `strategy=temporal` against `single`: wall time at the same settings",
        "",
        "Written by `python -m bench temporal` (`bench/temporal_bench.py`; its docstring says "
        "what runs). Both strategies decode with the TSCV paper's settings (fixed schedule, "
        "block 32, steps L/2, temperature 0); `temporal` adds the output head over every "
        "still-masked position at each step (the rules then reuse those logits), the argmax "
        "and the answer of each changed prediction. Goal: within 5% of `single`.",
        "",
    ]
    return (
        [START]
        + intro
        + table(results)
        + [""]
        + workload_lines(results)
        + machine_lines(results["meta"])
        + [END]
    )


# ----------------------------------------------------------------- command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", nargs="+", default=["tiny-arith", "tiny-arith-dream"])
    p.add_argument("--questions", type=int, default=128)
    p.add_argument("--max-rows", type=int, default=16)
    p.add_argument("--demo-gen-length", type=int, default=32)
    p.add_argument(
        "--repeats", type=int, default=7, help="runs of each strategy on the demo (medians)"
    )
    p.add_argument(
        "--real-repeats", type=int, default=3, help="runs of each strategy at the real shape"
    )
    add_real_shape_arguments(p, prompt_length=32, gen_length=64)
    p.add_argument("--skip-real", action="store_true")
    add_quick_flag(p)
    add_threads_flag(p)
    add_output_flags(p, RESULTS / "temporal_bench.json")
    args = p.parse_args(argv)
    if args.quick:
        args.questions, args.repeats, args.real_repeats = 8, 2, 1
        args.width, args.heads, args.gen_length = 256, 4, 32
    return args


def start_results(args: argparse.Namespace, argv: list[str]) -> Results:
    """A fresh record of the command, the machine, the flags; workloads are added as they run."""
    command = "OMP_NUM_THREADS=1 " + command_line("temporal", argv)
    return {"meta": {**run_facts(command), "workloads": {}}, "args": args_record(args)}


def workloads(args: argparse.Namespace) -> list[tuple[Any, ...]]:
    """(name, model, prompts, extract, description, gen_length, max_rows, repeats) of each
    workload the flags ask for: the demo models, then the real-shape proxy."""
    loads = [
        (*load, args.demo_gen_length, args.max_rows, args.repeats) for load in demo_workloads(args)
    ]
    if not args.skip_real:
        loads.append((*real_workload(args), args.gen_length, 1, args.real_repeats))
    return loads


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.report_only:
        write_section(args.out, section(load_json(args.json)), START, END)
        return 0
    results = start_results(args, argv)
    began = time.perf_counter()

    def save() -> None:
        save_json(args.json, results)

    for name, model, prompts, extract, description, gen_length, max_rows, repeats in workloads(
        args
    ):
        results["meta"]["workloads"][name] = description
        run_pair(name, model, prompts, extract, gen_length, max_rows, repeats, results, save)
    results["meta"]["elapsed"] = time.perf_counter() - began
    results["meta"]["load_after"] = load_average()
    save()
    write_section(args.out, section(results), START, END)
    print("\n".join(table(results)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
