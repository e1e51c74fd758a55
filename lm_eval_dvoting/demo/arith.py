"""Seeded synthetic multi-step arithmetic problems with worked, ``\\boxed{}`` solutions.

A problem is a chain of additions/subtractions (optionally multiplications) written
compactly, e.g. ``7+2-5+4=?`` (with parentheses where a multiplication follows a
sum: ``(7+2)*3=?``); its solution works the chain one step at a time with
running results and ends in the boxed answer::

    7+2=9. 9-5=4. 4+4=8. \\boxed{8}

The difficulty knob (`Difficulty`) sets the number of steps (a range), the largest
operand, the range of the first number, the largest running result allowed, and the
operations. Operations that would leave ``[0, max_value]`` are redrawn, so every
running result stays non-negative and bounded (one digit with ``max_value=9``, at
most two with the test set's ``max_value=99``).

Problems are drawn from `random.Random(seed)`, so a seed fixes the whole stream.
The shipped test set (``arith_test.jsonl``) uses `TEST_SEED`; training draws from
other seeds and skips every problem *equivalent* to one of the test or validation sets:
problems are compared by `canonical_form` (the multiset of signed terms, the first
number counted as ``+first``), not by their text, so no reordering of a held-out
problem is ever trained on.

Other valid worked solutions of a problem, several reasoning paths to one answer, come
from `solution_orders` (the terms in another order) and `commute_additions` (``4+3``
written ``3+4``); the shipped model was trained on both.

The prompt is the dVoting paper's GSM8K prompt (`format_prompt`).
"""

from __future__ import annotations

import itertools
import json
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

INSTRUCTION = "Please answer the question step by step and put the answer in \\boxed{}."
# Fresh seeds for the canonically held-out sets (2026-11-24); the sets of seeds
# 20260310/20260311 compared questions by text, and 375 of those 500 test problems had a
# reordered twin in training.
TEST_SEED = 20261124
VALID_SEED = 20261125
TEST_SIZE = 500
VALID_SIZE = 200
TEST_FILE = Path(__file__).resolve().parent / "arith_test.jsonl"

_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclass(frozen=True)
class Difficulty:
    """How hard the problems are: steps (operations) per problem, operand and result ranges."""

    min_steps: int = 2
    max_steps: int = 4
    max_operand: int = 9
    max_value: int = 9
    operations: tuple[str, ...] = ("+", "-")
    min_start: int = 1  # the first number is drawn from [min_start, max_value]

    def __post_init__(self) -> None:
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError(
                f"need 1 <= min_steps <= max_steps, got {self.min_steps}, {self.max_steps}"
            )
        if not 1 <= self.max_operand <= self.max_value:
            raise ValueError(
                f"need 1 <= max_operand <= max_value, got {self.max_operand}, {self.max_value}"
            )
        if not 0 <= self.min_start <= self.max_value:
            raise ValueError(
                f"need 0 <= min_start <= max_value, got {self.min_start}, {self.max_value}"
            )
        unknown = set(self.operations) - set(_APPLY)
        if not self.operations or unknown:
            raise ValueError(
                f"operations must be a non-empty subset of + - *, got {self.operations}"
            )


# The difficulty of the shipped test set (see demo/tiny-arith/TRAINING.md for why):
# chains of 2-4 additions/subtractions of one-digit numbers, starting from 1-9, every
# running result in 0..9. (A two-digit version, running results in 0..99, was tried
# first and stayed below 10% greedy accuracy within the CPU training budget.)
TEST_DIFFICULTY = Difficulty(min_steps=2, max_steps=4, max_operand=9, max_value=9, min_start=1)


@dataclass(frozen=True)
class Problem:
    question: str  # "7+2-5+4=?"
    solution: str  # "7+2=9. 9-5=4. 4+4=8. \\boxed{8}"
    answer: int
    steps: int

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def make_problem(rng: random.Random, difficulty: Difficulty = TEST_DIFFICULTY) -> Problem:
    """One problem drawn from `rng` at `difficulty`."""
    d = difficulty
    steps = rng.randint(d.min_steps, d.max_steps)
    value = rng.randint(d.min_start, d.max_value)
    question, worked, open_sum = str(value), [], False
    for _ in range(steps):
        while True:  # redraw until the running result stays in [0, max_value]
            op = rng.choice(d.operations)
            operand = rng.randint(1, d.max_operand)
            result = _APPLY[op](value, operand)
            if 0 <= result <= d.max_value:
                break
        if op == "*" and open_sum:
            question = f"({question})"  # the chain is worked left to right
        open_sum = op != "*"
        question += f"{op}{operand}"
        worked.append(f"{value}{op}{operand}={result}.")
        value = result
    solution = " ".join(worked) + f" \\boxed{{{value}}}"
    return Problem(question=question + "=?", solution=solution, answer=value, steps=steps)


def solution_orders(problem: Problem, max_value: int = TEST_DIFFICULTY.max_value) -> list[str]:
    """Every worked solution of an addition/subtraction chain, one per valid order.

    The first number stays first; the signed terms after it may be taken in any order
    whose running results all stay in ``[0, max_value]`` (so ``7-5+4`` is also solved
    as ``7-5=2. 2+4=6.`` or, reordered, ``7+4=11.`` only when 11 is allowed). The
    question's own left-to-right order is always first. A chain with a
    multiplication has one order: its own. Several orders are several reasoning
    paths to one answer, which is what voting needs: samples that take different
    paths make different mistakes. (`problem.solution` is not read: only the question.)
    """
    body = problem.question.removesuffix("=?")
    if "*" in body or "(" in body:
        return [problem.solution]
    first, *terms = re.findall(r"[+-]?\d+", body)
    start = int(first)
    orders: list[str] = []
    for order in dict.fromkeys(itertools.permutations(terms)):  # equal terms: one order
        value, worked = start, []
        for term in order:
            result = value + int(term)
            if not 0 <= result <= max_value:
                break
            worked.append(f"{value}{term[0]}{term[1:]}={result}.")
            value = result
        else:
            orders.append(" ".join(worked) + f" \\boxed{{{value}}}")
    return orders  # permutations() yields the question's own order first


def commute_additions(solution: str, rng: random.Random) -> str:
    """`solution` with each addition step written either way round, by a coin flip each.

    ``4+3=7.`` may become ``3+4=7.``: the same layout and the same running results at
    the same positions, but a different fact to recall. Samples that differ this way
    stay aligned position by position, which is what dVoting's remasking compares.
    """

    def flip(match: re.Match) -> str:
        left, right, result = match.groups()
        return f"{right}+{left}={result}." if rng.random() < 0.5 else match.group(0)

    return re.sub(r"\b(\d+)\+(\d+)=(\d+)\.", flip, solution)


def canonical_form(question: str) -> tuple[str, ...]:
    """What makes two problems the same problem: the sorted multiset of signed terms.

    ``4+3-2=?``, ``4-2+3=?``, ``3+4-2=?`` and ``3-2+4=?`` all give ``('+3', '+4', '-2')``.
    The first number counts as a positive term, which is stronger than keeping it apart,
    because training writes additions either way round (`commute_additions`): the
    solution ``3+4=7. 7-2=5.`` is trained for ``4+3-2=?`` and is word for word a solution
    of ``3+4-2=?``. Problems with one form have one answer and the same worked solutions
    up to order, so a held-out form must never be trained on. A chain with a
    multiplication has no reorderings (`solution_orders`): its form is its question.
    """
    body = question.removesuffix("=?")
    if "*" in body or "(" in body:
        return (body,)
    first, *terms = re.findall(r"[+-]?\d+", body)
    return tuple(sorted([f"+{int(first)}", *terms]))


def problem_stream(seed: int, difficulty: Difficulty = TEST_DIFFICULTY) -> Iterator[Problem]:
    """An endless, reproducible stream of problems."""
    rng = random.Random(seed)
    while True:
        yield make_problem(rng, difficulty)


def make_problems(
    seed: int,
    count: int,
    difficulty: Difficulty = TEST_DIFFICULTY,
    exclude: set[tuple[str, ...]] | frozenset[tuple[str, ...]] = frozenset(),
) -> list[Problem]:
    """`count` canonically distinct problems from `seed`, none of whose `canonical_form`
    is in `exclude` (so no two of them are reorderings of one problem)."""
    seen, problems, misses = set(exclude), [], 0
    for problem in problem_stream(seed, difficulty):
        form = canonical_form(problem.question)
        if form in seen:
            misses += 1
            if misses > 100_000:
                raise ValueError(
                    f"{difficulty} has fewer than {count} canonically distinct new problems"
                )
            continue
        seen.add(form)
        problems.append(problem)
        misses = 0
        if len(problems) == count:
            return problems
    raise AssertionError("unreachable")


def format_prompt(question: str) -> str:
    """The dVoting paper's GSM8K prompt around a question."""
    return f"{INSTRUCTION} {question}"


def held_out_sets(
    difficulty: Difficulty = TEST_DIFFICULTY, valid_size: int = VALID_SIZE
) -> tuple[list[Problem], list[Problem]]:
    """The test set (TEST_SEED) and a validation set (VALID_SEED) canonically disjoint from it.

    A larger `valid_size` extends the same validation stream: its first 200 problems
    are always the same, so logs made with 200 and with 1,000 compare.
    """
    test = make_problems(TEST_SEED, TEST_SIZE, difficulty)
    valid = make_problems(
        VALID_SEED, valid_size, difficulty, exclude={canonical_form(p.question) for p in test}
    )
    return test, valid


def write_test_set(path: Path = TEST_FILE) -> None:
    test, _ = held_out_sets()
    path.write_text("".join(p.to_json() + "\n" for p in test))


def read_test_set(path: Path = TEST_FILE) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    write_test_set()
    print(f"wrote {TEST_SIZE} problems to {TEST_FILE}")
