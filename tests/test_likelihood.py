"""The Monte-Carlo likelihood bound and the greedy check, on the tiny official checkpoints.

The references here are written independently of `lm_eval_dvoting.core.likelihood`: one
unpadded sequence per forward pass, no batching, every mask set enumerated.
"""

from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lm_eval_dvoting.core.likelihood import (
    loglikelihood,
    rolling_loglikelihood,
    rolling_windows,
    score_requests,
)
from lm_eval_dvoting.models.loading import load_model

FAMILIES = ["llada_fixture", "dream_fixture"]


@functools.lru_cache(maxsize=None)
def _load(folder: str) -> nn.Module:
    return load_model(folder)


@pytest.fixture(params=FAMILIES, ids=["llada", "dream"])
def model(request) -> nn.Module:
    return _load(str(request.getfixturevalue(request.param)))


def _tokens(n: int, seed: int) -> torch.Tensor:
    """Random ordinary tokens (below the fixtures' special ids 240..250)."""
    return torch.randint(0, 240, (n,), generator=torch.Generator().manual_seed(seed))


def _prediction_logits(model: nn.Module, sequence: torch.Tensor) -> torch.Tensor:
    """(length, vocab) float32 logits whose row p predicts the token at p (shift applied)."""
    with torch.no_grad():
        logits = model(sequence[None])[0].float()
    shift = model.logits_shift
    return torch.cat([logits[:shift], logits[: len(logits) - shift]]) if shift else logits


def exact_expectation(model: nn.Module, context: torch.Tensor, continuation: torch.Tensor) -> float:
    """E[estimate]: every mask set S, weighted P(l) * 1/C(L, l), valued -(L/l) * sum CE."""
    length, total = len(continuation), 0.0
    for n_masked in range(1, length + 1):
        for subset in itertools.combinations(range(length), n_masked):
            noisy = continuation.clone()
            noisy[list(subset)] = model.mask_token_id
            logits = _prediction_logits(model, torch.cat([context, noisy]))[len(context) :]
            nll = F.cross_entropy(logits[list(subset)], continuation[list(subset)], reduction="sum")
            weight = (1 / length) / math.comb(length, n_masked)
            total += weight * (length / n_masked) * float(nll)
    return -total


def greedy_reference(model: nn.Module, context: torch.Tensor, length: int) -> torch.Tensor:
    """Unmask the most confident position (argmax token, never the mask) once per pass."""
    decoded = torch.full((length,), model.mask_token_id)
    masked = torch.ones(length, dtype=torch.bool)
    for _ in range(length):
        probs = _prediction_logits(model, torch.cat([context, decoded]))[len(context) :].softmax(-1)
        probs[:, model.mask_token_id] = 0.0
        confidence, tokens = probs.max(-1)
        confidence[~masked] = -1.0
        position = int(confidence.argmax())
        decoded[position], masked[position] = tokens[position], False
    return decoded


def test_monte_carlo_converges_to_the_exact_expectation(model):
    context, continuation = _tokens(5, 1), _tokens(3, 2)
    exact = exact_expectation(model, context, continuation)
    seeds = list(range(24))
    errors, estimates = {}, {}
    for mc_num in (16, 64, 256):
        results = score_requests(
            model,
            [(context, continuation)] * len(seeds),
            mc_num=mc_num,
            batch_size=512,
            seeds=seeds,
            greedy=False,
        )
        estimates[mc_num] = torch.tensor([value for value, _ in results], dtype=torch.float64)
        errors[mc_num] = float((estimates[mc_num] - exact).abs().mean())
    print(f"{model.family}: exact {exact:.4f}, mean |error| by mc_num {errors}")
    # error ~ 1/sqrt(mc_num): each 4x more draws should halve it (ratio ~2, noisy over 24 seeds)
    assert errors[16] / errors[64] > 1.3 and errors[64] / errors[256] > 1.3, errors
    assert 2.5 < errors[16] / errors[256] < 8.0, errors
    # unbiased: the mean of 24 estimates lies within 4 standard errors of the expectation
    standard_error = float(estimates[256].std()) / math.sqrt(len(seeds))
    assert abs(float(estimates[256].mean()) - exact) < 4 * standard_error


def test_results_do_not_depend_on_batch_size_or_order(model):
    requests = [
        (_tokens(c, 10 + i), _tokens(n, 20 + i))
        for i, (c, n) in enumerate([(3, 2), (9, 5), (1, 1), (6, 4), (2, 7)])
    ]
    seeds = [5, 6, 7, 8, 9]
    reference = score_requests(model, requests, mc_num=12, batch_size=1, seeds=seeds)
    batched = score_requests(model, requests, mc_num=12, batch_size=7, seeds=seeds)
    backwards = score_requests(model, requests[::-1], mc_num=12, batch_size=7, seeds=seeds[::-1])[
        ::-1
    ]
    for other in (batched, backwards):
        for (value, greedy), (value2, greedy2) in zip(reference, other):
            assert value == pytest.approx(value2, abs=1e-5, rel=1e-6)
            assert greedy == greedy2
    alone = loglikelihood(model, *requests[3], mc_num=12, seed=8)
    assert alone == pytest.approx(reference[3][0], abs=1e-5, rel=1e-6)


class Recorder(nn.Module):
    """Passes calls through to a model and keeps every batch of input ids it is given."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.mask_token_id, self.logits_shift = inner.mask_token_id, inner.logits_shift
        self.max_length = inner.max_length
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        self.calls.append((input_ids.clone(), attention_mask.clone()))
        return self.inner(input_ids, attention_mask=attention_mask, position_ids=position_ids)


def test_context_is_never_masked_and_levels_are_uniform(model):
    recorder = Recorder(model)
    context, continuation = _tokens(6, 3), _tokens(4, 4)
    mc_num = 40
    recorded = loglikelihood(recorder, context, continuation, mc_num=mc_num, seed=1, batch_size=16)
    # the whole-logits path (any module) agrees with the head-at-scored-positions path
    assert recorded == pytest.approx(
        loglikelihood(model, context, continuation, mc_num=mc_num, seed=1), abs=1e-5
    )
    rows = torch.cat([ids for ids, _ in recorder.calls])
    assert len(rows) == mc_num and all(len(call[0]) <= 16 for call in recorder.calls)
    assert torch.equal(rows[:, : len(context)], context.expand(mc_num, -1))  # context intact
    masked = rows[:, len(context) :] == model.mask_token_id
    assert torch.equal(
        torch.where(masked, continuation, rows[:, len(context) :]), continuation.expand(mc_num, -1)
    )
    # stratified levels: every l in 1..4 is used mc_num / 4 = 10 times
    assert torch.bincount(masked.sum(1), minlength=5).tolist() == [0, 10, 10, 10, 10]


def test_seeded_and_leaves_the_global_rng_alone(model):
    context, continuation = _tokens(4, 5), _tokens(3, 6)
    rng_before = torch.get_rng_state()
    first = loglikelihood(model, context, continuation, mc_num=8, seed=3)
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert loglikelihood(model, context, continuation, mc_num=8, seed=3) == first
    assert loglikelihood(model, context, continuation, mc_num=8, seed=4) != first
    # independent draws (the plain reading) are also available and also seeded
    iid = loglikelihood(model, context, continuation, mc_num=8, seed=3, stratified=False)
    assert loglikelihood(model, context, continuation, mc_num=8, seed=3, stratified=False) == iid


def test_greedy_flag_accepts_the_greedy_continuation_only(model):
    context = _tokens(5, 7)
    greedy_continuation = greedy_reference(model, context, 4)
    other = greedy_continuation.clone()
    other[2] = (other[2] + 1) % 240
    # one request alone, and both sharing the greedy passes
    for continuation, expected in ((greedy_continuation, True), (other, False)):
        [(_, flag)] = score_requests(model, [(context, continuation)], mc_num=1, seeds=[0])
        assert flag is expected
    flags = [
        greedy
        for _, greedy in score_requests(
            model,
            [(context, other), (context, greedy_continuation)],
            mc_num=2,
            seeds=[0, 0],
            batch_size=3,
        )
    ]
    assert flags == [False, True]


def test_edge_cases(model):
    empty = torch.tensor([], dtype=torch.long)
    assert score_requests(model, [(_tokens(3, 8), empty)], seeds=[0]) == [(0.0, True)]
    if model.logits_shift:  # Dream predicts token i at i-1: position 0 has no prediction
        with pytest.raises(ValueError, match="BOS"):
            loglikelihood(model, empty, _tokens(2, 9), mc_num=2)
    else:
        assert math.isfinite(loglikelihood(model, empty, _tokens(2, 9), mc_num=2))
    with pytest.raises(ValueError, match="seeds"):
        score_requests(model, [(_tokens(2, 1), _tokens(2, 2))], seeds=[0, 1])


def test_too_long_requests(model):
    continuation = _tokens(5, 11)
    long_context = _tokens(model.max_length + 20, 12)
    kept = long_context[len(long_context) - (model.max_length - 5) :]
    assert loglikelihood(model, long_context, continuation, mc_num=4) == pytest.approx(
        loglikelihood(model, kept, continuation, mc_num=4), abs=1e-6
    )
    with pytest.raises(ValueError, match="max_length"):
        loglikelihood(model, _tokens(2, 13), _tokens(model.max_length + 1, 14), mc_num=2)


def test_rolling_windows_tile_the_document():
    document = torch.arange(300)
    windows = rolling_windows(document, max_length=128, prefix_ids=torch.tensor([7]))
    assert torch.equal(torch.cat([cont for _, cont in windows]), document)
    assert [len(cont) for _, cont in windows] == [127, 63, 63, 47]
    for context, continuation in windows:
        assert len(context) + len(continuation) <= 128 and context[0] == 7
        start = int(continuation[0])
        assert torch.equal(
            context[1:], document[start - len(context) + 1 : start]
        )  # nearest history
    assert len(rolling_windows(document[:127], max_length=128, prefix_ids=torch.tensor([7]))) == 1


def test_rolling_loglikelihood(model):
    prefix = torch.tensor([240])  # the fixtures' BOS / end-of-text id
    short = _tokens(10, 15)
    assert rolling_loglikelihood(
        model, short, mc_num=4, seed=2, prefix_ids=prefix
    ) == pytest.approx(loglikelihood(model, prefix, short, mc_num=4, seed=2), abs=1e-6)
    document = _tokens(model.max_length + 30, 16)
    windows = rolling_windows(document, max_length=model.max_length, prefix_ids=prefix)
    total = rolling_loglikelihood(model, document, mc_num=2, seed=2, prefix_ids=prefix)
    assert len(windows) > 1 and math.isfinite(total) and total < 0


def test_progress_counts_every_request(model):
    requests = [(_tokens(3, i), _tokens(i % 3, 30 + i)) for i in range(5)]
    for greedy in (True, False):
        done: list[int] = []
        score_requests(
            model,
            requests,
            mc_num=3,
            batch_size=2,
            seeds=range(5),
            progress=done.append,
            greedy=greedy,
        )
        assert sum(done) == len(requests)
