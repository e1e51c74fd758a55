"""Temporal self-consistency voting (TSCV; Wang et al., "Time Is a Feature", arXiv
2508.09138): a vote over the answers a decode already holds at its steps.

At every step the decoder shows an observed row its full prediction (fixed tokens, plus
the most likely token at every still-masked position: `RowDecoder._show_predictions`).
`StepAnswers` extracts each prediction's answer through the same path as the final
answer (the harness's cut at end-of-text and `until`, then the task's extraction), and
`temporal_vote` weighs them by step:

    exp:    w(s) = exp(alpha * s / T)      (the release's README example: alpha 5.0)
    linear: w(s) = (s + 1) / T
    fixed:  w(s) = 1

with `s` the 0-based step and `T` the decode's number of steps (its forward passes). A
step without an answer casts no vote. Each decode's weights are normalised to sum to 1
over its answered steps, so one decode (strategy=temporal) gives each answer its share
of the decode, and several (`vote=temporal` for majority, hex and dvoting: our
extension, not in the paper) give each decode one vote, spread over its steps' answers.
Equal answers (by `same_answer`, e.g. MATH equivalence, which the release does not
merge) pool their weight; the heaviest group wins, a tie goes to the group seen first
(decodes in order, steps in order). No extra forward pass: the cost is the extraction,
done only when a step's prediction differs from the previous step's.

Sample logs keep each decode's answers as runs (`answer_runs`), from which the report's
figures are computed: ever-pass and temporal semantic entropy (`step_figures`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from lm_eval_dvoting.core.answers import group_answers

TEMPORAL_WEIGHTS = ("exp", "linear", "fixed")
SameAnswer = Optional[Callable[[Any, Any], bool]]
StepAnswer = tuple[int, Any]  # (0-based step, answer), answer not None


def step_weight(step: int, total_steps: int, rule: str, alpha: float) -> float:
    """The weight of 0-based step `step` of `total_steps` under `rule` (module docstring)."""
    if rule == "exp":
        return math.exp(alpha * step / total_steps)
    if rule == "linear":
        return (step + 1) / total_steps
    if rule == "fixed":
        return 1.0
    raise ValueError(f"temporal_weight must be one of {TEMPORAL_WEIGHTS}, got {rule!r}")


def step_shares(steps: Sequence[int], total_steps: int, rule: str, alpha: float) -> list[float]:
    """The weights of a decode's answered `steps`, normalised to sum to 1 ([] for none).

    exp weights are taken relative to the latest step (exp(alpha * (s - s_last) / T)),
    which normalising makes no difference to but keeps any finite alpha from overflowing.
    """
    if not steps:
        return []
    shift = max(steps) if rule == "exp" else 0
    weights = [step_weight(step - shift, total_steps, rule, alpha) for step in steps]
    total = sum(weights)
    return [weight / total for weight in weights]


@dataclass
class StepAnswers:
    """The answers of one decode's steps, as the decoder shows them (`observe`).

    `answer_of` maps a prediction (generation-region token ids) to an answer or None.
    A prediction seen at an earlier step (the previous one, or one the decode came back
    to) reuses its answer: no second extraction.
    """

    answer_of: Callable[[torch.Tensor], Any]
    answers: list[StepAnswer] = field(default_factory=list)
    predictions: dict[int, torch.Tensor] = field(
        default_factory=dict
    )  # step -> prediction, answered steps
    _previous: tuple[torch.Tensor, Any] | None = None
    _parsed: dict[bytes, Any] = field(default_factory=dict)  # prediction's bytes -> its answer

    def observe(self, step: int, prediction: torch.Tensor) -> None:
        prediction = prediction.cpu()
        if self._previous is not None and torch.equal(self._previous[0], prediction):
            prediction, answer = self._previous  # one tensor kept for a run of equal predictions
        else:
            key = prediction.numpy().tobytes()
            if key not in self._parsed:
                self._parsed[key] = self.answer_of(prediction)
            answer = self._parsed[key]
        self._previous = (prediction, answer)
        if answer is not None:
            self.answers.append((step, answer))
            self.predictions[step] = prediction

    def close(self, last_step: int, tokens: torch.Tensor, answer: Any) -> None:
        """The decode's last step answers what the decode committed: `tokens` and `answer`
        (the final sample's) replace that step's prediction. They differ only when the
        last commit was sampled (temperature > 0: the predictions are argmaxes), and then
        the sample's own answer must be the one its last step votes for, as in the release
        (whose predictions are the sampled candidates)."""
        if self.answers and self.answers[-1][0] == last_step:
            self.answers.pop()
            self.predictions.pop(last_step)
        if answer is not None:
            self.answers.append((last_step, answer))
            self.predictions[last_step] = tokens.cpu()


@dataclass
class TemporalVote:
    """The outcome: the winning answer (None if no step answered), each group's
    representative and total weight (heaviest first; one decode's weights sum to 1), and
    the `carrier`: (decode, step) of the latest step carrying the winner in the decode
    that gives the winner the most weight (the first such decode on a tie)."""

    winner: Any
    weights: list[tuple[Any, float]]
    carrier: tuple[int, int] | None


def temporal_vote(
    decodes: Sequence[Sequence[StepAnswer]],
    total_steps: Sequence[int],
    rule: str = "exp",
    alpha: float = 5.0,
    same_answer: SameAnswer = None,
) -> TemporalVote:
    """Weighted vote over the (step, answer) pairs of each decode, whose `total_steps`
    are given in the same order (module docstring)."""
    flat = [
        (d, step, answer, share)
        for d, (answers, steps) in enumerate(zip(decodes, total_steps, strict=True))
        for (step, answer), share in zip(
            answers, step_shares([s for s, _ in answers], steps, rule, alpha)
        )
    ]
    groups = group_answers([answer for _, _, answer, _ in flat], same_answer)
    if not groups:
        return TemporalVote(winner=None, weights=[], carrier=None)
    totals = [math.fsum(flat[i][3] for i in members) for _, members in groups]
    order = sorted(
        range(len(groups)), key=lambda g: -_rounded(totals[g])
    )  # stable: ties keep first-seen order
    winning = groups[order[0]][1]
    by_decode: dict[int, list[float]] = {}
    for i in winning:
        by_decode.setdefault(flat[i][0], []).append(flat[i][3])
    decode = max(by_decode, key=lambda d: (_rounded(math.fsum(by_decode[d])), -d))
    return TemporalVote(
        winner=groups[order[0]][0],
        weights=[(groups[g][0], totals[g]) for g in order],
        carrier=(decode, max(flat[i][1] for i in winning if flat[i][0] == decode)),
    )


def _rounded(weight: float) -> float:
    # Sums of shares carry rounding error (ten shares of 1/10 make 0.9999999999999999): equal
    # weights must tie, and go to the answer seen first, as in a plain vote.
    return round(weight, 9)


# ------------------------------------------------------------- logs and figures


def answer_runs(
    answers: Sequence[StepAnswer],
    total_steps: int,
    value: Callable[[Any], Any] = lambda answer: answer,
) -> list[list[Any]]:
    """A decode's per-step answers, compactly and losslessly: [first step, value] for each
    run of consecutive steps with one answer, a run of steps without one as
    [first step, None]. Each run lasts until the next one's first step, the last until
    step `total_steps - 1`. `value` maps an answer to what is logged."""
    runs: list[list[Any]] = []
    expected = 0  # the step after the last one seen
    for step, answer in answers:
        if step > expected and (not runs or runs[-1][1] is not None):
            runs.append([expected, None])
        logged = value(answer)
        if not runs or runs[-1][1] != logged:
            runs.append([step, logged])
        expected = step + 1
    if expected < total_steps and (not runs or runs[-1][1] is not None):
        runs.append([expected, None])
    return runs


def expand_runs(runs: Sequence[Sequence[Any]], total_steps: int) -> list[Any]:
    """The per-step values (None: no answer) of `answer_runs`' runs, `total_steps` of them."""
    values: list[Any] = []
    for k, (first, value) in enumerate(runs):
        end = runs[k + 1][0] if k + 1 < len(runs) else total_steps
        values += [value] * (end - first)
    return values


def temporal_entropy(values: Sequence[Any], same_answer: SameAnswer = None) -> float | None:
    """Temporal semantic entropy (TSE) of one decode, in bits: the entropy of the
    distribution of its answered steps over its answers, equal answers (`same_answer`)
    grouped: -sum_k p_k log2 p_k with p_k the share of answered steps in group k. None
    when no step answered. Ours counts every answered step once; the authors' training
    code drops the first half of the steps and weighs by exp(12.8 s/T)."""
    groups = group_answers(values, same_answer)
    answered = sum(len(members) for _, members in groups)
    if not answered:
        return None
    return -sum(len(m) / answered * math.log2(len(m) / answered) for _, m in groups) + 0.0


def step_figures(
    trace: dict[str, Any], is_correct: Callable[[Any], bool], same_answer: SameAnswer = None
) -> tuple[dict[str, Any], dict[str, float]]:
    """A scored copy of a trace with per-step answers, and the question's figures.

    Each candidate carrying `steps` (runs) gets `steps_correct` (one bool per run); the
    trace gets `plain_correct` (whether the plain vote over the samples' final answers,
    `plain_vote`, is right). Figures: `ever_pass` (1.0 when some step of some sample,
    or some sample's final answer, is right) and `tse` (the mean `temporal_entropy` of
    the decodes that answered at some step; left out when none did).
    """
    candidates = [dict(candidate) for candidate in trace.get("candidates", [])]
    scored = dict(trace, candidates=candidates, plain_correct=is_correct(trace.get("plain_vote")))
    ever, entropies = False, []
    for candidate in candidates:
        ever = ever or is_correct(candidate.get("answer"))
        if "steps" not in candidate:
            continue
        candidate["steps_correct"] = [is_correct(value) for _, value in candidate["steps"]]
        ever = ever or any(candidate["steps_correct"])
        entropy = temporal_entropy(expand_runs(candidate["steps"], candidate["nfe"]), same_answer)
        if entropy is not None:
            entropies.append(entropy)
    figures = {"ever_pass": float(ever)}
    if entropies:
        figures["tse"] = sum(entropies) / len(entropies)
    return scored, figures
