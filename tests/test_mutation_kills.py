"""Tests written to kill surviving mutants of the scoring core (tools/mutation.py,
docs/MUTATION.md). Each one guards a behaviour a user can see: a returned text, a voted
or scored answer, an NFE count, a seed, a stop decision or a metric.
"""
from __future__ import annotations

import pytest
import torch

from lm_eval_dvoting.answers import extract_answer, infer_answer_kind
from lm_eval_dvoting.metrics import (
    benefit_per_cost,
    consistency_from_votes,
    consistency_level,
    nupr_at_k,
)

# ---- metrics.py ----------------------------------------------------------------------


def test_benefit_per_cost_accepts_one_step_and_rejects_zero_steps():
    """A one-step run is a valid cost (BPC is defined), a zero-step one is not: the
    boundary of the `steps > 0` check, with the message naming both step counts."""
    assert benefit_per_cost(0.75, 0.5, 1, 1) == pytest.approx(0.25)
    assert benefit_per_cost(0.75, 0.5, 2, 1) == pytest.approx(0.125)
    assert benefit_per_cost(0.75, 0.5, 1, 2) == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"steps must be > 0, got method 0, single 4"):
        benefit_per_cost(0.75, 0.5, 0, 4)
    with pytest.raises(ValueError, match=r"steps must be > 0, got method 4, single 0"):
        benefit_per_cost(0.75, 0.5, 4, 0)


def test_consistency_from_votes_of_one_sample():
    """One sample that voted is full consistency; zero samples is an error that says so."""
    assert consistency_from_votes({"7": 1}, 1) == 1.0
    assert consistency_from_votes({}, 1) == 0.0
    with pytest.raises(ValueError, match=r"n_samples must be >= 1, got 0"):
        consistency_from_votes({"7": 1}, 0)


def test_metric_errors_name_the_empty_input():
    """Empty inputs fail with a message that says what was empty, not a bare ValueError."""
    with pytest.raises(ValueError, match=r"^no answers$"):
        consistency_level([])
    with pytest.raises(ValueError, match=r"^no samples$"):
        nupr_at_k([], 1)
    with pytest.raises(ValueError, match=r"^samples have no positions$"):
        nupr_at_k([[], []], 1)
    with pytest.raises(ValueError, match=r"^samples have no positions$"):
        nupr_at_k(torch.zeros(3, 0, dtype=torch.long), 1)


# ---- answers.py ----------------------------------------------------------------------


@pytest.mark.parametrize("task, kind", [
    ("leaderboard_math_hard", "math"),
    ("leaderboard_gpqa_main", "choice"),
    ("leaderboard-mmlu-pro", "choice"),
    ("my.minerva.copy", "math"),
])
def test_answer_kind_from_a_benchmark_name_inside_the_task_name(task, kind):
    """The task name is split at every non-alphanumeric character, so a benchmark name
    after a prefix (lm-eval's `leaderboard_*` groups) still decides the answer kind
    (the vote then groups `\\frac{1}{2}` with `0.5`, or letters with letters)."""
    assert infer_answer_kind(task) == kind


@pytest.mark.parametrize("text, expected", [
    ("The answer is 3 / 4", "0.75"),
    ("The answer is 1.5/3", "0.5"),
    ("#### 4.5 / 1.5", "3"),
    ("so it is -3/4", "-0.75"),
])
def test_fraction_answers_with_spaces_or_decimals(text, expected):
    """A fraction written with spaces around the slash or with decimal parts is still
    one number (`1.5/3` is 0.5, not "no answer"), so such samples vote for it."""
    assert extract_answer(text, "number") == expected
