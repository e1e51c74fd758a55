"""`decoder=fixed`: LLaDA's fixed schedule: `steps` forward passes per sample, a fixed
number of tokens committed per step, chosen by `remasking`: `steps / num_blocks` steps per
block, the block's masks spread evenly over them (remainder to the earliest steps),
highest confidence first (`remasking="low_confidence"`: the softmax probability of the
chosen token; `"random"`: a uniform score)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from lm_eval_dvoting.core.decoding.rules import (
    RowBatch,
    RowWork,
    ScheduledWork,
    Window,
    block_size,
    row_batches,
    token_lists,
)
from lm_eval_dvoting.core.decoding.state import DecodeRow
from lm_eval_dvoting.core.parts.base import CommitRule, register


class FixedSchedule:
    """LLaDA's fixed schedule: a set number of highest-confidence commits per step."""

    def __init__(self, mask_id: int) -> None:
        self.mask_id = mask_id

    def block_start(self, row: DecodeRow) -> int:
        """The first generation index of the block the row commits in next."""
        return row.progress.block * row.block_length

    def is_done(self, row: DecodeRow) -> bool:
        return row.progress.block >= row.num_blocks

    def begin(self, index: int, row: DecodeRow, window: Window) -> ScheduledWork:
        return self.begin_many([(index, row, window)])[0]

    def begin_many(self, items: Sequence[tuple[int, DecodeRow, Window]]) -> list[ScheduledWork]:
        """Each row's share of its block this step, from the rows' host tokens
        (`token_lists`: the step's snapshot, or one read of all the rows outside a step)."""
        tokens = token_lists([row for _, row, _ in items])
        return [self._share(i, row, row_tokens) for (i, row, _), row_tokens in zip(items, tokens)]

    def _share(self, index: int, row: DecodeRow, tokens: list[int]) -> ScheduledWork:
        """This step's share of the block; the block's masked positions if it commits any."""
        progress, start = row.progress, self.block_start(row)
        block = tokens[start : start + row.block_length]
        masked = [start + k for k, token in enumerate(block) if token == self.mask_id]
        if progress.step_in_block == 0:
            # LLaDA's get_num_transfer_tokens: even spread, remainder to the first steps
            base, remainder = divmod(len(masked), row.steps_per_block)
            progress.counts = [
                base + 1 if s < remainder else base for s in range(row.steps_per_block)
            ]
        work = ScheduledWork(index, row, start=start)
        if progress.counts[progress.step_in_block]:
            work.wanted = masked
        return work

    def commit(self, works: Sequence[ScheduledWork]) -> list[RowWork]:
        """Commit each row's share, all rows at once; a fixed-schedule row never goes on
        within a step."""
        for run in row_batches([work for work in works if work.wanted]):
            self._commit_shares(run)
        for work in works:
            row, progress = work.row, work.row.progress
            progress.step_in_block += 1
            if progress.step_in_block == row.steps_per_block:
                progress.block, progress.step_in_block = progress.block + 1, 0
        return []

    def _commit_shares(self, works: Sequence[ScheduledWork]) -> None:
        """Each row's count of its block's masks, highest confidence first (`RowBatch`: the
        candidates and confidences of all rows at once; each row's noise drawn as a row
        alone draws it: its block's candidate noise, then its remasking noise). Ties among
        confidences go as `topk` breaks them over one row's block, as before batching."""
        batch = RowBatch(works, self.mask_id)
        remask: dict[ScheduledWork, torch.Tensor] = {}

        def draw_remask(work: ScheduledWork) -> None:
            if work.row.remasking != "low_confidence":  # "random": a uniform score
                remask[work] = torch.rand(
                    (block_size(work),),
                    dtype=torch.float64,
                    device=batch.device,
                    generator=work.row.generator,
                )

        batch.draw_noise(works, then=draw_remask)
        chosen = batch.candidates()
        confidence = _confidences(batch, chosen, remask)
        chosen_blocks = batch.padded(chosen, 0)
        for r, work in enumerate(batch.works):
            row, size = work.row, batch.sizes[r]
            picked = confidence[r, :size].topk(row.progress.counts[row.progress.step_in_block])
            row.tokens[work.start : work.start + size][picked.indices] = chosen_blocks[
                r, picked.indices
            ]


def _confidences(
    batch: RowBatch, chosen: torch.Tensor, remask: dict[ScheduledWork, torch.Tensor]
) -> torch.Tensor:
    """Each block's confidences in `batch.padded`'s layout: at its masked positions the
    softmax probability of the candidate (`low_confidence`) or the row's uniform noise
    (`random`); -inf elsewhere, never picked (no share exceeds the block's masks)."""
    if len(remask) < len(batch.works):
        probs = torch.softmax(batch.logits64, dim=-1).gather(-1, chosen[:, None]).squeeze(-1)
    else:
        probs = torch.zeros(chosen.shape, dtype=torch.float64, device=batch.device)
    confidence = batch.padded(probs, float("-inf"))
    for r, work in enumerate(batch.works):
        if work in remask:
            a, b = batch.bounds[r], batch.bounds[r + 1]
            at = batch.padded_at[a:b] - r * batch.width
            confidence[r, at] = remask[work][at]
    return confidence


@register
class Fixed(CommitRule):
    name = "fixed"
    order = 10
    reads = ("steps", "remasking", "top_p", "top_k")
    runs_steps = True

    @classmethod
    def row_settings(cls, settings: Any) -> dict[str, Any]:
        return dict(steps=settings.steps_run, alpha=None, threshold=None)

    @classmethod
    def selects(cls, row: Any) -> bool:
        return row.block is None and row.steps is not None and row.dream is None

    @classmethod
    def worker(cls, mask_id: int, end_ids: Sequence[int]) -> FixedSchedule:
        return FixedSchedule(mask_id)
