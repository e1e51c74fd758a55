"""Suite `step-profile`: where one cached reuse step's time goes, kernel by kernel. Issue #43's
one-row `dual` step under CUDA graphs took 9.4 ms on an H200 against a weight-read floor of
3.1-3.5 ms; this suite says which kernels that time is in, so that a change (a fused layer,
fused projections) can be aimed at them and measured.

    # on the CPU: the operators of a reuse step (each a kernel launch on a GPU), per layer too
    .venv/bin/python -m bench step-profile --layers 2
    # a step without a cache (a full pass over prompt and answer): --cache none
    # on a lent GPU (bench/gpu_session.sh's `step_profile` part): LLaDA-8B's shape in bfloat16
    python3 -m bench step-profile --device cuda --dtype bfloat16 --layers 32 \\
        --json $OUT/step_profile.json
    # here: the section from its JSON
    .venv/bin/python -m bench step-profile --report-only --json FILE --section step_profile_h200

A decoder of `single`'s fixed schedule enters the answer's first block under
`cached_steps=static` (eager, so that the profiler sees every kernel) and steps until its
reuse passes are steady; then `--profile-steps` reuse steps run under `torch.profiler`: on a
GPU its CUDA kernels (name, calls, time on the device), on the CPU the top-level `aten::`
operators, views left out (`bench.common.top_operators`). Each is put in a category by its
name: matrix products, attention, and the rest (norms, rotary embedding, casts, residual
adds, the buffers' writes, the commit rule's softmax and arg-max: a step is the decoder's,
not the model's pass alone). Beside them, the wall time of a reuse step under `static` and, on
a GPU, under `graphs` (the same kernels replayed: what a decode pays) and, with `--compiled`,
under `compiled` (the pass compiled by torch.compile, then replayed), the medians of
`--timed-steps`. The operators per layer come from two tiny models of the same lengths, 1
and 2 layers, under `static`: their difference (the count does not depend on the width).
What it does not show: the profiler's own overhead (the wall times are measured apart, without
it); the graphs' kernels one by one (a replay is one launch to the profiler, so the kernels
are those of the eager `static` step, which a replay runs too).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from bench.caches_bench import entering_decoder
from bench.common import (
    RESULTS,
    add_output_flags,
    add_real_shape_arguments,
    add_section_flag,
    is_cuda,
    markers,
    run_or_report,
    timed,
    top_operators,
)
from bench.workloads import real_shape_workload
from lm_eval_dvoting.core.decoding import RowDecoder
from lm_eval_dvoting.core.decoding.static_steps import CAPTURE_ON_STEADY_STEP

SECTION = "step_profile"
Results = dict[str, Any]
# the full pass, then the reuse steps up to the first replay of a captured graph
STEADY_STEPS = 1 + CAPTURE_ON_STEADY_STEP + 1
# a kernel's or operator's category, by the first pattern its lower-cased name contains
CATEGORIES = (
    ("matmul", ("gemm", "gemv", "nvjet", "xmma", "linear", "aten::mm", "aten::addmm", "bmm")),
    ("attention", ("attention", "fmha", "flash", "attn", "sdpa")),
)
OTHER = "other (norms, rotary, casts, adds, copies, the rule's)"


def category(name: str) -> str:
    """Which of `CATEGORIES` a kernel or operator name belongs to, else `OTHER`."""
    lowered = name.lower()
    for label, patterns in CATEGORIES:
        if any(pattern in lowered for pattern in patterns):
            return label
    return OTHER


def steady_decoder(
    model: Any, prompt: torch.Tensor, args: argparse.Namespace, mode: str
) -> RowDecoder:
    """A decoder in the answer's first block under `cached_steps=mode`, stepped until its
    reuse passes are steady (buffers filled; under `graphs` the graph captured and replayed)."""
    model.cached_steps = mode
    decoder = entering_decoder(model, prompt, args, "fixed", args.cache, 0, args.rows)
    for _ in range(STEADY_STEPS):
        decoder.step()
    return decoder


def kernels_per_step(decoder: RowDecoder, steps: int, device: str) -> list[Results]:
    """Per kernel name (CUDA) or top-level operator (CPU): calls and microseconds per step,
    most time first."""
    if is_cuda(device):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as run:
            for _ in range(steps):
                decoder.step()
            torch.cuda.synchronize()
        events = [e for e in run.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    else:
        events = top_operators(lambda: [decoder.step() for _ in range(steps)])
    calls: collections.Counter[str] = collections.Counter()
    micros: collections.Counter[str] = collections.Counter()
    for event in events:
        calls[event.name] += 1
        micros[event.name] += event.time_range.elapsed_us()
    found = [
        {"name": name, "category": category(name), "calls": n / steps, "us": micros[name] / steps}
        for name, n in calls.items()
    ]
    return sorted(found, key=lambda k: -k["us"])


def wall_ms(decoder: RowDecoder, steps: int, device: str) -> float:
    """The median wall time of `steps` reuse steps (ms), the GPU waited for at each edge."""
    return statistics.median(timed(decoder.step, device) for _ in range(steps)) * 1e3


def operators_per_layer(args: argparse.Namespace) -> dict[str, float]:
    """The top-level operators a reuse step adds per layer, by name: a 2-layer tiny model's
    count minus a 1-layer one's, at the run's lengths, cache, rows and dtype (on the CPU: the
    count is the same on a GPU, where each is a kernel launch or more)."""
    counts = []
    for layers in (1, 2):
        tiny = argparse.Namespace(**{**vars(args), "layers": layers, "width": 64, "heads": 4})
        work = real_shape_workload(tiny, "cpu", getattr(torch, args.dtype))
        decoder = steady_decoder(work.model, work.prompts[0], tiny, "static")
        counts.append(collections.Counter(e.name for e in top_operators(decoder.step)))
    return {name: float(n) for name, n in sorted((counts[1] - counts[0]).items())}


def weight_gb(model: torch.nn.Module) -> float:
    """The gigabytes of parameters a pass reads: all but the embedding tables' (a gather
    reads a few rows; LLaDA-8B's output head is a separate matrix, read whole)."""
    gathered = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    read = [p.numel() * p.element_size() for p in model.parameters() if id(p) not in gathered]
    return sum(read) / 1e9


def wall_modes(args: argparse.Namespace) -> list[str]:
    """The modes a step's wall time is measured under: `static` (for `none`: its eager full
    pass); on a GPU also `graphs` (for `none`: its full passes captured, `full_steps.py`)
    and, with `--compiled`, `compiled`."""
    if not is_cuda(args.device):
        return ["static"]
    return ["static", "graphs"] + (["compiled"] if args.compiled else [])


def run(args: argparse.Namespace, results: Results) -> None:
    """Profile a steady reuse step, time it under each mode (each a fresh decoder, timed at
    the same steps of the block), count a layer's operators; into `results`."""
    work = real_shape_workload(args, args.device, getattr(torch, args.dtype))
    results["description"] = work.description
    results["weights_gb"] = weight_gb(work.model)
    prompt = work.prompts[0].to(args.device)
    profiled = steady_decoder(work.model, prompt, args, "static")
    results["kernels"] = kernels_per_step(profiled, args.profile_steps, args.device)
    del profiled  # on a GPU its buffers would sit beside the timed decoders'
    results["wall_ms"] = {}
    for mode in wall_modes(args):
        timed_decoder = steady_decoder(work.model, prompt, args, mode)
        results["wall_ms"][mode] = wall_ms(timed_decoder, args.timed_steps, args.device)
    results["operators_per_layer"] = operators_per_layer(args)


# ------------------------------------------------------------------ the section


def category_rows(results: Results) -> list[str]:
    """Kernels (operators on the CPU) and their time per reuse step, by category."""
    unit = "kernels" if is_cuda(results["args"]["device"]) else "operators"
    total = sum(k["us"] for k in results["kernels"]) or 1.0
    rows = [
        f"| category | {unit} per step | ms per step | share of their time |",
        "|---|---:|---:|---:|",
    ]
    for label in [c for c, _ in CATEGORIES] + [OTHER]:
        mine = [k for k in results["kernels"] if k["category"] == label]
        us = sum(k["us"] for k in mine)
        calls = sum(k["calls"] for k in mine)
        rows.append(f"| {label} | {calls:.0f} | {us / 1e3:.2f} | {us / total:.0%} |")
    calls = sum(k["calls"] for k in results["kernels"])
    rows.append(f"| all | {calls:.0f} | {total / 1e3:.2f} | 100% |")
    return rows


def top_rows(results: Results, count: int = 12) -> list[str]:
    """The `count` kernels (operators) with the most time per step."""
    rows = ["| name | category | calls per step | µs per step |", "|---|---|---:|---:|"]
    for k in results["kernels"][:count]:
        name = k["name"] if len(k["name"]) <= 70 else k["name"][:67] + "..."
        rows.append(f"| `{name}` | {k['category']} | {k['calls']:.0f} | {k['us']:.0f} |")
    return rows


def step_kind(cache: str) -> str:
    """What a steady step of `cache` is: a reuse step, or (`none`) a full pass."""
    return "full step (no cache)" if cache == "none" else "reuse step"


def summary_lines(results: Results) -> list[str]:
    """The step's wall times, the bytes a pass reads and the operators per layer."""
    args, wall = results["args"], results["wall_ms"]
    per_layer = results["operators_per_layer"]
    graphs = "".join(
        f", under `{mode}` {wall[mode]:.2f} ms" for mode in ("graphs", "compiled") if mode in wall
    )
    mode = " eagerly" if args["cache"] == "none" else " under `static`"  # none: no buffers
    return [
        f"- a {step_kind(args['cache'])} of `cache={args['cache']}` at {args['rows']} row(s): "
        f"{wall['static']:.2f} ms wall{mode}{graphs} (medians of {args['timed_steps']} steps, "
        "no profiler)",
        f"- parameters a pass reads (the embedding table left out): {results['weights_gb']:.2f} GB",
        f"- top-level operators a layer adds to a {step_kind(args['cache'])} (views left out; "
        f"from 1- and 2-layer tiny models): {sum(per_layer.values()):.0f}: "
        + ", ".join(f"{name.removeprefix('aten::')} {n:.0f}" for name, n in per_layer.items()),
    ]


def section(results: Results, name: str = SECTION) -> list[str]:
    """The run's section of BENCHMARKS.md, between the markers `name`."""
    meta, args = results["meta"], results["args"]
    gpu = meta["facts"].get("gpu")
    where = f" on the {gpu}, {args['dtype']}" if gpu else f" on the CPU, {args['dtype']}"
    start, end = markers(name)
    return [
        start,
        f"## One {step_kind(args['cache'])} of `cache={args['cache']}`, kernel by kernel "
        f"(`step-profile`){where}",
        "",
        f"Written by `python -m bench step-profile`: {results['description']}; prompt "
        f"{args['prompt_length']} + answer {args['gen_length']}, block {args['block']}, the "
        f"first block, `single`'s fixed schedule; {args['profile_steps']} steady steps "
        "profiled under `cached_steps=static` (eager: every kernel seen).",
        "",
        f"- command: `{meta['command']}`",
        *[f"- {key}: {value}" for key, value in meta["facts"].items()],
        *summary_lines(results),
        "",
        *category_rows(results),
        "",
        *top_rows(results),
        "",
        "What it does not show: the profiler's overhead on the kernels' times (small on a GPU, "
        "large on the CPU, where the times are the operators' own and include their children); "
        "a graph replay's kernels one by one (the same kernels as the `static` step's); gaps "
        "between kernels (the wall time minus the kernels' time, where the step is serial).",
        end,
    ]


# ------------------------------------------------------------------ flags


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The flags; a block too short for the steps the run takes is refused here, first."""
    p = argparse.ArgumentParser(prog="python -m bench step-profile", description=__doc__)
    add_real_shape_arguments(p, prompt_length=256, gen_length=256)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument(
        "--cache",
        choices=("none", "prefix", "dual"),
        default="dual",
        help="dual (default), prefix, or none: every step a full pass",
    )
    p.add_argument("--profile-steps", type=int, default=3, help="reuse steps profiled")
    p.add_argument("--timed-steps", type=int, default=8, help="reuse steps timed per mode")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    add_output_flags(p, RESULTS / "step_profile.json")
    add_section_flag(p, SECTION)
    p.add_argument(
        "--compiled",
        action="store_true",
        help="on a GPU, also time the step under cached_steps=compiled (the pass compiled by "
        "torch.compile first: a minute or more at LLaDA-8B's shape)",
    )
    args = p.parse_args(argv)
    if args.compiled and not is_cuda(args.device):
        p.error(f"--compiled needs a CUDA device, got --device {args.device}")
    needed = STEADY_STEPS + max(args.profile_steps, args.timed_steps)
    if args.block < needed:
        p.error(
            f"--block {args.block}: a decoder steps up to {needed} times in one block "
            f"({STEADY_STEPS} to get steady, then --profile-steps {args.profile_steps} or "
            f"--timed-steps {args.timed_steps}); give --block {needed} or more, or fewer steps"
        )
    if args.gen_length % args.block:
        p.error(f"--gen-length {args.gen_length} must be a multiple of --block {args.block}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the suite (or, with `--report-only`, only write its section from `--json`)."""
    argv = sys.argv[1:] if argv is None else argv
    return run_or_report("step-profile", argv, parse_args(argv), run, section)
