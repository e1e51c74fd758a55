"""A row's kept keys and values (`KeptKeysValues`): their layout in a reuse pass
(`stack_kept`, the layout the static buffers copy too), what a finished block-cache row
can hand to a new one (`shared_block_prefix`), and their layers in one tensor
(`layers_in_one`, `all_layers`: a copy or a fill of every layer in one kernel)."""

from __future__ import annotations

from typing import Sequence

import torch

from lm_eval_dvoting.core.decoding.rules import host_to_device
from lm_eval_dvoting.core.decoding.state import DecodeRow, KeptKeysValues
from lm_eval_dvoting.models.common import PrefixCache


def shared_block_prefix(
    donor: DecodeRow, prompt: torch.Tensor, tokens: torch.Tensor
) -> KeptKeysValues | None:
    """The keys and values a block-cache row (`donor`, finished) kept that a new row of the
    same block length can start from: those of the whole blocks before the first position
    where the new sequence (`prompt` + `tokens`, masks included) differs from the donor's.
    A block never sees a later one, so they are exactly what the new row would compute
    (a dVoting remask sample recomputes only its blocks from the first remasked one on).
    None when nothing is shared."""
    kept = donor.kept
    if kept is None or donor.cache != "block":
        return None
    mine = torch.cat([prompt, tokens]).to(donor.tokens.device)
    theirs = torch.cat([donor.prompt, donor.tokens])
    width = min(mine.numel(), theirs.numel(), kept.prefix_keys[0].shape[1])
    differs = (mine[:width] != theirs[:width]).nonzero()
    same = width if not len(differs) else int(differs[0])
    shared = same // donor.block_length * donor.block_length
    if shared == 0:
        return None
    return KeptKeysValues(
        shared,
        LayersInOne(all_layers(kept.prefix_keys)[:, :, :shared]),
        LayersInOne(all_layers(kept.prefix_values)[:, :, :shared]),
    )


def stack_kept(kept: Sequence[KeptKeysValues], device: torch.device) -> PrefixCache:
    """One cache for the rows' kept keys and values: prefixes left-padded to the longest,
    suffixes (dual cache rows) right-padded to the longest, with masks marking the real ones."""
    cache = PrefixCache()
    cache.keys, cache.values, cache.mask = _stack(
        [k.prefix_keys for k in kept], [k.prefix_values for k in kept], device, left=True
    )
    if any(k.suffix_keys is not None for k in kept):
        keys = [
            k.suffix_keys if k.suffix_keys is not None else _empty_like(k.prefix_keys) for k in kept
        ]
        values = [
            k.suffix_values if k.suffix_values is not None else _empty_like(k.prefix_values)
            for k in kept
        ]
        cache.suffix_keys, cache.suffix_values, cache.suffix_mask = _stack(
            keys, values, device, left=False
        )
    cache.no_kept_padding = not kept_padding(kept)
    return cache


def kept_padding(kept: Sequence[KeptKeysValues]) -> bool:
    """Whether laying the rows' kept keys out together pads any row: their prefixes, or their
    suffixes (none kept counts as none long), are not all of one length."""
    prefixes = {kept_columns(k.prefix_keys) for k in kept}
    suffixes = {kept_columns(k.suffix_keys) for k in kept}
    return len(prefixes) > 1 or len(suffixes) > 1


def kept_columns(layers: list[torch.Tensor] | None) -> int:
    """The columns of kept per-layer (kv_heads, columns, head_dim) tensors (None: 0)."""
    return 0 if layers is None else layers[0].shape[1]


def _empty_like(layers: list[torch.Tensor]) -> list[torch.Tensor]:
    """No columns of `layers`, as views (of one tensor where they are)."""
    if isinstance(layers, LayersInOne):
        return LayersInOne(layers.whole[:, :, :0])
    return [t[:, :0] for t in layers]


def _stack(
    keys: Sequence[list[torch.Tensor]],
    values: Sequence[list[torch.Tensor]],
    device: torch.device,
    left: bool,
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """Per layer, the rows' (kv_heads, length, head_dim) tensors padded to one length and
    stacked, and the (rows, length) 0/1 mask of the real positions."""
    lengths = [row[0].shape[1] for row in keys]
    longest = max(lengths)
    real = host_to_device(lengths, torch.long, device)[:, None]
    columns = torch.arange(longest, device=device)
    mask = (columns >= longest - real if left else columns < real).long()
    return _padded_rows(keys, longest, left), _padded_rows(values, longest, left), mask


def _padded_rows(rows: Sequence[list[torch.Tensor]], length: int, left: bool) -> list[torch.Tensor]:
    """Per layer, the rows' tensors padded with zeros to `length` columns and stacked: one
    (layers, rows, kv_heads, length, head_dim) tensor, each row's every layer copied in at
    once (`all_layers`), whose per-layer views are returned (a kernel a row, not one a row
    and layer; no padded copy of a row on the way)."""
    first = rows[0][0]
    layers, kv_heads, _, head_dim = len(rows[0]), *first.shape
    stacked = first.new_zeros((layers, len(rows), kv_heads, length, head_dim))
    for r, row in enumerate(rows):
        columns = row[0].shape[1]
        where = slice(length - columns, length) if left else slice(0, columns)
        stacked[:, r, :, where] = all_layers(row)
    return list(stacked.unbind(0))


class LayersInOne(list):
    """Per-layer tensors that are views of one (layers, ...) tensor, `whole` (`layers_in_one`
    makes them; a list like any other, not to be changed in place)."""

    def __init__(self, whole: torch.Tensor) -> None:
        super().__init__(whole.unbind(0))
        self.whole = whole


def layers_in_one(tensors: Sequence[torch.Tensor]) -> LayersInOne:
    """Copies of per-layer tensors (one shape) laid out in one (layers, ...) tensor, as its
    per-layer views: one copy kernel for all the layers (a clone per layer is one each),
    and `all_layers` hands them on whole."""
    return LayersInOne(torch.stack(list(tensors)))


def all_layers(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-layer tensors (one shape) as one (layers, ...) tensor, for reading: the tensor
    they are views of where `layers_in_one` made them, else a stacked copy."""
    if isinstance(tensors, LayersInOne):
        return tensors.whole
    return torch.stack(list(tensors))
