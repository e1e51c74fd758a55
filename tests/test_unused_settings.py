"""Settings the chosen strategy, commit rule or vote does not read (issue 38): given, they are
reported once per run and left out of `settings_used` and the result cache's fingerprint;
the settings a decode reads stay there exactly as before. (`config.dvoting.settings`, the
model's own settings, keeps every model arg as given.)

`guidance` without rfg, `temporal_alpha` with a plain vote, `block_length` with hex,
`threshold` without the confidence rule, ... used to be accepted silently, recorded as if
they had been used, and given each value its own cache entries (a sweep over a setting that
does nothing recomputed everything and reported differences that were noise).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Iterator

import pytest

import lm_eval_dvoting.integration.result_cache as result_cache
from lm_eval_dvoting.core import strategies
from lm_eval_dvoting.core.strategies import StrategySettings
from lm_eval_dvoting.integration.harness import LLaDAEvalModel

GEN_LENGTH = 32  # hex needs a multiple of 32


@pytest.fixture(scope="module")
def shared_lm() -> LLaDAEvalModel:
    return LLaDAEvalModel(pretrained="tiny-arith", device="cpu", batch_size=8)


@pytest.fixture
def lm(shared_lm: LLaDAEvalModel) -> Iterator[LLaDAEvalModel]:
    """The module's model, switched back to the settings it was built with after each test:
    a test's `use_strategy` must not reach the next test (pytest-xdist orders a worker's
    tests as it likes; `remasking=random` left over once failed the block diffusion tests)."""
    built = shared_lm.settings.strategy
    yield shared_lm
    shared_lm.use_strategy(built)


class _Request:
    """The parts of lm-eval's Instance that generate_until reads."""

    def __init__(self, doc_id: int = 0) -> None:
        self.args = ("1+2=", {"until": ["\n"], "max_gen_toks": GEN_LENGTH})
        self.task_name, self.doc_id = "dvoting_arith", doc_id


# (strategy, setting, value): a valid value that the strategy, its rule and its vote do not read
UNUSED = [
    ("single", "guidance", 2.0),  # rfg's
    ("majority", "temporal_alpha", 11.0),  # the temporal vote's; majority votes plainly
    ("majority", "temporal_weight", "linear"),
    ("hex", "block_length", 4),  # hex decodes with its own block lengths, L/32 .. L/2
    ("single", "threshold", 0.7),  # the confidence rule's; single uses the fixed schedule
    ("dvoting", "steps", 8),  # the fixed schedule's; dvoting uses the entropy rule
    ("dvoting", "remasking", "random"),
    ("single", "alpha", 0.5),  # the entropy rule's
    ("single", "n", 7),  # one sample
    ("temporal", "n", 3),
    ("majority", "tau", 0.5),  # dVoting's remask share
    ("single", "hex_samples", 5),
]


def _unused_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "is not used by" in r.getMessage()
    ]


@pytest.mark.parametrize("strategy, name, value", UNUSED)
def test_an_unused_setting_is_reported_and_kept_out_of_settings_used_and_the_fingerprint(
    lm, strategy, name, value, caplog
):
    lm.use_strategy(strategy)
    without = result_cache.fingerprint(lm)
    lm.generate_until([_Request()])
    used_without = lm.get_model_info()["dvoting"]["settings_used"]
    with caplog.at_level(logging.WARNING):
        lm.use_strategy(strategy, **{name: value})
    assert getattr(lm.settings, name) == value  # accepted (it can run), not refused
    [warned] = _unused_warnings(caplog)
    assert f"{name}={value!r}" in warned and f"strategy={strategy}" in warned
    identity = result_cache.fingerprint(lm)
    assert name not in identity
    # the same cache entries as without it: the setting changes no output
    assert result_cache.fingerprint_id(identity) == result_cache.fingerprint_id(without)
    lm.generate_until([_Request()])
    info = lm.get_model_info()["dvoting"]
    [entry] = info["settings_used"]
    assert name not in entry and info["settings_used"] == used_without  # the record without it
    assert info["settings"][name] == value  # the model's own settings: every model arg, as given


def test_a_given_unused_setting_is_reported_once_per_run_and_a_used_or_default_one_never(caplog):
    with caplog.at_level(logging.WARNING):
        lm = LLaDAEvalModel(
            pretrained="tiny-arith", device="cpu", strategy="single", guidance=2.0, n=7
        )
    warned = _unused_warnings(caplog)
    assert len(warned) == 2
    guidance = next(m for m in warned if "guidance=2.0" in m)
    # says who reads it, and what happens to it
    assert "only strategy=rfg read" in guidance
    assert "left out of settings_used and of the result cache's fingerprint" in guidance
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        lm.use_strategy("single")  # the same settings again: already reported in this run
        lm.generate_until([_Request()])
        LLaDAEvalModel(pretrained="tiny-arith", device="cpu", strategy="majority", n=7, steps=16)
        LLaDAEvalModel(pretrained="tiny-arith", device="cpu", strategy="single")
    assert _unused_warnings(caplog) == []
    with caplog.at_level(logging.WARNING):
        lm.use_strategy("majority")  # n is majority's: used; guidance still is not
    [warned] = _unused_warnings(caplog)
    assert "guidance=2.0" in warned and "strategy=majority" in warned


def _old_fingerprint_settings(settings: StrategySettings) -> dict:
    """The strategy part of the fingerprint as it was before issue 38 (every field)."""
    resolved = dataclasses.asdict(settings) | {
        "block_length": settings.resolved_block_length,
        "temperature": settings.resolved_temperature,
        "steps": settings.resolved_steps,
        "vote": settings.resolved_vote,
        "threshold": settings.resolved_threshold,
    }
    resolved["max_gen_toks"] = resolved.pop("gen_length")
    return resolved


def _strategy_part(lm: LLaDAEvalModel, **settings) -> tuple[dict, dict]:
    """The fingerprint's strategy settings with `settings`, then and before issue 38."""
    built = lm.settings
    try:
        lm.settings = dataclasses.replace(built, **settings)
        old = _old_fingerprint_settings(lm.settings)
        identity = result_cache.fingerprint(lm)
    finally:
        lm.settings = built
    return {key: value for key, value in identity.items() if key in old}, old


DREAM_ONLY = {"alg", "alg_temp", "eps"}  # Dream's algorithm settings (decoder=dream only)
# LLaDA2.1's editing, and Dream's algorithm settings
NEVER_READ_BY_LLADA = {"editing_threshold", "max_post_steps", *DREAM_ONLY}
TEMPORAL = {"temporal_weight", "temporal_alpha"}
NOT_READ = {  # per strategy (LLaDA's family, its default decoder and vote), what is left out
    "single": {"n", "alpha", "tau", "hex_samples", "threshold", "guidance"} | TEMPORAL,
    "majority": {"alpha", "tau", "hex_samples", "threshold", "guidance"} | TEMPORAL,
    "hex": {"block_length", "n", "alpha", "tau", "threshold", "guidance"} | TEMPORAL,
    "dvoting": {"steps", "remasking", "hex_samples", "threshold", "guidance"} | TEMPORAL,
    "temporal": {"n", "alpha", "tau", "hex_samples", "threshold", "guidance"},
    "rfg": {"n", "alpha", "tau", "hex_samples", "threshold"} | TEMPORAL,
}


@pytest.mark.parametrize("strategy", sorted(NOT_READ))
def test_the_settings_a_decode_reads_keep_their_fingerprint_entries_exactly(lm, strategy):
    """Only the unread settings leave the fingerprint: every other entry, its name and value
    (defaults filled in), is what it was, so no cache entry of a used setting moves."""
    now, old = _strategy_part(lm, strategy=strategy)
    left_out = NOT_READ[strategy] | NEVER_READ_BY_LLADA
    assert now == {key: value for key, value in old.items() if key not in left_out}


@pytest.mark.parametrize(
    "decoder, reads, not_read",
    [
        ("entropy", "alpha", {"steps", "remasking", "threshold"}),
        ("confidence", "threshold", {"steps", "remasking", "alpha"}),
    ],
)
def test_the_decoder_decides_which_rule_settings_are_kept(lm, decoder, reads, not_read):
    now, old = _strategy_part(lm, strategy="single", decoder=decoder)
    left_out = (NOT_READ["single"] - {reads}) | not_read | NEVER_READ_BY_LLADA
    assert now == {key: value for key, value in old.items() if key not in left_out}


@pytest.mark.parametrize(
    "block_decoding, left_out",
    [
        (
            "threshold",
            {"editing_threshold", "max_post_steps", *DREAM_ONLY},
        ),  # LLaDA2.0: threshold, steps per block
        (
            "quality",
            {"steps", *DREAM_ONLY},
        ),  # LLaDA2.1: threshold, editing threshold and post-fill steps
    ],
)
def test_block_diffusion_keeps_its_rules_settings(lm, block_decoding, left_out):
    now, old = _strategy_part(lm, strategy="single", block_decoding=block_decoding)
    # the block rules read the threshold, not remasking
    left_out |= (NOT_READ["single"] - {"threshold"}) | {"remasking"}
    assert now == {key: value for key, value in old.items() if key not in left_out}


def test_every_setting_is_read_by_some_part_and_each_table_names_real_settings():
    """A new setting must be declared where it is read, or it would be reported as unused
    everywhere; a misspelt name in a table would leave the real setting unread."""
    names = {f.name for f in dataclasses.fields(StrategySettings)}
    tables = [strategies.READ_BY_STRATEGY, strategies.READ_BY_RULE, strategies.READ_BY_VOTE]
    declared = set(strategies.READ_BY_EVERY_DECODE).union(
        *(names_read for table in tables for names_read in table.values())
    )
    assert declared == names
    assert set(strategies.READ_BY_STRATEGY) == set(strategies.STRATEGIES)
    rules = set(strategies.DECODERS) | set(strategies.BLOCK_DECODINGS)
    assert set(strategies.READ_BY_RULE) == rules
    assert set(strategies.READ_BY_VOTE) == set(strategies.VOTES)


def test_combinations_that_cannot_run_are_still_refused(lm):
    for settings, says in [
        (dict(strategy="single", vote="temporal"), "vote=temporal does not apply"),
        (dict(strategy="hex", decoder="entropy"), "decoder=entropy does not apply"),
        (dict(strategy="dvoting", decoder="fixed"), "decoder=fixed does not apply"),
        (dict(strategy="single", guidance=-1.0), "guidance .* must be >= 0"),
    ]:
        with pytest.raises(ValueError, match=says):
            lm.use_strategy(**settings)
    lm.use_strategy("dvoting")


def test_hex_takes_a_block_length_that_divides_no_length_and_warns_it_unused(caplog):
    """hex reads no block_length (its own block sizes L/32..L/2), so the block rule (a block
    length divides L) is not applied to it: block_length=5 with L=64 runs, warned as unused;
    hex's own rule (L a multiple of 32) still refuses L=48, whatever the block length."""
    from lm_eval_dvoting.integration.request_planning import task_length

    with caplog.at_level(logging.WARNING):
        lm = LLaDAEvalModel(
            pretrained="tiny-arith", device="cpu", strategy="hex", block_length=5, max_gen_toks=64
        )
    [warned] = _unused_warnings(caplog)
    assert "block_length=5" in warned and "strategy=hex" in warned
    assert lm.settings.length_problem() is None
    # a task's own length, as each request carries it
    assert task_length(lm.settings, {"max_gen_toks": 64}, "t", 2048).gen_length == 64
    with pytest.raises(
        ValueError,
        match="hex needs a generation length divisible by 32.*got 48"
        ".*give a max_gen_toks divisible by 32",
    ):
        task_length(lm.settings, {"max_gen_toks": 48}, "t", 2048)
    with pytest.raises(ValueError, match="hex needs a generation length divisible by 32"):
        StrategySettings(strategy="hex", gen_length=40, block_length=5)
