"""LLaDA-MoE (inclusionAI/LLaDA-MoE-7B-A1B-Base/-Instruct) as plain PyTorch.

The upstream file (`modeling_lladamoe.py`, an OLMoE-style block) with the hub's
parameter names. Differences from dense LLaDA: per-head RMSNorms on queries and keys
(`q_norm`/`k_norm`, before the rotary embedding) and a mixture-of-experts MLP in every
layer whose `moe_layer_freq` is 1. The router is upstream's: a bias-free linear map to
the experts, softmax in float32 over all of them, the top `num_experts_per_tok` taken
with their softmax probabilities as weights, *not* renormalised (upstream forces
`norm_topk_prob` off whatever the config says); with `moe_router_enable_expert_bias` an
`expert_bias` is added to the probabilities before the choice and stays in the weights.

Upstream ignores every attention mask (fully bidirectional, padding included); we do
not copy that: padded keys are masked, so a padded row gives the logits of the row alone
(tests/fixtures/official-tiny README, `logits_masked_dllm`). Logits are not shifted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

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
from lm_eval_dvoting.models.moe import Experts, SwiGLU


def apply_partial_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first `cos.shape[-1]` dims of each head (rotate-half within them); the
    rest pass through (LLaDA2's partial rotary embedding; the whole head when they match)."""
    width = cos.shape[-1]
    if width == x.shape[-1]:
        return apply_rotary(x, cos, sin)
    return torch.cat([apply_rotary(x[..., :width], cos, sin), x[..., width:]], dim=-1)


@dataclass(frozen=True)
class LLaDAMoEConfig(FromConfigDict):
    """The fields of LLaDA-MoE's `config.json` that the forward pass needs."""

    # settings upstream's code reads that we implement at one value only, the released
    # checkpoints' (another is refused at load: models/loading.py, `check_implemented`)
    IMPLEMENTED: ClassVar[dict[str, Any]] = {
        "shared_expert_intermediate_size": None,
        "qk_layernorm": True,
    }
    # what upstream's config class reads where config.json leaves one of them out
    UPSTREAM_DEFAULTS: ClassVar[dict[str, Any]] = {"qk_layernorm": None}  # no q/k norms

    hidden_size: int
    num_attention_heads: int
    num_hidden_layers: int
    vocab_size: int
    num_experts: int
    num_experts_per_tok: int
    expert_intermediate_size: int
    num_key_value_heads: int | None = None
    dense_intermediate_size: int | None = None
    moe_layer_freq: list[int] = field(default_factory=list)  # empty: every layer is MoE
    moe_router_enable_expert_bias: bool = False
    clip_qkv: float | None = None  # upstream clamps queries, keys and values to +-clip_qkv
    rope_theta: float = 50000.0
    # read as transformers' code reads it; only the default (None) is computed
    # (models/loading.py, `rotary_settings`, refuses the others)
    rope_scaling: dict[str, Any] | None = None
    rms_norm_eps: float = 1e-5
    partial_rotary_factor: float = 1.0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        """The dims of each head the rotary embedding turns (upstream's default rope init:
        `head_dim * partial_rotary_factor`; its `apply_rotary_pos_emb` passes the rest)."""
        return int(self.head_dim * self.partial_rotary_factor)

    def is_moe(self, layer: int) -> bool:
        return not self.moe_layer_freq or bool(self.moe_layer_freq[layer])


class LLaDAMoEAttention(nn.Module):
    def __init__(self, cfg: LLaDAMoEConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.kv_heads = cfg.num_key_value_heads or cfg.num_attention_heads
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.clip = cfg.clip_qkv

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        bias: torch.Tensor | None,
        cache: PrefixCache | None,
        layer: int,
    ) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, length, self.n_heads, self.head_dim)).transpose(
            1, 2
        )
        k = self.k_norm(self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim)).transpose(
            1, 2
        )
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.clip is not None:  # as upstream: after the norms, before the rotation
            q, k, v = (t.clamp(-self.clip, self.clip) for t in (q, k, v))
        q, k = rotate_pair(q, k, apply_partial_rotary, rotary)
        attended = (
            bidirectional_attention(q, k, v, bias)
            if cache is None
            else cache.attend(layer, q, k, v, bias)
        )
        return self.o_proj(attended.transpose(1, 2).reshape(batch, length, -1))


class SoftmaxRouter(nn.Module):
    """LLaDA-MoE's router (`mlp.gate`): softmax probabilities, top-k, not renormalised."""

    def __init__(self, cfg: LLaDAMoEConfig) -> None:
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size))
        if cfg.moe_router_enable_expert_bias:
            self.register_buffer("expert_bias", torch.zeros(cfg.num_experts))
        else:
            self.expert_bias = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax(F.linear(x, self.weight).float(), dim=-1)
        if self.expert_bias is not None:
            probs = probs + self.expert_bias.float()
        weights, chosen = probs.topk(self.top_k, dim=-1)
        # in the activations' dtype, as upstream's (OLMoE's) code casts them: the experts'
        # weighted outputs are then added in that dtype (models/moe.py)
        return chosen, weights.to(x.dtype)


class LLaDAMoEBlock(nn.Module):
    """The sparse MLP: router (`gate`) and experts."""

    def __init__(self, cfg: LLaDAMoEConfig) -> None:
        super().__init__()
        self.gate = SoftmaxRouter(cfg)
        self.experts = Experts(cfg.num_experts, cfg.hidden_size, cfg.expert_intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        return self.experts(flat, *self.gate(flat)).view(x.shape)


class LLaDAMoELayer(nn.Module):
    def __init__(self, cfg: LLaDAMoEConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LLaDAMoEAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        dense = cfg.dense_intermediate_size or cfg.expert_intermediate_size
        self.mlp = LLaDAMoEBlock(cfg) if cfg.is_moe(layer) else SwiGLU(cfg.hidden_size, dense)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        bias: torch.Tensor | None,
        cache: PrefixCache | None,
        layer: int,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rotary, bias, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class _Backbone(nn.Module):
    def __init__(self, cfg: LLaDAMoEConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LLaDAMoELayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LLaDAMoEModel(HeadedLM):
    """LLaDA-MoE's mask predictor: `forward(input_ids, attention_mask) -> logits` (shift 0)."""

    logits_shift = 0

    def __init__(self, cfg: LLaDAMoEConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = _Backbone(cfg)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: PrefixCache | None = None,
    ) -> torch.Tensor:
        """Final-norm hidden states (batch, length, width); `cache` as for LLaDA."""
        cfg = self.config
        if position_ids is None:
            position_ids = default_position_ids(input_ids)
        x = self.model.embed_tokens(input_ids)
        # in the activations' dtype, as upstream's (transformers' OLMoE) code rotates
        rotary = rotary_tables(position_ids, cfg.rotary_dim, cfg.rope_theta, x.dtype)
        bias = attention_bias(attended_keys(attention_mask, input_ids, cache), x.dtype)
        for index, layer in enumerate(self.model.layers):
            x = layer(x, rotary, bias, cache, index)
        return self.model.norm(x)

    def input_embedding(self) -> nn.Embedding:
        return self.model.embed_tokens
