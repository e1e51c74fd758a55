"""LLaDA (GSAI-ML/LLaDA-8B-Instruct, LLaDA-1.5) as plain PyTorch.

Reads the official checkpoints' parameter names (`model.transformer.blocks.N.q_proj`,
...), so no downloaded modeling code is ever run. The block is OLMo's "llama" block:
pre-norm, rotary, SwiGLU with `ff_proj` as the gated branch, bidirectional attention.
"""

from __future__ import annotations

from dataclasses import dataclass

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
class LLaDAConfig(FromConfigDict):
    """The fields of LLaDA's `config.json` that the forward pass needs."""

    d_model: int
    n_heads: int
    n_layers: int
    mlp_hidden_size: int
    vocab_size: int
    n_kv_heads: int | None = None
    embedding_size: int | None = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    weight_tying: bool = False
    include_bias: bool = False
    include_qkv_bias: bool = False
    max_sequence_length: int = 4096
    # upstream rotates queries and keys in float32 when true (LLaDA's default and its
    # checkpoints' setting), else in the weights' dtype
    rope_full_precision: bool = True

    @property
    def tie_word_embeddings(self) -> bool:
        """`weight_tying`, under the name `HeadedLM` reads."""
        return self.weight_tying

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def padded_vocab(self) -> int:
        return self.embedding_size or self.vocab_size


class LLaDABlock(nn.Module):
    def __init__(self, cfg: LLaDAConfig) -> None:
        super().__init__()
        head_dim = cfg.d_model // cfg.n_heads
        self.n_heads, self.kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, head_dim
        self.rope_theta = cfg.rope_theta
        qkv_bias = cfg.include_bias or cfg.include_qkv_bias
        self.attn_norm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=qkv_bias)
        self.k_proj = nn.Linear(cfg.d_model, cfg.kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(cfg.d_model, cfg.kv_heads * head_dim, bias=qkv_bias)
        self.attn_out = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.include_bias)
        self.ff_norm = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        self.ff_proj = nn.Linear(cfg.d_model, cfg.mlp_hidden_size, bias=cfg.include_bias)
        self.up_proj = nn.Linear(cfg.d_model, cfg.mlp_hidden_size, bias=cfg.include_bias)
        self.ff_out = nn.Linear(cfg.mlp_hidden_size, cfg.d_model, bias=cfg.include_bias)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        bias: torch.Tensor | None,
        cache: PrefixCache | None = None,
        layer: int = 0,
    ) -> torch.Tensor:
        batch, length, width = x.shape
        h = self.attn_norm(x)
        q = self.q_proj(h).view(batch, length, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate_pair(q, k, apply_rotary, rotary)
        attended = (
            bidirectional_attention(q, k, v, bias)
            if cache is None
            else cache.attend(layer, q, k, v, bias)
        )
        x = x + self.attn_out(attended.transpose(1, 2).reshape(batch, length, width))
        h = self.ff_norm(x)
        return x + self.ff_out(F.silu(self.ff_proj(h)) * self.up_proj(h))


class LLaDATransformer(nn.Module):
    def __init__(self, cfg: LLaDAConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.padded_vocab, cfg.d_model)
        self.blocks = nn.ModuleList(LLaDABlock(cfg) for _ in range(cfg.n_layers))
        self.ln_f = RMSNorm(cfg.d_model, cfg.rms_norm_eps)
        if not cfg.weight_tying:
            self.ff_out = nn.Linear(cfg.d_model, cfg.padded_vocab, bias=cfg.include_bias)


class _Root(nn.Module):
    """Holds `transformer` so parameter names read `model.transformer.…` as upstream."""

    def __init__(self, cfg: LLaDAConfig) -> None:
        super().__init__()
        self.transformer = LLaDATransformer(cfg)


class LLaDAModel(HeadedLM):
    """LLaDA's mask predictor: `forward(input_ids, attention_mask) -> logits`.

    Logits have shape (batch, length, padded vocabulary) and are in the upstream
    convention: the prediction for position `i` is read at `i` (shift 0).
    """

    logits_shift = 0
    # a pass without host syncs or data-dependent shapes (`cached_steps=graphs`)
    captures_cuda_graphs = True

    def __init__(self, cfg: LLaDAConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = _Root(cfg)

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
        cfg, transformer = self.config, self.model.transformer
        if position_ids is None:
            position_ids = default_position_ids(input_ids)
        x = transformer.wte(input_ids)
        rotary = rotary_tables(
            position_ids,
            cfg.d_model // cfg.n_heads,
            cfg.rope_theta,
            torch.float32 if cfg.rope_full_precision else x.dtype,
        )
        bias = attention_bias(attended_keys(attention_mask, input_ids, cache), x.dtype)
        for layer, block in enumerate(transformer.blocks):
            x = block(x, rotary, bias, cache, layer)
        return transformer.ln_f(x)

    def input_embedding(self) -> nn.Embedding:
        return self.model.transformer.wte

    def output_head(self) -> nn.Module:
        return self.model.transformer.ff_out
