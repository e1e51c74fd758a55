"""What the commit rules share: a row's work within a step (`RowWork`), the logits window,
and the block helpers. The rules themselves are parts, one file each under
`core/parts/rules/` (their arithmetic there too: `FixedSchedule` in fixed.py,
`EntropyThreshold` in entropy.py, `ConfidenceThreshold` in confidence.py; block diffusion's
`BlockThreshold` in decoding/blocks.py). This module imports no part.

A rule turns each row into a `RowWork` at the start of a step (`begin`): the positions it
wants logits for. The row batch fetches the logits of every row's wanted positions in one
output-head call and hands them over (`RowWork.receive`); then each rule commits for all
its rows at once (`commit`), and returns the rows that go on in another round of the same
step (only the entropy rule's block hand-over does). Rows are independent: each draws
from its own generator, so no row's tokens depend on the others in its round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lm_eval_dvoting.core.decoding.state import DecodeRow, masked_block

Window = tuple[int, int] | None  # generation indices [lo, hi) whose logits a step has; None: all


@dataclass(eq=False)
class RowWork:
    """One row's commits within one step: the positions it wants logits for next, and
    the float32 logits it received for them."""

    index: int  # the row's index in the step's batch
    row: DecodeRow
    wanted: list[int] = field(default_factory=list)  # generation indices
    logits: torch.Tensor | None = None

    def receive(self, logits: torch.Tensor) -> None:
        self.logits = logits


@dataclass(eq=False)
class ScheduledWork(RowWork):
    """A row's work on one block: the fixed schedule's, the confidence rule's, block
    diffusion's."""

    start: int = 0  # the block's first generation index
    masked: torch.Tensor | None = None  # bool over the block


def first_masked_block_start(row: DecodeRow, mask_id: int) -> int:
    """The start of the block holding the row's first mask (an active row has one)."""
    return masked_block(row.tokens.tolist(), mask_id, row.block_length)[0]


class FirstMaskedBlock:
    """What the rules without a per-block schedule of their own share (the entropy and
    confidence thresholds, Dream's): a row works on the block holding its first mask, and
    is done when no mask is left (which the row batch checks)."""

    def __init__(self, mask_id: int) -> None:
        self.mask_id = mask_id

    def block_start(self, row: DecodeRow) -> int:
        return first_masked_block_start(row, self.mask_id)

    def is_done(self, row: DecodeRow) -> bool:
        return False


def inside_window(window: Window, positions: list[int]) -> bool:
    """Whether the step's logits window holds every one of `positions`."""
    return window is None or all(window[0] <= p < window[1] for p in positions)
