"""Mixture-of-experts feed-forward layers shared by LLaDA-MoE and LLaDA2.

Each expert is a SwiGLU MLP, `down(silu(gate(x)) * up(x))`, with the upstream parameter
names (`experts.N.gate_proj.weight`, ...). A router gives every token `k` experts and
their weights; `Experts.forward` runs them batched: the (token, expert) assignments are
sorted by expert once, and each expert that received tokens runs once over all of them
(a loop over experts, never over tokens or rows), its outputs scattered back with
`index_add_`. The routers differ per family and live with their models.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    """`down(silu(gate(x)) * up(x))`, bias-free (every MLP of both families)."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(width, hidden, bias=False)
        self.up_proj = nn.Linear(width, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Experts(nn.ModuleList):
    """The routed experts of one layer."""

    def __init__(self, count: int, width: int, hidden: int) -> None:
        super().__init__(SwiGLU(width, hidden) for _ in range(count))

    def forward(self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Σ_j weights[t, j] · expert[chosen[t, j]](x[t]) for tokens `x` (tokens, width).

        `chosen` (tokens, k) long, `weights` (tokens, k) float32; the weighted sum is
        taken in float32 and returned in x's dtype.
        """
        tokens, k = chosen.shape
        flat = chosen.flatten()
        order = flat.argsort(stable=True)  # assignments grouped by expert, token order kept within
        counts = torch.bincount(flat, minlength=len(self)).tolist()
        token_of = order // k
        weight_of = weights.flatten()[order]
        out = torch.zeros((tokens, x.shape[-1]), dtype=torch.float32, device=x.device)
        begin = 0
        for expert, count in enumerate(counts):
            if count:
                rows = token_of[begin : begin + count]
                y = self[expert](x[rows]).float() * weight_of[begin : begin + count, None]
                out.index_add_(0, rows, y)
                begin += count
        return out.to(x.dtype)
