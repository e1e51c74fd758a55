"""`cache=block`: block diffusion's (LLaDA2): the keys and values of finished blocks, which
are final (a block never sees a later one), so it changes no output; LLaDA2's default.

A row keeps the keys and values of everything before its current block; each pass runs from
the end of what it keeps to the end of its current block (the first pass of a block also
covers the blocks finished since, whose keys and values it then keeps)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from lm_eval_dvoting.core.decoding.kept import LayersInOne, all_layers, stack_kept
from lm_eval_dvoting.core.decoding.state import DecodeRow, KeptKeysValues
from lm_eval_dvoting.core.parts.base import BLOCK_CAUSAL, CachePolicy, register
from lm_eval_dvoting.models.common import PrefixCache as KeyValueCache


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
        """The rows that keep nothing yet in one pass, the others in another."""
        fresh = [i for i in members if rows[i].kept is None]
        for group in (fresh, [i for i in members if rows[i].kept is not None]):
            if group:
                _block_pass(forward, rows, group, starts, logits)


def _block_pass(
    forward: Any,
    rows: Sequence[DecodeRow],
    group: list[int],
    starts: Sequence[int],
    logits: Any,
) -> None:
    """Each row from the end of what it keeps to the end of its current block; keeps the
    keys and values of what lies before that block."""
    begins = [0 if rows[i].kept is None else rows[i].kept.prefix_keys[0].shape[1] for i in group]
    block_starts = [rows[i].prompt.numel() + starts[i] for i in group]
    ends = [start + rows[i].block_length for i, start in zip(group, block_starts)]
    sequences = [rows[i].sequence(b, e) for i, b, e in zip(group, begins, ends)]
    ids, attention, positions = forward.padded(sequences, begins)
    lengths = [e - b for b, e in zip(begins, ends)]
    # `run_pass` never mixes rows that keep something with rows that do not
    fresh = rows[group[0]].kept is None
    cache = KeyValueCache() if fresh else stack_kept([rows[i].kept for i in group], forward.device)
    hidden = forward.model.hidden_states(
        ids, attention, positions, cache=cache, **forward.block_lengths(rows, group)
    )
    width = ids.shape[1]
    for local, (i, begin, start) in enumerate(zip(group, begins, block_starts)):
        first = width - lengths[local]
        done = slice(first, first + start - begin)  # finished blocks: final keys and values
        _keep_finished(rows[i], start, cache, local, done)
    prompts = [rows[i].prompt.numel() for i in group]
    offsets = [width - n + p - b for n, p, b in zip(lengths, prompts, begins)]
    windows = [(max(0, b - p), e - p) for b, e, p in zip(begins, ends, prompts)]
    logits.add(group, hidden, offsets, windows)


def _keep_finished(
    row: DecodeRow, start: int, cache: KeyValueCache, local: int, done: slice
) -> None:
    """Block diffusion: keep the row's keys and values up to `start` (what it kept before, and
    this pass's `done` columns of batch row `local`): finished blocks are final. A pass
    within the block the row kept up to finishes none: what it keeps stays as it is, with
    no copy (a copy of every kept key, per step, before)."""
    kept = row.kept
    if kept is not None and done.stop == done.start:
        return
    keys = torch.stack([k[local, :, done] for k in cache.new_keys])  # (layers, kv, ...)
    values = torch.stack([v[local, :, done] for v in cache.new_values])
    if kept is not None:
        keys = torch.cat([all_layers(kept.prefix_keys), keys], dim=2)
        values = torch.cat([all_layers(kept.prefix_values), values], dim=2)
    row.kept = KeptKeysValues(start, LayersInOne(keys), LayersInOne(values))
