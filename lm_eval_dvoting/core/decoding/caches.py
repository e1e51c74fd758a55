"""The cache policies: what one step's forward pass covers, and what it keeps for later
steps (a row's `cache`, one of `CACHE_POLICIES`).

* `none`: every row runs over its whole sequence (prompt + generation region). Exact.
* `prefix` (Fast-dLLM's prefix cache): a row entering a new block runs over its whole
  sequence and keeps the keys and values of everything before the block; while it stays
  in that block it runs over the block and what follows only, attending to the kept prefix.
* `block` (block diffusion, LLaDA2): a row keeps the keys and values of everything before
  its current block; each pass runs from the end of what it keeps to the end of its
  current block (the first pass of a block also covers the blocks finished since, whose
  keys and values it then keeps). A block never sees a later one, so what is kept is final:
  exact, the same tokens as `none` (tested), and on by default for that family.
* `dual` (Fast-dLLM's dual cache): as `prefix`, and the keys and values after the block
  are kept too; while it stays in the block it runs over the block alone (for Dream also
  the token before the block, whose output predicts the block's first position; Fast-dLLM's
  Dream code reads that prediction from the block's first position itself, which we do
  not copy). Only the block's logits exist then, so the entropy rule's hand-over to the
  next block waits for the next step, which starts that block with a full pass.

What is kept is stale (computed before the block's later commits), so `prefix` and `dual`
are approximations of the exact decoder: opt-in, off by default. Rows of one step may mix
policies: the rows that run over their whole sequence share one pass, the rows that reuse
what they kept share another.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

import torch

from lm_eval_dvoting.core.decoding.rules import Window
from lm_eval_dvoting.core.decoding.state import DecodeRow, KeptKeysValues, left_pad
from lm_eval_dvoting.models.common import PrefixCache


def accepts_cache(model: torch.nn.Module) -> bool:
    """Whether the model's `hidden_states` takes a key/value `cache` (this package's models)."""
    return "cache" in _parameters(getattr(model, "hidden_states", None))


def accepts_position_ids(model: torch.nn.Module) -> bool:
    return "position_ids" in _parameters(getattr(model, "hidden_states", None) or model.forward)


def _parameters(function: Any) -> Sequence[str]:
    try:
        return [] if function is None else list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return []


class StepLogits:
    """The logits of one step, computed lazily at the positions asked for.

    Our own models expose `hidden_states` and `logits_from_hidden`: the head (a
    vocabulary-sized matmul) then runs only at the positions the rules ask for, and for
    all rows in one call (`many`), so the head's weight is read once per round rather
    than once per row. Any other module (e.g. a scripted test model) is run as
    `model(ids, mask)` and its logits are read where asked.
    Each row's outputs sit in one of the step's passes at `column = offset + g` for the
    prediction of generation index g; `window` is the range of g a pass covers.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._where: dict[int, tuple[torch.Tensor, int, int, Window, bool]] = {}
        self._known: dict[
            int, tuple[dict[int, int], torch.Tensor]
        ] = {}  # row -> ({position: k}, logits)

    def add(
        self,
        members: Sequence[int],
        outputs: torch.Tensor,
        offsets: Sequence[int],
        windows: Sequence[Window] | None = None,
        are_logits: bool = False,
    ) -> None:
        """Row `members[k]`'s outputs are `outputs[k]` (hidden states, or logits)."""
        for local, (index, offset) in enumerate(zip(members, offsets)):
            window = None if windows is None else windows[local]
            self._where[index] = (outputs, local, offset, window, are_logits)

    def window(self, index: int) -> Window:
        return self._where[index][3]

    def remember(self, index: int, positions: Sequence[int], logits: torch.Tensor) -> None:
        """Keep row `index`'s logits at `positions` (what `many` gave), so that a later
        request of this step for positions all among them runs no head call again: the
        observer computes every masked position's logits, the rules then ask for the
        block's. (In float32 on the CPU the head gives a position the same logits in any
        batch, so the commits are `single`'s exactly; in bfloat16 or on an accelerator the
        call's shape may move the last bit, as the rows sharing a pass may.)"""
        self._known[index] = ({position: k for k, position in enumerate(positions)}, logits)

    def many(self, wanted: Sequence[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """Float32 logits (len(positions), vocab) for each (row, generation positions) pair,
        with one head call for all (none for the pairs `remember`ed)."""
        known = [
            bool(positions)
            and index in self._known
            and all(p in self._known[index][0] for p in positions)
            for index, positions in wanted
        ]
        computed = iter(self._compute([pair for pair, seen in zip(wanted, known) if not seen]))
        return [
            self._recall(index, positions) if seen else next(computed)
            for (index, positions), seen in zip(wanted, known)
        ]

    def _recall(self, index: int, positions: list[int]) -> torch.Tensor:
        rows, logits = self._known[index]
        return logits[
            torch.tensor([rows[p] for p in positions], dtype=torch.long, device=logits.device)
        ]

    def _compute(self, wanted: Sequence[tuple[int, list[int]]]) -> list[torch.Tensor]:
        if not wanted:
            return []
        picked = []
        for index, positions in wanted:
            outputs, local, offset, _, are_logits = self._where[index]
            columns = torch.tensor(
                [offset + p for p in positions], dtype=torch.long, device=outputs.device
            )
            picked.append(outputs[local, columns])
        if self._where[wanted[0][0]][4]:
            return [logits.float() for logits in picked]
        sizes = [len(positions) for _, positions in wanted]
        return list(self.model.logits_from_hidden(torch.cat(picked)).float().split(sizes))


class ForwardPass:
    """Runs one step's forward pass for the active rows, each under its cache policy."""

    def __init__(self, model: torch.nn.Module, pad_id: int, device: torch.device) -> None:
        self.model, self.pad_id, self.device = model, pad_id, device
        self.shift = int(getattr(model, "logits_shift", 0))
        self.block_causal = bool(getattr(model, "block_causal", False))
        self.can_cache = accepts_cache(model)
        self.pass_positions = accepts_position_ids(model)

    def check(self, row: DecodeRow) -> None:
        if row.cache != "none" and not self.can_cache:
            raise ValueError(
                f"cache={row.cache} (or prefix_cache) needs one of this package's LLaDA/Dream "
                "models (hidden_states "
                f"with a cache); {type(self.model).__name__} has none: run with cache=none (the "
                "default)"
            )

    def run(
        self, rows: Sequence[DecodeRow], starts: Sequence[int], keeps: Sequence[bool]
    ) -> StepLogits:
        """The step's logits. `starts`: each row's current block start; `keeps`: whether
        a later step in that block could reuse what this pass would keep for the row."""
        logits = StepLogits(self.model)
        plain = [i for i, row in enumerate(rows) if row.cache == "none"]
        blocks = [i for i, row in enumerate(rows) if row.cache == "block"]
        if plain:
            self._plain(rows, plain, logits)
        if blocks:
            self._blocks(rows, blocks, starts, logits)
        reusing = [
            i
            for i, (row, start) in enumerate(zip(rows, starts))
            if row.cache in ("prefix", "dual")
            and row.kept is not None
            and row.kept.block_start == start
        ]
        fresh = sorted(set(range(len(rows))) - set(reusing) - set(plain) - set(blocks))
        if fresh:
            self._fresh(rows, fresh, starts, keeps, logits)
        if reusing:
            self._reuse(rows, reusing, starts, logits)
        return logits

    def _block_lengths(
        self, rows: Sequence[DecodeRow], members: Sequence[int]
    ) -> dict[str, torch.Tensor]:
        """The block-causal model's `block_lengths` argument (nothing for the others)."""
        if not self.block_causal:
            return {}
        return {
            "block_lengths": torch.tensor(
                [rows[i].block_length for i in members], device=self.device
            )
        }

    def _plain(self, rows: Sequence[DecodeRow], members: Sequence[int], logits: StepLogits) -> None:
        """Rows over their whole sequence, no cache."""
        ids, attention, positions = left_pad(
            [torch.cat([rows[i].prompt, rows[i].tokens]) for i in members], self.pad_id, self.device
        )
        # Each row's real tokens sit at positions 0..n-1 whatever its padding, so a row's
        # numbers do not depend on the rows it is batched with.
        kwargs = {"position_ids": positions} if self.pass_positions else {}
        kwargs.update(self._block_lengths(rows, members))
        offsets = [ids.shape[1] - rows[i].gen_length - self.shift for i in members]
        if hasattr(self.model, "hidden_states") and hasattr(self.model, "logits_from_hidden"):
            logits.add(members, self.model.hidden_states(ids, attention, **kwargs), offsets)
        else:
            logits.add(members, self.model(ids, attention, **kwargs), offsets, are_logits=True)

    def _blocks(
        self,
        rows: Sequence[DecodeRow],
        members: list[int],
        starts: Sequence[int],
        logits: StepLogits,
    ) -> None:
        """Block diffusion's cache: the rows that keep nothing yet in one pass, the others in
        another."""
        fresh = [i for i in members if rows[i].kept is None]
        for group in (fresh, [i for i in members if rows[i].kept is not None]):
            if group:
                self._block_pass(rows, group, starts, logits)

    def _block_pass(
        self, rows: Sequence[DecodeRow], group: list[int], starts: Sequence[int], logits: StepLogits
    ) -> None:
        """Each row from the end of what it keeps to the end of its current block; keeps the
        keys and values of what lies before that block."""
        begins = [
            0 if rows[i].kept is None else rows[i].kept.prefix_keys[0].shape[1] for i in group
        ]
        block_starts = [rows[i].prompt.numel() + starts[i] for i in group]
        ends = [start + rows[i].block_length for i, start in zip(group, block_starts)]
        sequences = [
            torch.cat([rows[i].prompt, rows[i].tokens])[b:e] for i, b, e in zip(group, begins, ends)
        ]
        ids, attention, positions = left_pad(sequences, self.pad_id, self.device)
        positions = positions + torch.tensor(begins, device=self.device)[:, None]
        fresh = (
            rows[group[0]].kept is None
        )  # `_blocks` never mixes rows that keep something with rows that do not
        cache = PrefixCache() if fresh else _stack_kept([rows[i].kept for i in group], self.device)
        hidden = self.model.hidden_states(
            ids, attention, positions, cache=cache, **self._block_lengths(rows, group)
        )
        width = ids.shape[1]
        for local, (i, begin, start) in enumerate(zip(group, begins, block_starts)):
            first = width - sequences[local].numel()
            done = slice(first, first + start - begin)  # finished blocks: final keys and values
            _keep_finished(rows[i], start, cache, local, done)
        prompts = [rows[i].prompt.numel() for i in group]
        offsets = [width - s.numel() + p - b for s, p, b in zip(sequences, prompts, begins)]
        windows = [(max(0, b - p), e - p) for b, e, p in zip(begins, ends, prompts)]
        logits.add(group, hidden, offsets, windows)

    def _fresh(
        self,
        rows: Sequence[DecodeRow],
        fresh: list[int],
        starts: Sequence[int],
        keeps: Sequence[bool],
        logits: StepLogits,
    ) -> None:
        """The rows that reuse nothing, over their whole sequences; keeps what the cached
        rows can reuse in a later step of the same block."""
        sequences = [torch.cat([rows[i].prompt, rows[i].tokens]) for i in fresh]
        ids, attention, positions = left_pad(sequences, self.pad_id, self.device)
        keep = [local for local, i in enumerate(fresh) if rows[i].cache != "none" and keeps[i]]
        record = PrefixCache() if keep else None
        hidden = self.model.hidden_states(ids, attention, positions, cache=record)
        for local in keep:
            i = fresh[local]
            first = ids.shape[1] - sequences[local].numel()  # the row's first real column
            rows[i].kept = self._cut(record, local, first, rows[i], starts[i])
        logits.add(fresh, hidden, [ids.shape[1] - rows[i].gen_length - self.shift for i in fresh])

    def _cut(
        self, record: PrefixCache, local: int, first: int, row: DecodeRow, start: int
    ) -> KeptKeysValues:
        """The keys and values of a row's prefix (before its block; for Dream before the
        token ahead of it) and, for the dual cache, of its suffix (after the block)."""
        prompt = row.prompt.numel()
        prefix = slice(first, first + prompt + start - self.shift)
        kept = KeptKeysValues(
            start,
            [k[local, :, prefix].clone() for k in record.new_keys],
            [v[local, :, prefix].clone() for v in record.new_values],
        )
        if row.cache == "dual":
            suffix = slice(
                first + prompt + start + row.block_length, first + prompt + row.gen_length
            )
            kept.suffix_keys = [k[local, :, suffix].clone() for k in record.new_keys]
            kept.suffix_values = [v[local, :, suffix].clone() for v in record.new_values]
        return kept

    def _reuse(
        self,
        rows: Sequence[DecodeRow],
        reusing: list[int],
        starts: Sequence[int],
        logits: StepLogits,
    ) -> None:
        """The rows that reuse what they kept: `prefix` rows over their block and what
        follows, `dual` rows over their block, all in one pass."""
        kept = [rows[i].kept for i in reusing]
        begins = [k.prefix_keys[0].shape[1] for k in kept]
        ends = [self._query_end(rows[i], starts[i]) for i in reusing]
        sequences = [torch.cat([rows[i].prompt, rows[i].tokens]) for i in reusing]
        ids, attention, positions = left_pad(
            [s[b:e] for s, b, e in zip(sequences, begins, ends)], self.pad_id, self.device
        )
        positions = positions + torch.tensor(begins, device=self.device)[:, None]
        cache = _stack_kept(kept, self.device)
        hidden = self.model.hidden_states(ids, attention, positions, cache=cache)
        offsets = [
            ids.shape[1] - (e - rows[i].prompt.numel()) - self.shift for i, e in zip(reusing, ends)
        ]
        windows = [
            (starts[i], starts[i] + rows[i].block_length) if rows[i].cache == "dual" else None
            for i in reusing
        ]
        logits.add(reusing, hidden, offsets, windows)

    @staticmethod
    def _query_end(row: DecodeRow, start: int) -> int:
        """Where a reusing row's pass ends (an index into prompt + generation region)."""
        end = row.prompt.numel() + row.gen_length
        return end if row.cache == "prefix" else row.prompt.numel() + start + row.block_length


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
        [k[:, :shared] for k in kept.prefix_keys],
        [v[:, :shared] for v in kept.prefix_values],
    )


def _stack_kept(kept: Sequence[KeptKeysValues], device: torch.device) -> PrefixCache:
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
    return cache


def _empty_like(layers: list[torch.Tensor]) -> list[torch.Tensor]:
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
    mask = torch.zeros((len(keys), longest), dtype=torch.long, device=device)
    for r, length in enumerate(lengths):
        if left:
            mask[r, longest - length :] = 1
        else:
            mask[r, :length] = 1
    stacked_keys, stacked_values = [], []
    for layer in range(len(keys[0])):
        stacked_keys.append(torch.stack([_pad(row[layer], longest, left) for row in keys]))
        stacked_values.append(torch.stack([_pad(row[layer], longest, left) for row in values]))
    return stacked_keys, stacked_values, mask


def _pad(tensor: torch.Tensor, length: int, left: bool) -> torch.Tensor:
    pad = length - tensor.shape[1]
    return torch.nn.functional.pad(tensor, (0, 0, pad, 0) if left else (0, 0, 0, pad))


def _keep_finished(row: DecodeRow, start: int, cache: PrefixCache, local: int, done: slice) -> None:
    """Block diffusion: keep the row's keys and values up to `start` (what it kept before, and
    this pass's `done` columns of batch row `local`): finished blocks are final."""
    keys = [k[local, :, done] for k in cache.new_keys]
    values = [v[local, :, done] for v in cache.new_values]
    kept = row.kept
    if kept is not None:
        keys = [torch.cat([old, new], dim=1) for old, new in zip(kept.prefix_keys, keys)]
        values = [torch.cat([old, new], dim=1) for old, new in zip(kept.prefix_values, values)]
    row.kept = KeptKeysValues(start, [k.clone() for k in keys], [v.clone() for v in values])
