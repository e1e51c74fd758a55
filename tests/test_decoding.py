"""The one-sample decoder (issue 3): fidelity to LLaDA's generate() and to docs/ALGORITHM.md 1.4,
batch invariance, init_tokens, NFE, and argument errors.

The references below are written independently of `lm_eval_dvoting.core.decoding`: one
unpadded row, the full sequence through the model's plain `forward`, the whole
vocabulary at every position.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from references import (
    decoded_after_each_step,
    gumbel_max,
    load_float32,
    recorded_pass_lengths,
    reference_logits,
)
from scripted import ScriptedModel, gen_choices
from torch import nn

from lm_eval_dvoting.core.decoding import DecodeRow, generate

FAMILIES = ["llada_fixture", "dream_fixture"]
MASK = 250  # the fixtures' mask id


_load = load_float32


@pytest.fixture
def llada(llada_fixture: Path) -> nn.Module:
    return _load(str(llada_fixture))


@pytest.fixture(params=FAMILIES, ids=["llada", "dream"])
def model(request) -> nn.Module:
    return _load(str(request.getfixturevalue(request.param)))


def _prompt(length: int, seed: int) -> torch.Tensor:
    """Ordinary tokens (below the fixtures' special ids 240..250)."""
    return torch.randint(0, 240, (length,), generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------- references


_reference_logits = reference_logits


def _get_num_transfer_tokens(mask_index: torch.Tensor, steps: int) -> torch.Tensor:
    """LLaDA's get_num_transfer_tokens, verbatim (batch of rows)."""
    mask_num = mask_index.sum(dim=1, keepdim=True)
    base = mask_num // steps
    remainder = mask_num % steps
    num_transfer_tokens = torch.zeros(mask_num.size(0), steps, dtype=torch.int64) + base
    for i in range(mask_num.size(0)):
        num_transfer_tokens[i, : remainder[i]] += 1
    return num_transfer_tokens


@torch.no_grad()
def reference_llada_generate(model, prompt, steps, gen_length, block_length, mask_id):
    """LLaDA's original generate(): one row, temperature 0, low-confidence remasking.

    Transcribed from GSAI-ML/LLaDA generate.py; the only changes are the ones
    docs/ALGORITHM.md asks for: the mask logit is set to -inf first, and the
    confidence softmax is taken in float64 (as the decoder does; it decides only
    ties that float32 could not tell apart).
    """
    x = torch.full((1, prompt.shape[0] + gen_length), mask_id, dtype=torch.long)
    x[:, : prompt.shape[0]] = prompt.clone()
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    steps = steps // num_blocks
    nfe = 0
    for num_block in range(num_blocks):
        block_start = prompt.shape[0] + num_block * block_length
        block_mask_index = x[:, block_start : block_start + block_length] == mask_id
        num_transfer_tokens = _get_num_transfer_tokens(block_mask_index, steps)
        for i in range(steps):
            mask_index = x == mask_id
            logits = _reference_logits(model, x[0])[None]
            nfe += 1
            x0 = torch.argmax(logits, dim=-1)  # temperature 0: no Gumbel noise
            p = F.softmax(logits, dim=-1)
            x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
            x0_p[:, block_start + block_length :] = float("-inf")
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(
                mask_index, x0_p, torch.tensor(float("-inf"), dtype=x0_p.dtype)
            )
            transfer_index = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(confidence.shape[0]):
                _, select_index = torch.topk(confidence[j], k=int(num_transfer_tokens[j, i]))
                transfer_index[j, select_index] = True
            x[transfer_index] = x0[transfer_index]
    return x[0, prompt.shape[0] :], nfe


@torch.no_grad()
def reference_entropy_threshold(
    model, prompt, gen_length, block_length, alpha, init=None, temperature=0.0, seed=0
):
    """docs/ALGORITHM.md 1.4, entropy threshold, one row. What commits is decided on the
    un-noised logits' entropies; at temperature > 0 each committed position, in block
    order, then draws one float64 vocabulary row of uniform noise u from the row's
    generator (seeded `seed`) for LLaDA's Gumbel-max candidate."""
    generator = torch.Generator().manual_seed(seed)
    mask_id = model.mask_token_id
    start_of_gen = prompt.shape[0]
    region = torch.full((gen_length,), mask_id) if init is None else init.clone()
    x = torch.cat([prompt, region])
    nfe = 0
    commits_per_step = []
    while (x[start_of_gen:] == mask_id).any():
        logits = _reference_logits(model, x)
        nfe += 1
        candidates = logits.argmax(-1)
        p = logits.softmax(-1)
        entropy = -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(-1)
        fallback_used = False
        committed = 0
        while True:
            masked = (x[start_of_gen:] == mask_id).nonzero().flatten()
            if len(masked) == 0:
                break
            block = int(masked[0]) // block_length
            lo = start_of_gen + block * block_length
            hi = lo + block_length
            in_block = x[lo:hi] == mask_id
            chosen = in_block & (entropy[lo:hi] < alpha)
            if not chosen.any():
                if fallback_used:
                    break
                scores = torch.where(
                    in_block, entropy[lo:hi], torch.tensor(float("inf"), dtype=torch.float64)
                )
                chosen[int(scores.argmin())] = True
                fallback_used = True
            if temperature > 0:
                positions = lo + chosen.nonzero().squeeze(1)
                noise = torch.rand(
                    (len(positions), logits.shape[-1]), dtype=torch.float64, generator=generator
                )
                x[positions] = gumbel_max(logits[positions], noise, temperature)
            else:
                x[lo:hi][chosen] = candidates[lo:hi][chosen]
            committed += int(chosen.sum())
            if (x[lo:hi] == mask_id).any():
                break
        commits_per_step.append(committed)
    return x[start_of_gen:], nfe, commits_per_step


# --------------------------------------------------------------------- fidelity


@pytest.mark.parametrize(
    "gen_length, block_length, steps",
    [(16, 16, 16), (16, 16, 5), (16, 4, 8), (24, 8, 9), (32, 8, 12), (12, 12, 12)],
)
def test_fixed_schedule_matches_llada_generate(llada, gen_length, block_length, steps):
    for seed in (0, 1):
        prompt = _prompt(5 + 3 * seed, seed)
        expected, expected_nfe = reference_llada_generate(
            llada, prompt, steps, gen_length, block_length, MASK
        )
        result = generate(
            llada, prompt[None], gen_length=gen_length, block_length=block_length, steps=steps
        )
        assert result.tokens[0].tolist() == expected.tolist()
        assert int(result.nfe[0]) == expected_nfe == steps
        assert not (result.tokens == MASK).any()


@pytest.mark.parametrize("alpha", [0.3, 1.0, 0.0])
@pytest.mark.parametrize("gen_length, block_length", [(16, 4), (24, 8), (16, 16)])
def test_entropy_threshold_matches_reference(model, alpha, gen_length, block_length):
    for seed in (0, 1):
        prompt = _prompt(4 + 2 * seed, 10 + seed)
        expected, expected_nfe, _ = reference_entropy_threshold(
            model, prompt, gen_length, block_length, alpha
        )
        result = generate(
            model, prompt[None], gen_length=gen_length, block_length=block_length, alpha=alpha
        )
        assert result.tokens[0].tolist() == expected.tolist()
        assert int(result.nfe[0]) == expected_nfe
        assert not (result.tokens == MASK).any()


def test_entropy_reference_exercises_the_interesting_cases(model):
    """The fixtures are peaked enough that steps commit several tokens and cross blocks."""
    prompt = _prompt(6, 11)
    _, nfe, commits = reference_entropy_threshold(model, prompt, 24, 4, 1.0)
    assert max(commits) > 4  # a step that finished one block went on into the next
    assert nfe < 24


# --------------------------------------------------------------------- batch invariance


def _rows(count: int = 8) -> list[torch.Tensor]:
    return [_prompt(3 + (5 * k) % 11, 100 + k) for k in range(count)]


def _left_pad(prompts: list[torch.Tensor], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = p
        mask[i, width - len(p) :] = 1
    return ids, mask


def _generators(seeds: list[int]) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in seeds]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("rule", [{"steps": 8}, {"alpha": 0.3}], ids=["fixed", "entropy"])
def test_row_alone_equals_row_in_batch(model, rule, temperature):
    prompts = _rows()
    seeds = [1000 + k for k in range(len(prompts))]
    ids, mask = _left_pad(prompts, pad=17)  # a real token as padding: it must be masked out
    kwargs = dict(gen_length=16, block_length=4, temperature=temperature, **rule)
    batched = generate(model, ids, mask, generator=_generators(seeds), **kwargs)
    for k in (0, 3, 6):  # a short, a middle and the longest prompt
        alone = generate(model, prompts[k][None], generator=_generators([seeds[k]]), **kwargs)
        assert batched.tokens[k].tolist() == alone.tokens[0].tolist()
        assert int(batched.nfe[k]) == int(alone.nfe[0])
    if temperature > 0:
        # the noise matters: another seed gives another sample for some row
        other = generate(model, ids, mask, generator=_generators([s + 1 for s in seeds]), **kwargs)
        assert not torch.equal(other.tokens, batched.tokens)


# --------------------------------------------------------------------- init_tokens, NFE


@pytest.mark.parametrize("rule", [{"steps": 12}, {"alpha": 0.3}], ids=["fixed", "entropy"])
def test_init_tokens_stay_fixed(model, rule):
    prompts = _rows(3)
    ids, mask = _left_pad(prompts)
    init = torch.full((3, 12), MASK)
    generator = torch.Generator().manual_seed(5)
    fixed = torch.rand(3, 12, generator=generator) < 0.4
    fixed[:, -4:] = False  # the last block all masks (see the xfail test below for why)
    values = torch.randint(0, 240, (3, 12), generator=generator)
    init[fixed] = values[fixed]
    result = generate(
        model,
        ids,
        mask,
        gen_length=12,
        block_length=4,
        init_tokens=init,
        temperature=0.7,
        generator=_generators([1, 2, 3]),
        **rule,
    )
    assert torch.equal(result.tokens[fixed], values[fixed])
    assert not (result.tokens == MASK).any()
    if "steps" in rule:
        assert result.nfe.tolist() == [12, 12, 12]
    else:
        assert all(1 <= n <= int((~f).sum()) for n, f in zip(result.nfe.tolist(), fixed))


def test_init_tokens_entropy_matches_reference(model):
    prompt = _prompt(5, 21)
    init = torch.full((16,), MASK)
    init[[0, 1, 5, 9, 10, 11]] = torch.tensor([7, 8, 9, 10, 11, 12])
    expected, nfe, _ = reference_entropy_threshold(model, prompt, 16, 4, 0.3, init=init)
    result = generate(
        model, prompt[None], gen_length=16, block_length=4, alpha=0.3, init_tokens=init[None]
    )
    assert result.tokens[0].tolist() == expected.tolist()
    assert int(result.nfe[0]) == nfe


def test_fixed_schedule_nfe_counts_only_passes_with_masks_left(llada):
    """NFE is the forward passes during which the row still had masks (docs/ALGORITHM.md 1):
    once its last mask is committed a row leaves the batch, so a last block that starts
    with 3 masks for its 4 steps ([1, 1, 1, 0]) costs 7 passes, not LLaDA's 8, with the
    same tokens. Fresh rows always cost exactly `steps`."""
    init = torch.full((1, 8), MASK)
    init[0, 5] = 7  # last block (4..7): 3 masks for 4 steps
    result = generate(
        llada, _prompt(4, 0)[None], gen_length=8, block_length=4, steps=8, init_tokens=init
    )
    assert result.nfe.tolist() == [7]
    assert int(result.tokens[0, 5]) == 7


def test_fully_given_region_costs_nothing(llada):
    init = torch.randint(0, 240, (1, 8))
    result = generate(
        llada, _prompt(4, 0)[None], gen_length=8, block_length=4, alpha=0.3, init_tokens=init
    )
    assert torch.equal(result.tokens, init)
    assert result.nfe.tolist() == [0]


def test_fixed_schedule_nfe_is_steps_per_row(llada):
    ids, mask = _left_pad(_rows(4))
    for steps, block_length in [(16, 16), (8, 4), (32, 8)]:
        result = generate(llada, ids, mask, gen_length=32, block_length=block_length, steps=steps)
        assert result.nfe.tolist() == [steps] * 4


PEAKED = ScriptedModel(gen_choices(3, lambda q, g: (1 + g % 20,)))


def test_entropy_rule_commits_many_tokens_per_step_when_confident():
    model = ScriptedModel(gen_choices(3, lambda q, g: (1 + g % 20,)))
    result = generate(model, torch.tensor([[5, 6, 7]]), gen_length=16, block_length=4, alpha=0.3)
    assert result.tokens[0].tolist() == [1 + g % 20 for g in range(16)]
    # every position is certain: one step commits all four blocks
    assert result.nfe.tolist() == [1]
    assert len(model.calls) == 1


def test_entropy_rule_commits_one_token_per_step_when_none_is_below_alpha():
    model = ScriptedModel(gen_choices(3, lambda q, g: (1 + g % 20,)))
    result = generate(model, torch.tensor([[5, 6, 7]]), gen_length=16, block_length=4, alpha=0.0)
    assert result.tokens[0].tolist() == [1 + g % 20 for g in range(16)]
    assert result.nfe.tolist() == [16]  # the one-token fallback, once per step

    init = torch.full((1, 16), model.mask_token_id)
    init[0, :9] = 3
    result = generate(
        model, torch.tensor([[5, 6, 7]]), gen_length=16, block_length=4, alpha=0.0, init_tokens=init
    )
    assert result.nfe.tolist() == [7]  # one step per masked position
    assert result.tokens[0, :9].tolist() == [3] * 9


def test_entropy_rule_mixed_certainty():
    """Certain positions go together; uncertain ones (two-way ties, entropy ln 2) one per step."""
    uncertain = {2, 9}

    def region(q, g):
        return (1 + g, 25) if g in uncertain else (1 + g,)

    model = ScriptedModel(gen_choices(3, region))
    row = DecodeRow(
        prompt=torch.tensor([5, 6, 7]),
        tokens=torch.full((12,), model.mask_token_id),
        block_length=4,
        alpha=0.3,
    )
    history = decoded_after_each_step(model, row)
    # step 1: block 0's certain positions 0, 1, 3 (not 2); block 0 unfinished, stop there
    assert history[0] == [0, 1, 3]
    # step 2: nothing below alpha in block 0: the fallback commits position 2, block 0 is
    # complete, so the same logits go on: block 1 all certain (4..7), block 2's certain 8, 10, 11
    assert history[1] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11]
    # step 3: position 9 by the fallback
    assert history[2] == list(range(12)) and len(history) == 3
    assert row.nfe == 3


def test_fallback_at_most_once_per_step():
    """Every position uncertain: one token per step even across a block boundary."""
    model = ScriptedModel(gen_choices(1, lambda q, g: (1, 2)))
    result = generate(model, torch.tensor([[4]]), gen_length=8, block_length=1, alpha=0.3)
    assert result.nfe.tolist() == [8]
    assert result.tokens[0].tolist() == [1] * 8  # temperature 0: the smaller id of the tie


def test_mask_token_is_never_committed():
    # the scripted model predicts the mask token everywhere in the region (then a flat rest)
    model = ScriptedModel(lambda q, p: (31,) if p >= 2 else (0,))
    assert model.mask_token_id == 31
    for rule in ({"steps": 8}, {"alpha": 0.3}):
        result = generate(
            model,
            torch.tensor([[4, 5]]),
            gen_length=8,
            block_length=4,
            temperature=0.5,
            generator=torch.Generator().manual_seed(0),
            **rule,
        )
        assert not (result.tokens == model.mask_token_id).any()


def test_random_remasking_runs_and_is_seed_reproducible(llada):
    ids, mask = _left_pad(_rows(3))
    kwargs = dict(gen_length=16, block_length=8, steps=8, remasking="random", temperature=0.0)
    first = generate(llada, ids, mask, generator=_generators([1, 2, 3]), **kwargs)
    again = generate(llada, ids, mask, generator=_generators([1, 2, 3]), **kwargs)
    other = generate(llada, ids, mask, generator=_generators([4, 5, 6]), **kwargs)
    assert torch.equal(first.tokens, again.tokens)
    assert not (first.tokens == MASK).any()
    assert first.nfe.tolist() == [8, 8, 8]
    # the commit order is random: other seeds, other orders, other tokens somewhere
    assert not torch.equal(first.tokens, other.tokens)
    low_confidence = generate(llada, ids, mask, gen_length=16, block_length=8, steps=8)
    assert not torch.equal(first.tokens, low_confidence.tokens)


def test_gumbel_sampling_is_llada_float64():
    """Candidates at T > 0: argmax(exp(logits) / (-log u)^T) with u drawn in float64."""
    from lm_eval_dvoting.core.decoding.state import candidates as _candidates

    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for temperature in (0.3, 1.0):
        got = _candidates(logits, temperature, torch.Generator().manual_seed(42))
        u = torch.rand(
            logits.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(42)
        )
        expected = gumbel_max(logits, u, temperature)
        assert got.tolist() == expected.tolist()
        assert (got != logits.argmax(-1)).any()  # the noise does something
    assert _candidates(logits, 0.0, None).tolist() == logits.argmax(-1).tolist()


def test_shared_generator_is_used_in_row_order(llada):
    ids, mask = _left_pad(_rows(2))
    kwargs = dict(gen_length=8, block_length=4, alpha=0.3, temperature=1.0)
    a = generate(llada, ids, mask, generator=torch.Generator().manual_seed(9), **kwargs)
    b = generate(llada, ids, mask, generator=torch.Generator().manual_seed(9), **kwargs)
    assert torch.equal(a.tokens, b.tokens)


def test_dream_needs_a_prompt(dream_fixture):
    model = _load(str(dream_fixture))
    with pytest.raises(ValueError, match="prompt"):
        generate(
            model, torch.zeros((1, 0), dtype=torch.long), gen_length=4, block_length=4, alpha=0.3
        )


# --------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(gen_length=10, block_length=4, steps=10), r"block_length 4 .*divide gen_length 10"),
        (
            dict(gen_length=16, block_length=4, steps=6),
            r"steps 6 .*multiple of the number of blocks",
        ),
        (dict(gen_length=16, block_length=4, steps=8, alpha=0.3), "exactly one of steps"),
        (dict(gen_length=16, block_length=4), "exactly one of steps"),
        (dict(gen_length=16, block_length=4, alpha=-0.1), r"alpha must be >= 0"),
        (dict(gen_length=16, block_length=4, steps=4, temperature=-1.0), "temperature"),
        (dict(gen_length=16, block_length=4, steps=4, remasking="entropy"), "remasking"),
        (dict(gen_length=0, block_length=4, steps=4), "gen_length"),
    ],
)
def test_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(PEAKED, torch.tensor([[5, 6, 7]]), **kwargs)


def test_shape_errors():
    with pytest.raises(ValueError, match="init_tokens"):
        generate(
            PEAKED,
            torch.tensor([[5, 6, 7]]),
            gen_length=8,
            block_length=4,
            alpha=0.3,
            init_tokens=torch.full((1, 4), PEAKED.mask_token_id),
        )
    with pytest.raises(ValueError, match="generators"):
        generate(
            PEAKED,
            torch.tensor([[5, 6, 7]]),
            gen_length=8,
            block_length=4,
            alpha=0.3,
            generator=_generators([1, 2]),
        )
    with pytest.raises(ValueError, match="maximum length"):
        generate(
            ScriptedModel(PEAKED.choices, max_length=10),
            torch.tensor([[5, 6, 7]]),
            gen_length=8,
            block_length=4,
            alpha=0.3,
        )


# --------------------------------------------------------------------- prefix cache


def _demo_prompts(count: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    from lm_eval_dvoting.demo import arith
    from lm_eval_dvoting.models.loading import load_tokenizer

    tokenizer = load_tokenizer("tiny-arith")
    questions = [arith.format_prompt(p.question) for p in arith.held_out_sets()[1][:count]]
    enc = tokenizer(questions, add_special_tokens=False, padding=True, return_tensors="pt")
    return _load("tiny-arith"), enc.input_ids, enc.attention_mask


@pytest.mark.parametrize(
    "rule", [dict(steps=32), dict(alpha=0.3, temperature=0.6)], ids=["fixed", "entropy"]
)
def test_prefix_cache_stays_close_to_the_exact_decoder(rule):
    """An approximation: most demo answers are unchanged, the NFE is the same for the
    fixed schedule, and every row decodes to the same tokens alone or in a batch."""
    model, ids, mask = _demo_prompts(24)
    seeds = lambda: [torch.Generator().manual_seed(i) for i in range(24)]  # noqa: E731
    exact = generate(model, ids, mask, gen_length=32, block_length=2, generator=seeds(), **rule)
    cached = generate(
        model,
        ids,
        mask,
        gen_length=32,
        block_length=2,
        generator=seeds(),
        prefix_cache=True,
        **rule,
    )
    same = sum(torch.equal(a, b) for a, b in zip(exact.tokens, cached.tokens))
    assert same >= 18, f"only {same}/24 rows unchanged by the prefix cache"
    if "steps" in rule:
        assert torch.equal(exact.nfe, cached.nfe)
    for i in (0, 5, 23):  # alone == inside the batch (prefixes and suffixes padded)
        alone = generate(
            model,
            ids[i : i + 1],
            mask[i : i + 1],
            gen_length=32,
            block_length=2,
            generator=[torch.Generator().manual_seed(i)],
            prefix_cache=True,
            **rule,
        )
        assert torch.equal(alone.tokens[0], cached.tokens[i])


def test_prefix_cache_is_used_within_a_block():
    """With several steps per block, the block's later steps run over the suffix only."""
    model, ids, mask = _demo_prompts(4)
    with recorded_pass_lengths(model) as lengths:
        generate(model, ids, mask, gen_length=32, block_length=8, steps=32, prefix_cache=True)
    full = ids.shape[1] + 32
    assert lengths.count(full) == 4  # one full pass per block
    assert sorted(set(lengths) - {full}) == [8, 16, 24, 32]  # the block and what follows


def test_prefix_cache_needs_our_models():
    scripted = ScriptedModel(gen_choices(2, lambda q, g: (1,)), vocab=8)
    with pytest.raises(ValueError, match="prefix_cache"):
        generate(
            scripted,
            torch.tensor([[1, 2]]),
            gen_length=2,
            block_length=2,
            steps=2,
            prefix_cache=True,
        )


def test_a_surely_completed_block_hands_on_without_another_head_call(llada):
    """alpha = 0: every commit is the one-token fallback, so a block of 2 completes on its
    second step and the step goes on to the next block, where nothing may commit. The
    next block's logits come with the step's one head call; the tokens are unchanged."""
    calls = []
    original = llada.logits_from_hidden

    def spy(hidden):
        calls.append(hidden.shape[0])
        return original(hidden)

    ids, mask = _left_pad(_rows(1))
    llada.logits_from_hidden = spy
    try:
        result = generate(
            llada, ids, mask, gen_length=8, block_length=2, alpha=0.0, temperature=0.0
        )
    finally:
        del llada.logits_from_hidden
    assert int(result.nfe[0]) == 8  # one token per pass
    assert len(calls) == 8  # one head call per pass
    assert calls == [
        2,
        3,
        2,
        3,
        2,
        3,
        2,
        1,
    ]  # 2 masks; 1 mask + the next block's 2 ahead; ...; the last one
    reference = reference_entropy_threshold(llada, ids[0][mask[0].bool()], 8, 2, 0.0)
    assert result.tokens[0].tolist() == reference[0].tolist()


# ------------------------------------------------------------ sampling (temperature > 0)


@torch.no_grad()
def reference_sampled_fixed_schedule(
    model, prompt, gen_length, block_length, steps, temperature, seed
):
    """LLaDA's fixed schedule at temperature > 0, one row, low-confidence remasking, as the
    decoder documents it: each step draws float64 noise of shape (block_length, vocab) over
    the whole block from the row's generator, takes the Gumbel-max candidate at the masked
    positions, and commits the step's count of them by the un-noised softmax probability."""
    generator = torch.Generator().manual_seed(seed)
    mask_id, steps_per_block = model.mask_token_id, steps // (gen_length // block_length)
    x = torch.cat([prompt, torch.full((gen_length,), mask_id)])
    for lo in range(prompt.shape[0], len(x), block_length):
        counts = _get_num_transfer_tokens(
            (x[lo : lo + block_length] == mask_id)[None], steps_per_block
        )[0]
        for count in counts.tolist():
            masked = x[lo : lo + block_length] == mask_id
            logits = _reference_logits(model, x)[lo : lo + block_length]
            noise = torch.rand(
                (block_length, logits.shape[-1]), dtype=torch.float64, generator=generator
            )
            chosen = gumbel_max(logits, noise, temperature)
            probability = logits.softmax(-1).gather(-1, chosen[:, None]).squeeze(-1)
            confidence = torch.where(masked, probability, torch.tensor(float("-inf")).double())
            picked = lo + confidence.topk(count).indices
            x[picked] = chosen[picked - lo]
    return x[prompt.shape[0] :]


@pytest.mark.parametrize("rule", ["fixed", "entropy"])
def test_sampling_follows_each_rows_generator_as_documented(model, rule):
    """Temperature > 0 (majority voting's 0.9, dVoting's 0.6): each row's tokens are those
    of the documented noise from its own seeded generator, rows batched together."""
    prompts, seeds, temperature = _rows(2), [21, 22], 0.8
    ids, mask = _left_pad(prompts)
    settings = {"steps": 8} if rule == "fixed" else {"alpha": 0.3}
    found = generate(
        model,
        ids,
        mask,
        gen_length=8,
        block_length=4,
        temperature=temperature,
        generator=_generators(seeds),
        **settings,
    )
    for row, (prompt, seed) in enumerate(zip(prompts, seeds)):
        if rule == "fixed":
            expected = reference_sampled_fixed_schedule(model, prompt, 8, 4, 8, temperature, seed)
        else:
            expected = reference_entropy_threshold(
                model, prompt, 8, 4, 0.3, temperature=temperature, seed=seed
            )[0]
        assert found.tokens[row].tolist() == expected.tolist()
    assert not torch.equal(
        found.tokens, generate(model, ids, mask, gen_length=8, block_length=4, **settings).tokens
    )


# ------------------------------------------------------------ progress guard (issue 38)


def _commits_nothing(rule: str, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Break one commit rule so that it commits nothing; the row settings that select it."""
    from lm_eval_dvoting.core.parts.rules.confidence import ConfidenceThreshold
    from lm_eval_dvoting.core.parts.rules.entropy import EntropyThreshold

    if rule == "entropy":  # nothing below alpha, and no fallback
        nothing = staticmethod(lambda work, entropies: [])
        monkeypatch.setattr(EntropyThreshold, "_decide", nothing)
        return {"alpha": 0.3}
    monkeypatch.setattr(ConfidenceThreshold, "commit", lambda self, works: [])
    return {"threshold": 0.9}


@pytest.mark.parametrize("rule", ["entropy", "confidence"])
def test_a_rule_that_commits_nothing_in_a_step_raises_at_once(rule, monkeypatch):
    """A rule that commits nothing and moves no schedule on would decode its row forever (the
    row batch and the strategies' scheduler step it again and again): the step raises,
    naming the rule, the step and the row. A row beside it that progresses is no excuse."""
    from lm_eval_dvoting.core.decoding import RowDecoder

    settings = _commits_nothing(rule, monkeypatch)
    model = ScriptedModel(gen_choices(3, lambda q, g: (1 + g % 20,)))
    decoder = RowDecoder(model)
    masks = torch.full((8,), model.mask_token_id)
    decoder.add(DecodeRow(prompt=torch.tensor([5, 6, 7]), tokens=masks, block_length=4, steps=8))
    decoder.add(
        DecodeRow(
            prompt=torch.tensor([5, 6, 7]),
            tokens=masks,
            block_length=4,
            label="question 3, sample 2",
            **settings,
        )
    )
    name = {
        "entropy": r"EntropyThreshold \(alpha=0.3\)",
        "confidence": r"ConfidenceThreshold \(threshold=0.9\)",
    }[rule]
    says = (
        rf"commit rule {name} committed nothing in step 1 of row 1 \(question 3, sample 2\): "
        r"8 of its 8 generated positions are still masked, .*would decode it forever"
    )
    with pytest.raises(RuntimeError, match=says):
        decoder.step()


def test_steps_that_commit_nothing_by_schedule_are_progress():
    """The fixed schedule spends a block's steps on it even when the block holds no mask (given
    tokens): those steps commit nothing by design and move the schedule on, so the guard lets
    them be (block diffusion's steps always move its schedule on too:
    tests/test_block_diffusion.py)."""
    model = ScriptedModel(gen_choices(3, lambda q, g: (1 + g % 20,)))
    init = torch.full((1, 8), model.mask_token_id)
    init[0, :4] = 4  # the first block given: its four steps commit nothing
    result = generate(
        model, torch.tensor([[5, 6, 7]]), gen_length=8, block_length=4, steps=8, init_tokens=init
    )
    assert result.nfe.tolist() == [8] and result.tokens[0].tolist() == [4, 4, 4, 4, 5, 6, 7, 8]
