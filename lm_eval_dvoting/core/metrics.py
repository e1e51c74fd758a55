"""The measures the dVoting paper reports (docs/ALGORITHM.md section 4), as pure functions.

* `nupr_at_k`: NUPR@k of one question: the fraction of generation positions at which
  at least `k` of its `K` samples (equal-length token sequences) hold the same token.
  `mean_nupr_at_k` averages it over questions.
* `consistency_level`: votes for the most frequent answer / number of samples.
* `benefit_per_cost`: BPC, `(acc_method - acc_single) / (steps_method / steps_single)`;
  `benefit_per_cost_if_costlier`: BPC where it charges for cost, None for a cheaper method.

Nothing here imports torch or lm_eval: samples may be lists of token ids or anything
with `.tolist()` (a tensor or an array), so the functions run on a harness's logged
samples as well as on live strategy results.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

__all__ = [
    "benefit_per_cost",
    "benefit_per_cost_if_costlier",
    "consistency_from_votes",
    "consistency_level",
    "mean_nupr_at_k",
    "nupr_at_k",
    "position_agreement",
    "token_agreement",
]


def _rows(samples: Any) -> list[list[Hashable]]:
    """`samples` as a list of equal-length, non-empty token lists (else ValueError)."""
    if hasattr(samples, "tolist"):
        samples = samples.tolist()
    rows = [list(s.tolist() if hasattr(s, "tolist") else s) for s in samples]
    if not rows:
        raise ValueError("no samples")
    lengths = {len(r) for r in rows}
    if len(lengths) != 1:
        raise ValueError(f"samples must have equal lengths, got lengths {sorted(lengths)}")
    if lengths == {0}:
        raise ValueError("samples have no positions")
    return rows


def position_agreement(samples: Any) -> list[int]:
    """Per position: how many samples hold that position's most frequent token."""
    rows = _rows(samples)
    return [Counter(column).most_common(1)[0][1] for column in zip(*rows)]


def token_agreement(samples: Any) -> list[list[int]]:
    """Per sample and position: how many samples (itself included) hold the same token.

    This is what the token-consistency picture colours: 1 = this sample alone, K = all.
    """
    rows = _rows(samples)
    counts = [Counter(column) for column in zip(*rows)]
    return [[counts[t][token] for t, token in enumerate(row)] for row in rows]


def nupr_at_k(samples: Any, k: int) -> float:
    """NUPR@k of one question's `K` samples.

    The fraction of generation positions at which at least `k` samples share the same
    token. Every position of the (equal-length) samples counts, end-of-text padding
    included: the samples are the generation region as decoded. `k <= 1` gives 1.0;
    `k > K` gives 0.0 (no position can have `k` agreeing samples).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    agreement = position_agreement(samples)
    return sum(1 for a in agreement if a >= k) / len(agreement)


def mean_nupr_at_k(questions: Iterable[Any], k: int) -> float | None:
    """NUPR@k averaged over questions (each question weighs the same).

    `questions` yields each question's samples. A question with fewer than `k` samples
    is left out (with `K < k` the measure says nothing about agreement; counting it as
    0 would make an early-stopping strategy look less repetitive than it is). Returns
    None when no question has `k` samples.
    """
    values = []
    for samples in questions:
        rows = _rows(samples)
        if len(rows) >= k:
            values.append(nupr_at_k(rows, k))
    return sum(values) / len(values) if values else None


def consistency_level(
    answers: Sequence[Any],
    same: Callable[[Any, Any], bool] | None = None,
) -> float:
    """Voting consistency level: votes for the most frequent answer / number of samples.

    `answers` holds every sample's extracted answer; None means "no answer could be
    extracted". Such a sample counts in the denominator (it is one of the samples
    drawn) but casts no vote, so `["7", "7", None]` is 2/3 and all-None is 0.0.
    `same(a, b)` groups equivalent answers (e.g. "18" and "18.0"); by default answers
    are compared with `==`. Groups are formed in order, each answer joining the first
    earlier group it is the same as, as the vote does.
    """
    if not answers:
        raise ValueError("no answers")
    groups: list[tuple[Any, int]] = []
    for answer in answers:
        if answer is None:
            continue
        for i, (representative, count) in enumerate(groups):
            if same(representative, answer) if same else representative == answer:
                groups[i] = (representative, count + 1)
                break
        else:
            groups.append((answer, 1))
    top = max((count for _, count in groups), default=0)
    return top / len(answers)


def consistency_from_votes(votes: dict[Any, int], n_samples: int) -> float:
    """`consistency_level` from a vote count (answer -> votes) over `n_samples` samples."""
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    return max(votes.values(), default=0) / n_samples


def benefit_per_cost(
    acc_method: float, acc_single: float, steps_method: float, steps_single: float
) -> float:
    """Benefit per cost: `(acc_method - acc_single) / (steps_method / steps_single)`.

    The accuracy gain over the single-sample baseline per multiple of the baseline's
    cost. In the unit of the accuracies: pass percentages to get percentage points,
    as the paper does: `benefit_per_cost(78.24, 70.58, 170.4, 128)` = 5.75.
    """
    if steps_single <= 0 or steps_method <= 0:
        raise ValueError(f"steps must be > 0, got method {steps_method}, single {steps_single}")
    return (acc_method - acc_single) / (steps_method / steps_single)


def benefit_per_cost_if_costlier(
    acc_method: float, acc_single: float, steps_method: float, steps_single: float
) -> float | None:
    """BPC for a method that costs at least the baseline's steps; None for a cheaper one.

    BPC divides the accuracy difference by the cost ratio to charge a method for the passes
    it adds. For a method cheaper than the baseline the ratio is below 1 and the division
    magnifies the difference instead (a method at half the passes that loses 25 points would
    show -50), so there is no benefit per cost to report: compare accuracy and steps directly.
    """
    if steps_method < steps_single:
        return None
    return benefit_per_cost(acc_method, acc_single, steps_method, steps_single)
