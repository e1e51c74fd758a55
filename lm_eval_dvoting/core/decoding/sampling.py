"""Sampling filters and Dream's sampling arithmetic, shared by every commit rule.

`top_p_filter` and `top_k_filter` are Dream-v0's `top_p_logits` / `top_k_logits`
(generation_utils.py of Dream-v0-Instruct-7B) to the letter: removed entries get the dtype's
most negative finite value, so their softmax is 0. `filtered` applies them in Dream's order
(top-p, then top-k) to logits already divided by the temperature (`tempered`).

The LLaDA-style rules (fixed, entropy, confidence) and block diffusion draw their candidate
from the filtered distribution at temperature > 0 (`removed_by_filters` says which tokens
are out); at temperature 0 the argmax is always kept, so the filters change nothing there.
Dream's rule (`decoder=dream`, core/parts/rules/dream.py) reads its confidences from the
filtered distribution too, at every temperature, as Dream's `sample_tokens` does.

This module imports nothing from the decoder (it sits below `state.py`).
"""

from __future__ import annotations

import torch

# Dream's `alg`: which confidence orders the masked positions (origin: none, a coin per position)
DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest prefix of the sorted distribution whose cumulative probability
    exceeds `top_p` (the most likely token always); the rest get finfo(dtype).min."""
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    cumulative = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
    remove_sorted = cumulative > top_p
    # shifted right by one: the token that crosses top_p is kept, and the first always
    remove_sorted[..., 1:] = remove_sorted[..., :-1].clone()
    remove_sorted[..., 0] = False
    remove = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, sorted_indices, remove_sorted)
    return logits.masked_fill(remove, torch.finfo(logits.dtype).min)


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep every token at least as likely as the `top_k`-th (ties at the boundary all
    stay); the rest get finfo(dtype).min."""
    top_k = min(top_k, logits.size(-1))
    kth = torch.topk(logits, top_k)[0][..., -1, None]
    return logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Logits divided by the temperature when it is above 0 (Dream's `sample_tokens`)."""
    return logits / temperature if temperature > 0 else logits


def filtered(
    logits: torch.Tensor, top_p: float | None, top_k: int | None, top_k_first: bool = False
) -> torch.Tensor:
    """Top-p (when given and below 1), then top-k (when given), as Dream applies them;
    `top_k_first`: top-k, then top-p, as LLaDA2's upstream sampler applies them."""
    if top_k is not None and top_k_first:
        logits = top_k_filter(logits, top_k)
    if top_p is not None and top_p < 1:
        logits = top_p_filter(logits, top_p)
    if top_k is not None and not top_k_first:
        logits = top_k_filter(logits, top_k)
    return logits


def filters_active(top_p: float | None, top_k: int | None) -> bool:
    """Whether `filtered` would change anything."""
    return (top_p is not None and top_p < 1) or top_k is not None


def removed_by_filters(
    logits: torch.Tensor, temperature: float, top_p: float | None, top_k: int | None
) -> torch.Tensor | None:
    """The tokens top-p/top-k remove from the distribution at `temperature` (bool, the
    logits' shape), or None when no filter is on."""
    if not filters_active(top_p, top_k):
        return None
    kept = filtered(tempered(logits, temperature), top_p, top_k)
    return kept == torch.finfo(kept.dtype).min


def gumbel_argmax(logits: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """A draw from softmax(logits) per row: argmax(logits - log(-log u)) for uniform
    float64 noise u of the logits' shape (log space: no overflow at small temperatures)."""
    return (logits - torch.log(-torch.log(noise))).argmax(-1)
