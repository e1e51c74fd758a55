"""`decoder=entropy`: dVoting's entropy threshold: every masked position of the block whose
entropy is below `alpha` per step, at least one: every masked position of the block whose
float64 entropy (of the un-noised logits) is below `alpha`, else the one lowest-entropy
position; a block completed in a step hands the same logits on to the next block (the
one-token fallback at most once per step). `decoder=entropy` on
`single`/`majority` is the ablation that tells dVoting's decoder from its voting."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from lm_eval_dvoting.core.decoding.rules import (
    FirstMaskedBlock,
    RowWork,
    Window,
    begins,
    host_to_device,
    host_tokens,
    inside_window,
)
from lm_eval_dvoting.core.decoding.state import (
    DecodeRow,
    entropy,
    filtered_gumbel,
    masked_block,
    suppress_mask,
)
from lm_eval_dvoting.core.parts.base import CommitRule, register

COMMITTED = -1  # a committed position in a row's host copy of its tokens (never the mask id)


@dataclass(eq=False)
class _ThresholdWork(RowWork):
    """An entropy-threshold row within one step: its current block and that block's
    masked positions, and the next block's, fetched ahead when the current one surely
    completes in this step."""

    # host copy of row.tokens, in step with its masks: a position committed in this step
    # holds `COMMITTED` there (its token is on the device: the rule reads nothing back)
    tokens: list[int] = field(default_factory=list)
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


class EntropyThreshold(FirstMaskedBlock):
    """dVoting's entropy-threshold rule with the hand-over to the next block."""

    def begin(self, index: int, row: DecodeRow, window: Window) -> _ThresholdWork:
        work = _ThresholdWork(index, row, tokens=list(host_tokens(row)), window=window)
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
        if found is None or not inside_window(work.window, found[1]):
            return False
        work.start, work.positions = found
        return True

    def _positions_after(self, work: _ThresholdWork) -> list[int]:
        """The masked positions of the block `_next_block` will find once the current
        block's masks are committed (empty when none is left after it, or outside the window)."""
        length = work.row.block_length
        found = masked_block(work.tokens, self.mask_id, length, work.start + length)
        return [] if found is None or not inside_window(work.window, found[1]) else found[1]

    def _commit_round(self, works: list[_ThresholdWork]) -> list[_ThresholdWork]:
        """Every row's current block in one round: one float64 entropy pass for all rows'
        positions, read to the host (the one read the rule needs: its decisions, a handful
        of positions per row, are taken on host lists), and the candidates computed at the
        committed positions only (`committed_candidates`), written on the device. Row by
        row the numbers are those of a row alone: every operation works along the
        vocabulary. A row whose block completes goes on to its next block."""
        sizes = [int(w.logits.shape[0]) for w in works]
        logits64 = suppress_mask(torch.cat([w.logits for w in works]), self.mask_id)
        entropies = entropy(logits64).tolist()
        commits = [
            self._decide(w, entropies[b : b + n]) for w, b, n in zip(works, begins(sizes), sizes)
        ]
        chosen = committed_candidates(logits64, [w.row for w in works], sizes, commits)
        going_on = []
        for work, size, commit, at in zip(works, sizes, commits, begins([len(c) for c in commits])):
            if not commit:
                continue  # nothing confident and the fallback already used in this step
            picked = [work.positions[k] for k in commit]
            tokens = work.row.tokens
            tokens[host_to_device(picked, torch.long, tokens.device)] = chosen[
                at : at + len(commit)
            ].to(tokens.dtype)
            for position in picked:
                work.tokens[position] = COMMITTED
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


def committed_candidates(
    logits64: torch.Tensor,
    rows: Sequence[DecodeRow],
    sizes: Sequence[int],
    commits: Sequence[list[int]],
) -> torch.Tensor:
    """The token committed at each of `commits` (per row, indices into its slice), on the
    device, the rows' laid end to end.

    Temperature 0: the argmax. T > 0: LLaDA's float64 Gumbel-max, argmax(exp(logits) /
    (-log u)^T), with u drawn from the row's generator for the committed positions
    only, one vocabulary-sized row of noise per position in block order. (The
    entropy rule decides what commits before any candidate is drawn, so noise at
    positions that do not commit would never be used: not drawing it saves the
    decoder's largest float64 cost and leaves every committed token's distribution
    as it is.) At T > 0 the draw is from the tokens top-p/top-k keep (decoding/sampling.py).
    """
    flat = [begin + k for begin, commit in zip(begins(sizes), commits) for k in commit]
    picked = logits64[host_to_device(flat, torch.long, logits64.device)]
    chosen = picked.argmax(-1)
    # rows of one temperature and filters share the arithmetic
    by_temperature: dict[tuple[float, Any, Any], list[tuple[int, int, DecodeRow]]] = {}
    offset = 0
    for row, commit in zip(rows, commits):
        if commit and row.temperature > 0:
            key = (row.temperature, row.top_p, row.top_k)
            by_temperature.setdefault(key, []).append((offset, len(commit), row))
        offset += len(commit)
    for (temperature, top_p, top_k), members in by_temperature.items():
        indices = torch.cat([torch.arange(o, o + n, device=logits64.device) for o, n, _ in members])
        noise = _uniform_noise([(n, row) for _, n, row in members], picked.shape[-1], picked.device)
        chosen[indices] = filtered_gumbel(picked[indices], temperature, noise, top_p, top_k)
    return chosen


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


@register
class Entropy(CommitRule):
    name = "entropy"
    order = 20
    reads = ("alpha", "top_p", "top_k")

    @classmethod
    def row_settings(cls, settings: Any) -> dict[str, Any]:
        return dict(steps=None, alpha=settings.alpha, threshold=None)

    @classmethod
    def selects(cls, row: Any) -> bool:
        return row.block is None and row.steps is None and row.alpha is not None

    @classmethod
    def worker(cls, mask_id: int, end_ids: Sequence[int]) -> EntropyThreshold:
        return EntropyThreshold(mask_id)
