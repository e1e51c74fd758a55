"""`decoder=confidence`: Fast-dLLM's rule: commit the most confident masked position of the
block and every other one whose candidate's probability is >= `threshold` (for single,
majority and, instead of its entropy rule, dvoting)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from lm_eval_dvoting.core.decoding.rules import (
    FirstMaskedBlock,
    RowWork,
    ScheduledWork,
    Window,
)
from lm_eval_dvoting.core.decoding.state import DecodeRow, candidates, suppress_mask
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
        start = self.block_start(row)
        masked = row.tokens[start : start + row.block_length] == self.mask_id
        return ScheduledWork(
            index,
            row,
            wanted=(start + masked.nonzero().squeeze(1)).tolist(),
            start=start,
            masked=masked,
        )

    def commit(self, works: Sequence[ScheduledWork]) -> list[RowWork]:
        for work in works:
            row, masked = work.row, work.masked
            logits64 = suppress_mask(work.logits, self.mask_id)
            chosen = candidates(
                logits64, row.temperature, row.generator, masked, row.top_p, row.top_k
            )
            probability = torch.softmax(logits64, dim=-1).gather(-1, chosen[:, None]).squeeze(-1)
            commit = probability >= row.threshold
            commit[int(probability.argmax())] = True  # the first maximum: leftmost on ties
            positions = torch.tensor(work.wanted, device=row.tokens.device)
            row.tokens[positions[commit]] = chosen[commit].to(row.tokens.dtype)
        return []


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
