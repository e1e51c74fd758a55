"""`cache=dual`: Fast-dLLM's dual cache: a pass covers the current block only, the prefix's
and the suffix's keys and values kept (approximate).

As `prefix` (whose passes its rows share), and the keys and values after the block are kept
too; while a row stays in its block it runs over the block alone (for Dream also the token
before the block, whose output predicts the block's first position). Only the block's
logits exist then, so the entropy rule's hand-over to the next block waits for the next
step, which starts that block with a full pass."""

from __future__ import annotations

from typing import Any

from lm_eval_dvoting.core.decoding.kept import layers_in_one
from lm_eval_dvoting.core.decoding.rules import Window
from lm_eval_dvoting.core.decoding.state import DecodeRow, KeptKeysValues
from lm_eval_dvoting.core.parts.base import register
from lm_eval_dvoting.core.parts.caches.prefix import PrefixCache


@register
class DualCache(PrefixCache):
    name = "dual"
    order = 30
    predicts_beyond_block = False
    whole_prediction_refusal = (
        "cache=dual does not apply to {which}: the dual cache computes no prediction beyond "
        "the current block, and the vote needs every step's whole prediction; use cache=none "
        "(the default) or cache=prefix"
    )

    @classmethod
    def query_end(cls, row: DecodeRow, start: int) -> int:
        return row.prompt.numel() + start + row.block_length

    @classmethod
    def window(cls, row: DecodeRow, start: int) -> Window:
        return (start, start + row.block_length)

    @classmethod
    def keep_suffix(cls, kept: KeptKeysValues, record: Any, local: int, suffix: slice) -> None:
        kept.suffix_keys = layers_in_one([k[local, :, suffix] for k in record.new_keys])
        kept.suffix_values = layers_in_one([v[local, :, suffix] for v in record.new_values])
