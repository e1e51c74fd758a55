"""Model-arg and generation-kwarg values as lm-eval hands them over, checked and converted.

lm-eval passes `--model_args a=1,b=0.3,c=true` typed (int/float/bool), `--batch_size 4` as
text, and a task's YAML values as YAML typed them, so each value may arrive as a number,
as its text or as a bool. These helpers accept every spelling of a valid value and refuse
the rest with a message that names the argument; ranges are `StrategySettings`' to check.
Used by the harness (model args) and by request planning (generation kwargs). The strategy
settings' model args are read generically from their declarations (`parse_settings`).
"""

from __future__ import annotations

import numbers
from typing import Any

from lm_eval_dvoting.core.settings import setting_fields


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


# ------------------------------------------------------------- the strategy settings

_PARSERS = {
    "whole": lambda name, value, allowed: whole_number(name, value, allowed=allowed),
    "real": lambda name, value, allowed: real_number(name, value),
    "flag": lambda name, value, allowed: flag(name, value),
    "text": lambda name, value, allowed: value,
}


def setting_args() -> dict[str, Any]:
    """The strategy settings that are model args: model-arg name -> the setting's declaration
    (a `StrategySettings` field; `gen_length` is the model arg `max_gen_toks`)."""
    return {
        declared.metadata["arg"] or declared.name: declared
        for declared in setting_fields()
        if declared.metadata["parse"] is not None
    }


def setting_arg_default(declared: Any) -> Any:
    """A setting's model-arg default: its declaration's (`cache`: None, the model kind's)."""
    return declared.metadata["arg_default"]


def parse_settings(given: dict[str, Any]) -> dict[str, Any]:
    """The settings among the model args `given` (by model-arg name; those left out take
    their model-arg default), each value read from its text by its declared parser, by
    field name. None stays None where the model-arg default is None ("left out")."""
    parsed = {}
    for name, declared in setting_args().items():
        value = given.get(name, setting_arg_default(declared))
        if value is not None or setting_arg_default(declared) is not None:
            metadata = declared.metadata
            value = _PARSERS[metadata["parse"]](name, value, metadata["allowed"])
        parsed[declared.name] = value
    return parsed
