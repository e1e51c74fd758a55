"""LoRA adapters in the PEFT format on the native models (`peft=`, models/adapters.py),
checked against adapters written by `peft` itself for the official parameter names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lora import D1_TARGETS, OFFICIAL, peft_adapter
from safetensors.torch import load_file, save_file

from lm_eval_dvoting.models import adapters
from lm_eval_dvoting.models.adapters import AdapterError
from lm_eval_dvoting.models.loading import load_model

IDS = torch.randint(0, 90, (2, 10), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(
    "family, targets, adapted, extra",
    [
        ("llada", D1_TARGETS, {"q_proj", "k_proj", "v_proj", "up_proj"}, {}),
        (
            "dream",
            D1_TARGETS,
            {"q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj"},
            {},
        ),
        (
            "llada",
            ["q_proj", "up_proj"],
            {"q_proj", "up_proj"},
            {"use_rslora": True},
        ),  # scale alpha / sqrt(r)
    ],
)
def test_an_adapter_written_by_peft_gives_peft_logits_off_gives_the_base_and_merged_the_same(
    family, targets, adapted, extra, tmp_path
):
    folder, written = peft_adapter(OFFICIAL / family, tmp_path / "adapter", targets, **extra)
    with torch.no_grad():
        expected = written(input_ids=IDS) if family == "dream" else written(IDS)
    expected = getattr(expected, "logits", expected)
    model = load_model(OFFICIAL / family, device="cpu", dtype="float32")
    with torch.no_grad():
        base = model(IDS)
    adapter = adapters.read_adapter(folder)
    assert {
        name.rsplit(".", 1)[-1] for name in adapter.weights
    } == adapted  # what the saved weights name
    adapters.attach(model, adapter)
    with torch.no_grad():
        on = model(IDS)
        with adapters.enabled(model, False):
            off = model(IDS)
        again = model(IDS)
    assert torch.equal(on, expected) and torch.equal(off, base) and torch.equal(again, on)
    assert (on - base).abs().max() > 1e-2  # not vacuous: the adapter changes the logits
    adapters.merge(model)
    with torch.no_grad():
        merged = model(IDS)
    torch.testing.assert_close(merged, on, rtol=1e-5, atol=1e-4)


def test_a_target_that_also_names_llada_s_output_head_adapts_only_the_trained_modules(tmp_path):
    """`ff_out` is the blocks' MLP output and the model's head in LLaDA: the adapter's saved
    weights, not the config's names, say which were trained."""
    folder, _ = peft_adapter(
        OFFICIAL / "llada", tmp_path / "a", r"model\.transformer\.blocks\.\d+\.ff_out"
    )
    config = json.loads((folder / "adapter_config.json").read_text())
    config["target_modules"] = ["ff_out"]  # as a training config would say it
    (folder / "adapter_config.json").write_text(json.dumps(config))
    model = load_model(OFFICIAL / "llada", device="cpu", dtype="float32")
    adapters.attach(model, adapters.read_adapter(folder))
    wrapped = sorted(name for name, module in model.named_modules() if adapters._is_lora(module))
    assert wrapped and all(".blocks." in name for name in wrapped)
    assert not adapters._is_lora(model.model.transformer.ff_out)


def _edit_weights(folder: Path, change) -> None:
    weights = load_file(str(folder / "adapter_model.safetensors"))
    save_file(change(weights), str(folder / "adapter_model.safetensors"))


def test_an_adapter_that_does_not_fit_is_refused_with_the_names(tmp_path):
    folder, _ = peft_adapter(OFFICIAL / "llada", tmp_path / "a", ["q_proj"])
    key = next(k for k in load_file(str(folder / "adapter_model.safetensors")) if "lora_A" in k)
    _edit_weights(folder, lambda w: w | {key: torch.zeros(4, 7)})
    model = load_model(OFFICIAL / "llada", device="cpu", dtype="float32")
    module = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
    with pytest.raises(
        AdapterError, match=rf"does not fit this model \(LLaDAModel\): {module}: lora_A \(4, 7\)"
    ):
        adapters.attach(model, adapters.read_adapter(folder))
    dream_model = load_model(OFFICIAL / "dream", device="cpu", dtype="float32")
    fresh, _ = peft_adapter(OFFICIAL / "llada", tmp_path / "b", ["q_proj"])
    with pytest.raises(
        AdapterError, match=r"model\.transformer\.blocks\.0\.q_proj: no such module in the model"
    ):
        adapters.attach(dream_model, adapters.read_adapter(fresh))  # a LLaDA adapter on Dream


@pytest.mark.parametrize(
    "change, says",
    [
        (
            lambda c: c | {"use_dora": True},
            "sets use_dora=True, which this loader does not support",
        ),
        (lambda c: c | {"bias": "all"}, "sets bias='all'"),
        (lambda c: c | {"modules_to_save": ["lm_head"]}, "sets modules_to_save"),
        (lambda c: c | {"rank_pattern": {"q_proj": 8}}, "sets rank_pattern"),
        (lambda c: c | {"peft_type": "IA3"}, "peft_type='IA3'; only LoRA adapters"),
        (lambda c: c | {"alora_invocation_tokens": [5, 6]}, "sets alora_invocation_tokens=[5, 6]"),
        (lambda c: c | {"use_qalora": True}, "sets use_qalora=True"),
        (lambda c: c | {"some_future_feature": 1}, "sets some_future_feature=1"),
        (
            lambda c: {k: v for k, v in c.items() if k != "r"},
            "has r=None; a LoRA adapter needs a positive r",
        ),
    ],
)
def test_adapter_features_this_loader_does_not_apply_are_refused(change, says, tmp_path):
    folder, _ = peft_adapter(OFFICIAL / "llada", tmp_path / "a", ["q_proj"])
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps(change(config)))
    with pytest.raises(
        AdapterError, match=says.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        adapters.read_adapter(folder)


def test_missing_files_and_foreign_weights_are_refused(tmp_path):
    with pytest.raises(AdapterError, match=r"peft='/no/such/adapter': no such folder"):
        adapters.read_adapter("/no/such/adapter")
    folder, _ = peft_adapter(OFFICIAL / "llada", tmp_path / "a", ["q_proj"])
    _edit_weights(folder, lambda w: w | {"model.transformer.wte.weight": torch.zeros(2, 2)})
    with pytest.raises(
        AdapterError, match=r"holds 'model.transformer.wte.weight', which is no LoRA weight"
    ):
        adapters.read_adapter(folder)
    _edit_weights(
        folder, lambda w: {k: v for k, v in w.items() if "lora_B" not in k and "wte" not in k}
    )
    with pytest.raises(
        AdapterError, match=r"lacks lora_A or lora_B for model.transformer.blocks.0.q_proj"
    ):
        adapters.read_adapter(folder)
    (folder / "adapter_config.json").unlink()
    with pytest.raises(AdapterError, match=r"the folder has no adapter_config.json"):
        adapters.read_adapter(folder)


def test_peft_through_the_harness_changes_the_model_and_its_fingerprint(tmp_path):
    from lm_eval_dvoting.integration import result_cache
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    folder, _ = peft_adapter(
        Path(__file__).resolve().parents[1] / "lm_eval_dvoting" / "demo" / "tiny-arith",
        tmp_path / "a",
        ["q_proj", "v_proj"],
        alpha=64,
    )
    base = LLaDAEvalModel(pretrained="tiny-arith", device="cpu")
    adapted = LLaDAEvalModel(pretrained="tiny-arith", device="cpu", peft=str(folder))
    ids = torch.randint(4, 40, (1, 12))
    with torch.no_grad():
        assert not torch.allclose(base.model(ids), adapted.model(ids))
    info = adapted.get_model_info()["dvoting"]["peft"]
    assert info == {"source": str(folder), "digest": adapters.read_adapter(folder).identity}
    assert base.get_model_info()["dvoting"]["peft"] is None
    assert result_cache.fingerprint(adapted)["peft"] == info["digest"]
    assert result_cache.fingerprint(base)["peft"] is None
    other, _ = peft_adapter(
        Path(__file__).resolve().parents[1] / "lm_eval_dvoting" / "demo" / "tiny-arith",
        tmp_path / "b",
        ["q_proj", "v_proj"],
        alpha=64,
        seed=1,
    )  # other weights, same names
    assert adapters.read_adapter(other).identity != info["digest"]


# ------------------------------------------------------------------ kill tests (mutation runs)


def test_a_hub_id_fetches_only_the_two_adapter_files_at_the_revision(tmp_path, monkeypatch):
    """`org/name` (one slash, no suffix, no such folder) is a hub id; anything else that is no
    folder is refused as a missing folder, with the whole message."""
    import huggingface_hub

    folder, _ = peft_adapter(OFFICIAL / "llada", tmp_path / "a", ["q_proj"])
    calls = []
    monkeypatch.setattr(
        huggingface_hub, "snapshot_download", lambda **kwargs: calls.append(kwargs) or str(folder)
    )
    adapter = adapters.read_adapter("org/adapter", revision="v2")
    assert calls == [
        {
            "repo_id": "org/adapter",
            "revision": "v2",
            "allow_patterns": ["adapter_config.json", "adapter_model.safetensors"],
        }
    ]
    assert adapter.folder == folder and adapter.source == "org/adapter"
    for local in ("org/adapter.json", "a/b/c", "./adapter", "~/adapter", "/adapter"):
        with pytest.raises(AdapterError) as refused:
            adapters.resolve_adapter(local)
        assert str(refused.value) == (
            f"peft={local!r}: no such folder; give a folder holding adapter_config.json and "
            "adapter_model.safetensors, a hub id such as 'org/adapter-name', or one of "
            "['tiny-arith-lora']"
        )
    assert len(calls) == 1


def test_the_folder_checks_say_which_file_is_missing_and_what_a_folder_holds(tmp_path):
    folder, _ = peft_adapter(OFFICIAL / "llada", tmp_path / "a", ["q_proj"])
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (folder / name).unlink()
    with pytest.raises(AdapterError) as refused:
        adapters.resolve_adapter(folder)
    assert str(refused.value) == (
        f"peft={str(folder)!r}: the folder has no adapter_config.json or "
        "adapter_model.safetensors; a PEFT LoRA adapter folder holds adapter_config.json and "
        "adapter_model.safetensors (as written by save_pretrained)"
    )


@pytest.mark.parametrize("rank, accepted", [(0, False), (-2, False), (1, True)])
def test_a_rank_must_be_positive(rank, accepted, tmp_path):
    folder, _ = peft_adapter(OFFICIAL / "llada", tmp_path / "a", ["q_proj"], r=1)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps(config | {"r": rank}))
    if accepted:
        assert adapters.read_adapter(folder).config["r"] == 1
    else:
        with pytest.raises(AdapterError, match=rf"has r={rank}; a LoRA adapter needs a positive r"):
            adapters.read_adapter(folder)


def test_the_digest_is_of_the_two_files_as_read(tmp_path):
    import hashlib

    folder, _ = peft_adapter(OFFICIAL / "llada", tmp_path / "a", ["q_proj"])
    expected = hashlib.sha256(
        (folder / "adapter_config.json").read_bytes()
        + (folder / "adapter_model.safetensors").read_bytes()
    ).hexdigest()[:16]
    assert adapters.read_adapter(folder).identity == expected


def test_every_misfit_is_named_with_what_the_module_is(tmp_path):
    """A weight on a norm layer names its type, on a missing module says so; past five
    problems the message counts the rest."""
    folder, _ = peft_adapter(OFFICIAL / "llada", tmp_path / "a", ["q_proj"])
    extra = {
        f"base_model.model.model.transformer.blocks.{i}.nothing.lora_{part}.weight": torch.zeros(
            4, 4
        )
        for i in range(5)
        for part in "AB"
    }
    extra |= {
        f"base_model.model.model.transformer.blocks.0.attn_norm.lora_{part}.weight": torch.zeros(
            4, 4
        )
        for part in "AB"
    }
    _edit_weights(folder, lambda w: w | extra)
    model = load_model(OFFICIAL / "llada", device="cpu", dtype="float32")
    with pytest.raises(AdapterError) as refused:
        adapters.check_fits(model, adapters.read_adapter(folder))
    message = str(refused.value)
    norm = type(dict(model.named_modules())["model.transformer.blocks.0.attn_norm"]).__name__
    assert f"model.transformer.blocks.0.attn_norm: {norm} in the model" in message
    assert message.count("no such module in the model") == 4 and "; ... (6 in all)" in message


@pytest.mark.parametrize(
    "change, shown",
    [
        # another architecture's names
        ({"target_modules": ["query_key_value", "dense"]}, "['query_key_value', 'dense']"),
        # a regex, matched against the whole name
        ({"target_modules": r"model\.decoder\.layers\.\d+\.q_proj"}, r"'model\\.decoder"),
        # names that exist, in layers that do not (the fixture has two blocks)
        ({"target_modules": ["q_proj"], "layers_to_transform": [7]}, "['q_proj']"),
    ],
)
def test_target_modules_that_match_no_module_are_refused_as_peft_refuses_them(
    change, shown, tmp_path
):
    """PEFT refuses an adapter whose config's target_modules match no module of the model (the
    adapter was made for another model); so does this loader, though it reads the modules from the
    saved weights, naming the file, the value and module names that exist."""
    from peft import LoraConfig, inject_adapter_in_model

    folder, _ = peft_adapter(OFFICIAL / "llada", tmp_path / "a", ["q_proj"])
    config = json.loads((folder / "adapter_config.json").read_text()) | change
    (folder / "adapter_config.json").write_text(json.dumps(config))
    adapter = adapters.read_adapter(folder)
    model = load_model(OFFICIAL / "llada", device="cpu", dtype="float32")
    with pytest.raises(ValueError, match="not found in the base model"):  # PEFT's own refusal
        inject_adapter_in_model(
            LoraConfig(r=4, **change), load_model(OFFICIAL / "llada", device="cpu")
        )
    with pytest.raises(AdapterError) as refused:
        adapters.attach(model, adapter)
    message = str(refused.value)
    assert f"{folder / 'adapter_config.json'} has target_modules=" in message and shown in message
    assert "matches no module of LLaDAModel" in message
    assert "q_proj" in message and "model.transformer.blocks.0.q_proj" in message  # what exists
    assert not adapters.lora_layers(model)  # refused before anything was wrapped


@pytest.mark.parametrize(
    "targets", [["ff_out"], ["q_proj", "not_here"], r".*\.q_proj", "all-linear", None]
)
def test_target_modules_that_match_some_module_are_accepted(targets, tmp_path):
    """A list matching a module by name or suffix, a regex matching a whole name, PEFT's
    all-linear, or no target_modules at all (the saved weights say which modules)."""
    folder, _ = peft_adapter(OFFICIAL / "llada", tmp_path / "a", ["q_proj"])
    config = json.loads((folder / "adapter_config.json").read_text()) | {"target_modules": targets}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    model = load_model(OFFICIAL / "llada", device="cpu", dtype="float32")
    adapters.attach(model, adapters.read_adapter(folder))
    assert len(adapters.lora_layers(model)) == 2  # q_proj of both blocks, as saved


def test_a_lora_on_a_routed_expert_is_refused_as_such(tmp_path):
    """The routed experts' weights are stacked (models/moe.py), so an adapter made on
    upstream's per-expert modules cannot attach there: refused, saying why."""
    folder, _ = peft_adapter(OFFICIAL / "llada2", tmp_path / "a", ["gate_proj"])
    expert = "base_model.model.model.layers.1.mlp.experts.3.gate_proj"
    _edit_weights(folder, lambda w: w | {f"{expert}.lora_A.weight": torch.zeros(4, 64)})
    _edit_weights(folder, lambda w: w | {f"{expert}.lora_B.weight": torch.zeros(32, 4)})
    model = load_model(OFFICIAL / "llada2", device="cpu", dtype="float32")
    with pytest.raises(AdapterError, match=r"experts\.3\.gate_proj: a routed expert's projection"):
        adapters.check_fits(model, adapters.read_adapter(folder))


def test_an_adapter_on_the_experts_alone_is_refused_as_such(tmp_path):
    """LLaDA-MoE's fixture has an MoE MLP in every layer, so `gate_proj` names only routed
    experts: the adapter is not taken for another model's, it is refused for what it adapts."""
    folder, _ = peft_adapter(OFFICIAL / "llada_moe", tmp_path / "a", ["q_proj"])
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(
        json.dumps(config | {"target_modules": ["gate_proj"]})
    )
    expert = "base_model.model.model.layers.0.mlp.experts.1.gate_proj"
    _edit_weights(
        folder,
        lambda w: {
            f"{expert}.lora_A.weight": torch.zeros(4, 64),
            f"{expert}.lora_B.weight": torch.zeros(32, 4),
        },
    )
    model = load_model(OFFICIAL / "llada_moe", device="cpu", dtype="float32")
    with pytest.raises(AdapterError, match=r"experts\.1\.gate_proj: a routed expert's projection"):
        adapters.attach(model, adapters.read_adapter(folder))
