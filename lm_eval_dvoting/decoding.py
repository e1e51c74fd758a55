"""The one-sample decoder: masked-diffusion decoding of a batch of rows.

Semantics (ALGORITHM.md section 1): each step is one forward pass over prompt +
generation region; the mask token's logit is suppressed; candidates are the argmax
(temperature 0) or LLaDA's float64 Gumbel-max (temperature > 0); only masked
positions of a row's leftmost unfinished block may be committed. Two commit rules:

* fixed schedule (`steps`): LLaDA's original decoder, `steps / num_blocks` steps per
  block, the block's masks spread evenly over them (remainder to the earliest
  steps), highest confidence first (`remasking="low_confidence"`: the softmax
  probability of the chosen token; `"random"`: a uniform score);
* entropy threshold (`alpha`): dVoting's decoder, commit every masked position of the
  block whose float64 entropy (of the un-noised logits) is below `alpha`, else the one
  lowest-entropy position; a block completed in a step hands the same logits on to
  the next block (the one-token fallback at most once per step).

Rows are independent: each has its own prompt length, generation length, block
length, rule, temperature and random generator, so a row decodes to the same tokens
alone or inside any batch in float32 (tested; the attention kernel sums a padded row
in another order, so logits may move by ~1e-7 relative, which has flipped no decision in
any test or in docs/batch_invariance.md). In bfloat16/float16 the same reordering moves
a row's numbers by one unit in the last place (2^-8 relative in bfloat16; on a GPU
kernels are also chosen by shape), which flips decisions at near-ties; everything from the logits on
(softmax, entropy, confidence, Gumbel noise) runs in float64 whatever the model dtype. `RowDecoder` lets a caller (the strategies) add rows
between steps, so a slot freed by a finished row is refilled at once.

Cost: the forward pass runs once per step for all active rows; the output head,
softmax, entropy and noise are computed only at the positions of the block(s) that
can be committed in that step, never over the whole sequence times the vocabulary.
The fixed schedule draws the block's noise at all its masked positions (the noisy
candidates decide, through their confidence, which positions commit); the entropy
rule decides from the un-noised logits, so it draws noise only for the positions it
commits.

Random streams: every draw comes from the row's generator, so a seed fixes a row's
tokens whatever the batch. The stream is not the release's (which draws noise over
the whole batch x sequence x vocabulary at every step); the distribution of every
committed token is.
"""
from __future__ import annotations

import inspect
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

from .models.common import PrefixCache

REMASKING_RULES = ("low_confidence", "random")


@dataclass(frozen=True)
class DecodeResult:
    """What `generate` returns: the generation region and the forward passes per row."""

    tokens: torch.Tensor  # (batch, gen_length)
    nfe: torch.Tensor  # (batch,) forward passes during which the row still had masks


@dataclass(eq=False)  # rows are compared by identity; their tensors have no truth value
class DecodeRow:
    """One row to decode: a prompt and a (partly) masked generation region.

    `tokens` holds the generation region and is updated in place; positions holding
    the mask id are decoded, the others stay fixed. `tag` is free for the caller.
    """

    prompt: torch.Tensor  # (prompt_length,) token ids, no padding
    tokens: torch.Tensor  # (gen_length,)
    block_length: int
    steps: int | None = None
    alpha: float | None = None
    temperature: float = 0.0
    remasking: str = "low_confidence"
    generator: torch.Generator | None = None
    tag: Any = None
    prefix_cache: bool = False  # Fast-dLLM's prefix key/value cache (`RowDecoder._cached_pass`)
    nfe: int = 0
    # fixed-schedule progress: the block being decoded, the step within it, and how
    # many tokens each of its steps commits
    _block: int = field(default=0, repr=False)
    _step_in_block: int = field(default=0, repr=False)
    _schedule: list[int] = field(default_factory=list, repr=False)
    # prefix cache (when `prefix_cache`): per-layer keys and values of the
    # prompt and finished blocks, and the block start they were made for
    _cache: tuple[list[torch.Tensor], list[torch.Tensor]] | None = field(default=None, repr=False)
    _cache_start: int | None = field(default=None, repr=False)

    @property
    def gen_length(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length


def validate_row_settings(
    gen_length: int,
    block_length: int,
    steps: int | None,
    alpha: float | None,
    temperature: float,
    remasking: str,
) -> None:
    """Raise a ValueError naming the setting that cannot work, and what would."""
    if gen_length <= 0:
        raise ValueError(f"gen_length must be positive, got {gen_length}")
    if block_length <= 0 or gen_length % block_length:
        raise ValueError(
            f"block_length {block_length} must be positive and divide gen_length {gen_length}"
        )
    if (steps is None) == (alpha is None):
        raise ValueError("give exactly one of steps (fixed schedule) or alpha (entropy threshold)")
    if steps is not None:
        num_blocks = gen_length // block_length
        if steps <= 0 or steps % num_blocks:
            raise ValueError(
                f"steps {steps} must be a positive multiple of the number of blocks "
                f"({gen_length} / {block_length} = {num_blocks})"
            )
    # `not ... >= 0` also refuses NaN; temperature=inf would turn the Gumbel noise into inf/0 (garbage samples)
    if alpha is not None and not alpha >= 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}: e.g. 0.3 (inf commits every masked position at once)")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}: 0 for greedy, e.g. 0.6 to sample")
    if remasking not in REMASKING_RULES:
        raise ValueError(f"remasking must be one of {REMASKING_RULES}, got {remasking!r}")


def _accepts_cache(model: torch.nn.Module) -> bool:
    forward = getattr(model, "hidden_states", None)
    try:
        return forward is not None and "cache" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False


def _left_pad(sequences: Sequence[torch.Tensor], pad_id: int,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded ids, 0/1 attention mask and positions (0.. over the real tokens)."""
    width = max(s.numel() for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long, device=device)
    attention = torch.zeros((len(sequences), width), dtype=torch.long, device=device)
    for i, sequence in enumerate(sequences):
        ids[i, width - sequence.numel():] = sequence
        attention[i, width - sequence.numel():] = 1
    return ids, attention, (attention.cumsum(-1) - 1).clamp(min=0)


def _accepts_position_ids(model: torch.nn.Module) -> bool:
    forward = getattr(model, "hidden_states", None) or model.forward
    try:
        return "position_ids" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False


class _StepLogits:
    """The logits of one forward pass, computed lazily at the positions asked for.

    Our own models expose `hidden_states` and `logits_from_hidden`: the head (a
    vocabulary-sized matmul) then runs only at the masked positions of the blocks that
    can commit, and for all rows of a step in one call (`many`), so the head's weight
    is read once per step rather than once per row.
    Any other module (e.g. a scripted test model) is run as `model(ids, mask)`.
    """

    def __init__(self, model: torch.nn.Module, ids: torch.Tensor, attention_mask: torch.Tensor,
                 pass_positions: bool) -> None:
        self.model = model
        kwargs: dict[str, Any] = {}
        if pass_positions:
            # Each row's real tokens sit at positions 0..n-1 whatever its padding, so a
            # row's numbers do not depend on the rows it is batched with.
            kwargs["position_ids"] = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        if hasattr(model, "hidden_states") and hasattr(model, "logits_from_hidden"):
            self.hidden = model.hidden_states(ids, attention_mask, **kwargs)
            self.full = None
        else:
            self.hidden = None
            self.full = model(ids, attention_mask, **kwargs)

    @classmethod
    def of_hidden(cls, model: torch.nn.Module, hidden: torch.Tensor) -> "_StepLogits":
        """Logits of hidden states computed elsewhere (the prefix-cache path)."""
        self = cls.__new__(cls)
        self.model, self.hidden, self.full = model, hidden, None
        return self

    def at(self, row: int, columns: torch.Tensor) -> torch.Tensor:
        """Float32 logits (len(columns), vocab) of batch row `row` at `columns`."""
        if self.full is not None:
            return self.full[row, columns].float()
        return self.model.logits_from_hidden(self.hidden[row, columns]).float()

    def many(self, wanted: Sequence[tuple[int, torch.Tensor]]) -> list[torch.Tensor]:
        """`at(row, columns)` for each (row, columns) pair, with one head call for all."""
        if not wanted:
            return []
        if self.full is not None or len(wanted) == 1:
            return [self.at(row, columns) for row, columns in wanted]
        sizes = [int(columns.numel()) for _, columns in wanted]
        rows = torch.cat([torch.full((n,), row, dtype=torch.long, device=columns.device)
                          for n, (row, columns) in zip(sizes, wanted)])
        logits = self.model.logits_from_hidden(self.hidden[rows, torch.cat([c for _, c in wanted])]).float()
        return list(logits.split(sizes))


def _candidates(logits64: torch.Tensor, temperature: float, generator: torch.Generator | None,
                block_masked: torch.Tensor | None = None) -> torch.Tensor:
    """Argmax at temperature 0; LLaDA's float64 Gumbel-max sampling otherwise.

    `logits64` may hold only the masked positions of a block (`block_masked`, a
    boolean over the whole block): the noise is still drawn for the whole block, so
    the random stream is the same, and is then used at the masked positions only.
    """
    if temperature == 0:
        return logits64.argmax(-1)
    shape = logits64.shape if block_masked is None else (block_masked.numel(), logits64.shape[-1])
    noise = torch.rand(shape, dtype=torch.float64, device=logits64.device, generator=generator)
    if shape[0] != logits64.shape[0]:  # some block positions are not masked
        noise = noise[block_masked]
    gumbel = (-torch.log(noise)) ** temperature
    return (logits64.exp() / gumbel).argmax(-1)


def _entropy(logits64: torch.Tensor) -> torch.Tensor:
    log_p = torch.log_softmax(logits64, dim=-1)
    p = log_p.exp()
    # xlogy-style: entries with p = 0 (the suppressed mask token: 0 * -inf = NaN) contribute
    # 0, not NaN; the same sums as torch.where(p > 0, p * log_p, 0) without its two extra
    # vocabulary-sized temporaries
    return -(p * log_p).nan_to_num_(nan=0.0).sum(-1)


class RowDecoder:
    """Decodes rows in shared forward passes; rows may be added between steps.

    Usage: `add(row)` any number of times, then `step()` until `active` is empty;
    `step()` returns the rows that finished during it.
    """

    def __init__(self, model: torch.nn.Module, pad_token_id: int | None = None) -> None:
        self.model = model
        self.caches = _accepts_cache(model)
        self.mask_id = int(model.mask_token_id)
        self.shift = int(getattr(model, "logits_shift", 0))
        self.max_length = getattr(model, "max_length", None)
        self.pad_id = self.mask_id if pad_token_id is None else pad_token_id
        self.pass_positions = _accepts_position_ids(model)
        first_parameter = next(iter(model.parameters()), None)
        self.device = first_parameter.device if first_parameter is not None else torch.device("cpu")
        self.active: list[DecodeRow] = []

    def add(self, row: DecodeRow) -> None:
        validate_row_settings(row.gen_length, row.block_length, row.steps, row.alpha,
                              row.temperature, row.remasking)
        if row.prefix_cache and not self.caches:
            raise ValueError(
                f"prefix_cache needs one of this package's LLaDA/Dream models (hidden_states with a cache); "
                f"{type(self.model).__name__} has none: run without prefix_cache"
            )
        if self.shift and row.prompt.numel() == 0:
            raise ValueError("this model reads predictions one position to the left: the prompt must not be empty")
        total = row.prompt.numel() + row.gen_length
        if self.max_length is not None and total > self.max_length:
            raise ValueError(
                f"prompt ({row.prompt.numel()} tokens) + generation ({row.gen_length}) = {total} tokens "
                f"exceeds the model's maximum length {self.max_length}"
            )
        row.prompt = row.prompt.to(self.device)
        row.tokens = row.tokens.to(self.device).clone()
        if row.steps is not None:
            row._block, row._step_in_block, row._schedule = 0, 0, []
        if self._has_masks(row):
            self.active.append(row)

    def _has_masks(self, row: DecodeRow) -> bool:
        if row.steps is not None and row._block >= row.num_blocks:
            return False
        return bool((row.tokens == self.mask_id).any())

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Left-padded ids and attention mask for the active rows, and their width."""
        ids, attention, _ = _left_pad([torch.cat([r.prompt, r.tokens]) for r in self.active], self.pad_id,
                                      self.device)
        return ids, attention, ids.shape[1]

    def _block_start(self, row: DecodeRow) -> int:
        """The first generation index of the block the row commits in next."""
        if row.steps is not None:
            return row._block * row.block_length
        start, _ = self._masked_block(row.tokens.tolist(), row.block_length)  # an active row has a mask
        return start

    def _cached_pass(self) -> tuple[_StepLogits, int]:
        """One step's forward pass when some row uses Fast-dLLM's prefix cache.

        A row entering a new block runs over its whole sequence, and the keys and
        values of everything before the block (prompt and finished blocks) are kept;
        while it stays in that block, it runs over the block and what follows only,
        attending to the kept keys and values. The kept prefix is stale (it was
        computed before the block's later commits), so outputs differ slightly from
        the uncached decoder: an opt-in approximation, off by default. Rows without
        the cache always run over their whole sequence.
        Hidden states come back right-aligned in one (rows, width, d) tensor, so that
        generation index g of a row sits at column width - L + g as without the cache.
        """
        rows = self.active
        starts = [self._block_start(row) for row in rows]
        reuses = [row.prefix_cache and row._cache_start == start for row, start in zip(rows, starts)]
        kept = [i for i, reuse in enumerate(reuses) if reuse]
        fresh = [i for i, reuse in enumerate(reuses) if not reuse]
        sequences = [torch.cat([row.prompt, row.tokens]) for row in rows]
        width = max(s.numel() for s in sequences)
        parts: list[tuple[list[int], torch.Tensor]] = []
        if fresh:
            ids, attention, positions = _left_pad([sequences[i] for i in fresh], self.pad_id, self.device)
            # keep a prefix only where a later step of the same block can use it
            keep = [(local, i) for local, i in enumerate(fresh) if rows[i].prefix_cache and (
                rows[i].steps is None or rows[i]._step_in_block + 1 < rows[i].steps // rows[i].num_blocks)]
            record = PrefixCache() if keep else None
            hidden = self.model.hidden_states(ids, attention, positions, cache=record)
            for local, i in keep:
                row, prefix = rows[i], rows[i].prompt.numel() + starts[i] - self.shift
                first = ids.shape[1] - sequences[i].numel()
                row._cache = ([k[local, :, first:first + prefix].clone() for k in record.new_keys],
                              [v[local, :, first:first + prefix].clone() for v in record.new_values])
                row._cache_start = starts[i]
            parts.append((fresh, hidden))
        if kept:
            prefixes = [rows[i]._cache[0][0].shape[1] for i in kept]
            ids, attention, positions = _left_pad([sequences[i][p:] for i, p in zip(kept, prefixes)],
                                                  self.pad_id, self.device)
            positions = positions + torch.tensor(prefixes, device=self.device)[:, None]
            longest = max(prefixes)
            cache = PrefixCache(mask=torch.zeros((len(kept), longest), dtype=torch.long, device=self.device))
            for layer in range(len(rows[kept[0]]._cache[0])):
                keys, values = [], []
                for local, i in enumerate(kept):
                    k, v = rows[i]._cache[0][layer], rows[i]._cache[1][layer]
                    pad = longest - k.shape[1]
                    keys.append(torch.nn.functional.pad(k, (0, 0, pad, 0)))
                    values.append(torch.nn.functional.pad(v, (0, 0, pad, 0)))
                    if layer == 0:
                        cache.mask[local, pad:] = 1
                cache.keys.append(torch.stack(keys))
                cache.values.append(torch.stack(values))
            parts.append((kept, self.model.hidden_states(ids, attention, positions, cache=cache)))
        if len(parts) == 1 and parts[0][1].shape[1] == width:
            return _StepLogits.of_hidden(self.model, parts[0][1]), width
        first_hidden = parts[0][1]
        hidden = first_hidden.new_zeros((len(rows), width, first_hidden.shape[-1]))
        for members, part in parts:
            hidden[torch.tensor(members, device=self.device), width - part.shape[1]:] = part
        return _StepLogits.of_hidden(self.model, hidden), width

    @torch.no_grad()
    def step(self) -> list[DecodeRow]:
        """One forward pass for every active row, then each row's commits."""
        if not self.active:
            return []
        if any(row.prefix_cache for row in self.active):
            logits, width = self._cached_pass()
        else:
            ids, attention, width = self._batch()
            logits = _StepLogits(self.model, ids, attention, self.pass_positions)
        # Each row's first block and its masked positions are found before the head
        # runs, so that the head runs once for all rows, at masked positions only.
        # generation index g sits at column width - L + g; its prediction is read
        # `shift` columns to the left (Dream)
        offsets = [width - row.gen_length - self.shift for row in self.active]
        plans: list[tuple[int, torch.Tensor] | None] = []
        wanted: list[tuple[int, torch.Tensor]] = []
        cascades: list[_Cascade] = []
        for i, row in enumerate(self.active):
            if row.steps is not None:
                plan = self._fixed_schedule_plan(row)
                if plan is not None:
                    wanted.append((i, offsets[i] + plan[0] + plan[1].nonzero().squeeze(1)))
            else:
                plan, cascade = None, _Cascade(i, row, row.tokens.tolist())
                self._next_block(cascade)  # an active row has a mask left
                cascades.append(cascade)
                columns = self._columns(cascade, offsets[i])
                if len(cascade.positions) == 1 and (ahead_positions := self._positions_after(cascade)):
                    # the block's last mask commits in this step (the fallback sees to
                    # it), so the step surely goes on to the next block: its positions
                    # join this head call instead of costing a call (a read of the
                    # head's weights) of their own
                    cascade.ahead_positions = ahead_positions
                    ahead = torch.tensor([offsets[i] + p for p in ahead_positions], device=self.device)
                    columns = torch.cat([columns, ahead])
                wanted.append((i, columns))
            plans.append(plan)
        first_logits = dict(zip((i for i, _ in wanted), logits.many(wanted)))
        for cascade in cascades:
            found = first_logits[cascade.index]
            cascade.logits = found[:len(cascade.positions)]
            if cascade.ahead_positions:
                cascade.ahead_logits = found[len(cascade.positions):]
        for i, (row, plan) in enumerate(zip(self.active, plans)):
            row.nfe += 1
            if row.steps is not None:
                first = first_logits.get(i)
                self._fixed_schedule_step(row, plan, None if first is None else self._suppress_mask(first))
        # Entropy-threshold rows commit in rounds: every row's current block in one
        # round, and the rows whose block completed continue in the next block in the
        # next round, from the same forward pass: one head call and one float64 pass
        # per round for all rows, rather than one per row and block.
        while cascades:
            cascades = self._entropy_threshold_round(cascades)
            needed = []
            for cascade in cascades:
                if cascade.ahead_positions and cascade.ahead_positions == cascade.positions:
                    cascade.logits, cascade.ahead_logits = cascade.ahead_logits, None
                else:
                    needed.append(cascade)
            found = logits.many([(c.index, self._columns(c, offsets[c.index])) for c in needed])
            for cascade, found_logits in zip(needed, found):
                cascade.logits = found_logits
            for cascade in cascades:
                cascade.ahead_positions = []
        still_masked = [self._has_masks(r) for r in self.active]
        finished = [r for r, masked in zip(self.active, still_masked) if not masked]
        for row in finished:
            row._cache = None  # free the kept keys and values
        self.active = [r for r, masked in zip(self.active, still_masked) if masked]
        return finished

    def _suppress_mask(self, logits: torch.Tensor) -> torch.Tensor:
        logits64 = logits.double()
        if self.mask_id < logits64.shape[-1]:
            logits64[:, self.mask_id] = float("-inf")  # never commit the mask token
        return logits64

    def _fixed_schedule_plan(self, row: DecodeRow) -> tuple[int, torch.Tensor] | None:
        """The block start and its masked positions if this step commits in it, else None."""
        steps_per_block = row.steps // row.num_blocks
        start = row._block * row.block_length
        masked = row.tokens[start:start + row.block_length] == self.mask_id
        if row._step_in_block == 0:
            # LLaDA's get_num_transfer_tokens: even spread, remainder to the first steps
            count = int(masked.sum())
            base, remainder = divmod(count, steps_per_block)
            row._schedule = [base + 1 if s < remainder else base for s in range(steps_per_block)]
        return (start, masked) if row._schedule[row._step_in_block] else None

    def _fixed_schedule_step(self, row: DecodeRow, plan: tuple[int, torch.Tensor] | None,
                             logits64: torch.Tensor | None) -> None:
        """Commit this step's share of the block, highest confidence first.

        `logits64` holds the masked positions of the block only: the others can never
        be picked (their confidence is -inf and the schedule never asks for more
        tokens than the block has masks).
        """
        if plan is not None:
            start, masked = plan
            block = row.tokens[start:start + row.block_length]
            chosen = torch.zeros_like(block)
            chosen[masked] = _candidates(logits64, row.temperature, row.generator, masked)
            confidence = torch.full(block.shape, float("-inf"), dtype=torch.float64, device=block.device)
            if row.remasking == "low_confidence":
                probs = torch.softmax(logits64, dim=-1)
                confidence[masked] = probs.gather(-1, chosen[masked][:, None]).squeeze(-1)
            else:
                noise = torch.rand(block.shape, dtype=torch.float64, device=block.device, generator=row.generator)
                confidence[masked] = noise[masked]
            picked = confidence.topk(row._schedule[row._step_in_block]).indices
            block[picked] = chosen[picked]
        row._step_in_block += 1
        if row._step_in_block == row.steps // row.num_blocks:
            row._block, row._step_in_block = row._block + 1, 0

    def _masked_block(self, tokens: list[int], length: int, after: int = 0) -> tuple[int, list[int]] | None:
        """The start of the block holding the first mask at or after `after`, and that
        block's masked positions; None when no mask is left there."""
        try:
            first_mask = tokens.index(self.mask_id, after)
        except ValueError:
            return None
        start = first_mask // length * length
        return start, [start + k for k, token in enumerate(tokens[start:start + length]) if token == self.mask_id]

    def _next_block(self, cascade: _Cascade) -> bool:
        """Point `cascade` at the block holding its row's first mask; False if none is left."""
        found = self._masked_block(cascade.tokens, cascade.row.block_length)
        if found is None:
            return False
        cascade.start, cascade.positions = found
        return True

    def _positions_after(self, cascade: _Cascade) -> list[int]:
        """The masked positions of the block `_next_block` will find once the current
        block's masks are committed (empty when none is left after it)."""
        length = cascade.row.block_length
        found = self._masked_block(cascade.tokens, length, cascade.start + length)
        return [] if found is None else found[1]

    def _columns(self, cascade: _Cascade, offset: int) -> torch.Tensor:
        """The batch columns whose predictions are the cascade's masked positions."""
        return torch.tensor([offset + p for p in cascade.positions], dtype=torch.long, device=self.device)

    def _entropy_threshold_round(self, cascades: list[_Cascade]) -> list[_Cascade]:
        """Commit each row's confident masks in its block; return the rows that go on.

        Every cascade's `logits` hold the masked positions of its block only. The rule
        needs only the entropy of the un-noised logits to decide *which* positions
        commit, so the float64 entropy runs once over all rows' positions, the
        decisions (a handful of positions per row) are made on host lists, and the
        candidates (argmax, or at T > 0 float64 Gumbel-max) are computed at the
        committed positions only (`_committed_candidates`). Row by row the numbers are
        those of a row alone: every operation works along the vocabulary. A row whose
        block completes goes on to its next block in the next round; the one-token
        fallback is used at most once per row and step.
        """
        sizes = [int(c.logits.shape[0]) for c in cascades]
        logits64 = self._suppress_mask(torch.cat([c.logits for c in cascades]))
        entropy = _entropy(logits64).tolist()
        commits: list[list[int]] = []  # per cascade: committed indices into its positions
        begin = 0
        for cascade, size in zip(cascades, sizes):
            row_entropy = entropy[begin:begin + size]
            begin += size
            commit = [k for k, value in enumerate(row_entropy) if value < cascade.row.alpha]
            if not commit and not cascade.fallback_used:
                # the first minimum, as argmin over the block's masked positions
                commit = [min(range(size), key=row_entropy.__getitem__)]
                cascade.fallback_used = True
            commits.append(commit)
        chosen = _committed_candidates(logits64, cascades, sizes, commits)
        going_on: list[_Cascade] = []
        for cascade, size, commit, values in zip(cascades, sizes, commits, chosen):
            if not commit:
                continue  # nothing confident and the fallback already used in this step
            row = cascade.row
            picked = [cascade.positions[k] for k in commit]
            row.tokens[torch.tensor(picked, device=row.tokens.device)] = torch.tensor(
                values, dtype=row.tokens.dtype, device=row.tokens.device)
            for position, value in zip(picked, values):
                cascade.tokens[position] = value
            if len(commit) < size:
                continue  # the block is unfinished: the next step continues it
            if self._next_block(cascade):
                going_on.append(cascade)
        return going_on


@dataclass(eq=False)
class _Cascade:
    """An entropy-threshold row within one step: its block and that block's logits."""

    index: int  # the row's index in the step's batch
    row: DecodeRow
    tokens: list[int]  # host copy of row.tokens, kept in step with it
    start: int = 0  # the block's first generation index
    positions: list[int] = field(default_factory=list)  # the block's masked generation indices
    logits: torch.Tensor | None = None  # float32, at `positions`
    fallback_used: bool = False
    # the next block's masked positions and their logits, computed ahead with the first
    # head call when the current block surely completes in this step
    ahead_positions: list[int] = field(default_factory=list)
    ahead_logits: torch.Tensor | None = None


def _committed_candidates(logits64: torch.Tensor, cascades: Sequence[_Cascade], sizes: Sequence[int],
                          commits: Sequence[list[int]]) -> list[list[int]]:
    """The token committed at each of `commits` (per cascade, indices into its slice).

    Temperature 0: the argmax. T > 0: LLaDA's float64 Gumbel-max, argmax(exp(logits) /
    (-log u)^T), with u drawn from the row's generator for the committed positions
    only, one vocabulary-sized row of noise per position in block order. (The
    entropy rule decides what commits before any candidate is drawn, so noise at
    positions that do not commit would never be used: not drawing it saves the
    decoder's largest float64 cost and leaves every committed token's distribution
    as it is.) Rows of one temperature share the arithmetic.
    """
    begins = [0, *itertools.accumulate(sizes[:-1])]
    flat = [begin + k for begin, commit in zip(begins, commits) for k in commit]
    if not flat:
        return [[] for _ in commits]
    picked = logits64[torch.tensor(flat, device=logits64.device)]
    chosen = picked.argmax(-1)
    by_temperature: dict[float, list[tuple[int, int, _Cascade]]] = {}
    offset = 0
    for cascade, commit in zip(cascades, commits):
        if commit and cascade.row.temperature > 0:
            by_temperature.setdefault(cascade.row.temperature, []).append((offset, len(commit), cascade))
        offset += len(commit)
    for temperature, members in by_temperature.items():
        rows = torch.cat([torch.arange(o, o + n, device=logits64.device) for o, n, _ in members])
        noise = torch.cat([torch.rand((n, picked.shape[-1]), dtype=torch.float64, device=logits64.device,
                                      generator=cascade.row.generator) for _, n, cascade in members])
        chosen[rows] = (picked[rows].exp() / (-torch.log(noise)) ** temperature).argmax(-1)
    values = chosen.tolist()
    out, offset = [], 0
    for commit in commits:
        out.append(values[offset:offset + len(commit)])
        offset += len(commit)
    return out


def check_prompt_batch(input_ids: Any, attention_mask: Any = None, model: nn.Module | None = None) -> torch.Tensor:
    """Refuse prompts that would be misread; return the attention mask (all ones if None).

    `input_ids` must be a 2-D integer tensor of token ids >= 0 (a float tensor would be
    cast to ids silently, a 1-D one read as a batch of one-token prompts), below the
    `model`'s embedding size when a model is given, and `attention_mask` a 0/1 tensor of
    the same shape.
    """
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor of token ids, got {type(input_ids).__name__}: "
                        "use torch.tensor(ids, dtype=torch.long)")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be 2-D (batch, length), got shape {tuple(input_ids.shape)}: "
                         "for one prompt pass input_ids[None]")
    if input_ids.dtype == torch.bool or input_ids.is_floating_point() or input_ids.is_complex():
        raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}: "
                         "tokenize the text and pass the ids as torch.long")
    if input_ids.numel() and int(input_ids.min()) < 0:
        raise ValueError(f"input_ids must be token ids >= 0, got {int(input_ids.min())}: "
                         "mark padding with attention_mask, not with negative ids")
    rows = _embedding_rows(model)
    if rows is not None and input_ids.numel() and int(input_ids.max()) >= rows:
        raise ValueError(f"input_ids must be token ids < {rows} (the model's embedding size), got "
                         f"{int(input_ids.max())}: encode the prompt with this checkpoint's tokenizer")
    if attention_mask is None:
        return torch.ones_like(input_ids)
    if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != tuple(input_ids.shape):
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
        raise ValueError(f"attention_mask must be a tensor of input_ids' shape {tuple(input_ids.shape)}, got {shape}")
    if attention_mask.numel() and not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (prompt token)")
    return attention_mask


def _embedding_rows(model: nn.Module | None) -> int | None:
    """How many token ids the model's input embedding holds (None without a model)."""
    if model is None:
        return None
    embedding = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    return None if embedding is None else embedding.num_embeddings


def _as_generators(generator: torch.Generator | Sequence[torch.Generator] | None,
                   batch: int) -> list[torch.Generator | None]:
    if generator is None or isinstance(generator, torch.Generator):
        return [generator] * batch
    generators = list(generator)
    if len(generators) != batch:
        raise ValueError(f"got {len(generators)} generators for {batch} rows: give one, or one per row")
    return generators


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    gen_length: int,
    block_length: int,
    steps: int | None = None,
    alpha: float | None = None,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    init_tokens: torch.Tensor | None = None,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    prefix_cache: bool = False,
) -> DecodeResult:
    """Decode `gen_length` tokens after each (left-padded) prompt row of `input_ids`.

    `steps` selects LLaDA's fixed schedule, `alpha` dVoting's entropy threshold.
    `init_tokens` (batch, gen_length) pre-fills the region: mask-id positions are
    decoded, the others stay fixed. `generator` is one `torch.Generator` shared by the
    rows in order, or one per row (then a row's tokens do not depend on the batch).
    """
    validate_row_settings(gen_length, block_length, steps, alpha, temperature, remasking)
    attention_mask = check_prompt_batch(input_ids, attention_mask, model)
    batch = input_ids.shape[0]
    if init_tokens is None:
        init_tokens = torch.full((batch, gen_length), int(model.mask_token_id), dtype=torch.long)
    if tuple(init_tokens.shape) != (batch, gen_length):
        raise ValueError(f"init_tokens must have shape {(batch, gen_length)}, got {tuple(init_tokens.shape)}")
    decoder = RowDecoder(model)
    rows = [
        DecodeRow(
            prompt=input_ids[i][attention_mask[i].bool()],
            tokens=init_tokens[i],
            block_length=block_length,
            steps=steps,
            alpha=alpha,
            temperature=temperature,
            remasking=remasking,
            generator=g,
            prefix_cache=prefix_cache,
        )
        for i, g in enumerate(_as_generators(generator, batch))
    ]
    for row in rows:
        decoder.add(row)
    while decoder.active:
        decoder.step()
    return DecodeResult(
        tokens=torch.stack([r.tokens for r in rows]).cpu(),
        nfe=torch.tensor([r.nfe for r in rows], dtype=torch.long),
    )
