"""LoRA adapters in the PEFT format (`adapter_config.json` + `adapter_model.safetensors`)
on this package's native LLaDA and Dream models: the `peft=` model arg.

Adapters trained on the official checkpoints name the official modules
(`base_model.model.model.transformer.blocks.N.q_proj.lora_A.weight` for LLaDA,
`base_model.model.model.layers.N.self_attn.q_proj...` for Dream), which are this
package's module names too, so the `peft` library wraps them as it would the official
model. Which modules get a LoRA is read from the adapter's saved weights, not from the
config's `target_modules`: PEFT matches those by name suffix and skips names that match
nothing, so the d1/wd1 list of seven names wraps only `q_proj k_proj v_proj up_proj` on
LLaDA, and a target `ff_out` would also match LLaDA's output head (`transformer.ff_out`),
which was never trained. Every saved weight must name a linear layer of the model with
the shapes its rank says ([r, in] and [out, r]); anything else is refused with the names.
The config's `target_modules` must still match some module of the model, as PEFT demands
(`check_targets`): an adapter whose targets name another architecture's modules is refused.

Only the two adapter files are ever downloaded from the hub. The adapter is attached
unmerged (`enabled` switches it off and on, e.g. for a reference pass) and merged into
the weights with `merge` (the same logits up to rounding; exactly in float32 up to
float addition order).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import torch

from lm_eval_dvoting.models.loading import CheckpointError
from lm_eval_dvoting.models.moe import checkpoint_names

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
# adapters shipped with the package: the demo's RFG policy (demo/train_adapter.py)
PACKAGED_ADAPTERS = {
    "tiny-arith-lora": Path(__file__).resolve().parents[1] / "demo" / "tiny-arith-lora"
}
_KEY = re.compile(
    r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<part>[AB])(?:\.[^.]+)?\.weight$"
)
# adapter_config.json keys that say nothing about the forward beyond W + scale * B A (which
# modules: the saved weights say); every other key must be unset (None, false, empty, or
# bias "none"), since PEFT's many other features (DoRA, aLoRA, QALoRA, biases, saved
# modules, per-module ranks, ...) change the forward and this loader does not apply them
_PLAIN_KEYS = {
    "peft_type",
    "r",
    "lora_alpha",
    "use_rslora",
    "target_modules",
    "lora_dropout",
    "task_type",
    "inference_mode",
    "init_lora_weights",
    "base_model_name_or_path",
    "revision",
    "auto_mapping",
    "peft_version",
    "layers_to_transform",
    "layers_pattern",
    "exclude_modules",
    "megatron_config",
    "megatron_core",
    "loftq_config",
    "eva_config",
    "corda_config",
    "qalora_group_size",
    "ensure_weight_tying",
}


class AdapterError(CheckpointError):
    """An adapter that cannot be put on the model as it is; the message says why and what to do."""


@dataclass(frozen=True)
class Adapter:
    """A resolved adapter: where it came from, its folder, config, and its LoRA weights per
    module (A [r, in], B [out, r])."""

    source: str
    folder: Path
    config: dict[str, Any]
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]
    identity: str  # a digest of the two files as they were read, for the result cache's fingerprint


def resolve_adapter(source: str | Path, revision: str | None = None) -> Path:
    """A local folder for `source`: a packaged adapter's name, an existing folder, or a hub id
    (only the two adapter files are downloaded)."""
    key = str(source)
    path = PACKAGED_ADAPTERS.get(key, Path(key).expanduser())
    if path.is_dir():
        missing = [name for name in ADAPTER_FILES if not (path / name).exists()]
        if missing:
            raise AdapterError(
                f"peft={key!r}: the folder has no {' or '.join(missing)}; a PEFT LoRA adapter "
                f"folder holds {' and '.join(ADAPTER_FILES)} (as written by save_pretrained)"
            )
        return path
    if key.startswith((".", "/", "~")) or path.suffix or key.count("/") != 1:
        raise AdapterError(
            f"peft={key!r}: no such folder; give a folder holding {' and '.join(ADAPTER_FILES)}, "
            f"a hub id such as 'org/adapter-name', or one of {sorted(PACKAGED_ADAPTERS)}"
        )
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(repo_id=key, revision=revision, allow_patterns=list(ADAPTER_FILES))
        )
    except Exception as err:  # network, auth, offline mode: all end the same way for a user
        raise AdapterError(
            f"peft={key!r}: could not fetch the adapter from the Hugging Face hub "
            f"({type(err).__name__}: {err}); check the id and your network, or pass a folder"
        ) from err


def read_adapter(source: str | Path, revision: str | None = None) -> Adapter:
    """The adapter's config and weights, checked for what this loader supports."""
    folder = resolve_adapter(source, revision)
    raw = {name: (folder / name).read_bytes() for name in ADAPTER_FILES}
    config = json.loads(raw["adapter_config.json"])
    _check_config(source, config)
    parts = _lora_pairs(source, raw["adapter_model.safetensors"])
    digest = hashlib.sha256(b"".join(raw[name] for name in ADAPTER_FILES)).hexdigest()[:16]
    return Adapter(
        str(source), folder, config, {m: (p["A"], p["B"]) for m, p in sorted(parts.items())}, digest
    )


def _check_config(source: str | Path, config: dict[str, Any]) -> None:
    """Refuse an adapter_config.json of anything but a plain LoRA with positive r and alpha."""
    if config.get("peft_type") != "LORA":
        raise AdapterError(
            f"peft={source!s}: adapter_config.json says peft_type={config.get('peft_type')!r}; "
            "only LoRA adapters (peft_type LORA) are supported"
        )
    for name, value in sorted(config.items()):
        if name not in _PLAIN_KEYS and value not in (None, False, "none", [], {}):
            raise AdapterError(
                f"peft={source!s}: adapter_config.json sets {name}={value!r}, which this loader "
                "does not support (it applies W + scale * B A to the saved modules only); use a "
                f"plain LoRA adapter, with {name} unset"
            )
    for name in ("r", "lora_alpha"):
        value = config.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise AdapterError(
                f"peft={source!s}: adapter_config.json has {name}={value!r}; a LoRA adapter "
                f"needs a positive {name}"
            )


def _lora_pairs(source: str | Path, weights: bytes) -> dict[str, dict[str, torch.Tensor]]:
    """module -> {"A": lora_A, "B": lora_B} of adapter_model.safetensors' bytes, refused
    when a tensor is no LoRA weight, a module lacks one of its pair, or none is there."""
    from safetensors.torch import load

    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in load(weights).items():
        match = _KEY.match(key)
        if match is None:
            raise AdapterError(
                f"peft={source!s}: adapter_model.safetensors holds {key!r}, which is no LoRA "
                "weight (expected <module>.lora_A.weight / <module>.lora_B.weight)"
            )
        parts.setdefault(match["module"], {})[match["part"]] = tensor
    unpaired = sorted(module for module, found in parts.items() if set(found) != {"A", "B"})
    if unpaired or not parts:
        raise AdapterError(
            f"peft={source!s}: adapter_model.safetensors "
            + (
                f"lacks lora_A or lora_B for {', '.join(unpaired)}"
                if unpaired
                else "holds no LoRA weights"
            )
        )
    return parts


def check_targets(model: torch.nn.Module, adapter: Adapter) -> None:
    """Refuse an adapter whose config's `target_modules` match no module of `model`, as PEFT
    refuses it ("Target modules ... not found in the base model"): it was made for another
    model. Matched as PEFT matches them (a list by name or name suffix, a string as a regex of
    the whole name, with `layers_to_transform`/`layers_pattern`/`exclude_modules`; PEFT's
    "all-linear" matches any linear layer). Without `target_modules` nothing is checked: the
    saved weights say which modules are adapted."""
    from peft.tuners.tuners_utils import check_target_module_exists

    targets = adapter.config.get("target_modules")
    if not targets:
        return
    modules = dict(model.named_modules())
    linear = [name for name, module in modules.items() if isinstance(module, torch.nn.Linear)]
    if isinstance(targets, str) and targets.lower() == "all-linear":
        if linear:
            return
    else:
        keys = (
            "target_modules",
            "exclude_modules",
            "modules_to_save",
            "target_parameters",
            "layers_to_transform",
            "layers_pattern",
        )
        matching = SimpleNamespace(**{key: adapter.config.get(key) for key in keys})
        # the routed experts' projections count as the model's (upstream has a module each;
        # `check_fits` then refuses a LoRA on them, saying why)
        names = [*modules, *_routed_expert_modules(model)]
        if any(check_target_module_exists(matching, name) for name in names if name):
            return
    leaves = sorted({name.rsplit(".", 1)[-1] for name in linear})
    raise AdapterError(
        f"peft={adapter.source}: {adapter.folder / 'adapter_config.json'} has target_modules="
        f"{targets!r}, which matches no module of {type(model).__name__} (PEFT refuses such an "
        f"adapter: it was made for another model). The model's linear layers are "
        f"{', '.join(leaves)} (e.g. {', '.join(linear[:3])}). Use an adapter trained on this "
        "checkpoint's architecture"
    )


def check_fits(model: torch.nn.Module, adapter: Adapter) -> None:
    """The config's target modules are the model's (`check_targets`), and every adapted module
    is a linear layer of `model`, with the shapes the rank says."""
    check_targets(model, adapter)
    modules = dict(model.named_modules())
    routed = _routed_expert_modules(model)
    rank = int(adapter.config["r"])
    problems = []
    for name, (lora_a, lora_b) in adapter.weights.items():
        module = modules.get(name)
        if not isinstance(module, torch.nn.Linear):
            problems.append(f"{name}: {_what_is_there(module, name in routed)} in the model")
            continue
        want_a, want_b = (rank, module.in_features), (module.out_features, rank)
        if tuple(lora_a.shape) != want_a or tuple(lora_b.shape) != want_b:
            problems.append(
                f"{name}: lora_A {tuple(lora_a.shape)}, lora_B {tuple(lora_b.shape)}; the model's "
                f"layer takes lora_A {want_a}, lora_B {want_b}"
            )
    if problems:
        shown = "; ".join(problems[:5]) + (
            f"; ... ({len(problems)} in all)" if len(problems) > 5 else ""
        )
        raise AdapterError(
            f"peft={adapter.source}: the adapter does not fit this model ({type(model).__name__}): "
            f"{shown}. Use an adapter trained on this checkpoint's architecture"
        )


def _routed_expert_modules(model: torch.nn.Module) -> set[str]:
    """Upstream's names of the routed experts' projections (`...experts.N.gate_proj`): a
    module each there, slices of one stacked weight here (models/moe.py)."""
    return {
        name.removesuffix(".weight")
        for slices in checkpoint_names(model).values()
        for name in slices
    }


def _what_is_there(module: Any, routed: bool) -> str:
    """What an adapted module's name finds in the model when it is no linear layer (`routed`:
    the name is a routed expert's projection)."""
    if module is not None:
        return type(module).__name__
    if routed:
        return (
            "a routed expert's projection, stacked with the other experts' (models/moe.py: a "
            "LoRA on routed experts is not supported)"
        )
    return "no such module"


def attach(model: torch.nn.Module, adapter: Adapter) -> None:
    """Wrap the adapted modules with PEFT's LoRA layers and load the weights (unmerged)."""
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict

    check_fits(model, adapter)
    # the modules' full names: PEFT wraps exactly these (a name matches itself or a suffix)
    config = LoraConfig(
        r=int(adapter.config["r"]),
        lora_alpha=adapter.config["lora_alpha"],
        use_rslora=bool(adapter.config.get("use_rslora")),
        lora_dropout=0.0,
        target_modules=list(adapter.weights),
    )
    inject_adapter_in_model(config, model)
    state = {}
    for name, (lora_a, lora_b) in adapter.weights.items():
        state[f"{name}.lora_A.weight"], state[f"{name}.lora_B.weight"] = lora_a, lora_b
    loaded = set_peft_model_state_dict(model, state)
    missing = [key for key in loaded.missing_keys if ".lora_" in key]
    if loaded.unexpected_keys or missing:
        raise AdapterError(
            f"peft={adapter.source}: PEFT did not load every LoRA weight (unexpected: "
            f"{loaded.unexpected_keys[:5]}, missing: {missing[:5]})"
        )
    wrapped = sorted(name for name, module in model.named_modules() if _is_lora(module))
    if wrapped != sorted(adapter.weights):
        raise AdapterError(
            f"peft={adapter.source}: PEFT wrapped {len(wrapped)} modules for the adapter's "
            f"{len(adapter.weights)}: {sorted(set(wrapped) ^ set(adapter.weights))[:5]}"
        )
    model.eval()


def _is_lora(module: torch.nn.Module) -> bool:
    from peft.tuners.lora import LoraLayer

    return isinstance(module, LoraLayer)


def lora_layers(model: torch.nn.Module) -> list[Any]:
    return [module for module in model.modules() if _is_lora(module)]


@contextlib.contextmanager
def enabled(model: torch.nn.Module, on: bool) -> Iterator[None]:
    """The model with its (unmerged) adapter switched on or off inside the block."""
    layers = lora_layers(model)
    before = [not layer.disable_adapters for layer in layers]
    try:
        for layer in layers:
            layer.enable_adapters(on)
        yield
    finally:
        for layer, was in zip(layers, before):
            layer.enable_adapters(was)


def merge(model: torch.nn.Module) -> None:
    """Fold the adapter into the weights (W += scale * B A): one forward at base cost."""
    for layer in lora_layers(model):
        layer.merge()
