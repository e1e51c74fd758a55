"""References for `decoder=dream` (issue 40), written independently of the decoder.

1. `dream_generate`: Dream-v0-Instruct-7B's own sampling, transcribed from the checkpoint's
   `generation_utils.py` (`top_p_logits`, `top_k_logits`, `sample_tokens` and the step loop
   of `DreamGenerationMixin._sample`; checked against two vendored copies of the file). The
   order of operations, the float32 arithmetic of the model's logits, the timesteps, the
   batch-averaged `num_mask_token` and `torch.topk` over the whole row are the file's. Two
   deviations, and only these:
   (a) the mask token's logit is set to -inf right after the model call (ALGORITHM.md 1.1;
       `suppress_mask=False` gives the file's own reading, to see whether it matters);
   (b) the model call is our fixture model's `forward` (raw logits, no padding: the file's
       `attention_mask="full"`, `tok_idx=None`) followed by Dream's shift, as the file does.
   At temperature > 0 (and for `alg="origin"`, and `alg_temp > 0`) the file draws from
   torch's global generator, so only its temperature-0, `alg_temp=0` paths are compared
   token for token with the decoder.

2. `documented_dream`: the decoder's documented random streams (dream-api.md and the
   brief of issue 40), one row, any block length, written out step by step so the noise
   tests compare tokens exactly: every draw comes from the row's `torch.Generator` in the
   order documented at `documented_dream`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributions as dists
import torch.nn.functional as F
from references import gumbel_max, reference_logits
from torch import nn

ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")

# ------------------------------------------------------ 1. Dream's file, transcribed


def top_p_logits(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The file's nucleus filter: keep the smallest sorted prefix whose cumulative
    probability exceeds `top_p` (the top token always); the rest to the dtype's finfo.min."""
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    cumulative_probs = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    sorted_indices_to_remove = cumulative_probs > top_p
    # one to the right: the token that crosses top_p stays
    sorted_indices_to_remove[..., 1:] = sorted_indices_to_remove[..., :-1].clone()
    sorted_indices_to_remove[..., 0] = 0
    mask = torch.zeros_like(logits, dtype=torch.bool, device=logits.device)
    mask = mask.scatter_(-1, sorted_indices, sorted_indices_to_remove)
    return logits.masked_fill(mask, torch.finfo(logits.dtype).min)


def top_k_logits(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """The file's top-k filter: entries below the k-th largest go to finfo.min (ties with
    the k-th all stay)."""
    top_k = min(top_k, logits.size(-1))
    indices_to_remove = logits < torch.topk(logits, top_k)[0][..., -1, None]
    return logits.masked_fill(indices_to_remove, torch.finfo(logits.dtype).min)


def sample_tokens(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_p: float | None = None,
    top_k: int | None = None,
    margin_confidence: bool = False,
    neg_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The file's `sample_tokens`: (confidence, candidate) per row of `logits`."""
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        logits = top_p_logits(logits, top_p)
    if top_k is not None:
        logits = top_k_logits(logits, top_k)
    probs = torch.softmax(logits, dim=-1)
    if temperature > 0:
        try:  # the file falls back to the argmax when Categorical refuses the row
            x0 = dists.Categorical(probs=probs).sample()
            confidence = torch.gather(probs, -1, x0.unsqueeze(-1)).squeeze(-1)
        except Exception:
            confidence, x0 = probs.max(dim=-1)
    else:
        confidence, x0 = probs.max(dim=-1)
    if margin_confidence:
        sorted_probs, _ = torch.sort(probs, dim=-1, descending=True)
        confidence = sorted_probs[:, 0] - sorted_probs[:, 1]
    if neg_entropy:
        epsilon = 1e-10
        log_probs = torch.log(probs + epsilon)
        confidence = torch.sum(probs * log_probs, dim=-1)
    return confidence, x0


@dataclass(frozen=True)
class DreamSampling:
    """The generation config fields `_sample` reads (the file's names and defaults, but
    `alg`: the file's default is origin, ours entropy)."""

    steps: int
    eps: float = 1e-3
    alg: str = "entropy"
    alg_temp: float | None = None
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None


def _shifted_logits(model: nn.Module, x: torch.Tensor, suppress_mask: bool) -> torch.Tensor:
    """Deviation (b): our model's raw logits, then the file's shift
    `cat([logits[:, :1], logits[:, :-1]])`; deviation (a): the mask token's logit -inf."""
    logits = model(x)
    logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    if suppress_mask:
        logits = logits.clone()
        logits[..., model.mask_token_id] = float("-inf")
    return logits


def _origin_step(x, mask_index, mask_logits, i, t, s, cfg: DreamSampling, mask_id) -> None:
    """`alg == 'origin'`: each masked position commits with probability 1 - s/t (global
    generator, as the file)."""
    p_transfer = 1 - s / t if i < cfg.steps - 1 else 1
    x0 = torch.zeros_like(x[mask_index], dtype=torch.long) + mask_id
    transfer_index_t_s = torch.rand(*x0.shape) < p_transfer
    _, x0[transfer_index_t_s] = sample_tokens(
        mask_logits[transfer_index_t_s],
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
    )
    x[mask_index] = x0.clone()


def _confidences(mask_logits: torch.Tensor, cfg: DreamSampling):
    """The file's choice of `sample_tokens` flags per `alg`."""
    kwargs = dict(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k)
    if cfg.alg == "maskgit_plus":
        return sample_tokens(mask_logits, **kwargs)
    if cfg.alg == "topk_margin":
        return sample_tokens(mask_logits, **kwargs, margin_confidence=True)
    if cfg.alg == "entropy":
        return sample_tokens(mask_logits, **kwargs, neg_entropy=True)
    raise RuntimeError(f"Unknown alg: {cfg.alg}")


def _ranked_step(x, mask_index, logits, mask_logits, i, t, s, cfg: DreamSampling, mask_id, ties):
    """maskgit_plus / topk_margin / entropy: the batch-averaged count of the most confident
    masked positions (or a multinomial draw of them at alg_temp > 0) commit. (Not the
    file's: step i goes to `ties` when torch.topk chose among equal confidences.)"""
    confidence, x0 = _confidences(mask_logits, cfg)
    num_mask_token = mask_index.sum() / mask_index.shape[0]
    number_transfer_tokens = (
        int(num_mask_token * (1 - s / t)) if i < cfg.steps - 1 else int(num_mask_token)
    )
    full_confidence = torch.full_like(x, -torch.inf, dtype=logits.dtype)
    full_confidence[mask_index] = confidence
    if number_transfer_tokens > 0:
        if cfg.alg_temp is None or cfg.alg_temp == 0:
            _, transfer_index = torch.topk(full_confidence, number_transfer_tokens)
            if ties is not None and _tie_decides(full_confidence, number_transfer_tokens):
                ties.append(i)
        else:
            full_confidence = F.softmax(full_confidence / cfg.alg_temp, dim=-1)
            transfer_index = torch.multinomial(full_confidence, num_samples=number_transfer_tokens)
        x_ = torch.zeros_like(x, dtype=torch.long) + mask_id
        x_[mask_index] = x0.clone()
        row_indices = torch.arange(x.size(0)).unsqueeze(1).expand_as(transfer_index)
        x[row_indices, transfer_index] = x_[row_indices, transfer_index]


def _tie_decides(full_confidence: torch.Tensor, k: int) -> bool:
    """Whether some row's k-th and (k+1)-th largest confidences are equal and finite:
    then which position commits is torch.topk's unspecified tie order (CPU and CUDA
    differ), which the decoder documents as the leftmost."""
    if k >= full_confidence.shape[-1]:
        return False
    top = full_confidence.topk(k + 1).values
    return bool(((top[:, k - 1] == top[:, k]) & top[:, k].isfinite()).any())


@torch.no_grad()
def dream_generate(
    model: nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    cfg: DreamSampling,
    suppress_mask: bool = True,
    ties: list[int] | None = None,
) -> tuple[torch.Tensor, int]:
    """`_sample` for unpadded prompts of one length (`input_ids` (batch, prompt)): the
    generated region (batch, max_new_tokens) and the forward passes (always `cfg.steps`).
    `ties`, when given, collects the steps at which a tie in confidence decided a commit."""
    mask_id = model.mask_token_id
    max_length = input_ids.shape[1] + max_new_tokens
    x = F.pad(input_ids, (0, max_length - input_ids.shape[1]), value=mask_id)
    timesteps = torch.linspace(1, cfg.eps, cfg.steps + 1)
    for i in range(cfg.steps):
        mask_index = x == mask_id
        logits = _shifted_logits(model, x, suppress_mask)
        mask_logits = logits[mask_index]
        t, s = timesteps[i], timesteps[i + 1]
        if cfg.alg == "origin":
            _origin_step(x, mask_index, mask_logits, i, t, s, cfg, mask_id)
        else:
            _ranked_step(x, mask_index, logits, mask_logits, i, t, s, cfg, mask_id, ties)
    return x[:, input_ids.shape[1] :], cfg.steps


# ------------------------------------------- 2. the decoder's documented random streams


def filtered(logits64: torch.Tensor, temperature: float, top_p, top_k) -> torch.Tensor:
    """Dream's order: divide by the temperature (> 0), then top-p (< 1), then top-k."""
    x = logits64 / temperature if temperature > 0 else logits64
    if top_p is not None and top_p < 1:
        x = top_p_logits(x, top_p)
    if top_k is not None:
        x = top_k_logits(x, top_k)
    return x


def _gumbel_candidates(x, generator, rows: int, used: torch.Tensor | None) -> torch.Tensor:
    """LLaDA's float64 Gumbel-max at temperature 1 on `x`: noise of (rows, V) from the
    generator, used at the `used` rows (all when None)."""
    noise = torch.rand((rows, x.shape[-1]), dtype=torch.float64, generator=generator)
    return gumbel_max(x, noise if used is None else noise[used], 1.0)


def _confidence(probs: torch.Tensor, alg: str) -> torch.Tensor:
    """topk_margin / entropy, or the top probability (maskgit_plus at temperature 0)."""
    if alg == "topk_margin":
        top = probs.sort(-1, descending=True).values
        return top[:, 0] - top[:, 1]
    if alg == "entropy":
        return (probs * torch.log(probs + 1e-10)).sum(-1)
    return probs.max(-1).values


def dream_count(n: int, t: torch.Tensor, s: torch.Tensor, last: bool) -> int:
    """How many of the block's n masks a step commits: int(n (1 - s/t)) in float32."""
    if last:
        return n
    return int(torch.tensor(n, dtype=torch.float32) * (1 - s / t))


def _picked(confidence: torch.Tensor, k: int, alg_temp, generator) -> torch.Tensor:
    """The k positions (indices into the masked ones) that commit."""
    if not alg_temp:  # 0 or None: the k most confident, ties to the leftmost
        return torch.sort(confidence, descending=True, stable=True).indices[:k]
    weights = torch.softmax(confidence / alg_temp, dim=-1)
    return torch.multinomial(weights, k, replacement=False, generator=generator)


@dataclass(frozen=True)
class DocumentedDream:
    """One row's documented Dream decode: `DreamSampling`'s fields plus the blocks."""

    gen_length: int
    block_length: int
    steps: int
    alg: str = "entropy"
    alg_temp: float | None = 0.0
    eps: float = 1e-3
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None


def _ranked(x, masked_at, i, times, cfg: DocumentedDream, generator):
    """maskgit_plus / topk_margin / entropy at one step: {position: token} committed. No
    draw when nothing commits; at T > 0 maskgit_plus draws every masked position first
    (its confidence is the draw's), the other two only the chosen ones, after the choice."""
    k = dream_count(len(masked_at), times[i], times[i + 1], i == len(times) - 2)
    if k == 0:
        return {}
    probs = torch.softmax(x, dim=-1)
    if cfg.alg == "maskgit_plus" and cfg.temperature > 0:
        candidate = _gumbel_candidates(x, generator, x.shape[0], None)
        confidence = probs.gather(-1, candidate[:, None]).squeeze(-1)
        picked = _picked(confidence, k, cfg.alg_temp, generator).tolist()
        return {masked_at[j]: int(candidate[j]) for j in picked}
    picked = _picked(_confidence(probs, cfg.alg), k, cfg.alg_temp, generator).tolist()
    if cfg.temperature > 0:
        tokens = _gumbel_candidates(x[picked], generator, len(picked), None).tolist()
    else:
        tokens = probs[picked].max(-1).indices.tolist()
    return {masked_at[j]: tok for j, tok in zip(picked, tokens)}


def _origin(x, masked_at, i, times, cfg: DocumentedDream, generator):
    """origin at one step: each masked position with probability p = 1 - s/t (1 at the
    block's last step), float64 uniforms from the generator; candidates for those only."""
    last = i == len(times) - 2
    p = 1.0 if last else float(1 - times[i + 1] / times[i])
    moves = torch.rand(len(masked_at), dtype=torch.float64, generator=generator) < p
    rows = x[moves]
    if cfg.temperature > 0:
        tokens = _gumbel_candidates(rows, generator, rows.shape[0], None)
    else:
        tokens = torch.softmax(rows, dim=-1).max(-1).indices
    return {masked_at[j]: int(tok) for j, tok in zip(moves.nonzero().flatten().tolist(), tokens)}


def block_steps(steps_per_block: int, masked: int, block_length: int) -> int:
    """A block's steps: all of them when fully masked, ceil(spb * masked / L_b) when it
    starts partly unmasked, none without masks."""
    return math.ceil(steps_per_block * masked / block_length)


@torch.no_grad()
def documented_dream(
    model: nn.Module,
    prompt: torch.Tensor,
    cfg: DocumentedDream,
    generator: torch.Generator | None = None,
    init: torch.Tensor | None = None,
) -> tuple[torch.Tensor, int]:
    """One unpadded row decoded as the decoder documents `decoder=dream`: blocks left to
    right, each with `block_steps` steps on the timesteps linspace(1, eps, S_b + 1)
    (float32); at each step one forward pass of the whole sequence, float64 logits at the
    block's masked positions (mask token -inf), `filtered`, then `_ranked` or `_origin`.
    A block whose masks are all committed early (origin) hands on to the next block at the
    next step. Returns the region and the forward passes."""
    mask_id, lo = model.mask_token_id, prompt.shape[0]
    region = torch.full((cfg.gen_length,), mask_id) if init is None else init.clone()
    x, nfe = torch.cat([prompt, region]), 0
    spb = cfg.steps // (cfg.gen_length // cfg.block_length)
    for start in range(lo, lo + cfg.gen_length, cfg.block_length):
        n0 = int((x[start : start + cfg.block_length] == mask_id).sum())
        times = torch.linspace(1, cfg.eps, block_steps(spb, n0, cfg.block_length) + 1)
        for i in range(len(times) - 1):
            block_masked = x[start : start + cfg.block_length] == mask_id
            if not block_masked.any():
                break
            nfe += 1
            x[start : start + cfg.block_length] = _step_block(
                model, x, start, block_masked, i, times, cfg, generator
            )
    return x[lo:], nfe


def _step_block(model, x, start, block_masked, i, times, cfg: DocumentedDream, generator):
    """One step on the block at `start`: the block's tokens after the step's commits."""
    masked_at = (start + block_masked.nonzero().flatten()).tolist()
    logits = filtered(reference_logits(model, x)[masked_at], cfg.temperature, cfg.top_p, cfg.top_k)
    if cfg.alg == "origin":
        commits = _origin(logits, masked_at, i, times, cfg, generator)
    else:
        commits = _ranked(logits, masked_at, i, times, cfg, generator)
    block = x[start : start + cfg.block_length].clone()
    for position, token in commits.items():
        block[position - start] = token
    return block
