"""The reference "before": one decoding step done over the whole sequence, as the release does.

The authors' release (built on LLaDA's `generate.py`) takes the full logits
(batch, prompt + generation, vocabulary), converts *all* of them to float64, draws
Gumbel noise for all of them, takes the float64 softmax (and, for dVoting's rule, the
entropy) at every position, and only then throws away everything outside the current
block. This module reproduces that work so that `bench/run.py` can time it against
`RowDecoder.step`, which runs the output head and all float64 work only at the
masked positions of the committable block. It is a benchmark reference, not a decoder
the package uses; its commits follow the same rules as `lm_eval_dvoting.core.decoding`.
"""

from __future__ import annotations

import torch


def add_gumbel_noise(
    logits: torch.Tensor, temperature: float, generator: torch.Generator | None
) -> torch.Tensor:
    """LLaDA's float64 Gumbel-max transform of the whole logits tensor."""
    if temperature == 0:
        return logits
    logits = logits.to(torch.float64)
    noise = torch.rand(logits.shape, dtype=torch.float64, device=logits.device, generator=generator)
    gumbel_noise = (-torch.log(noise)) ** temperature
    return logits.exp() / gumbel_noise


@torch.no_grad()
def naive_entropy_step(
    logits: torch.Tensor,
    x: torch.Tensor,
    mask_id: int,
    block_start: int,
    block_end: int,
    alpha: float,
    temperature: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """dVoting's entropy-threshold commit for one step, computed over the whole sequence.

    `logits` (batch, length, vocab) float32, `x` (batch, length) ids, updated in place;
    `block_start`/`block_end` are sequence columns of the current block.
    """
    logits = logits.clone()
    logits[..., mask_id] = float("-inf")
    x0 = torch.argmax(add_gumbel_noise(logits, temperature, generator), dim=-1)
    log_p = torch.log_softmax(logits.to(torch.float64), dim=-1)
    p = log_p.exp()
    entropy = -torch.where(p > 0, p * log_p, torch.zeros_like(p)).sum(-1)
    mask_index = x == mask_id
    in_block = torch.zeros_like(mask_index)
    in_block[:, block_start:block_end] = True
    entropy = torch.where(mask_index & in_block, entropy, torch.full_like(entropy, float("inf")))
    x0 = torch.where(mask_index, x0, x)
    commit = entropy < alpha
    for row in range(x.shape[0]):
        if not commit[row].any() and mask_index[row, block_start:block_end].any():
            commit[row, entropy[row].argmin()] = True
    x[commit] = x0[commit]
    return x


@torch.no_grad()
def naive_fixed_step(
    logits: torch.Tensor,
    x: torch.Tensor,
    mask_id: int,
    block_end: int,
    commit_count: int,
    temperature: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """LLaDA's low-confidence remasking step (majority / HEX), over the whole sequence."""
    logits = logits.clone()
    logits[..., mask_id] = float("-inf")
    x0 = torch.argmax(add_gumbel_noise(logits, temperature, generator), dim=-1)
    p = torch.softmax(logits.to(torch.float64), dim=-1)
    x0_p = torch.gather(p, dim=-1, index=x0.unsqueeze(-1)).squeeze(-1)
    x0_p[:, block_end:] = float("-inf")
    mask_index = x == mask_id
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, x0_p, torch.full_like(x0_p, float("-inf")))
    transfer = torch.zeros_like(x0, dtype=torch.bool)
    for row in range(confidence.shape[0]):
        transfer[row, torch.topk(confidence[row], k=commit_count).indices] = True
    x[transfer] = x0[transfer]
    return x
