"""The native LLaDA-MoE and LLaDA2 modules (issue 22) against the tensors the upstream code
computed (tests/fixtures/official-tiny/README.md), and the loader telling the families apart."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
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


def test_experts_run_batched_equal_a_loop_over_tokens():
    torch.manual_seed(0)
    experts = Experts(5, 8, 6)
    x = torch.randn(11, 8)
    chosen = torch.randint(0, 5, (11, 2))
    chosen[:, 1] = (chosen[:, 0] + 1) % 5  # two different experts per token
    weights = torch.rand(11, 2)
    slow = torch.stack(
        [sum(weights[t, j] * experts[int(chosen[t, j])](x[t]) for j in range(2)) for t in range(11)]
    )
    assert _gap(experts(x, chosen, weights), slow) < 1e-5


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
