"""`decoder=fixed`: LLaDA's fixed schedule: `steps` forward passes per sample, a fixed
number of tokens committed per step, chosen by `remasking`: `steps / num_blocks` steps per
block, the block's masks spread evenly over them (remainder to the earliest steps),
highest confidence first (`remasking="low_confidence"`: the softmax probability of the
chosen token; `"random"`: a uniform score)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from lm_eval_dvoting.core.decoding.rules import RowWork, ScheduledWork, Window
from lm_eval_dvoting.core.decoding.state import DecodeRow, candidates, suppress_mask
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

    def begin(self, index: int, row: DecodeRow, window: Window) -> RowWork:
        """This step's share of the block; the block's masked positions if it commits any."""
        progress, start = row.progress, self.block_start(row)
        masked = row.tokens[start : start + row.block_length] == self.mask_id
        if progress.step_in_block == 0:
            # LLaDA's get_num_transfer_tokens: even spread, remainder to the first steps
            base, remainder = divmod(int(masked.sum()), row.steps_per_block)
            progress.counts = [
                base + 1 if s < remainder else base for s in range(row.steps_per_block)
            ]
        work = ScheduledWork(index, row, start=start, masked=masked)
        if progress.counts[progress.step_in_block]:
            work.wanted = (start + masked.nonzero().squeeze(1)).tolist()
        return work

    def commit(self, works: Sequence[ScheduledWork]) -> list[RowWork]:
        """Commit each row's share; a fixed-schedule row never goes on within a step."""
        for work in works:
            row, progress = work.row, work.row.progress
            if work.wanted:
                self._commit_share(work, suppress_mask(work.logits, self.mask_id))
            progress.step_in_block += 1
            if progress.step_in_block == row.steps_per_block:
                progress.block, progress.step_in_block = progress.block + 1, 0
        return []

    @staticmethod
    def _commit_share(work: ScheduledWork, logits64: torch.Tensor) -> None:
        """The step's count of the block's masks, highest confidence first.

        `logits64` holds the masked positions of the block only: the others can never
        be picked (their confidence is -inf and the schedule never asks for more
        tokens than the block has masks).
        """
        row, masked = work.row, work.masked
        block = row.tokens[work.start : work.start + row.block_length]
        chosen = torch.zeros_like(block)
        chosen[masked] = candidates(
            logits64, row.temperature, row.generator, masked, row.top_p, row.top_k
        )
        confidence = torch.full(
            block.shape, float("-inf"), dtype=torch.float64, device=block.device
        )
        if row.remasking == "low_confidence":
            probs = torch.softmax(logits64, dim=-1)
            confidence[masked] = probs.gather(-1, chosen[masked][:, None]).squeeze(-1)
        else:
            noise = torch.rand(
                block.shape, dtype=torch.float64, device=block.device, generator=row.generator
            )
            confidence[masked] = noise[masked]
        picked = confidence.topk(row.progress.counts[row.progress.step_in_block]).indices
        block[picked] = chosen[picked]


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
