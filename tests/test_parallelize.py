"""`parallelize=true`: one model spread over several devices (models/placement.py).

* A device map over each family's tiny official-format checkpoint gives the plain load's
  logits exactly: units mapped one by one to "cpu" (accelerate's hooks on every layer),
  and layers *offloaded* (their weights meta in the module, streamed from host memory for
  each pass, as a GPU run streams its "cpu" entries); a decode (LLaDA with each cache,
  LLaDA2's block diffusion) gives the same tokens. Only one device exists here, so what
  crosses GPUs (inputs moved by the hooks, results returned on the main device) is not run.
* The map computed on the meta device for LLaDA2.0-flash's published config places every
  layer on 4 x 80 GiB GPUs within budget; 2 x 80 GiB does not fit and is refused, or
  spills to the CPU with a CPU budget. accelerate takes integer GPU ids in `max_memory`
  without any GPU (it only logs that they are not available), so no CUDA is needed.
* The harness's model args (`parallelize`, `max_memory_per_gpu`, `max_cpu_memory`,
  `device_map`, `offload_folder`) are checked before any model work; the GPU budget is
  HFLM's (`gpu_budget`, with a stubbed GPU count); with the budget stubbed to the CPU, a
  `parallelize=True` harness model decodes as the plain one and records its map.
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest
import torch
from conftest import fixture_folder
from safetensors.torch import load_file, save_file

from lm_eval_dvoting.core.decoding import generate
from lm_eval_dvoting.integration import harness
from lm_eval_dvoting.integration.harness import LLaDAEvalModel
from lm_eval_dvoting.models import placement
from lm_eval_dvoting.models.llada2 import LLaDA2Config, LLaDA2Model
from lm_eval_dvoting.models.loading import (
    CheckpointError,
    _read_weights_placed,
    load_model,
    weight_files,
)
from lm_eval_dvoting.models.placement import PlacementError

FAMILIES = ["llada", "dream", "llada_moe", "llada2"]

# inclusionAI/LLaDA2.0-flash's config.json, as vendored by inclusionAI's own training framework:
# github.com/inclusionAI/dFactory configs/model_configs/llada2_flash/config.json (commit c29d72cc),
# where model_type reads "llada2_moe_veomni" (dFactory renames it; the hub's is "llada2_moe").
# 102.9B parameters, 191.6 GiB in bfloat16: "100B" as published.
FLASH_CONFIG = {
    "architectures": ["LLaDA2MoeModelLM"],
    "model_type": "llada2_moe",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "intermediate_size": 9216,
    "first_k_dense_replace": 1,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "num_shared_experts": 1,
    "moe_intermediate_size": 1024,
    "n_group": 8,
    "topk_group": 4,
    "routed_scaling_factor": 2.5,
    "partial_rotary_factor": 0.5,
    "rope_theta": 600000,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "vocab_size": 157184,
    "max_position_embeddings": 16384,
}
GIB = 1 << 30


def _ids(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of token ids below the fixtures' mask id, the second left-padded."""
    ids = torch.randint(0, 240, (2, 12), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    return ids, mask


def _layer_units(model: torch.nn.Module) -> list[str]:
    layer = placement.layer_class(model)
    return [
        unit
        for unit in placement.placement_units(model)
        if isinstance(model.get_submodule(unit), layer)
    ]


# ------------------------------------------------- identical logits under a device map


@pytest.mark.parametrize("family", FAMILIES)
def test_a_device_map_gives_the_plain_logits(family):
    folder = fixture_folder(family)
    plain = load_model(folder, device="cpu")
    units = placement.placement_units(plain)
    # mixed granularity: '' covers what the named units do not
    placed = load_model(folder, device_map={"": "cpu", units[1]: "cpu", units[-1]: "cpu"})
    assert list(placed.device_map) == units and set(placed.device_map.values()) == {"cpu"}
    assert (
        units[0].endswith(("wte", "embed_tokens", "word_embeddings"))
        and len(_layer_units(plain)) == 2
    )
    assert all(
        hasattr(placed.get_submodule(unit), "_hf_hook") for unit in units
    )  # every unit dispatched
    # one hook per unit: none on a resident layer's submodules (LLaDA2-flash has 768 expert
    # projections a layer, each hook a Python call per forward pass)
    assert not any(
        hasattr(sub, "_hf_hook")
        for unit in units
        for sub in placed.get_submodule(unit).modules()
        if sub is not placed.get_submodule(unit)
    )
    ids, mask = _ids()
    assert torch.equal(placed(ids, mask), plain(ids, mask))
    hidden = placed.hidden_states(ids, mask)
    expected = plain.logits_from_hidden(plain.hidden_states(ids, mask)[:, 3:])
    assert torch.equal(placed.logits_from_hidden(hidden[:, 3:]), expected)


@pytest.mark.parametrize("family", FAMILIES)
def test_offloaded_layers_give_the_plain_logits(family):
    """What a GPU run does with the budget's "cpu" entries, here on the CPU: the offloaded
    layers hold meta weights, streamed from host memory for each pass."""
    folder = fixture_folder(family)
    plain = load_model(folder, device="cpu")
    model = load_model(folder, device="cpu")
    device_map = placement.expand_device_map(model, {"": "cpu"})
    placement.dispatch(model, device_map, offload_cpu=True)
    layers = _layer_units(model)
    assert all(
        p.device.type == "meta" for unit in layers for p in model.get_submodule(unit).parameters()
    )
    assert next(model.parameters()).device.type == "cpu"  # the embedding is never offloaded
    ids, mask = _ids(1)
    assert torch.equal(model(ids, mask), plain(ids, mask))
    assert all(
        p.device.type == "meta" for unit in layers for p in model.get_submodule(unit).parameters()
    )


@pytest.mark.parametrize("offload", [False, True], ids=["hooks", "offloaded"])
@pytest.mark.parametrize(
    "family, settings",
    [
        ("llada", {"steps": 8, "cache": "none"}),
        ("llada", {"steps": 8, "cache": "prefix"}),  # cached keys/values stay beside their layer
        ("llada", {"steps": 8, "cache": "dual"}),
        ("llada2", {}),  # block diffusion with the block cache, LLaDA2's default
    ],
    ids=["llada", "llada-prefix", "llada-dual", "llada2-blocks"],
)
def test_a_dispatched_model_decodes_the_same_tokens(offload, family, settings):
    folder = fixture_folder(family)
    plain = load_model(folder, device="cpu")
    model = load_model(folder, device="cpu")
    placement.dispatch(model, placement.expand_device_map(model, {"": "cpu"}), offload_cpu=offload)
    ids, mask = _ids(2)
    expected = generate(plain, ids, mask, gen_length=8, block_length=4, **settings).tokens
    assert torch.equal(
        generate(model, ids, mask, gen_length=8, block_length=4, **settings).tokens, expected
    )


def test_each_weight_is_read_onto_its_units_device(tmp_path, monkeypatch):
    from lm_eval_dvoting.models import loading

    finite = loading._all_finite  # a meta tensor has no values to check
    monkeypatch.setattr(
        loading, "_all_finite", lambda tensor: tensor.device.type == "meta" or finite(tensor)
    )
    folder = fixture_folder("llada")
    model = load_model(folder, device="cpu")
    device_map = placement.expand_device_map(model, {"": "cpu"})
    on_meta = "model.transformer.blocks.1"
    device_of = placement.weight_device(device_map)

    def meta_or_mapped(name: str) -> torch.device:
        return torch.device("meta") if name.startswith(on_meta + ".") else device_of(name)

    state = _read_weights_placed(weight_files(folder), meta_or_mapped, torch.float32)
    assert set(state) == set(model.state_dict())
    assert (
        {name for name, t in state.items() if t.device.type == "meta"}
        == {name for name in state if name.startswith(on_meta + ".")}
        != set()
    )
    # the plain reader's checks hold: a NaN is refused, naming file and tensor
    broken = tmp_path / "llada"
    shutil.copytree(folder, broken)
    weights = load_file(broken / "model.safetensors")
    weights["model.transformer.blocks.0.ff_out.weight"][0, 0] = float("nan")
    save_file(weights, broken / "model.safetensors")
    with pytest.raises(CheckpointError, match="blocks.0.ff_out.weight.*NaN/inf"):
        load_model(broken, device_map={"": "cpu"})
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_model(broken, device_map={"": "cpu"})


@pytest.mark.parametrize(
    "device_map, says",
    [
        (
            {"": "cpu", "model.transformer.blocks.0.q_proj": "cpu"},
            "lies inside 'model.transformer.blocks.0'",
        ),
        ({"": "cpu", "model.transformer.block.0": "cpu"}, "no module"),
        ({"model.transformer.blocks": "cpu"}, "places no entry over"),
        ({"": "disk"}, "disk offload is not supported"),
        ({"": "tpu"}, "is not a device"),
        ({"": 3}, "CUDA sees"),
        ("balanced", "give 'auto' or a dict"),
    ],
)
def test_bad_device_maps_are_refused_before_any_weight_is_read(device_map, says, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ValueError, match=says):
        load_model(fixture_folder("llada"), device_map=device_map)


# ------------------------------------------------------ LLaDA2.0-flash on the meta device


@pytest.fixture(scope="module")
def flash() -> torch.nn.Module:
    with torch.device("meta"):
        return LLaDA2Model(LLaDA2Config.from_dict(FLASH_CONFIG))


def test_flash_fits_four_80gib_gpus_layer_by_layer(flash):
    budget = {gpu: "80GiB" for gpu in range(4)}
    device_map = placement.auto_device_map(flash, budget, torch.bfloat16)
    assert list(device_map) == placement.placement_units(flash)  # every unit placed
    assert (
        len(_layer_units(flash)) == 32 and len(device_map) == 35
    )  # embedding, 32 layers, norm, head
    assert set(device_map.values()) == {0, 1, 2, 3}  # no "cpu", no "disk"; every GPU used
    assert list(device_map.values()) == sorted(device_map.values())  # in forward order
    shares = placement.device_shares(flash, device_map, torch.bfloat16)
    assert sum(shares.values()) == pytest.approx(191.6 * GIB, rel=1e-3)
    assert all(share <= 80 * GIB for share in shares.values())
    balanced = placement.balanced_budget(flash, budget, torch.bfloat16)
    assert all(shares[gpu] <= balanced[gpu] for gpu in shares)
    assert max(shares.values()) < 60 * GIB  # spread out, not packed into the first GPUs
    # each weight is read onto its layer's GPU (torch.device needs no GPU to be named)
    device_of = placement.weight_device(device_map)
    for name in (
        "model.word_embeddings.weight",
        "model.layers.17.mlp.experts.255.down_proj.weight",
        "model.layers.31.mlp.gate.expert_bias",
        "lm_head.weight",
    ):
        unit = next(unit for unit in device_map if name.startswith(unit + "."))
        assert device_of(name) == torch.device("cuda", device_map[unit])
    assert placement.main_device(device_map) == torch.device("cuda", 0)


def test_flash_does_not_fit_two_80gib_gpus(flash):
    with pytest.raises(PlacementError) as refused:
        placement.auto_device_map(flash, {0: "80GiB", 1: "80GiB"}, torch.bfloat16)
    message = str(refused.value)
    assert "does not fit" in message and "191.6 GiB" in message and "max_cpu_memory=" in message
    # with a CPU budget the rest is offloaded there, every GPU within its own
    budget = {0: "80GiB", 1: "80GiB", "cpu": "120GiB"}
    device_map = placement.auto_device_map(flash, budget, torch.bfloat16)
    shares = placement.device_shares(flash, device_map, torch.bfloat16)
    assert set(shares) == {0, 1, "cpu"} and device_map["model.word_embeddings"] == 0
    assert shares[0] <= 80 * GIB and shares[1] <= 80 * GIB and shares["cpu"] <= 120 * GIB


# ------------------------------------------------------------------- the harness


@pytest.mark.parametrize(
    "args, says",
    [
        ("max_cpu_memory=100GiB", "max_cpu_memory='100GiB' applies with parallelize=True only"),
        ("device_map=auto", "applies with parallelize=True only"),
        ("parallelize=True,device_map=balanced", "device_map='balanced'"),
        (
            "parallelize=True,max_memory_per_gpu=lots",
            "max_memory_per_gpu='lots' is not a memory size",
        ),
        ("parallelize=True,max_cpu_memory=-5", "max_cpu_memory=-5 is not a memory size"),
        ("parallelize=maybe", "parallelize must be true or false"),
        ("parallelize=True,device=cpu", "device='cpu' with parallelize=True"),
        ("parallelize=True,reference=tiny-arith", "reference='tiny-arith' with parallelize=True"),
        ("parallelize=True,offload_folder=./off", "offloading to disk is not supported"),
        ("parallelize=True", "but CUDA sees none"),
    ],
)
def test_parallel_args_are_checked_before_the_model_loads(args, says, monkeypatch):
    def no_model(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model was loaded before the bad argument was refused")

    monkeypatch.setattr(harness, "load_model", no_model)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ValueError) as refused:
        LLaDAEvalModel.create_from_arg_string(f"pretrained=tiny-arith,{args}")
    assert says in str(refused.value)


def test_the_gpu_budget_is_hflms_split_by_local_process(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert placement.gpu_budget("80GiB") == {gpu: 80 * GIB for gpu in range(4)}
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert placement.gpu_budget(10**9, "100GiB") == {1: 10**9, 3: 10**9, "cpu": 100 * GIB}
    asked = []
    monkeypatch.setattr(
        torch.cuda, "mem_get_info", lambda gpu: (asked.append(gpu) or (gpu + 1) * GIB, 80 * GIB)
    )
    assert placement.gpu_budget() == {
        1: 2 * GIB,
        3: 4 * GIB,
    }  # free memory; no CPU offload unless asked
    assert asked == [1, 3]  # the other process's GPUs are left alone
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "5")
    with pytest.raises(PlacementError, match="none of the 4 visible falls to local process 5 of 8"):
        placement.gpu_budget("80GiB")


def test_a_lora_adapter_on_a_dispatched_model_gives_the_plain_logits():
    from lm_eval_dvoting.models.adapters import attach, read_adapter

    adapter = read_adapter("tiny-arith-lora")
    plain, placed = (
        load_model("tiny-arith", device="cpu"),
        load_model("tiny-arith", device_map={"": "cpu"}),
    )
    attach(plain, adapter)
    attach(placed, adapter)
    ids = torch.randint(0, 20, (2, 10), generator=torch.Generator().manual_seed(4))
    assert torch.equal(placed(ids), plain(ids))


class _Request:
    """The parts of lm-eval's Instance that generate_until reads."""

    def __init__(self, context: str, gen_kwargs: dict[str, Any], doc_id: int = 0) -> None:
        self.args = (context, gen_kwargs)
        self.task_name, self.doc_id = "dvoting_arith", doc_id


def test_a_parallelized_harness_model_decodes_as_the_plain_one(monkeypatch):
    """The budget stubbed to the CPU (no GPU here): the harness's own path, map to decode."""
    monkeypatch.setattr(harness, "gpu_budget", lambda per_gpu, cpu: {"cpu": 10**9})
    parallel = LLaDAEvalModel(pretrained="tiny-arith", strategy="single", parallelize=True)
    plain = LLaDAEvalModel(pretrained="tiny-arith", strategy="single", device="cpu")
    units = placement.placement_units(plain.model)
    info = parallel.get_model_info()["dvoting"]
    assert info["device_map"] == {unit: "cpu" for unit in units} and info["device"] == "cpu"
    assert plain.get_model_info()["dvoting"]["device_map"] is None
    requests = [
        _Request(f"{a}+{b}=", {"until": [], "max_gen_toks": 16}, doc_id=i)
        for i, (a, b) in enumerate([(1, 2), (13, 4), (25, 7)])
    ]
    assert [str(t) for t in parallel.generate_until(requests)] == [
        str(t) for t in plain.generate_until(requests)
    ]
