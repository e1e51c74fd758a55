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
  answer's length, as upstream's `min(steps, gen_length)`). Ties for the quota go to the
  leftmost (upstream's `torch.topk` leaves their order unspecified).
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

The rows of a step commit together (`BlockThreshold._commit_run` on a `RowBatch`: one call
per distribution, not one per row; each row's noise drawn from its own generator in the
rows' order, of the shape a row alone draws: a row of uniforms per position it asks logits
for).

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
from dataclasses import dataclass, field
from typing import Sequence

import torch

from lm_eval_dvoting.core.decoding.rules import (
    RowBatch,
    RowWork,
    ScheduledWork,
    host_to_device,
    host_tokens,
    row_batches,
)
from lm_eval_dvoting.core.decoding.sampling import filtered
from lm_eval_dvoting.core.decoding.state import (
    LLADA2_STEPS,
    DecodeRow,
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
    row.editable = (row.tokens == mask_id).tolist()  # on the host: the rule plans with it
    row.progress.block, row.progress.step_in_block, row.progress.post = -1, 0, 0


def block_schedule(block_length: int, steps: int) -> list[int]:
    """Upstream's per-step quotas: the block length spread evenly over `steps`, remainder first."""
    base, remainder = divmod(block_length, steps)
    return [base + 1 if s < remainder else base for s in range(steps)]


@dataclass(eq=False)
class BlockWork(ScheduledWork):
    """A block-diffusion row's work in one step, with what its commit and its settling
    need from the step's snapshot (its commit reads nothing from the device)."""

    tokens: list[int] = field(default_factory=list)  # the row's tokens at the step's start
    masked: list[bool] = field(default_factory=list)  # which `wanted` positions were masks

    @property
    def started_without_masks(self) -> bool:
        """A post-fill step (LLaDA2.1): the block held no mask when the step began."""
        return not any(self.masked)


class BlockThreshold:
    """LLaDA2.0's threshold decoding and LLaDA2.1's joint threshold decoding (module docstring).

    Host reads: a step plans on the row batch's snapshot of the tokens (`begin`) and commits
    on the device; what the block's outcome depends on (the block's tokens after the commit,
    and whether it edited) is read with the row batch's progress read (`facts_to_read`),
    after which `settle` decides on the host whether the block is done and where the row
    goes on. No read of a row's own."""

    def __init__(self, mask_id: int, end_ids: Sequence[int]) -> None:
        self.mask_id = mask_id
        self.end_ids = frozenset(int(i) for i in end_ids)  # ints: host tokens are ints
        self.unsettled: dict[DecodeRow, tuple[BlockWork, torch.Tensor]] = {}

    def block_start(self, row: DecodeRow) -> int:
        """The first index (into the row's re-laid tokens) of the block it decodes now."""
        if row.progress.block < 0:
            self._advance(row, host_tokens(row), 0)
        return row.progress.block * row.block_length

    def is_done(self, row: DecodeRow) -> bool:
        """Whether the row stopped: no block with a mask left, or an end token in its answer."""
        self.block_start(row)
        return row.progress.block >= row.num_blocks

    def begin(self, index: int, row: DecodeRow, window: object) -> BlockWork:
        """The block's masked positions, and (editing) its editable ones: this step's logits."""
        start = self.block_start(row)
        tokens = host_tokens(row)
        editing = row.block.editing_threshold is not None
        wanted = [
            p
            for p in range(start, start + row.block_length)
            if tokens[p] == self.mask_id or (editing and row.editable[p])
        ]
        masked = [tokens[p] == self.mask_id for p in wanted]
        return BlockWork(index, row, wanted=wanted, start=start, tokens=tokens, masked=masked)

    def commit(self, works: Sequence[BlockWork]) -> list[RowWork]:
        """Each row's commits and edits, written on the device, all the rows at once (in as
        few runs as `row_batches` allows); the block's outcome is settled after the row
        batch's progress read (`settle`). (What a step that raised left unsettled is dropped
        here: one round per step, so nothing else is pending.)"""
        self.unsettled = {}
        for run in row_batches(works):
            self._commit_run(run)
        for work in works:
            work.row.progress.step_in_block += 1
            work.row.progress.post += work.started_without_masks
        return []

    def _commit_run(self, works: Sequence[BlockWork]) -> None:
        """The rows' commits (and LLaDA2.1's edits) on a `RowBatch`: one call per
        distribution for the candidates, one for the threshold and the quota's fall-back,
        one write per row; each row's block after the commit, and whether it edited, kept
        unread for `settle` (`facts_to_read`)."""
        batch = RowBatch(works, self.mask_id, noise_per_block=False)
        batch.draw_noise(works)  # each row's noise from its generator, as a row alone draws
        chosen, confidence = self._candidates(batch)
        current = _snapshot_at_wanted(batch)
        masked = current == self.mask_id
        threshold, editing_threshold, quota = self._limits(batch)
        padded = batch.padded(masked, False), batch.padded(confidence, 0.0)
        commit = unmasked(*padded, threshold, quota).view(-1)[batch.padded_at]
        edited = torch.zeros(len(batch.works), dtype=torch.long, device=batch.device)
        if any(work.row.block.editing_threshold is not None for work in batch.works):
            edit = ~masked & (confidence > editing_threshold[batch.row_of]) & (chosen != current)
            commit, edited = commit | edit, batch.padded(edit, False).any(1).long()
        batch.write(torch.where(commit, chosen, current))
        self._keep_facts(batch.works, edited)

    def _limits(self, batch: RowBatch) -> tuple[torch.Tensor, ...]:
        """Per row of the batch (float64, one copy): its threshold, its editing threshold
        (LLaDA2.0: inf, no edit) and this step's quota (`_quota`)."""
        works = batch.works
        editing = [work.row.block.editing_threshold for work in works]
        return (
            host_to_device(
                [work.row.block.threshold for work in works]
                + [math.inf if e is None else e for e in editing]
                + [float(self._quota(work)) for work in works],
                torch.float64,
                batch.device,
            )
            .view(3, -1)
            .unbind()
        )

    def _keep_facts(self, works: Sequence[BlockWork], edited: torch.Tensor) -> None:
        """Each row's block after the commit, then 1 if it edited a token, else 0 (`edited`,
        long, per row): one tensor for the rows, row r's facts a view of it, kept for the
        progress read."""
        pieces: list[torch.Tensor] = []
        for r, work in enumerate(works):
            pieces += [work.row.tokens[work.start : work.start + work.row.block_length]]
            pieces += [edited[r : r + 1]]
        sizes = [work.row.block_length + 1 for work in works]  # the rows hold whole blocks
        for work, facts in zip(works, torch.cat(pieces).split(sizes)):
            self.unsettled[work.row] = (work, facts)

    def facts_to_read(self) -> list[tuple[DecodeRow, torch.Tensor]]:
        """Each row of the last commit not settled yet, with what its settling needs read:
        its block's tokens after the commit, then 1 if it edited a token, else 0."""
        return [(row, fact) for row, (_, fact) in self.unsettled.items()]

    def settle(self, row: DecodeRow, facts: list[int]) -> None:
        """After the read (once per row and step, which forgets the row): whether the row's
        block is done, and if so, where the row goes on (or that it stops), decided on the
        host."""
        work, _ = self.unsettled.pop(row)
        after = work.start + row.block_length
        tokens = work.tokens[: work.start] + facts[:-1] + work.tokens[after:]
        if self._block_done(row, tokens, work.started_without_masks, bool(facts[-1])):
            self._finish_block(row, tokens, work.start)

    @staticmethod
    def _candidates(batch: RowBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Each wanted position's candidate and its confidence (its probability at the row's
        temperature, under the top-k/top-p filters when given), one call per distribution:
        the argmax at temperature 0, else a float64 Gumbel-max with the row's noise. (Not
        `RowBatch.candidates`: LLaDA2's sampler filters top-k first, and the confidence is
        the probability under the same filtered, tempered logits.)"""
        chosen = torch.empty(batch.bounds[-1], dtype=torch.long, device=batch.device)
        confidence = torch.empty(batch.bounds[-1], dtype=torch.float64, device=batch.device)
        for (temperature, top_p, top_k), lo, hi in batch.groups:
            a, b = batch.bounds[lo], batch.bounds[hi]
            if a == b:
                continue
            logits64 = batch.logits64[a:b]
            if temperature == 0:
                chosen[a:b] = logits64.argmax(-1)
                probs = torch.softmax(logits64, dim=-1)
            else:
                # LLaDA2's upstream sampler: top-k, then top-p, on the tempered logits
                scaled = filtered(logits64 / temperature, top_p, top_k, top_k_first=True)
                chosen[a:b] = (scaled - torch.log(-torch.log(batch.noise_of(a, b)))).argmax(-1)
                probs = torch.softmax(scaled, dim=-1)
            confidence[a:b] = probs.gather(-1, chosen[a:b, None]).squeeze(-1)
        return chosen, confidence

    @staticmethod
    def _quota(work: BlockWork) -> int:
        """How many masked positions the row commits at least in this step: upstream's
        per-step quota (LLaDA2.1: 1), capped at the block's masks."""
        row, settings = work.row, work.row.block
        if settings.editing_threshold is not None:
            quota = 1  # upstream LLaDA2.1's num_to_transfer
        else:
            answer_length = row.gen_length - row.lead - row.trail
            steps = min(settings.steps or LLADA2_STEPS, answer_length)  # upstream's min
            schedule = block_schedule(row.block_length, steps)
            step = row.progress.step_in_block
            quota = schedule[step] if step < len(schedule) else 1
        return min(quota, sum(work.masked))

    def _block_done(
        self, row: DecodeRow, tokens: list[int], started_without_masks: bool, edited: bool
    ) -> bool:
        start = row.progress.block * row.block_length
        masks_left = self.mask_id in tokens[start : start + row.block_length]
        settings = row.block
        if settings.editing_threshold is None:
            return not masks_left
        if started_without_masks and not edited:
            return True
        return not masks_left and row.progress.post + 1 > settings.max_post_steps

    def _finish_block(self, row: DecodeRow, tokens: list[int], start: int) -> None:
        """Stop at an end token in the answer so far (`tokens`: the row's on the host); else
        go on to the next block with a mask."""
        end = start + row.block_length
        first = self._first_end(tokens, row.lead, end)
        if first is not None:
            row.tokens[first + 1 :] = tokens[first]
            row.progress.block = row.num_blocks
            return
        self._advance(row, tokens, end)

    def _advance(self, row: DecodeRow, tokens: list[int], after: int) -> None:
        """Point the row at the first block at or after index `after` that holds a mask (none:
        done), unless the answer before that block already ends (then fill and stop)."""
        row.progress.step_in_block, row.progress.post = 0, 0
        try:
            block = tokens.index(self.mask_id, after) // row.block_length
        except ValueError:  # no mask left
            row.progress.block = row.num_blocks
            return
        row.progress.block = block
        start = block * row.block_length
        if start > row.lead and self._first_end(tokens, row.lead, start) is not None:
            self._finish_block(row, tokens, start - row.block_length)

    def _first_end(self, tokens: list[int], lo: int, hi: int) -> int | None:
        """The index of the first end token in `tokens[lo:hi]` (None: there is none)."""
        return next((k for k in range(lo, hi) if tokens[k] in self.end_ids), None)


def unmasked(
    masked: torch.Tensor, confidence: torch.Tensor, threshold: torch.Tensor, quota: torch.Tensor
) -> torch.Tensor:
    """Which positions commit, per row of a (rows, width) layout (`masked`: which are masks;
    `confidence`: each candidate's; `threshold`, `quota`: a value per row): the masks whose
    confidence is strictly above the threshold, or, where fewer than the quota are, the
    quota's most confident masks (ties to the leftmost: a stable sort), chosen on the
    device (no read)."""
    hot = masked & (confidence > threshold[:, None])
    ranked = torch.sort(
        confidence.masked_fill(~masked, -math.inf), dim=1, descending=True, stable=True
    ).indices
    columns = torch.arange(masked.shape[1], device=masked.device)
    most_confident = torch.zeros_like(masked).scatter_(1, ranked, columns < quota[:, None])
    return torch.where((hot.sum(1) >= quota)[:, None], hot, most_confident)


def _snapshot_at_wanted(batch: RowBatch) -> torch.Tensor:
    """Each wanted position's token at the step's start (from the step's snapshot,
    `BlockWork.tokens`: one copy, no read)."""
    tokens = [work.tokens[p] for work in batch.works for p in work.wanted]
    return host_to_device(tokens, torch.long, batch.device)
