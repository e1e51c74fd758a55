"""Choices of ``dvoting_arith_mc``: the demo problems as multiple choice, scored by likelihood.

Each problem gets four worked solutions that differ only in the last running result
and the boxed answer: the right one and three near misses (the answer +1, -1, +2,
with other offsets where a near miss would be negative). The right solution's place
among the four is fixed per problem (answer modulo 4), so it is not always first.
"""

from __future__ import annotations

from typing import Any

OFFSETS = (1, -1, 2, 3, -2, 4)


def _with_answer(solution: str, right: int, wrong: int) -> str:
    ending = f"={right}. \\boxed{{{right}}}"
    if not solution.endswith(ending):
        raise ValueError(f"unexpected solution layout: {solution!r}")
    return solution[: -len(ending)] + f"={wrong}. \\boxed{{{wrong}}}"


def choices(doc: dict[str, Any]) -> list[str]:
    """The four candidate solutions, the right one at position `target(doc)`."""
    right = int(doc["target"])
    wrong = [right + d for d in OFFSETS if right + d >= 0][:3]
    options = [_with_answer(doc["solution"], right, w) for w in wrong]
    options.insert(target(doc), doc["solution"])
    return options


def target(doc: dict[str, Any]) -> int:
    return int(doc["target"]) % 4
