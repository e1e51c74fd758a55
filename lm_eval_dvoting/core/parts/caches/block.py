"""`cache=block`: block diffusion's (LLaDA2): the keys and values of finished blocks, which
are final (a block never sees a later one), so it changes no output; LLaDA2's default."""

from lm_eval_dvoting.core.parts.base import BLOCK_CAUSAL, CachePolicy, register


@register
class BlockCache(CachePolicy):
    name = "block"
    order = 40
    models = (BLOCK_CAUSAL,)
    default_for = (BLOCK_CAUSAL,)
    predicts_beyond_block = False
    whole_prediction_refusal = (
        "the temporal vote needs every step's whole prediction, which cache=block does not "
        "compute (a pass covers the current block): use cache=none with it"
    )
