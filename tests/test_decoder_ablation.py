"""The model arg `decoder=fixed|entropy` (issue 19) through the harness; the strategies'
side (a `single` sample with the entropy decoder is dVoting's first sample, ...) is
tested in tests/test_strategies.py."""

from __future__ import annotations

import lm_eval
import pytest

from lm_eval_dvoting.integration.harness import LLaDAEvalModel

GEN_LENGTH = 32


def test_the_model_arg_reaches_the_harness_and_its_report():
    lm = LLaDAEvalModel(pretrained="tiny-arith", strategy="single", decoder="entropy", batch_size=8)
    results = lm_eval.simple_evaluate(
        model=lm, tasks=["dvoting_arith"], limit=6, gen_kwargs="max_gen_toks=32", verbosity="ERROR"
    )
    info = results["config"]["dvoting"]
    [used] = info["settings_used"]
    # the entropy rule reads no steps: neither is recorded (issue 38)
    assert used["decoder"] == "entropy" and "steps" not in used and "steps_run" not in used
    nfe = results["results"]["dvoting_arith"]["nfe,extract"]
    assert nfe < GEN_LENGTH  # the fixed schedule would take exactly 32 passes
    with pytest.raises(ValueError, match="decoder=entropy does not apply to strategy=hex"):
        LLaDAEvalModel(pretrained="tiny-arith", strategy="hex", decoder="entropy")


def test_use_strategy_overrides_and_reseeds():
    lm = LLaDAEvalModel(pretrained="tiny-arith", strategy="dvoting", batch_size=8)
    lm.use_strategy("majority", decoder="entropy", temperature=0.6, seed=11)
    assert (lm.settings.strategy, lm.settings.decoder, lm.settings.temperature) == (
        "majority",
        "entropy",
        0.6,
    )
    assert lm.seed == 11
    with pytest.raises(ValueError, match="decoder=fixed does not apply"):
        lm.use_strategy("dvoting", decoder="fixed")
    # a switch starts from the settings and seed the model was built with, not the last switch's
    lm.use_strategy("majority")
    assert (lm.settings.decoder, lm.settings.temperature, lm.seed) == (None, None, 1234)
    assert lm.settings.resolved_decoder == "fixed" and lm.settings.resolved_temperature == 0.9


def test_the_confidence_decoder_through_the_harness():
    """decoder=confidence,threshold=... (Fast-dLLM's rule) as model args: used, recorded,
    and bad thresholds refused before the checkpoint is read."""
    lm = LLaDAEvalModel(
        pretrained="tiny-arith",
        strategy="single",
        decoder="confidence",
        threshold="0.5",
        block_length=32,
        batch_size=8,
    )
    results = lm_eval.simple_evaluate(
        model=lm, tasks=["dvoting_arith"], limit=6, gen_kwargs="max_gen_toks=32", verbosity="ERROR"
    )
    [used] = results["config"]["dvoting"]["settings_used"]
    assert (used["decoder"], used["threshold"]) == ("confidence", 0.5) and "steps_run" not in used
    assert results["results"]["dvoting_arith"]["nfe,extract"] < GEN_LENGTH
    for bad, says in [
        ("1.5", r"threshold \(confidence decoder\) must be in \(0, 1\], got 1.5"),
        ("abc", "threshold must be a number, got 'abc'"),
    ]:
        with pytest.raises(ValueError, match=says):
            LLaDAEvalModel(
                pretrained="does-not-exist", strategy="single", decoder="confidence", threshold=bad
            )
