"""The paper's measures (docs/ALGORITHM.md section 4) on hand-computed cases."""

from __future__ import annotations

import pytest
import torch

from lm_eval_dvoting.core.metrics import (
    benefit_per_cost,
    consistency_from_votes,
    consistency_level,
    mean_nupr_at_k,
    nupr_at_k,
    position_agreement,
    token_agreement,
)

# Three samples of one question, four generation positions. Most frequent token's
# count per position: 3 (all hold 1), 2 (two hold 2), 2 (two hold 5), 1 (all differ).
THREE = [[1, 2, 3, 4], [1, 2, 5, 6], [1, 7, 5, 8]]


def test_position_and_token_agreement():
    assert position_agreement(THREE) == [3, 2, 2, 1]
    assert token_agreement(THREE) == [[3, 2, 1, 1], [3, 2, 2, 1], [3, 1, 2, 1]]


def test_nupr_at_k_hand_computed():
    assert nupr_at_k(THREE, 1) == 1.0
    assert nupr_at_k(THREE, 2) == 3 / 4  # positions 0, 1, 2
    assert nupr_at_k(THREE, 3) == 1 / 4  # position 0 only
    assert nupr_at_k(THREE, 4) == 0.0  # more than K samples can never agree


def test_nupr_counts_the_most_frequent_token_not_any_pair():
    # position 0: tokens 5,5,6,6,7 -> at most 2 share a token, not 4
    samples = [[5], [5], [6], [6], [7]]
    assert nupr_at_k(samples, 2) == 1.0
    assert nupr_at_k(samples, 3) == 0.0


def test_nupr_of_five_samples_like_the_paper():
    # K=5, L=10: 5 positions where 2 agree, 2 of them where 3 agree
    rows = torch.arange(50).reshape(5, 10)  # all distinct
    rows[1, :5] = rows[0, :5]
    rows[2, :2] = rows[0, :2]
    assert nupr_at_k(rows, 2) == pytest.approx(0.5)
    assert nupr_at_k(rows, 3) == pytest.approx(0.2)


def test_nupr_takes_tensors_and_lists_of_tensors():
    tensor = torch.tensor(THREE)
    assert nupr_at_k(tensor, 2) == 0.75
    assert nupr_at_k(list(tensor), 3) == 0.25


def test_nupr_rejects_bad_input():
    with pytest.raises(ValueError, match="equal lengths"):
        nupr_at_k([[1, 2], [1]], 2)
    with pytest.raises(ValueError, match="no samples"):
        nupr_at_k([], 2)
    with pytest.raises(ValueError, match="k must be"):
        nupr_at_k(THREE, 0)


def test_mean_nupr_over_questions():
    two = [[9, 9], [9, 8]]  # NUPR@2 = 1/2; K=2 < 3: left out of NUPR@3
    assert mean_nupr_at_k([THREE, two], 2) == pytest.approx((0.75 + 0.5) / 2)
    assert mean_nupr_at_k([THREE, two], 3) == pytest.approx(0.25)
    assert mean_nupr_at_k([two], 3) is None
    assert mean_nupr_at_k([], 2) is None


def test_consistency_level_hand_computed():
    assert consistency_level(["7", "7", "3", "7", "5"]) == pytest.approx(3 / 5)
    assert consistency_level(["7", "7", "7"]) == 1.0
    assert consistency_level(["a", "b"]) == 0.5  # a tie: the top count is what counts
    assert consistency_level(["4"]) == 1.0


def test_consistency_level_none_counts_as_a_sample_without_a_vote():
    assert consistency_level(["7", "7", None]) == pytest.approx(2 / 3)
    assert consistency_level([None, "3", None, None, "3"]) == pytest.approx(2 / 5)
    assert consistency_level([None, None]) == 0.0
    with pytest.raises(ValueError):
        consistency_level([])


def test_consistency_level_groups_equivalent_answers():
    same_number = lambda a, b: float(a) == float(b)  # noqa: E731
    assert consistency_level(["18", "18.0", "3"], same_number) == pytest.approx(2 / 3)
    assert consistency_level(["18", "18.0", "3"]) == pytest.approx(1 / 3)


def test_consistency_from_votes():
    assert consistency_from_votes({"7": 2, "3": 2, "6": 1}, 5) == pytest.approx(0.4)
    assert consistency_from_votes({}, 3) == 0.0  # no sample had an answer
    with pytest.raises(ValueError):
        consistency_from_votes({"7": 1}, 0)


def test_benefit_per_cost_paper_example():
    # the paper: (78.24 - 70.58) / (170.4 / 128) = 5.75
    bpc = benefit_per_cost(78.24, 70.58, 170.4, 128)
    assert bpc == pytest.approx(7.66 / 1.33125)
    assert round(bpc, 2) == 5.75


def test_benefit_per_cost_other_cases():
    assert benefit_per_cost(80.0, 70.0, 256, 128) == pytest.approx(
        5.0
    )  # +10 points at twice the cost
    assert benefit_per_cost(70.0, 70.0, 640, 128) == 0.0
    assert benefit_per_cost(65.0, 70.0, 640, 128) == pytest.approx(-1.0)
    assert benefit_per_cost(60.0, 70.0, 64, 128) == pytest.approx(-20.0)  # cheaper and worse
    # in the accuracies' unit: fractions in, fractions out
    assert benefit_per_cost(0.7824, 0.7058, 170.4, 128) == pytest.approx(0.0575, abs=5e-5)
    with pytest.raises(ValueError):
        benefit_per_cost(80.0, 70.0, 100, 0)
