"""`cache=none`: every pass covers the whole sequence (exact; the default but for LLaDA2)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from lm_eval_dvoting.core.decoding.state import DecodeRow, left_pad
from lm_eval_dvoting.core.parts.base import BIDIRECTIONAL, BLOCK_CAUSAL, CachePolicy, register


@register
class NoCache(CachePolicy):
    name = "none"
    order = 10
    models = (BIDIRECTIONAL, BLOCK_CAUSAL)
    default_for = (BIDIRECTIONAL,)
    uses_cache = False

    @classmethod
    def run_pass(
        cls,
        forward: Any,
        rows: Sequence[DecodeRow],
        members: list[int],
        starts: Sequence[int],
        keeps: Sequence[bool],
        logits: Any,
    ) -> None:
        """The rows over their whole sequence in one pass, keeping nothing."""
        ids, attention, positions = left_pad(
            [rows[i].sequence() for i in members],
            forward.pad_id,
            forward.device,
            mask_only_if_padded=True,
        )
        # Each row's real tokens sit at positions 0..n-1 whatever its padding, so a row's
        # numbers do not depend on the rows it is batched with.
        kwargs = {"position_ids": positions} if forward.pass_positions else {}
        kwargs.update(forward.block_lengths(rows, members))
        offsets = [ids.shape[1] - rows[i].gen_length - forward.shift for i in members]
        model = forward.model
        if forward.full_steps is not None:  # cached_steps=graphs|compiled: captured passes
            logits.add(members, forward.full_steps.run(ids, attention, positions), offsets)
        elif hasattr(model, "hidden_states") and hasattr(model, "logits_from_hidden"):
            logits.add(members, model.hidden_states(ids, attention, **kwargs), offsets)
        else:  # another module: HF's convention, a 0/1 mask always
            attention = torch.ones_like(ids) if attention is None else attention
            logits.add(members, model(ids, attention, **kwargs), offsets, are_logits=True)
