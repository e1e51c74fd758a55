"""`cache=prefix`: Fast-dLLM's prefix cache: a pass covers the current block and everything
after it, the prefix's keys and values kept (faster at long lengths, slightly different
samples; `prefix_cache=true` is its older spelling)."""

from lm_eval_dvoting.core.parts.base import CachePolicy, register


@register
class PrefixCache(CachePolicy):
    name = "prefix"
    order = 20
