"""Part 3 of `bench/run.py`: the targets of the issue, checked on the part-1 cells.

1. dVoting's time per question / majority's <= 1.1 x their NFE ratio, per model and batch;
2. the decoder's own share of the wall time < 10% on `real-shape` (LLaDA-8B's width);
3. on the demo, batch 16 gives >= 3x the questions/s of batch 1, with identical tokens
   at every batch size (checked on the other models too).

Each check gives Markdown lines for the report and named yes/no verdicts for `--json`.
"""

from __future__ import annotations

from typing import Any

from bench.strategies_bench import Cell

Verdicts = dict[str, Any]


def _by_strategy_and_batch(cells: list[Cell]) -> dict[tuple[str, int], Cell]:
    return {(c.strategy, c.batch): c for c in cells}


def _strategies(cells: list[Cell]) -> list[str]:
    """The strategies of `cells` in their first-seen order."""
    return list(dict.fromkeys(c.strategy for c in cells))


def _same_tokens(cells: list[Cell], strategy: str) -> bool:
    """Whether every batch size of `strategy` decoded exactly the same tokens."""
    return len({c.tokens_digest for c in cells if c.strategy == strategy}) == 1


def dvoting_vs_majority(all_cells: dict[str, list[Cell]], verdicts: Verdicts) -> list[str]:
    """Target 1: dVoting's wall time per question over majority's <= 1.1 x its NFE ratio."""
    lines = [
        "**1. dVoting's time per question / majority's <= 1.1 x NFE ratio** (same questions)",
        "",
        "| model | batch | time ratio | NFE ratio | time ratio / NFE ratio | met |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for model, cells in all_cells.items():
        by = _by_strategy_and_batch(cells)
        for b in sorted({c.batch for c in cells}):
            dv, mj = by.get(("dvoting", b)), by.get(("majority", b))
            if not dv or not mj:
                continue
            time_ratio = dv.seconds_per_question / mj.seconds_per_question
            nfe_ratio = dv.nfe / mj.nfe
            rel = time_ratio / nfe_ratio
            ok = rel <= 1.1
            verdicts[f"dvoting_vs_majority/{model}/batch{b}"] = ok
            lines.append(
                f"| {model} | {b} | {time_ratio:.3f} | {nfe_ratio:.3f} | {rel:.3f} | "
                f"{'yes' if ok else 'NO'} |"
            )
    return lines + [""]


def decoder_share(all_cells: dict[str, list[Cell]], verdicts: Verdicts) -> list[str]:
    """Target 2: the decoder's own share < 10% on `real-shape`; `real-vocab` is shown for reference
    only."""
    lines = [
        "**2. The decoder's own share of a step < 10% at the real vocabulary**",
        "",
        "The issue's model is the real vocabulary at a *reduced depth*: `real-shape` "
        "(LLaDA-8B's width).",
        "`real-vocab` also reduces the width (to 256), which shrinks the forward pass but not "
        "the decoder's",
        "per-position work: shown for reference, not the target's model.",
        "",
        "| model | strategy | batch | decoder share | met |",
        "|---|---|---:|---:|---|",
    ]
    for model in ("real-shape", "real-vocab"):
        for c in all_cells.get(model, []):
            ok = c.decoder_share < 0.10
            if model == "real-shape":
                verdicts[f"decoder_share/{model}/{c.strategy}/batch{c.batch}"] = ok
            lines.append(
                f"| {model} | {c.strategy} | {c.batch} | {c.decoder_share * 100:.1f}% | "
                f"{('yes' if ok else 'NO') if model == 'real-shape' else '(reference)'} |"
            )
    return lines + [""]


def _batch_1_and_16(demo: list[Cell]) -> list[tuple[str, Cell, Cell]]:
    """(strategy, batch-1 cell, batch-16 cell) for each demo strategy that has both."""
    by = _by_strategy_and_batch(demo)
    pairs = [(s, by.get((s, 1)), by.get((s, 16))) for s in _strategies(demo)]
    return [(s, one, sixteen) for s, one, sixteen in pairs if one and sixteen]


def batch_speedup(demo: list[Cell], verdicts: Verdicts) -> list[str]:
    """Target 3: batch 16 >= 3x the questions/s of batch 1 on the demo, identical tokens."""
    lines = [
        "**3. Demo model: batch 16 gives >= 3x the questions/s of batch 1, with identical "
        "answers**",
        "",
        "| strategy | q/s batch 1 | q/s batch 16 | speed-up | met | tokens identical across "
        "batch sizes |",
        "|---|---:|---:|---:|---|---|",
    ]
    for s, one, sixteen in _batch_1_and_16(demo):
        speedup = sixteen.qps / one.qps
        same = _same_tokens(demo, s)
        verdicts[f"batch_speedup/demo/{s}"] = speedup >= 3
        verdicts[f"identical_tokens/demo/{s}"] = same
        lines.append(
            f"| {s} | {one.qps:.3f} | {sixteen.qps:.3f} | {speedup:.2f}x | "
            f"{'yes' if speedup >= 3 else 'NO'} | {'yes' if same else 'NO'} |"
        )
    return lines + [""]


def forward_ceiling(demo: list[Cell]) -> list[str]:
    """The batch speed-up a decoder costing nothing would reach: forward time per row, batch 1 /
    batch 16."""
    lines = [
        "Forward time per decoded row (s/forward pass / rows per pass), demo model: the ceiling "
        "of the",
        "batch speed-up when the decoder's own time is zero:",
        "",
        "| strategy | forward ms/row, batch 1 | forward ms/row, batch 16 | ceiling |",
        "|---|---:|---:|---:|",
    ]
    for s, one, sixteen in _batch_1_and_16(demo):
        per_row_1 = one.seconds_per_pass / one.rows_per_pass
        per_row_16 = sixteen.seconds_per_pass / sixteen.rows_per_pass
        lines.append(
            f"| {s} | {per_row_1 * 1e3:.2f} | {per_row_16 * 1e3:.2f} | "
            f"{per_row_1 / per_row_16:.2f}x |"
        )
    return lines + [""]


def identical_tokens_beyond_demo(all_cells: dict[str, list[Cell]], verdicts: Verdicts) -> None:
    """Verdicts only (no table): identical tokens across batch sizes on the models other than the
    demo."""
    for model, cells in all_cells.items():
        if model == "demo":
            continue
        for s in _strategies(cells):
            verdicts[f"identical_tokens/{model}/{s}"] = _same_tokens(cells, s)


def targets(all_cells: dict[str, list[Cell]]) -> tuple[list[str], Verdicts]:
    """The report's lines on the three targets, and every verdict by name."""
    verdicts: Verdicts = {}
    demo = all_cells.get("demo", [])
    lines = (
        dvoting_vs_majority(all_cells, verdicts)
        + decoder_share(all_cells, verdicts)
        + batch_speedup(demo, verdicts)
        + forward_ceiling(demo)
    )
    identical_tokens_beyond_demo(all_cells, verdicts)
    return lines, verdicts
