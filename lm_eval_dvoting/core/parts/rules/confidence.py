"""`decoder=confidence`: Fast-dLLM's rule: commit the most confident masked position of the
block and every other one whose candidate's probability is >= `threshold` (for single,
majority and, instead of its entropy rule, dvoting)."""

from __future__ import annotations

from typing import Any, Sequence

from lm_eval_dvoting.core.decoding.rules import ConfidenceThreshold
from lm_eval_dvoting.core.parts.base import CommitRule, register

DEFAULT_THRESHOLD = 0.9  # Fast-dLLM's


@register
class Confidence(CommitRule):
    name = "confidence"
    order = 30
    reads = ("threshold",)

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
