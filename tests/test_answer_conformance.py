"""Issue 38: every conformance row reads as a careful grader reads it, and the vote, the
task configs' scoring and docs/ANSWER_READING.md agree with that reading.

The table is data (tests/fixtures/answer_conformance.py); tools/answer_reading.py runs
lm-eval's own GSM8K filters over its number rows for the doc.
"""

from __future__ import annotations

import collections
import doctest
import importlib.util
import time
from pathlib import Path
from typing import Any

import pytest

from lm_eval_dvoting.core import latex_value as latex_value_module
from lm_eval_dvoting.core.answers import answers_equivalent, extract_answer, vote
from lm_eval_dvoting.core.latex_value import latex_value

ROOT = Path(__file__).resolve().parents[1]


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TABLE = _load(ROOT / "tests" / "fixtures" / "answer_conformance.py", "answer_conformance")
CASES = TABLE.CASES


def _id(case: Any) -> str:
    return f"{case.kind}:{case.group}:{case.text[:40]!r}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_reads_as_a_grader_reads(case: Any) -> None:
    """`extract_answer` gives the grader's reading: the same canonical string for number
    and choice rows, an answer math-verify finds equivalent to the reference for math
    rows (the dvoting_math500 scoring path), None where the grader reads none."""
    got = extract_answer(case.text, case.kind, case.n_options)
    if case.kind == "math" and case.grader is not None:
        assert answers_equivalent(case.grader, got, "math"), (case.text, got)
    else:
        assert got == case.grader, case.text


# The issue's table, row for row: (input, kind, what the plugin read before, grader).
ISSUE_ROWS = [
    (r"\boxed{18 \text{ m}^2}", "number", "2", "18"),
    (r"\boxed{8\text{ ft}^3}", "number", "3", "8"),
    (r"\boxed{2^{10}}", "number", "10", "1024"),
    (r"\boxed{3.5 \times 10^3}", "number", "3", "3500"),
    (r"\boxed{3 \frac{1}{2}}", "number", "0.5", "3.5"),
    (r"\boxed{ - 3}", "number", "3", "-3"),
    (r"\boxed{5 + 3}", "number", "3", "8"),
    (r"so \boxed{12", "number", "12", None),
    (r"The answer is \boxed{12", "number", "12", None),
    ("Answer: I think it's B", "choice", "I", "B"),
    ("The correct choice is D. I hope it is correct.", "choice", None, "D"),
]


def test_table_covers_the_issue_and_the_forms_it_names() -> None:
    """At least 150 rows; every row of the issue's table is in it with the grader's
    reading; every form the issue names has its group; each benchmark family appears."""
    assert len(CASES) >= 150
    rows = {(c.text, c.kind): c.grader for c in CASES}
    for text, kind, _, grader in ISSUE_ROWS:
        assert rows[(text, kind)] == grader, text
    assert rows[("A good answer is C", "choice")] == "C"
    groups = {c.group for c in CASES}
    for form in (
        "money",
        "percent",
        "units and exponents",
        "thousands separators",
        "signs",
        "fractions and decimals",
        "mixed numbers",
        "I hope it is correct",
        "repeated boxes",
        "truncated",
        "#### line",
        "bold markdown",
    ):
        assert form in groups, form
    kinds = collections.Counter(c.kind for c in CASES)
    assert kinds["number"] >= 100 and kinds["math"] >= 20 and kinds["choice"] >= 30
    assert len({c.text for c in CASES if c.kind == "number"}) == kinds["number"]  # no repeats


@pytest.mark.parametrize("text, kind, before, grader", ISSUE_ROWS, ids=[r[0] for r in ISSUE_ROWS])
def test_issue_rows(text: str, kind: str, before: str | None, grader: str | None) -> None:
    got = extract_answer(text, kind)
    assert got == grader and got != before


def test_vote_groups_what_the_grader_reads_as_one_answer() -> None:
    """Samples that state one value in different spellings are one vote, and a
    truncated box casts none (it used to vote for the digits inside it)."""
    texts = [
        r"\boxed{18 \text{ m}^2}",
        "The area is 18 m^2.",
        "#### 18",
        r"\boxed{18",
        r"\boxed{2^{1}}",
    ]
    result = vote([extract_answer(t, "number") for t in texts], "number")
    assert result.counts == [("18", 3), ("2", 1)]
    letters = ["Answer: I think it's B", "The correct choice is B.", "Answer: I believe it is C."]
    result = vote([extract_answer(t, "choice") for t in letters], "choice")
    assert result.counts == [("B", 2), ("C", 1)]


def test_the_option_range_never_changes_which_letter_is_read() -> None:
    """With the range (the task configs' scoring) a letter beyond it is no answer; without
    it (the vote, which does not see the question) the same letter is read. So for every
    row and every range, and every reference letter in that range, both score the text
    the same: what is voted is what is scored."""
    for case in (c for c in CASES if c.kind == "choice"):
        free = extract_answer(case.text, "choice")
        for n_options in range(1, 11):
            ranged = extract_answer(case.text, "choice", n_options)
            assert ranged in (free, None)
            assert ranged == (
                free if free is not None and "ABCDEFGHIJ".index(free) < n_options else None
            )
            for gold in "ABCDEFGHIJ"[:n_options]:
                assert (ranged == gold) == (free == gold)


def test_the_choice_filter_passes_each_question_s_range() -> None:
    """task_configs/utils.py's choice filter reads a letter beyond the question's options
    as `[invalid]`, per document (ARC mixes 3-, 4- and 5-option questions)."""
    utils = _load(ROOT / "task_configs" / "utils.py", "dvoting_task_utils_conformance")
    docs = [
        {"choices": ["a", "b", "c", "d"]},
        {"choices": ["a", "b", "c", "d", "e"]},
        {"choices": ["a", "b", "c"]},
    ]
    responses = [["Answer: E"], ["Answer: E"], [r"\boxed{C}", r"\boxed{D}"]]
    assert utils.extract_choice(responses, docs) == [["[invalid]"], ["E"], ["C", "[invalid]"]]
    with pytest.raises(ValueError):  # a response list without its document is a bug
        utils.extract_choice(responses, docs[:2])


def test_latex_value_docstring_examples() -> None:
    result = doctest.testmod(latex_value_module)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("n_options", [0, 11, -1, True, 2.0, "4"])
def test_a_bad_option_range_is_refused(n_options: Any) -> None:
    with pytest.raises(ValueError, match=r"n_options=.*1 to 10"):
        extract_answer("Answer: B", "choice", n_options)


def test_the_option_range_is_for_choice_answers_only() -> None:
    with pytest.raises(ValueError, match="applies to kind 'choice' only"):
        extract_answer("#### 4", "number", 4)
    assert extract_answer("#### 4", "number", None) == "4"


@pytest.mark.parametrize(
    "content", [r"9^{9^{9}}", r"10^{100000}", r"2^{10^{6}}", r"(10^{3000})^{5}"]
)
def test_a_huge_power_is_refused_at_once(content: str) -> None:
    """A power whose value would exceed 10,000 bits is no answer, and is refused before it
    is computed: no input can make the reading slow (there is no time limit to rely on)."""
    # CPU time of this process (other jobs on a shared machine do not count): the readings
    # take ~0.1 s at most; a quadratic or unbounded one takes seconds or never ends
    start = time.process_time()
    assert latex_value(content) is None
    assert extract_answer(rf"\boxed{{{content}}}", "number") is None
    assert time.process_time() - start < 1.0


@pytest.mark.parametrize(
    "content",
    [
        "(" * 2000 + "1" + ")" * 2000,
        "-" * 5000 + "1",
        "\\text{" * 5000 + "18" + "}" * 5000,
        "\\frac{" * 500 + "1}{2}" + "{2}" * 499,
    ],
)
def test_a_runaway_box_is_refused_at_once(content: str) -> None:
    """Brackets, signs, fractions and text groups nested beyond 32 levels refuse the box:
    a runaway generation neither exhausts the stack (RecursionError) nor takes quadratic
    time; 32 levels still read."""
    # CPU time of this process (other jobs on a shared machine do not count): the readings
    # take ~0.1 s at most; a quadratic or unbounded one takes seconds or never ends
    start = time.process_time()
    assert latex_value(content) is None
    assert extract_answer(rf"\boxed{{{content}}}", "number") is None
    assert time.process_time() - start < 1.0
    assert latex_value("(" * 31 + "7" + ")" * 31) == 7


def test_powers_within_the_bound_are_exact() -> None:
    # the bound is the base's bit length times the exponent: 2 (`10` in binary) x 4999
    assert latex_value(r"2^{4999}") == 2**4999
    assert latex_value(r"2^{5001}") is None
    assert extract_answer(r"\boxed{10^{-3}}", "number") == "0.001"
    assert extract_answer(r"\boxed{0^{-1}}", "number") is None
    assert extract_answer(r"\boxed{4^{1/2}}", "number") is None  # not a whole exponent


@pytest.mark.parametrize(
    "content",
    [
        "2(3)",  # juxtaposition other than a mixed number
        r"2\frac{3}{2}",  # an improper fraction after a whole number is no mixed number
        "5k",
        "2n + 1",  # a single letter other than m g s h l L is a variable
        "5 + apples",  # a word that follows no operand
        r"\pi",
        r"\pm 3",
        "4:30",
        "3 < 4",
        r"\{1, 2\}",
        "1,8",
        "3, 4",
        "3 times 4",
    ],
)
def test_a_box_that_states_no_single_value_is_no_answer(content: str) -> None:
    assert latex_value(content) is None
    assert extract_answer(rf"So 7 is close: \boxed{{{content}}}", "number") is None


def test_the_doc_comparison_is_up_to_date() -> None:
    """docs/ANSWER_READING.md's generated section is what tools/answer_reading.py computes
    now from lm-eval's installed GSM8K filters (regenerate with `--write`)."""
    tool = _load(ROOT / "tools" / "answer_reading.py", "answer_reading")
    assert tool.check() == []
    records = tool.compare()
    assert len(records) == sum(c.kind == "number" for c in CASES)
    assert all(r["ours_agrees"] for r in records)
    # lm-eval's flexible-extract reads the unit's exponent: the issue's first row
    first = next(r for r in records if r["text"] == r"\boxed{18 \text{ m}^2}")
    assert first["flexible-extract"] == ("2", False)
