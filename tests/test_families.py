"""The model-family registry (models/families.py): every table the package keeps about a
family or a `--model` name is read from it, and it agrees with the classes it names and with
pyproject.toml's static entry points."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, fixture_folder

from lm_eval_dvoting.core.strategies import BLOCK_DECODINGS
from lm_eval_dvoting.integration import harness, plugin
from lm_eval_dvoting.models import families, placement
from lm_eval_dvoting.models.common import FromConfigDict, HeadedLM
from lm_eval_dvoting.models.families import FAMILIES, MODEL_NAMES
from lm_eval_dvoting.models.loading import CheckpointError, load_model, model_family


def test_pyproject_entry_points_are_the_registered_model_names() -> None:
    """pyproject.toml is static: a `--model` name added to the registry needs its line there
    (lm-eval versions with plugin discovery read only the entry points)."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib: Python 3.11+")
    meta = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    expected = {name: model.target for name, model in MODEL_NAMES.items()}
    assert meta["entry-points"]["lm_eval.models"] == expected
    assert plugin.MODELS == expected


@pytest.mark.parametrize("name", list(MODEL_NAMES))
def test_each_model_name_is_a_harness_class_built_from_its_record(name: str) -> None:
    spec = MODEL_NAMES[name]
    module, class_name = spec.target.split(":")
    model_class = getattr(harness, class_name)
    assert module == harness.__name__ and model_class.__name__ == class_name
    assert harness.EVAL_MODELS[name] is model_class
    assert issubclass(model_class, harness.DVotingEvalModel)
    assert (model_class.model_name, model_class.family) == (name, spec.family)
    assert model_class.default_pretrained == spec.default_pretrained
    assert model_class.block_decoding == spec.block_decoding
    assert model_class.__doc__ == spec.doc
    assert spec.block_decoding is None or spec.block_decoding in BLOCK_DECODINGS
    # the family it is named for suggests it in messages
    assert name in FAMILIES[spec.family].decoded_by


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_family_record_names_its_classes(name: str) -> None:
    """The record's classes exist, and what they say agrees with the record."""
    family = FAMILIES[name]
    config_class, model_class = family.config_class(), family.model_class()
    assert dataclasses.is_dataclass(config_class) and issubclass(config_class, FromConfigDict)
    assert issubclass(model_class, HeadedLM)
    assert issubclass(family.layer_class(), torch.nn.Module)
    assert family.max_length_field in {f.name for f in dataclasses.fields(config_class)}
    assert bool(getattr(model_class, "block_causal", False)) == family.block_causal
    assert family.model_type == family.model_type.lower()
    assert all(model in MODEL_NAMES for model in family.decoded_by)


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("named", [True, False])
def test_model_family_recognises_each_record(name: str, named: bool) -> None:
    """From `architectures`, or without them from `model_type` and num_experts alone."""
    family = FAMILIES[name]
    config = {"model_type": family.model_type.upper() if name == "dream" else family.model_type}
    if named:
        config["architectures"] = [family.architecture]
    if family.moe:
        config["num_experts"] = 4
    assert model_family(config, Path("config.json")) == name


def test_a_dense_architecture_with_experts_is_named_dense() -> None:
    """The refusal says what `architectures` names (it once said the opposite)."""
    config = {"model_type": "llada", "architectures": ["LLaDAModelLM"], "num_experts": 4}
    with pytest.raises(CheckpointError, match="names a dense model but the config has"):
        model_family(config, Path("config.json"))
    config = {"model_type": "llada2_moe", "architectures": ["LLaDA2MoeModelLM"]}
    with pytest.raises(CheckpointError, match="names a mixture-of-experts model but the config "):
        model_family(config, Path("config.json"))


def test_the_unsupported_message_lists_the_registry() -> None:
    with pytest.raises(CheckpointError) as refused:
        model_family({"model_type": "gpt2"}, Path("c/config.json"))
    assert str(refused.value) == (
        "c/config.json: model_type 'gpt2' (architectures None) is not supported; expected LLaDA "
        "(model_type 'llada', LLaDAModelLM: LLaDA-8B-Instruct, LLaDA-1.5), Dream ('Dream', "
        "Dream-v0-Instruct-7B), LLaDA-MoE ('llada', LLaDAMoEModelLM) or LLaDA2.0/2.1 "
        "('llada2_moe', LLaDA2MoeModelLM)"
    )


def test_suggested_models_names_each_release() -> None:
    assert families.suggested_models(FAMILIES["llada_moe"]) == "dvoting-llada"
    assert families.suggested_models(FAMILIES["llada2"]) == (
        "dvoting-llada2 (LLaDA2.0) or dvoting-llada21 (LLaDA2.1)"
    )


def test_a_new_family_is_one_record(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A family added to FAMILIES alone (here Dream's network under another model_type and
    architecture) is recognised, loaded with its token ids and maximum length, and placed."""
    toy = dataclasses.replace(
        FAMILIES["dream"],
        name="toy",
        display="Toy",
        model_type="toy",
        architecture="ToyLM",
        ids=families.OfficialIds(vocab_size=256, mask=7, eos=8, end_of_turn=9),
        supported_as="Toy ('toy', ToyLM)",
    )
    monkeypatch.setitem(FAMILIES, "toy", toy)
    folder = tmp_path / "toy"
    shutil.copytree(fixture_folder("dream"), folder)
    config = json.loads((folder / "config.json").read_text())
    for key in ("architectures", "mask_token_id", "eos_token_id"):
        del config[key]
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "Toy"}))
    (folder / "generation_config.json").unlink()
    model = load_model(folder, device="cpu")
    assert (model.family, model.mask_token_id, model.end_token_ids) == ("toy", 7, (8, 9))
    assert model.max_length == config["max_position_embeddings"]
    with pytest.raises(CheckpointError, match=r"or Toy \('toy', ToyLM\)$"):
        model_family({"model_type": "gpt2"}, Path("config.json"))
    # placement's unit is the layer class of the record naming the model class
    monkeypatch.delitem(FAMILIES, "dream")
    layers = ("DreamConfig", "DreamModel", "DreamMLP")
    monkeypatch.setitem(FAMILIES, "toy", dataclasses.replace(toy, classes=layers))
    assert placement.layer_class(model).__name__ == "DreamMLP"


_LLADA2_NAMES = "dvoting-llada2 (LLaDA2.0) or dvoting-llada21 (LLaDA2.1)"


@pytest.mark.parametrize(
    "model, family, pretrained, expected",
    [
        ("dvoting-llada", "llada", "x", None),
        ("dvoting-llada", "dream", "x", None),  # decoded, with a warning
        ("dvoting-dream", "llada_moe", "x", None),
        ("dvoting-llada", "llada2", "x", _LLADA2_NAMES),
        ("dvoting-llada2", "llada", "x", "dvoting-llada"),
        ("dvoting-llada21", "dream", "x", "dvoting-dream"),
        ("dvoting-llada2", "llada2", "org/LLaDA2.0-mini", None),
        ("dvoting-llada2", "llada2", "org/LLaDA2.1-mini", "dvoting-llada21"),
        ("dvoting-llada21", "llada2", "/ckpt/llada-2.0", "dvoting-llada2"),
        ("dvoting-llada21", "llada2", "my-checkpoint", None),
    ],
)
def test_other_model_for(model: str, family: str, pretrained: str, expected: str | None) -> None:
    found = families.other_model_for(MODEL_NAMES[model], FAMILIES[family], pretrained)
    assert found == expected


def test_a_block_diffusion_name_decodes_its_own_family_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unlike the bidirectional names, which read each other's checkpoints."""
    toy_name = dataclasses.replace(MODEL_NAMES["dvoting-llada2"], name="dvoting-toy")
    monkeypatch.setitem(MODEL_NAMES, "dvoting-toy", toy_name)
    toy = dataclasses.replace(FAMILIES["llada2"], name="toy", decoded_by=("dvoting-toy",))
    assert families.other_model_for(MODEL_NAMES["dvoting-llada2"], toy, "x") == "dvoting-toy"
    assert families.other_model_for(toy_name, toy, "x") is None
