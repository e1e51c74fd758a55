"""Suite `experts`: one MoE layer's routed experts (models/moe.py's `Experts.forward`) at
LLaDA2.0-mini's shape (256 experts, width 2048, intermediate 512, top-8), the two ways it
runs them: grouped GEMMs (`F.grouped_mm`; the CPU, and CUDA in bfloat16 on compute
capability 9/10) against the loop over the experts that received tokens (what runs
elsewhere, and how every MoE layer ran before). Per call: the operators (each a kernel launch
on a GPU), the host reads (each a wait on a GPU) and the time, on the tokens of one step: 1
and 16 rows x a block of 32 (the block cache), 1 and 16 rows x 512 (no cache).

    .venv/bin/python -m bench experts
    # another commit's experts under the same measure (before the grouped GEMMs: its loop):
    git worktree add /tmp/base REV && .venv/bin/python -m bench experts --package /tmp/base
    # on a lent GPU (bench/gpu_session.sh runs it):
    python3 -m bench experts --device cuda --dtype bfloat16
    # a smoke run (8 experts of width 64):
    .venv/bin/python -m bench experts --quick --repeats 1

Random weights (normal, std 0.02) and routing (each token's 8 experts drawn uniformly,
seeded): spread as a trained router's are over many tokens. Each cell runs both ways back to
back, `--repeats` times, alternating which goes first; the table gives the medians and the
median of the per-repeat ratios, and whether the two ways gave the same bits (on the CPU they
must; on CUDA the largest difference is given). What it does not show: a whole layer's or a
model's time (`python -m bench moe`), nor the time a host read costs on a GPU, which depends
on what is queued before it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any, Callable

import torch

from bench import common
from bench.common import operators
from bench.host_reads_bench import HostReads

SHAPE = dict(experts=256, width=2048, hidden=512, k=8)  # LLaDA2.0-mini's MoE layers
QUICK = dict(experts=8, width=64, hidden=32, k=2)
CELLS = [(1, 32), (16, 32), (1, 512), (16, 512)]  # rows x tokens of one step's pass


def random_experts(shape: dict[str, int], device: str, dtype: torch.dtype) -> Any:
    """The routed experts of one layer, random weights as the moe suite draws them."""
    from bench.moe_bench import fill_random
    from lm_eval_dvoting.models.moe import Experts

    torch.manual_seed(0)
    experts = Experts(shape["experts"], shape["width"], shape["hidden"])
    fill_random(experts)
    return experts.to(device, dtype).requires_grad_(False)


def step_input(
    shape: dict[str, int], tokens: int, device: str, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A step's tokens, each routed to k distinct experts drawn uniformly, with weights."""
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, shape["width"], generator=g)
    chosen = torch.rand(tokens, shape["experts"], generator=g).argsort(dim=1)[:, : shape["k"]]
    weights = torch.rand(tokens, shape["k"], generator=g)
    return x.to(device, dtype), chosen.to(device), weights.to(device)


def both_ways(experts: Any, call: Callable[[], torch.Tensor]) -> dict[str, Callable[[], Any]]:
    """`call` with the grouped GEMMs, and with the loop over experts (`grouped_applies`
    answered False); only the loop for a package from before the grouped GEMMs."""
    from lm_eval_dvoting.models import moe

    if not hasattr(moe, "grouped_applies"):
        return {"loop": call}
    applies = moe.grouped_applies

    def looped() -> torch.Tensor:
        moe.grouped_applies = lambda x, weight: False
        try:
            return call()
        finally:
            moe.grouped_applies = applies

    return {"grouped": call, "loop": looped}


def reads(fn: Callable[[], Any]) -> int:
    with HostReads() as counted:
        fn()
    return sum(counted.calls.values())


def measure(
    experts: Any, inputs: tuple[torch.Tensor, ...], repeats: int, device: str
) -> dict[str, Any]:
    """One cell: operators, host reads and times of both ways, and how far apart they are."""
    from lm_eval_dvoting.models import moe

    ways = both_ways(experts, lambda: experts(*inputs))
    if "grouped" in ways and not moe.grouped_applies(inputs[0], experts.gate_proj):
        raise SystemExit(f"the grouped GEMMs do not apply on {device} in {inputs[0].dtype}")
    outputs = {name: fn() for name, fn in ways.items()}  # also the warm-up
    cell: dict[str, Any] = {
        "hit": int(inputs[1].unique().numel()),
        "operators": {name: operators(fn) for name, fn in ways.items()},
        "reads": {name: reads(fn) for name, fn in ways.items()},
        "ms": {name: [] for name in ways},
    }
    for repeat in range(repeats):
        for name in list(ways)[:: 1 if repeat % 2 == 0 else -1]:
            cell["ms"][name].append(common.timed(ways[name], device) * 1e3)
    if "grouped" in ways:
        apart = outputs["grouped"].float() - outputs["loop"].float()
        cell["gap"] = apart.abs().max().item()
        cell["ratio"] = statistics.median(g / lp for g, lp in zip(*cell["ms"].values()))
    return cell


def table(cells: dict[tuple[int, int], dict[str, Any]], device: str, repeats: int) -> list[str]:
    """A row per cell; a package from before the grouped GEMMs fills the loop's columns."""
    lines = [
        "| rows x tokens | experts hit | operators: grouped / loop | host reads: grouped / loop "
        f"| ms grouped / loop on {device} (median of {repeats}) | grouped / loop "
        "| largest difference |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (rows, tokens), c in cells.items():
        ms = {name: f"{statistics.median(times):.1f}" for name, times in c["ms"].items()}
        ratio, gap = (f"{c['ratio']:.2f}x", f"{c['gap']:.3g}") if "gap" in c else ("", "")
        lines.append(
            f"| {rows} x {tokens} | {c['hit']} | {c['operators'].get('grouped', '-')} / "
            f"{c['operators']['loop']} | {c['reads'].get('grouped', '-')} / {c['reads']['loop']} | "
            f"{ms.get('grouped', '-')} / {ms['loop']} | {ratio} | {gap} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench experts", description=__doc__)
    common.add_device_flags(p, "timed calls per way and cell")
    common.add_quick_flag(p, "8 experts of width 64 (a smoke run)")
    args = common.parse_device_args(p, argv)
    if args.device == "cpu":
        torch.set_num_threads(1)
    shape, dtype = (QUICK if args.quick else SHAPE), getattr(torch, args.dtype)
    experts = random_experts(shape, args.device, dtype)
    cells = {
        (rows, tokens): measure(
            experts, step_input(shape, rows * tokens, args.device, dtype), args.repeats, args.device
        )
        for rows, tokens in CELLS
    }
    lines = [f"{shape}, {args.dtype}, {args.device}", "", *table(cells, args.device, args.repeats)]
    print("\n".join(lines))
    common.write_table(args.out, "experts", argv, args.device, lines)
    return 0
