"""Answer extraction, normalisation, equivalence and the vote.

One module decides what "the answer" of a generated text is, for two readers that
must agree: the voting strategies (which sample's answer won?) and this project's
task configs (is the voted answer right?). Because both call the same functions,
what is voted is exactly what is scored.

Principles: a text's answer is what a careful human grader reads in it.

* **A box states a value.** ``\\boxed{...}`` is the model's delimited final answer,
  so its content is read as a whole value, not searched for its last digits: units
  and ``\\text{...}`` are removed with their exponents (``\\boxed{18 \\text{ m}^2}``
  is 18, not 2), LaTeX arithmetic is evaluated exactly (``2^{10}`` is 1024,
  ``3.5 \\times 10^3`` 3500, the mixed number ``3 \\frac{1}{2}`` 3.5, ``5 + 3`` 8,
  ``- 3`` -3; `latex_value.latex_value`, which says why it is not sympy).
* **A truncated box is no answer.** A generation cut at the length limit inside its
  final box (``so \\boxed{12``, even ``\\boxed`` alone at the end) has no answer, for
  every kind; nothing inside that box, and no earlier box, phrase or number, is
  read instead: what the model was writing is unknown.
* **A choice letter is a standalone option letter** of the question's range, never
  the pronoun "I" or the article "A" inside a sentence ("A good answer is C" reads
  C, "Answer: I think it's B" reads B).
* **When in doubt, no answer rather than a guess**: a box that states no single
  number, a number glued to what makes it none (``2,5``, ``3:30``, ``1e3``,
  ``0.333...``; in rule 3's running text a comma still separates a list, ``3,4``),
  two letters named (``the answer is A and C``), an answer phrase retracted after it
  (``The answer is B. Wait, no, it is C.``: what replaced it is not read either),
  an answer stated as an unevaluated sum in prose, a negated or ambiguous
  answer clause read as None, which no grader credits, rather than as some number
  or letter the model did not commit to.

tests/test_answer_conformance.py holds these readings on 150+ realistic endings;
docs/ANSWER_READING.md compares them with lm-eval's own GSM8K filters.

Three *kinds* of answers exist (`ANSWER_KINDS`):

``"number"`` (GSM8K and other arithmetic word problems)
    Where the answer is looked for, in order of preference:

    1. the last non-empty ``\\boxed{...}`` (or ``\\fbox{...}``), matched with balanced
       braces so ``\\boxed{\\frac{3}{4}}`` is read whole, and read as the one value it
       states (`latex_value.latex_value`: ``=`` then the part after the last one,
       ``x = 5`` is 5; units, ``$``, ``\\%`` and ``^\\circ`` dropped; exact
       arithmetic). A boxed answer is *authoritative*: if it states no single number
       (``\\boxed{x}``, ``\\boxed{5 \\text{ or } 6}``, ``\\boxed{1,8}``), the text has
       no answer (``None``) rather than falling back to some other number in the
       reasoning, which would be a guess the model did not make. If the last
       non-empty box never closes, the text has no answer (see the principles);
    2. the last "answer is X" / "answer: X" phrase (case-insensitive; covers "The
       answer is", "The final answer is", "Answer:") or GSM8K's ``#### X`` line
       whose clause holds a number. The clause is the text after the phrase up to
       the end of its line or sentence (``.``, ``,``, ``;``, ``!``, ``?`` followed
       by a space or the end; a ``.`` or ``,`` inside a number does not end it). It
       is read by `_clause_answer`: a written result wins, so "the answer is
       5 + 3 = 8" is ``8``, "The answer is $1,800 - $200 = $1,600." is ``1600``;
       otherwise its first number, as in "The answer is 12 apples." (``12``). An
       expression with no result written, "the answer is 5 + 3" (also ``10-20``),
       is *no answer* (``None``), and earlier phrases and rule 3 are not consulted:
       a GSM8K reference is one number, the model stated a sum in prose instead,
       and neither operand (``5`` as a strict "answer is" regex reads it, ``3`` as a
       last-number grader does) is what it claimed. (A box differs: it is a
       delimited expression whose value the model presents as its answer, so
       ``\\boxed{5 + 3}`` is 8; a prose clause may still be going on);
    3. the last number anywhere in the text, unless the text ends in ``=`` or an
       operator after an operand (``so 9 * 2 =``): a generation cut mid-calculation,
       whose last number is an operand, is no answer.

    In rules 2 and 3 the text is read as numbers the way a grader reads them:
    ``3.5 \\times 10^3`` and ``2^{10}`` are one number each (3500, 1024), a unit's
    exponent is no number (``18 m^2``, ``18 \\text{ m}^2`` hold only 18), a whole
    number before a proper fraction is a mixed number (``3 1/2``,
    ``3 \\frac{1}{2}``: 3.5).

    The number is then normalised to a canonical string so that equal values are
    one vote: ``$``, ``%``, units and LaTeX spacing are ignored (GSM8K states
    percentages and money as bare numbers: "50%" is the answer ``50``); a number
    and a scale word is their exact product (``1.5 million`` is 1500000; thousand,
    million, billion, short scale; not inside a box); commas are
    thousands separators only in the ``1,000`` pattern (``"1,000" -> "1000"``);
    the sign is kept (``-3`` is not ``3``, ``-$3`` is ``-3``; a hyphen directly after a digit or
    letter, as in ``10-20``, is a range/subtraction, not a sign); values are exact
    rationals, so ``18``, ``18.0``, ``18.00`` all become ``"18"``, ``0.50`` and
    ``.5`` become ``"0.5"``, and fractions (``3/4``, ``\\frac{3}{4}``,
    ``\\dfrac34``) become a decimal when that decimal terminates (``"0.75"``) and a
    reduced ``"p/q"`` otherwise (``"1/3"``). ``-0`` is ``"0"``.

``"math"`` (MATH500 and other free-form LaTeX answers)
    The content of the last non-empty brace-balanced ``\\boxed{...}`` or
    ``\\fbox{...}`` (also the brace-less ``\\boxed 5``), lightly normalised and
    kept as a LaTeX string: surrounding whitespace and ``$``, a trailing ``.``,
    ``\\left`` / ``\\right``, LaTeX spacing commands (``\\!``, ``\\,``, ``\\;``,
    ``\\:``), ``\\displaystyle`` are removed, ``\\dfrac`` / ``\\tfrac`` become
    ``\\frac``, runs of whitespace become one space. Without a box, the last
    "answer is $X$" is read instead (the stock ``minerva_math`` tasks ask for
    "The final answer is $X$"); neither, or a truncated final box: ``None``.
    Equivalence (``\\frac{1}{2}`` = ``0.5`` = ``\\dfrac12``, and units, powers and
    mixed numbers as for numbers: ``18 \\text{ m}^2`` = ``18``) is decided later by
    `answers_equivalent` with math-verify, not by rewriting the string.

``"choice"`` (multiple choice: ARC, MMLU, GPQA)
    A single capital letter ``"A"``..``"J"``. A truncated final box is no answer;
    otherwise the letter is looked for in this order, taking the last occurrence of
    each rule before trying the next:

    1. a boxed letter: ``\\boxed{B}``, ``\\boxed{\\text{B}}``, ``\\boxed{(B)}``,
       ``\\boxed{B) text}`` (a box whose content is not a letter, e.g. the option
       text, is skipped: the later rules may still find the letter);
    2. an answer line: ``Answer: B`` / ``**Answer:** (B)`` / ``Answer: I think it's B``;
    3. an "is" phrase: ``the answer is B``, ``The correct answer is (B)``,
       ``The best answer is B`` (the wording of the stock ``arc_challenge_chat``),
       ``The correct choice is D``, ``the best option would be C``, ``I choose B``
       (answer lines also ``Correct option: B``);
    4. a parenthesised letter ``(B)``;
    4b. (before 4) a letter claimed correct: ``B is the correct answer``,
       ``C is correct`` (``C is not correct`` is not read);
    5. a response that is nothing but a letter (`` C``, ``B.``, ``Option B``): what the stock
       ``arc_challenge_chat`` gets after its prefix "The best answer is".

    In rules 2 and 3 the phrase's clause (up to the end of its line or sentence) is
    read for its first *standalone* letter: a capital with no letter, digit or
    contraction attached (``the answer is Alice`` is not "A", nor is ``I'm``), and
    not "A" or "I" followed by a lower-case word other than a few that follow option
    letters (``is``, ``because``, ``and``, ...): "A good answer is C" is C, "I think"
    is the pronoun. A clause with a negation before its letter ("the answer is not
    A") is not read. A clause without a letter leaves the phrase unread.

    `extract_answer`'s ``n_options`` gives the question's range (the task configs
    pass each question's number of options; without it, A..J): a letter beyond it
    is no answer. The range never changes *which* letter is read, only whether it
    counts, so a reader without the range (the vote, which does not see the
    question) and one with it (the scoring) give every text the same score.

`vote` counts the answers of several samples, grouping ``math`` answers by
mathematical equivalence. `infer_answer_kind` picks the kind for a task.

This module is pure Python (math-verify, and through it sympy, is imported only
when two ``math`` answers that differ as strings must be compared), so importing it
is cheap.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, Callable, Optional, Sequence, Union

from lm_eval_dvoting.core.latex_value import latex_value

__all__ = [
    "ANSWER_KINDS",
    "Vote",
    "answers_equivalent",
    "extract_answer",
    "infer_answer_kind",
    "normalize_math",
    "option_count",
    "vote",
]

ANSWER_KINDS = ("number", "math", "choice")


def _check_kind(kind: str) -> None:
    if kind not in ANSWER_KINDS:
        raise ValueError(f"unknown answer kind {kind!r}; expected one of {ANSWER_KINDS}")


# --------------------------------------------------------------------------- boxed


_BOX_COMMANDS = ("\\boxed", "\\fbox")


class _Truncated:
    """The verdict on a text whose final box was cut off: no answer (see `_final_box`)."""

    def __repr__(self) -> str:
        return "TRUNCATED"


TRUNCATED = _Truncated()


def _box_at(text: str, i: int, command: str) -> Optional[tuple[Optional[str], int]]:
    """The box whose command starts at `i`: (content, where scanning goes on), or None
    when `command` is not a box there (``\\boxedx``). Content None: the box never closes
    (its brace stays open, or the text ends right after the command)."""
    j = i + len(command)
    if j < len(text) and text[j].isalpha():
        return None
    k = j
    while k < len(text) and text[k] in " \t":
        k += 1
    if k == len(text):  # `... so \boxed` and the generation stops
        return None, j
    if text[k] == "{":
        depth = 0
        for end in range(k, len(text)):
            if text[end] == "{":
                depth += 1
            elif text[end] == "}":
                depth -= 1
                if depth == 0:
                    return text[k + 1 : end], end + 1
        return None, j  # unclosed: the scan goes on inside it
    if k > j:  # `\boxed 5`: the next whitespace/`$`-delimited token
        m = re.match(r"[^\s$]+", text[k:])
        if m:
            return m.group(0), k + m.end()
    return None


def _boxed_contents(text: str) -> list[Optional[str]]:
    """Contents of every ``\\boxed{...}`` / ``\\fbox{...}`` in `text`, in order.

    Braces are balanced by counting, so nested groups (``\\boxed{\\frac{1}{2}}``)
    are read whole. A box that never closes (a generation cut off at the length limit)
    is listed as None: `_final_box` turns it into no answer. The brace-less form
    ``\\boxed 5`` yields the token after the space.
    """
    found: list[tuple[int, Optional[str]]] = []
    for command in _BOX_COMMANDS:
        start = 0
        while True:
            i = text.find(command, start)
            if i < 0:
                break
            box = _box_at(text, i, command)
            if box is None:
                start = i + len(command)
                continue
            found.append((i, box[0]))
            start = box[1]
    found.sort(key=lambda pair: pair[0])
    return [content for _, content in found]


def _final_box(text: str) -> Union[str, None, _Truncated]:
    """The content of the last non-empty box; None when there is none; `TRUNCATED` when
    the last non-empty box never closes.

    A truncated final box means the generation was cut while it wrote its answer: the
    text has no answer, and neither an earlier box nor a fallback reads one, since
    what the model was writing is unknown and everything after ``\\boxed{`` is inside
    the unfinished box. An empty box (the prompt's ``\\boxed{}`` echoed) is skipped.
    """
    for content in reversed(_boxed_contents(text)):
        if content is None:
            return TRUNCATED
        if content.strip():
            return content
    return None


# --------------------------------------------------------------------------- numbers

# An optional sign, then `1,234,567(.89)`, `1234(.5)` or `.5`. The sign counts only
# when the hyphen does not follow a digit, letter, `)` or `.`: in `10-20` or
# `x-3` it is an operator, not part of the number.
_NUMBER = r"(?:(?<![\w).])-)?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
# A fraction `a/b` (optionally signed) is one value, tried before plain numbers.
_NUMBER_OR_FRACTION = re.compile(rf"{_NUMBER}(?:\s*/\s*\d+(?:\.\d+)?)?")
# `\frac{3}{4}`, `\frac34`, with an optional sign and an optional whole part before it:
# a whole number (glued or spaced) before a proper fraction is a mixed number
# (`2\frac{1}{2}` and `2 \frac{1}{2}` are 5/2, not 21/2 nor 1); before an improper one it
# stays a number of its own.
_LATEX_FRAC = re.compile(
    r"((?<![\w).])-)?(?:(?<![\d.,])(\d+)\s*)?"
    r"\\frac\s*(?:\{\s*(-?[\d.,]+)\s*\}|(\d))\s*(?:\{\s*(-?[\d.,]+)\s*\}|(\d))"
)
# `3 1/2`: a whole number, one space, a proper fraction of whole numbers
_MIXED = re.compile(r"(?<![\w.,/])(\d+) (\d+)/(\d+)(?![\w/]|[.,]\d)")
# `\text{ m}^2`, `\mathrm{ft}^{3}`: a unit group without a digit, with its exponent
_UNIT_GROUP = re.compile(
    r"\\(?:text|textrm|mathrm|mbox|operatorname)\s*\{[^{}\d]*\}(?:\s*\^\s*(?:\{[^{}]*\}|\d))?"
)
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ\b|\\degree\b")
# `3.5 \times 10^3`, `2 x 10^{-3}`: one number in scientific notation
_SCIENTIFIC = re.compile(
    rf"{_NUMBER}(?:\s*(?:\\times|\\cdot|\u00d7|\*)\s*|\s+x\s+)10\s*\^\s*(?:\{{\s*-?\d+\s*\}}|-?\d+)"
)
# `2^{10}`, `3^2`: a power of a number (not of a letter, a `)` or a group)
_POWER = re.compile(r"(?<![\w.^}])\d+(?:\.\d+)?\s*\^\s*(?:\{\s*-?\d+\s*\}|\d+)")
# `m^2`, `ft^{3}`: the exponent of a unit (a letter before the `^`) is not a number
_UNIT_EXPONENT = re.compile(r"(?<=[A-Za-z])\s*\^\s*(?:\{\s*-?\d+\s*\}|-?\d)")
# `1.5 million`: a number and a scale word is their exact product (short scale)
_SCALE = re.compile(rf"({_NUMBER})\s+(thousand|million|billion)\b", re.IGNORECASE)
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9}
# What glued to a number makes it no one exact number: a comma that is no thousands group
# (`2,5`), a clock time (`3:30`), e-notation (`1e3`); after a decimal, a trailing `...`
# (`0.333...`, a truncated expansion)
_GLUED_AFTER = re.compile(r":\d|[eE][-+]?\d")
_ELLIPSIS_AFTER = re.compile(r"\.\.|\u2026|\\[lc]?dots")
_GLUED_BEFORE = re.compile(r"\d:$|\d[eE][-+]?$")
_COMMA_AFTER, _COMMA_BEFORE = re.compile(r",\d"), re.compile(r"\d,$")
_ANSWER_PHRASE = re.compile(r"answer\s*(?:is|was|=|:)\s*:?|####", re.IGNORECASE)


def _clean_numeric_text(text: str) -> str:
    """Undo the LaTeX and Unicode spellings that hide a plain number."""
    text = text.replace("\u2212", "-").replace("\u2013", "-")  # Unicode minus, en dash
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    text = text.replace("{,}", ",")  # `1{,}000`
    text = re.sub(r"\\[!,;: ]", "", text)  # LaTeX spacing, e.g. `1,\!000`
    text = text.replace("\\$", "$").replace("\\%", "%")
    # `-$5` is minus five dollars: the sign goes to the number, as in `-5` (a hyphen
    # after a digit, letter, `)` or `.` stays an operator, `10-$5`; `- $5` is a list item)
    text = re.sub(r"(?<![\w).])-\$", "$-", text)
    text = _UNIT_GROUP.sub(" ", text)
    text = _DEGREES.sub("", text)
    text = _SCALE.sub(_scaled, text)
    # a power or a number in scientific notation is one value, as the grader reads it
    text = _SCIENTIFIC.sub(_evaluated, text)
    text = _POWER.sub(_evaluated, text)
    text = _UNIT_EXPONENT.sub("", text)
    text = _MIXED.sub(_mixed_number, text)
    return _LATEX_FRAC.sub(_latex_fraction, text)


def _evaluated(m: re.Match[str]) -> str:
    """A matched power / scientific number written as its exact value (kept as written
    when `latex_value` refuses it, e.g. a power too large to be an answer)."""
    value = latex_value(m.group(0))
    return m.group(0) if value is None else _format_fraction(value)


def _scaled(m: re.Match[str]) -> str:
    """`1.5 million` -> `1500000`: exact, as the grader multiplies it out."""
    value = Fraction(m.group(1).replace(",", "")) * _SCALES[m.group(2).lower()]
    return _format_fraction(value)


def _glued(text: str, match: re.Match[str], commas: bool = True) -> bool:
    """Whether the number `match` found in `text` is part of something that is not one
    exact number (`2,5`, `3:30`, `1e3`, `0.333...`): read as no answer, not as a part.
    `commas=False` (rule 3, a last number in running text) lets a comma separate a list
    (`the pairs 3,4`)."""
    before, end = text[: match.start()], match.end()
    if _GLUED_AFTER.match(text, end) or _GLUED_BEFORE.search(before):
        return True
    if commas and (_COMMA_AFTER.match(text, end) or _COMMA_BEFORE.search(before)):
        return True
    return "." in match.group(0) and _ELLIPSIS_AFTER.match(text, match.end()) is not None


def _mixed_number(m: re.Match[str]) -> str:
    whole, numerator, denominator = (int(g) for g in m.groups())
    if not 0 < numerator < denominator:
        return m.group(0)
    return _format_fraction(whole + Fraction(numerator, denominator))


def _latex_fraction(m: re.Match[str]) -> str:
    """`\\frac{3}{4}` -> ` 3/4 `, `2\\frac{1}{2}` -> ` 5/2 `, so one rule reads every
    spelling of a fraction."""
    sign, whole = m.group(1), m.group(2)
    num = (m.group(3) or m.group(4)).replace(",", "")
    den = (m.group(5) or m.group(6)).replace(",", "")
    try:
        value = Fraction(num) / Fraction(den)
    except (ValueError, ZeroDivisionError):
        return m.group(0)
    prefix = ""
    if whole is not None:
        if num.isdigit() and den.isdigit() and 0 < int(num) < int(den):
            value += int(whole)
        else:  # `2\frac{3}{2}`: not a mixed number, the two numbers stay apart
            prefix = f"{sign or ''}{whole} "
            sign = None
    value = -value if sign else value
    text = str(value.numerator) if value.denominator == 1 else str(value)  # `p/q`
    return f" {prefix}{text} "


def _canonical_number(token: str) -> Optional[str]:
    """Canonical string of one matched number/fraction token, or None."""
    token = re.sub(r"\s", "", token).replace(",", "")
    try:
        if "/" in token:
            num, den = token.split("/", 1)
            value = Fraction(num) / Fraction(den)
        else:
            value = Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None
    return _format_fraction(value)


def _format_fraction(value: Fraction) -> str:
    """`18`, `0.5`, `-3`, or `p/q` when the decimal does not terminate."""
    den = value.denominator
    while den % 2 == 0:
        den //= 2
    while den % 5 == 0:
        den //= 5
    if den != 1:
        return f"{value.numerator}/{value.denominator}"
    # A terminating decimal: scale by 10**k to an integer and place the point by
    # hand (exact for any size, unlike Decimal division at 28 digits).
    k = 0
    while (10**k) % value.denominator:
        k += 1
    digits = str(abs(value.numerator) * (10**k // value.denominator)).rjust(k + 1, "0")
    whole, frac = (digits[:-k], digits[-k:].rstrip("0")) if k else (digits, "")
    sign = "-" if value < 0 else ""
    return f"{sign}{whole}.{frac}" if frac else f"{sign}{whole}"


# The clause after an answer phrase ends with its line or at a sentence end: `.`, `,`,
# `;`, `!` or `?` followed by whitespace or the end of the line (`12.5`, `1,800` go on).
_CLAUSE_END = re.compile(r"[.,;!?](?=\s|$)")
# What makes a number the first operand of an expression: an operator and another
# number right after it (`5 + 3`, `5-3`, `$5 + $3`, `50% x 4`, `2 \times 3`, `(-4) * 2`,
# `6 \div 2`; not `5 apples + 3`, not `5 -- so`). A `/` between numbers is not here: `3/4`
# and `3 / 4` are read as one fraction.
_OPERATION = re.compile(r"[\s%)]*(?:[-+*x\u00d7\u00f7\u00b7]|\\times|\\cdot|\\div)[\s$(]*-?\.?\d")
# A text that ends in `=` or an operator after an operand was cut mid-calculation: its
# last number is an operand, not a result (`... so 9 * 2 =`), so rule 3 does not read
# it. Markdown's `**` and `---` and a new list item's `-` are not operators.
_CUT_MID_CALCULATION = re.compile(
    r"[\w)}\]]\s*(?:=|\+|(?<!-)-|(?<!\*)\*|/|\u00d7|\u00f7|\\times|\\cdot|\\div)[\s$\\(\[{]*$"
)
# `_clause_answer`'s verdict on a clause that states an expression but no result
_UNFINISHED = object()


def _clause_answer(clause: str) -> Any:
    """The number an answer phrase's clause states (already `_clean_numeric_text`-ed).

    The clause is cut at each ``=`` into parts (``5 + 3 = 8`` -> ``5 + 3``, ``8``). A
    part *states a number* when it holds one that no operator and number follow
    (``8``, ``$1,600 in all``, ``x`` does not, ``5 + 3`` does not: it is an
    expression); the part's first number is what it states. The clause's answer is
    what its last such part states, so a written result (``5 + 3 = 8``, also
    ``8 = 5 + 3``) is read rather than an operand. Returns that canonical string,
    None when the clause holds no number at all (the phrase is then skipped), and
    `_UNFINISHED` when it holds numbers but only in expressions (``5 + 3``): an
    answer stated as a sum with no value, which the caller reads as no answer.
    """
    verdict: Any = None
    for part in reversed(clause.split("=")):
        for match in _NUMBER_OR_FRACTION.finditer(part):
            canonical = _canonical_number(match.group(0))
            if canonical is None:  # `5/0`: not a value, the next number may be
                continue
            if _glued(part, match):  # `2,5`, `3:30`: not one number
                return _UNFINISHED
            if _OPERATION.match(part, match.end()) is None:
                return canonical
            verdict = _UNFINISHED
            break
    return verdict


def _extract_number(text: str) -> Optional[str]:
    boxed = _final_box(text)
    if boxed is TRUNCATED:
        return None
    if isinstance(boxed, str):
        # a box states a value: `\boxed{18 \text{ m}^2}` is 18, `\boxed{5 + 3}` is 8
        value = latex_value(boxed)
        return None if value is None else _format_fraction(value)
    for phrase in reversed(list(_ANSWER_PHRASE.finditer(text))):
        line = _clean_numeric_text(text[phrase.end() :].split("\n", 1)[0])
        answer = _clause_answer(_CLAUSE_END.split(line, 1)[0])
        if answer is _UNFINISHED:
            return None
        if answer is not None:
            return answer
    if _CUT_MID_CALCULATION.search(text):
        return None
    cleaned = _clean_numeric_text(text)
    for m in reversed(list(_NUMBER_OR_FRACTION.finditer(cleaned))):
        canonical = _canonical_number(m.group(0))
        if canonical is not None:
            return None if _glued(cleaned, m, commas=False) else canonical
    return None


# --------------------------------------------------------------------------- math


def normalize_math(answer: str) -> str:
    """Light, meaning-preserving clean-up of a LaTeX answer string.

    Only spellings that never change the value are rewritten; everything else
    (units, degrees, `\\text{}`) is left to math-verify in `answers_equivalent`.
    """
    s = answer.strip()
    s = s.strip("$").strip()
    s = re.sub(r"\\left\b|\\right\b", "", s)
    s = re.sub(r"\\displaystyle\b", "", s)
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\[!,;:]", "", s)
    s = re.sub(r"\s+", " ", s).strip()
    s = s.rstrip(".").rstrip()
    return s


# The stock minerva_math tasks ask for "Final Answer: The final answer is $X$. I hope
# it is correct." instead of a box; reading it lets their samples vote too.
_MATH_ANSWER_PHRASE = re.compile(r"(?i:answer\s+is)\s*:?\s*\$([^$]+)\$")


def _extract_math(text: str) -> Optional[str]:
    answer = _final_box(text)
    if answer is TRUNCATED:
        return None
    if answer is None:
        phrases = _MATH_ANSWER_PHRASE.findall(text)
        answer = phrases[-1] if phrases else None
    if answer is None:
        return None
    normalized = normalize_math(answer)
    return normalized or None


# --------------------------------------------------------------------------- choice

LETTERS = "ABCDEFGHIJ"

# A box holding a letter: `B`, `(B)`, `\text{B}`, `\textbf{(B)}`, `B) 42`, `B. 42`.
_LETTER_IN_BOX = re.compile(
    r"^\s*(?:\\(?:text|textbf|mathrm|mathbf)\s*\{)?\s*\(?\s*([A-J])\s*(?:\}\s*)?(?:$|[).:].*$)",
    re.DOTALL,
)
# A capital A-J standing alone: no letter, digit or `\` before it, no letter, digit or
# contraction (`I'm`, `A's`) after it. The next word, if any, is returned too.
_STANDALONE = re.compile(r"(?<![\w\\'\u2019])([A-J])(?!\w|['\u2019]\w)(?:\s+([a-z]+)\b)?")
# Words that follow an option letter in a sentence ("A is correct", "I because ...") but
# never the article "A" nor the pronoun "I": after "A"/"I", any other lower-case word
# makes it the article or the pronoun ("A good answer is C", "I think it's B").
_AFTER_LETTER = frozenset(
    {
        "is",
        "has",
        "does",
        "seems",
        "appears",
        "fits",
        "matches",
        "gives",
        "states",
        "describes",
        "remains",
        "because",
        "since",
        "and",
        "or",
        "as",
        "but",
        "nor",
    }
)
# A negation before a letter (since the previous letter) rules that letter out:
# "the answer is not A but C" is C, "I don't think it's A" names no answer.
_NEGATION = re.compile(r"\b(?:not|never|no)\b|n't\b", re.IGNORECASE)
# The phrases whose clause names the answer: an answer line, then an "is" phrase.
_CHOICE_PHRASES = (
    # `Answer: B`, `**Answer:** (B)`, `Answer: $B$`, `Answer: I think it's B`,
    # `Correct option: B`
    re.compile(r"(?i:answer|option|choice)\**\s*:"),
    # `the answer is B`, `The correct answer is (B)`, `The best answer is B`,
    # `The correct choice is D`, `the best option would be C`
    re.compile(r"(?i:(?:answer|choice|option)\s+(?:is|would\s+be|should\s+be|must\s+be))\s*:?"),
    # `I choose B.`, `I select option (D)` (not "I pick (B) over (A)": a comparison)
    re.compile(r"\bI\s+(?i:choose|select)\b"),
)
# `B is the correct answer.`, `C is correct`, `Option A is the best choice`: the letter
# before the claim (a negation breaks the pattern: `C is not correct` is not read)
_LETTER_CLAIM = re.compile(
    r"(?<![\w\\'\u2019])\(?([A-J])\)?\s+is\s+(?:the\s+)?(?i:correct|right|best)\b"
)
# A second letter joined to the first (`A and C`, `(A) or (B)`, `A/C`): two answers named
_SECOND_LETTER = re.compile(r"\)?\s*(?:\b(?:and|or)\b|&|/|\+)\s*\(?[A-J](?![\w'])")
# A retraction after the answer phrase (`The answer is B. Wait, no, it is C.`): what the
# model settled on is unsure, so the phrase is not read and nothing else is
_RETRACTION = re.compile(
    r"\b(?i:wait|actually|on second thought|correction|I mean|scratch that)\b|\b(?i:no),"
)
_PARENTHESISED = re.compile(r"\(([A-J])\)")
# the whole response is one letter: ` C` after the stock arc_challenge_chat's
# `gen_prefix` "The best answer is" (which also stops at ".")
# (also `Option B`, `Choice: (C)`)
_WHOLE_RESPONSE = re.compile(r"^[\s*]*(?:(?i:option|choice)\s*:?\s*)?\(?\s*([A-J])[\s*).:]*$")


def _first_letter(clause: str) -> Optional[str]:
    """The first option letter standing alone in `clause`, skipping the article "A",
    the pronoun "I" and a letter negated since the previous letter; None if none."""
    since = 0
    for m in _STANDALONE.finditer(clause):
        letter, next_word = m.group(1), m.group(2)
        if letter in "AI" and next_word is not None and next_word not in _AFTER_LETTER:
            continue  # "A good answer", "I think"
        if _NEGATION.search(clause, since, m.start()) is None:
            return TRUNCATED if _SECOND_LETTER.match(clause, m.end(1)) else letter
        since = m.end(1)
    return None


def _clause_after(text: str, end: int) -> str:
    """The clause after a phrase ending at `end`: the rest of its line up to a sentence
    end; when that rest is blank (``Answer:`` and a line break), the next non-empty
    line's first clause."""
    rest, _, after = text[end:].partition("\n")
    if not rest.strip(" \t*$:"):
        rest = next((line for line in after.split("\n") if line.strip()), "")
    return _CLAUSE_END.split(rest, 1)[0]


def _phrase_letter(text: str) -> Optional[str]:
    """The letter of the last answer line, else of the last "answer is" phrase, whose
    clause names one (`_clause_after`, `_first_letter`); `TRUNCATED` (no answer, no later
    rule) when that clause names two letters or a retraction follows it."""
    for phrase in _CHOICE_PHRASES:
        for m in reversed(list(phrase.finditer(text))):
            clause = _clause_after(text, m.end())
            letter = _first_letter(clause)
            if letter is None:
                continue
            if letter is TRUNCATED:  # `A and C`: two answers named
                return TRUNCATED
            after = text[text.find(clause, m.end()) + len(clause) :]
            return TRUNCATED if _RETRACTION.search(after) else letter
    return None


def _read_letter(text: str) -> Optional[str]:
    """The option letter the text names, by the rules of the module docstring."""
    if _final_box(text) is TRUNCATED:
        return None
    for content in reversed(_boxed_contents(text)):
        m = _LETTER_IN_BOX.match(content or "")
        if m:
            return m.group(1)
    letter = _phrase_letter(text)
    if letter is TRUNCATED:
        return None
    if letter is not None:
        return letter
    for pattern in (_LETTER_CLAIM, _PARENTHESISED, _WHOLE_RESPONSE):
        matches = pattern.findall(text)
        if matches:
            return matches[-1]
    return None


def _extract_choice(text: str, n_options: Optional[int]) -> Optional[str]:
    """`_read_letter`, and None when that letter is beyond the question's options.

    The range never changes *which* letter is read, only whether it counts: an
    out-of-range letter is the model's answer, just not an option, so no rule behind
    it is consulted (that would be a guess).
    """
    letter = _read_letter(text)
    if letter is None or (n_options is not None and LETTERS.index(letter) >= n_options):
        return None
    return letter


def _check_options(kind: str, n_options: Optional[int]) -> None:
    if n_options is None:
        return
    if kind != "choice":
        raise ValueError(
            f"n_options={n_options!r} applies to kind 'choice' only, not {kind!r}; "
            "leave it out (None)"
        )
    if (
        isinstance(n_options, bool)
        or not isinstance(n_options, int)
        or not 1 <= n_options <= len(LETTERS)
    ):
        raise ValueError(
            f"n_options={n_options!r} is not a number of options; expected a whole "
            f"number from 1 to {len(LETTERS)} (options A to {LETTERS[-1]}), or None"
        )


# --------------------------------------------------------------------------- API


def option_count(doc: Any, kind: str) -> Optional[int]:
    """The range `extract_answer`'s ``n_options`` takes for a question, from its lm-eval doc.

    A ``choice`` question's number of options: ``doc["choices"]`` as a list (this project's
    tasks) or as ``{"text": [...]}`` (the hub's ARC); None (letters A to J) for other kinds,
    for a doc without such choices, and for more options than there are letters. The vote
    (harness) and the task configs' filter both read it here, so what is voted is what is
    scored."""
    if kind != "choice" or not isinstance(doc, dict):
        return None
    choices = doc.get("choices")
    if isinstance(choices, dict):
        choices = choices.get("text")
    if not isinstance(choices, (list, tuple)) or not 1 <= len(choices) <= len(LETTERS):
        return None
    return len(choices)


def extract_answer(text: str, kind: str, n_options: Optional[int] = None) -> Optional[str]:
    """The canonical answer of a generated `text`, or None when it has none.

    `kind` is one of `ANSWER_KINDS`; the rules for each are in the module
    docstring. The result is a hashable string that is equal for equal ``number``
    and ``choice`` answers (``"18"``, ``"-3"``, ``"0.5"``, ``"B"``); ``math``
    answers are LaTeX strings to be compared with `answers_equivalent`.
    `n_options` (``choice`` only; None: options A to J) is the question's number of
    options: a letter beyond them is no answer (ValueError for another kind or a
    number outside 1..10).

    >>> extract_answer("so 18.00 dollars. The answer is 18.", "number")
    '18'
    >>> extract_answer("Thus $\\\\boxed{\\\\dfrac{1}{2}}$.", "math")
    '\\\\frac{1}{2}'
    >>> extract_answer("The answer is (C).", "choice")
    'C'
    """
    _check_kind(kind)
    _check_options(kind, n_options)
    if not text:
        return None
    text = str(text)  # a `str` subclass (CostedText) is read as its text
    if kind == "number":
        return _extract_number(text)
    if kind == "math":
        return _extract_math(text)
    return _extract_choice(text, n_options)


# math-verify's timeouts use SIGALRM, which only the main thread may set; elsewhere
# (a harness worker thread) it raises, so there we run without its timeout.
_MATH_VERIFY_TIMEOUT_S = 5


# Longer "answers" are runaway generations, not MATH answers (the longest MATH500
# reference has under 100 characters); sympy can spend seconds on them, so they
# are compared as strings only.
_MATH_VERIFY_MAX_CHARS = 1000


def _timeout() -> Optional[int]:
    return _MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=65536)
def _parse_math(answer: str) -> tuple[Any, ...]:
    """math-verify's parse of a bare LaTeX answer (wrapped in a box so it is found)."""
    try:
        from math_verify import parse
    except ImportError:  # math-verify is optional for number/choice use
        return ()
    try:
        return tuple(parse(f"\\boxed{{{answer}}}", parsing_timeout=_timeout()))
    except BaseException as exc:  # noqa: BLE001 - never let a parser bug end a run
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return ()


@lru_cache(maxsize=262144)
def _math_equivalent(gold: str, pred: str) -> bool:
    parsed_gold, parsed_pred = _parse_math(gold), _parse_math(pred)
    if not parsed_gold or not parsed_pred:
        return False
    try:
        from math_verify import verify

        return bool(verify(list(parsed_gold), list(parsed_pred), timeout_seconds=_timeout()))
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return False


def answers_equivalent(a: Optional[str], b: Optional[str], kind: str) -> bool:
    """Whether two extracted answers are the same answer.

    ``number`` and ``choice`` answers are canonical strings, so equality is string
    equality. ``math`` answers are equal when their strings are (after
    `normalize_math`), else when math-verify finds them mathematically equivalent
    (``\\frac{1}{2}``, ``0.5`` and ``\\dfrac12`` are one answer). `a` is given to
    math-verify as the reference ("gold"), which matters only for its few
    asymmetric rules. Never raises: a parse failure or a timeout (5 s, in the main
    thread only) is "not equivalent", and answers over 1000 characters are
    compared as strings only. None is equivalent to nothing. Results are
    cached, since the vote compares answers pairwise.
    """
    _check_kind(kind)
    if a is None or b is None:
        return False
    if a == b:
        return True
    if kind != "math":
        return False
    a, b = normalize_math(a), normalize_math(b)
    if a == b:
        return True
    if not a or not b or max(len(a), len(b)) > _MATH_VERIFY_MAX_CHARS:
        return False
    return _math_equivalent(a, b)


@dataclass(frozen=True)
class Vote:
    """The outcome of a vote.

    `winner`: the winning answer (the representative of the largest group), None
    when no sample had an answer. `counts`: ``(answer, votes)`` per group, most
    votes first; ties keep the order of first appearance, so ``counts[0]`` is the
    winner. `winner_index`: index of the first sample whose answer is in the
    winning group (None without a winner).
    """

    winner: Optional[str]
    counts: list[tuple[str, int]]
    winner_index: Optional[int]


def group_answers(
    answers: Sequence[Any], same_answer: Optional[Callable[[Any, Any], bool]] = None
) -> list[tuple[Any, list[int]]]:
    """The groups of equal answers, in order of first appearance: (representative, indices).

    None belongs to no group. Each answer joins the first group whose representative, the
    group's first-seen answer, is the same answer by `same_answer` (default `==`), else
    starts a new group. The grouping behind `tally` and `temporal.temporal_vote`.
    """
    same = same_answer or (lambda a, b: a == b)
    groups: list[tuple[Any, list[int]]] = []
    for index, answer in enumerate(answers):
        if answer is None:
            continue
        for representative, members in groups:
            if same(representative, answer):
                members.append(index)
                break
        else:
            groups.append((answer, [index]))
    return groups


def tally(answers: Sequence[Any], same_answer: Optional[Callable[[Any, Any], bool]] = None) -> Vote:
    """Majority vote over any hashable answers; the rule behind `vote`.

    None casts no vote; answers are grouped by `group_answers`. The largest group wins;
    a tie goes to the group seen first.
    """
    groups = group_answers(answers, same_answer)
    if not groups:
        return Vote(winner=None, counts=[], winner_index=None)
    # sorted() is stable: equal tallies keep first-appearance order
    order = sorted(range(len(groups)), key=lambda g: -len(groups[g][1]))
    counts = [(groups[g][0], len(groups[g][1])) for g in order]
    return Vote(winner=counts[0][0], counts=counts, winner_index=groups[order[0]][1][0])


def vote(answers: Sequence[Optional[str]], kind: str) -> Vote:
    """Majority vote over extracted answers (one per sample, in sample order).

    None (no extractable answer) casts no vote. Answers are grouped by
    `answers_equivalent` (equality for ``number``/``choice``, mathematical
    equivalence for ``math``); the largest group wins, a tie going to the group
    seen first (see `tally`).

    >>> vote(["18", None, "7", "18"], "number")
    Vote(winner='18', counts=[('18', 2), ('7', 1)], winner_index=0)
    """
    _check_kind(kind)
    return tally(answers, lambda a, b: answers_equivalent(a, b, kind))


# Task-name tokens that decide the kind when a task does not declare it. Tokens are
# the pieces of the name split at non-alphanumerics (`mmlu_college_mathematics` ->
# mmlu, college, mathematics); multiple-choice names are checked first so that an
# MMLU maths subject is still a letter answer.
_CHOICE_NAME_PREFIXES = (
    "gpqa",
    "arc",
    "mmlu",
    "openbookqa",
    "commonsense",
    "hellaswag",
    "piqa",
    "siqa",
    "winogrande",
    "truthfulqa",
    "race",
    "sciq",
    "logiqa",
    "agieval",
    "bbh",
    "mc",
)
_MATH_NAME_PREFIXES = ("math", "minerva", "hendrycks", "aime", "amc", "olympiad")


def infer_answer_kind(task_name: Optional[str], gen_kwargs_kind: Optional[str] = None) -> str:
    """The answer kind to vote with for a request of task `task_name`.

    1. A task may declare it: its ``generation_kwargs`` key ``dvoting_answer``
       (passed here as `gen_kwargs_kind`) wins when given, and must be one of
       `ANSWER_KINDS` (else ValueError). All of this project's ``dvoting_*`` tasks
       declare it.
    2. Otherwise (stock harness tasks) the task name decides. It is lower-cased and
       split into tokens at every non-alphanumeric character; then

       - ``"choice"`` if a token starts with a multiple-choice benchmark name:
         gpqa, arc, mmlu, openbookqa, commonsense, hellaswag, piqa, siqa,
         winogrande, truthfulqa, race, sciq, logiqa, agieval, bbh, mc
         (``gpqa_diamond_cot_zeroshot``, ``arc_challenge_chat``,
         ``mmlu_college_mathematics``);
       - else ``"math"`` if a token starts with math, minerva, hendrycks, aime,
         amc or olympiad (``minerva_math500``, ``hendrycks_math500``);
       - else ``"number"`` (``gsm8k``, ``gsm8k_cot_zeroshot``, and no task name).

    Note ``bbh`` mixes answer types; a wrong guess only weakens the vote's grouping
    (answers are then compared less cleverly), never the task's own scoring.
    """
    if gen_kwargs_kind is not None:
        if gen_kwargs_kind not in ANSWER_KINDS:
            raise ValueError(
                f"dvoting_answer={gen_kwargs_kind!r} is not an answer kind; "
                f"expected one of {', '.join(ANSWER_KINDS)}"
            )
        return gen_kwargs_kind
    if not task_name:
        return "number"
    tokens = [t for t in re.split(r"[^a-z0-9]+", task_name.lower()) if t]
    if any(t.startswith(_CHOICE_NAME_PREFIXES) for t in tokens):
        return "choice"
    if any(t.startswith(_MATH_NAME_PREFIXES) for t in tokens):
        return "math"
    return "number"
