"""`majority`: `n` fresh samples, fixed schedule, `steps = L/2`, temperature 0.9, vote.
(`decoder="entropy"` gives it dVoting's entropy-threshold decoder instead of the fixed
schedule: the ablation rows of `dvoting compare`.)"""

from __future__ import annotations

from typing import Any

from lm_eval_dvoting.core.parts.base import BIDIRECTIONAL, BLOCK_CAUSAL, Strategy, register
from lm_eval_dvoting.core.parts.samples import QuestionPlan, fresh_sample


@register
class Majority(Strategy):
    name = "majority"
    order = 20
    reads = ("block_length", "n")
    models = (BIDIRECTIONAL, BLOCK_CAUSAL)
    temperature = 0.9

    @classmethod
    def plan(cls, settings: Any, mask_id: int, same_answer: Any) -> QuestionPlan:
        yield [fresh_sample(settings, mask_id) for _ in range(settings.n)]
