"""Building blocks every family shares: RMSNorm, rotary embeddings, attention, the output head.

LLaDA (an OLMo-style LLaMA block), Dream (Qwen2), LLaDA-MoE and LLaDA2 are pre-norm
transformers with RMSNorm, half-split rotary embeddings, SwiGLU MLPs and bidirectional (for
LLaDA2, block-causal) attention. The numerics follow the upstream code: norms in float32,
the rotary embedding in the dtype each family's own code rotates in (`rotary_tables`), the
rest in the weights' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, scaled by a learned weight."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rotary_tables(
    position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape (batch, 1, length, head_dim), computed in float32 and cast to
    `dtype`, the dtype the rotation then runs in (`apply_rotary`): the family's upstream
    choice. LLaDA rotates in float32 (its `rope_full_precision`, true in its checkpoints);
    Dream, LLaDA-MoE and LLaDA2 follow transformers' Llama code, whose tables are cast to the
    activations' dtype, so in bfloat16 each product and the sum round to bfloat16.

    The sign of the half-split rotation (`rotate_half`'s `-x2`) is folded into the first half
    of `sin`: `x2 * -s` rounds as `-x2 * s` does, in any dtype, so the rotation is upstream's
    bit for bit and a pass launches one negation fewer per rotated tensor."""
    inv_freq = 1.0 / (
        theta
        ** (
            torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32) / head_dim
        )
    )
    freqs = position_ids.float()[..., None] * inv_freq  # (batch, length, head_dim/2)
    angles = torch.cat((freqs, freqs), dim=-1)[:, None]
    sin = angles.sin()
    signed_sin = torch.cat((-sin[..., : head_dim // 2], sin[..., head_dim // 2 :]), dim=-1)
    return angles.cos().to(dtype), signed_sin.to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (batch, heads, length, head_dim) by `rotary_tables`' tables, half-split
    convention, in the tables' dtype (back in `x`'s after): `x * cos + swapped * sin`, where
    `swapped` is `x` with its halves exchanged and `sin` carries the rotation's sign."""
    rotated = x.to(cos.dtype)
    first, second = rotated.chunk(2, dim=-1)
    swapped = torch.cat((second, first), dim=-1)
    return (rotated * cos + swapped * sin).to(x.dtype)


def rotate_pair(
    q: torch.Tensor,
    k: torch.Tensor,
    rotate: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    rotary: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rotate(q, *rotary)` and `rotate(k, *rotary)`, (batch, heads, length, head_dim) each, in
    one call over both tensors' heads laid side by side: the same elementwise arithmetic on
    the same values, so the same bits, for one copy instead of a second rotation's five or
    so kernels (each layer of a pass rotates both; on a GPU a one-row step is bound by its
    kernels' count, issue 43). The two come back as views of one tensor."""
    heads = q.shape[1]
    both = rotate(torch.cat((q, k), dim=1), *rotary)
    return both[:, :heads], both[:, heads:]


def attention_bias(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Additive key mask (batch, 1, 1, length) from a 0/1 mask; None means attend everywhere.

    Padded *queries* still attend to the real keys (their outputs are never used),
    which keeps every softmax row finite.
    """
    if attention_mask is None:
        return None
    keep = attention_mask.to(torch.bool)[:, None, None, :]
    bias = torch.zeros(keep.shape, dtype=dtype, device=attention_mask.device)
    return bias.masked_fill(~keep, torch.finfo(dtype).min)


def attended_keys(
    attention_mask: torch.Tensor | None, input_ids: torch.Tensor, cache: Any = None
) -> torch.Tensor | None:
    """The 0/1 mask over the keys a pass attends to (a cache's kept keys, if any, and the
    pass's own), or None when every one of them is real: attention then runs without a mask,
    as the upstream code runs a batch with no padding, which lets SDPA choose its fastest
    kernel (flash attention in bfloat16 and float16 on a GPU: any mask, even one of zeros,
    rules it out). On the CPU the numbers are the same either way. The decoder gives
    `attention_mask=None` where no row of a pass is padded (`state.left_pad`); a cache tells
    whether its kept keys are (`every_kept_key_real`)."""
    if cache is None:
        return attention_mask
    if attention_mask is None and cache.every_kept_key_real:
        return None
    return cache.key_mask(attention_mask, input_ids)


def default_position_ids(input_ids: torch.Tensor) -> torch.Tensor:
    """Positions 0..length-1 for every row, the upstream models' convention."""
    batch, length = input_ids.shape
    return torch.arange(length, device=input_ids.device).expand(batch, length)


# SDPA's `enable_gqa` came with torch 2.5; before it, grouped heads are always repeated
GQA_IN_PLACE = torch.torch_version.TorchVersion(torch.__version__) >= (2, 5)
FLASH_DTYPES = (torch.bfloat16, torch.float16)


def grouped_heads_in_place(q: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether SDPA should read grouped key/value heads as they are (`enable_gqa`) rather than
    repeated: only where its flash kernel runs the pass, which reads them in place with the
    arithmetic of the repeat (no mask; bfloat16 or float16 on a CUDA GPU of compute
    capability 8.0 or more; a head width flash takes). Elsewhere `enable_gqa` would pick the
    math kernel: slower than the repeat on a GPU, and on the CPU, before torch's flash kernel
    there took grouped heads (mid-2025), other rounding."""
    return (
        GQA_IN_PLACE
        and bias is None
        and q.is_cuda
        and q.dtype in FLASH_DTYPES
        and q.shape[-1] % 8 == 0
        and q.shape[-1] <= 256
        and torch.cuda.get_device_capability(q.device) >= (8, 0)
    )


def bidirectional_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Full (non-causal) attention; grouped key/value heads (Dream, LLaDA-MoE) are read in
    place by SDPA's flash kernel where it runs the pass (`grouped_heads_in_place`: a copy of
    every key and value fewer per layer, the same numbers), and repeated otherwise."""
    if k.shape[1] != q.shape[1] and grouped_heads_in_place(q, bias):
        return F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=True)
    if k.shape[1] != q.shape[1]:
        groups = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=False)


@dataclass
class PrefixCache:
    """Keys and values to attend to without recomputing them (Fast-dLLM's caches), and
    the keys and values of the pass that uses them.

    `keys[l]` / `values[l]`: layer `l`'s rotated keys and values of the cached prefix,
    (batch, kv_heads, prefix, head_dim); `mask` (batch, prefix) marks the real ones (a
    row's prefix is left-padded to the longest). `suffix_keys` / `suffix_values` /
    `suffix_mask`: the same for what follows the pass's tokens (the dual cache; a row's
    suffix is right-padded to the longest). Empty lists: none (a pass that only records).
    After a pass, `new_keys[l]` / `new_values[l]` hold the pass's own keys and values,
    from which a caller cuts what it keeps.
    """

    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    mask: torch.Tensor | None = None
    suffix_keys: list[torch.Tensor] = field(default_factory=list)
    suffix_values: list[torch.Tensor] = field(default_factory=list)
    suffix_mask: torch.Tensor | None = None
    new_keys: list[torch.Tensor] = field(default_factory=list)
    new_values: list[torch.Tensor] = field(default_factory=list)
    # set (by `stack_kept`, which knows the rows' lengths on the host) when no row's kept
    # keys are padded: `mask` and `suffix_mask` then mark every kept key real
    no_kept_padding: bool = False

    @property
    def every_kept_key_real(self) -> bool:
        """Whether a pass with no padded query may attend without a mask (`attended_keys`)."""
        return self.no_kept_padding or (self.mask is None and self.suffix_mask is None)

    def key_mask(
        self, attention_mask: torch.Tensor | None, input_ids: torch.Tensor
    ) -> torch.Tensor | None:
        """The 0/1 mask over prefix + pass + suffix keys (None: attend everywhere)."""
        if self.mask is None and self.suffix_mask is None:
            return attention_mask
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        parts = [attention_mask]
        if self.mask is not None:
            parts.insert(0, self.mask.to(attention_mask.dtype))
        if self.suffix_mask is not None:
            parts.append(self.suffix_mask.to(attention_mask.dtype))
        return torch.cat(parts, dim=1)

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """Record this pass's keys/values, then attend over prefix + pass + suffix keys."""
        self.new_keys.append(own_copy(k))
        self.new_values.append(own_copy(v))
        if self.keys:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        if self.suffix_keys:
            k = torch.cat([k, self.suffix_keys[layer]], dim=2)
            v = torch.cat([v, self.suffix_values[layer]], dim=2)
        return bidirectional_attention(q, k, v, bias)


def own_copy(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a copy where it is a view into a larger tensor (keys rotated with the queries,
    `rotate_pair`; LLaDA2's values, a split of its fused projection): what a cache records
    must not keep every layer's queries alive until the pass ends (about 2 GiB for a 16 x 512
    recording pass of LLaDA-8B in bfloat16)."""
    whole = t.untyped_storage().nbytes()
    return t if whole == t.numel() * t.element_size() else t.clone()


@dataclass
class StaticKeyValues:
    """A reuse pass's keys and values in buffers of fixed shape, written in place (the
    static-shape cached step, `core/decoding/static_steps.py`).

    `keys[l]` / `values[l]`: layer `l`'s buffers (batch, kv_heads, width, head_dim), laid
    out as the dynamic path concatenates them (the kept prefix left-padded, the pass's own
    columns, the kept suffix right-padded), so attention sees the same tensor, bit for bit.
    `slot` (the pass's length,): the columns the pass's own keys and values are written to;
    `mask` (batch, width): the 0/1 key mask. Nothing is allocated or concatenated per step,
    so a pass over these buffers can be captured as a CUDA graph and replayed.
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    mask: torch.Tensor
    slot: torch.Tensor
    # a shape whose every fill leaves no kept key padded (its rows' kept prefixes of one
    # length, their suffixes too): with no query padded either, its pass attends without a
    # mask (`attended_keys`)
    every_kept_key_real: bool = False

    def key_mask(
        self, attention_mask: torch.Tensor | None, input_ids: torch.Tensor
    ) -> torch.Tensor:
        """The key mask set when the buffers were filled (it covers the pass's columns)."""
        return self.mask

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """Write this pass's keys and values into their columns, then attend over all."""
        keys = self.keys[layer].index_copy_(2, self.slot, k)
        values = self.values[layer].index_copy_(2, self.slot, v)
        return bidirectional_attention(q, keys, values, bias)


def block_causal_bias(
    key_mask: torch.Tensor,
    query_positions: torch.Tensor,
    block_lengths: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Additive (batch, 1, queries, keys) mask of block diffusion (LLaDA2): a query at
    position p sees a real key at position q when q // B <= p // B, with each row's block
    length B (`block_lengths`, (batch,)): bidirectional inside a block, causal across
    blocks. Positions count a row's real tokens from 0 (`key_mask` 0/1 marks them; a key's
    position is its count of real keys before it), so blocks are aligned at the row's
    first real token whatever its padding or cached prefix, as upstream aligns them."""
    key_positions = key_mask.long().cumsum(-1) - 1
    # a caller's host tensor moves; the decoder's is on the device already, where `.to` is
    # free but would count as a copy to the host-reads counter, which sees only the CPU
    if block_lengths.device != key_mask.device:
        block_lengths = block_lengths.to(key_mask.device)
    blocks = block_lengths.long()[:, None]
    see = (key_positions // blocks)[:, None, :] <= (query_positions.long() // blocks)[:, :, None]
    see = see & key_mask.bool()[:, None, :]
    bias = torch.zeros(see.shape, dtype=dtype, device=key_mask.device)
    return bias.masked_fill_(~see, torch.finfo(dtype).min)[:, None]


def repeat_kv(k: torch.Tensor, v: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped key/value heads repeated to `heads` query heads."""
    if k.shape[1] == heads:
        return k, v
    groups = heads // k.shape[1]
    return k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


class FromConfigDict:
    """`from_dict` for the config dataclasses: the fields a `config.json` gives, None left out."""

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Any:
        fields = cls.__dataclass_fields__  # type: ignore[attr-defined]
        return cls(**{k: raw[k] for k in fields if k in raw and raw[k] is not None})


class HeadedLM(nn.Module):
    """The output head and `forward` of every family's model: `output_head()` (an `lm_head`
    by default), or the input embedding when `config.tie_word_embeddings`. A subclass
    defines `hidden_states` and `input_embedding()`."""

    # whether a cached step's pass may be captured as a CUDA graph (`cached_steps=graphs`,
    # `core/decoding/static_steps.py`): no host syncs, no shapes that depend on the data
    captures_cuda_graphs = False

    def input_embedding(self) -> nn.Embedding:
        raise NotImplementedError

    def output_head(self) -> nn.Module:
        """The untied output projection (LLaDA names it `transformer.ff_out`)."""
        return self.lm_head

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output head alone, so a sampler can apply it to the positions it needs."""
        if self.config.tie_word_embeddings:
            return F.linear(hidden, self.input_embedding().weight)
        return self.output_head()(hidden)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Raw logits (batch, length, vocabulary); `kwargs` go to `hidden_states`."""
        return self.logits_from_hidden(
            self.hidden_states(input_ids, attention_mask, position_ids, **kwargs)
        )
