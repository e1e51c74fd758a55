"""`cache=prefix`: Fast-dLLM's prefix cache: a pass covers the current block and everything
after it, the prefix's keys and values kept (faster at long lengths, slightly different
samples; `prefix_cache=true` is its older spelling).

A row entering a new block runs over its whole sequence and keeps the keys and values of
everything before the block; while it stays in that block it runs over the block and what
follows only, attending to the kept prefix. The `dual` policy (dual.py) shares its passes:
the rows that reuse nothing share one pass, the rows that reuse what they kept another."""

from __future__ import annotations

from typing import Any, Sequence

from lm_eval_dvoting.core.decoding.caches import cache_policy
from lm_eval_dvoting.core.decoding.kept import layers_in_one, stack_kept
from lm_eval_dvoting.core.decoding.rules import Window
from lm_eval_dvoting.core.decoding.state import DecodeRow, KeptKeysValues, left_pad
from lm_eval_dvoting.core.parts.base import CachePolicy, register
from lm_eval_dvoting.models.common import PrefixCache as KeyValueCache


@register
class PrefixCache(CachePolicy):
    name = "prefix"
    order = 20

    @classmethod
    def pass_group(cls) -> type[CachePolicy]:
        return PrefixCache  # its subclasses' rows (dual) share its passes

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
        """The rows that reuse nothing (new block, or nothing kept) in one pass over their
        whole sequences, then the rows that reuse what they kept in another."""
        reusing = [
            i for i in members if rows[i].kept is not None and rows[i].kept.block_start == starts[i]
        ]
        fresh = [i for i in members if i not in reusing]
        if fresh:
            _fresh(forward, rows, fresh, starts, keeps, logits)
        if reusing:
            _reuse(forward, rows, reusing, starts, logits)

    @classmethod
    def query_end(cls, row: DecodeRow, start: int) -> int:
        """Where a reusing row's pass ends (an index into prompt + generation region)."""
        return row.prompt.numel() + row.gen_length

    @classmethod
    def window(cls, row: DecodeRow, start: int) -> Window:
        """The generation indices a reusing row's pass predicts (None: all it covers)."""
        return None

    @classmethod
    def keep_suffix(cls, kept: KeptKeysValues, record: Any, local: int, suffix: slice) -> None:
        """Keep the keys and values after the block too (the dual cache): not this one."""


def _fresh(
    forward: Any,
    rows: Sequence[DecodeRow],
    fresh: list[int],
    starts: Sequence[int],
    keeps: Sequence[bool],
    logits: Any,
) -> None:
    """The rows that reuse nothing, over their whole sequences; keeps what the cached
    rows can reuse in a later step of the same block."""
    ids, attention, positions = left_pad(
        [rows[i].sequence() for i in fresh],
        forward.pad_id,
        forward.device,
        mask_only_if_padded=True,
    )
    keep = [local for local, i in enumerate(fresh) if keeps[i]]
    record = KeyValueCache() if keep else None
    hidden = forward.model.hidden_states(ids, attention, positions, cache=record)
    for local in keep:
        i = fresh[local]
        first = ids.shape[1] - rows[i].prompt.numel() - rows[i].gen_length  # its first column
        rows[i].kept = _cut(forward.shift, record, local, first, rows[i], starts[i])
    offsets = [ids.shape[1] - rows[i].gen_length - forward.shift for i in fresh]
    logits.add(fresh, hidden, offsets)


def _cut(
    shift: int, record: KeyValueCache, local: int, first: int, row: DecodeRow, start: int
) -> KeptKeysValues:
    """The keys and values of a row's prefix (before its block; for Dream before the
    token ahead of it) and, for the dual cache, of its suffix (after the block)."""
    prompt = row.prompt.numel()
    prefix = slice(first, first + prompt + start - shift)
    kept = KeptKeysValues(
        start,
        layers_in_one([k[local, :, prefix] for k in record.new_keys]),
        layers_in_one([v[local, :, prefix] for v in record.new_values]),
    )
    suffix = slice(first + prompt + start + row.block_length, first + prompt + row.gen_length)
    cache_policy(row.cache).keep_suffix(kept, record, local, suffix)
    return kept


def _reuse(
    forward: Any,
    rows: Sequence[DecodeRow],
    reusing: list[int],
    starts: Sequence[int],
    logits: Any,
) -> None:
    """The rows that reuse what they kept: `prefix` rows over their block and what
    follows, `dual` rows over their block, all in one pass."""
    kept = [rows[i].kept for i in reusing]
    begins = [k.prefix_keys[0].shape[1] for k in kept]
    policies = [cache_policy(rows[i].cache) for i in reusing]
    ends = [p.query_end(rows[i], starts[i]) for p, i in zip(policies, reusing)]
    ids, attention, positions = forward.padded(
        [rows[i].sequence(b, e) for i, b, e in zip(reusing, begins, ends)], begins
    )
    if forward.static_steps is not None:  # cached_steps=static|graphs: fixed buffers
        hidden = forward.static_steps.run(kept, ids, attention, positions)
    else:
        cache = stack_kept(kept, forward.device)
        hidden = forward.model.hidden_states(ids, attention, positions, cache=cache)
    offsets = [
        ids.shape[1] - (e - rows[i].prompt.numel()) - forward.shift for i, e in zip(reusing, ends)
    ]
    windows = [p.window(rows[i], starts[i]) for p, i in zip(policies, reusing)]
    logits.add(reusing, hidden, offsets, windows)
