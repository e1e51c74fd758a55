"""`decoder=fixed|entropy` (issue 19): dVoting's entropy-threshold decoder for `single` and
`majority`, so that dVoting's gain splits into decoder, voting, and remasking with early stop.

The exact checks: a `single` sample with the entropy decoder at dVoting's temperature *is*
dVoting's first sample (same seed, same decoder), and `majority`'s first two samples are
dVoting's two fresh samples, token for token and pass for pass.
"""
from __future__ import annotations

import pytest
import torch

import lm_eval
from lm_eval_dvoting.answers import extract_answer
from lm_eval_dvoting.demo import arith
from lm_eval_dvoting.harness import LLaDAEvalModel
from lm_eval_dvoting.models.loading import load_model, load_tokenizer
from lm_eval_dvoting.strategies import StrategySettings, run_strategy

GEN_LENGTH = 32


@pytest.fixture(scope="module")
def demo():
    model = load_model("tiny-arith", device="cpu")
    tokenizer = load_tokenizer("tiny-arith")
    problems = arith.read_test_set()[:12]
    enc = tokenizer([arith.format_prompt(p["question"]) for p in problems], add_special_tokens=False,
                    padding=True, return_tensors="pt")

    def extract(ids: torch.Tensor) -> str | None:
        return extract_answer(tokenizer.decode(ids.tolist()).split("<|endoftext|>")[0], "number")

    return model, enc, extract


def _run(demo, **kwargs):
    model, enc, extract = demo
    return run_strategy(model, enc.input_ids, enc.attention_mask, extract=extract, gen_length=GEN_LENGTH,
                        seed=7, max_rows=8, **kwargs)


def test_single_with_the_entropy_decoder_is_dvotings_first_sample(demo):
    dvoting = _run(demo, strategy="dvoting")
    single = _run(demo, strategy="single", decoder="entropy", temperature=0.6)
    for one, voted in zip(single, dvoting, strict=True):
        assert torch.equal(one.samples[0], voted.samples[0])
        assert one.nfe == voted.sample_nfe[0]
    # and not what the fixed schedule gives: it commits several tokens per pass
    fixed = _run(demo, strategy="single", temperature=0.6)
    assert all(r.nfe == GEN_LENGTH for r in fixed)
    assert sum(r.nfe for r in single) < sum(r.nfe for r in fixed)


def test_majority_with_the_entropy_decoder_starts_with_dvotings_fresh_samples(demo):
    dvoting = _run(demo, strategy="dvoting")
    majority = _run(demo, strategy="majority", decoder="entropy", temperature=0.6)
    for voted, plain in zip(dvoting, majority, strict=True):
        assert len(plain.samples) == 5  # n fresh samples, no early stop
        assert torch.equal(plain.samples[:2], voted.samples[:2])
        assert plain.sample_nfe[:2] == voted.sample_nfe[:2]
    # majority keeps its own default temperature with the entropy decoder
    assert StrategySettings(strategy="majority", decoder="entropy").resolved_temperature == 0.9


def test_greedy_single_with_the_entropy_decoder_follows_alpha(demo):
    loose = _run(demo, strategy="single", decoder="entropy", alpha=float("inf"))
    # every entropy is below inf: one pass commits all of a block, and hands its logits on to the next
    assert all(r.nfe == 1 for r in loose)
    strict = _run(demo, strategy="single", decoder="entropy", alpha=0.0)
    assert all(r.nfe == GEN_LENGTH for r in strict)  # one token per pass


def test_settings_report_the_decoder_and_no_schedule():
    entropy = StrategySettings(strategy="single", gen_length=32, decoder="entropy", steps=8)
    assert entropy.resolved_decoder == "entropy" and entropy.steps_run is None  # steps are not used
    assert StrategySettings(strategy="single", gen_length=32).resolved_decoder == "fixed"
    assert StrategySettings(strategy="dvoting", gen_length=32).resolved_decoder == "entropy"
    assert StrategySettings(strategy="majority", gen_length=32, decoder="fixed").steps_run == 16


@pytest.mark.parametrize("strategy, decoder, says", [
    ("hex", "entropy", "does not apply to strategy=hex"),
    ("dvoting", "fixed", "does not apply to strategy=dvoting"),
    ("single", "greedy", "decoder must be one of"),
])
def test_decoder_refusals_name_the_setting(strategy, decoder, says):
    with pytest.raises(ValueError, match=says):
        StrategySettings(strategy=strategy, gen_length=64, decoder=decoder)


def test_the_model_arg_reaches_the_harness_and_its_report():
    lm = LLaDAEvalModel(pretrained="tiny-arith", strategy="single", decoder="entropy", batch_size=8)
    results = lm_eval.simple_evaluate(model=lm, tasks=["dvoting_arith"], limit=6,
                                      gen_kwargs="max_gen_toks=32", verbosity="ERROR")
    info = results["config"]["dvoting"]
    [used] = info["settings_used"]
    assert used["decoder"] == "entropy" and used["steps_run"] is None
    nfe = results["results"]["dvoting_arith"]["nfe,extract"]
    assert nfe < GEN_LENGTH  # the fixed schedule would take exactly 32 passes
    with pytest.raises(ValueError, match="decoder=entropy does not apply to strategy=hex"):
        LLaDAEvalModel(pretrained="tiny-arith", strategy="hex", decoder="entropy")


def test_use_strategy_overrides_and_reseeds():
    lm = LLaDAEvalModel(pretrained="tiny-arith", strategy="dvoting", batch_size=8)
    lm.use_strategy("majority", decoder="entropy", temperature=0.6, seed=11)
    assert (lm.settings.strategy, lm.settings.decoder, lm.settings.temperature) == ("majority", "entropy", 0.6)
    assert lm.seed == 11
    with pytest.raises(ValueError, match="decoder=fixed does not apply"):
        lm.use_strategy("dvoting", decoder="fixed")
