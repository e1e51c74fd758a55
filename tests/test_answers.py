"""Answer extraction, normalisation, equivalence and the vote (lm_eval_dvoting.core.answers)."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lm_eval_dvoting.core import answers
from lm_eval_dvoting.core.answers import (
    ANSWER_KINDS,
    Vote,
    answers_equivalent,
    extract_answer,
    infer_answer_kind,
    vote,
)


def test_docstring_examples() -> None:
    result = doctest.testmod(answers)
    assert result.attempted > 0 and result.failed == 0


def test_import_is_light() -> None:
    # the strategies import this module in every worker: no torch, no lm_eval, no sympy
    code = (
        "import sys, lm_eval_dvoting.core.answers as a; a.vote(['1', '1.0'], 'number');"
        "print(sorted(m for m in ('torch', 'lm_eval', 'sympy', 'math_verify') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- number


@pytest.mark.parametrize(
    "text, expected",
    [
        ("So she has 18 left.", "18"),
        ("The answer is 18.0", "18"),
        ("The total is \\boxed{18.00}.", "18"),
        ("It is 0.50 of it", "0.5"),
        ("It is .5 of it", "0.5"),
        ("The answer is -3.", "-3"),
        ("The temperature drops to \\boxed{-3}", "-3"),
        ("She pays $1,000.", "1000"),
        ("\\boxed{1,234,567.50}", "1234567.5"),
        ("\\boxed{1{,}000}", "1000"),
        ("\\boxed{1,\\!000}", "1000"),
        ("The answer is $12.", "12"),
        ("\\boxed{\\$18.90}", "18.9"),
        ("The answer is 25%", "25"),
        ("\\boxed{25\\%}", "25"),
        ("\\boxed{18 \\text{ dollars}}", "18"),
        ("\\boxed{x = 5}", "5"),
        ("\\boxed{\\frac{3}{4}}", "0.75"),
        ("\\boxed{\\dfrac34}", "0.75"),
        ("The answer is 3/4", "0.75"),
        ("\\boxed{-\\frac{1}{2}}", "-0.5"),
        ("\\boxed{\\frac{1}{3}}", "1/3"),
        ("The answer is 2/6", "1/3"),
        ("\\boxed{2\\frac{1}{2}}", "2.5"),
        ("\\boxed{-0}", "0"),
        ("\\boxed{-0.0}", "0"),
        ("\\boxed{1000000}", "1000000"),
        ("\\boxed{12345678901234567890123456789012.50}", "12345678901234567890123456789012.5"),
        ("pages 10-20", "20"),  # a hyphen after a digit is not a sign
        ("10 - 3", "3"),
        ("Janet sells 16 - 3 - 4 = 9 eggs.\n#### 9", "9"),
        ("#### 1,600", "1600"),
        ("the result is \u22125", "-5"),  # Unicode minus
    ],
)
def test_number_normalisation(text: str, expected: str) -> None:
    assert extract_answer(text, "number") == expected


def test_number_equal_values_are_one_answer() -> None:
    spellings = ["\\boxed{18}", "The answer is 18.0", "so 18.00", "\\boxed{18.}", "#### 18"]
    assert {extract_answer(t, "number") for t in spellings} == {"18"}
    assert vote([extract_answer(t, "number") for t in spellings], "number").counts == [("18", 5)]


def test_number_sign_and_separators_matter() -> None:
    assert extract_answer("The answer is -3", "number") != extract_answer(
        "The answer is 3", "number"
    )
    assert extract_answer("it costs 1,000 dollars", "number") == "1000"
    # a comma not in thousands groups separates numbers
    assert extract_answer("the pairs 3,4", "number") == "4"


def test_number_precedence_boxed_then_phrase_then_last() -> None:
    assert extract_answer("The answer is 5. Double check: \\boxed{7}. Then 9.", "number") == "7"
    assert extract_answer("\\boxed{7} ... The answer is 5.", "number") == "7"
    assert extract_answer("The answer is 5 apples. Afterwards 9 remain.", "number") == "5"
    assert extract_answer("3 plus 4 is 7", "number") == "7"
    # the last of several phrases / boxes
    assert extract_answer("The answer is 5. No wait, the answer is 6.", "number") == "6"
    assert extract_answer("\\boxed{5} or rather \\boxed{6}", "number") == "6"
    # an empty box (the prompt's `\boxed{}` echoed) is not an answer
    assert extract_answer("put it in \\boxed{} so 42", "number") == "42"


def test_number_boxed_without_number_is_no_answer() -> None:
    # a box is the model's committed answer: no number there means no answer,
    # not some number from the reasoning
    assert extract_answer("It takes 3 steps, so \\boxed{x}", "number") is None
    assert extract_answer("", "number") is None
    assert extract_answer("no digits here", "number") is None


def test_truncated_box_is_no_answer() -> None:
    """Issue 38: a generation cut at the length limit leaves `\\boxed{1` open. That box
    is no answer, and no fallback reads one instead: not the digits inside it (the old
    reading of `so \\boxed{12`), not an earlier phrase or box (this test pinned `12`
    for the first text before: what the model was writing in its final box is unknown)."""
    for kind in ("number", "math", "choice"):
        assert extract_answer("The answer is 12. \\boxed{1", kind) is None
        assert extract_answer("so \\boxed{7} and then \\boxed{", kind) is None
        assert extract_answer("so \\boxed", kind) is None  # cut right after the command
    assert extract_answer("so \\boxed{12", "number") is None
    assert extract_answer("The answer is \\boxed{12", "number") is None
    assert extract_answer("The answer is (B) so \\boxed{B", "choice") is None
    # a closed box after an unclosed one is the final answer; empty echoes are skipped
    assert extract_answer("\\boxed{12 oops \\boxed{5}", "number") == "5"
    assert extract_answer("\\boxed{5} put it in \\boxed{}", "number") == "5"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("the answer is 5 + 3 = 8", "8"),
        ("The answer is 12.", "12"),
        ("the answer is 5", "5"),
        ("The answer is 3 * 4 = 12 + 6 = 18.", "18"),  # a chain: the last result
        ("The answer is 1,200 + 600 = 1,800.", "1800"),
        ("The answer is $1,800 - $200 = $1,600.", "1600"),
        ("The answer is \\$5 + \\$3 = \\$8.", "8"),
        ("The answer is 5 - 8 = -3.", "-3"),
        ("Answer: 5-8=-3", "-3"),
        ("#### 20 * 3 = 60", "60"),
        ("The final answer is 2 \\times 3 = 6 apples.", "6"),
        ("The answer is (4 + 1) x 2 = 10", "10"),
        ("The answer is 48 / 2 = 24", "24"),
        ("The answer is 1.5 + 2.5 = 4.0", "4"),
        ("The answer is 5 apples + 3 apples = 8 apples", "8"),
        ("The answer is 2 hours = 120 minutes.", "120"),  # the last stated value
        ("The answer is 24 = 4 * 6", "24"),  # the result written first
        # the clause ends at a sentence end or a `, `: later sums are reasoning
        ("The answer is 12, since 3 * 4 = 12.", "12"),
        ("The answer is 20, not 5 + 3 = 8", "20"),
        ("The answer is 8. Check: 8 - 3 = 5", "8"),
        # `5/0` has no value: the clause's next number, not the last number of the text
        ("The answer is 5/0 or 7. Then 9 more.", "7"),
        # not expressions: no operator and number right after the number
        ("The answer is 5 -- final.", "5"),
        ("The answer is **5**", "5"),
        ("The answer is 5 (3 + 2).", "5"),
    ],
)
def test_number_answer_phrase_reads_the_result(text: str, expected: str) -> None:
    """An answer phrase followed by arithmetic is read at its result (after the last
    `=`), not at its first operand; a plain number is read as it stands."""
    assert extract_answer(text, "number") == expected


@pytest.mark.parametrize(
    "text",
    [
        "the answer is 5 + 3",
        "The answer is 5 + 3.",
        "The answer is $12 - $4, I think",
        "The answer is 50% + 10%",
        "The answer is 10-20 minutes",
        # neither an operand nor the last number of the text is read instead
        "So 2 + 2 = 4 and the answer is 4 * 2",
        # the last phrase decides, as the last box does
        "The answer is 8. No wait, the answer is 5 + 3",
    ],
)
def test_number_answer_phrase_with_an_unwritten_result_is_no_answer(text: str) -> None:
    """An answer stated as an expression with no result is no answer (None), as a box
    without a number is: the model claimed a sum, not a value."""
    assert extract_answer(text, "number") is None


def test_number_unwritten_result_yields_to_a_box() -> None:
    # the box comes first (rule 1), whatever the phrase says
    assert extract_answer("the answer is 5 + 3, so \\boxed{8}", "number") == "8"


_OPERATIONS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "x": lambda a, b: a * b,
    "\\times": lambda a, b: a * b,
}
_PHRASES = ["The answer is", "the final answer is", "Answer:", "####", "So the answer is:"]
_ENDINGS = ["", ".", ". Done.", ", so 1 + 1 = 2.", "\nCheck: 9 - 1 = 8"]


@st.composite
def _spelled_int(draw, value: int) -> str:
    """`value` as a model may write it: `1800`, `1,800`, `$1,800`, `-$5`, `(-5)`."""
    digits = f"{abs(value):,}" if draw(st.booleans()) else str(abs(value))
    dollar = "$" if draw(st.booleans()) else ""
    if value >= 0:
        return dollar + digits
    return draw(
        st.sampled_from([f"-{dollar}{digits}", f"({dollar}-{digits})", f"(-{dollar}{digits})"])
    )


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    st.data(),
    st.integers(-(10**6), 10**6),
    st.integers(-(10**6), 10**6),
    st.sampled_from(sorted(_OPERATIONS)),
    st.sampled_from(_PHRASES),
    st.sampled_from(_ENDINGS),
    st.sampled_from(["", " "]),
)
def test_number_answer_phrase_property(data, a, b, op, phrase, ending, space) -> None:
    """For any `a op b = r` after an answer phrase, in any spelling of the numbers, with
    or without spaces and whatever follows the clause, the answer is r; the same
    expression with no `= r` is no answer."""
    r = _OPERATIONS[op](a, b)
    sa, sb, sr = (data.draw(_spelled_int(v)) for v in (a, b, r))
    if op in ("x", "\\times"):  # a letter or command operator needs its spaces
        space = " "
    expression = f"{sa}{space}{op}{space}{sb}"
    assert extract_answer(f"{phrase} {expression}{space}={space}{sr}{ending}", "number") == str(r)
    assert extract_answer(f"{phrase} {sr}{ending}", "number") == str(r)
    assert extract_answer(f"{phrase} {expression}{ending}", "number") is None


# --------------------------------------------------------------------------- math


def test_math_boxed_brace_balanced() -> None:
    assert extract_answer("so $\\boxed{\\frac{\\sqrt{3}}{2}}$.", "math") == "\\frac{\\sqrt{3}}{2}"
    assert extract_answer("\\boxed{a} then \\boxed{\\{1, 2\\}}", "math") == "\\{1, 2\\}"
    assert extract_answer("\\fbox{42}", "math") == "42"
    assert extract_answer("\\boxed 5$ done", "math") == "5"
    assert extract_answer("no box: 0.5", "math") is None
    # the stock minerva_math answer line, read only without a box
    minerva = "Final Answer: The final answer is $\\frac{1}{2}$. I hope it is correct."
    assert extract_answer(minerva, "math") == "\\frac{1}{2}"
    assert extract_answer(minerva + " \\boxed{3}", "math") == "3"
    assert extract_answer("\\boxed{}", "math") is None


def test_math_light_normalisation() -> None:
    assert (
        extract_answer("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "math")
        == "( 3, \\frac{\\pi}{2} )"
    )
    assert extract_answer("\\boxed{\\dfrac{1}{2}.}", "math") == "\\frac{1}{2}"
    assert extract_answer("\\boxed{ \\tfrac{1}{2} }", "math") == "\\frac{1}{2}"
    assert extract_answer("\\boxed{$x^2\\!+\\,1$}", "math") == "x^2+1"


@pytest.mark.parametrize(
    "a, b",
    [
        ("\\frac{1}{2}", "0.5"),
        ("\\frac{1}{2}", "\\dfrac12"),
        ("0.5", "\\dfrac12"),
        ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}"),
        ("2x+1", "1+2x"),
        ("x = 5", "5"),
    ],
)
def test_math_equivalent(a: str, b: str) -> None:
    assert answers_equivalent(a, b, "math")


@pytest.mark.parametrize(
    "a, b", [("\\frac{1}{2}", "\\frac{1}{3}"), ("2x+1", "2x-1"), ("\\pi", "3")]
)
def test_math_not_equivalent(a: str, b: str) -> None:
    assert not answers_equivalent(a, b, "math")


def test_equivalence_never_raises() -> None:
    for junk in ["\\frac{", "}}}{{", "\\unknowncommand{x}", "", "a" * 2000]:
        assert answers_equivalent("1", junk, "math") in (True, False)
    assert not answers_equivalent(None, "1", "number")
    assert not answers_equivalent("1", None, "math")
    assert answers_equivalent("7", "7", "number") and not answers_equivalent("7", "7.0", "number")


# --------------------------------------------------------------------------- choice


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\\boxed{B}", "B"),
        ("so $\\boxed{\\text{C}}$", "C"),
        ("\\boxed{(D)}", "D"),
        ("\\boxed{\\textbf{(A)}}", "A"),
        ("\\boxed{B) 42 meters}", "B"),
        ("Answer: B", "B"),
        ("**Answer:** (C)", "C"),
        ("Answer: $D$", "D"),
        ("the answer is A.", "A"),
        ("The answer is (C)", "C"),
        ("The correct answer is B", "B"),
        ("The best answer is D", "D"),  # stock arc_challenge_chat wording
        ("I pick (B) over (A) ... finally (C)", "C"),
        ("Option J fits: \\boxed{J}", "J"),
        (" C", "C"),  # arc_challenge_chat: its prompt ends "The best answer is"
        ("B.", "B"),
        ("**D**", "D"),
        ("The answer is Alice", None),  # a word, not a letter
        ("A", "A"),
        ("A cat", None),
        ("Answer: a lowercase", None),
        ("\\boxed{K}", None),  # beyond A-J
        ("no answer", None),
    ],
)
def test_choice_patterns(text: str, expected: str | None) -> None:
    assert extract_answer(text, "choice") == expected


def test_choice_precedence() -> None:
    # boxed > "Answer:" > "answer is" > "(X)", last occurrence within each
    assert extract_answer("Answer: A. So \\boxed{B}. The answer is (C)", "choice") == "B"
    assert extract_answer("the answer is C ... Answer: A", "choice") == "A"
    assert extract_answer("(D) then the answer is B", "choice") == "B"
    assert extract_answer("Answer: A ... Answer: C", "choice") == "C"
    # a box that holds no letter (the option's text) leaves the letter to later rules
    assert extract_answer("The answer is (B): \\boxed{42}", "choice") == "B"


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="number"):
        extract_answer("1", "letter")
    assert ANSWER_KINDS == ("number", "math", "choice")


# --------------------------------------------------------------------------- vote


def test_vote_majority_and_winner_index() -> None:
    result = vote(["7", "18", "18", None, "7", "18"], "number")
    assert result == Vote(winner="18", counts=[("18", 3), ("7", 2)], winner_index=1)


def test_vote_tie_goes_to_first_seen() -> None:
    assert vote(["7", "18", "18", "7"], "number").winner == "7"
    assert vote(["B", "A", "A", "B", "C"], "choice").counts == [("B", 2), ("A", 2), ("C", 1)]


def test_vote_none_casts_no_vote() -> None:
    result = vote([None, None, "3"], "number")
    assert result.winner == "3" and result.winner_index == 2 and result.counts == [("3", 1)]
    assert vote([None, None], "number") == Vote(winner=None, counts=[], winner_index=None)
    assert vote([], "choice").winner is None


def test_vote_groups_math_by_equivalence() -> None:
    samples = ["\\frac{1}{3}", "0.5", "\\frac{1}{3}", "\\dfrac12", "\\frac{1}{2}"]
    result = vote(samples, "math")
    # the first-seen spelling represents its group
    assert result.counts == [("0.5", 3), ("\\frac{1}{3}", 2)]
    assert result.winner == "0.5" and result.winner_index == 1


def test_vote_number_spellings_one_vote() -> None:
    texts = ["\\boxed{18}", "The answer is 18.0", "\\boxed{-18}", "so 18.00", "\\boxed{1,8}"]
    result = vote([extract_answer(t, "number") for t in texts], "number")
    assert result.winner == "18" and result.counts[0] == ("18", 3)


# --------------------------------------------------------------------------- kinds


@pytest.mark.parametrize(
    "task, kind",
    [
        ("gsm8k", "number"),
        ("gsm8k_cot_zeroshot", "number"),
        ("gsm8k-cot-self-consistency", "number"),
        ("minerva_math500", "math"),
        ("hendrycks_math500", "math"),
        ("minerva_math_algebra", "math"),
        ("gpqa_diamond_cot_zeroshot", "choice"),
        ("arc_challenge_chat", "choice"),
        ("mmlu_college_mathematics", "choice"),  # multiple choice wins over "math"
        ("mmlu_flan_cot_zeroshot_anatomy", "choice"),
        ("search_and_research", "number"),  # `arc` only as a token prefix
        (None, "number"),
    ],
)
def test_infer_answer_kind_from_name(task: str | None, kind: str) -> None:
    assert infer_answer_kind(task) == kind


def test_infer_answer_kind_declared() -> None:
    assert infer_answer_kind("gsm8k", "math") == "math"
    assert infer_answer_kind(None, "choice") == "choice"
    with pytest.raises(ValueError, match="number, math, choice"):
        infer_answer_kind("gsm8k", "letters")


# --------------------------------------------------------------------------- real data


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def test_gsm8k_references(data_dir: Path) -> None:
    docs = _jsonl(data_dir / "gsm8k" / "test.jsonl")
    assert len(docs) == 1319
    for doc in docs:
        raw = doc["answer"].split("#### ")[-1].strip()
        expected = raw.replace(",", "")
        # the whole worked solution and the bare reference read the same
        assert extract_answer(doc["answer"], "number") == expected
        assert extract_answer(f"\\boxed{{{raw}}}", "number") == expected
        assert extract_answer(f"The answer is {raw}.", "number") == expected


def test_math500_references(data_dir: Path) -> None:
    docs = _jsonl(data_dir / "math500" / "test.jsonl")
    assert len(docs) == 500
    for doc in docs:
        from_solution = extract_answer(doc["solution"], "math")
        assert answers_equivalent(doc["answer"], from_solution, "math"), doc["unique_id"]
        # a model's `\dfrac` spelling of the same answer
        assert answers_equivalent(doc["answer"], doc["answer"].replace("\\frac", "\\dfrac"), "math")
