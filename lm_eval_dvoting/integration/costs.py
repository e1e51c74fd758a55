"""The text handed back to the harness, carrying what it cost.

lm-eval keeps whatever `generate_until` returns, so a `str` subclass with attributes
reaches the task's filters and `process_results` intact. Filters that build new
strings must copy the attributes over (`CostedText.like`), or the figures are lost.
"""

from __future__ import annotations

from typing import Any


class CostedText(str):
    """A generated text with per-request figures as attributes.

    Attributes set by the harness adapter: `nfe` (forward passes summed over the
    request's samples), `n_samples` (samples drawn), `votes` (answer -> count), and
    `trace` (a JSON-serialisable dict describing every candidate). Pickles with its
    attributes, so it survives lm-eval's request cache and cross-process gathers.
    """

    def __new__(cls, text: str, **figures: Any) -> "CostedText":
        obj = super().__new__(cls, text)
        obj.__dict__.update(figures)
        return obj

    @classmethod
    def like(cls, text: str, original: Any) -> str:
        """`text` carrying the figures of `original`, or plain `text` if it has none."""
        figures = getattr(original, "__dict__", None)
        return cls(text, **figures) if figures else text
