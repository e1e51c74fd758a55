"""`vote=plain`: one vote per sample's final answer (the default but for strategy=temporal)."""

from lm_eval_dvoting.core.parts.base import BIDIRECTIONAL, BLOCK_CAUSAL, Vote, register


@register
class Plain(Vote):
    name = "plain"
    order = 10
    models = (BIDIRECTIONAL, BLOCK_CAUSAL)
