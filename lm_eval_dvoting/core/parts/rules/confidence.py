"""`decoder=confidence`: Fast-dLLM's rule: commit the most confident masked position of the
block and every other one whose candidate's probability is >= `threshold` (for single,
majority and, instead of its entropy rule, dvoting)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from lm_eval_dvoting.core.decoding.rules import (
    FirstMaskedBlock,
    RowBatch,
    RowWork,
    ScheduledWork,
    Window,
    row_batches,
    token_lists,
)
from lm_eval_dvoting.core.decoding.state import DecodeRow, masked_block
from lm_eval_dvoting.core.parts.base import CommitRule, register

DEFAULT_THRESHOLD = 0.9  # Fast-dLLM's


class ConfidenceThreshold(FirstMaskedBlock):
    """Fast-dLLM's confidence-threshold rule (its `generate(..., threshold=...)`): among
    the current block's masked positions, the one whose candidate has the highest
    probability commits, and so does every other one whose candidate's probability is at
    least `threshold`. Candidates and probabilities as for the fixed schedule (argmax or
    float64 Gumbel-max drawn over the block; the softmax probability of the un-noised
    logits at the candidate). Ties for the highest probability go to the leftmost position.
    A block is done when it has no mask left; the next one starts in the next step."""

    def begin(self, index: int, row: DecodeRow, window: Window) -> ScheduledWork:
        return self.begin_many([(index, row, window)])[0]

    def begin_many(self, items: Sequence[tuple[int, DecodeRow, Window]]) -> list[ScheduledWork]:
        """Each row's work on the block holding its first mask: that block's masked
        positions, from the rows' host tokens (`token_lists`: the step's snapshot, or one
        read of all the rows outside a step)."""
        tokens = token_lists([row for _, row, _ in items])
        works = []
        for (index, row, _), row_tokens in zip(items, tokens):
            start, wanted = masked_block(row_tokens, self.mask_id, row.block_length)
            works.append(ScheduledWork(index, row, wanted=wanted, start=start))
        return works

    def commit(self, works: Sequence[ScheduledWork]) -> list[RowWork]:
        """The rows in as few runs as `row_batches` allows, no host sync."""
        for run in row_batches(works):
            self._commit_run(run)
        return []

    def _commit_run(self, works: Sequence[ScheduledWork]) -> None:
        """All the rows at once (`RowBatch`): one softmax and gather for every row's
        positions, the candidates one call per distribution, the noise drawn row by row
        from each row's generator as a row alone draws it."""
        batch = RowBatch(works, self.mask_id)
        batch.draw_noise(works)
        chosen = batch.candidates()
        probability = torch.softmax(batch.logits64, dim=-1).gather(-1, chosen[:, None]).squeeze(-1)
        threshold = batch.per_row([work.row.threshold for work in batch.works])
        commit = (probability >= threshold) | batch.first_max(probability)
        batch.write(torch.where(commit, chosen, self.mask_id))  # its wanted positions are masks


@register
class Confidence(CommitRule):
    name = "confidence"
    order = 30
    reads = ("threshold", "top_p", "top_k")

    @classmethod
    def row_settings(cls, settings: Any) -> dict[str, Any]:
        return dict(steps=None, alpha=None, threshold=settings.resolved_threshold)

    @classmethod
    def selects(cls, row: Any) -> bool:
        fields = (row.block, row.steps, row.alpha)
        return all(f is None for f in fields) and row.threshold is not None

    @classmethod
    def worker(cls, mask_id: int, end_ids: Sequence[int]) -> ConfidenceThreshold:
        return ConfidenceThreshold(mask_id)
