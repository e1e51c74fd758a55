"""Top-p / top-k (decoding/sampling.py) in every rule, and the settings of `decoder=dream`.

Dream's own algorithms are checked against a transcription of Dream's file in
test_dream_rule.py; here: the filters' semantics worked out by hand, the LLaDA-style rules
drawing from the filtered distribution, and the model args that choose them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from references import gumbel_max, load_float32

from lm_eval_dvoting.core.decoding import generate
from lm_eval_dvoting.core.decoding.sampling import filtered, top_k_filter, top_p_filter
from lm_eval_dvoting.core.decoding.state import candidates
from lm_eval_dvoting.core.settings import StrategySettings, used_settings

LOW = torch.finfo(torch.float64).min


def _logits(*probabilities: float) -> torch.Tensor:
    return torch.tensor([[math.log(p) for p in probabilities]], dtype=torch.float64)


def _kept(logits: torch.Tensor) -> list[int]:
    return (logits[0] != LOW).nonzero().flatten().tolist()


def test_top_p_keeps_the_token_that_crosses_it_and_always_the_first():
    """(Planted: no shift of the removal by one, so the crossing token goes too.)"""
    logits = _logits(0.5, 0.3, 0.15, 0.05)
    assert _kept(top_p_filter(logits, 0.7)) == [0, 1]  # 0.5 < 0.7 < 0.8: token 1 crosses
    assert _kept(top_p_filter(logits, 0.5)) == [0, 1]  # 0.5 is not above 0.5: 1 crosses
    assert _kept(top_p_filter(logits, 0.4)) == [0]  # the first crosses at once
    assert _kept(top_p_filter(logits, 0.99)) == [0, 1, 2, 3]
    assert _kept(top_p_filter(_logits(0.1, 0.9), 0.5)) == [1]  # by probability, not position


def test_top_k_keeps_ties_at_the_boundary():
    logits = torch.tensor([[3.0, 2.0, 2.0, 1.0]], dtype=torch.float64)
    assert _kept(top_k_filter(logits, 2)) == [0, 1, 2]
    assert _kept(top_k_filter(logits, 1)) == [0]
    assert _kept(top_k_filter(logits, 10)) == [0, 1, 2, 3]


def test_the_order_of_the_filters_is_dreams_unless_asked_otherwise():
    """Dream: top-p, then top-k; LLaDA2's sampler: top-k, then top-p (the renormalized top-2
    puts 0.53 on the first token, above top_p=0.5)."""
    logits = _logits(0.4, 0.35, 0.25)
    assert _kept(filtered(logits, 0.5, 2)) == [0, 1]
    assert _kept(filtered(logits, 0.5, 2, top_k_first=True)) == [0]
    assert filtered(logits, 1.0, None) is logits  # top_p=1 and no top_k: off


def _removed_by_hand(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Top-p over softmax(logits / T), written out position by position."""
    removed = torch.zeros_like(logits, dtype=torch.bool)
    for row in range(logits.shape[0]):
        probabilities = torch.softmax(logits[row] / temperature, -1).tolist()
        order = sorted(range(len(probabilities)), key=lambda v: -probabilities[v])
        total = 0.0
        for rank, token in enumerate(order):
            if rank > 0 and total > top_p:
                removed[row, token] = True
            total += probabilities[token]
    return removed


def test_candidates_draw_from_the_filtered_tempered_distribution():
    """LLaDA's Gumbel-max over the tokens top-p keeps at T (Planted: the filter taken on the
    untempered logits; no filter at all.)"""
    logits = torch.randn(64, 30, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    temperature, top_p = 0.5, 0.6
    got = candidates(logits, temperature, torch.Generator().manual_seed(7), top_p=top_p)
    noise = torch.rand(
        logits.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7)
    )
    kept = logits.masked_fill(_removed_by_hand(logits, temperature, top_p), float("-inf"))
    assert got.tolist() == gumbel_max(kept, noise, temperature).tolist()
    assert got.tolist() != gumbel_max(logits, noise, temperature).tolist()  # the filter bites


@pytest.mark.parametrize("rule", [dict(steps=8), dict(alpha=0.3), dict(threshold=0.9)], ids=str)
def test_top_k_1_makes_a_sampling_rule_greedy(llada_fixture: Path, rule: dict):
    """At T = 1 with top_k=1 every draw is the argmax, so the tokens are the greedy decode's
    (the rules' confidences and entropies are the unfiltered logits', as at T = 0).
    (Planted: top_k dropped in the entropy rule's or the fixed schedule's candidates.)"""
    model = load_float32(str(llada_fixture))
    prompts = torch.tensor([[3, 17, 40, 9, 21], [8, 8, 30, 2, 11]])
    common = dict(gen_length=16, block_length=8, **rule)
    greedy = generate(model, prompts, temperature=0.0, **common).tokens
    seeded = [torch.Generator().manual_seed(i) for i in range(2)]
    top1 = generate(model, prompts, temperature=1.0, top_k=1, generator=seeded, **common).tokens
    sampled = generate(model, prompts, temperature=1.0, generator=seeded, **common).tokens
    assert top1.tolist() == greedy.tolist()
    assert sampled.tolist() != greedy.tolist()  # without the filter, T = 1 samples


@pytest.mark.parametrize(
    "given, says",
    [
        (dict(top_p=0.0), "top_p must be in (0, 1], got 0.0"),
        (dict(top_p=1.5), "top_p must be in (0, 1], got 1.5"),
        (dict(top_k=0), "top_k must be >= 1, got 0"),
        (dict(alg="greedy"), "alg must be one of ('origin', 'maskgit_plus', 'topk_margin', "),
        (dict(eps=1.0), "eps must be in (0, 1), got 1.0"),
        (dict(alg_temp=-0.5), "alg_temp must be >= 0, got -0.5"),
    ],
    ids=str,
)
def test_dream_and_filter_settings_are_refused_with_their_name(given: dict, says: str):
    with pytest.raises(ValueError) as refused:
        StrategySettings(strategy="single", decoder="dream", gen_length=64, **given)
    assert says in str(refused.value)


def test_decoder_dream_defaults_are_the_model_cards_whole_answer_schedule():
    """steps = L and one block of L, for every strategy; a block length given runs Dream's
    schedule per block. (Planted: the strategy's L/16 block or L/2 steps.)"""
    for strategy in ("single", "majority", "dvoting", "temporal"):
        settings = StrategySettings(strategy=strategy, decoder="dream", gen_length=64)
        assert (settings.resolved_steps, settings.resolved_block_length) == (64, 64)
        assert settings.steps_run == 64
    blocks = StrategySettings(strategy="single", decoder="dream", gen_length=64, block_length=16)
    assert (blocks.resolved_steps, blocks.resolved_block_length, blocks.steps_run) == (64, 16, 64)
    assert StrategySettings(strategy="single", gen_length=64).resolved_block_length == 4


def test_dreams_settings_are_read_by_decoder_dream_only():
    """alg/alg_temp/eps are used (reported, fingerprinted) with decoder=dream only; top_p
    and top_k by every rule."""
    dream = used_settings(StrategySettings(strategy="single", decoder="dream", gen_length=64))
    fixed = used_settings(StrategySettings(strategy="single", gen_length=64))
    assert {"alg", "alg_temp", "eps", "top_p", "top_k"} <= set(dream)
    assert not {"alg", "alg_temp", "eps"} & set(fixed)
    assert {"top_p", "top_k"} <= set(fixed)


def test_compare_single_dream_row_is_the_model_card():
    from lm_eval_dvoting.commands.compare import row_overrides

    base = StrategySettings(strategy="dvoting", gen_length=64)
    strategy, overrides = row_overrides("single-dream", base)
    assert strategy == "single"
    assert overrides == dict(
        decoder="dream", alg="entropy", alg_temp=0.0, temperature=0.2, top_p=0.95
    )


def test_dreams_model_args_reach_their_settings_through_the_harness():
    """`--model_args` text, parsed by each setting's declared parser. (Planted: alg_temp
    parsed as a whole number.)"""
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    lm = LLaDAEvalModel.create_from_arg_string(
        "pretrained=tiny-arith-dream,strategy=single,decoder=dream,alg=origin,alg_temp=0.5,"
        "eps=0.01,top_p=0.9,top_k=5",
        {"device": "cpu"},
    )
    got = {
        name: getattr(lm.settings, name) for name in ("alg", "alg_temp", "eps", "top_p", "top_k")
    }
    assert got == dict(alg="origin", alg_temp=0.5, eps=0.01, top_p=0.9, top_k=5)
    assert lm.settings.resolved_decoder == "dream"
