"""Temporal self-consistency voting (TSCV; Wang et al., "Time Is a Feature", arXiv
2508.09138): a vote over the answers one decode already holds at its steps.

At every step the decoder shows an observed row its full prediction (fixed tokens, plus
the most likely token at every still-masked position: `RowDecoder._show_predictions`).
`StepAnswers` extracts each prediction's answer through the same path as the final
answer (the harness's cut at end-of-text and `until`, then the task's extraction), and
`temporal_vote` weighs them by step:

    exp:    w(s) = exp(alpha * s / T)      (the release's README example: alpha 5.0)
    linear: w(s) = (s + 1) / T
    fixed:  w(s) = 1

with `s` the 0-based step and `T` the decode's number of steps (its forward passes). A
step without an answer casts no vote. Equal answers (by `same_answer`, e.g. MATH
equivalence, which the release does not merge) pool their weight; the heaviest group
wins, a tie goes to the group seen first. No extra forward pass: the cost is the
extraction, done only when a step's prediction differs from the previous step's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from .answers import group_answers

TEMPORAL_WEIGHTS = ("exp", "linear", "fixed")
SameAnswer = Optional[Callable[[Any, Any], bool]]


def step_weight(step: int, total_steps: int, rule: str, alpha: float) -> float:
    """The weight of 0-based step `step` of `total_steps` under `rule` (module docstring)."""
    if rule == "exp":
        return math.exp(alpha * step / total_steps)
    if rule == "linear":
        return (step + 1) / total_steps
    if rule == "fixed":
        return 1.0
    raise ValueError(f"temporal_weight must be one of {TEMPORAL_WEIGHTS}, got {rule!r}")


@dataclass
class StepAnswers:
    """The answers of one decode's steps, as the decoder shows them (`observe`).

    `answer_of` maps a prediction (generation-region token ids) to an answer or None.
    A prediction equal to the previous step's reuses its answer (no second extraction).
    """

    answer_of: Callable[[torch.Tensor], Any]
    answers: list[tuple[int, Any]] = field(default_factory=list)  # (step, answer), answer not None
    predictions: dict[int, torch.Tensor] = field(default_factory=dict)  # step -> prediction, answered steps
    _previous: tuple[torch.Tensor, Any] | None = None

    def observe(self, step: int, prediction: torch.Tensor) -> None:
        prediction = prediction.cpu()
        if self._previous is not None and torch.equal(self._previous[0], prediction):
            answer = self._previous[1]
        else:
            answer = self.answer_of(prediction)
        self._previous = (prediction, answer)
        if answer is not None:
            self.answers.append((step, answer))
            self.predictions[step] = prediction


@dataclass
class TemporalVote:
    """The outcome: the winning answer (None if no step answered), each group's
    representative and total weight (heaviest first), and the latest step whose answer
    is in the winning group (its prediction is the text to return)."""

    winner: Any
    weights: list[tuple[Any, float]]
    winner_step: int | None


def temporal_vote(answers: list[tuple[int, Any]], total_steps: int, rule: str = "exp", alpha: float = 5.0,
                  same_answer: SameAnswer = None) -> TemporalVote:
    """Weighted vote over (step, answer) pairs (module docstring)."""
    groups = group_answers([answer for _, answer in answers], same_answer)
    if not groups:
        return TemporalVote(winner=None, weights=[], winner_step=None)
    totals = [sum(step_weight(answers[i][0], total_steps, rule, alpha) for i in members) for _, members in groups]
    order = sorted(range(len(groups)), key=lambda g: -totals[g])  # stable: ties keep first-seen order
    return TemporalVote(winner=groups[order[0]][0],
                        weights=[(groups[g][0], totals[g]) for g in order],
                        winner_step=max(answers[i][0] for i in groups[order[0]][1]))
