"""`decoder=confidence` (Fast-dLLM's confidence-threshold rule, with `threshold`) for the
strategies: single, majority and dvoting decode their samples with it; hex refuses it.
The rule itself is tested in tests/test_confidence_decoder.py."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from lm_eval_dvoting.core.answers import extract_answer
from lm_eval_dvoting.core.decoding import generate
from lm_eval_dvoting.core.strategies import StrategySettings, derive_seed, run_strategy
from lm_eval_dvoting.models.loading import load_model, load_tokenizer


@functools.lru_cache(maxsize=None)
def _demo() -> tuple:
    from lm_eval_dvoting.demo import arith

    tokenizer = load_tokenizer("tiny-arith")
    questions = [arith.format_prompt(p["question"]) for p in arith.read_test_set()[:12]]
    enc = tokenizer(questions, add_special_tokens=False, padding=True, return_tensors="pt")
    return (
        load_model("tiny-arith", device="cpu", dtype="float32"),
        tokenizer,
        enc.input_ids,
        enc.attention_mask,
    )


def _extract(tokens: torch.Tensor) -> str | None:
    return extract_answer(_demo()[1].decode(tokens.tolist(), skip_special_tokens=True), "number")


def _run(**kwargs) -> list:
    model, _, ids, mask = _demo()
    return run_strategy(model, ids, mask, extract=_extract, gen_length=32, seed=3, **kwargs)


def test_single_greedy_is_the_decoders_confidence_rule():
    """strategy=single,decoder=confidence at temperature 0 is generate(threshold=...)."""
    model, _, ids, mask = _demo()
    for threshold, block in [(0.9, 32), (0.5, 8)]:
        results = _run(
            strategy="single", decoder="confidence", threshold=threshold, block_length=block
        )
        direct = generate(model, ids, mask, gen_length=32, block_length=block, threshold=threshold)
        assert [r.samples[0].tolist() for r in results] == direct.tokens.tolist()
        assert [r.nfe for r in results] == direct.nfe.tolist()
    low = sum(
        r.nfe for r in _run(strategy="single", decoder="confidence", threshold=0.3, block_length=32)
    )
    high = sum(
        r.nfe
        for r in _run(strategy="single", decoder="confidence", threshold=0.99, block_length=32)
    )
    assert low < high  # the threshold reaches the decoder


def test_majority_and_dvoting_draw_their_samples_with_the_rule():
    """At one temperature and seed, sample k of majority and dVoting's fresh samples are
    the same draws as with the rule alone: sample k's generator is seeded from the
    question's seed and k."""
    model, _, ids, mask = _demo()
    majority = _run(strategy="majority", decoder="confidence", temperature=0.6, n=3)
    dvoting = _run(strategy="dvoting", decoder="confidence")
    entropy = _run(strategy="dvoting")
    for q, (m, d) in enumerate(zip(majority, dvoting)):
        assert torch.equal(m.samples[0], d.samples[0]) and torch.equal(m.samples[1], d.samples[1])
        seed = derive_seed(derive_seed(3, q), 0)
        alone = generate(
            model,
            ids[q : q + 1],
            mask[q : q + 1],
            gen_length=32,
            block_length=2,
            threshold=0.9,
            temperature=0.6,
            generator=[torch.Generator().manual_seed(seed)],
        )
        assert (
            alone.tokens[0].tolist() == m.samples[0].tolist()
            and int(alone.nfe[0]) == m.sample_nfe[0]
        )
    assert [d.samples.tolist() for d in dvoting] != [e.samples.tolist() for e in entropy]


@pytest.mark.parametrize("threshold", [0, 1.5, -0.2, math.nan, math.inf, True, "0.9"])
def test_bad_thresholds_are_refused_naming_the_setting(threshold):
    with pytest.raises(ValueError, match=r"threshold \(confidence decoder\) must be"):
        StrategySettings(strategy="single", decoder="confidence", threshold=threshold)


def test_the_rule_needs_no_schedule():
    settings = StrategySettings(strategy="single", gen_length=32, decoder="confidence", steps=8)
    assert settings.steps_run is None
    assert settings.commit_rule() == dict(steps=None, alpha=None, threshold=0.9)
    assert StrategySettings(strategy="dvoting", gen_length=32).commit_rule() == dict(
        steps=None, alpha=0.3, threshold=None
    )
