"""LLaDA2's upstream `generate()` transcribed for batch size 1 (../shared/design/LLADA2_DECODING.md
sections 1 and 4, the hub code of LLaDA2.0 and LLaDA2.1), as the tests' reference:
the whole canvas, blocks aligned at the prompt's first token, a forward pass per step
over `x[:, :end of the current block]` with the block-causal mask cropped to it, no
cache. Deviations we make on purpose, and apply here too: temperature 0 is the argmax
(upstream 2.0 samples there), the mask token is never a candidate, the block-causal mask
in 2.1 (its hub mask loses it), and decoding stops after a block whose answer holds an
end token in 2.1 as in 2.0 (upstream 2.1 only with eos_early_stop; the answer, cut at the
first end token, is the same)."""

from __future__ import annotations

import math

import torch
from torch import nn


def _forward(model: nn.Module, x: torch.Tensor, block: int) -> torch.Tensor:
    """Float64 block-causal logits of one unpadded window (the model's block-causal mask is
    checked against upstream's own output in tests/test_models_moe.py)."""
    return model(x[None], block_lengths=torch.tensor([block]))[0].double()


def upstream_generate(
    model: nn.Module,
    prompt: list[int],
    gen_length: int,
    block: int,
    threshold: float = 0.95,
    steps: int | None = None,
    editing_threshold: float | None = None,
    max_post_steps: int = 16,
) -> tuple[list[int], int]:
    """(answer tokens, forward passes) of greedy LLaDA2.0 (`editing_threshold` None) or 2.1
    decoding."""
    mask, ends = model.mask_token_id, set(model.end_token_ids)
    total = -(-(len(prompt) + gen_length) // block) * block
    x = torch.full((total,), mask, dtype=torch.long)
    x[: len(prompt)] = torch.tensor(prompt)
    steps = min(
        steps or 32, gen_length
    )  # upstream's default steps=32, capped by min(steps, gen_length)
    base, extra = divmod(block, steps)
    quotas = [base + 1 if s < extra else base for s in range(steps)]
    passes = 0
    for b in range(len(prompt) // block, total // block):
        lo, hi = b * block, (b + 1) * block
        step, post = 0, 0
        while True:
            old = x[lo:hi].clone()
            masked = old == mask
            if editing_threshold is None and not masked.any():
                break
            if editing_threshold is not None:
                if not masked.any():
                    post += 1
                if post > max_post_steps:
                    break
            logits = _forward(model, x[:hi], block)
            logits = logits[lo:hi]
            logits[:, mask] = -math.inf
            cand = logits.argmax(-1)
            conf = torch.softmax(logits, -1).gather(-1, cand[:, None]).squeeze(-1)
            passes += 1
            hot = masked & (conf > threshold)
            quota = 1 if editing_threshold is not None else (quotas[step] if step < steps else 1)
            quota = min(quota, int(masked.sum()))
            if int(hot.sum()) < quota:
                ranked = conf.masked_fill(~masked, -math.inf).topk(quota).indices
                hot = torch.zeros_like(masked)
                hot[ranked] = True
            edit = torch.zeros_like(masked)
            if editing_threshold is not None:
                prompt_pos = torch.arange(lo, hi) < len(prompt)
                edit = ~masked & ~prompt_pos & (conf > editing_threshold) & (cand != old)
            new = old.clone()
            new[hot | edit] = cand[hot | edit]
            x[lo:hi] = new
            step += 1
            if editing_threshold is not None and not masked.any() and not edit.any():
                break
        answer = x[len(prompt) : hi].tolist()
        if any(t in ends for t in answer):
            break
    answer = x[len(prompt) : len(prompt) + gen_length].tolist()
    cut = next((k for k, t in enumerate(answer) if t in ends), None)
    return (answer if cut is None else answer[: cut + 1]), passes
