"""Block diffusion (LLaDA2.0 and LLaDA2.1): the layout of a row and its commit rule.

Layout (upstream `generate()`, ../shared/design/LLADA2_DECODING.md section 1): blocks are
aligned at the prompt's first token, not at the answer's. So a row of a block-causal model
is re-laid when it is added (`align`): the prompt's last `P mod B` tokens move to the
front of the decoded region (`lead`, fixed, never edited) and masks are appended up to a
whole number of blocks (`trail`, decoded as upstream decodes them, then cut off). The
first decoded block is the one holding the prompt's end. `DecodeRow.answer_tokens` is the
region the caller asked for.

Rule (`BlockThreshold`), one block at a time, left to right; each step is one forward
pass (attention bidirectional inside a block, causal across blocks):

* LLaDA2.0 (`editing_threshold is None`): commit every masked position of the block whose
  candidate's confidence is strictly above `threshold`; if fewer than this step's quota
  pass, commit the quota's most confident masked positions instead (the block length
  spread evenly over `steps` steps, remainder to the early ones, capped at the masks left;
  `steps` defaults to upstream's 32 whatever the block length, and is capped at the
  answer's length, as upstream's `min(steps, gen_length)`).
  A block is done when no mask is left.
* LLaDA2.1 (joint threshold, `editing_threshold` set): the same commits with a quota of 1
  (upstream's `num_to_transfer`), and in the same step every *editable* position of the
  block that holds a token whose candidate differs from it with confidence strictly above
  `editing_threshold` is rewritten. A step that starts with no mask in the block is a
  post-fill step; the block is done after a post-fill step that rewrites nothing, or when
  the next step would be post-fill step number `max_post_steps + 1` (upstream checks
  that before its forward pass, so it costs no pass).
  Editable: the positions that were masks when the row was added. The prompt (and its
  tail in the first block) never is, as upstream; nor are the tokens a dVoting sample
  keeps because the earlier samples agree on them (our choice: the agreement is what
  dVoting keeps; upstream has no such tokens).

Candidates: the argmax at temperature 0 (upstream LLaDA2.0 samples even there, a hub bug
its authors confirmed: LLADA2_DECODING.md section 1); a float64 Gumbel-max draw from
softmax(logits / T) otherwise, which is upstream's multinomial draw in distribution.
Confidence: the candidate's probability under softmax(logits / T) (T = 0: softmax(logits)),
as upstream, except that the mask token is never a candidate: its logit is set to -inf
before the softmax, so the confidences are renormalised over the other tokens (upstream
keeps the mask token in its softmax; a trained model gives it next to no probability at a
masked position, so the two differ only in rounding there, but a confidence right at the
threshold could fall on either side).

End of text: after a block is done, if the answer so far holds an end token, every later
position becomes that token and the row stops (upstream LLaDA2.0 stops there always, 2.1
with `eos_early_stop`; finished blocks never change again, so stopping changes no
answer, it only saves the passes).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from lm_eval_dvoting.core.decoding.rules import RowWork, ScheduledWork
from lm_eval_dvoting.core.decoding.sampling import filtered
from lm_eval_dvoting.core.decoding.state import (
    LLADA2_STEPS,
    BlockDecoding,
    DecodeRow,
    suppress_mask,
)


def align(row: DecodeRow, mask_id: int) -> None:
    """Re-lay a block-diffusion row (see the module docstring) and point it at its first block."""
    block = row.block_length
    lead = row.prompt.numel() % block
    total = lead + row.gen_length
    trail = -total % block
    masks = torch.full((trail,), mask_id, dtype=row.tokens.dtype, device=row.tokens.device)
    row.tokens = torch.cat([row.prompt[row.prompt.numel() - lead :], row.tokens, masks])
    row.prompt = row.prompt[: row.prompt.numel() - lead]
    row.lead, row.trail = lead, trail
    row.editable = row.tokens == mask_id
    row.progress.block, row.progress.step_in_block, row.progress.post = -1, 0, 0


def block_schedule(block_length: int, steps: int) -> list[int]:
    """Upstream's per-step quotas: the block length spread evenly over `steps`, remainder first."""
    base, remainder = divmod(block_length, steps)
    return [base + 1 if s < remainder else base for s in range(steps)]


class BlockThreshold:
    """LLaDA2.0's threshold decoding and LLaDA2.1's joint threshold decoding (module docstring)."""

    def __init__(self, mask_id: int, end_ids: Sequence[int]) -> None:
        self.mask_id = mask_id
        self.end_ids = torch.tensor(sorted(set(end_ids)), dtype=torch.long)

    def block_start(self, row: DecodeRow) -> int:
        """The first index (into the row's re-laid tokens) of the block it decodes now."""
        if row.progress.block < 0:
            self._advance(row, 0)
        return row.progress.block * row.block_length

    def is_done(self, row: DecodeRow) -> bool:
        """Whether the row stopped: no block with a mask left, or an end token in its answer."""
        self.block_start(row)
        return row.progress.block >= row.num_blocks

    def begin(self, index: int, row: DecodeRow, window: object) -> ScheduledWork:
        """The block's masked positions, and (editing) its editable ones: this step's logits."""
        start = self.block_start(row)
        block = slice(start, start + row.block_length)
        masked = row.tokens[block] == self.mask_id
        wanted = masked | row.editable[block] if row.block.editing_threshold is not None else masked
        return ScheduledWork(
            index,
            row,
            wanted=(start + wanted.nonzero().squeeze(1)).tolist(),
            start=start,
        )

    def commit(self, works: Sequence[ScheduledWork]) -> list[RowWork]:
        for work in works:
            row, settings = work.row, work.row.block
            positions = torch.tensor(work.wanted, dtype=torch.long, device=row.tokens.device)
            chosen, confidence = self._candidates(work.logits, row)
            masked = row.tokens[positions] == self.mask_id
            unmask = self._unmasked(
                masked,
                confidence,
                settings,
                row.progress.step_in_block,
                row.block_length,
                row.gen_length - row.lead - row.trail,
            )
            edit = torch.zeros_like(masked)
            if settings.editing_threshold is not None:
                edit = (
                    ~masked
                    & (confidence > settings.editing_threshold)
                    & (chosen != row.tokens[positions])
                )
            write = unmask | edit
            row.tokens[positions[write]] = chosen[write].to(row.tokens.dtype)
            started_without_masks = not bool(masked.any())
            row.progress.step_in_block += 1
            row.progress.post += started_without_masks
            if self._block_done(row, started_without_masks, bool(edit.any())):
                self._finish_block(row, work.start)
        return []

    def _candidates(
        self, logits: torch.Tensor, row: DecodeRow
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each position's candidate and its confidence (its probability at the row's
        temperature, under the top-k/top-p filters when given)."""
        logits64 = suppress_mask(logits, self.mask_id)
        if row.temperature == 0:
            chosen = logits64.argmax(-1)
            probs = torch.softmax(logits64, dim=-1)
        else:
            noise = torch.rand(
                logits64.shape, dtype=torch.float64, device=logits64.device, generator=row.generator
            )
            # LLaDA2's upstream sampler: top-k, then top-p, on the tempered logits
            scaled = filtered(logits64 / row.temperature, row.top_p, row.top_k, top_k_first=True)
            chosen = (scaled - torch.log(-torch.log(noise))).argmax(-1)
            probs = torch.softmax(scaled, dim=-1)
        return chosen, probs.gather(-1, chosen[:, None]).squeeze(-1)

    @staticmethod
    def _unmasked(
        masked: torch.Tensor,
        confidence: torch.Tensor,
        settings: BlockDecoding,
        step: int,
        block_length: int,
        answer_length: int,
    ) -> torch.Tensor:
        """The masked positions to commit: those above the threshold, or the quota's most
        confident."""
        hot = masked & (confidence > settings.threshold)
        if settings.editing_threshold is not None:
            quota = 1  # upstream LLaDA2.1's num_to_transfer
        else:
            steps = min(
                settings.steps or LLADA2_STEPS, answer_length
            )  # upstream's min(steps, gen_length)
            schedule = block_schedule(block_length, steps)
            quota = schedule[step] if step < len(schedule) else 1
        quota = min(quota, int(masked.sum()))
        if int(hot.sum()) >= quota:
            return hot
        ranked = confidence.masked_fill(~masked, -math.inf).topk(quota).indices
        return torch.zeros_like(masked).index_fill_(0, ranked, True)

    def _block_done(self, row: DecodeRow, started_without_masks: bool, edited: bool) -> bool:
        start = row.progress.block * row.block_length
        masks_left = bool((row.tokens[start : start + row.block_length] == self.mask_id).any())
        settings = row.block
        if settings.editing_threshold is None:
            return not masks_left
        if started_without_masks and not edited:
            return True
        return not masks_left and row.progress.post + 1 > settings.max_post_steps

    def _finish_block(self, row: DecodeRow, start: int) -> None:
        """Stop at an end token in the answer so far; else go on to the next block with a mask."""
        end = start + row.block_length
        answer = row.tokens[row.lead : end]
        is_end = torch.isin(answer, self.end_ids.to(answer.device))
        if bool(is_end.any()):
            first = row.lead + int(is_end.nonzero()[0])
            row.tokens[first + 1 :] = row.tokens[first]
            row.progress.block = row.num_blocks
            return
        self._advance(row, end)

    def _advance(self, row: DecodeRow, after: int) -> None:
        """Point the row at the first block at or after index `after` that holds a mask (none:
        done), unless the answer before that block already ends (then fill and stop)."""
        row.progress.step_in_block, row.progress.post = 0, 0
        masks = (row.tokens[after:] == self.mask_id).nonzero()
        if not len(masks):
            row.progress.block = row.num_blocks
            return
        block = (after + int(masks[0])) // row.block_length
        row.progress.block = block
        start = block * row.block_length
        if start > row.lead and bool(
            torch.isin(row.tokens[row.lead : start], self.end_ids.to(row.tokens.device)).any()
        ):
            self._finish_block(row, start - row.block_length)
