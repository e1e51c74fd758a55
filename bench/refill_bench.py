"""Suite `refill`: what one refill of the static buffers costs (`cached_steps=static|graphs`,
core/decoding/static_steps.py's `_fill`: the rows' kept keys and values copied into the reuse
pass's buffers, which happens at every step where the rows of the pass change, e.g. the
threshold rules at many rows): the operators it runs (each a kernel launch on a GPU) and its
time on this CPU, at LLaDA-8B's 32 layers with small and larger heads; and the operators of
the dynamic path's stack of the same rows (`kept.stack_kept`, which the block cache, LLaDA2's
default, runs at every step).

    .venv/bin/python -m bench refill
    # another commit's refill under the same measure:
    git worktree add /tmp/base REV && .venv/bin/python -m bench refill --package /tmp/base
    # on a lent GPU (bench/gpu_session.sh): LLaDA-8B's 32 key/value heads x 128, bfloat16
    python3 -m bench refill --device cuda --dtype bfloat16 --real-shape

The kept keys are laid out as the package itself keeps them (every layer in one tensor
where it has `kept.layers_in_one`, else a copy per layer). Prefixes of 200-305 and suffixes
of 195-300 columns per row, a pass of 32. What it counts: the `aten::` operators the refill
calls at the top level, views left out (a GPU launches a kernel for each, at a few
microseconds of host time apiece). Its time on the CPU is memory copies; on a GPU the launches
are what grows with rows x layers (no GPU here).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
from typing import Any

import torch

from bench import common
from bench.common import operators

CONFIGS = [(1, 2, 8), (16, 2, 8), (1, 8, 64), (4, 8, 64), (16, 8, 64)]  # rows, kv heads, size
REAL_SHAPE = [(1, 32, 128), (4, 32, 128), (16, 32, 128)]  # LLaDA-8B's key/value heads
LAYERS, PASS = 32, 32


def kept_rows(
    rows: int, heads: int, size: int, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> list[Any]:
    """Each row's kept keys and values, laid out as the package keeps them."""
    from lm_eval_dvoting.core.decoding import kept as kept_module
    from lm_eval_dvoting.core.decoding.state import KeptKeysValues

    generator = torch.Generator().manual_seed(0)
    lay_out = getattr(kept_module, "layers_in_one", lambda ts: [t.clone() for t in ts])

    def layers(length: int) -> list[torch.Tensor]:
        drawn = [torch.randn(heads, length, size, generator=generator) for _ in range(LAYERS)]
        return lay_out([t.to(device, dtype) for t in drawn])

    found = []
    for row in range(rows):
        prefix, suffix = 200 + 7 * row, 300 - 7 * row
        found.append(
            KeptKeysValues(0, layers(prefix), layers(prefix), layers(suffix), layers(suffix))
        )
    return found


def measure(
    rows: int,
    heads: int,
    size: int,
    repeats: int,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[int, float, int]:
    """(operators, median milliseconds) of one refill of a fresh shape's buffers, and the
    operators of one `kept.stack_kept` of the same rows (the dynamic path's per-step stack,
    and the block cache's, LLaDA2)."""
    steps = importlib.import_module("lm_eval_dvoting.core.decoding.static_steps")
    stack_kept = importlib.import_module("lm_eval_dvoting.core.decoding.kept").stack_kept
    kept = kept_rows(rows, heads, size, device, dtype)
    ids = torch.zeros((rows, PASS), dtype=torch.long, device=device)
    width = steps._prefix_width(kept) + PASS + steps._suffix_width(kept)
    shape = steps._allocate(kept, ids, width)

    def fill() -> None:
        steps._fill(shape, kept, ids, torch.ones_like(ids))

    fill()
    count = operators(fill)
    times = [common.timed(fill, device) for _ in range(repeats)]
    stacked = operators(lambda: stack_kept(kept, torch.device(device)))
    return count, statistics.median(times) * 1e3, stacked


def table(
    repeats: int,
    configs: list[tuple[int, int, int]] = CONFIGS,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> list[str]:
    lines = [
        f"| rows | kv heads x size | operators per refill ({LAYERS} layers) "
        f"| ms on {device} (median of {repeats}) | operators per stack_kept |",
        "|---:|---|---:|---:|---:|",
    ]
    for rows, heads, size in configs:
        count, ms, stacked = measure(rows, heads, size, repeats, device, dtype)
        lines.append(f"| {rows} | {heads} x {size} | {count} | {ms:.1f} | {stacked} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench refill", description=__doc__)
    common.add_device_flags(p, "timed refills per cell")
    p.add_argument("--real-shape", action="store_true", help="LLaDA-8B's 32 kv heads x 128")
    args = common.parse_device_args(p, argv)
    torch.set_num_threads(1)
    configs = REAL_SHAPE if args.real_shape else CONFIGS
    lines = table(args.repeats, configs, args.device, getattr(torch, args.dtype))
    print("\n".join(lines))
    common.write_table(args.out, "refill", argv, args.device, lines)
    return 0
