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
import math
import struct
from typing import Any, Sequence

import torch

from lm_eval_dvoting.core.decoding.rules import (
    FirstMaskedBlock,
    RowWork,
    ScheduledWork,
    Window,
    block_size,
    host_to_device,
    host_tokens,
)
from lm_eval_dvoting.core.decoding.sampling import filtered, gumbel_argmax, tempered
from lm_eval_dvoting.core.decoding.state import (
    DecodeRow,
    DreamDecoding,
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
        for work in works:
            row, progress = work.row, work.row.progress
            step, steps = progress.step_in_block, progress.block_steps
            share = commit_shares(steps, row.dream.eps)[step]
            logits64 = suppress_mask(work.logits, self.mask_id)
            if row.dream.alg == "origin":
                self._commit_origin(work, logits64, transfer_share(share, step == steps - 1))
            else:
                last = step == steps - 1
                count = len(work.wanted) if last else commit_count(len(work.wanted), share)
                self._commit_confident(work, logits64, count)
            progress.step_in_block += 1
            if progress.step_in_block == steps:
                progress.step_in_block, progress.block_steps = 0, 0
        return []

    @staticmethod
    def _commit_confident(work: ScheduledWork, logits64: torch.Tensor, count: int) -> None:
        """maskgit_plus / topk_margin / entropy: the `count` chosen positions commit."""
        if count == 0:
            return  # nothing commits: no candidate is needed, no noise is drawn
        row = work.row
        logits, probs = dream_distribution(logits64, row)
        chosen = None
        if row.dream.alg == "maskgit_plus" and row.temperature > 0:
            # the confidence is the drawn candidate's: every masked position draws
            chosen = gumbel_argmax(logits, _noise(logits.shape, logits.device, row))
            confidence = probs.gather(-1, chosen[:, None]).squeeze(-1)
        else:
            confidence = dream_confidence(probs, row.dream.alg)
        picked = chosen_positions(confidence, count, row.dream, row.generator)
        if chosen is None:  # the others' confidence does not depend on the draw: only the
            chosen = draw(logits[picked], probs[picked], row)  # committed positions draw
        else:
            chosen = chosen[picked]
        positions = host_to_device(work.wanted, torch.long, row.tokens.device)[picked]
        row.tokens[positions] = chosen.to(row.tokens.dtype)

    @staticmethod
    def _commit_origin(work: ScheduledWork, logits64: torch.Tensor, share: float) -> None:
        """origin: each masked position commits with probability `share`."""
        row = work.row
        coins = _noise((len(work.wanted),), logits64.device, row)
        transfer = coins < share
        if not bool(transfer.any()):
            return
        logits, probs = dream_distribution(logits64[transfer], row)
        positions = host_to_device(work.wanted, torch.long, row.tokens.device)[transfer]
        row.tokens[positions] = draw(logits, probs, row).to(row.tokens.dtype)


def _noise(shape: Sequence[int], device: torch.device, row: DecodeRow) -> torch.Tensor:
    """Float64 uniforms from the row's generator."""
    return torch.rand(tuple(shape), dtype=torch.float64, device=device, generator=row.generator)


def dream_distribution(logits64: torch.Tensor, row: DecodeRow) -> tuple[torch.Tensor, torch.Tensor]:
    """Dream's `sample_tokens` up to its softmax: the tempered, filtered logits and `probs`."""
    logits = filtered(tempered(logits64, row.temperature), row.top_p, row.top_k)
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


def chosen_positions(
    confidence: torch.Tensor, count: int, dream: DreamDecoding, generator: torch.Generator | None
) -> torch.Tensor:
    """Which of the block's masked positions commit: the `count` most confident (ties to
    the leftmost), or a draw without replacement from softmax(confidence / alg_temp)."""
    if not dream.alg_temp:
        return torch.sort(confidence, descending=True, stable=True).indices[:count]
    weights = torch.softmax(confidence / dream.alg_temp, dim=-1)
    return torch.multinomial(weights, count, replacement=False, generator=generator)


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
