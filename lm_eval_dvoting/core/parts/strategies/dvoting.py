"""`dvoting` (docs/ALGORITHM.md section 2): samples 1..floor(n/2)+1 fresh, later ones keep the
positions the earlier samples agree on (share >= tau) and regenerate the rest (always the
last quarter), with the answer-consistency early stop before samples 3..n, decoded with
the entropy-threshold rule."""

from __future__ import annotations

from typing import Any

import torch

from lm_eval_dvoting.core.parts.base import BIDIRECTIONAL, BLOCK_CAUSAL, Strategy, register
from lm_eval_dvoting.core.parts.samples import (
    QuestionPlan,
    SampleSpec,
    fresh_sample,
    remask_tokens,
    should_stop_early,
)


@register
class DVoting(Strategy):
    name = "dvoting"
    order = 40
    reads = ("block_length", "n", "tau")
    models = (BIDIRECTIONAL, BLOCK_CAUSAL)
    default_rule = "entropy"
    temperature = 0.6
    rules = ("entropy", "confidence", "dream")
    rule_refusal = (
        "decoder={rule} does not apply to strategy=dvoting: dVoting decodes with its entropy "
        "threshold (alpha) or, with decoder=confidence, Fast-dLLM's rule, or with decoder=dream, "
        "Dream's own algorithms; leave decoder out for dvoting, or compare with "
        "strategy=majority,decoder=entropy"
    )
    shares_block_cache = True

    @classmethod
    def plan(cls, settings: Any, mask_id: int, same_answer: Any) -> QuestionPlan:
        n, fresh_count = settings.n, settings.n // 2 + 1
        drawn: list[torch.Tensor] = []
        answers: list[Any] = []
        while len(drawn) < n:
            i = len(drawn) + 1  # the sample about to be drawn, 1-based as in the paper
            if i >= 3 and should_stop_early(answers, n, same_answer):
                return
            if i <= fresh_count:
                # fresh samples before the first early-stop check (samples 1, 2) decode together
                size = min(2 - len(drawn) if i == 1 else 1, fresh_count - len(drawn))
                specs = [fresh_sample(settings, mask_id) for _ in range(min(size, n - len(drawn)))]
            else:
                specs = [_remask_sample(settings, torch.stack(drawn), mask_id)]
            results = yield specs
            drawn += [tokens for tokens, _ in results]
            answers += [answer for _, answer in results]


def _remask_sample(settings: Any, drawn: torch.Tensor, mask_id: int) -> SampleSpec:
    """A sample that keeps the positions the earlier samples agree on (`remask_tokens`)."""
    start = remask_tokens(drawn, settings.tau, mask_id)
    return fresh_sample(settings, mask_id, init_tokens=start, kept=start != mask_id)
