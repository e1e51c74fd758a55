"""Dream (Dream-org/Dream-v0-Instruct-7B) as plain PyTorch.

A Qwen2 transformer run with bidirectional attention. Dream was initialised from an
autoregressive model, so its prediction for position `i` sits in the logits at `i-1`:
`forward` returns the raw logits (upstream convention) and `logits_shift = 1` tells
the sampler to read them one position to the left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lm_eval_dvoting.models.common import (
    FromConfigDict,
    HeadedLM,
    PrefixCache,
    RMSNorm,
    apply_rotary,
    attended_keys,
    attention_bias,
    bidirectional_attention,
    default_position_ids,
    rotary_tables,
    rotate_pair,
)


@dataclass(frozen=True)
class DreamConfig(FromConfigDict):
    """The fields of Dream's `config.json` that the forward pass needs."""

    hidden_size: int
    num_attention_heads: int
    num_hidden_layers: int
    intermediate_size: int
    vocab_size: int
    num_key_value_heads: int | None = None
    rope_theta: float = 10000.0
    # read as transformers' code reads it; only the default (None) is computed
    # (models/loading.py, `rotary_settings`, refuses the others)
    rope_scaling: dict[str, Any] | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768


class DreamAttention(nn.Module):
    def __init__(self, cfg: DreamConfig) -> None:
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads or cfg.num_attention_heads
        self.head_dim = cfg.hidden_size // self.n_heads
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        bias: torch.Tensor | None,
        query_keep: torch.Tensor | None,
        cache: PrefixCache | None = None,
        layer: int = 0,
    ) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate_pair(q, k, apply_rotary, rotary)
        attended = (
            bidirectional_attention(q, k, v, bias)
            if cache is None
            else cache.attend(layer, q, k, v, bias)
        )
        if query_keep is not None:
            # Upstream Dream masks queries too (a 4-D mask `keep_q & keep_k`), which
            # makes a padded position's attention output zero. Zeroing explicitly gives
            # the same numbers without relying on how a kernel treats fully masked rows.
            attended = attended * query_keep
        return self.o_proj(attended.transpose(1, 2).reshape(batch, length, -1))


class DreamMLP(nn.Module):
    def __init__(self, cfg: DreamConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DreamLayer(nn.Module):
    def __init__(self, cfg: DreamConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DreamAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DreamMLP(cfg)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        bias: torch.Tensor | None,
        query_keep: torch.Tensor | None,
        cache: PrefixCache | None = None,
        layer: int = 0,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rotary, bias, query_keep, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class DreamBackbone(nn.Module):
    def __init__(self, cfg: DreamConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DreamLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DreamModel(HeadedLM):
    """Dream's mask predictor: `forward(input_ids, attention_mask) -> raw logits`."""

    logits_shift = 1
    # a pass without host syncs or data-dependent shapes (`cached_steps=graphs`)
    captures_cuda_graphs = True

    def __init__(self, cfg: DreamConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = DreamBackbone(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: PrefixCache | None = None,
    ) -> torch.Tensor:
        """Final-norm hidden states (batch, length, width), before the output head.

        With `cache`, the tokens also attend to the cached prefix's keys and values
        (give `position_ids` that continue the prefix's), and the pass's own keys and
        values are recorded in it.
        """
        cfg = self.config
        if position_ids is None:
            position_ids = default_position_ids(input_ids)
        x = self.model.embed_tokens(input_ids)
        # in the activations' dtype, as Dream's own (transformers' Qwen2) code rotates
        rotary = rotary_tables(
            position_ids, cfg.hidden_size // cfg.num_attention_heads, cfg.rope_theta, x.dtype
        )
        bias = attention_bias(attended_keys(attention_mask, input_ids, cache), x.dtype)
        query_keep = None
        if attention_mask is not None:
            query_keep = attention_mask.to(x.dtype)[:, None, :, None]
        for index, layer in enumerate(self.model.layers):
            x = layer(x, rotary, bias, query_keep, cache, index)
        return self.model.norm(x)

    def input_embedding(self) -> nn.Embedding:
        return self.model.embed_tokens
