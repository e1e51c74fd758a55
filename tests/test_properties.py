"""Property tests (hypothesis): answer normalisation and equivalence, the vote and its
tie-break, the early stop, and batch/order invariance over random request mixes.

Every property runs under `derandomize=True` and without an example database, so each
run draws the same examples: the suite stays deterministic and leaves no files. The
model-driven properties use few examples on the shipped demo model (tiny-arith).
"""

from __future__ import annotations

import functools
from collections import Counter
from fractions import Fraction
from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lm_eval.api.instance import Instance
from scripted import ScriptedAnswers, ScriptedModel, gen_choices

from lm_eval_dvoting.core.answers import answers_equivalent, extract_answer, tally, vote
from lm_eval_dvoting.core.metrics import consistency_level
from lm_eval_dvoting.core.strategies import run_strategy, should_stop_early
from lm_eval_dvoting.integration.harness import LLaDAEvalModel

# pure functions: many examples, still well under a second each
PURE = settings(max_examples=150, deadline=None, derandomize=True, database=None)
# math-verify (sympy) costs milliseconds per comparison
SYMPY = settings(max_examples=25, deadline=None, derandomize=True, database=None)
# a model in the loop: few examples
MODEL = settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

integers = st.integers(min_value=-(10**12), max_value=10**12)
fractions = st.builds(Fraction, st.integers(-(10**6), 10**6), st.integers(1, 2000))


def _number(text: str) -> str | None:
    return extract_answer(text, "number")


def _terminates(value: Fraction) -> bool:
    den = value.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    return den == 1


# ------------------------------------------------------------- number normalisation


@PURE
@given(integers)
def test_spellings_of_an_integer_are_one_answer(n):
    """`18`, `18.0`, `18.00`, `1,800`-style separators, a `$`, a box or an answer phrase:
    one canonical string, the integer's own."""
    canonical = str(n)
    sign = "-" if n < 0 else ""
    spellings = [str(n), f"{n}.0", f"{n}.00", f"{n:,}", f"{n:,}.0", f"{sign}${abs(n):,}", f"{n}\\%"]
    for spelled in spellings:
        assert _number(f"The answer is {spelled}.") == canonical, spelled
        assert _number(f"so we get \\boxed{{{spelled}}}") == canonical, spelled
        assert _number(f"#### {spelled}") == canonical, spelled
    # the phrase and the box win over numbers elsewhere in the reasoning
    assert _number(f"7 + 11 = 18. The answer is {n:,}") == canonical


@PURE
@given(fractions)
def test_spellings_of_a_fraction_are_one_answer(value):
    """`\\frac{p}{q}`, `\\dfrac{p}{q}`, `p/q` and (when it terminates) the decimal: one
    canonical string, which reads back as the same value."""
    p, q = abs(value.numerator), value.denominator
    sign = "-" if value < 0 else ""
    spellings = [
        f"{sign}\\frac{{{p}}}{{{q}}}",
        f"{sign}\\dfrac{{{p}}}{{{q}}}",
        f"{sign}{p}/{q}",
        f"{sign}{p * 3}/{q * 3}",
    ]  # unreduced
    canonical = {_number(f"\\boxed{{{s}}}") for s in spellings}
    assert len(canonical) == 1, canonical
    (answer,) = canonical
    assert Fraction(answer) == value
    if _terminates(value):
        assert "/" not in answer  # a terminating value is a decimal ...
        assert _number(f"The answer is {answer}") == answer  # ... that is its own canonical form
    else:
        assert answer == f"{value.numerator}/{value.denominator}"  # reduced p/q


@PURE
@given(fractions, fractions)
def test_different_values_are_different_answers(a, b):
    """Normalisation never merges two values: canonical strings are equal iff values are."""
    ca, cb = (
        _number(f"\\boxed{{{a.numerator}/{a.denominator}}}"),
        _number(f"\\boxed{{{b.numerator}/{b.denominator}}}"),
    )
    assert (ca == cb) == (a == b)
    assert answers_equivalent(ca, cb, "number") == (a == b)
    assert answers_equivalent(ca, cb, "number") == answers_equivalent(cb, ca, "number")


# ------------------------------------------------------------------ math equivalence


@SYMPY
@given(st.integers(0, 999), st.sampled_from([1, 2, 4, 5, 8, 10, 16, 20, 25, 40, 50, 100]))
def test_math_fraction_equals_its_decimal(p, q):
    """`\\frac{p}{q}` = its decimal = `\\dfrac{p}{q}` for math answers, and the vote groups them."""
    value = Fraction(p, q)
    decimal = _number(str(value.numerator / value.denominator if q > 1 else p))
    assert decimal is not None and Fraction(decimal) == value
    frac = extract_answer(f"Thus $\\boxed{{\\dfrac{{{p}}}{{{q}}}}}$.", "math")
    assert frac == f"\\frac{{{p}}}{{{q}}}"
    assert answers_equivalent(frac, decimal, "math")
    assert answers_equivalent(decimal, frac, "math")
    result = vote([frac, "x+1", decimal], "math")
    assert result.counts[0][1] == 2 and result.winner == frac and result.winner_index == 0


@SYMPY
@given(st.integers(0, 99), st.integers(1, 20), st.integers(0, 99), st.integers(1, 20))
def test_math_different_values_are_not_equivalent(p, q, r, s):
    a, b = f"\\frac{{{p}}}{{{q}}}", f"\\frac{{{r}}}{{{s}}}"
    assert answers_equivalent(a, b, "math") == (Fraction(p, q) == Fraction(r, s))


# ------------------------------------------------------------ the vote and tie-break

answer_lists = st.lists(st.one_of(st.none(), st.sampled_from(["a", "b", "c", "d"])), max_size=9)


def _reference_vote(
    answers: list[Any], key=lambda a: a
) -> tuple[Any, int | None, list[tuple[Any, int]]]:
    """docs/ALGORITHM.md: the most frequent answer wins, ties go to the answer seen first; None
    casts no vote. Groups are named by their first-seen spelling."""
    first: dict[Any, int] = {}
    spelling: dict[Any, Any] = {}
    counts: Counter = Counter()
    for i, answer in enumerate(answers):
        if answer is None:
            continue
        first.setdefault(key(answer), i)
        spelling.setdefault(key(answer), answer)
        counts[key(answer)] += 1
    if not counts:
        return None, None, []
    order = sorted(counts, key=lambda k: (-counts[k], first[k]))
    return spelling[order[0]], first[order[0]], [(spelling[k], counts[k]) for k in order]


@PURE
@given(answer_lists)
def test_vote_tie_goes_to_the_answer_seen_first(answers):
    winner, index, counts = _reference_vote(answers)
    result = tally(answers)
    assert (result.winner, result.winner_index, result.counts) == (winner, index, counts)
    assert vote(answers, "choice") == result
    if answers:
        top = counts[0][1] if counts else 0
        assert consistency_level(answers) == top / len(answers)


@PURE
@given(st.lists(st.one_of(st.none(), st.sampled_from(["a", "A", "b", "B", "c"])), max_size=9))
def test_vote_groups_by_same_answer_first_spelling_represents(answers):
    """With a grouping rule, each answer joins the first group it is the same as; the
    group is named by its first-seen spelling and the tie-break is unchanged."""
    same = lambda x, y: x.lower() == y.lower()  # noqa: E731
    winner, index, counts = _reference_vote(answers, key=str.lower)
    result = tally(answers, same)
    assert (result.winner, result.winner_index, result.counts) == (winner, index, counts)


@PURE
@given(st.integers(3, 9), st.data())
def test_early_stop_follows_the_algorithm(n, data):
    """Checked before samples 3..n (so on 2..n-1 answers): stop when the top answer has a
    strict majority of n, or when every valid answer agrees and has at least floor(n/2) votes."""
    answers = data.draw(
        st.lists(st.one_of(st.none(), st.sampled_from("xyz")), min_size=2, max_size=n - 1)
    )
    counts = Counter(a for a in answers if a is not None)
    top, valid = max(counts.values(), default=0), sum(counts.values())
    expected = bool(counts) and (top > n // 2 or (top == valid and top >= n // 2))
    assert should_stop_early(answers, n) == expected


# dVoting through the strategy driver, with scripted answers: what is drawn, voted, chosen

PROMPT_LENGTH = 3


def _region(q: int, g: int):
    return (q,) if g == 0 else ((20, 21) if g % 3 == 0 else (1 + g % 15,))


@functools.lru_cache(maxsize=1)
def _scripted() -> ScriptedModel:
    return ScriptedModel(gen_choices(PROMPT_LENGTH, _region))


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    st.sampled_from(["majority", "dvoting"]),
    st.lists(st.one_of(st.none(), st.sampled_from(["7", "8", "9"])), min_size=5, max_size=5),
)
def test_strategy_draws_votes_and_returns_as_the_algorithm_says(strategy, script):
    answers = ScriptedAnswers({13: script})
    (result,) = run_strategy(
        _scripted(),
        torch.tensor([[13, 5, 6]]),
        strategy=strategy,
        extract=answers,
        gen_length=16,
        block_length=4,
        n=5,
        seed=4,
    )
    drawn = 5
    if strategy == "dvoting":
        # the early stop is checked before samples 3, 4, 5
        drawn = next((i - 1 for i in (3, 4, 5) if should_stop_early(script[: i - 1], 5)), 5)
    assert result.answers == script[:drawn]
    winner, index, counts = _reference_vote(script[:drawn])
    assert result.votes == counts
    assert result.chosen == (0 if index is None else index)


# ------------------------------------------------- batch and order invariance (model)

QUESTIONS = ["3+4-2=?", "9-6+4-2+1=?", "5+2-4+6=?", "8-5+1=?"]
TASKS = ["dvoting_arith", "probe_math_arith"]  # the second: answer kind from the name (math)


@functools.lru_cache(maxsize=None)
def _lm(strategy: str, batch_rows: int) -> LLaDAEvalModel:
    return LLaDAEvalModel(
        pretrained="tiny-arith", strategy=strategy, batch_size=batch_rows, device="cpu"
    )


def _instance(question: int, length: int, task: int, doc_id: int) -> Instance:
    gen_kwargs = {"until": [], "max_gen_toks": length}
    context = (
        "Please answer the question step by step and put the answer in \\boxed{}. "
        f"{QUESTIONS[question]}"
    )
    return Instance(
        "generate_until", {}, (context, gen_kwargs), idx=0, metadata=(TASKS[task], doc_id, 1)
    )


def _outcome(text: Any) -> tuple:
    return str(text), text.nfe, text.n_samples, text.trace["chosen"], tuple(text.votes.items())


@functools.lru_cache(maxsize=None)
def _alone(strategy: str, key: tuple[int, int, int, int]) -> tuple:
    (text,) = _lm(strategy, 1).generate_until([_instance(*key)], disable_tqdm=True)
    return _outcome(text)


request_keys = st.tuples(
    st.integers(0, len(QUESTIONS) - 1),
    st.sampled_from([16, 32]),
    st.integers(0, len(TASKS) - 1),
    st.integers(0, 3),
)


@MODEL
@given(
    st.sampled_from(["dvoting", "majority"]),
    st.lists(request_keys, min_size=2, max_size=5),
    st.integers(1, 8),
    st.data(),
)
def test_batch_and_order_invariance_over_random_request_mixes(strategy, keys, batch_rows, data):
    """Any mix of questions, lengths, tasks and documents, in any order, at any batch size:
    each request's text, cost and vote equal those it gets decoded alone."""
    order = data.draw(st.permutations(range(len(keys))))
    requests = [_instance(*keys[i]) for i in order]
    texts = _lm(strategy, batch_rows).generate_until(requests, disable_tqdm=True)
    for i, text in zip(order, texts):
        assert _outcome(text) == _alone(strategy, keys[i])


def test_request_mixes_are_not_vacuous():
    """The invariance above compares real samples: seeds, tasks and lengths change them."""
    outcomes = {_alone("dvoting", (1, 32, 0, d)) for d in range(3)}
    assert len(outcomes) > 1  # documents with the same context draw different samples
    assert _alone("dvoting", (1, 32, 0, 0)) != _alone("dvoting", (1, 32, 1, 0))  # another task
    assert _alone("dvoting", (1, 16, 0, 0)) != _alone("dvoting", (1, 32, 0, 0))  # another length
