"""`temporal`: one sample decoded as `single` decodes it (fixed schedule, block 32,
`steps = L/2`, temperature 0: the TSCV paper's settings), answered by a vote over the
answers of its steps (`core/temporal.py`): no extra forward pass."""

from __future__ import annotations

from typing import Any

from lm_eval_dvoting.core.parts.base import BIDIRECTIONAL, BLOCK_CAUSAL, Strategy, register
from lm_eval_dvoting.core.parts.samples import QuestionPlan, fresh_sample

BLOCK_LENGTH = 32  # the TSCV paper's block length (its code's default), when it divides L


@register
class Temporal(Strategy):
    name = "temporal"
    order = 50
    reads = ("block_length",)
    models = (BIDIRECTIONAL, BLOCK_CAUSAL)
    follows_task_sampling = True
    default_vote = "temporal"
    votes = ("temporal",)
    vote_refusal = (
        "vote={vote} does not apply to strategy=temporal, whose answer is the temporal vote: "
        "use strategy=single for the decode's final answer"
    )
    default_block_doc = "32 where it divides the length, else max_gen_toks/16"

    @classmethod
    def default_block_length(cls, gen_length: int) -> int | None:
        """The paper's 32 where it fits (else the usual L/16)."""
        block = min(BLOCK_LENGTH, gen_length)
        return block if gen_length % block == 0 else None

    @classmethod
    def plan(cls, settings: Any, mask_id: int, same_answer: Any) -> QuestionPlan:
        yield [fresh_sample(settings, mask_id)]
