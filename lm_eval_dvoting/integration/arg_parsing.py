"""Model-arg and generation-kwarg values as lm-eval hands them over, checked and converted.

lm-eval passes `--model_args a=1,b=0.3,c=true` typed (int/float/bool), `--batch_size 4` as
text, and a task's YAML values as YAML typed them, so each value may arrive as a number,
as its text or as a bool. These helpers accept every spelling of a valid value and refuse
the rest with a message that names the argument; ranges are `StrategySettings`' to check.
Used by the harness (model args) and by request planning (generation kwargs).
"""

from __future__ import annotations

import numbers
from typing import Any


def flag(name: str, value: bool | str) -> bool:
    """A boolean model arg given as a bool or as true/false text."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"{name} must be true or false, got {value!r}")


def whole_number(
    name: str, value: Any, minimum: int | None = None, allowed: str | None = None
) -> int:
    """A whole-number model arg: 5, "5" and 5.0 give 5; 2.5, "abc", True, inf are refused.

    `int()` would truncate 2.5 to 2 silently and fail on "abc" with a bare message.
    """
    number: Any = value
    if isinstance(value, str):
        text = value.strip()
        try:
            number = int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                number = None
    if isinstance(number, float) and number.is_integer():
        number = int(number)
    allowed = allowed or "a whole number" + ("" if minimum is None else f" >= {minimum}")
    if (
        isinstance(number, bool)
        or not isinstance(number, numbers.Integral)
        or (minimum is not None and number < minimum)
    ):
        raise ValueError(
            f"{name} must be {allowed}, got {value!r}: give {name} as such a number, "
            f"or leave it out for its default"
        )
    return int(number)


def real_number(name: str, value: Any) -> float:
    """A real-valued model arg from a number or its text; "abc" and True are refused.

    Range checks (finite, >= 0, ...) are StrategySettings' and name the allowed values.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"{name} must be a number, got {value!r}: give e.g. {name}=0.5, "
            f"or leave {name} out for its default"
        ) from None
