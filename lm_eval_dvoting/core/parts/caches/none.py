"""`cache=none`: every pass covers the whole sequence (exact; the default but for LLaDA2)."""

from lm_eval_dvoting.core.parts.base import BIDIRECTIONAL, BLOCK_CAUSAL, CachePolicy, register


@register
class NoCache(CachePolicy):
    name = "none"
    order = 10
    models = (BIDIRECTIONAL, BLOCK_CAUSAL)
    default_for = (BIDIRECTIONAL,)
