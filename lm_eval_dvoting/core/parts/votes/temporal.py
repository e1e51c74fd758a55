"""`vote=temporal`: the answers of every step of every sample, each sample's weights
normalised (`core/temporal.py`; TSCV's vote, extended to the voting strategies)."""

from lm_eval_dvoting.core.parts.base import BIDIRECTIONAL, BLOCK_CAUSAL, Vote, register


@register
class TemporalVote(Vote):
    name = "temporal"
    order = 20
    reads = ("temporal_weight", "temporal_alpha")
    models = (BIDIRECTIONAL, BLOCK_CAUSAL)
    needs_whole_prediction = True
