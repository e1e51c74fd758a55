"""Block diffusion's rules (LLaDA2, decoding/blocks.py), chosen by the model name, not by
`decoder=`: "threshold" is LLaDA2.0's threshold decoding, "quality" and "speed" LLaDA2.1's
joint threshold decoding with its model card's presets. Preset: (threshold,
editing_threshold); sources: LLaDA2.0's model card and tech report (0.95), LLaDA2.1's model
card "Best Practices"."""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

from lm_eval_dvoting.core.decoding.blocks import BlockThreshold
from lm_eval_dvoting.core.decoding.state import LLADA2_STEPS
from lm_eval_dvoting.core.parts.base import BLOCK_CAUSAL, CommitRule, register

_EDITING_ONLY = {
    "editing_threshold": (
        "editing_threshold is LLaDA2.1's: use --model dvoting-llada21 (editing=quality|speed)"
    ),
    "max_post_steps": (
        "max_post_steps={settings.max_post_steps!r} is LLaDA2.1's (post-fill editing steps): "
        "use --model dvoting-llada21, or leave it out"
    ),
}
_NO_STEPS = {
    "steps": (
        "steps does not apply to LLaDA2.1's joint threshold decoding (editing="
        "{settings.block_decoding}), which commits at least one token per step as upstream; "
        "leave steps out"
    )
}


class BlockRule(CommitRule):
    """A block-diffusion preset: its settings reach the row as one `BlockDecoding`."""

    models = (BLOCK_CAUSAL,)
    block_preset: ClassVar[tuple[float, float | None]] = (0.95, None)
    block_length = 32  # both model cards' block_length (and SGLang's hard-coded value)
    default_steps = LLADA2_STEPS

    @classmethod
    def row_settings(cls, settings: Any) -> dict[str, Any]:
        return dict(steps=None, alpha=None, block=settings.block_settings())

    @classmethod
    def selects(cls, row: Any) -> bool:
        """A row with `block` settings; the three presets share the worker, so the first in
        `order` (`threshold`) decodes every block-diffusion row, whatever its preset."""
        return row.block is not None

    @classmethod
    def worker(cls, mask_id: int, end_ids: Sequence[int]) -> BlockThreshold:
        return BlockThreshold(mask_id, end_ids)


@register
class Threshold(BlockRule):
    name = "threshold"
    order = 40
    reads = ("threshold", "steps", "top_p", "top_k")  # LLaDA2.0 (steps per block)
    block_preset = (0.95, None)
    refused_when_given = _EDITING_ONLY


@register
class Quality(BlockRule):
    name = "quality"
    order = 50
    reads = ("threshold", "editing_threshold", "max_post_steps", "top_p", "top_k")
    block_preset = (0.7, 0.5)
    refused_when_given = _NO_STEPS


@register
class Speed(BlockRule):
    name = "speed"
    order = 60
    reads = ("threshold", "editing_threshold", "max_post_steps", "top_p", "top_k")
    block_preset = (0.5, 0.0)
    refused_when_given = _NO_STEPS
