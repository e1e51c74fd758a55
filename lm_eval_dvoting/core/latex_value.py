"""The exact value a ``\\boxed{...}`` states, for answers that are one number (GSM8K).

A box is the model's final, delimited statement of its answer, so its content is read
as a *value*, the way a grader reads it: ``\\boxed{18 \\text{ m}^2}`` states 18 (the
``^2`` belongs to the unit), ``\\boxed{2^{10}}`` states 1024, ``\\boxed{3.5 \\times
10^3}`` 3500, ``\\boxed{3 \\frac{1}{2}}`` 7/2, ``\\boxed{ - 3}`` -3, ``\\boxed{5 + 3}`` 8.
`latex_value` returns that value as an exact `Fraction`, or None when the content does
not state one number (``\\boxed{x}``, ``\\boxed{5 \\text{ or } 6}``, ``\\boxed{2x+3}``,
``\\boxed{\\sqrt{2}}``, ``\\boxed{4:30}``): no answer rather than a guess.

What is read
    * ``=`` (also ``\\approx``): the part after the last one states the value
      (``x = 5`` is 5, ``5 + 3 = 8`` is 8);
    * numbers ``18``, ``18.50``, ``.5``, thousands groups ``1,234,567`` (``1{,}000``,
      ``1\\,000``); any other comma (``1,8``, ``3, 4``) is not a value;
    * ``+ - * / \\times \\cdot \\div`` and a spaced ``x`` between two numbers
      (``4 x 5``), with the usual precedence, parentheses and braces; signs, also
      spaced (``- 3``), apply to the whole operand (``-3\\frac{1}{2}`` is -7/2);
    * ``\\frac{a}{b}`` (``\\dfrac``, ``\\tfrac``, ``\\frac34``); a whole number directly
      before a *proper* fraction of two whole numbers is a mixed number
      (``3 \\frac{1}{2}``, ``3 1/2``), any other juxtaposition (``2(3)``,
      ``2\\frac{3}{2}``) is refused as ambiguous;
    * powers ``a^b`` / ``a^{b}`` with a whole exponent (``10^{-3}`` too); ``2^10``
      (digits outside braces) is read as the model meant it, 1024, not as TeX's
      ``2^1 0``. A power whose result may exceed 10,000 bits (the base's bit length
      times the exponent) is refused before it is computed, so no input can make the
      evaluator slow;
    * units are dropped with their exponents: ``\\text{...}``, ``\\mathrm{...}`` and
      similar groups without a digit (``\\text{ m}^2``, ``\\text{ dollars}``), words
      after an operand (``8 ft^3``, ``5 miles per hour``, ``3 m/s``), ``^\\circ``,
      ``\\%`` and ``$`` (GSM8K states money and percentages as bare numbers). A
      digit-free text group before the value is a label (``\\text{Total: } 18``). A
      single-letter word is a unit only when it is one of ``m g s h l L``; any other
      (``2n + 1``, ``5k``) is a variable or a multiplier and refuses the box, and so
      does a word that does not follow an operand (``5 + apples``);
    * a trailing ``...`` (``0.333...``) is a truncated expansion, not one exact number,
      and refuses the box (a single sentence period is dropped);
    * anything else (``\\sqrt``, ``\\pi``, ``:``, ``<``, ``\\pm``, a set) refuses the box.
      So do brackets, signs, fractions or text groups nested more than `MAX_DEPTH` (32)
      levels deep (a runaway generation, never an answer).

Why a hand-written evaluator rather than sympy or math-verify's LaTeX parser
(latex2sympy2_extended): the grammar a one-number answer needs is small, and owning it
makes every reading exact and bounded. latex2sympy reads units as symbols
(``18 \\text{ m}^2`` becomes ``18*m**2``, not 18), decimals as floats (``3.5 \\times
10^3`` becomes 3500.0), fails on ``25\\%``, and needs a time limit whose only
mechanism (SIGALRM) works in the main thread alone, while the harness extracts answers
wherever its strategies run. This module is exact (`Fraction`), has no time limit to
hit, and imports nothing beyond the standard library.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Callable, Optional, Union

__all__ = ["latex_value"]

# Brackets, signs and text groups nested deeper than this refuse the box: no answer nests
# so deep, and a runaway generation must not exhaust the stack or take quadratic time.
MAX_DEPTH = 32
# A power is computed only when the base's bit length times the exponent is at most this
# (a bound on the result's bits; about 3,000 decimal digits).
MAX_POWER_BITS = 10_000

# digit-free groups like these are units or labels; with a digit they hold the value
_TEXT_GROUP = re.compile(
    r"\\(?:text|textbf|textit|textrm|texttt|textsf|mathrm|mathbf|mathit|mathsf|mbox|"
    r"operatorname|emph)\s*\{([^{}]*)\}"
)
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree|\u00b0")
_DROPPED = re.compile(
    r"\\\$|\$|\\[!,;: ]|~|\\q?quad\b|\\left\b|\\right\b|\\displaystyle\b|\\[bB]igg?[lr]?\b"
)
_UNIT = "\\unit"  # the token a removed unit group leaves behind (its exponent follows it)
_TOKEN = re.compile(
    r"\s*(?:"
    r"(?P<number>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"|(?P<frac>\\frac)"
    r"|(?P<unit>\\unit)"
    r"|(?P<times>\\times|\\cdot|\*|\u00d7|\u00b7)"
    r"|(?P<divide>\\div|/|\u00f7)"
    r"|(?P<op>[-+^%(){}\[\]])"
    r"|(?P<word>[A-Za-z]+)"
    r")"
)
_SINGLE_LETTER_UNITS = frozenset("mgshlL")

# a token: (kind, text, value); value is the number's Fraction for "number"
Token = tuple[str, str, Optional[Fraction]]


class _NotAValue(Exception):
    """The content does not state one number."""


def latex_value(content: str) -> Optional[Fraction]:
    """The exact value that a box's `content` states, or None (see the module docstring).

    >>> latex_value(r"18 \\text{ m}^2"), latex_value(r"3.5 \\times 10^3")
    (Fraction(18, 1), Fraction(3500, 1))
    >>> latex_value(r"3 \\frac{1}{2}"), latex_value("x = 5"), latex_value("5 or 6")
    (Fraction(7, 2), Fraction(5, 1), None)
    """
    text = _stated_part(_plain(content))
    if text is None:
        return None
    try:
        tokens = _tokens(text)
        return _Parser(tokens).value()
    except (_NotAValue, ZeroDivisionError):
        return None


def _plain(content: str) -> str:
    """`content` with spacing, money, delimiters and unit groups reduced to plain tokens."""
    text = content.replace("\u2212", "-").replace("\u2013", "-")
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    text = text.replace("{,}", ",").replace("\\%", "%")
    text = _DEGREES.sub(lambda _: f" {_UNIT} ", text)
    for _ in range(MAX_DEPTH):  # innermost groups first: `\text{\textbf{18} dollars}`
        previous = text
        text = _TEXT_GROUP.sub(
            lambda m: f" {m.group(1)} " if re.search(r"\d", m.group(1)) else f" {_UNIT} ", text
        )
        if text == previous:
            break  # (groups nested deeper than MAX_DEPTH stay, and refuse the box)
    text = _DROPPED.sub("", text)
    # `\frac34`, `\frac3{4}`, `\frac{3}4`: single-character arguments get their braces
    text = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\frac\s*(\d)", r"\\frac{\1}", text)
    text = re.sub(r"(\\frac\s*\{[^{}]*\})\s*(\d)", r"\1{\2}", text)
    # one sentence period ends the box's statement; more (`0.333...`) is a truncated
    # expansion, not one exact number, and is left to refuse the box
    return re.sub(r"(?<!\.)\.$", "", text.strip()).strip()


def _stated_part(text: str) -> Optional[str]:
    """The part after the last `=` (or `\\approx`), or None when it is empty."""
    part = re.split(r"=|\\approx|\u2248", text)[-1].strip()
    return part or None


def _tokens(text: str) -> list[Token]:
    tokens: list[Token] = []
    position = 0
    while position < len(text):
        if text[position:].isspace():
            break
        m = _TOKEN.match(text, position)
        if m is None or m.end() == position:
            raise _NotAValue(text[position:])
        kind = m.lastgroup or ""
        raw = m.group(kind)
        value = Fraction(raw.replace(",", "")) if kind == "number" else None
        tokens.append((kind, raw, value))
        position = m.end()
    return tokens


def _is_whole(token: Token) -> bool:
    """A whole-number literal: digits only, no point, no thousands commas."""
    return token[0] == "number" and token[1].isdigit()


class _Parser:
    """Recursive descent over the tokens: sum > product > sign > power > operand.

    Each method consumes tokens from `self.at` and returns the exact value; anything
    that does not fit raises `_NotAValue`.
    """

    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.at = 0
        self.depth = 0

    def nested(self, read: Callable[[], Fraction]) -> Fraction:
        """`read()` one level deeper; beyond `MAX_DEPTH` levels the box is refused."""
        if self.depth >= MAX_DEPTH:
            raise _NotAValue("nested too deep")
        self.depth += 1
        try:
            return read()
        finally:
            self.depth -= 1

    # ------------------------------------------------------------------ helpers

    def peek(self, offset: int = 0) -> Optional[Token]:
        index = self.at + offset
        return self.tokens[index] if index < len(self.tokens) else None

    def take(self, *texts: str) -> bool:
        """Consume the next token if it is an operator or bracket among `texts`."""
        token = self.peek()
        if token is not None and token[0] == "op" and token[1] in texts:
            self.at += 1
            return True
        return False

    def take_kind(self, kind: str) -> bool:
        """Consume the next token if it is of `kind` ("times", "divide", "unit", "frac")."""
        token = self.peek()
        if token is not None and token[0] == kind:
            self.at += 1
            return True
        return False

    def expect(self, *texts: str) -> None:
        if not self.take(*texts):
            raise _NotAValue(f"expected {texts} at token {self.at}")

    # ------------------------------------------------------------------ grammar

    def value(self) -> Fraction:
        while self.take_kind("unit"):  # a digit-free text group before the value: a label
            pass
        result = self.sum()
        if self.peek() is not None:
            raise _NotAValue(f"unread tokens from {self.at}")
        return result

    def sum(self) -> Fraction:
        result = self.product()
        while True:
            if self.take("+"):
                result += self.product()
            elif self.take("-"):
                result -= self.product()
            else:
                return result

    def product(self) -> Fraction:
        result = self.signed()
        while True:
            if self.take_kind("times") or self._spaced_x():
                result *= self.signed()
            elif self.take_kind("divide"):
                result /= self.signed()  # ZeroDivisionError: not a value
            else:
                return result

    def _spaced_x(self) -> bool:
        """`4 x 5`: an `x` between two operands is a times sign."""
        token, after = self.peek(), self.peek(1)
        if (
            token is not None
            and token[1] in ("x", "X")
            and after is not None
            and (after[0] in ("number", "frac") or after[1] in ("(", "{", "[", "-"))
        ):
            self.at += 1
            return True
        return False

    def signed(self) -> Fraction:
        if self.take("-"):
            return -self.nested(self.signed)
        if self.take("+"):
            return self.nested(self.signed)
        return self.with_units()

    def with_units(self) -> Fraction:
        """An operand, then any units after it (dropped with their exponents) and `%`."""
        result = self.power()
        while True:
            if self.take("%"):
                continue
            token = self.peek()
            if token is None or not self._unit_word(token):
                return result
            self.at += 1
            self._skip_exponent()
            if self.peek() is not None and self.peek()[1] == "/" and self._unit_word(self.peek(1)):
                self.at += 1  # `m/s`: the denominator unit goes too

    @staticmethod
    def _unit_word(token: Optional[Token]) -> bool:
        if token is None:
            return False
        if token[0] == "unit":
            return True
        word = token[1]
        return token[0] == "word" and (len(word) > 1 or word in _SINGLE_LETTER_UNITS)

    def _skip_exponent(self) -> None:
        """A unit's exponent (`^2`, `^{3}`, `^{-1}`): read and dropped."""
        if self.take("^"):
            self.take("-")
            self.operand()

    def power(self) -> Fraction:
        base = self.operand()
        if not self.take("^"):
            return base
        sign = -1 if self.take("-") else 1
        exponent = self.operand() * sign
        if exponent.denominator != 1:
            raise _NotAValue("a fractional exponent")
        return _bounded_power(base, int(exponent))

    def operand(self) -> Fraction:
        token = self.peek()
        if token is None:
            raise _NotAValue("an operand is missing")
        if token[0] == "number":
            self.at += 1
            assert token[2] is not None
            return token[2] + self._proper_fraction_after(token)
        if self.take_kind("frac"):
            return self.nested(self.fraction)
        if self.take("(", "{", "["):
            closing = {"(": ")", "{": "}", "[": "]"}[token[1]]
            result = self.nested(self.sum)
            self.expect(closing)
            return result
        raise _NotAValue(f"{token[1]!r} is not an operand")

    def fraction(self) -> Fraction:
        numerator = self.operand()
        denominator = self.operand()
        return numerator / denominator

    def _proper_fraction_after(self, whole: Token) -> Union[Fraction, int]:
        """The fraction part of a mixed number `3 \\frac{1}{2}` / `3 1/2`, else 0.

        Only a whole number followed by a proper fraction of two whole numbers makes a
        mixed number; the parts are consumed here.
        """
        if not _is_whole(whole):
            return 0
        window = self.tokens[self.at : self.at + 7]
        texts = [t[1] for t in window]
        if (
            texts[:1] == ["\\frac"]
            and len(window) >= 7
            and texts[1] == texts[4] == "{"
            and texts[3] == texts[6] == "}"
            and _is_whole(window[2])
            and _is_whole(window[5])
        ):
            numerator, denominator, used = window[2][2], window[5][2], 7
        elif (
            len(window) >= 3
            and _is_whole(window[0])
            and window[1][0] == "divide"
            and window[1][1] == "/"
            and _is_whole(window[2])
        ):
            numerator, denominator, used = window[0][2], window[2][2], 3
        else:
            return 0
        assert numerator is not None and denominator is not None
        if not 0 < numerator < denominator:
            return 0
        self.at += used
        return numerator / denominator


def _bounded_power(base: Fraction, exponent: int) -> Fraction:
    """`base ** exponent`; refused when its bound on the result's bits (the base's bit
    length times the exponent) exceeds `MAX_POWER_BITS`."""
    if base == 0 and exponent < 0:
        raise _NotAValue("zero to a negative power")
    size = max(base.numerator.bit_length(), base.denominator.bit_length())
    if base not in (0, 1, -1) and size * abs(exponent) > MAX_POWER_BITS:
        raise _NotAValue("a power too large to be an answer")
    return base**exponent
