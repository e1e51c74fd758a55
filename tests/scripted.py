"""A scripted stand-in for a diffusion LM, and helpers to script answers, for the tests.

`ScriptedModel` has no weights: its logits are a known function of the input, so a
test can say in advance what the decoder must commit and how fast.

For every row, the model looks only at the row's *real* tokens (those the attention
mask keeps, so left padding changes nothing). With `q` the row's first real token
(the "question id") and `p` a real position counted from the start of the row, the
logits at `p` are

* `choices(q, p) = (t,)`: `peak` on token `t`, 0 elsewhere: a near-certain prediction
  (entropy about `vocab * peak * exp(-peak)`, far below any sensible alpha);
* `choices(q, p) = (t1, t2, ...)`: `peak` on each: a tie. At temperature 0 the
  argmax takes the smallest id; at temperature > 0 the Gumbel noise picks one, so
  samples disagree there (entropy `ln k`, e.g. 0.69 for two: above alpha = 0.3);
* `choices(q, p) = ()`: all logits 0, a flat distribution (entropy `ln vocab`).

`forward` also records the batch size of each call (`calls`), so a test can count
forward passes and row-steps independently of the decoder's own NFE counters.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import nn

Choices = Callable[[int, int], Sequence[int]]


class ScriptedModel(nn.Module):
    def __init__(
        self,
        choices: Choices,
        vocab: int = 32,
        peak: float = 30.0,
        max_length: int = 1024,
    ) -> None:
        super().__init__()
        self.choices = choices
        self.vocab = vocab
        self.peak = peak
        self.mask_token_id = vocab - 1
        self.end_token_ids = (vocab - 2,)
        self.logits_shift = 0
        self.max_length = max_length
        self.calls: list[int] = []  # batch size of every forward pass
        self._cache: dict[tuple[int, int], torch.Tensor] = {}

    def _row_logits(self, q: int, p: int) -> torch.Tensor:
        key = (q, p)
        if key not in self._cache:
            row = torch.zeros(self.vocab)
            for token in self.choices(q, p):
                row[int(token)] = self.peak
            self._cache[key] = row
        return self._cache[key]

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        batch, width = input_ids.shape
        self.calls.append(batch)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        logits = torch.zeros(batch, width, self.vocab)
        for b in range(batch):
            real = attention_mask[b].bool().nonzero().flatten()
            q = int(input_ids[b, real[0]])
            for p, column in enumerate(real.tolist()):
                logits[b, column] = self._row_logits(q, p)
        return logits

    @property
    def row_steps(self) -> int:
        """Rows summed over forward passes: every row's NFE together."""
        return sum(self.calls)


def gen_choices(prompt_length: int, region: Callable[[int, int], Sequence[int]]) -> Choices:
    """`choices` for prompts of one known length: `region(q, g)` scripts generation index g."""

    def choices(q: int, p: int) -> Sequence[int]:
        if p < prompt_length:
            return (0,)
        return region(q, p - prompt_length)

    return choices


class ScriptedAnswers:
    """An `extract` that returns, for question `q`, the answers scripted for it, in order.

    The question is read from generation index `question_at` (a test scripts the
    model to write `q` there). Every call is recorded in `seen` as (q, tokens).
    """

    def __init__(self, script: dict[int, Sequence[Any]], question_at: int = 0) -> None:
        self.script = {q: list(answers) for q, answers in script.items()}
        self.question_at = question_at
        self.calls: dict[int, int] = {}
        self.seen: list[tuple[int, torch.Tensor]] = []

    def __call__(self, tokens: torch.Tensor) -> Any:
        q = int(tokens[self.question_at])
        k = self.calls.get(q, 0)
        self.calls[q] = k + 1
        self.seen.append((q, tokens.clone()))
        return self.script[q][k]
