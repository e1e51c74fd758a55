"""Fast-dLLM's confidence-threshold decoder (`threshold`, decoder=confidence): the rule on a
scripted model, and token-for-token agreement with a transcription of Fast-dLLM's own
`generate(..., threshold=...)` at temperature 0."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from references import decoded_after_each_step, gumbel_max, load_float32, reference_logits
from scripted import ScriptedModel, gen_choices

from lm_eval_dvoting.core.decoding import DecodeRow, generate

_load = load_float32
_reference_logits = reference_logits


@torch.no_grad()
def reference_fast_dllm_generate(model, prompt, gen_length, block_length, threshold):
    """NVlabs Fast-dLLM's llada/generate.py `generate(..., threshold=...)` without a cache,
    one row, temperature 0, transcribed; changed only as docs/ALGORITHM.md asks (the mask
    token's logit is -inf before anything else)."""
    mask_id = model.mask_token_id
    x = torch.full((prompt.shape[0] + gen_length,), mask_id, dtype=torch.long)
    x[: prompt.shape[0]] = prompt
    nfe = 0
    for num_block in range(gen_length // block_length):
        start = prompt.shape[0] + num_block * block_length
        end = start + block_length
        while True:
            nfe += 1
            mask_index = x == mask_id
            logits = _reference_logits(model, x)
            mask_index[end:] = False
            x0 = torch.argmax(logits, dim=-1)
            p = F.softmax(logits, dim=-1)
            x0_p = torch.gather(p, -1, x0[:, None]).squeeze(-1)
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, torch.tensor(-math.inf, dtype=x0_p.dtype))
            count = int(mask_index.sum())
            _, select_index = torch.topk(confidence, k=count)
            transfer_index = torch.zeros_like(x0, dtype=torch.bool)
            transfer_index[select_index] = True
            for k in range(1, count):
                if confidence[select_index[k]] < threshold:
                    transfer_index[select_index[k]] = False
            x[transfer_index] = x0[transfer_index]
            if int((x[start:end] == mask_id).sum()) == 0:
                break
    return x[prompt.shape[0] :], nfe


@pytest.mark.parametrize("family", ["llada_fixture", "dream_fixture"])
@pytest.mark.parametrize(
    "threshold,gen_length,block_length", [(0.9, 16, 4), (0.3, 16, 16), (0.05, 12, 4)]
)
def test_confidence_rule_matches_fast_dllm(family, threshold, gen_length, block_length, request):
    model = _load(str(request.getfixturevalue(family)))
    prompts = [
        torch.randint(0, 240, (n,), generator=torch.Generator().manual_seed(n)) for n in (3, 6, 9)
    ]
    # batched with rows of other lengths: each row gets the tokens and passes it gets alone
    width = max(p.numel() for p in prompts)
    ids = torch.stack([F.pad(p, (width - p.numel(), 0)) for p in prompts])
    mask = torch.stack([F.pad(torch.ones_like(p), (width - p.numel(), 0)) for p in prompts])
    found = generate(
        model, ids, mask, gen_length=gen_length, block_length=block_length, threshold=threshold
    )
    for row, prompt in enumerate(prompts):
        expected, nfe = reference_fast_dllm_generate(
            model, prompt, gen_length, block_length, threshold
        )
        assert found.tokens[row].tolist() == expected.tolist()
        assert int(found.nfe[row]) == nfe


def test_the_fixtures_make_the_comparison_interesting(llada_fixture):
    """Steps commit several tokens at a low threshold and one at a high one."""
    model = _load(str(llada_fixture))
    prompt = torch.randint(0, 240, (6,), generator=torch.Generator().manual_seed(6))
    low = reference_fast_dllm_generate(model, prompt, 16, 4, 0.05)[1]
    high = reference_fast_dllm_generate(model, prompt, 16, 4, 0.9)[1]
    assert 4 <= low < high <= 16


def _history(
    model: ScriptedModel, gen_length: int, block_length: int, threshold: float
) -> list[list[int]]:
    """The decoded positions after each step, for the prompt [1, 1, 1]."""
    row = DecodeRow(
        prompt=torch.tensor([1, 1, 1]),
        tokens=torch.full((gen_length,), model.mask_token_id),
        block_length=block_length,
        threshold=threshold,
    )
    history = decoded_after_each_step(model, row)
    assert row.nfe == len(history)
    return history


def test_the_most_confident_position_always_commits_ties_to_the_leftmost():
    """Every position a two-way tie (probability exactly 0.5, the mask suppressed): below a
    0.9 threshold nothing else commits, so one token per step, left to right."""
    tie = ScriptedModel(gen_choices(3, lambda q, g: (0, 1)), vocab=3)
    assert _history(tie, 4, 4, 0.9) == [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3]]


def test_others_commit_at_or_above_the_threshold():
    """Ties have probability exactly 0.5: a threshold of 0.5 commits them all at once, one
    just above commits the certain positions only (and the best tie, leftmost)."""

    def region(q, g):
        return (0,) if g in (1, 3) else (0, 1)

    mixed = ScriptedModel(gen_choices(3, region), vocab=3)
    assert _history(mixed, 4, 4, 0.5) == [[0, 1, 2, 3]]
    assert _history(mixed, 4, 4, 0.5000001)[0] == [1, 3]  # certain ones; the top one is certain
    assert _history(mixed, 4, 4, 0.5000001)[1] == [0, 1, 3]  # then one tie per step, leftmost


def test_nothing_outside_the_current_block_commits():
    """All positions certain: each step completes its block, and the next block waits for
    the next step (Fast-dLLM's rule has no hand-over)."""
    certain = ScriptedModel(gen_choices(3, lambda q, g: (1 + g % 20,)))
    assert _history(certain, 12, 4, 0.9) == [[0, 1, 2, 3], list(range(8)), list(range(12))]


@pytest.mark.parametrize("threshold", [0.0, -0.1, 1.5, math.nan, math.inf])
def test_bad_thresholds_are_refused(threshold):
    model = ScriptedModel(gen_choices(1, lambda q, g: (1,)))
    with pytest.raises(ValueError, match=r"threshold must be in \(0, 1\], got"):
        generate(model, torch.tensor([[4]]), gen_length=2, block_length=2, threshold=threshold)


def test_exactly_one_rule():
    model = ScriptedModel(gen_choices(1, lambda q, g: (1,)))
    with pytest.raises(ValueError, match="exactly one of steps .*alpha .*threshold"):
        generate(model, torch.tensor([[4]]), gen_length=2, block_length=2, threshold=0.9, alpha=0.3)


@torch.no_grad()
def reference_sampled_confidence(
    model, prompt, gen_length, block_length, threshold, temperature, seed
):
    """The rule at temperature > 0 as the module docstring states it, one row, no cache:
    each step draws float64 uniform noise of shape (block_length, vocab) over the whole
    block from the row's generator, takes LLaDA's Gumbel-max candidate at the masked
    positions, and commits by the softmax probability of the un-noised logits."""
    generator = torch.Generator().manual_seed(seed)
    mask_id = model.mask_token_id
    x = torch.cat([prompt, torch.full((gen_length,), mask_id, dtype=torch.long)])
    for start in range(len(prompt), len(x), block_length):
        block = x[start : start + block_length]  # a view: commits land in x
        while bool((block == mask_id).any()):
            masked = block == mask_id
            logits = _reference_logits(model, x)[start : start + block_length][masked]
            noise = torch.rand(
                (block_length, logits.shape[-1]), dtype=torch.float64, generator=generator
            )[masked]
            chosen = gumbel_max(logits, noise, temperature)
            probability = F.softmax(logits, dim=-1).gather(-1, chosen[:, None]).squeeze(-1)
            commit = probability >= threshold
            commit[int(probability.argmax())] = True
            positions = masked.nonzero().squeeze(1)
            block[positions[commit]] = chosen[commit]
    return x[len(prompt) :]


@pytest.mark.parametrize("family", ["llada_fixture", "dream_fixture"])
def test_sampled_confidence_rule_draws_block_noise_from_each_rows_generator(family, request):
    """Temperature > 0: the tokens are those of the row's own seeded generator, the noise
    drawn over the whole block at every step (the fixed schedule's random stream), rows
    batched together each getting what they get alone."""
    model = _load(str(request.getfixturevalue(family)))
    prompts = [
        torch.randint(0, 240, (n,), generator=torch.Generator().manual_seed(n)) for n in (3, 6)
    ]
    ids = torch.stack([F.pad(p, (6 - p.numel(), 0)) for p in prompts])
    mask = torch.stack([F.pad(torch.ones_like(p), (6 - p.numel(), 0)) for p in prompts])
    generators = [torch.Generator().manual_seed(seed) for seed in (11, 12)]
    found = generate(
        model,
        ids,
        mask,
        gen_length=8,
        block_length=4,
        threshold=0.3,
        temperature=0.8,
        generator=generators,
    )
    expected = [
        reference_sampled_confidence(model, prompt, 8, 4, 0.3, 0.8, seed)
        for prompt, seed in zip(prompts, (11, 12))
    ]
    assert [row.tolist() for row in found.tokens] == [row.tolist() for row in expected]
    greedy = generate(model, ids, mask, gen_length=8, block_length=4, threshold=0.3).tokens
    assert not torch.equal(found.tokens, greedy)  # the sampling is seen
