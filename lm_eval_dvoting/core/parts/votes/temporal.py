"""`vote=temporal`: the answers of every step of every sample, each sample's weights
normalised (`core/temporal.py`; TSCV's vote, extended to the voting strategies)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lm_eval_dvoting.core.parts.base import BIDIRECTIONAL, BLOCK_CAUSAL, Vote, register
from lm_eval_dvoting.core.parts.samples import SameAnswer
from lm_eval_dvoting.core.temporal import temporal_vote


@register
class TemporalVote(Vote):
    name = "temporal"
    order = 20
    reads = ("temporal_weight", "temporal_alpha")
    models = (BIDIRECTIONAL, BLOCK_CAUSAL)
    needs_whole_prediction = True

    @classmethod
    def result(cls, question: Any, settings: Any, same_answer: SameAnswer | None) -> Any:
        """The temporal vote over the samples' steps (each sample's weights over its own
        number of steps). The response is the first sample whose final answer is the
        winner, else the latest step's prediction carrying the winner (`TemporalVote.carrier`
        of core/temporal.py); the plain vote's result when no step of any sample answered."""
        plain = question.result(same_answer)
        vote = temporal_vote(
            [steps.answers for steps in question.steps],
            question.sample_nfe,
            settings.temporal_weight,
            settings.temporal_alpha,
            same_answer,
        )
        logged = replace(
            plain,
            step_answers=[list(steps.answers) for steps in question.steps],
            plain_votes=plain.votes,
        )
        if vote.winner is None:
            return logged
        final = _first_carrying(question.answers, vote.winner, same_answer)
        if final is not None:
            return replace(logged, votes=vote.weights, chosen=final)
        sample, step = vote.carrier
        return replace(
            logged,
            votes=vote.weights,
            chosen=sample,
            returned=question.steps[sample].predictions[step],
            returned_step=step,
        )


def _first_carrying(answers: list[Any], winner: Any, same_answer: SameAnswer | None) -> int | None:
    """The first sample whose final answer is `winner` (None: no sample's is)."""
    same = same_answer or (lambda a, b: a == b)
    carrying = (
        i for i, answer in enumerate(answers) if answer is not None and same(winner, answer)
    )
    return next(carrying, None)
