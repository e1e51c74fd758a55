"""Suite `gpu`: the GPU rows of BENCHMARKS.md: LLaDA-8B's full shape in bfloat16, and batch
invariance on a GPU.

    # on a lent GPU (about 4 min on an H200)
    python3 -m bench gpu --json $OUT/gpu_bench.json
    # write BENCHMARKS.md's section from FILE
    .venv/bin/python -m bench gpu --report-only --json FILE
    # another GPU's run: a section of its own
    .venv/bin/python -m bench gpu --report-only --json bench/results/gpu_bench_h100.json \\
        --section gpu_bench_h100
    # a smoke run on the CPU
    .venv/bin/python -m bench gpu --quick --device cpu --json /tmp/g.json

The CPU rows stand in for a GPU with one layer of LLaDA-8B's 32 in float32 and extrapolate;
this script measures the whole shape (random weights, 32 layers, width 4096, 32 heads, MLP
12,288, vocabulary 126,464) in bfloat16, in four parts, each saved to `--json` as it ends (a
part that fails records its traceback and the next one runs):

1. *forward*: one forward pass (hidden states + the head at 32 positions per row) at
   prompt 256 + generation 256, for 1, 4 and 16 rows: the batch ceiling on this GPU.
2. *caches*: `bench/caches_bench.py`'s real-shape cells (`single`'s fixed schedule per
   block, the entropy rule's first steps) for `none`, `prefix` and `dual`, at 1 and 16 rows.
3. *strategies*: `bench/strategies_bench.py`'s cells on the real shape with `bench/run.py`'s
   real-shape sizes (prompt 32, generation 32, block 2), batch 1 and 16.
4. *invariance*: the demo model on the GPU in float32 and bfloat16, strategies single,
   majority and dvoting, 1 and 16 rows per pass: accuracy, NFE, and the questions whose
   samples differ from the 1-row run; and float32 on the GPU against float32 on the CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch

from bench import caches_bench
from bench.common import (
    REPO,
    add_output_flags,
    add_quick_flag,
    command_line,
    load_json,
    machine_description,
    markers,
    save_json,
    utc_now,
    write_section,
)
from bench.strategies_bench import cells_table, run_cells
from bench.workloads import Workload, demo_workload, real_vocab_workload
from lm_eval_dvoting.core.decoding import generate
from lm_eval_dvoting.core.decoding.state import BlockDecoding, left_pad
from lm_eval_dvoting.core.strategies import StrategySettings, decode_questions
from lm_eval_dvoting.models.loading import load_model

SECTION = "gpu_bench"  # the H200 run's section; another GPU's run gets its own with --section
START, END = markers(SECTION)  # the H200 section's
Results = dict[str, Any]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--layers", type=int, default=32, help="layers of the real-shape model (LLaDA-8B: 32)"
    )
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--parts", nargs="+", default=["forward", "caches", "strategies", "invariance"])
    p.add_argument("--cache-rows", type=int, nargs="+", default=[1, 16])
    p.add_argument("--cache-repeats", type=int, default=2)
    p.add_argument("--strategy-questions", type=int, default=16)
    p.add_argument("--demo-questions", type=int, default=50)
    add_quick_flag(p)
    add_output_flags(p, json_default=None)
    p.add_argument(
        "--section",
        default=SECTION,
        help="the name in the section's markers, `<!-- NAME:start -->`",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.layers, args.width, args.heads, args.cache_rows = 1, 256, 4, [1, 2]
        args.cache_repeats, args.strategy_questions, args.demo_questions = 1, 2, 4
    return args


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# ------------------------------------------------------------------ part 1: forward


def forward_ms(
    model: torch.nn.Module, rows: int, length: int, head_positions: int, repeats: int = 5
) -> float:
    """Median milliseconds of hidden states over `length` tokens + the head at the last
    positions."""
    device = next(model.parameters()).device
    ids = torch.randint(0, 126_000, (rows, length), device=device)
    times = []
    with torch.no_grad():
        for i in range(repeats + 2):  # two warm-ups
            sync(device)
            start = time.perf_counter()
            model.logits_from_hidden(model.hidden_states(ids)[:, -head_positions:])
            sync(device)
            if i >= 2:
                times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def part_forward(work: Workload, args: argparse.Namespace) -> Results:
    return {
        f"{rows}x{length}": forward_ms(work.model, rows, length, min(32, length))
        for length in (512, 64)
        for rows in (1, 4, 16)
    }


# ------------------------------------------------------------------ part 2: caches


CACHE_SHAPE = SimpleNamespace(
    gen_length=256, block=32, entropy_steps=4
)  # caches_bench's real-shape cells


def part_caches(work: Workload, args: argparse.Namespace) -> Results:
    counter = caches_bench.PassCounter(work.model)
    device = next(work.model.parameters()).device
    prompt = torch.randint(0, 126_000, (256,), generator=torch.Generator().manual_seed(2)).to(
        device
    )
    out: Results = {}
    for rows in args.cache_rows:
        real: Results = {}
        for repeat in range(args.cache_repeats):
            real.update(
                caches_bench.run_repeat(counter, prompt, CACHE_SHAPE, repeat, rows, warm_up=2)
            )
        out[str(rows)] = real
        print(f"  [caches] {rows} row(s) done", flush=True)
    return out


# ------------------------------------------------------------------ part 3: strategies


def part_strategies(work: Workload, args: argparse.Namespace) -> Results:
    cells = run_cells(
        work,
        ["single", "majority", "dvoting", "hex"],
        [1, 16],
        args.strategy_questions,
        max(1, args.strategy_questions // 8),
        repeats=1,
    )
    return {"cells": [c.as_json() for c in cells], "table": cells_table(cells)}


# ------------------------------------------------------------------ part 4: invariance


def sample_digests(results: list[Any]) -> list[str]:
    return [hashlib.sha256(r.samples.cpu().numpy().tobytes()).hexdigest()[:12] for r in results]


def demo_run(model: torch.nn.Module, work: Any, strategy: str, rows: int, count: int) -> Results:
    start = time.perf_counter()
    results = decode_questions(
        model,
        work.prompts[:count],
        StrategySettings(strategy=strategy, gen_length=32),
        work.extract,
        list(range(count)),
        max_rows=rows,
    )
    chosen = [r.answers[r.chosen] for r in results]
    return {
        "wall": time.perf_counter() - start,
        "nfe": sum(r.nfe for r in results) / count,
        "accuracy": sum(str(a) == t for a, t in zip(chosen, work.targets)) / count,
        "answers": [str(a) for a in chosen],
        "digests": sample_digests(results),
    }


def part_invariance(shape: Workload, args: argparse.Namespace) -> Results:
    del shape  # the demo model, not the real shape
    count = args.demo_questions
    work = demo_workload("tiny-arith", count)
    out: Results = {"description": work.description}
    cpu_model = work.model
    for dtype in ("float32", "bfloat16"):
        gpu_model = demo_workload("tiny-arith", 1).model.to(args.device, getattr(torch, dtype))
        for strategy in ("single", "majority", "dvoting"):
            for rows in (1, 16):
                out[f"{args.device}/{dtype}/{strategy}/{rows}"] = demo_run(
                    gpu_model, work, strategy, rows, count
                )
            print(f"  [invariance] {dtype} {strategy} done", flush=True)
    for strategy in ("single", "majority", "dvoting"):
        out[f"cpu/float32/{strategy}/16"] = demo_run(cpu_model, work, strategy, 16, count)
    return out


# ------------------------------------------------------------------ part 5: fixtures


FIXTURES = REPO / "tests" / "fixtures" / "official-tiny"


def fixture_logits(folder: Path, device: str, dtype: str) -> Results:
    """Max |ours - upstream| of a fixture's logits (plain and left-padded) and argmax agreement."""
    from safetensors.torch import load_file

    model = load_model(str(folder), device=device, dtype=dtype)
    expected = load_file(str(folder / "expected.safetensors"))
    ids, attention = expected["input_ids"].to(device), expected["attention_mask"].to(device)
    with torch.no_grad():
        plain, masked = model(ids).float().cpu(), model(ids, attention_mask=attention).float().cpu()
    # the padded reference as tests/test_models*.py read it (the README of the fixtures says why)
    padded = next(
        expected[k]
        for k in ("logits_pad4d", "logits_masked_dllm", "logits_masked")
        if k in expected
    )
    return {
        "plain": (plain - expected["logits"]).abs().max().item(),
        "masked": (masked - padded).abs().max().item(),
        "argmax": (plain.argmax(-1) == expected["logits"].argmax(-1)).float().mean().item(),
    }


BLOCK_PRESETS = {  # LLaDA2's block-diffusion presets
    "2.0": BlockDecoding(),
    "2.1-quality": BlockDecoding(threshold=0.7, editing_threshold=0.5),
    "2.1-speed": BlockDecoding(threshold=0.5, editing_threshold=0.0),
}


def greedy_block_cache_differ(model: torch.nn.Module, prompts: list[torch.Tensor]) -> int:
    """Greedy decodes (each preset x each prompt, one row) whose tokens or pass counts
    differ between `cache=block` and no cache."""
    differ = 0
    for settings in BLOCK_PRESETS.values():
        for prompt in prompts:
            runs = [
                generate(model, prompt[None], gen_length=8, block_length=4, block=settings, cache=c)
                for c in ("none", "block")
            ]
            same = torch.equal(runs[0].tokens, runs[1].tokens) and torch.equal(
                runs[0].nfe, runs[1].nfe
            )
            differ += int(not same)
    return differ


def sampled_block_cache_differ(
    model: torch.nn.Module, prompts: list[torch.Tensor], device: str
) -> int:
    """Rows of one sampled batched decode (left-padded prompts) whose tokens differ between
    `cache=block` and no cache."""
    ids, attention, _ = left_pad(prompts, 0, torch.device(device))
    sampled = [
        generate(
            model,
            ids,
            attention,
            gen_length=11,
            block_length=4,
            block=BLOCK_PRESETS["2.1-quality"],
            cache=c,
            temperature=0.8,
            generator=[torch.Generator(device=device).manual_seed(r) for r in range(len(prompts))],
        )
        for c in ("none", "block")
    ]
    return int((sampled[0].tokens != sampled[1].tokens).any(-1).sum())


def llada2_block_cache(device: str, dtype: str) -> Results:
    """LLaDA2's block cache against no cache on the fixture: greedy over the block-diffusion
    presets, and sampled over 4 batched rows; sequences (and pass counts) that differ."""
    model = load_model(str(FIXTURES / "llada2"), device=device, dtype=dtype)
    drawn = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 240, (n,), generator=drawn) for n in (3, 4, 6, 9)]
    return {
        "greedy_differ": greedy_block_cache_differ(model, prompts),
        "greedy_total": len(BLOCK_PRESETS) * len(prompts),
        "sampled_rows_differ": sampled_block_cache_differ(model, prompts, device),
        "sampled_rows": len(prompts),
    }


def part_fidelity(shape: Workload, args: argparse.Namespace) -> Results:
    del shape  # the tiny official-format fixtures, not the real shape
    out: Results = {}
    for dtype in ("float32", "bfloat16"):
        for family in ("llada", "dream", "llada_moe", "llada2"):
            out[f"logits/{family}/{dtype}"] = fixture_logits(FIXTURES / family, args.device, dtype)
        for device in dict.fromkeys([args.device, "cpu"]):  # the CPU for comparison
            out[f"block_cache/{device}/{dtype}"] = llada2_block_cache(device, dtype)
    return out


def _entries(fidelity: Results, kind: str) -> list[tuple[str, str, Results]]:
    """(second, third part of the key, value) of the entries `kind/x/y`."""
    return [
        (*key.split("/")[1:], value)
        for key, value in fidelity.items()
        if key.startswith(kind + "/")
    ]


def fidelity_lines(fidelity: Results) -> list[str]:
    lines = [
        "| fixture | dtype | max abs diff of the logits (plain / left-padded) | argmax agreement |",
        "|---|---|---:|---:|",
    ]
    lines += [
        f"| {family} | {dtype} | {v['plain']:.2e} / {v['masked']:.2e} | {100 * v['argmax']:.1f}% |"
        for family, dtype, v in _entries(fidelity, "logits")
    ]
    lines += [
        "",
        "| device | dtype | LLaDA2 `cache=block` vs `none`: greedy decodes that differ (3 "
        "presets x 4 prompts, generation 8, block 4) | sampled rows that differ (4 batched "
        "rows, generation 11) |",
        "|---|---|---:|---:|",
    ]
    lines += [
        f"| {device} | {dtype} | {v['greedy_differ']} of {v['greedy_total']} | "
        f"{v['sampled_rows_differ']} of {v['sampled_rows']} |"
        for device, dtype, v in _entries(fidelity, "block_cache")
    ]
    return lines


# ------------------------------------------------------------------ running


def run_parts(args: argparse.Namespace, results: Results, save: Callable[[], None]) -> None:
    device = torch.device(args.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    start = time.perf_counter()
    shape = real_vocab_workload(
        args.strategy_questions,
        32,
        32,
        name="real-shape",
        d_model=args.width,
        n_layers=args.layers,
        n_heads=args.heads,
        std=0.02,
        device=str(device),
        dtype=dtype,
    )
    results["model_seconds"] = time.perf_counter() - start
    results["real_description"] = shape.description
    results["dtype"] = str(dtype).replace("torch.", "")
    parts = {
        "forward": part_forward,
        "caches": part_caches,
        "strategies": part_strategies,
        "invariance": part_invariance,
        "fidelity": part_fidelity,
    }
    for name in args.parts:
        start = time.perf_counter()
        try:
            results[name] = parts[name](shape, args)
        except Exception:  # noqa: BLE001 - record it and go on: the lease is short
            results[name] = {"error": traceback.format_exc()}
            print(results[name]["error"], flush=True)
        results.setdefault("seconds", {})[name] = time.perf_counter() - start
        print(f"[{name}] {results['seconds'][name]:.1f} s", flush=True)
        save()


# ------------------------------------------------------------------ the section


def ms(value: float) -> str:
    return "n/a" if value != value else f"{1e3 * value:.1f}"  # NaN: not measured


def forward_lines(forward: Results) -> list[str]:
    lines = [
        "| rows x tokens | ms per pass | ms per row | rows/s against 1 row |",
        "|---|---:|---:|---:|",
    ]
    for key, value in forward.items():
        rows, length = (key.split("x") + ["512"])[
            :2
        ]  # older runs keyed by rows alone, at 512 tokens
        base = forward.get(f"1x{length}", forward.get("1"))
        lines.append(
            f"| {rows} x {length} | {value:.1f} | {value / int(rows):.1f} | "
            f"{base * int(rows) / value:.2f}x |"
        )
    return lines


def cache_lines(real: Results, rows: str) -> list[str]:
    """`single`'s fixed schedule per block and per question, and the entropy rule's steps, in ms."""
    fixed, blocks = caches_bench.fixed_block, 8
    lines = [
        f"**{rows} row(s).**",
        "",
        "| cache | block | full step ms | reuse step ms | reuse pass tokens | "
        "head ms/step | ms/step over a question (`single`) | none/cache |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    steps = 256  # one question of `single`: 8 blocks x 32 steps
    base = caches_bench.per_question(real, "none", blocks, 1.0)
    for cache, b in [("none", 0), ("prefix", 0), ("prefix", 7), ("dual", 0), ("dual", 7)]:
        cell = fixed(real, cache, b, 1.0)
        question = caches_bench.per_question(real, cache, blocks, 1.0)
        reuse, width = (
            ("-", "-") if cache == "none" else (ms(cell["reuse"]), f"{cell['width']:.0f}")
        )
        lines.append(
            f"| {cache} | {b + 1} of {blocks} | {ms(cell['full'])} | {reuse} | {width} | "
            f"{ms(cell['head'])} | {ms(question / steps)} | {base / question:.2f}x |"
        )
    lines += [
        "",
        "| cache | entropy rule: first step of a block ms (full) | later step ms |",
        "|---|---:|---:|",
    ]
    for cache in caches_bench.CACHES:
        step = caches_bench.entropy_steps(real, cache)
        lines.append(f"| {cache} | {ms(step['full'])} | {ms(step['later'])} |")
    return lines


def strategy_targets(cells: list[dict[str, Any]]) -> list[str]:
    """Targets 1 and 3 of BENCHMARKS.md on the GPU cells."""
    by = {(c["strategy"], c["batch"]): c for c in cells}
    lines = [
        "| strategy | q/s, batch 1 | q/s, batch 16 | speed-up | answers identical across batch "
        "sizes |",
        "|---|---:|---:|---:|---|",
    ]
    for strategy in ("single", "majority", "dvoting", "hex"):
        one, many = by.get((strategy, 1)), by.get((strategy, 16))
        if one and many:
            same = (
                "yes"
                if one["tokens_digest"] == many["tokens_digest"]
                else "NO (token digests differ)"
            )
            lines.append(
                f"| {strategy} | {one['qps']:.3f} | {many['qps']:.3f} | "
                f"{many['qps'] / one['qps']:.2f}x | {same} |"
            )
    lines += [
        "",
        "| batch | dVoting/majority time per question | NFE ratio | time ratio / NFE ratio |",
        "|---:|---:|---:|---:|",
    ]
    for batch in (1, 16):
        d, m = by.get(("dvoting", batch)), by.get(("majority", batch))
        if d and m:
            time_ratio = (statistics.median(d["wall"]) / d["questions"]) / (
                statistics.median(m["wall"]) / m["questions"]
            )
            nfe_ratio = d["nfe"] / m["nfe"]
            lines.append(
                f"| {batch} | {time_ratio:.3f} | {nfe_ratio:.3f} | {time_ratio / nfe_ratio:.3f} |"
            )
    return lines


def differing(a: Results, b: Results, key: str) -> int:
    return sum(x != y for x, y in zip(a[key], b[key]))


WHAT_IT_DOES_NOT_SHOW = (
    "What it does not show: the weights are random (no real LLaDA-8B was reachable), so "
    "dVoting's step counts are its worst case (one token per step, all five samples, no early "
    "stop) and the real-shape answers are meaningless; one GPU kind (the {gpu}), torch 2.11 "
    "there against 2.13 in CI, eager PyTorch (no CUDA graphs, no compiled kernels); each "
    "strategy cell ran once, so its seconds carry the spread of one run (the cache cells are "
    "medians of 3 repeats)."
)
INVARIANCE_NOTE = (
    "The first 50 held-out problems, generation 32, block 2, each strategy's defaults, the "
    "seeds the harness would give (question index). Only `single` (greedy) can match the CPU "
    "token for token: the sampling strategies draw their noise from a generator on the model's "
    "device, and a CUDA generator's stream differs from the CPU's for the same seed, so their "
    "samples differ from the CPU's by design (a seed reproduces a run on the same kind of "
    "device, not across kinds)."
)


def invariance_lines(inv: Results, device: str) -> list[str]:
    lines = [
        "| dtype | strategy | accuracy %, 1 row / 16 rows | mean NFE, 1 / 16 | questions whose "
        "samples differ, 16 rows vs 1 | whose returned answer differs | samples differ from the "
        "CPU's (float32, 16 rows) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for dtype in ("float32", "bfloat16"):
        for strategy in ("single", "majority", "dvoting"):
            one, many = (
                inv.get(f"{device}/{dtype}/{strategy}/1"),
                inv.get(f"{device}/{dtype}/{strategy}/16"),
            )
            cpu = inv.get(f"cpu/float32/{strategy}/16")
            if not (one and many):
                continue
            against_cpu = (
                f"{differing(many, cpu, 'digests')} of {len(cpu['digests'])}" if cpu else "n/a"
            )
            lines.append(
                f"| {dtype} | {strategy} | {100 * one['accuracy']:.1f} / "
                f"{100 * many['accuracy']:.1f} | {one['nfe']:.2f} / {many['nfe']:.2f} | "
                f"{differing(one, many, 'digests')} of {len(one['digests'])} | "
                f"{differing(one, many, 'answers')} | {against_cpu} |"
            )
    return lines


def part_lines(
    results: Results, name: str, title: str, render: Callable[[Any], list[str]]
) -> list[str]:
    part = results.get(name)
    if part is None:
        return [f"### {title}", "", "Not run.", ""]
    if isinstance(part, dict) and "error" in part:
        last = part["error"].strip().splitlines()[-1]
        return [
            f"### {title}",
            "",
            f"Failed on the GPU: `{last}` (the traceback is in the JSON).",
            "",
        ]
    return [f"### {title}", "", *render(part), ""]


def forward_reading(forward: Results) -> list[str]:
    if not ("1x64" in forward and "1x512" in forward):
        return []
    return [
        "- **One row is bound by per-kernel overheads, not arithmetic:** a pass over 64 "
        f"tokens costs {forward['1x64']:.1f} ms against {forward['1x512']:.1f} ms over 512, "
        f"and 16 rows of 64 tokens {forward['16x64']:.1f} ms. Batching is nearly free "
        "there; shortening one row's pass is not."
    ]


def caches_reading(caches: Results) -> list[str]:
    if "error" in caches:
        return []
    lines = []
    for rows, real in caches.items():
        ratios = {
            c: caches_bench.per_question(real, "none", 8, 1.0)
            / caches_bench.per_question(real, c, 8, 1.0)
            for c in ("prefix", "dual")
        }
        lines.append(
            f"- **Caches at {rows} row(s):** `prefix` {ratios['prefix']:.2f}x and `dual` "
            f"{ratios['dual']:.2f}x `none`'s speed per step of `single`; the goal of `dual` "
            f"at least 5x is {'met' if ratios['dual'] >= 5 else 'NOT met'} here."
        )
    return lines


def strategies_reading(strategies: Results) -> list[str]:
    by = {(c["strategy"], c["batch"]): c for c in strategies.get("cells", [])}
    speedups = [by[(s, 16)]["qps"] / by[(s, 1)]["qps"] for s, b in by if b == 1 and (s, 16) in by]
    if not speedups:
        return []
    return [
        f"- **Batch 16 against batch 1** at the real shape: {min(speedups):.1f}x to "
        f"{max(speedups):.1f}x the questions per second (the target is 3x; the CPU's "
        "ceiling was 1.3x). The random-weight model's tokens differ between the batch "
        "sizes (not investigated further: the likely cause is near-tied logits of random "
        "weights, rounded differently by bfloat16 matrix kernels that the GPU picks by "
        "shape; see the demo rows for a trained model)."
    ]


def invariance_reading(inv: Results) -> list[str]:
    pairs = [(k, k[:-1] + "16") for k in inv if k.endswith("/1") and k[:-1] + "16" in inv]
    if not pairs:
        return []
    moved = sum(differing(inv[a], inv[b], "digests") for a, b in pairs)
    return [
        f"- **The demo model on the GPU:** {moved} of "
        f"{sum(len(inv[a]['digests']) for a, _ in pairs)} question-runs changed any sample "
        "between 1 and 16 rows per pass (float32 and bfloat16, single, majority and "
        "dvoting)."
    ]


def fidelity_reading(fidelity: Results) -> list[str]:
    if not fidelity or "error" in fidelity:
        return []
    worst = max(
        max(v["plain"], v["masked"])
        for k, v in fidelity.items()
        if k.endswith("/float32") and "logits" in k
    )
    caches = {
        k.split("/")[1]: (
            v["greedy_differ"] + v["sampled_rows_differ"],
            v["greedy_total"] + v["sampled_rows"],
        )
        for k, v in fidelity.items()
        if k.startswith("block_cache/") and k.endswith("/bfloat16")
    }
    return [
        "- **Fidelity on the GPU:** in float32 the four official-format fixtures stay "
        f"within {worst:.1e} of the upstream logits (the CPU tests' bound is 1e-4), and "
        "LLaDA2's block cache gives no cache's tokens exactly on both devices. In bfloat16 "
        "the decodes with the block cache that differ from no cache's (greedy and "
        "sampled): "
        + ", ".join(f"{n} of {total} on {device}" for device, (n, total) in caches.items())
        + " (not investigated: in bfloat16 the cached keys and values, computed over a "
        "shorter sequence, may round differently from recomputed ones; exactness is "
        "claimed for float32 only)."
    ]


def reading_lines(results: Results) -> list[str]:
    """What the tables say, computed from them (a part that did not run is left out)."""
    return (
        ["### Reading", ""]
        + forward_reading(results.get("forward", {}))
        + caches_reading(results.get("caches", {}))
        + strategies_reading(results.get("strategies", {}))
        + invariance_reading(results.get("invariance", {}))
        + fidelity_reading(results.get("fidelity", {}))
        + [""]
    )


def gpu_name(results: Results) -> str:
    """ "NVIDIA H100 80GB HBM3": H100; a CPU run: cpu."""
    return results["facts"].get("gpu", results["device"]).removeprefix("NVIDIA ").split()[0]


def header_lines(results: Results, name: str) -> list[str]:
    """The section's title, what wrote it, the command and the machine."""
    lines = [
        "## GPU: LLaDA-8B's full shape in bfloat16"
        + ("" if name == SECTION else f", on the {gpu_name(results)}"),
        "",
        "Written by `python -m bench gpu` on a lent GPU machine (rerun it there, then "
        "`--report-only` here). "
        + results["real_description"]
        + f"; {results['dtype']}, on the GPU.",
        "",
        f"- command: `{results['command']}`",
        *[f"- {k}: {v}" for k, v in results["facts"].items()],
        f"- date: {results['date']}; building the random model took "
        f"{results['model_seconds']:.1f} s",
    ]
    if "second_run" in results:
        lines.append(
            f"- second run: {results['second_run']['date']}, on "
            f"{results['second_run']['facts'].get('gpu')}"
        )
    return lines + [""]


def parts_lines(results: Results) -> list[str]:
    """Each part's subsection, in the order the parts run."""
    device = results["device"]
    parts: list[tuple[str, str, Callable[[Any], list[str]]]] = [
        (
            "forward",
            "One forward pass (hidden states + the head at 32 positions per row; medians of 5)",
            forward_lines,
        ),
        (
            "caches",
            "Key/value caches: step times (`bench/caches_bench.py`'s cells, block 32, 8 blocks)",
            lambda c: [x for rows in c for x in cache_lines(c[rows], rows) + [""]],
        ),
        (
            "strategies",
            "Strategies at the real shape (prompt 32, generation 32, block 2; one repeat)",
            lambda s: s["table"] + [""] + strategy_targets(s["cells"]),
        ),
        (
            "invariance",
            "The demo model on the GPU: does the batch change the answers?",
            lambda inv: (
                [inv["description"] + ". " + INVARIANCE_NOTE, ""] + invariance_lines(inv, device)
            ),
        ),
        (
            "fidelity",
            "The official-format fixtures on the GPU (tests/fixtures/official-tiny; "
            "logits against what the upstream code computed on the CPU in float32)",
            fidelity_lines,
        ),
    ]
    return [line for part in parts for line in part_lines(results, *part)]


def section(results: Results, name: str = SECTION) -> list[str]:
    """The whole section of one GPU run, between its markers `name`."""
    start, end = markers(name)
    return (
        [start]
        + header_lines(results, name)
        + parts_lines(results)
        + reading_lines(results)
        + [WHAT_IT_DOES_NOT_SHOW.format(gpu=gpu_name(results)), "", end]
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report_only:
        lines = section(load_json(args.json), args.section)
        write_section(args.out, lines, *markers(args.section))
        return 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(
            f"--device {args.device}: no CUDA device is visible here; use --device cpu for a "
            "smoke run"
        )
    results: Results = {
        "command": command_line("gpu", argv if argv is not None else sys.argv[1:], "python3"),
        "device": args.device,
        "facts": machine_description(torch.device(args.device)),
        "date": utc_now(),
    }

    def save() -> None:
        save_json(args.json, results, indent=1, default=str)

    run_parts(args, results, save)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
