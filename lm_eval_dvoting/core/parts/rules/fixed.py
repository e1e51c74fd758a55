"""`decoder=fixed`: LLaDA's fixed schedule: `steps` forward passes per sample, a fixed
number of tokens committed per step, chosen by `remasking` (decoding/rules.py)."""

from __future__ import annotations

from typing import Any, Sequence

from lm_eval_dvoting.core.decoding.rules import FixedSchedule
from lm_eval_dvoting.core.parts.base import CommitRule, register


@register
class Fixed(CommitRule):
    name = "fixed"
    order = 10
    reads = ("steps", "remasking")

    @classmethod
    def row_settings(cls, settings: Any) -> dict[str, Any]:
        return dict(steps=settings.steps_run, alpha=None, threshold=None)

    @classmethod
    def selects(cls, row: Any) -> bool:
        return row.block is None and row.steps is not None

    @classmethod
    def worker(cls, mask_id: int, end_ids: Sequence[int]) -> FixedSchedule:
        return FixedSchedule(mask_id)
