"""`single`: one sample, fixed schedule, `steps = L`, temperature 0 (LLaDA's baseline)."""

from __future__ import annotations

from typing import Any

from lm_eval_dvoting.core.parts.base import BIDIRECTIONAL, BLOCK_CAUSAL, Strategy, register
from lm_eval_dvoting.core.parts.samples import QuestionPlan, fresh_sample

NO_VOTE = (
    "vote={vote} does not apply to strategy={strategy}, which has no vote: use "
    "strategy=temporal for the temporal vote over one decode's steps"
)


@register
class Single(Strategy):
    name = "single"
    order = 10
    reads = ("block_length",)
    models = (BIDIRECTIONAL, BLOCK_CAUSAL)
    follows_task_sampling = True
    full_steps = True
    votes = ("plain",)
    vote_refusal = NO_VOTE

    @classmethod
    def plan(cls, settings: Any, mask_id: int, same_answer: Any) -> QuestionPlan:
        yield [fresh_sample(settings, mask_id)]
