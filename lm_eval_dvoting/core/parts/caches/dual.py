"""`cache=dual`: Fast-dLLM's dual cache: a pass covers the current block only, the prefix's
and the suffix's keys and values kept (approximate)."""

from lm_eval_dvoting.core.parts.base import CachePolicy, register


@register
class DualCache(CachePolicy):
    name = "dual"
    order = 30
    predicts_beyond_block = False
    whole_prediction_refusal = (
        "cache=dual does not apply to {which}: the dual cache computes no prediction beyond "
        "the current block, and the vote needs every step's whole prediction; use cache=none "
        "(the default) or cache=prefix"
    )
