"""Part 1 of `bench/run.py`: every strategy at every batch size, through
`strategies.decode_questions`.

A *cell* is one (model, strategy, batch size) combination. Each run of a cell drives
its questions with `max_rows` = the batch size and records the wall time, the time
inside the model (`TimedModel`), forward passes, output-head calls, NFE, the peak
resident set and a digest of every sample's tokens. The cells are run in an
interleaved order and repeated; the table shows medians. The digest must not change
between repeats (the decoding is seeded), and equal digests across batch sizes show
that batching does not change the answers.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from bench.timing import PeakMemory, TimedModel
from bench.workloads import Workload
from lm_eval_dvoting.core.strategies import StrategySettings, decode_questions


@dataclass
class Cell:
    """One (model, strategy, batch size) combination and what its runs measured."""

    model: str
    strategy: str
    batch: int
    questions: int
    wall: list[float] = field(default_factory=list)
    forward: list[float] = field(default_factory=list)
    passes: int = 0
    head_calls: int = 0
    nfe: float = 0.0
    rows_per_pass: float = 0.0
    peak_mib: list[float] = field(default_factory=list)
    tokens_digest: str = ""
    answers: list[Any] = field(default_factory=list)

    @property
    def median_wall(self) -> float:
        return statistics.median(self.wall)

    @property
    def qps(self) -> float:
        return self.questions / self.median_wall

    @property
    def seconds_per_question(self) -> float:
        return self.median_wall / self.questions

    @property
    def seconds_per_pass(self) -> float:
        return statistics.median(self.forward) / self.passes

    @property
    def decoder_share(self) -> float:
        return statistics.median((w - f) / w for w, f in zip(self.wall, self.forward))

    @property
    def peak(self) -> float | None:
        return max(self.peak_mib) if self.peak_mib and None not in self.peak_mib else None

    def as_json(self) -> dict[str, Any]:
        """The raw fields and the derived numbers the tables show, for `--json`."""
        return asdict(self) | {
            "qps": self.qps,
            "decoder_share": self.decoder_share,
            "seconds_per_pass": self.seconds_per_pass,
        }


def tokens_digest(results) -> str:
    """A short hash of every sample's tokens and NFE: equal digests mean identical decoding."""
    h = hashlib.sha256()
    for r in results:
        h.update(r.samples.numpy().tobytes())
        h.update(str(r.nfe).encode())
    return h.hexdigest()[:16]


def run_cell(work: Workload, timed: TimedModel, cell: Cell) -> None:
    """Drive the cell's questions once and append the measurements to `cell`."""
    count = cell.questions
    settings = StrategySettings(strategy=cell.strategy, gen_length=work.gen_length)
    timed.reset()
    with PeakMemory(torch.device("cpu")) as memory:
        start = time.perf_counter()
        results = decode_questions(
            timed,
            work.prompts[:count],
            settings,
            work.extract,
            list(range(count)),
            max_rows=cell.batch,
        )
        wall = time.perf_counter() - start
    cell.wall.append(wall)
    cell.forward.append(timed.seconds)
    cell.peak_mib.append(memory.peak_mib)
    cell.passes = timed.passes
    cell.head_calls = timed.head_calls
    cell.nfe = sum(r.nfe for r in results) / count
    cell.rows_per_pass = sum(r.nfe for r in results) / max(1, timed.passes)
    digest = tokens_digest(results)
    if cell.tokens_digest and digest != cell.tokens_digest:
        raise RuntimeError(
            f"{cell.model} {cell.strategy} batch {cell.batch}: tokens differ between repeats"
        )
    cell.tokens_digest = digest
    cell.answers = [r.answers[r.chosen] for r in results]


def interleaved_order(cells: list[Cell], repeat: int) -> list[Cell]:
    """The cells in the order of one repeat.

    Every repeat visits all cells, each time in a rotated order (reversed on odd
    repeats), so that a slow spell of the shared machine does not fall on one cell only.
    """
    shift = repeat % len(cells)
    order = cells[shift:] + cells[:shift]
    if repeat % 2:
        order.reverse()
    return order


def _warm_up(work: Workload, timed: TimedModel) -> None:
    """One short unrecorded run, so that the allocator and lazy initialisation are not charged to a
    cell."""
    decode_questions(
        timed,
        work.prompts[:1],
        StrategySettings(strategy="single", gen_length=work.gen_length),
        work.extract,
        [0],
        max_rows=1,
    )


def _print_run(work: Workload, cell: Cell) -> None:
    share = (cell.wall[-1] - cell.forward[-1]) / cell.wall[-1]
    print(
        f"  [{work.name}] {cell.strategy:8s} batch {cell.batch:2d}: {cell.wall[-1]:7.2f} s, "
        f"NFE {cell.nfe:6.1f}, decoder share {share:.2f}",
        flush=True,
    )


def run_cells(
    work: Workload,
    strategies: list[str],
    batch_sizes: list[int],
    questions: int,
    hex_questions: int,
    repeats: int,
) -> list[Cell]:
    """Every strategy at every batch size on `work`, `repeats` times, interleaved.

    hex gets `hex_questions` (its 25 samples per question make it the slow one).
    """
    timed = TimedModel(work.model)
    cells = [
        Cell(work.name, s, b, hex_questions if s == "hex" else questions)
        for s in strategies
        for b in batch_sizes
    ]
    _warm_up(work, timed)
    for repeat in range(repeats):
        for cell in interleaved_order(cells, repeat):
            run_cell(work, timed, cell)
            _print_run(work, cell)
    return cells


def _fmt_mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def cells_table(cells: list[Cell]) -> list[str]:
    """The Markdown table of one model's cells (medians over the repeats)."""
    lines = [
        "| strategy | batch | questions | q/s | s/question | mean NFE | rows/pass | head "
        "calls/pass | s/forward pass | decoder share | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        lines.append(
            f"| {c.strategy} | {c.batch} | {c.questions} | {c.qps:.3f} | "
            f"{c.seconds_per_question:.3f} | {c.nfe:.1f} | {c.rows_per_pass:.1f} | "
            f"{c.head_calls / max(1, c.passes):.2f} | {c.seconds_per_pass * 1e3:.2f} ms | "
            f"{c.decoder_share * 100:.1f}% | {_fmt_mib(c.peak)} |"
        )
    return lines
