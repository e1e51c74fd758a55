"""Suite `static-steps`: the reuse steps of `cache=prefix|dual` under each `cached_steps` mode
(`dynamic`: the kept keys concatenated at every step; `static`: buffers filled once per block;
`graphs`: the same, replayed as CUDA graphs, on a GPU only; `compiled`: compiled first, by
name only: `--modes`), against `cache=none` (eager, and under the modes that capture: its full
passes replayed).

    # on the CPU (the real-shape proxy: LLaDA-8B's width, --layers of its 32 layers)
    OMP_NUM_THREADS=2 .venv/bin/python -m bench static-steps --layers 2 --rows 1 4
    # on a lent GPU: the full shape in bfloat16 (with graphs)
    python3 -m bench static-steps --device cuda --dtype bfloat16 --layers 32 --rows 1 16 \\
        --json $OUT/static_steps_gpu.json
    # write BENCHMARKS.md's section from --json
    .venv/bin/python -m bench static-steps --report-only --json FILE

Each cell is one block of `single`'s fixed schedule (steps = the answer length: one commit a
step, so a block of B positions takes B steps: one full pass, then B-1 reuse passes), entered
with the earlier blocks pre-filled, in the first and in the last block; a random-weight LLaDA
at prompt 256 + answer 256, block 32. The cells of a repeat step round-robin (one step of each
in turn), so a drift of the machine's load hits every mode alike; a GPU is synchronised after
every step. Every mode's tokens at the end of its block are compared with `dynamic`'s (in
float32 they must be identical, `tests/test_static_steps.py`). Results go to `--json` after
every repeat; the section sits between `<!-- static_steps_bench:start/end -->`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import torch

from bench.caches_bench import entering_decoder
from bench.common import (
    RESULTS,
    add_modes_flag,
    add_output_flags,
    add_real_shape_arguments,
    add_section_flag,
    is_cuda,
    markers,
    refused_capture,
    run_or_report,
    save_json,
    step_modes,
    timed,
)
from bench.workloads import real_shape_workload
from lm_eval_dvoting.core.decoding import RowDecoder
from lm_eval_dvoting.core.decoding.static_steps import CAPTURE_ON_STEADY_STEP, CAPTURED

SECTION = "static_steps_bench"  # the markers' name; another run's section: --section
Results = dict[str, Any]
# A cell is a fresh decoder entering its block. Under `graphs` its first reuse step runs
# eagerly (the buffers' fill), the next captures (a warm-up pass, the capture, a checked
# replay: `CAPTURE_ON_STEADY_STEP`) and the later ones replay. A decode captures each shape
# once: under `dual` (all the rows entering their blocks together) its first block's shape
# is every block's, and every later block's reuse steps replay it, the first after its
# refill. So a `graphs` cell's reuse step is the mean of its replays, its step over a block
# is its full step with those replays (a later block of a decode), and its capture step is
# reported apart. Under `prefix` the pass covers the rest of the answer, so every block is
# a new shape and pays a capture that these figures leave out (its capture step is listed),
# where its pass holds at most `CAPTURE_TOKENS` queries (a larger one captures nothing: its
# "replays" are eager steps). Other modes: every step after the full one is a reuse step.
REPLAYS_FROM = CAPTURE_ON_STEADY_STEP + 1
CACHES = ("none", "prefix", "dual")


def cells(args: argparse.Namespace) -> list[tuple[str, str, int, int]]:
    """(cache, mode, rows, block index) of every cell; `none` under `dynamic` and the modes
    that capture, per rows and block."""
    last = args.gen_length // args.block - 1
    found = []
    caches = getattr(args, "caches", None) or CACHES
    for rows in args.rows:
        for block in (0, last):
            # `none` under each mode that captures (its full passes replayed: full_steps.py)
            found += [("none", m, rows, block) for m in step_modes(args) if m != "static"]
            found += [
                (cache, mode, rows, block)
                for cache in ("prefix", "dual")
                if cache in caches
                for mode in step_modes(args)
            ]
    return found


def _step(decoder: RowDecoder, device: str) -> float:
    """One decoder step's seconds (`timed`; one name here, which the tests replace)."""
    return timed(decoder.step, device)


def run_repeat(
    model: Any, prompt: torch.Tensor, args: argparse.Namespace, progress: Any = None
) -> Results:
    """One block of every cell; each cell's step times and final tokens. The cells of one
    rows count and block step round-robin; a group's decoders (and their buffers) are
    dropped before the next group starts, so a GPU holds one group's at a time. After each
    round of steps, `progress(cells so far)` (the run's partial record: a run stopped by a
    time limit keeps the steps it took, captures and compilations among them)."""
    found: Results = {}
    groups: dict[tuple[int, int], list[tuple[str, str]]] = {}
    for cache, mode, rows, block in cells(args):
        groups.setdefault((rows, block), []).append((cache, mode))
    for (rows, block), members in groups.items():
        if is_cuda(args.device):  # the peak of each group: its decoders' buffers side by side
            torch.cuda.reset_peak_memory_stats()
        decoders = {}
        for cache, mode in members:
            model.cached_steps = mode
            key = f"{cache}/{mode}/rows{rows}/block{block}"
            decoders[key] = entering_decoder(model, prompt, args, "fixed", cache, block, rows)
        kept = {key: list(decoder.active) for key, decoder in decoders.items()}
        times: dict[str, list[float]] = {key: [] for key in decoders}
        refused: dict[str, str] = {}
        for _ in range(args.block):  # one block: the fixed schedule commits one a step
            _step_round(decoders, times, refused, args.device)
            if progress is not None:
                progress({**found, **{key: {"steps": steps} for key, steps in times.items()}})
        peak = torch.cuda.max_memory_allocated() / 2**30 if is_cuda(args.device) else None
        for key, decoder in decoders.items():
            tokens = [row.tokens.tolist() for row in kept[key]]
            found[key] = {"steps": times[key], "tokens": tokens, "group_peak_gib": peak}
            found[key].update(graphs=graphs_held(decoder), **_refusal(refused, key))
    return found


def _step_round(
    decoders: dict[str, RowDecoder],
    times: dict[str, list[float]],
    refused: dict[str, str],
    device: str,
) -> None:
    """One step of every cell of a group not refused yet, its time into `times`; a refused
    capture into `refused` (said; the others go on), anything else raised."""
    for key, decoder in decoders.items():
        if key in refused:
            continue
        try:
            times[key].append(_step(decoder, device))
        except RuntimeError as error:  # a refused capture: said, the others go on
            if not refused_capture(error):
                raise  # anything else (out of memory, a bug) stops the run
            refused[key] = str(error)


def graphs_held(decoder: RowDecoder) -> int | None:
    """The CUDA graphs the cell's decoder holds at the block's end, of its reuse passes and
    (`none`) its full passes (None: no mode that captures)."""
    forward = decoder.forward
    held = [
        steps
        for steps in (forward.static_steps, forward.full_steps)
        if steps is not None and steps.mode in CAPTURED
    ]
    if not held:
        return None
    return sum(shape.graph is not None for steps in held for shape in steps.shapes.values())


def _refusal(refused: dict[str, str], key: str) -> dict[str, str]:
    return {"refused": refused[key]} if key in refused else {}


def run(args: argparse.Namespace, results: Results) -> None:
    work = real_shape_workload(args, args.device, getattr(torch, args.dtype))
    results["description"] = work.description
    prompt = work.prompts[0].to(args.device)
    if args.warm_up:  # the first steps on a GPU cost many times a later one
        model = work.model
        model.cached_steps = "dynamic"
        warm = entering_decoder(model, prompt, args, "fixed", "none", 0, max(args.rows))
        for _ in range(args.warm_up):
            _step(warm, args.device)
    repeats = results.setdefault("repeats", [])

    def keep_partial(cells_so_far: Results) -> None:
        results["partial_repeat"] = cells_so_far  # left out of the report
        save_json(args.json, results)

    for repeat in range(len(repeats), args.repeats):
        repeats.append(run_repeat(work.model, prompt, args, keep_partial))
        results.pop("partial_repeat", None)
        print(f"  [static-steps] repeat {repeat} done", flush=True)
        save_json(args.json, results)


# ----------------------------------------------------------------- the report


def reuse_steps(steps: list[float], mode: str) -> list[float]:
    """The steps of a cell's block that stand for its reuse steps (`REPLAYS_FROM`)."""
    return steps[REPLAYS_FROM:] if mode in CAPTURED else steps[1:]


def block_steps(steps: list[float], mode: str, cache: str = "dual") -> list[float]:
    """The steps of a block of a decode, from a cell's: under `graphs` or `compiled` its full
    step and its reuse steps at the replays' mean (a later block: no capture, no eager first
    step); for `none`, whose every pass has the one shape, every step at the replays' mean."""
    if mode not in CAPTURED:
        return steps
    replayed = statistics.mean(reuse_steps(steps, mode))
    if cache == "none":
        return [replayed] * len(steps)
    return [steps[0]] + [replayed] * (len(steps) - 1)


def cell_figures(results: Results) -> dict[str, dict[str, float]]:
    """Per cell: median over repeats of the mean reuse step (ms; `reuse_steps`) and of the
    mean step over a block (ms; `block_steps`), and whether its tokens are dynamic's."""
    figures: dict[str, dict[str, float]] = {}
    for key in results["repeats"][0]:
        if any("refused" in r[key] for r in results["repeats"]):
            continue  # `refusal_lines` says why
        cache, mode, rest = key.split("/", 2)
        steps = [r[key]["steps"] for r in results["repeats"]]
        reuse = [statistics.mean(reuse_steps(s, mode)) * 1e3 for s in steps]
        block = [statistics.mean(block_steps(s, mode, cache)) * 1e3 for s in steps]
        same = all(
            r[key]["tokens"] == r[f"{cache}/dynamic/{rest}"]["tokens"] for r in results["repeats"]
        )
        figures[key] = {
            "reuse": statistics.median(reuse),
            "reuse_spread": max(reuse) - min(reuse),
            "block": statistics.median(block),
            "same": same,
        }
    return figures


def table(results: Results) -> list[str]:
    """One row per cache and mode and rows: reuse step and step over the block (first and
    last block), and `none`'s step over the block divided by the cell's (mean of the two)."""
    figures = cell_figures(results)
    args = results["args"]
    last = args["gen_length"] // args["block"] - 1
    lines = [
        "| rows | cache | cached_steps | reuse step ms, block 1 / last | step over a block ms, "
        "1 / last | none/cell per step | tokens as `dynamic`'s |",
        "|---:|---|---|---:|---:|---:|---|",
    ]
    for rows in args["rows"]:
        none = [figures[f"none/dynamic/rows{rows}/block{b}"]["block"] for b in (0, last)]
        for key in [k for k in figures if f"/rows{rows}/block0" in k]:
            cache, mode, _ = key.split("/", 2)
            if key.replace("/block0", f"/block{last}") not in figures:
                continue
            pair = [figures[key.replace("/block0", f"/block{b}")] for b in (0, last)]
            reuse = " / ".join(f"{p['reuse']:.1f}" for p in pair) if cache != "none" else "-"
            blocks = " / ".join(f"{p['block']:.1f}" for p in pair)
            ratio = statistics.mean(none) / statistics.mean(p["block"] for p in pair)
            same = "yes" if all(p["same"] for p in pair) else "NO"
            lines.append(
                f"| {rows} | {cache} | {mode} | {reuse} | {blocks} | {ratio:.2f}x | {same} |"
            )
    return lines


def _benchmark_like(busy: list[str]) -> list[str]:
    """The busy processes that explain noise here (Python jobs), not the sandbox's own."""
    return [process.strip() for process in busy if "python" in process]


def peak_lines(results: Results) -> list[str]:
    """The GPU's peak memory while each (rows, block) group of cells ran (none on the CPU)."""
    peaks = {
        key.split("/", 2)[2]: cell["group_peak_gib"]
        for key, cell in results["repeats"][0].items()
        if cell.get("group_peak_gib") is not None
    }
    if not peaks:
        return []
    listed = ", ".join(f"{group} {gib:.1f} GiB" for group, gib in peaks.items())
    return [
        "",
        f"Peak GPU memory while each group of cells ran (all its modes' decoders): {listed}.",
    ]


def capture_step(cell: Results) -> float:
    """A `graphs` cell's step that captured its graph (seconds)."""
    return cell["steps"][CAPTURE_ON_STEADY_STEP]


def graph_lines(results: Results) -> list[str]:
    """The graphs each `graphs` or `compiled` cell held at its block's end and its capture
    step, and the cells whose capture was refused (`cached_steps=graphs|compiled` raises:
    the bench goes on with the other cells)."""
    cells = results["repeats"][0]
    held = [
        f"{key} {cell['graphs']} (capture step {1e3 * capture_step(cell):.0f} ms)"
        for key, cell in cells.items()
        if cell.get("graphs") and len(cell["steps"]) > CAPTURE_ON_STEADY_STEP
    ]
    refused = [
        f"- refused, {key}: {cell['refused']}"
        for r in results["repeats"]
        for key, cell in r.items()
        if "refused" in cell
    ]
    lines = (
        [
            "",
            "CUDA graphs held at the block's end, and the step that captured them (a warm-up "
            "pass, the capture and a checked replay; a decode pays it once per shape: under "
            "`dual` once, in its first block; under `prefix` in every block whose pass holds at "
            "most `CAPTURE_TOKENS` queries (it covers the rest of the answer), a cost the step "
            "figures above leave out), first repeat: "
            f"{', '.join(held)}.",
        ]
        if held
        else []
    )
    lines += uncaptured_lines(cells)
    return lines + (
        ["", "Cells that stopped (left out of the table):", *refused] if refused else []
    )


def uncaptured_lines(cells: Results) -> list[str]:
    """The capturing cells that captured nothing (and were not refused)."""
    none_held = [
        key for key, cell in cells.items() if cell.get("graphs") == 0 and "refused" not in cell
    ]
    if not none_held:
        return []
    return [
        "",
        "Cells that captured nothing (a pass over more than `CAPTURE_TOKENS` queries, rows x "
        "pass length, runs eagerly; or too few steps), whose reuse steps are eager ones: "
        + ", ".join(none_held)
        + ".",
    ]


TERMS = (
    "*reuse step*: a step whose pass reuses the kept keys and values (all but the block's "
    "first; under `graphs` its replays only); *step over a block*: the mean over the "
    "block's steps, its full first pass included, which is what a question costs per step "
    "(under `graphs` a later block of a decode: the full step and the replays, the capture "
    "listed below); *none/cell*: `cache=none`'s step over the block under `dynamic` "
    "(eager) divided by the cell's (`none` under `graphs` or `compiled`: its full passes "
    "replayed, every step at the replays' mean)."
)


def section(results: Results, name: str = SECTION) -> list[str]:
    """The run's section of BENCHMARKS.md, between the markers `name`."""
    if not results.get("repeats"):
        raise SystemExit(
            "static-steps: the run ended before its first whole repeat, so there is no "
            "section to write; the steps it took are under `partial_repeat` in its JSON"
        )
    meta = results["meta"]
    spread = max(
        figure["reuse_spread"] / max(figure["reuse"], 1e-9)
        for figure in cell_figures(results).values()
    )
    busy = ", ".join(_benchmark_like(meta["busy"]))
    start, end = markers(name)
    return [
        start,
        "## Static-shape cached steps and CUDA graphs (`cached_steps`)" + machine_title(results),
        "",
        f"Written by `python -m bench static-steps`: {results['description']}; prompt "
        f"{results['args']['prompt_length']} + answer {results['args']['gen_length']}, block "
        f"{results['args']['block']}, `single`'s fixed schedule (one commit a step), medians of "
        f"{len(results['repeats'])} repeat(s) (largest spread of a reuse step: "
        f"{spread:.0%} of its median).",
        "",
        f"- command: `{meta['command']}`",
        *[f"- {name}: {value}" for name, value in meta["facts"].items()],
        f"- load average before: {meta['load_before']}; busy: {busy or '-'}",
        "",
        *table(results),
        *peak_lines(results),
        *graph_lines(results),
        "",
        TERMS,
        "",
        "What it does not show: random weights; the layers given (the proxy's other layers "
        "would add the same per-layer work to every mode); one rule (the fixed schedule: the "
        "threshold rules change the rows of the reuse pass more often, which refills the "
        "buffers and, with graphs, may capture new shapes).",
        end,
    ]


def machine_title(results: Results) -> str:
    """The GPU and dtype a run measured, for its title (nothing for a CPU run)."""
    gpu = results["meta"]["facts"].get("gpu")
    return f" on the {gpu}, {results['args']['dtype']}" if gpu else ""


def main(argv: list[str] | None = None) -> int:
    """Run the suite (or, with `--report-only`, only write its section from `--json`)."""
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench static-steps", description=__doc__)
    add_real_shape_arguments(p, prompt_length=256, gen_length=256)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warm-up", type=int, default=0, help="untimed steps first (GPU: 5)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    add_output_flags(p, RESULTS / "static_steps_bench.json")
    add_section_flag(p, SECTION)
    add_modes_flag(p)
    p.add_argument(
        "--caches",
        nargs="+",
        choices=CACHES[1:],
        default=list(CACHES[1:]),
        help="the cached cells (default prefix dual; `none`, what each is compared with, "
        "always runs)",
    )
    args = p.parse_args(argv)
    # refused before any model work: a mode the device cannot run, and a block too short
    # for a capturing mode's cell to replay (its reuse step is the mean of its replays)
    captured = [mode for mode in step_modes(args) if mode in CAPTURED]
    if captured and args.block <= REPLAYS_FROM:
        p.error(
            f"--block {args.block}: under {' and '.join(captured)} a cell's first "
            f"{REPLAYS_FROM} steps run eagerly or capture; give --block {REPLAYS_FROM + 1} or more"
        )
    return run_or_report("static-steps", argv, args, run, section)


if __name__ == "__main__":
    raise SystemExit(main())
