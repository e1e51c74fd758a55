"""The model families, one record each, and the `--model` names that decode them.

Everything that tells one family from another lives here, read by models/loading.py (which
family a config.json names, its official token ids, config and network classes, maximum
length), models/placement.py (the layer class placed whole), integration/harness.py (the
`--model` classes, which checkpoints each decodes), integration/plugin.py (lm-eval's model
table) and commands/compare.py.

This module imports nothing heavy (no torch): lm-eval's start-up hook reads the `--model`
names through integration/plugin.py. A family's classes are named as text (its module and
their names) and imported when first asked for (`Family.config_class()`, ...).

Adding a family: its network in a module of models/ (config dataclass with `FromConfigDict`,
model class on `HeadedLM`, its layer class), and here one `Family` in `FAMILIES` (plus a
`ModelName` in `MODEL_NAMES` when a new `--model` name decodes it, and that name's line in
pyproject.toml's entry points: tests/test_families.py checks both).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

_MODELS = "lm_eval_dvoting.models"
_HARNESS = "lm_eval_dvoting.integration.harness"


@dataclass(frozen=True)
class OfficialIds:
    """The token ids of a family's official tokenizer, used when a config does not name them
    (`vocab_size`: the official vocabulary; a smaller one is a custom checkpoint's)."""

    vocab_size: int
    mask: int
    eos: int
    end_of_turn: int | None  # None: read from the checkpoint's generation_config.json


@dataclass(frozen=True)
class Family:
    """One model family: how its config.json is recognised, its classes and its token ids."""

    name: str  # model_family's name, `model.family`
    display: str  # the family's name in messages
    model_type: str  # config.json's `model_type`, lower case
    architecture: str  # the upstream class name in config.json's `architectures`
    moe: bool  # whether its config has `num_experts` (mixture of experts)
    module: str  # the module of its network, under lm_eval_dvoting.models
    classes: tuple[str, str, str]  # its config, model and layer (placement unit) classes
    max_length_field: str  # the config field holding the longest sequence it reads
    block_causal: bool  # decoded as block diffusion (its model class says so too)
    ids: OfficialIds
    decoded_by: tuple[str, ...]  # the `--model` names to use for it (MODEL_NAMES' keys)
    supported_as: str  # how the message refusing an unknown config names it

    def _class(self, index: int) -> Any:
        module = importlib.import_module(f"{_MODELS}.{self.module}")
        return getattr(module, self.classes[index])

    def config_class(self) -> Any:
        """The config dataclass (`from_dict(config_json)`)."""
        return self._class(0)

    def model_class(self) -> Any:
        """The network: `model_class()(config)` is an `nn.Module`."""
        return self._class(1)

    def layer_class(self) -> Any:
        """The transformer layer class, placed whole on one device (models/placement.py)."""
        return self._class(2)


@dataclass(frozen=True)
class ModelName:
    """A `--model` name: the harness class lm-eval builds for it and how it decodes."""

    name: str  # `--model dvoting-...`
    class_name: str  # its class in integration/harness.py (built from this record there)
    family: str  # the family it is named for
    default_pretrained: str  # the checkpoint without `pretrained=`
    doc: str  # its class's docstring
    # None: bidirectional decoding (it decodes the families that are not block-causal);
    # else block diffusion's default rule (strategies.BLOCK_DECODINGS)
    block_decoding: str | None = None
    editing: bool = False  # takes LLaDA2.1's `editing` presets (quality, speed)
    variant: str = ""  # which release of its family, when several names share it
    pretrained_pattern: str = ""  # a regex matching that release's checkpoint names

    @property
    def target(self) -> str:
        """Its "module:Class", as lm-eval's registry and pyproject's entry points name it."""
        return f"{_HARNESS}:{self.class_name}"


# LLaDA-MoE and LLaDA2.x share inclusionAI's tokenizer: mask 156895 and end of text 156892
# (the defaults of LLaDA2's generate() and dInfer; LLaDA-MoE's published examples use the
# same mask id); their end of turn is read from the checkpoint's generation_config.json.
_INCLUSION_AI = OfficialIds(vocab_size=157184, mask=156895, eos=156892, end_of_turn=None)

# The order is the messages' (placement lists the model classes in it); within one
# model_type, the dense family comes first.
FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family(
            name="llada",
            display="LLaDA",
            model_type="llada",
            architecture="LLaDAModelLM",
            moe=False,
            module="llada",
            classes=("LLaDAConfig", "LLaDAModel", "LLaDABlock"),
            max_length_field="max_sequence_length",
            block_causal=False,
            ids=OfficialIds(vocab_size=126464, mask=126336, eos=126081, end_of_turn=126348),
            decoded_by=("dvoting-llada",),
            supported_as="LLaDA (model_type 'llada', LLaDAModelLM: LLaDA-8B-Instruct, LLaDA-1.5)",
        ),
        Family(
            name="dream",
            display="Dream",
            model_type="dream",
            architecture="DreamModel",
            moe=False,
            module="dream",
            classes=("DreamConfig", "DreamModel", "DreamLayer"),
            max_length_field="max_position_embeddings",
            block_causal=False,
            ids=OfficialIds(vocab_size=152064, mask=151666, eos=151643, end_of_turn=151645),
            decoded_by=("dvoting-dream",),
            supported_as="Dream ('Dream', Dream-v0-Instruct-7B)",
        ),
        Family(
            name="llada_moe",
            display="LLaDA-MoE",
            model_type="llada",  # as dense LLaDA's: `architectures` and num_experts tell them apart
            architecture="LLaDAMoEModelLM",
            moe=True,
            module="llada_moe",
            classes=("LLaDAMoEConfig", "LLaDAMoEModel", "LLaDAMoELayer"),
            max_length_field="max_position_embeddings",
            block_causal=False,
            ids=_INCLUSION_AI,
            decoded_by=("dvoting-llada",),
            supported_as="LLaDA-MoE ('llada', LLaDAMoEModelLM)",
        ),
        Family(
            name="llada2",
            display="LLaDA2 (block diffusion)",
            model_type="llada2_moe",
            architecture="LLaDA2MoeModelLM",
            moe=True,
            module="llada2",
            classes=("LLaDA2Config", "LLaDA2Model", "LLaDA2Layer"),
            max_length_field="max_position_embeddings",
            block_causal=True,
            ids=_INCLUSION_AI,
            decoded_by=("dvoting-llada2", "dvoting-llada21"),
            supported_as="LLaDA2.0/2.1 ('llada2_moe', LLaDA2MoeModelLM)",
        ),
    )
}

MODEL_NAMES: dict[str, ModelName] = {
    model.name: model
    for model in (
        ModelName(
            name="dvoting-llada",
            class_name="LLaDAEvalModel",
            family="llada",
            default_pretrained="GSAI-ML/LLaDA-8B-Instruct",
            doc="`--model dvoting-llada`: LLaDA-8B-Instruct / LLaDA-1.5 and LLaDA-MoE-7B-A1B "
            "(or any folder in their formats): bidirectional semi-autoregressive decoding.",
        ),
        ModelName(
            name="dvoting-dream",
            class_name="DreamEvalModel",
            family="dream",
            default_pretrained="Dream-org/Dream-v0-Instruct-7B",
            doc="`--model dvoting-dream`: Dream-v0-Instruct-7B (or any Dream-format folder).",
        ),
        ModelName(
            name="dvoting-llada2",
            class_name="LLaDA2EvalModel",
            family="llada2",
            default_pretrained="inclusionAI/LLaDA2.0-mini",
            doc="`--model dvoting-llada2`: LLaDA2.0-mini / -flash: block diffusion, LLaDA2.0's "
            "threshold decoding (threshold 0.95, block 32, the block cache).",
            block_decoding="threshold",
            variant="LLaDA2.0",
            pretrained_pattern=r"llada-?2\.0",
        ),
        ModelName(
            name="dvoting-llada21",
            class_name="LLaDA21EvalModel",
            family="llada2",
            default_pretrained="inclusionAI/LLaDA2.1-mini",
            doc="`--model dvoting-llada21`: LLaDA2.1-mini / -flash: block diffusion with token "
            "editing (joint threshold decoding), `editing=quality` (default) or `speed`.",
            block_decoding="quality",
            editing=True,
            variant="LLaDA2.1",
            pretrained_pattern=r"llada-?2\.1",
        ),
    )
}


def families_of_type(model_type: str) -> tuple[Family, ...]:
    """The families whose config.json says this `model_type` (any case), in registry order."""
    return tuple(f for f in FAMILIES.values() if f.model_type == model_type.lower())


def family_of_architecture(architecture: str) -> Family | None:
    """The family whose upstream class is `architecture` (config.json's `architectures`)."""
    return next((f for f in FAMILIES.values() if f.architecture == architecture), None)


def suggested_models(family: Family) -> str:
    """The `--model` name(s) a message tells a user of this family to run, each with its
    release when there are several ("dvoting-llada2 (LLaDA2.0) or dvoting-llada21 (...)")."""
    names = [MODEL_NAMES[name] for name in family.decoded_by]
    if len(names) == 1:
        return names[0].name
    return " or ".join(f"{model.name} ({model.variant})" for model in names)


def supported_list() -> str:
    """The families an unknown config is told about: "A, B, C or D"."""
    named = [family.supported_as for family in FAMILIES.values()]
    return ", ".join(named[:-1]) + " or " + named[-1]


def other_model_for(model: ModelName, family: Family, pretrained: str) -> str | None:
    """None when `--model model.name` decodes the checkpoint `pretrained` of `family`; else
    the name(s) to use instead. A bidirectional name decodes every bidirectional family (the
    harness warns when it is not the name's own); a block-diffusion name decodes its own
    family only, and not a checkpoint whose name says it is another release of it (LLaDA2.0
    or 2.1, each with its own name and decoding)."""
    if family.block_causal != (model.block_decoding is not None):
        return suggested_models(family)
    if model.name not in family.decoded_by:
        return suggested_models(family) if family.block_causal else None
    for name in family.decoded_by:
        pattern = MODEL_NAMES[name].pretrained_pattern
        if name != model.name and pattern and re.search(pattern, pretrained, re.IGNORECASE):
            return name
    return None
