"""What a strategy's plan is made of: the samples it asks for (`SampleSpec`), and the
helpers dVoting's plan shares (the early stop, the remask start, the fixed schedule's steps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generator, Sequence

import torch

from lm_eval_dvoting.core.answers import tally
from lm_eval_dvoting.core.decoding.state import BlockDecoding, DreamDecoding

SameAnswer = Callable[[Any, Any], bool]


@dataclass(frozen=True)
class SampleSpec:
    """One sample to draw: its starting region and decoding rule."""

    init_tokens: torch.Tensor
    block_length: int
    steps: int | None
    alpha: float | None
    temperature: float
    kept: torch.Tensor | None = None  # positions fixed from earlier samples (remask samples)
    threshold: float | None = None  # the confidence rule's (when neither steps nor alpha is given)
    # block diffusion's rule (LLaDA2), instead of the three above
    block: BlockDecoding | None = None
    rule: str | None = None  # a commit rule chosen by name (`DecodeRow.rule`)
    dream: DreamDecoding | None = None  # Dream's algorithm settings (rule "dream")


# a question's plan: yields the next draw (samples that do not depend on each other, so
# they decode side by side) and receives each sample's (tokens, answer) back
QuestionPlan = Generator[list[SampleSpec], list[tuple[torch.Tensor, Any]], None]


def should_stop_early(
    answers: Sequence[Any | None], n: int, same_answer: SameAnswer | None = None
) -> bool:
    """dVoting's answer-consistency stop, checked before drawing samples 3..n."""
    counts = tally(answers, same_answer).counts
    if not counts:
        return False
    top, valid = counts[0][1], sum(c for _, c in counts)
    return top > n // 2 or (top == valid and top >= n // 2)


def remask_tokens(samples: torch.Tensor, tau: float, mask_id: int) -> torch.Tensor:
    """The start of a remask sample: keep agreed positions, mask the rest.

    For each position, the most frequent token among the earlier `samples`
    (k, L) is kept if its share is >= `tau`; ties between equally frequent tokens go
    to the one the earliest sample holds. The last quarter (floor(L/4)) is always
    masked, so the answer is always regenerated.
    """
    k, length = samples.shape
    # (k, L) votes for each sample's token
    agree = (samples[:, None, :] == samples[None, :, :]).sum(1)
    best = agree.argmax(0)  # first maximum = earliest sample
    token = samples.gather(0, best[None]).squeeze(0)
    share = agree.gather(0, best[None]).squeeze(0).double() / k
    start = torch.where(share >= tau - 1e-12, token, torch.full_like(token, mask_id))
    start[length - length // 4 :] = mask_id
    return start


def fixed_steps(steps: int, gen_length: int, block_length: int) -> int:
    """`steps` rounded up to a multiple of the block count (LLaDA needs equal steps per block)."""
    blocks = gen_length // block_length
    return max(blocks, -(-steps // blocks) * blocks)


def fresh_region(gen_length: int, mask_id: int) -> torch.Tensor:
    """A generation region of masks only: where a fresh sample starts."""
    return torch.full((gen_length,), mask_id, dtype=torch.long)


def fresh_sample(settings: Any, mask_id: int, **changes: Any) -> SampleSpec:
    """A sample from masks only at the settings' block length, temperature and commit rule
    (`changes` override any of them, e.g. hex's block length, a remask sample's start)."""
    spec: dict[str, Any] = dict(
        init_tokens=fresh_region(settings.gen_length, mask_id),
        block_length=settings.resolved_block_length,
        temperature=settings.resolved_temperature,
        **settings.commit_rule(),
    )
    spec.update(changes)
    return SampleSpec(**spec)
