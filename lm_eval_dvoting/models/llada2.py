"""LLaDA2.0 / LLaDA2.1 (inclusionAI/LLaDA2.0-mini/-flash, LLaDA2.1-mini/-flash) as plain PyTorch.

The upstream `LLaDA2MoeModelLM` (a Ling/Bailing MoE block) with the hub's parameter
names: a fused `query_key_value` projection (rows: query heads | key heads | value
heads), per-head RMSNorms on queries and keys before a *partial* rotary embedding (the
first `head_dim * partial_rotary_factor` dims of each head, rotate-half within them),
output projection `dense`; the first `first_k_dense_replace` layers have a dense MLP, the
others a mixture of experts with a shared expert.

Router (upstream's, whatever `score_function`/`norm_topk_prob` in the config say):
sigmoid of the float32 router logits; the choice uses the scores plus `gate.expert_bias`:
the experts form `n_group` groups, a group scores the sum of its two best biased scores,
the best `topk_group` groups stay, and the top `num_experts_per_tok` experts among them
are chosen by biased score; their weights are the *unbiased* scores normalised to sum 1,
times `routed_scaling_factor`. The shared expert is added with weight 1.

Attention is block diffusion's: with `block_lengths` (one per row), a query sees the
keys of its own block and of every earlier block (blocks aligned at the row's first real
token); without, it is bidirectional. Padded keys are always masked (upstream turns a 2D
mask with a zero into a causal mask for the whole batch; we do not copy that). Logits
are not shifted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from lm_eval_dvoting.models.common import (
    FromConfigDict,
    HeadedLM,
    PrefixCache,
    RMSNorm,
    attended_keys,
    attention_bias,
    block_causal_bias,
    default_position_ids,
    own_copy,
    repeat_kv,
    rotary_tables,
    rotate_pair,
)
from lm_eval_dvoting.models.llada_moe import apply_partial_rotary
from lm_eval_dvoting.models.moe import Experts, SwiGLU


@dataclass(frozen=True)
class LLaDA2Config(FromConfigDict):
    """The fields of LLaDA2's `config.json` that the forward pass needs."""

    # settings upstream's code reads that we implement at one value only, the released
    # checkpoints' (another is refused at load: models/loading.py, `check_implemented`)
    IMPLEMENTED: ClassVar[dict[str, Any]] = {"use_qk_norm": True}

    hidden_size: int
    num_attention_heads: int
    num_hidden_layers: int
    intermediate_size: int
    vocab_size: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    num_shared_experts: int = 0
    first_k_dense_replace: int = 0
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    partial_rotary_factor: float = 1.0
    rope_theta: float = 10000.0
    # read as transformers' code reads it; only the default (None) is computed
    # (models/loading.py, `rotary_settings`, refuses the others)
    rope_scaling: dict[str, Any] | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        return int(self.dim_per_head * self.partial_rotary_factor)


class LLaDA2Attention(nn.Module):
    def __init__(self, cfg: LLaDA2Config) -> None:
        super().__init__()
        self.n_heads, self.kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.kv_heads,
            cfg.dim_per_head,
        )
        self.query_key_value = nn.Linear(
            cfg.hidden_size, (self.n_heads + 2 * self.kv_heads) * self.head_dim, bias=False
        )
        self.dense = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        self.query_layernorm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.key_layernorm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        bias: torch.Tensor | None,
        cache: PrefixCache | None,
        layer: int,
    ) -> torch.Tensor:
        batch, length, _ = x.shape
        qkv = self.query_key_value(x).view(
            batch, length, self.n_heads + 2 * self.kv_heads, self.head_dim
        )
        q, k, v = qkv.split([self.n_heads, self.kv_heads, self.kv_heads], dim=2)
        q, k = self.query_layernorm(q).transpose(1, 2), self.key_layernorm(k).transpose(1, 2)
        q, k = rotate_pair(q, k, apply_partial_rotary, rotary)
        v = v.transpose(1, 2)
        if cache is not None:
            cache.new_keys.append(own_copy(k))
            cache.new_values.append(own_copy(v))
            if cache.keys:
                k, v = (
                    torch.cat([cache.keys[layer], k], dim=2),
                    torch.cat([cache.values[layer], v], dim=2),
                )
        k, v = repeat_kv(k, v, self.n_heads)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.dense(attended.transpose(1, 2).reshape(batch, length, -1))


class GroupLimitedRouter(nn.Module):
    """LLaDA2's router (`mlp.gate`, with its `expert_bias` buffer); see the module docstring."""

    def __init__(self, cfg: LLaDA2Config) -> None:
        super().__init__()
        self.top_k, self.groups, self.top_groups = (
            cfg.num_experts_per_tok,
            cfg.n_group,
            cfg.topk_group,
        )
        self.scaling = cfg.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(cfg.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = torch.sigmoid(F.linear(x.float(), self.weight.float()))
        biased = scores + self.expert_bias.float()
        tokens, experts = biased.shape
        per_group = biased.view(tokens, self.groups, experts // self.groups)
        group_scores = per_group.topk(min(2, per_group.shape[-1]), dim=-1).values.sum(-1)
        kept_groups = group_scores.topk(self.top_groups, dim=-1).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept_groups, True)
        keep = keep[:, :, None].expand_as(per_group).reshape(tokens, experts)
        chosen = biased.masked_fill(~keep, float("-inf")).topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, chosen)
        if self.top_k > 1:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return chosen, weights * self.scaling


class LLaDA2SparseMLP(nn.Module):
    def __init__(self, cfg: LLaDA2Config) -> None:
        super().__init__()
        self.gate = GroupLimitedRouter(cfg)
        # summed over the router's order (descending score), as upstream's `moe_infer` does
        self.experts = Experts(
            cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, ascending=False
        )
        shared = cfg.moe_intermediate_size * cfg.num_shared_experts
        self.shared_experts = SwiGLU(cfg.hidden_size, shared) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        out = self.experts(flat, *self.gate(flat)).view(x.shape)
        return out if self.shared_experts is None else out + self.shared_experts(x)


class LLaDA2Layer(nn.Module):
    def __init__(self, cfg: LLaDA2Config, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attention = LLaDA2Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        dense = layer < cfg.first_k_dense_replace
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size) if dense else LLaDA2SparseMLP(cfg)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        bias: torch.Tensor | None,
        cache: PrefixCache | None,
        layer: int,
    ) -> torch.Tensor:
        x = x + self.attention(self.input_layernorm(x), rotary, bias, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class _Backbone(nn.Module):
    def __init__(self, cfg: LLaDA2Config) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LLaDA2Layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LLaDA2Model(HeadedLM):
    """LLaDA2's mask predictor: `forward(input_ids, attention_mask, position_ids,
    block_lengths) -> logits` (shift 0). `block_causal` tells the decoder to decode it as
    block diffusion (decoding/blocks.py)."""

    logits_shift = 0
    block_causal = True

    def __init__(self, cfg: LLaDA2Config) -> None:
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
        block_lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final-norm hidden states (batch, length, width).

        `block_lengths` (batch,): block-causal attention with those block lengths (None:
        bidirectional). With `cache`, the tokens also attend to the cached prefix's keys
        and values (left-padded, `cache.mask`; give `position_ids` that continue the
        prefix's) and the pass's own keys and values are recorded in it.
        """
        cfg = self.config
        if position_ids is None:
            position_ids = default_position_ids(input_ids)
        x = self.model.word_embeddings(input_ids)
        # in the activations' dtype, as upstream's (transformers' Llama-style) code rotates
        rotary = rotary_tables(position_ids, cfg.rotary_dim, cfg.rope_theta, x.dtype)
        if block_lengths is None:
            bias = attention_bias(attended_keys(attention_mask, input_ids, cache), x.dtype)
        else:  # (block-causal: a mask over every key, the cache's kept ones included)
            keys = attention_mask if cache is None else cache.key_mask(attention_mask, input_ids)
            keys = torch.ones_like(input_ids) if keys is None else keys
            bias = block_causal_bias(keys, position_ids, block_lengths, x.dtype)
        for index, layer in enumerate(self.model.layers):
            x = layer(x, rotary, bias, cache, index)
        return self.model.norm(x)

    def input_embedding(self) -> nn.Embedding:
        return self.model.word_embeddings
