"""`decoder=confidence`: Fast-dLLM's rule: commit the most confident masked position of the
block and every other one whose candidate's probability is >= `threshold` (for single,
majority and, instead of its entropy rule, dvoting)."""

from __future__ import annotations

from typing import Any

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
