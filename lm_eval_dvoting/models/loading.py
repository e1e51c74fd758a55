"""Load an official checkpoint of any family in models/families.py (LLaDA, Dream, LLaDA-MoE,
LLaDA2) from a hub id or a local folder, without remote code.

`load_model` reads `config.json`, tells its family (`model_family`), builds that family's
own module (models/llada.py, dream.py, llada_moe.py or llada2.py), and fills it from
`model.safetensors` or the shards listed in `model.safetensors.index.json`. The module is
built on the meta device and the weights are assigned in the target dtype, so an 8B
checkpoint never exists in float32 on the host.

The returned module exposes what the sampler needs:
`mask_token_id`, `end_token_ids` (end-of-text and end-of-turn), `logits_shift`
(1 for Dream, else 0), `max_length`, `family` and `source` (the folder it came from).
With `device_map`, one model is spread over several GPUs, each weight read straight onto
its own (models/placement.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import nn

from lm_eval_dvoting.models import moe, placement
from lm_eval_dvoting.models.families import (
    FAMILIES,
    Family,
    families_of_type,
    family_of_architecture,
    supported_list,
)

_DEMO = Path(__file__).resolve().parents[1] / "demo"
# The demo checkpoints shipped inside the package: `pretrained=tiny-arith` (LLaDA format) and
# `pretrained=tiny-arith-dream` (Dream format, for `dvoting-dream`).
PACKAGED_CHECKPOINTS = {
    "tiny-arith": _DEMO / "tiny-arith",
    "tiny-arith-dream": _DEMO / "tiny-arith-dream",
}

# What a hub load fetches: data files only, named exactly (a wildcard such as `tokenizer*`
# would also admit a repo's `tokenization_*.py`/`tokenizer_*.py` code, which we never run).
# The tokenizer's data files (also what the result cache hashes as the tokenizer's identity).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",  # sentencepiece
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.json",
)
_HUB_FILES = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    *TOKENIZER_FILES,
    "*.jinja",
]


def hub_patterns(subfolder: str | None = None) -> list[str]:
    """The `allow_patterns` of a hub load: `_HUB_FILES`, inside `subfolder` when given."""
    if not subfolder:
        return list(_HUB_FILES)
    prefix = subfolder.strip("/")
    return [f"{prefix}/{pattern}" for pattern in _HUB_FILES]


_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be used as it is; the message says why and what to do."""


def resolve_checkpoint(
    name_or_path: str | Path, revision: str | None = None, subfolder: str | None = None
) -> Path:
    """A local folder for `name_or_path`: a packaged name, an existing folder, or a hub id.

    Hub ids are fetched with `huggingface_hub.snapshot_download`, restricted to the
    config, weights and tokenizer data files (no Python files are ever downloaded), at
    `revision` (branch, tag or commit; default the repo's main) and inside `subfolder`
    when given; offline (`HF_HUB_OFFLINE=1`) the revision is resolved from the local hub
    cache. A local folder or packaged name has no revisions or hub subfolders, so
    `revision`/`subfolder` are refused for them.
    """
    key = str(name_or_path)
    path = Path(key).expanduser()
    if key in PACKAGED_CHECKPOINTS or path.is_dir():
        _refuse_hub_options(key, revision, subfolder)
        return _packaged(key) if key in PACKAGED_CHECKPOINTS else path
    looks_local = key.startswith((".", "/", "~")) or path.suffix or key.count("/") != 1
    if looks_local:
        raise CheckpointError(
            f"no checkpoint folder at {key!r}: give an existing folder holding config.json and "
            "model.safetensors, a hub id such as 'GSAI-ML/LLaDA-8B-Instruct', or 'tiny-arith' "
            "/ 'tiny-arith-dream'"
        )
    return _from_hub(key, revision, subfolder)


def _refuse_hub_options(key: str, revision: str | None, subfolder: str | None) -> None:
    """Refuse `revision`/`subfolder` for a packaged checkpoint or local folder `key`."""
    if revision:
        kind = "packaged checkpoint" if key in PACKAGED_CHECKPOINTS else "local folder"
        raise CheckpointError(
            f"revision={revision!r} applies to hub ids only, but pretrained={key!r} is a "
            f"{kind}, which has no revisions: drop revision, or check that revision out into a "
            "folder and pass the folder"
        )
    if subfolder:
        raise CheckpointError(
            f"subfolder={subfolder!r} applies to hub ids only, but pretrained={key!r} is a local "
            f"folder or packaged checkpoint: drop subfolder and pass the folder itself "
            f"(pretrained={key.rstrip('/')}/{subfolder.strip('/')})"
        )


def _packaged(key: str) -> Path:
    """The folder of the packaged checkpoint `key`, refused when the install lacks it."""
    folder = PACKAGED_CHECKPOINTS[key]
    if not (folder / "config.json").exists():
        raise CheckpointError(
            f"the packaged checkpoint {key!r} is missing from {folder}; reinstall the package"
        )
    return folder


def _from_hub(key: str, revision: str | None, subfolder: str | None) -> Path:
    """The hub id `key`'s data files at `revision`, fetched (or found in the hub cache)."""
    from huggingface_hub import snapshot_download

    at = f" at revision {revision!r}" if revision else ""
    try:
        snapshot = Path(
            snapshot_download(
                repo_id=key, revision=revision, allow_patterns=hub_patterns(subfolder)
            )
        )
    except Exception as err:  # network, auth, offline mode: all end the same way for a user
        raise CheckpointError(
            f"could not fetch {key!r}{at} from the Hugging Face hub ({type(err).__name__}: "
            f"{err}); check the id, the revision and your network, or pass a local folder"
        ) from err
    if not subfolder:
        return snapshot
    folder = snapshot / subfolder.strip("/")
    if not (folder / "config.json").exists():
        raise CheckpointError(
            f"subfolder={subfolder!r} of {key!r}{at} holds no config.json ({folder}); "
            "check the subfolder name on the hub page of the repo"
        )
    return folder


def hub_revision(folder: str | Path) -> str | None:
    """The commit a hub-cache folder was loaded from (its `snapshots/<commit>` name), else None.

    `snapshot_download` returns `.../models--org--name/snapshots/<commit>`; a subfolder load
    lies below it. A local folder or packaged checkpoint has no revision: None.
    """
    path = Path(folder)
    for part in (path, *path.parents):
        if part.parent.name == "snapshots" and part.parent.parent.name.startswith("models--"):
            return part.name
    return None


def read_config(folder: Path) -> dict[str, Any]:
    """The object in `folder`'s config.json, refused when it is missing or not an object."""
    config_file = folder / "config.json"
    if not config_file.exists():
        raise CheckpointError(
            f"{config_file} does not exist: a checkpoint folder needs its config.json"
        )
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{config_file} is not valid JSON: {err}") from err
    if not isinstance(config, dict):
        raise CheckpointError(
            f"{config_file} holds a JSON {type(config).__name__} ({json.dumps(config)[:40]}), "
            "not an object: a checkpoint config is an object with model_type, vocab_size and "
            "the layer sizes; download it again"
        )
    return config


def check_config_fields(family: str, config: dict[str, Any], config_file: Path) -> None:
    """Refuse a config without the sizes the architecture needs (named), before any weight
    is read."""
    config_class = FAMILIES[family].config_class()
    required = [
        f.name
        for f in dataclasses.fields(config_class)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if config.get(name) is None]
    bad = [
        f"{name}={config[name]!r}"
        for name in required
        if name not in missing
        and (
            isinstance(config[name], bool) or not isinstance(config[name], int) or config[name] < 1
        )
    ]
    if missing or bad:
        problems = ([f"lacks {', '.join(missing)}"] if missing else []) + (
            [f"has {', '.join(bad)} (each must be a whole number >= 1)"] if bad else []
        )
        raise CheckpointError(
            f"{config_file} {'; '.join(problems)}: a {family} config needs {', '.join(required)}; "
            "use the checkpoint's original config.json (download it again)"
        )


def model_family(config: dict[str, Any], config_file: Path) -> str:
    """The name of the family (models/families.py) of a config, from its `model_type`,
    `architectures` and MoE fields.

    `model_type` alone cannot tell them apart: LLaDA-MoE's is 'llada', like dense LLaDA's.
    A config whose `architectures` and fields disagree (a dense name with experts, or the
    reverse) is refused rather than read as either.
    """
    model_type = str(config.get("model_type", ""))
    architectures = config.get("architectures")
    named = [family_of_architecture(a) for a in architectures or []]
    named = [family for family in named if family is not None]
    has_experts = config.get("num_experts") is not None
    families = families_of_type(model_type)
    if not families or (named and named[0] not in families):
        raise CheckpointError(
            f"{config_file}: model_type {model_type!r} (architectures {architectures!r}) is not "
            f"supported; expected {supported_list()}"
        )
    if named:
        family = named[0]
    else:  # the family of this model_type with (or without) experts, as the config has them
        family = next((f for f in families if f.moe == has_experts), families[0])
    if has_experts != family.moe:
        raise CheckpointError(
            f"{config_file}: architectures {architectures!r} names a "
            f"{'mixture-of-experts' if family.moe else 'dense'} model but the config "
            f"{'has' if has_experts else 'lacks'} num_experts; the file was edited or mixed up "
            "with another checkpoint's: use the checkpoint's original config.json"
        )
    return family.name


def checkpoint_facts(folder: Path) -> dict[str, Any]:
    """What a checkpoint folder's config says about the token ids it reads, without its
    weights: family, mask id, end-of-text ids and vocabulary size."""
    config = read_config(folder)
    family = model_family(config, folder / "config.json")
    mask_id, end_ids = _special_ids(FAMILIES[family], config, folder)
    return {
        "family": family,
        "mask_token_id": mask_id,
        "end_token_ids": end_ids,
        "vocabulary": int(config.get("embedding_size") or config["vocab_size"]),
    }


def _max_length(family: Family, cfg: Any) -> int:
    """The longest sequence (prompt plus generation) a model of this config reads: the
    family's `max_length_field` (LLaDA's `max_sequence_length`, the others'
    `max_position_embeddings`)."""
    return int(getattr(cfg, family.max_length_field))


def config_max_length(folder: Path) -> int:
    """The maximum length of the checkpoint in `folder`, from its config.json alone (the
    `max_length` that `load_model` gives the model), refusing a config `load_model` refuses."""
    family, config = _checked_config(folder)
    return _max_length(family, family.config_class().from_dict(config))


def _checked_config(folder: Path) -> tuple[Family, dict[str, Any]]:
    """The family and config.json of the checkpoint in `folder`, refused when the config
    names no family or lacks a size its architecture needs."""
    config = read_config(folder)
    family = model_family(config, folder / "config.json")
    check_config_fields(family, config, folder / "config.json")
    check_implemented(family, config, folder / "config.json")
    return FAMILIES[family], rotary_settings(family, config, folder / "config.json")


def check_implemented(family: str, config: dict[str, Any], config_file: Path) -> None:
    """Refuse a setting upstream's code reads that this plugin implements at one value only
    (the config class's `IMPLEMENTED`, the released checkpoints' values), rather than decode
    as if it were that value: a shared expert, no norm on the queries and keys. A key the
    config leaves out counts as upstream's default for it (`UPSTREAM_DEFAULTS`)."""
    config_class = FAMILIES[family].config_class()
    defaults = getattr(config_class, "UPSTREAM_DEFAULTS", {})
    for key, value in getattr(config_class, "IMPLEMENTED", {}).items():
        given = config.get(key, defaults.get(key, value))
        if given != value:
            found = f"has {key}={json.dumps(given)}" if key in config else f"lacks {key}"
            found += "" if key in config else f" (upstream's default: {json.dumps(given)})"
            raise CheckpointError(
                f"{config_file} {found}: this plugin runs "
                f"{FAMILIES[family].display} with {key}={json.dumps(value)} only (the released "
                "checkpoints' value); use the checkpoint's original config.json, or load the "
                "model elsewhere"
            )


def rotary_settings(family: str, config: dict[str, Any], config_file: Path) -> dict[str, Any]:
    """`config` with its rotary embedding read as transformers' code reads it, for the
    families whose config class declares `rope_scaling` (Dream, LLaDA-MoE, LLaDA2; LLaDA's code
    has no such field): `rope_theta` and `partial_rotary_factor` from `rope_parameters` where
    a transformers 5 config keeps them there. Any rope type but the default (linear, dynamic,
    yarn, ...) is refused: the families compute the default embedding only, and another
    would decode every position with wrong angles, silently."""
    fields = {f.name for f in dataclasses.fields(FAMILIES[family].config_class())}
    if "rope_scaling" not in fields:
        return config
    for key in ("rope_scaling", "rope_parameters"):
        given = config.get(key)
        kind = given.get("rope_type", given.get("type")) if isinstance(given, dict) else None
        if given is not None and (not isinstance(given, dict) or kind not in (None, "default")):
            raise CheckpointError(
                f"{config_file} has {key}={json.dumps(given)[:80]}: this plugin computes the "
                "default rotary embedding only (no scaling), which the released checkpoints "
                "use; use the checkpoint's original config.json, or load the model elsewhere"
            )
    parameters = config.get("rope_parameters") or {}
    lifted = {k: parameters[k] for k in ("rope_theta", "partial_rotary_factor") if k in parameters}
    return {**lifted, **config}


def local_checkpoint(
    name_or_path: str | Path, revision: str | None = None, subfolder: str | None = None
) -> Path | None:
    """The folder holding `name_or_path`'s config.json when it is known without the network:
    a packaged name or local folder (`resolve_checkpoint`'s), or a hub id whose config.json
    (at `revision`, default main, inside `subfolder`) is in the local hub cache; else None.

    Never downloads: what reads it (the early length check) is skipped when it is None. A
    cached config of a branch is the one last fetched, as an offline load would read it.
    """
    key = str(name_or_path)
    if key in PACKAGED_CHECKPOINTS or Path(key).expanduser().is_dir():
        return resolve_checkpoint(key, revision=revision, subfolder=subfolder)
    from huggingface_hub import try_to_load_from_cache

    filename = f"{subfolder.strip('/')}/config.json" if subfolder else "config.json"
    try:
        found = try_to_load_from_cache(key, filename, revision=revision)
    except Exception:  # not a valid hub id: `resolve_checkpoint` refuses it in its own words
        return None
    return Path(found).parent if isinstance(found, str) else None


def _special_ids(
    family: Family, config: dict[str, Any], folder: Path
) -> tuple[int, tuple[int, ...]]:
    """The mask id and the end-of-text/end-of-turn ids for this checkpoint: its config's
    and generation_config.json's, and the family's official ones when its vocabulary is
    the official one (a smaller vocabulary is a custom tokenizer's)."""
    official = family.ids
    vocab_size = int(config.get("embedding_size") or config["vocab_size"])
    is_official_vocab = vocab_size >= official.vocab_size
    mask_id = config.get("mask_token_id")
    if mask_id is None:
        if not is_official_vocab:
            raise CheckpointError(
                f"{folder / 'config.json'} has no mask_token_id and the official default "
                f"{official.mask} lies outside its vocabulary of {vocab_size}: "
                'add "mask_token_id" to config.json'
            )
        mask_id = official.mask
    end_ids = _id_list(config.get("eos_token_id"))
    generation_config = folder / "generation_config.json"
    if generation_config.exists():
        end_ids += _id_list(json.loads(generation_config.read_text()).get("eos_token_id"))
    if is_official_vocab:
        end_ids += [i for i in (official.eos, official.end_of_turn) if i is not None]
    if not end_ids:
        end_ids = [official.eos]
    return int(mask_id), tuple(dict.fromkeys(int(i) for i in end_ids if int(i) != int(mask_id)))


def _id_list(value: Any) -> list[Any]:
    """A config's `eos_token_id` (one id, a list of them, or none) as a list."""
    return list(value) if isinstance(value, list) else ([value] if value is not None else [])


def weight_files(folder: Path) -> list[Path]:
    """`model.safetensors`, or the shards named by `model.safetensors.index.json`."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / shard for shard in shards]
    else:
        files = [folder / "model.safetensors"]
    for file in files:
        if not file.exists():
            raise CheckpointError(
                f"weight file {file} is missing; download the checkpoint completely "
                "(model.safetensors, or every shard listed in model.safetensors.index.json)"
            )
    return files


def parse_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """A torch dtype from a name; None means bfloat16 on CUDA, float32 on CPU."""
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).removeprefix("torch.")  # `dtype=torch.bfloat16`, as written for HF models
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of float32, bfloat16, float16")
    return _DTYPES[name]


def check_device_dtype(device: torch.device, dtype: torch.dtype) -> None:
    """Fail early, with a clear message, when the device cannot run this dtype."""
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ValueError(
            f"{torch.cuda.get_device_name(device)} does not support bfloat16; use dtype=float16 "
            "or float32"
        )
    try:
        probe = torch.ones(2, 2, dtype=dtype, device=device)
        torch.nn.functional.linear(probe, probe)
    except RuntimeError as err:
        raise ValueError(
            f"dtype {dtype} cannot run on {device} ({err}); use dtype=float32"
        ) from err


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The requested device, or CPU with a warning when CUDA is asked for but absent."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        warnings.warn(
            f"device {device} requested but CUDA is not available; using the CPU", stacklevel=2
        )
        return torch.device("cpu")
    return device


def _read_weights(
    files: list[Path], device: torch.device, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    # safetensors accepts "cpu" but not "cpu:0" (what a CPU rank of torchrun/accelerate gets)
    where = "cpu" if device.type == "cpu" else str(device)
    for file in files:
        tensors = _corrupt_file_refused(file, functools.partial(load_file, str(file), device=where))
        for name, tensor in tensors.items():
            state[name] = _checked(file, name, tensor, tensor.device, dtype)
    return state


def _checked(
    file: Path, name: str, tensor: torch.Tensor, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """`tensor` on `device` in `dtype`, refused when it holds NaN/inf."""
    loaded = tensor.to(device=device, dtype=dtype)
    # a corrupt file of the right size loads "fine" and decodes garbage: one pass per
    # tensor at load, none per step
    if loaded.is_floating_point() and not _all_finite(loaded):
        _refuse_non_finite(file, name, tensor, loaded, dtype)
    return loaded


def _read_weights_placed(
    files: list[Path], device_of: Callable[[str], torch.device], dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """As `_read_weights`, each tensor onto its own device (`device_of(name)`, a device map's).

    Tensors are read one at a time from the memory-mapped file, so host memory holds one
    tensor in transit, never a second copy of the model (or of a shard)."""
    state: dict[str, torch.Tensor] = {}
    for file in files:
        opening = functools.partial(safe_open, str(file), framework="pt", device="cpu")
        with _corrupt_file_refused(file, opening) as opened:
            for name in opened.keys():
                tensor = _corrupt_file_refused(file, functools.partial(opened.get_tensor, name))
                # converted on its device (a GPU's, usually): only reading is a file's fault
                state[name] = _checked(file, name, tensor, device_of(name), dtype)
    return state


def _corrupt_file_refused(file: Path, read: Callable[[], Any]) -> Any:
    """`read()`, its failure reported as a corrupt weight file."""
    try:
        return read()
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CheckpointError(
            f"cannot read weight file {file} ({err}); it is corrupt or truncated: download it again"
        ) from err


def _all_finite(tensor: torch.Tensor) -> bool:
    """Whether every value is finite, at about the cost of one sum.

    A NaN or inf makes any sum non-finite, so a finite sum proves the tensor finite; only a
    non-finite sum (a bad value, or a float16 sum that overflowed) needs the element-wise
    check, which is 30-70x slower on a CPU (measured on one thread for 50M values: 8-17 ms
    for the sum, 0.56-0.83 s element-wise; for 8B weights about 2 s against 1.5 minutes).
    """
    return bool(torch.isfinite(tensor.sum())) or bool(torch.isfinite(tensor).all())


def _refuse_non_finite(
    file: Path, name: str, stored: torch.Tensor, loaded: torch.Tensor, dtype: torch.dtype
) -> None:
    """The error for a weight tensor holding NaN/inf: corrupt in the file, or overflowing
    `dtype`."""
    bad = int((~torch.isfinite(loaded)).sum())
    if stored.is_floating_point() and bool(torch.isfinite(stored).all()):
        raise CheckpointError(
            f"weight file {file}: tensor {name!r} overflows {dtype} ({bad} of {loaded.numel()} "
            f"values become inf; largest magnitude {float(stored.abs().max()):.4g}): load it "
            "with dtype=bfloat16 or float32"
        )
    raise CheckpointError(
        f"weight file {file}: tensor {name!r} holds {bad} NaN/inf value(s) of "
        f"{stored.numel()}; the file is corrupt: download it again"
    )


def load_model(
    name_or_path: str | Path,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    revision: str | None = None,
    subfolder: str | None = None,
    device_map: str | dict[str, Any] | None = None,
    max_memory: dict[Any, Any] | None = None,
) -> nn.Module:
    """Load a model of any family (models/families.py) from a hub id, a local folder, or a
    packaged demo name (`PACKAGED_CHECKPOINTS`); `revision`/`subfolder` as `resolve_checkpoint`.

    An eval-mode module whose `forward(input_ids, attention_mask=None)` gives raw logits
    (batch, length, vocab), carrying `mask_token_id`, `end_token_ids`, `logits_shift`,
    `max_length`, `family` and `source` (the folder it was read from).

    `device_map` spreads it over several devices instead of `device` (models/placement.py):
    "auto" (the map computed from `max_memory`: GPU index or "cpu" -> bytes or "80GiB", by
    default every GPU's free memory), or a dict of module name -> GPU index or "cpu" (''
    for the whole model; a layer is never split). Each weight is read straight onto its
    device; the model then carries `device_map` (one entry per unit) and `main_device`."""
    folder = resolve_checkpoint(name_or_path, revision=revision, subfolder=subfolder)
    family, config = _checked_config(folder)
    target, max_memory = _target_device(device, device_map, max_memory)
    torch_dtype = parse_dtype(dtype, target)
    check_device_dtype(target, torch_dtype)
    mask_id, end_ids = _special_ids(family, config, folder)
    files = weight_files(folder)
    with torch.device("meta"):
        model: nn.Module = family.model_class()(family.config_class().from_dict(config))
    placed = (
        None if device_map is None else _planned_map(model, device_map, max_memory, torch_dtype)
    )
    state = _read_state(files, target, placed, torch_dtype)
    _fill(model, state, f"the weights in {folder} do not fit a {family.name} model")
    if placed is not None:
        placement.dispatch(model, placed)
    model.mask_token_id, model.end_token_ids, model.family = mask_id, end_ids, family.name
    model.max_length, model.source = _max_length(family, model.config), str(folder)
    return model


def _target_device(
    device: str | torch.device | None,
    device_map: str | dict[str, Any] | None,
    max_memory: dict[Any, Any] | None,
) -> tuple[torch.device, dict[Any, Any] | None]:
    """The device whose dtype default and checks apply (with a device map, the first GPU it
    names), and the memory budget (`device_map="auto"` without one: every GPU's free
    memory); `device` with a device map, or `max_memory` without one, are refused."""
    if device_map is None:
        if max_memory is not None:
            raise ValueError(
                "max_memory applies with device_map='auto' only: give device_map='auto' or drop "
                "max_memory"
            )
        return resolve_device(device), None
    if device is not None:
        raise ValueError(
            f"device={device!r} and device_map: give one (device_map places every module itself)"
        )
    if device_map == "auto" and max_memory is None:
        max_memory = placement.gpu_budget()
    return placement.named_device(device_map, max_memory), max_memory


def _read_state(
    files: list[Path],
    target: torch.device,
    placed: dict[str, placement.Device] | None,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """The weights of `files` in `dtype`: on `target`, or each on its unit's device of the
    expanded map `placed`."""
    if placed is None:
        return _read_weights(files, target, dtype)
    return _read_weights_placed(files, placement.weight_device(placed), dtype)


def _fill(model: nn.Module, state: dict[str, torch.Tensor], misfit: str) -> None:
    """Assign `state` to the meta-device `model` (eval mode, no gradients), refused with
    `misfit` and the names when its tensors are not exactly the model's. The experts of a
    mixture-of-experts layer are named one by one in an official checkpoint and stacked in
    the model (models/moe.py): names are checked as the checkpoint has them, either way (a
    file written from this package's `state_dict()` holds them stacked)."""
    per_expert = {
        stacked: slices
        for stacked, slices in moe.checkpoint_names(model).items()
        if stacked not in state
    }
    expected = set(model.state_dict()) - per_expert.keys()
    expected |= {name for slices in per_expert.values() for name in slices}
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"{misfit} of this config: "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
        )
    try:
        moe.stack_checkpoint(state, per_expert)
    except ValueError as err:
        raise CheckpointError(f"{misfit} of this config: {err}") from None
    model.load_state_dict(state, assign=True)
    model.eval().requires_grad_(False)


def _planned_map(
    model: nn.Module,
    device_map: str | dict[str, Any],
    max_memory: dict[Any, Any] | None,
    dtype: torch.dtype,
) -> dict[str, placement.Device]:
    """The expanded map (one entry per layer and module) of `device_map` for the
    meta-device `model`."""
    if device_map == "auto":
        return placement.auto_device_map(model, max_memory or {}, dtype)
    if not isinstance(device_map, dict):
        raise ValueError(
            f"device_map={device_map!r}: give 'auto' or a dict of module name -> GPU index or 'cpu'"
        )
    if max_memory is not None:
        raise ValueError(
            "max_memory applies with device_map='auto' only: a dict device_map places every module "
            "itself"
        )
    return placement.expand_device_map(model, device_map)


def load_tokenizer(
    name_or_path: str | Path, revision: str | None = None, subfolder: str | None = None
) -> Any:
    """The checkpoint's tokenizer through transformers, never with remote code.

    `revision`/`subfolder` as for `load_model` (a hub id's branch, tag or commit). Dream's
    tokenizer config names a custom class (a renamed Qwen2 tokenizer); when transformers
    cannot build the named class without remote code, the Qwen2 tokenizer class reads
    the same files.
    """
    from transformers import AutoTokenizer
    from transformers.utils import logging as transformers_logging

    folder = resolve_checkpoint(name_or_path, revision=revision, subfolder=subfolder)
    verbosity = transformers_logging.get_verbosity()
    # AutoTokenizer reads config.json and warns that model_type 'llada'/'Dream' is not a
    # transformers model; we never build the model through transformers, so it is noise
    transformers_logging.set_verbosity_error()
    try:
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    except (ValueError, OSError, KeyError, AttributeError) as err:
        return _dream_tokenizer(folder, err)
    finally:
        transformers_logging.set_verbosity(verbosity)


def _dream_tokenizer(folder: Path, err: Exception) -> Any:
    """Dream's tokenizer, read by the Qwen2 tokenizer class when transformers cannot build
    the class its tokenizer config names (`err`); another family's failure is refused."""
    tokenizer_config = folder / "tokenizer_config.json"
    named = json.loads(tokenizer_config.read_text()) if tokenizer_config.exists() else {}
    if (
        "dream" not in json.dumps(named).lower()
        and model_family(read_config(folder), folder) != "dream"
    ):
        raise CheckpointError(f"cannot load the tokenizer in {folder}: {err}") from err
    if not (folder / "tokenizer.json").exists() and not (
        (folder / "vocab.json").exists() and (folder / "merges.txt").exists()
    ):
        # without these Qwen2Tokenizer still "loads", as an empty tokenizer
        raise CheckpointError(
            f"cannot load the tokenizer in {folder}: it holds neither tokenizer.json nor "
            f"vocab.json + merges.txt ({err})"
        ) from err
    from transformers import Qwen2Tokenizer

    return Qwen2Tokenizer.from_pretrained(str(folder))
