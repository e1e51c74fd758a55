"""The parts of a decode, each declared once (`core/parts/`, `core/settings.py`): a new part
is one file that registers itself; settings are checked and model args read from the
declarations; combinations are refused from the parts' capabilities, not by name."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import textwrap

import pytest
import torch
from scripted import ScriptedModel, gen_choices

from lm_eval_dvoting.core import parts
from lm_eval_dvoting.core.parts.base import REGISTRY
from lm_eval_dvoting.core.settings import StrategySettings, unused_settings
from lm_eval_dvoting.core.strategies import run_strategy
from lm_eval_dvoting.integration.arg_parsing import parse_settings, setting_args

TOY_STRATEGY = '''
"""A toy strategy: `n` fresh samples, like majority, at temperature 0.25."""

from lm_eval_dvoting.core.parts.base import Strategy, register
from lm_eval_dvoting.core.parts.samples import fresh_sample


@register
class Toy(Strategy):
    name = "toy"
    order = 99
    reads = ("block_length", "n")
    temperature = 0.25

    @classmethod
    def plan(cls, settings, mask_id, same_answer):
        yield [fresh_sample(settings, mask_id) for _ in range(settings.n)]
'''

TOY_CACHE = '''
"""A toy cache policy that, like the dual cache, predicts only the current block."""

from lm_eval_dvoting.core.parts.base import CachePolicy, register


@register
class ToyCache(CachePolicy):
    name = "toycache"
    order = 99
    predicts_beyond_block = False
    whole_prediction_refusal = "toycache cannot serve {which}"
'''

TOY_NONE = '''
"""A toy cache policy: `none` under another name, recording each pass it runs."""

from lm_eval_dvoting.core.parts.base import register
from lm_eval_dvoting.core.parts.caches.none import NoCache


@register
class Mirror(NoCache):
    name = "mirror"
    order = 98
    passes = []  # the rows of each pass it ran

    @classmethod
    def run_pass(cls, forward, rows, members, starts, keeps, logits):
        cls.passes.append(list(members))
        super().run_pass(forward, rows, members, starts, keeps, logits)
'''

TOY_RULE = '''
"""A toy commit rule: each step commits the leftmost masked position, its argmax."""

from lm_eval_dvoting.core.decoding.rules import RowWork
from lm_eval_dvoting.core.decoding.state import masked_block, suppress_mask
from lm_eval_dvoting.core.parts.base import CommitRule, register


class LeftmostWorker:
    def __init__(self, mask_id):
        self.mask_id = mask_id

    def block_start(self, row):
        return masked_block(row.tokens.tolist(), self.mask_id, row.block_length)[0]

    def is_done(self, row):
        return False

    def begin(self, index, row, window):
        first = int((row.tokens == self.mask_id).nonzero()[0])
        return RowWork(index, row, wanted=[first])

    def commit(self, works):
        for work in works:
            best = suppress_mask(work.logits, self.mask_id).argmax(-1)
            work.row.tokens[work.wanted[0]] = best[0]
        return []


@register
class Leftmost(CommitRule):
    name = "leftmost"
    order = 99

    @classmethod
    def worker(cls, mask_id, end_ids):
        return LeftmostWorker(mask_id)
'''


@pytest.fixture
def toy_folder(tmp_path, monkeypatch):
    """A folder of parts on sys.path, discovered as `core/parts/__init__.py` discovers its
    own; the toy parts leave the registries afterwards."""
    folder = tmp_path / "toyparts"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "toy.py").write_text(textwrap.dedent(TOY_STRATEGY))
    (folder / "toycache.py").write_text(textwrap.dedent(TOY_CACHE))
    (folder / "leftmost.py").write_text(textwrap.dedent(TOY_RULE))
    (folder / "mirror.py").write_text(textwrap.dedent(TOY_NONE))
    monkeypatch.syspath_prepend(str(tmp_path))
    parts.discover("toyparts")
    yield folder
    REGISTRY["strategy"].pop("toy", None)
    REGISTRY["cache"].pop("toycache", None)
    REGISTRY["cache"].pop("mirror", None)
    REGISTRY["rule"].pop("leftmost", None)
    for name in [m for m in sys.modules if m == "toyparts" or m.startswith("toyparts.")]:
        del sys.modules[name]


def test_a_new_strategy_is_one_file_that_registers_itself_and_decodes(toy_folder):
    """Discovery registers the file's part; the settings accept it, take its defaults and
    derive what it reads; `run_strategy` decodes with its plan. (Planted: `discover` skipping
    the folder's modules, or the settings checking strategies against a fixed list.)"""
    assert parts.names("strategy")[-1] == "toy"
    settings = StrategySettings(strategy="toy", gen_length=8, n=3)
    assert settings.resolved_temperature == 0.25 and settings.resolved_vote == "plain"
    assert "tau" in unused_settings(settings) and "n" not in unused_settings(settings)
    model = ScriptedModel(gen_choices(2, lambda q, g: (3 + g % 4,)))
    prompts = torch.tensor([[5, 6]])
    (result,) = run_strategy(
        model, prompts, strategy="toy", extract=lambda t: int(t[0]), gen_length=8, n=3
    )
    assert len(result.samples) == 3 and result.answers == [3, 3, 3]


def _leftmost_model() -> ScriptedModel:
    """Generation index g scripted to token 3 + g % 4 (all near-certain)."""
    return ScriptedModel(gen_choices(2, lambda q, g: (3 + g % 4,)))


def test_a_new_commit_rule_is_one_file_that_the_row_batch_decodes_with(toy_folder):
    """The row batch takes a row's rule from the registry: a row naming `leftmost` commits
    exactly its leftmost mask per step, through `RowDecoder`, `generate` and `run_strategy`
    (`decoder=leftmost`). (Planted: `RowDecoder._commit` committing the built-in rules only,
    by a fixed list of names: the toy rows commit nothing and the step raises.)"""
    from lm_eval_dvoting.core.decoding import DecodeRow, RowDecoder, generate

    model, prompt = _leftmost_model(), torch.tensor([5, 6])
    row = DecodeRow(prompt=prompt, tokens=torch.full((8,), 31), block_length=4, rule="leftmost")
    decoder = RowDecoder(model)
    decoder.add(row)
    for step in range(1, 9):
        decoder.step()
        assert (row.tokens != 31).tolist() == [True] * step + [False] * (8 - step)
    assert not decoder.active and row.tokens.tolist() == [3 + g % 4 for g in range(8)]
    found = generate(model, prompt[None], gen_length=8, block_length=4, rule="leftmost")
    assert found.tokens.tolist() == [row.tokens.tolist()] and found.nfe.tolist() == [8]
    (result,) = run_strategy(
        model, prompt[None], strategy="single", decoder="leftmost", extract=list, gen_length=8
    )
    assert result.samples.tolist() == [row.tokens.tolist()] and result.nfe == 8


def test_a_new_cache_policy_is_one_file_whose_pass_the_forward_pass_runs(toy_folder, llada_fixture):
    """The forward pass takes a row's cache policy from the registry and runs its pass: a
    copy of `none` under another name decodes the tiny LLaDA to `none`'s tokens and NFE,
    its pass run once per step over all its rows. (Planted: `ForwardPass.run` choosing the
    pass by a fixed dict of the built-in names: KeyError; and running `none`'s pass for
    every policy that keeps nothing: no pass recorded.)"""
    from references import load_float32

    from lm_eval_dvoting.core.decoding import generate

    mirror = REGISTRY["cache"]["mirror"]
    model = load_float32(str(llada_fixture))
    prompts = torch.tensor([[5, 6, 7, 8], [250, 9, 10, 11]])  # row 2 left-padded by its mask
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    found = {
        cache: generate(
            model,
            prompts,
            mask,
            gen_length=8,
            block_length=4,
            steps=4,
            temperature=0.7,
            generator=[torch.Generator().manual_seed(s) for s in (1, 2)],
            cache=cache,
        )
        for cache in ("none", "mirror")
    }
    assert found["mirror"].tokens.tolist() == found["none"].tokens.tolist()
    assert found["mirror"].nfe.tolist() == found["none"].nfe.tolist() == [4, 4]
    assert mirror.passes == [[0, 1]] * 4


def test_a_row_naming_no_registered_rule_is_refused_before_any_pass(toy_folder):
    """(Planted: `_choose_rule` falling back to the confidence rule.)"""
    from lm_eval_dvoting.core.decoding import generate

    model = _leftmost_model()
    with pytest.raises(ValueError) as refused:
        generate(model, torch.tensor([[5, 6]]), gen_length=8, block_length=4, rule="leftmots")
    assert str(refused.value) == (
        "no commit rule decodes this row (rule='leftmots'): name one of ('fixed', 'entropy', "
        "'confidence', 'dream', 'threshold', 'quality', 'speed', 'leftmost') with the settings it "
        "reads, "
        "or give steps, alpha or threshold"
    )
    assert model.calls == []


@pytest.mark.parametrize("first", ["core.decoding", "core.parts", "core.parts.rules.fixed"])
def test_the_decoder_and_the_parts_import_in_any_order(first):
    """`core.parts` imports `decoding.state`, whose package's row batch reads the registry:
    each may be imported first in a fresh interpreter. (Planted: rows.py importing
    `core.parts` instead of `core.parts.registry`: ImportError when the parts come first.)"""
    import subprocess

    code = (
        f"import lm_eval_dvoting.{first}\n"
        "from lm_eval_dvoting.core.decoding import RowDecoder\n"
        "from lm_eval_dvoting.core.parts import names\n"
        "print(names('rule'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(
        ("fixed", "entropy", "confidence", "dream", "threshold", "quality", "speed")
    )


def test_a_strategy_that_is_not_registered_is_refused_with_the_registered_list():
    with pytest.raises(ValueError) as refused:
        StrategySettings(strategy="toy")
    assert str(refused.value) == (
        "strategy must be one of ('single', 'majority', 'hex', 'dvoting', 'temporal', 'rfg'), "
        "got 'toy'"
    )


def test_a_cache_that_predicts_only_its_block_is_refused_for_the_temporal_vote(toy_folder):
    """The refusal comes from the capabilities (`predicts_beyond_block`,
    `needs_whole_prediction`), so a new cache needs no new check. (Planted: the check
    naming cache=dual instead of reading the capability.)"""
    with pytest.raises(ValueError) as refused:
        StrategySettings(strategy="temporal", cache="toycache")
    assert str(refused.value) == "toycache cannot serve strategy=temporal"
    with pytest.raises(ValueError, match="toycache cannot serve vote=temporal"):
        StrategySettings(strategy="majority", vote="temporal", cache="toycache")
    StrategySettings(strategy="majority", cache="toycache")  # the plain vote needs no more


def test_every_declared_setting_is_a_model_arg_with_its_declared_default():
    """The harness's model args are built from the declarations: each setting (but the one
    the model name sets) is accepted with its default, and reaches its field parsed.
    (Planted: a setting left out of `setting_args`; a parser that drops the declared
    `allowed` text.)"""
    from lm_eval_dvoting.integration.harness import DVotingEvalModel, accepted_model_args

    accepted = accepted_model_args()
    declared = {f.name for f in dataclasses.fields(StrategySettings)} - {"block_decoding"}
    by_field = {d.name for d in setting_args().values()}
    assert by_field == declared and "max_gen_toks" in accepted and "gen_length" not in accepted
    for name, field in setting_args().items():
        expected = None if name == "cache" else field.default
        assert accepted[name] == expected, name
    signature = inspect.signature(DVotingEvalModel.__init__).parameters
    assert list(signature)[1:] == list(accepted)
    parsed = parse_settings({"n": "3", "alpha": "0.5", "prefix_cache": "true", "max_gen_toks": 64})
    assert (parsed["n"], parsed["alpha"], parsed["prefix_cache"]) == (3, 0.5, True)
    assert parsed["gen_length"] == 64 and parsed["cache"] is None and parsed["steps"] is None
    with pytest.raises(ValueError, match="hex_samples must be 25 or 5, got 7.5"):
        parse_settings({"hex_samples": 7.5})


@pytest.mark.parametrize(
    "strategy, vote, block_causal, cache",
    [
        ("dvoting", None, False, "none"),
        ("temporal", None, False, "none"),
        ("majority", None, True, "block"),
        ("temporal", None, True, "none"),
        ("majority", "temporal", True, "none"),
        ("majority", "plain", True, "block"),
    ],
)
def test_the_default_cache_is_the_model_kinds_unless_the_vote_needs_every_step(
    strategy, vote, block_causal, cache
):
    """One place decides it (planted: `default_cache` ignoring the vote's need)."""
    assert parts.default_cache(strategy, vote, block_causal) == cache
