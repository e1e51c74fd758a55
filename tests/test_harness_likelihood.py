"""The log-likelihood requests through the harness model (`loglikelihood`,
`loglikelihood_rolling`), as lm-eval calls them: what each returns, the seed each
request is scored with, what reaches `--use_cache`, and text lm-eval could not hash.

The seed of a request is derived from the model's `seed` and the request itself (the
token ids of context and continuation; the document text for rolling requests), so a
score never depends on the batch, on the order of the requests or on which other
requests run: these tests pin that derivation, because a change to it changes every
published Monte-Carlo score of a run repeated with a later version.
"""

from __future__ import annotations

import pytest
import torch
from lm_eval.api.instance import Instance

from lm_eval_dvoting.core.likelihood import rolling_loglikelihood, score_requests
from lm_eval_dvoting.core.strategies import derive_seed
from lm_eval_dvoting.integration.harness import LLaDAEvalModel

PAIRS = [("Please answer: 3+4=", " 7"), ("Please answer: 2+2=", " 4"), ("Q: 9-5=", " 4. 4+1=5")]
DOCUMENTS = ["3+4=7. 7-2=5.", "The answer is \\boxed{8}.", "1+1=2. 2+2=4. 4+4=8."]


class RecordingHook:
    """Stands in for lm-eval's CacheHook: what `--use_cache` would store."""

    def __init__(self) -> None:
        self.stored: list[tuple[str, tuple, object]] = []

    def add_partial(self, attr: str, req: tuple, res: object) -> None:
        self.stored.append((attr, req, res))


def _model(**kwargs) -> LLaDAEvalModel:
    return LLaDAEvalModel(
        pretrained="tiny-arith", device="cpu", **{"mc_num": 4, "seed": 5, **kwargs}
    )


def _requests(kind: str, arguments: list[tuple]) -> list[Instance]:
    return [
        Instance(request_type=kind, doc={}, arguments=args, idx=i, metadata=("demo", i, 1))
        for i, args in enumerate(arguments)
    ]


def _expected_pairs(lm: LLaDAEvalModel, mc_num: int, seed: int) -> list[tuple[float, bool]]:
    encoded = [lm._encode_pair(context, continuation) for context, continuation in PAIRS]
    return score_requests(
        lm.model,
        [(torch.tensor(c), torch.tensor(x)) for c, x in encoded],
        mc_num=mc_num,
        batch_size=lm.batch_rows,
        seeds=[derive_seed(seed, "loglikelihood", c, x) for c, x in encoded],
    )


def test_loglikelihood_scores_each_request_with_its_own_seed():
    lm = _model()
    found = lm.loglikelihood(_requests("loglikelihood", PAIRS))
    assert found == _expected_pairs(lm, mc_num=4, seed=5)
    assert all(isinstance(score, float) and isinstance(greedy, bool) for score, greedy in found)
    # not vacuous: another seed or another mc_num gives other estimates
    assert [s for s, _ in _model(seed=6).loglikelihood(_requests("loglikelihood", PAIRS))] != [
        s for s, _ in found
    ]
    assert _model(mc_num=8).loglikelihood(_requests("loglikelihood", PAIRS)) == _expected_pairs(
        lm, 8, 5
    )


def test_loglikelihood_does_not_depend_on_order_or_batch_size():
    found = _model().loglikelihood(_requests("loglikelihood", PAIRS))
    backwards = _model(batch_size=1).loglikelihood(_requests("loglikelihood", PAIRS[::-1]))
    assert backwards[::-1] == found


def test_loglikelihood_results_reach_the_cache_hook():
    lm = _model()
    hook = RecordingHook()
    lm.set_cache_hook(hook)
    found = lm.loglikelihood(_requests("loglikelihood", PAIRS))
    assert hook.stored == [("loglikelihood", pair, result) for pair, result in zip(PAIRS, found)]


def _expected_rolling(lm: LLaDAEvalModel, document: str) -> float:
    return rolling_loglikelihood(
        lm.model,
        torch.tensor(lm.tok_encode(document)),
        mc_num=lm.mc_num,
        seed=derive_seed(lm.seed, "rolling", document),
        prefix_ids=torch.tensor([lm.prefix_token_id]),
        batch_size=lm.batch_rows,
    )


def test_loglikelihood_rolling_scores_each_document_with_its_own_seed():
    lm = _model()
    hook = RecordingHook()
    lm.set_cache_hook(hook)
    found = lm.loglikelihood_rolling(_requests("loglikelihood_rolling", [(d,) for d in DOCUMENTS]))
    assert found == [_expected_rolling(lm, d) for d in DOCUMENTS]
    assert all(isinstance(score, float) and score < 0 for score in found)
    assert hook.stored == [
        ("loglikelihood_rolling", (d,), score) for d, score in zip(DOCUMENTS, found)
    ]
    other = _model(seed=6).loglikelihood_rolling(
        _requests("loglikelihood_rolling", [(d,) for d in DOCUMENTS])
    )
    assert other != found
    alone = _model().loglikelihood_rolling(_requests("loglikelihood_rolling", [(DOCUMENTS[2],)]))
    assert alone == found[2:]


@pytest.mark.parametrize("kind", ["loglikelihood", "loglikelihood_rolling"])
def test_lone_surrogates_are_replaced_before_scoring(kind):
    """lm-eval hashes the request text for --log_samples after all scoring: a lone surrogate
    is rewritten in the request first, and the score is that of the rewritten text."""
    broken, clean = "3+4=\udc80", "3+4=\ufffd"
    arguments = [(broken, " 7")] if kind == "loglikelihood" else [(broken,)]
    requests = _requests(kind, arguments)
    found = getattr(_model(), kind)(requests)
    assert requests[0].args[0] == clean
    cleaned = [(clean, " 7")] if kind == "loglikelihood" else [(clean,)]
    assert found == getattr(_model(), kind)(_requests(kind, cleaned))
