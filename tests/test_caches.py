"""The cache policies (lm_eval_dvoting/core/decoding/caches.py): `prefix` and `dual` reuse what
a full pass kept, which must be exactly what the full pass computed (so the only
approximation is staleness), and `dual` runs over the current block alone."""

from __future__ import annotations

import pytest
import torch
from references import load_float32, recorded_pass_lengths
from scripted import ScriptedModel, gen_choices
from torch import nn

from lm_eval_dvoting.core.decoding import DecodeRow, generate
from lm_eval_dvoting.core.decoding.caches import ForwardPass
from lm_eval_dvoting.core.parts.rules.entropy import EntropyThreshold
from lm_eval_dvoting.core.strategies import StrategySettings

MASK = 250  # the official-tiny fixtures' mask id


_load = load_float32


@pytest.fixture(params=["llada_fixture", "dream_fixture"], ids=["llada", "dream"])
def model(request) -> nn.Module:
    return _load(str(request.getfixturevalue(request.param)))


def _row(
    prompt_length: int, gen_length: int, block_length: int, committed: int, cache: str, seed: int
) -> DecodeRow:
    """A fixed-schedule row whose first `committed` generation tokens are decoded already."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.full((gen_length,), MASK)
    tokens[:committed] = torch.randint(0, 240, (committed,), generator=g)
    return DecodeRow(
        prompt=torch.randint(0, 240, (prompt_length,), generator=g),
        tokens=tokens,
        block_length=block_length,
        steps=gen_length,
        cache=cache,
    )


def _rows(caches: list[str]) -> list[DecodeRow]:
    # prompts, generation lengths, block lengths and block starts all differ between rows
    shapes = [(5, 16, 4, 8), (9, 8, 2, 3), (3, 12, 4, 8), (7, 16, 8, 0)]
    return [
        _row(*shape, cache=cache, seed=k) for k, (shape, cache) in enumerate(zip(shapes, caches))
    ]


def _block(row: DecodeRow) -> list[int]:
    start = int((row.tokens == MASK).nonzero()[0]) // row.block_length * row.block_length
    return list(range(start, start + row.block_length))


@pytest.mark.parametrize(
    "caches",
    [["prefix"] * 4, ["dual"] * 4, ["dual", "prefix", "none", "dual"]],
    ids=["prefix", "dual", "mixed"],
)
def test_a_reuse_pass_over_unchanged_tokens_equals_the_full_pass(model, caches):
    """Nothing committed between the pass that kept the keys and values and the pass that
    reuses them: the block's logits must then be the full pass's (to float noise): right
    positions, masks, paddings and, for Dream, the prediction read one token to the left."""
    rows = _rows(caches)
    forward = ForwardPass(model, pad_id=MASK, device=torch.device("cpu"))
    starts = [_block(row)[0] for row in rows]
    full = forward.run(rows, starts, [True] * len(rows))
    assert all((row.kept is not None) == (row.cache != "none") for row in rows)
    again = forward.run(rows, starts, [True] * len(rows))
    for i, row in enumerate(rows):
        (expected,) = full.many([(i, _block(row))])
        (found,) = again.many([(i, _block(row))])
        torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-4)
        dual = row.cache == "dual"
        assert again.window(i) == ((starts[i], starts[i] + row.block_length) if dual else None)
        assert full.window(i) is None
        assert (row.kept.suffix_keys is not None) == dual if row.kept is not None else True


def test_the_exact_pass_agrees_with_the_cached_full_pass(model):
    """A cached row's full (recording) pass computes what the exact decoder computes."""
    exact_rows, cached_rows = _rows(["none"] * 4), _rows(["dual"] * 4)
    forward = ForwardPass(model, pad_id=MASK, device=torch.device("cpu"))
    starts = [_block(row)[0] for row in exact_rows]
    exact = forward.run(exact_rows, starts, [True] * 4)
    cached = forward.run(cached_rows, starts, [True] * 4)
    for i, row in enumerate(exact_rows):
        torch.testing.assert_close(
            cached.many([(i, _block(row))])[0], exact.many([(i, _block(row))])[0]
        )


@pytest.mark.parametrize("family", ["llada_fixture", "dream_fixture"])
def test_dual_cache_runs_over_the_block_alone_within_a_block(family, request):
    """Fixed schedule, 4 steps per block of 8: one full pass per block, then the block
    alone (Dream: and the token before it, which predicts the block's first position)."""
    model = load_float32(str(request.getfixturevalue(family)))
    prompt = torch.randint(0, 240, (1, 6), generator=torch.Generator().manual_seed(0))
    with recorded_pass_lengths(model) as lengths:
        result = generate(model, prompt, gen_length=16, block_length=8, steps=8, cache="dual")
    full, shift = 6 + 16, int(model.logits_shift)
    assert lengths == [full] + [8 + shift] * 3 + [full] + [8 + shift] * 3
    assert result.nfe.tolist() == [8]
    assert int((result.tokens == MASK).sum()) == 0


def test_entropy_rule_does_not_hand_over_outside_the_window():
    """Under the dual cache a reuse step has the block's logits only: a block completed
    there does not go on to the next block (the next step starts it with a full pass)."""
    rule = EntropyThreshold(mask_id=MASK)
    for window, goes_on in [((0, 2), False), (None, True)]:
        row = DecodeRow(
            prompt=torch.tensor([1, 2]),
            tokens=torch.full((4,), MASK),
            block_length=2,
            alpha=float("inf"),
        )
        work = rule.begin(0, row, window)
        assert work.wanted == [0, 1]
        work.receive(torch.randn(2, 251, generator=torch.Generator().manual_seed(1)))
        going_on = rule.commit([work])
        assert int((row.tokens[:2] == MASK).sum()) == 0  # alpha = inf commits the whole block
        assert [w.wanted for w in going_on] == ([[2, 3]] if goes_on else [])


def _demo(count: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    from lm_eval_dvoting.demo import arith
    from lm_eval_dvoting.models.loading import load_tokenizer

    tokenizer = load_tokenizer("tiny-arith")
    questions = [arith.format_prompt(p["question"]) for p in arith.read_test_set()[:count]]
    enc = tokenizer(questions, add_special_tokens=False, padding=True, return_tensors="pt")
    return _load("tiny-arith"), enc.input_ids, enc.attention_mask


@pytest.mark.parametrize(
    "rule", [dict(steps=32), dict(alpha=0.3, temperature=0.6)], ids=["fixed", "entropy"]
)
def test_dual_cache_stays_close_to_the_exact_decoder(rule):
    """An approximation: most demo outputs are unchanged, the fixed schedule's NFE is the
    same, and a row decodes to the same tokens alone or in a batch."""
    model, ids, mask = _demo(24)
    seeds = lambda: [torch.Generator().manual_seed(i) for i in range(24)]  # noqa: E731
    kwargs = dict(gen_length=32, block_length=8, **rule)
    exact = generate(model, ids, mask, generator=seeds(), **kwargs)
    dual = generate(model, ids, mask, generator=seeds(), cache="dual", **kwargs)
    same = sum(torch.equal(a, b) for a, b in zip(exact.tokens, dual.tokens))
    assert 18 <= same, f"only {same}/24 rows unchanged by the dual cache"
    if "steps" in rule:
        assert torch.equal(exact.nfe, dual.nfe)
    for i in (0, 7, 23):
        alone = generate(
            model,
            ids[i : i + 1],
            mask[i : i + 1],
            generator=[torch.Generator().manual_seed(i)],
            cache="dual",
            **kwargs,
        )
        assert torch.equal(alone.tokens[0], dual.tokens[i])


def test_bad_cache_settings_are_refused_before_any_model_work():
    scripted = ScriptedModel(gen_choices(2, lambda q, g: (1,)), vocab=8)
    with pytest.raises(
        ValueError, match=r"cache must be one of \('none', 'prefix', 'dual', 'block'\), got 'full'"
    ):
        generate(
            scripted, torch.tensor([[1, 2]]), gen_length=2, block_length=2, steps=2, cache="full"
        )
    with pytest.raises(
        ValueError, match=r"cache=dual .*needs one of this package's LLaDA/Dream models"
    ):
        generate(
            scripted, torch.tensor([[1, 2]]), gen_length=2, block_length=2, steps=2, cache="dual"
        )
    with pytest.raises(ValueError, match=r"cache must be one of .*got 'DUAL'"):
        StrategySettings(cache="DUAL")
    with pytest.raises(ValueError, match=r"prefix_cache=true and cache=dual disagree"):
        StrategySettings(cache="dual", prefix_cache=True)
    assert StrategySettings(prefix_cache=True).cache == "prefix"  # the older spelling
    assert StrategySettings(cache="prefix") == StrategySettings(prefix_cache=True)
