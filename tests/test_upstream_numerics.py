"""Each family's numerics as its own code computes them, in bfloat16 too: the rotary
embedding, the experts' weighted sum, and the settings upstream reads that we refuse.

The official fixtures' logits were computed in float32, where every way of rotating agrees;
in bfloat16 it matters in which dtype the rotation runs. LLaDA's code rotates in float32
(`rope_full_precision`, true in its checkpoints); Dream's, LLaDA-MoE's and LLaDA2's follow
transformers' Llama code, whose cos/sin tables are cast to the activations' dtype, so each
product and the sum round to bfloat16 (models/common.py, `rotary_tables`). The references
here are transformers' own classes (Dream's modeling code is transformers' Qwen2 with
bidirectional attention) and transcriptions of the upstream files (LLaDA's `RotaryEmbedding`,
LLaDA-MoE's `LLaDAMoESparseMoeBlock`, LLaDA2's gate and `moe_infer`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, Qwen2ForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from lm_eval_dvoting.models import dream, llada, llada_moe
from lm_eval_dvoting.models.common import apply_rotary, rotary_tables, rotate_pair
from lm_eval_dvoting.models.llada_moe import apply_partial_rotary
from lm_eval_dvoting.models.loading import CheckpointError, load_model

THETA = 1_000_000.0


def _positions(rows: int, length: int) -> torch.Tensor:
    """Positions of left-padded rows (row r starts r tokens late), as the decoder gives."""
    return torch.stack([(torch.arange(length) - r).clamp(min=0) for r in range(rows)])


def _edited_copy(folder: Path, tmp_path: Path, **changes) -> Path:
    """`folder` with its config.json changed (`None` removes a key), the rest linked."""
    for file in folder.iterdir():
        if file.name != "config.json":
            (tmp_path / file.name).symlink_to(file)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config.update(changes)
    config = {k: v for k, v in config.items() if v is not None or k not in changes}
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return tmp_path


IDS = torch.randint(0, 240, (1, 8), generator=torch.Generator().manual_seed(0))


def _logits(folder: Path, dtype: str = "float32") -> torch.Tensor:
    """The logits of `IDS` under the checkpoint in `folder`."""
    with torch.no_grad():
        return load_model(str(folder), device="cpu", dtype=dtype)(IDS)


def _refusal(folder: Path) -> str:
    """The message that refuses the checkpoint in `folder`, its weights removed first: the
    refusal must come before any weight is read."""
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError) as refused:
        load_model(str(folder), device="cpu", dtype="float32")
    return str(refused.value)


def _rotations(monkeypatch, module, folder: Path, dtype: str) -> list[tuple[torch.Tensor, ...]]:
    """The (x, cos, sin) of every rotation in a pass of `IDS` through the checkpoint in
    `folder`, `module` being the one whose `apply_rotary` its model calls."""
    seen = []

    def watched(x, cos, sin):
        seen.append((x, cos, sin))
        return apply_rotary(x, cos, sin)

    monkeypatch.setattr(module, "apply_rotary", watched)
    _logits(folder, dtype)
    return seen


def _transformers_rotation(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """`x` rotated by transformers' `LlamaRotaryEmbedding` and `apply_rotary_pos_emb`."""
    heads, head_dim = x.shape[1], x.shape[-1]
    config = LlamaConfig(hidden_size=heads * head_dim, num_attention_heads=heads, rope_theta=THETA)
    cos, sin = LlamaRotaryEmbedding(config)(x, positions)
    assert cos.dtype == x.dtype  # the tables in the activations' dtype: what is checked
    return apply_rotary_pos_emb(x, x, cos, sin)[0]


def _upstream_rotation(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """Dream's, LLaDA-MoE's and LLaDA2's own rotation, transcribed from their modeling files
    (frozen, whatever transformers does next): float32 tables cast to `x`'s dtype, the first
    `rotary_dim` dims of each head rotated (`rotate_half` within them), the rest passed."""
    inv_freq = 1.0 / (
        THETA ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim)
    )
    freqs = positions[..., None].float() * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)
    cos, sin = angles.cos().to(x.dtype)[:, None], angles.sin().to(x.dtype)[:, None]
    turned, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    first, second = turned[..., : rotary_dim // 2], turned[..., rotary_dim // 2 :]
    rotated = (turned * cos) + (torch.cat((-second, first), dim=-1) * sin)
    return torch.cat((rotated, passed), dim=-1)


def _llada_rotation(x: torch.Tensor, full_precision: bool) -> torch.Tensor:
    """LLaDA's `RotaryEmbedding.forward` for the keys (positions 0..length-1), transcribed:
    float32 under `rope_full_precision`, else the tables `type_as` the activations."""
    head_dim, length = x.shape[-1], x.shape[-2]
    rotated = x.float() if full_precision else x
    inv_freq = 1.0 / (THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    freqs = torch.einsum("i , j -> i j", torch.arange(length, dtype=torch.float), inv_freq)
    angles = torch.cat((freqs, freqs), dim=-1)
    sin, cos = angles.sin()[None, None].type_as(rotated), angles.cos()[None, None].type_as(rotated)
    batch, heads, length, size = rotated.size()
    first, second = rotated.view(batch, heads, length, 2, size // 2).unbind(dim=-2)
    turned = torch.cat((-second, first), dim=-1)  # LLaDA's `rotate_half`
    return ((rotated * cos) + (turned * sin)).to(rotated.dtype).type_as(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [16, 128])
def test_the_rotation_in_the_activations_dtype_is_transformers_bit_for_bit(dtype, head_dim):
    generator = torch.Generator().manual_seed(head_dim)
    x = (torch.randn(3, 4, 40, head_dim, generator=generator) * 8).to(dtype)
    positions = _positions(3, 40)
    ours = apply_rotary(x, *rotary_tables(positions, head_dim, THETA, dtype))
    assert ours.dtype == dtype
    assert torch.equal(ours, _transformers_rotation(x, positions))
    assert torch.equal(ours, _upstream_rotation(x, positions, head_dim))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_partial_rotation_turns_the_first_dims_as_upstream(dtype):
    """LLaDA2 (and LLaDA-MoE with `partial_rotary_factor` < 1) turn the first dims only."""
    generator = torch.Generator().manual_seed(2)
    x = (torch.randn(2, 4, 40, 64, generator=generator) * 8).to(dtype)
    positions = _positions(2, 40)
    ours = apply_partial_rotary(x, *rotary_tables(positions, 32, THETA, dtype))
    assert torch.equal(ours, _upstream_rotation(x, positions, 32))
    assert torch.equal(ours[..., 32:], x[..., 32:])


@pytest.mark.parametrize("tables_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads, kv_heads, rotated", [(4, 4, 16), (28, 4, 16), (4, 2, 8)])
def test_queries_and_keys_rotated_together_are_rotated_apart_bit_for_bit(
    tables_dtype, heads, kv_heads, rotated
):
    """`rotate_pair` lays q and k side by side and rotates once: the same bits as rotating
    each, for grouped heads, a partial rotation (8 of 16 dims), tables in float32 over
    bfloat16 activations (LLaDA) or in the activations' dtype, transposed inputs, batch 3.
    (Planted: the keys sliced one head off: failed.)"""
    generator = torch.Generator().manual_seed(heads)
    activations = torch.bfloat16 if tables_dtype == torch.float32 else tables_dtype
    q, k = (
        (torch.randn(3, 7, n, 16, generator=generator) * 8).to(activations).transpose(1, 2)
        for n in (heads, kv_heads)
    )
    tables = rotary_tables(_positions(3, 7), rotated, THETA, tables_dtype)
    found = rotate_pair(q, k, apply_partial_rotary, tables)
    expected = apply_partial_rotary(q, *tables), apply_partial_rotary(k, *tables)
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(found, expected))


@pytest.mark.parametrize("full_precision", [True, False])
def test_llada_rotation_is_llada_code_bit_for_bit(full_precision):
    generator = torch.Generator().manual_seed(1)
    x = (torch.randn(2, 4, 40, 128, generator=generator) * 8).to(torch.bfloat16)
    positions = _positions(1, 40).expand(2, 40)
    tables = rotary_tables(
        positions, 128, THETA, torch.float32 if full_precision else torch.bfloat16
    )
    assert torch.equal(apply_rotary(x, *tables), _llada_rotation(x, full_precision))
    # not vacuous: in bfloat16 the two precisions round otherwise
    assert not torch.equal(_llada_rotation(x, True), _llada_rotation(x, False))


def _qwen2_copy(dream_folder: Path, tmp_path: Path) -> Path:
    """Dream's checkpoint as transformers' Qwen2 reads it (the same parameter names)."""
    return _edited_copy(
        dream_folder,
        tmp_path,
        auto_map=None,
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
    )


ON_CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    ],
)


@pytest.mark.parametrize("device", ["cpu", ON_CUDA])
def test_dream_in_bfloat16_gives_the_logits_of_its_own_code(dream_fixture, tmp_path, device):
    """Dream's modeling code is transformers' Qwen2 with bidirectional attention (a 4-D mask
    of zeros; minus infinity at padded keys): in bfloat16 our Dream gives its logits bit for
    bit, a left-padded row's at its real positions. (transformers is the reference because
    Dream's file copies its Qwen2/Llama code; `dtype=` needs transformers 4.56 or later.)
    On CUDA both run PyTorch's SDPA with a mask, ours broadcast over the queries: a failure
    there may be the kernels' choice, not the rotation, which the CPU case pins."""
    reference = Qwen2ForCausalLM.from_pretrained(
        _qwen2_copy(dream_fixture, tmp_path), dtype=torch.bfloat16, attn_implementation="sdpa"
    )
    reference = reference.to(device).eval()
    assert reference.model.rotary_emb.inv_freq.dtype == torch.float32  # as from the hub
    ours = load_model(str(dream_fixture), device=device, dtype="bfloat16")
    ids = torch.randint(0, 240, (2, 12), generator=torch.Generator().manual_seed(0))
    attention = torch.ones_like(ids)
    attention[1, :3] = 0
    keep = attention.bool()[:, None, None, :].expand(2, 1, 12, 12)
    mask = torch.zeros(keep.shape, dtype=torch.bfloat16)
    mask = mask.masked_fill(~keep, torch.finfo(torch.bfloat16).min)
    positions = _positions(2, 12).clone()
    positions[0] = torch.arange(12)
    ids, attention, mask, positions = (t.to(device) for t in (ids, attention, mask, positions))
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        found = ours(ids, attention_mask=attention, position_ids=positions)
    assert torch.equal(found[0], expected[0])
    assert torch.equal(found[1, 3:], expected[1, 3:])


@pytest.mark.parametrize(
    "fixture, module, config_change, rotated_in",
    [
        ("llada_fixture", llada, {}, torch.float32),
        ("llada_fixture", llada, {"rope_full_precision": False}, torch.bfloat16),
        ("dream_fixture", dream, {}, torch.bfloat16),
        ("llada_moe_fixture", llada_moe, {}, torch.bfloat16),
        ("llada2_fixture", llada_moe, {}, torch.bfloat16),  # its partial rotary is llada_moe's
    ],
    ids=["llada", "llada-not-full-precision", "dream", "llada-moe", "llada2"],
)
def test_each_family_rotates_in_its_own_codes_dtype(
    request, tmp_path, monkeypatch, fixture, module, config_change, rotated_in
):
    folder = request.getfixturevalue(fixture)
    if config_change:
        folder = _edited_copy(folder, tmp_path, **config_change)
    seen = _rotations(monkeypatch, module, folder, "bfloat16")
    dtypes = {(x.dtype, cos.dtype, sin.dtype) for x, cos, sin in seen}
    assert seen and dtypes == {(torch.bfloat16, rotated_in, rotated_in)}


@pytest.mark.parametrize("fixture", ["dream_fixture", "llada_moe_fixture", "llada2_fixture"])
@pytest.mark.parametrize(
    "key, value",
    [
        ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}),
        ("rope_scaling", {"type": "linear", "factor": 2.0}),
        ("rope_parameters", {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
    ],
)
def test_a_scaled_rotary_embedding_is_refused_before_the_weights(
    request, tmp_path, fixture, key, value
):
    folder = _edited_copy(request.getfixturevalue(fixture), tmp_path, **{key: value})
    message = _refusal(folder)
    assert str(folder / "config.json") in message and key in message
    assert value.get("rope_type", value.get("type")) in message
    assert "default rotary embedding only" in message


def test_llada_reads_no_rope_scaling_as_its_own_code(llada_fixture, tmp_path):
    """LLaDA's modeling code has no `rope_scaling`: a config that carries one decodes as
    without it, as upstream would."""
    folder = _edited_copy(llada_fixture, tmp_path, rope_scaling={"rope_type": "yarn"})
    assert torch.equal(_logits(folder), _logits(llada_fixture))


@pytest.mark.parametrize("fixture", ["dream_fixture", "llada_moe_fixture", "llada2_fixture"])
def test_a_transformers_5_config_keeps_its_rotary_settings_in_rope_parameters(
    request, tmp_path, fixture
):
    """transformers 5 writes `rope_theta` (and `partial_rotary_factor`) inside
    `rope_parameters`; such a config decodes as the original one (not at a default theta)."""
    original_folder = request.getfixturevalue(fixture)
    config = json.loads((original_folder / "config.json").read_text(encoding="utf-8"))
    moved = {k: config[k] for k in ("rope_theta", "partial_rotary_factor") if k in config}
    folder = _edited_copy(
        original_folder,
        tmp_path,
        rope_parameters={"rope_type": "default", **moved},
        rope_scaling=None,
        **dict.fromkeys(moved),
    )
    assert "rope_theta" not in json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert torch.equal(_logits(folder), _logits(original_folder))


def test_llada_moe_turns_only_its_partial_rotary_dims(llada_moe_fixture, tmp_path, monkeypatch):
    """LLaDA-MoE's code rotates `head_dim * partial_rotary_factor` dims of each head (its
    released config: 1.0, the whole head)."""
    folder = _edited_copy(llada_moe_fixture, tmp_path, partial_rotary_factor=0.5)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    seen = _rotations(monkeypatch, llada_moe, folder, "float32")
    widths = {(x.shape[-1], cos.shape[-1]) for x, cos, _ in seen}
    assert seen and widths == {(head_dim // 2, head_dim // 2)}


def _expert(experts, index: int, x: torch.Tensor) -> torch.Tensor:
    """Upstream's expert MLP, `down(silu(gate(x)) * up(x))`, as `nn.Linear`s of its weights."""
    gate, up, down = (w[index] for w in (experts.gate_proj, experts.up_proj, experts.down_proj))
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def _llada_moe_block(block, x: torch.Tensor) -> torch.Tensor:
    """LLaDA-MoE's `LLaDAMoESparseMoeBlock.forward` (OLMoE's), transcribed: softmax routing in
    float32, the weights cast to the activations' dtype, each expert's weighted output added
    by `index_add_` into a tensor of that dtype, experts in ascending order."""
    hidden = x.reshape(-1, x.shape[-1])
    weights = F.softmax(F.linear(hidden, block.gate.weight), dim=1, dtype=torch.float)
    if block.gate.expert_bias is not None:
        weights += block.gate.expert_bias
    weights, selected = torch.topk(weights, block.gate.top_k, dim=-1)
    weights = weights.to(hidden.dtype)
    out = torch.zeros_like(hidden)
    mask = F.one_hot(selected, num_classes=len(block.experts)).permute(2, 1, 0)
    for index in range(len(block.experts)):
        slot, token = torch.where(mask[index])
        current = _expert(block.experts, index, hidden[token]) * weights[token, slot, None]
        out.index_add_(0, token, current.to(hidden.dtype))
    return out.view(x.shape)


def _llada2_mlp(mlp, x: torch.Tensor) -> torch.Tensor:
    """LLaDA2's gate and `moe_infer`, transcribed: sigmoid scores in float32, group-limited
    top-k on the biased scores, normalised weights times the scaling, the weighted sum in
    float32 over the top-k (descending score) and rounded once, the shared expert added."""
    gate, hidden = mlp.gate, x.reshape(-1, x.shape[-1])
    scores = torch.sigmoid(F.linear(hidden.float(), gate.weight.float()))
    routed = scores + gate.expert_bias
    tokens = hidden.shape[0]
    group_scores = routed.view(tokens, gate.groups, -1).topk(2, dim=-1)[0].sum(dim=-1)
    groups = torch.topk(group_scores, k=gate.top_groups, dim=-1, sorted=False)[1]
    keep = torch.zeros_like(group_scores).scatter_(1, groups, 1)
    per_group = len(mlp.experts) // gate.groups
    keep = keep.unsqueeze(-1).expand(tokens, gate.groups, per_group).reshape(tokens, -1)
    chosen = torch.topk(routed.masked_fill(~keep.bool(), float("-inf")), gate.top_k, dim=-1)[1]
    weights = torch.gather(scores, dim=1, index=chosen)
    weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20) * gate.scaling
    order = chosen.view(-1).argsort()
    outputs = torch.empty(len(order), hidden.shape[-1], dtype=hidden.dtype)
    for index in range(len(mlp.experts)):
        runs = order[chosen.view(-1)[order] == index]
        outputs[runs] = _expert(mlp.experts, index, hidden[runs // chosen.shape[1]])
    summed = outputs.view(*chosen.shape, -1).float().mul_(weights.unsqueeze(-1)).sum(dim=1)
    out = summed.to(hidden.dtype).view(x.shape)
    return out if mlp.shared_experts is None else out + mlp.shared_experts(x)


@pytest.mark.parametrize(
    "fixture, transcription, many",
    [
        ("llada_moe_fixture", _llada_moe_block, {"num_experts_per_tok": 4}),
        ("llada2_fixture", _llada2_mlp, {"num_experts_per_tok": 8, "topk_group": 4}),
    ],
    ids=["llada-moe", "llada2"],
)
@pytest.mark.parametrize("experts_per_token", ["released-2", "all"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_experts_weighted_sum_is_upstreams_bit_for_bit(
    request, tmp_path, fixture, transcription, many, experts_per_token, dtype
):
    """LLaDA-MoE's code adds its experts' weighted outputs in the activations' dtype, experts
    ascending; LLaDA2's in float32 over its router's order (models/moe.py): each of our sparse
    MLPs gives its upstream's outputs bit for bit. With every expert of a token chosen, the
    order of the sum shows too (two terms add the same either way)."""
    folder = request.getfixturevalue(fixture)
    if experts_per_token == "all":
        folder = _edited_copy(folder, tmp_path, **many)
    model = load_model(str(folder), device="cpu", dtype=dtype)
    sparse = [layer.mlp for layer in model.model.layers if hasattr(layer.mlp, "experts")]
    generator = torch.Generator().manual_seed(len(many))
    x = torch.randn(3, 32, model.config.hidden_size, generator=generator) * 2
    x = x.to(getattr(torch, dtype))
    with torch.no_grad():
        for mlp in sparse:
            assert torch.equal(mlp(x), transcription(mlp, x))


@pytest.mark.parametrize(
    "fixture, key, value",
    [
        ("llada_moe_fixture", "shared_expert_intermediate_size", 64),
        ("llada_moe_fixture", "qk_layernorm", False),
        ("llada2_fixture", "use_qk_norm", False),
    ],
)
def test_a_setting_we_run_at_one_value_only_is_refused_at_another(
    request, tmp_path, fixture, key, value
):
    """Upstream reads these settings; we run the released checkpoints' values only, so
    another is refused before any weight is read (not decoded as if it were ours)."""
    folder = _edited_copy(request.getfixturevalue(fixture), tmp_path, **{key: value})
    message = _refusal(folder)
    assert str(folder / "config.json") in message
    assert f"{key}={json.dumps(value)}" in message and "only" in message


def test_llada_moe_clamps_queries_keys_and_values_to_clip_qkv(
    llada_moe_fixture, tmp_path, monkeypatch
):
    """Upstream clamps q, k and v to +-`clip_qkv` after the norms, before the rotation: the
    values stay within the bound, the rotated queries and keys within bound x sqrt(2) (a
    rotated pair's length) and beyond the bound somewhere (clamped before the rotation)."""
    folder = _edited_copy(llada_moe_fixture, tmp_path, clip_qkv=0.05)
    unclipped = _logits(llada_moe_fixture)
    seen = []
    real = F.scaled_dot_product_attention

    def watched(q, k, v, *args, **kwargs):
        seen.append([t.abs().max().item() for t in (q, k, v)])
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", watched)
    found = _logits(folder)
    bound = float(torch.tensor(0.05))  # the clamp's bound in float32
    queries, keys, values = (max(column) for column in zip(*seen))
    assert values <= bound
    for rotated in (queries, keys):
        assert bound < rotated <= bound * 2**0.5 + 1e-6
    assert not torch.equal(found, unclipped)


def test_llada_moe_without_qk_layernorm_is_refused_as_upstream_reads_it_unnormed(
    llada_moe_fixture, tmp_path
):
    """Upstream's config class defaults `qk_layernorm` to None (no norms on the queries and
    keys): a config.json that leaves it out is refused, not run with the norms."""
    folder = _edited_copy(llada_moe_fixture, tmp_path, qk_layernorm=None)
    assert "qk_layernorm" not in json.loads((folder / "config.json").read_text())
    assert "lacks qk_layernorm (upstream's default: null)" in _refusal(folder)
