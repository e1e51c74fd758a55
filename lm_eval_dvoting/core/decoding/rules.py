"""The commit rules: which generation positions a row needs logits for in a step, and
what it commits given them (ALGORITHM.md section 1, step 4).

* `FixedSchedule` (`steps`): LLaDA's original decoder, `steps / num_blocks` steps per
  block, the block's masks spread evenly over them (remainder to the earliest steps),
  highest confidence first (`remasking="low_confidence"`: the softmax probability of the
  chosen token; `"random"`: a uniform score).
* `EntropyThreshold` (`alpha`): dVoting's decoder, commit every masked position of the
  block whose float64 entropy (of the un-noised logits) is below `alpha`, else the one
  lowest-entropy position; a block completed in a step hands the same logits on to the
  next block (the one-token fallback at most once per step).
* `ConfidenceThreshold` (`threshold`): Fast-dLLM's parallel decoding, commit the block's
  most confident masked position and every other one whose candidate's probability is at
  least `threshold`; the next block starts in the next step (no hand-over).

A rule turns each row into a `RowWork` at the start of a step (`begin`): the positions it
wants logits for. The row batch fetches the logits of every row's wanted positions in one
output-head call and hands them over (`RowWork.receive`); then each rule commits for all
its rows at once (`commit`), and returns the rows that go on in another round of the same
step (only the entropy rule's block hand-over does). Rows are independent: each draws
from its own generator, so no row's tokens depend on the others in its round.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Sequence

import torch

from lm_eval_dvoting.core.decoding.state import (
    DecodeRow,
    candidates,
    entropy,
    masked_block,
    suppress_mask,
)

Window = tuple[int, int] | None  # generation indices [lo, hi) whose logits a step has; None: all


@dataclass(eq=False)
class RowWork:
    """One row's commits within one step: the positions it wants logits for next, and
    the float32 logits it received for them."""

    index: int  # the row's index in the step's batch
    row: DecodeRow
    wanted: list[int] = field(default_factory=list)  # generation indices
    logits: torch.Tensor | None = None

    def receive(self, logits: torch.Tensor) -> None:
        self.logits = logits


class FixedSchedule:
    """LLaDA's fixed schedule: a set number of highest-confidence commits per step."""

    def __init__(self, mask_id: int) -> None:
        self.mask_id = mask_id

    def block_start(self, row: DecodeRow) -> int:
        """The first generation index of the block the row commits in next."""
        return row.progress.block * row.block_length

    def is_done(self, row: DecodeRow) -> bool:
        return row.progress.block >= row.num_blocks

    def begin(self, index: int, row: DecodeRow, window: Window) -> RowWork:
        """This step's share of the block; the block's masked positions if it commits any."""
        progress, start = row.progress, self.block_start(row)
        masked = row.tokens[start : start + row.block_length] == self.mask_id
        if progress.step_in_block == 0:
            # LLaDA's get_num_transfer_tokens: even spread, remainder to the first steps
            base, remainder = divmod(int(masked.sum()), row.steps_per_block)
            progress.counts = [
                base + 1 if s < remainder else base for s in range(row.steps_per_block)
            ]
        work = _ScheduledWork(index, row, start=start, masked=masked)
        if progress.counts[progress.step_in_block]:
            work.wanted = (start + masked.nonzero().squeeze(1)).tolist()
        return work

    def commit(self, works: Sequence["_ScheduledWork"]) -> list[RowWork]:
        """Commit each row's share; a fixed-schedule row never goes on within a step."""
        for work in works:
            row, progress = work.row, work.row.progress
            if work.wanted:
                self._commit_share(work, suppress_mask(work.logits, self.mask_id))
            progress.step_in_block += 1
            if progress.step_in_block == row.steps_per_block:
                progress.block, progress.step_in_block = progress.block + 1, 0
        return []

    @staticmethod
    def _commit_share(work: "_ScheduledWork", logits64: torch.Tensor) -> None:
        """The step's count of the block's masks, highest confidence first.

        `logits64` holds the masked positions of the block only: the others can never
        be picked (their confidence is -inf and the schedule never asks for more
        tokens than the block has masks).
        """
        row, masked = work.row, work.masked
        block = row.tokens[work.start : work.start + row.block_length]
        chosen = torch.zeros_like(block)
        chosen[masked] = candidates(logits64, row.temperature, row.generator, masked)
        confidence = torch.full(
            block.shape, float("-inf"), dtype=torch.float64, device=block.device
        )
        if row.remasking == "low_confidence":
            probs = torch.softmax(logits64, dim=-1)
            confidence[masked] = probs.gather(-1, chosen[masked][:, None]).squeeze(-1)
        else:
            noise = torch.rand(
                block.shape, dtype=torch.float64, device=block.device, generator=row.generator
            )
            confidence[masked] = noise[masked]
        picked = confidence.topk(row.progress.counts[row.progress.step_in_block]).indices
        block[picked] = chosen[picked]


@dataclass(eq=False)
class _ScheduledWork(RowWork):
    start: int = 0  # the block's first generation index
    masked: torch.Tensor | None = None  # bool over the block


@dataclass(eq=False)
class _ThresholdWork(RowWork):
    """An entropy-threshold row within one step: its current block and that block's
    masked positions, and the next block's, fetched ahead when the current one surely
    completes in this step."""

    tokens: list[int] = field(default_factory=list)  # host copy of row.tokens, kept in step with it
    window: Window = None
    start: int = 0
    positions: list[int] = field(default_factory=list)  # the block's masked generation indices
    fallback_used: bool = False
    ahead_positions: list[int] = field(default_factory=list)
    ahead_logits: torch.Tensor | None = None

    def receive(self, logits: torch.Tensor) -> None:
        self.logits = logits[: len(self.positions)]
        if self.ahead_positions:
            self.ahead_logits = logits[len(self.positions) :]


class EntropyThreshold:
    """dVoting's entropy-threshold rule with the hand-over to the next block."""

    def __init__(self, mask_id: int) -> None:
        self.mask_id = mask_id

    def block_start(self, row: DecodeRow) -> int:
        return _first_masked_block_start(row, self.mask_id)

    def is_done(self, row: DecodeRow) -> bool:
        return False  # done when no mask is left, which the row batch checks

    def begin(self, index: int, row: DecodeRow, window: Window) -> _ThresholdWork:
        work = _ThresholdWork(index, row, tokens=row.tokens.tolist(), window=window)
        self._next_block(work)  # an active row has a mask left
        work.wanted = list(work.positions)
        if len(work.positions) == 1 and (ahead := self._positions_after(work)):
            # the block's last mask commits in this step (the fallback sees to it), so
            # the step surely goes on to the next block: its positions join this head
            # call instead of costing a call (a read of the head's weights) of their own
            work.ahead_positions = ahead
            work.wanted += ahead
        return work

    def commit(self, works: Sequence[_ThresholdWork]) -> list[RowWork]:
        """Commit each row's confident masks in its block; return the rows that go on,
        each wanting the next block's logits (none when they were fetched ahead)."""
        going_on = self._commit_round(list(works))
        for work in going_on:
            if work.ahead_positions and work.ahead_positions == work.positions:
                work.logits, work.ahead_logits, work.wanted = work.ahead_logits, None, []
            else:
                work.wanted = list(work.positions)
        for work in going_on:
            work.ahead_positions = []
        return going_on

    def _next_block(self, work: _ThresholdWork) -> bool:
        """Point `work` at the block holding its row's first mask; False if none is left
        (or, under the dual cache, if it lies outside the step's window)."""
        found = masked_block(work.tokens, self.mask_id, work.row.block_length)
        if found is None or not _inside(work.window, found[1]):
            return False
        work.start, work.positions = found
        return True

    def _positions_after(self, work: _ThresholdWork) -> list[int]:
        """The masked positions of the block `_next_block` will find once the current
        block's masks are committed (empty when none is left after it, or outside the window)."""
        length = work.row.block_length
        found = masked_block(work.tokens, self.mask_id, length, work.start + length)
        return [] if found is None or not _inside(work.window, found[1]) else found[1]

    def _commit_round(self, works: list[_ThresholdWork]) -> list[_ThresholdWork]:
        """Every row's current block in one round: one float64 entropy pass for all rows'
        positions, the decisions (a handful of positions per row) on host lists, and the
        candidates computed at the committed positions only (`committed_candidates`). Row
        by row the numbers are those of a row alone: every operation works along the
        vocabulary. A row whose block completes goes on to its next block."""
        sizes = [int(w.logits.shape[0]) for w in works]
        logits64 = suppress_mask(torch.cat([w.logits for w in works]), self.mask_id)
        entropies = entropy(logits64).tolist()
        commits = [
            self._decide(w, entropies[b : b + n]) for w, b, n in zip(works, _begins(sizes), sizes)
        ]
        chosen = committed_candidates(logits64, [w.row for w in works], sizes, commits)
        going_on = []
        for work, size, commit, values in zip(works, sizes, commits, chosen):
            if not commit:
                continue  # nothing confident and the fallback already used in this step
            picked = [work.positions[k] for k in commit]
            row = work.row
            row.tokens[torch.tensor(picked, device=row.tokens.device)] = torch.tensor(
                values, dtype=row.tokens.dtype, device=row.tokens.device
            )
            for position, value in zip(picked, values):
                work.tokens[position] = value
            if len(commit) == size and self._next_block(work):
                going_on.append(work)  # the block is complete: on to the next one
        return going_on

    @staticmethod
    def _decide(work: _ThresholdWork, row_entropy: list[float]) -> list[int]:
        """Indices (into the block's masked positions) below alpha, else the one lowest."""
        commit = [k for k, value in enumerate(row_entropy) if value < work.row.alpha]
        if not commit and not work.fallback_used:
            # the first minimum, as argmin over the block's masked positions
            commit = [min(range(len(row_entropy)), key=row_entropy.__getitem__)]
            work.fallback_used = True
        return commit


class ConfidenceThreshold:
    """Fast-dLLM's confidence-threshold rule (its `generate(..., threshold=...)`): among
    the current block's masked positions, the one whose candidate has the highest
    probability commits, and so does every other one whose candidate's probability is at
    least `threshold`. Candidates and probabilities as for the fixed schedule (argmax or
    float64 Gumbel-max drawn over the block; the softmax probability of the un-noised
    logits at the candidate). Ties for the highest probability go to the leftmost position.
    A block is done when it has no mask left; the next one starts in the next step."""

    def __init__(self, mask_id: int) -> None:
        self.mask_id = mask_id

    def block_start(self, row: DecodeRow) -> int:
        return _first_masked_block_start(row, self.mask_id)

    def is_done(self, row: DecodeRow) -> bool:
        return False  # done when no mask is left, which the row batch checks

    def begin(self, index: int, row: DecodeRow, window: Window) -> _ScheduledWork:
        start = self.block_start(row)
        masked = row.tokens[start : start + row.block_length] == self.mask_id
        return _ScheduledWork(
            index,
            row,
            wanted=(start + masked.nonzero().squeeze(1)).tolist(),
            start=start,
            masked=masked,
        )

    def commit(self, works: Sequence[_ScheduledWork]) -> list[RowWork]:
        for work in works:
            row, masked = work.row, work.masked
            logits64 = suppress_mask(work.logits, self.mask_id)
            chosen = candidates(logits64, row.temperature, row.generator, masked)
            probability = torch.softmax(logits64, dim=-1).gather(-1, chosen[:, None]).squeeze(-1)
            commit = probability >= row.threshold
            commit[int(probability.argmax())] = True  # the first maximum: leftmost on ties
            positions = torch.tensor(work.wanted, device=row.tokens.device)
            row.tokens[positions[commit]] = chosen[commit].to(row.tokens.dtype)
        return []


def _first_masked_block_start(row: DecodeRow, mask_id: int) -> int:
    """The start of the block holding the row's first mask (an active row has one)."""
    return masked_block(row.tokens.tolist(), mask_id, row.block_length)[0]


def _inside(window: Window, positions: list[int]) -> bool:
    return window is None or all(window[0] <= p < window[1] for p in positions)


def _begins(sizes: Sequence[int]) -> list[int]:
    return [0, *itertools.accumulate(sizes[:-1])]


def committed_candidates(
    logits64: torch.Tensor,
    rows: Sequence[DecodeRow],
    sizes: Sequence[int],
    commits: Sequence[list[int]],
) -> list[list[int]]:
    """The token committed at each of `commits` (per row, indices into its slice).

    Temperature 0: the argmax. T > 0: LLaDA's float64 Gumbel-max, argmax(exp(logits) /
    (-log u)^T), with u drawn from the row's generator for the committed positions
    only, one vocabulary-sized row of noise per position in block order. (The
    entropy rule decides what commits before any candidate is drawn, so noise at
    positions that do not commit would never be used: not drawing it saves the
    decoder's largest float64 cost and leaves every committed token's distribution
    as it is.) Rows of one temperature share the arithmetic.
    """
    flat = [begin + k for begin, commit in zip(_begins(sizes), commits) for k in commit]
    if not flat:
        return [[] for _ in commits]
    picked = logits64[torch.tensor(flat, device=logits64.device)]
    chosen = picked.argmax(-1)
    by_temperature: dict[float, list[tuple[int, int, DecodeRow]]] = {}
    offset = 0
    for row, commit in zip(rows, commits):
        if commit and row.temperature > 0:
            by_temperature.setdefault(row.temperature, []).append((offset, len(commit), row))
        offset += len(commit)
    for temperature, members in by_temperature.items():
        indices = torch.cat([torch.arange(o, o + n, device=logits64.device) for o, n, _ in members])
        noise = _uniform_noise([(n, row) for _, n, row in members], picked.shape[-1], picked.device)
        chosen[indices] = (picked[indices].exp() / (-torch.log(noise)) ** temperature).argmax(-1)
    values = chosen.tolist()
    return [values[b : b + len(c)] for b, c in zip(_begins([len(c) for c in commits]), commits)]


def _uniform_noise(
    members: Sequence[tuple[int, DecodeRow]], vocab: int, device: torch.device
) -> torch.Tensor:
    """`n` float64 rows of uniform noise over the vocabulary from each row's generator, in
    the rows' order (each row's stream as if drawn alone)."""
    return torch.cat(
        [
            torch.rand((n, vocab), dtype=torch.float64, device=device, generator=row.generator)
            for n, row in members
        ]
    )
