"""`vote=plain`: one vote per sample's final answer (the default but for strategy=temporal);
the chosen sample is the first carrying the winner."""

from __future__ import annotations

from typing import Any

from lm_eval_dvoting.core.parts.base import BIDIRECTIONAL, BLOCK_CAUSAL, Vote, register


@register
class Plain(Vote):
    name = "plain"
    order = 10
    models = (BIDIRECTIONAL, BLOCK_CAUSAL)

    @classmethod
    def result(cls, question: Any, settings: Any, same_answer: Any) -> Any:
        return question.result(same_answer)
