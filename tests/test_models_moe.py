"""The native LLaDA-MoE and LLaDA2 modules (issue 22) against the tensors the upstream code
computed (tests/fixtures/official-tiny/README.md), and the loader telling the families apart."""

from __future__ import annotations

import functools
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from lm_eval_dvoting.models.loading import CheckpointError, load_model
from lm_eval_dvoting.models.moe import Experts

TOLERANCE = 1e-4


@functools.lru_cache(maxsize=None)
def _load(folder: str) -> nn.Module:
    return load_model(folder, device="cpu", dtype="float32")


def _expected(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "expected.safetensors"))


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def test_llada_moe_reproduces_upstream_logits(llada_moe_fixture: Path):
    model, expected = _load(str(llada_moe_fixture)), _expected(llada_moe_fixture)
    with torch.no_grad():
        plain = model(expected["input_ids"])
        padded = model(expected["input_ids"], expected["attention_mask"])
    assert model.family == "llada_moe" and plain.dtype == torch.float32
    assert _gap(plain, expected["logits"]) < TOLERANCE
    # the padded batch: row 1's pad keys removed (not upstream's ignored mask)
    assert _gap(padded, expected["logits_masked_dllm"]) < TOLERANCE
    assert (
        _gap(expected["logits"][1, 3:], expected["logits_masked_dllm"][1, 3:]) > 1e-2
    )  # not vacuous


def test_llada2_reproduces_upstream_logits(llada2_fixture: Path):
    model, expected = _load(str(llada2_fixture)), _expected(llada2_fixture)
    ids = expected["input_ids"]
    with torch.no_grad():
        plain = model(ids)
        padded = model(ids, expected["attention_mask"])
        block = model(
            ids,
            position_ids=expected["position_ids"].expand(2, -1),
            block_lengths=torch.tensor([4, 4]),
        )
    assert model.family == "llada2"
    assert _gap(plain, expected["logits"]) < TOLERANCE
    assert _gap(padded, expected["logits_pad4d"]) < TOLERANCE
    assert _gap(block, expected["logits_block"]) < TOLERANCE
    assert _gap(expected["logits"], expected["logits_block"]) > 1e-2  # block-causal really differs


@pytest.mark.parametrize("family", ["llada_moe", "llada2"])
def test_a_padded_row_gives_the_logits_of_the_row_alone(request, family: str):
    folder = request.getfixturevalue(f"{family}_fixture")
    model, expected = _load(str(folder)), _expected(folder)
    ids, mask = expected["input_ids"], expected["attention_mask"]
    with torch.no_grad():
        padded = model(ids, mask)
        alone = model(ids[1:, 3:])
    assert _gap(padded[1, 3:], alone[0]) < TOLERANCE


def test_llada2_block_causal_padded_row_matches_the_row_alone(llada2_fixture: Path):
    """Blocks count from a row's first real token: left padding moves no block boundary."""
    model, expected = _load(str(llada2_fixture)), _expected(llada2_fixture)
    ids, mask = expected["input_ids"], expected["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        padded = model(ids, mask, positions, block_lengths=torch.tensor([4, 4]))
        alone = model(ids[1:, 3:], block_lengths=torch.tensor([4]))
    assert _gap(padded[1, 3:], alone[0]) < TOLERANCE


def _experts(count: int, width: int, hidden: int, dtype: torch.dtype = torch.float32) -> Experts:
    torch.manual_seed(0)
    experts = Experts(count, width, hidden).to(dtype)
    for weight in experts.parameters():
        nn.init.normal_(weight, std=0.5)
    return experts


def _routing(tokens: int, experts: int, k: int, seed: int = 1):
    """Random (chosen, weights) with k different experts per token, in no sorted order."""
    g = torch.Generator().manual_seed(seed)
    chosen = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    return chosen, torch.rand(tokens, k, generator=g)


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "loop"])
def test_experts_run_batched_equal_a_loop_over_tokens(monkeypatch, grouped: bool):
    """Both ways of running the experts (grouped GEMMs, the loop over experts) give each
    token the weighted sum of its experts, each expert's SwiGLU written out by hand."""
    from lm_eval_dvoting.models import moe

    experts = _experts(5, 8, 4)  # widths of 16 bytes: the grouped GEMMs apply on the CPU
    assert moe.grouped_applies(torch.zeros(1, 8), experts.gate_proj)
    if not grouped:
        monkeypatch.setattr(moe, "grouped_applies", lambda x, weight: False)
    x = torch.randn(11, 8)
    chosen, weights = _routing(11, 5, 2)

    def swiglu(e: int, v: torch.Tensor) -> torch.Tensor:
        gate, up = experts.gate_proj[e] @ v, experts.up_proj[e] @ v
        return experts.down_proj[e] @ (F.silu(gate) * up)

    slow = torch.stack(
        [sum(weights[t, j] * swiglu(int(chosen[t, j]), x[t]) for j in range(2)) for t in range(11)]
    )
    assert _gap(experts(x, chosen, weights), slow) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_grouped_experts_equal_the_loop_bit_for_bit_on_the_cpu(monkeypatch, dtype):
    """The grouped GEMMs and the loop over experts (what CUDA runs outside bfloat16 on
    compute capability 9/10) give the same bits on the CPU, every expert hit or not."""
    from lm_eval_dvoting.models import moe

    experts = _experts(16, 64, 32, dtype)
    x = torch.randn(40, 64).to(dtype)
    chosen, weights = _routing(40, 12, 4)  # experts 12-15 receive nothing
    grouped = experts(x, chosen, weights)
    monkeypatch.setattr(moe, "grouped_applies", lambda x, weight: False)
    assert torch.equal(grouped, experts(x, chosen, weights))


def _index_add_forward(experts: Experts, x, chosen, weights) -> torch.Tensor:
    """The layer as it ran before the grouped GEMMs (f711f85): the assignments sorted by
    expert, a loop over the experts that received tokens, `index_add_` of their weighted
    outputs (on the CPU it adds in index order: each token's experts ascending)."""
    tokens, k = chosen.shape
    order = chosen.flatten().argsort(stable=True)
    counts = torch.bincount(chosen.flatten(), minlength=len(experts)).tolist()
    token_of, weight_of = order // k, weights.flatten()[order]
    out = torch.zeros((tokens, x.shape[-1]), dtype=torch.float32)
    begin = 0
    for expert, count in enumerate(counts):
        if count:
            rows = token_of[begin : begin + count]
            y = experts.expert(expert, x[rows]).float() * weight_of[begin : begin + count, None]
            out.index_add_(0, rows, y)
            begin += count
    return out.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("k", [1, 3])
def test_the_layer_gives_the_bits_it_gave_before_the_grouped_gemms(dtype, k):
    """The same bits as the old loop with `index_add_`, k = 1 included (what keeps the
    fixtures' decodes as they were). (Planted: the sum in the router's order instead of
    ascending: failed.)"""
    experts = _experts(16, 64, 32, dtype)
    x = torch.randn(40, 64).to(dtype)
    chosen, weights = _routing(40, 12, k, seed=k)  # experts 12-15 receive nothing
    with torch.no_grad():
        assert torch.equal(
            experts(x, chosen, weights), _index_add_forward(experts, x, chosen, weights)
        )


def test_a_large_pass_runs_in_parts_of_the_tokens(monkeypatch):
    """Past `ASSIGNMENTS_AT_ONCE` (token, expert) pairs the tokens run in consecutive parts,
    each token's sum as a whole pass gives it (up to the GEMMs' rounding for other row
    counts), and an empty pass gives an empty result."""
    from lm_eval_dvoting.models import moe

    experts = _experts(8, 16, 8)
    x = torch.randn(23, 16)
    chosen, weights = _routing(23, 8, 2)
    whole = experts(x, chosen, weights)
    calls, route = [], Experts.route

    def counted(self: Experts, chosen: torch.Tensor):
        calls.append(len(chosen))
        return route(self, chosen)

    monkeypatch.setattr(moe, "ASSIGNMENTS_AT_ONCE", 10)  # 5 tokens at k = 2
    monkeypatch.setattr(Experts, "route", counted)
    parts = experts(x, chosen, weights)
    assert calls == [5, 5, 5, 5, 3] and _gap(parts, whole) < 1e-5
    empty = experts(x[:0], chosen[:0], weights[:0])
    assert empty.shape == (0, 16) and empty.dtype == x.dtype


def test_a_tokens_experts_are_added_in_ascending_order(monkeypatch):
    """A token's weighted expert outputs are added (in the weights' dtype) from its lowest
    expert up, whatever order the router gave them in (no atomics: the same order on every
    device). Expert outputs 1, 1e8, -1e8 (experts 0, 1, 2) sum to 0 that way, to 1 from
    expert 1."""
    experts = _experts(3, 8, 4)
    outputs = torch.tensor([1.0, 1e8, -1e8])

    def run(x: torch.Tensor, routing) -> torch.Tensor:
        expert_of = torch.searchsorted(routing.ends, torch.arange(len(x)), right=True)
        return outputs[expert_of, None].expand(-1, x.shape[-1]).contiguous()

    monkeypatch.setattr(Experts, "run", staticmethod(run))
    chosen = torch.tensor([[1, 2, 0], [0, 1, 2], [2, 0, 1]])
    out = experts(torch.zeros(3, 8), chosen, torch.ones(3, 3))
    assert torch.equal(out, torch.zeros(3, 8))
    assert (outputs[1] + outputs[2]) + outputs[0] == 1  # the order matters for these


def test_experts_not_ascending_add_in_the_routers_order(monkeypatch):
    """`ascending=False` (LLaDA2, as its `moe_infer` sums over its top-k): a token's outputs
    are added in the order the router gave its experts. Experts 1, 2, 0 (outputs 1e8, -1e8,
    1) sum to 1 that way; experts 0, 1, 2 to 0."""
    experts = Experts(3, 8, 4, ascending=False)
    outputs = torch.tensor([1.0, 1e8, -1e8])

    def run(x: torch.Tensor, routing) -> torch.Tensor:
        expert_of = torch.searchsorted(routing.ends, torch.arange(len(x)), right=True)
        return outputs[expert_of, None].expand(-1, x.shape[-1]).contiguous()

    monkeypatch.setattr(Experts, "run", staticmethod(run))
    chosen = torch.tensor([[1, 2, 0], [0, 1, 2]])
    out = experts(torch.zeros(2, 8), chosen, torch.ones(2, 3))
    assert torch.equal(out, torch.tensor([[1.0] * 8, [0.0] * 8]))


def test_grouped_experts_read_nothing_on_the_host_and_the_loop_reads_once(monkeypatch):
    """The grouped GEMMs take the experts' bounds on the device: a MoE layer's pass waits
    for nothing (on a GPU); the loop over experts reads the counts once."""
    from bench.host_reads_bench import HostReads
    from lm_eval_dvoting.models import moe

    experts = _experts(8, 16, 8)
    x = torch.randn(6, 16)
    chosen, weights = _routing(6, 8, 2)
    with HostReads() as reads:
        experts(x, chosen, weights)
    assert dict(reads.calls) == {}
    monkeypatch.setattr(moe, "grouped_applies", lambda x, weight: False)
    with HostReads() as reads:
        experts(x, chosen, weights)
    assert dict(reads.calls) == {"tolist": 1}


def test_grouped_gemms_apply_where_the_widths_are_16_bytes():
    from lm_eval_dvoting.models.moe import grouped_applies

    assert grouped_applies(torch.zeros(1, 8), torch.zeros(2, 4, 8))  # 16 and 32 bytes
    assert not grouped_applies(torch.zeros(1, 6), torch.zeros(2, 4, 6))  # 24 bytes
    assert grouped_applies(torch.zeros(1, 8, dtype=torch.bfloat16), torch.zeros(2, 8, 8))
    assert not grouped_applies(torch.zeros(1, 8, dtype=torch.bfloat16), torch.zeros(2, 4, 8))
    assert not grouped_applies(torch.zeros(1, 8, device="meta"), torch.zeros(2, 4, 8))


def test_the_model_stacks_the_experts_a_checkpoint_names_one_by_one(llada2_fixture: Path):
    model = _load(str(llada2_fixture))
    stored = load_file(str(llada2_fixture / "model.safetensors"))
    layer = next(n for n in stored if ".experts.1.up_proj." in n).split(".experts.")[0]
    experts = model.get_submodule(f"{layer}.experts")
    assert f"{layer}.experts.up_proj" in model.state_dict()
    for e in range(len(experts)):
        assert torch.equal(experts.up_proj[e], stored[f"{layer}.experts.{e}.up_proj.weight"])


def test_a_file_of_the_models_own_state_dict_loads_too(llada2_fixture: Path, tmp_path: Path):
    """A checkpoint written from this package's `state_dict()` holds the experts stacked:
    it loads as the official per-expert layout does, to the same weights."""
    model = _load(str(llada2_fixture))
    folder = _copy(llada2_fixture, tmp_path)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    again = load_model(folder, device="cpu", dtype="float32")
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in state.items())


def test_a_missing_or_misshapen_expert_is_named(llada2_fixture: Path, tmp_path: Path):
    folder = _copy(llada2_fixture, tmp_path)
    stored = load_file(str(llada2_fixture / "model.safetensors"))
    name = next(n for n in stored if ".experts.3.down_proj." in n)
    save_file({k: v for k, v in stored.items() if k != name}, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=rf"(?s)missing \['{re.escape(name)}'\]"):
        load_model(folder, device="cpu")
    save_file(
        {**stored, name: stored[name][:, :-1].contiguous()}, str(folder / "model.safetensors")
    )
    with pytest.raises(CheckpointError, match=rf"{re.escape(name)} has shape \(64, 31\)"):
        load_model(folder, device="cpu")


def _copy(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / folder.name
    shutil.copytree(folder, target)
    return target


def test_llada_moe_is_not_read_as_dense_llada(llada_moe_fixture: Path, tmp_path: Path):
    """LLaDA-MoE's model_type is 'llada', like dense LLaDA's: architectures and the MoE
    fields decide, and a config whose architectures and fields disagree is refused."""
    config = json.loads((llada_moe_fixture / "config.json").read_text())
    assert config["model_type"] == "llada"
    folder = _copy(llada_moe_fixture, tmp_path)
    del config["architectures"]  # no architectures: the MoE fields decide
    (folder / "config.json").write_text(json.dumps(config))
    assert load_model(folder).family == "llada_moe"
    config["architectures"] = ["LLaDAModelLM"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"(?s)LLaDAModelLM.*num_experts"):
        load_model(folder)


def test_llada2_config_without_experts_is_refused(llada2_fixture: Path, tmp_path: Path):
    folder = _copy(llada2_fixture, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config["num_experts"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="num_experts"):
        load_model(folder)


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_llada_moe_decodes_like_llada_with_every_cache(llada_moe_fixture: Path, cache: str):
    """LLaDA-MoE decodes as dense LLaDA does (bidirectional, semi-autoregressive blocks),
    Fast-dLLM's caches included; a padded row decodes as the row alone (greedy, float32)."""
    from lm_eval_dvoting.core.decoding import generate

    model = _load(str(llada_moe_fixture))
    expected = _expected(llada_moe_fixture)
    ids, mask = expected["input_ids"][:, :8], expected["attention_mask"][:, :8]
    batched = generate(model, ids, mask, gen_length=8, block_length=4, steps=8, cache=cache)
    alone = generate(model, ids[1:, 3:], gen_length=8, block_length=4, steps=8, cache=cache)
    assert torch.equal(batched.tokens[1], alone.tokens[0])
    assert int((batched.tokens == model.mask_token_id).sum()) == 0
