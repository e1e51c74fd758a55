"""`decoder=entropy`: dVoting's entropy threshold: every masked position of the block whose
entropy is below `alpha` per step, at least one (decoding/rules.py). `decoder=entropy` on
`single`/`majority` is the ablation that tells dVoting's decoder from its voting."""

from __future__ import annotations

from typing import Any, Sequence

from lm_eval_dvoting.core.decoding.rules import EntropyThreshold
from lm_eval_dvoting.core.parts.base import CommitRule, register


@register
class Entropy(CommitRule):
    name = "entropy"
    order = 20
    reads = ("alpha",)

    @classmethod
    def row_settings(cls, settings: Any) -> dict[str, Any]:
        return dict(steps=None, alpha=settings.alpha, threshold=None)

    @classmethod
    def selects(cls, row: Any) -> bool:
        return row.block is None and row.steps is None and row.alpha is not None

    @classmethod
    def worker(cls, mask_id: int, end_ids: Sequence[int]) -> EntropyThreshold:
        return EntropyThreshold(mask_id)
