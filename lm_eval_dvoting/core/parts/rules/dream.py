"""`decoder=dream`: Dream's own `diffusion_generate` algorithms (`alg`: origin, maskgit_plus,
topk_margin, entropy), with its timestep schedule and its top-p/top-k sampling, as
Dream-v0-Instruct-7B's generation_utils.py decodes.

Per step of a block that has `S` steps (the whole answer is one block unless `block_length`
is given; then each block runs Dream's schedule with `steps / num_blocks` steps), with
`t, s = linspace(1, eps, S + 1)[i, i + 1]` (float32, as the file) and the block's `n` masked
positions:

* logits (float64, the mask token's at -inf, ALGORITHM.md 1.1) divided by the temperature
  when it is above 0, then top-p and top-k (decoding/sampling.py), softmax: `probs`;
* maskgit_plus / topk_margin / entropy: `k = int(n * (1 - s / t))` positions commit (all
  that are left at the block's last step; none: nothing is drawn). A position's candidate is
  the argmax of `probs` (temperature 0) or a draw from it (temperature > 0: Gumbel-max on
  the filtered, tempered logits with float64 uniforms from the row's generator, one row of
  V per position); its confidence is the candidate's probability (maskgit_plus: every
  masked position draws first, in block order), top-1 minus top-2 probability, or
  sum(p log(p + 1e-10)) (these two need no draw: only the `k` committed positions draw,
  after the choice, in the order chosen). The `k` are the most confident (`alg_temp` 0 or
  None; ties to the leftmost), or drawn without replacement from softmax(confidence /
  alg_temp) (`torch.multinomial` with the row's generator);
* origin: each masked position commits with probability `1 - s / t` (1 at the last step:
  n float64 uniforms, drawn every step), its token drawn as above at the positions that
  commit only.

The rows of a step commit together where they rank (maskgit_plus, topk_margin, entropy at
`alg_temp` 0 or None: `DreamBatch`, one call per distribution for all their positions, no host
read); origin (whose coins decide which positions draw) and `alg_temp` > 0 (`torch.multinomial`)
rows commit row by row. Every row draws as above from its own generator, in the rows' order: a
generator shared by rows gives each the numbers it gave row by row.

Where we differ from the file, on purpose:
* the commit count is the row's own: the file averages the masked count over the batch, so
  its counts depend on the other rows; ours equal the file's at batch size 1;
* a block that starts partly unmasked (dVoting's remask samples, or `init_tokens`) runs
  `ceil(S * n / block_length)` steps (at least 1), and a block without masks none: the file
  would spend all `S` steps on few masks, which would void dVoting's savings;
* the random streams are the row's generator's (documented above), not the global RNG.
"""

from __future__ import annotations

import functools
import itertools
import math
import struct
from typing import Any, Sequence

import torch

from lm_eval_dvoting.core.decoding.rules import (
    FirstMaskedBlock,
    RowBatch,
    RowWork,
    ScheduledWork,
    Window,
    begins,
    block_size,
    host_to_device,
    host_tokens,
    row_batches,
)
from lm_eval_dvoting.core.decoding.sampling import filtered, gumbel_argmax, tempered
from lm_eval_dvoting.core.decoding.state import (
    DecodeRow,
    masked_block,
    suppress_mask,
)
from lm_eval_dvoting.core.parts.base import CommitRule, register


class DreamSchedule(FirstMaskedBlock):
    """Dream's `_sample` step for each row, on the row's current block."""

    def more_steps_in_block(self, row: DecodeRow) -> bool:
        """Whether the block has a step after this one (a cache kept now may be reused)."""
        progress = row.progress
        if progress.block_steps == 0 or self.block_start(row) // row.block_length != progress.block:
            return True  # a new block: its steps are counted at its first step
        return progress.step_in_block + 1 < progress.block_steps

    def begin(self, index: int, row: DecodeRow, window: Window) -> ScheduledWork:
        start, wanted = masked_block(host_tokens(row), self.mask_id, row.block_length)
        work = ScheduledWork(index, row, wanted=wanted, start=start)
        progress, block = row.progress, start // row.block_length
        # the block's first step (origin may fill a block before its last step): its share
        if progress.block_steps == 0 or block != progress.block:
            progress.block, progress.step_in_block = block, 0
            progress.block_steps = block_steps(row.steps_per_block, len(wanted), block_size(work))
        return work

    def commit(self, works: Sequence[ScheduledWork]) -> list[RowWork]:
        """Each row's commits of this step: the rows that choose their most confident
        positions all at once (`DreamBatch`), in as few runs as `row_batches` allows; origin
        and `alg_temp` > 0 rows one by one, at their place in the rows' order."""
        amounts = {id(work): self._amount(work) for work in works}
        busy = [work for work in works if work.row.dream.alg == "origin" or amounts[id(work)]]
        for run in row_batches(busy):
            self._commit_run(run, amounts)
        for work in works:
            progress = work.row.progress
            progress.step_in_block += 1
            if progress.step_in_block == progress.block_steps:
                progress.step_in_block, progress.block_steps = 0, 0
        return []

    @staticmethod
    def _amount(work: ScheduledWork) -> float:
        """origin: the probability that a masked position commits; the others: how many
        commit (host arithmetic on the row's progress)."""
        row, progress = work.row, work.row.progress
        step, steps = progress.step_in_block, progress.block_steps
        share, last = commit_shares(steps, row.dream.eps)[step], step == steps - 1
        if row.dream.alg == "origin":
            return transfer_share(share, last)
        return len(work.wanted) if last else commit_count(len(work.wanted), share)

    def _commit_run(self, works: Sequence[ScheduledWork], amounts: dict[int, float]) -> None:
        """One run: the ranked rows batched, each row's random draws in the rows' order (a
        row alone's draws: a generator shared by rows gives each what it gave row by row)."""
        ranked = [work for work in works if by_rank(work.row)]
        counts = [int(amounts[id(work)]) for work in ranked]
        batch = DreamBatch(ranked, self.mask_id, counts) if ranked else None
        for work in works:
            if by_rank(work.row):
                batch.draw_noise(work)
                continue
            logits64 = suppress_mask(work.logits, self.mask_id)
            if work.row.dream.alg == "origin":
                self._commit_origin(work, logits64, amounts[id(work)])
            else:
                self._commit_drawn(work, logits64, int(amounts[id(work)]))
        if batch is not None:
            batch.commit()

    @staticmethod
    def _commit_drawn(work: ScheduledWork, logits64: torch.Tensor, count: int) -> None:
        """maskgit_plus / topk_margin / entropy at `alg_temp` > 0: the `count` positions
        drawn from softmax(confidence / alg_temp) commit (`torch.multinomial`, row by row)."""
        row = work.row
        logits, probs = dream_distribution(logits64, row.temperature, row.top_p, row.top_k)
        chosen = None
        if row.dream.alg == "maskgit_plus" and row.temperature > 0:
            # the confidence is the drawn candidate's: every masked position draws
            chosen = gumbel_argmax(logits, _noise(logits.shape, logits.device, row))
            confidence = probs.gather(-1, chosen[:, None]).squeeze(-1)
        else:
            confidence = dream_confidence(probs, row.dream.alg)
        weights = torch.softmax(confidence / row.dream.alg_temp, dim=-1)
        picked = torch.multinomial(weights, count, replacement=False, generator=row.generator)
        if chosen is None:  # the others' confidence does not depend on the draw: only the
            chosen = draw(logits[picked], probs[picked], row)  # committed positions draw
        else:
            chosen = chosen[picked]
        positions = host_to_device(work.wanted, torch.long, row.tokens.device)[picked]
        row.tokens[positions] = chosen.to(row.tokens.dtype)

    @staticmethod
    def _commit_origin(work: ScheduledWork, logits64: torch.Tensor, share: float) -> None:
        """origin: each masked position commits with probability `share` (one read: which
        positions, whose count sizes the draw of their tokens)."""
        row = work.row
        coins = _noise((len(work.wanted),), logits64.device, row)
        transfer = (coins < share).nonzero().squeeze(1)
        if transfer.numel() == 0:
            return
        logits, probs = dream_distribution(
            logits64[transfer], row.temperature, row.top_p, row.top_k
        )
        positions = host_to_device(work.wanted, torch.long, row.tokens.device)[transfer]
        row.tokens[positions] = draw(logits, probs, row).to(row.tokens.dtype)


def by_rank(row: DecodeRow) -> bool:
    """Whether a row commits its most confident positions (maskgit_plus, topk_margin,
    entropy at `alg_temp` 0 or None): those rows batch."""
    return row.dream.alg != "origin" and not row.dream.alg_temp


def dream_key(row: DecodeRow) -> tuple[str, float, float | None, int | None]:
    """What a ranked row's arithmetic depends on: (alg, temperature, top_p, top_k); Dream
    reads its confidences from the filtered distribution at every temperature, so the
    filters stay at temperature 0 (unlike `sampling_key`)."""
    return (row.dream.alg, row.temperature, row.top_p, row.top_k)


class DreamBatch:
    """One commit of ranked rows (`by_rank`), batched over the rows on a `RowBatch` whose
    rows sit side by side by `dream_key`: per group one call each for the distribution
    (`dream_distribution`), the confidence and the candidates; one stable descending sort of
    every row's confidences (ties to the leftmost); the tokens written row by row. Nothing
    is read back to the host: the counts are host ints, the index lists go to the device in
    one copy.

    The noise (`draw_noise`, row by row in the rule's order) has the shapes a row alone
    draws: maskgit_plus at temperature > 0 one row of V for every masked position (its
    candidates decide its confidences), the others one for each committed position, in the
    order chosen; none at temperature 0.
    """

    def __init__(self, works: Sequence[ScheduledWork], mask_id: int, counts: list[int]) -> None:
        self.batch = batch = RowBatch(works, mask_id, key=dream_key)
        self.mask_id, self.where = mask_id, {id(work): r for r, work in enumerate(batch.works)}
        given = {id(work): count for work, count in zip(works, counts)}
        self.counts = [given[id(work)] for work in batch.works]  # in the batch's order
        self.picks = [0, *itertools.accumulate(self.counts)]
        sizes = [self._noise_size(r) for r in range(len(batch.works))]
        self.noise_at = begins(sizes)
        vocab = batch.logits64.shape[-1]
        self.noise = torch.empty((sum(sizes), vocab), dtype=torch.float64, device=batch.device)
        take = [r * batch.width + j for r, n in enumerate(self.counts) for j in range(n)]
        rows = [r * batch.width for r, n in enumerate(self.counts) for _ in range(n)]
        self.take, self.row_base = host_to_device(take + rows, torch.long, batch.device).view(2, -1)

    def _noise_size(self, r: int) -> int:
        """Row r's noise rows: its masked positions (maskgit_plus drawing), its count (the
        others drawing), none (temperature 0)."""
        row = self.batch.works[r].row
        if row.temperature == 0:
            return 0
        if row.dream.alg == "maskgit_plus":
            return self.batch.bounds[r + 1] - self.batch.bounds[r]
        return self.counts[r]

    def draw_noise(self, work: ScheduledWork) -> None:
        """The row's noise from its own generator (= `torch.rand` of the shape it draws)."""
        r = self.where[id(work)]
        size = self._noise_size(r)
        if size:
            rows = self.noise[self.noise_at[r] : self.noise_at[r] + size]
            rows.uniform_(generator=work.row.generator)

    def _group_noise(self, lo: int, hi: int, size: int) -> torch.Tensor:
        """The noise of the group of rows [lo, hi): `size` rows from its first row's."""
        return self.noise[self.noise_at[lo] : self.noise_at[lo] + size]

    def _confidences(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every masked position's filtered logits (over `logits64`), `probs`, confidence,
        and (maskgit_plus at temperature > 0) its drawn candidate."""
        batch = self.batch
        probs = torch.empty_like(batch.logits64)
        confidence = torch.empty(probs.shape[0], dtype=torch.float64, device=batch.device)
        drawn = torch.zeros(probs.shape[0], dtype=torch.long, device=batch.device)
        for (alg, temperature, top_p, top_k), lo, hi in batch.groups:
            a, b = batch.bounds[lo], batch.bounds[hi]
            logits, probs[a:b] = dream_distribution(batch.logits64[a:b], temperature, top_p, top_k)
            batch.logits64[a:b] = logits
            if alg == "maskgit_plus" and temperature > 0:
                drawn[a:b] = gumbel_argmax(logits, self._group_noise(lo, hi, b - a))
                confidence[a:b] = probs[a:b].gather(-1, drawn[a:b, None]).squeeze(-1)
            else:
                confidence[a:b] = dream_confidence(probs[a:b], alg)
        return probs, confidence, drawn

    def commit(self) -> None:
        """Each row's `count` most confident positions commit their candidates."""
        batch = self.batch
        probs, confidence, drawn = self._confidences()
        ranked = torch.sort(
            batch.padded(confidence, float("-inf")), dim=1, descending=True, stable=True
        ).indices  # block offsets, each row's leftmost first among equals
        order = torch.arange(batch.bounds[-1], device=batch.device)
        picked = batch.padded(order, 0).view(-1)[self.row_base + ranked.view(-1)[self.take]]
        tokens = torch.empty(self.picks[-1], dtype=torch.long, device=batch.device)
        for (alg, temperature, _, _), lo, hi in batch.groups:
            a, b = self.picks[lo], self.picks[hi]
            if temperature == 0:
                tokens[a:b] = probs[picked[a:b]].max(dim=-1).indices
            elif alg == "maskgit_plus":
                tokens[a:b] = drawn[picked[a:b]]
            else:
                noise = self._group_noise(lo, hi, b - a)
                tokens[a:b] = gumbel_argmax(batch.logits64[picked[a:b]], noise)
        values = torch.full_like(order, self.mask_id)  # its wanted positions are masks
        batch.write(values.index_copy_(0, picked, tokens))


def _noise(shape: Sequence[int], device: torch.device, row: DecodeRow) -> torch.Tensor:
    """Float64 uniforms from the row's generator."""
    return torch.rand(tuple(shape), dtype=torch.float64, device=device, generator=row.generator)


def dream_distribution(
    logits64: torch.Tensor, temperature: float, top_p: float | None, top_k: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dream's `sample_tokens` up to its softmax: the tempered, filtered logits and `probs`
    (each position's along the vocabulary: one call for rows of one distribution)."""
    logits = filtered(tempered(logits64, temperature), top_p, top_k)
    return logits, torch.softmax(logits, dim=-1)


def dream_confidence(probs: torch.Tensor, alg: str) -> torch.Tensor:
    """A position's confidence without a draw: the top probability (maskgit_plus at
    temperature 0, whose candidate is the argmax), top-1 minus top-2, or sum(p log(p + 1e-10))."""
    if alg == "topk_margin":
        top2 = torch.sort(probs, dim=-1, descending=True).values[:, :2]
        return top2[:, 0] - top2[:, 1]
    if alg == "entropy":
        return (probs * torch.log(probs + 1e-10)).sum(-1)
    return probs.max(dim=-1).values


def draw(logits: torch.Tensor, probs: torch.Tensor, row: DecodeRow) -> torch.Tensor:
    """Each position's token: the argmax of `probs` at temperature 0 (Dream's
    `probs.max`), else a draw from it (Gumbel-max on `logits`, one row of noise each)."""
    if row.temperature == 0:
        return probs.max(dim=-1).indices
    return gumbel_argmax(logits, _noise(logits.shape, logits.device, row))


def block_steps(steps_per_block: int, masked: int, block_length: int) -> int:
    """A block's steps: all of them for a fully masked block, a share in proportion to its
    masks for one that starts partly unmasked (at least 1), none without masks."""
    if masked == block_length:
        return steps_per_block
    return 0 if masked == 0 else max(1, math.ceil(steps_per_block * masked / block_length))


@functools.lru_cache(maxsize=64)
def commit_shares(steps: int, eps: float) -> tuple[float, ...]:
    """Per step, the file's `1 - s / t` over its float32 timesteps `linspace(1, eps, steps +
    1)`, computed in float32 as the file does and kept as Python floats (a float32 is exact
    in one), once per schedule: a step's count is then host arithmetic, with no tensor read."""
    t = torch.linspace(1, eps, steps + 1)
    return tuple((1 - t[1:] / t[:-1]).tolist())


def commit_count(masked: int, share: float) -> int:
    """`int(num_mask_token * (1 - s / t))` in float32, as the file (its last step commits
    all): for `masked` up to 2^24 (a float32 holds it exactly, as the file's tensor does)
    `masked * share` is exact in a float (24 + 24 significant bits at most), so one rounding
    to float32 gives the float32 product."""
    return int(as_float32(masked * share))


def as_float32(value: float) -> float:
    """`value` rounded to the nearest float32 (ties to even, as the float32 arithmetic)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def transfer_share(share: float, last: bool) -> float:
    """origin's probability that a masked position commits in this step."""
    return 1.0 if last else share


@register
class Dream(CommitRule):
    name = "dream"
    order = 35
    reads = ("steps", "alg", "alg_temp", "eps", "top_p", "top_k")
    runs_steps = True

    @classmethod
    def default_block_length(cls, gen_length: int) -> int:
        """Dream's schedule runs over the whole answer (one block)."""
        return gen_length

    @classmethod
    def default_steps_for(cls, gen_length: int) -> int:
        """Dream's model card: as many steps as answer tokens."""
        return gen_length

    @classmethod
    def row_settings(cls, settings: Any) -> dict[str, Any]:
        dream = settings.dream_settings()
        return dict(
            steps=settings.steps_run, alpha=None, threshold=None, rule=cls.name, dream=dream
        )

    @classmethod
    def worker(cls, mask_id: int, end_ids: Sequence[int]) -> DreamSchedule:
        return DreamSchedule(mask_id)
