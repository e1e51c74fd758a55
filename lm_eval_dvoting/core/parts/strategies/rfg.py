"""`rfg`: one sample decoded as `single` decodes it, from a `guidance.GuidedModel`: the
policy's logits guided by a reference model's, two passes per step (RFG, arXiv 2509.25604).
"""

from __future__ import annotations

from typing import Any

from lm_eval_dvoting.core.parts.base import Strategy, register
from lm_eval_dvoting.core.parts.samples import QuestionPlan, fresh_sample
from lm_eval_dvoting.core.parts.strategies.single import NO_VOTE


@register
class RFG(Strategy):
    name = "rfg"
    order = 60
    reads = ("block_length", "guidance")
    follows_task_sampling = True
    full_steps = True
    passes_per_step = 2  # the policy's and the reference's
    votes = ("plain",)
    vote_refusal = NO_VOTE
    caches = ("none",)
    cache_refusal = (
        "cache={cache} does not apply to strategy=rfg: its two models would need a cache each; "
        "use cache=none (the default)"
    )
    block_causal_refusal = (
        "strategy=rfg is not available for LLaDA2 models yet: use single, majority, hex, "
        "dvoting or temporal"
    )

    @classmethod
    def plan(cls, settings: Any, mask_id: int, same_answer: Any) -> QuestionPlan:
        yield [fresh_sample(settings, mask_id)]
