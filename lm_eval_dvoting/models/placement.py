"""One model spread over several GPUs (lm-eval's `parallelize=true`), for this package's models.

Models larger than one GPU (LLaDA2.0/2.1-flash: 100B parameters, about 190 GiB in
bfloat16) are split by layers with accelerate's big-model tools, as `--model hf` splits
them with `device_map="auto"`:

* A *placement unit* is placed whole: every transformer layer (never split: its residual
  stream, attention and experts run on one device, and a cached prefix's keys and values
  stay beside their layer), and outside the layers each module holding weights (the
  embedding, the final norm, the output head). `placement_units` lists them in the order
  the forward pass runs them; a device map is expanded to one entry per unit
  (`expand_device_map`), whatever granularity it was given at.
* `auto_device_map` computes the map on the meta device: GPU budgets balanced first, as
  transformers' `device_map="auto"` balances them (`balanced_budget`), then accelerate's
  `infer_auto_device_map`. What the GPUs cannot hold goes to a "cpu" entry of the budget
  (offloaded: kept in host memory, streamed to the main GPU for each forward pass); a map
  that would need the disk is refused.
* `models.loading.load_model(device_map=...)` reads each weight straight onto its unit's
  device (`weight_device`), so no weight is ever held twice in host memory, and then
  `dispatch` adds accelerate's hooks: each unit moves its inputs to its own device, and
  `hidden_states`/`logits_from_hidden` hand back their results on the *main device* (the
  embedding's), so the decoders and scorers see one device, as with an undivided model.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Union

import torch
from torch import nn

from lm_eval_dvoting.models.families import FAMILIES

# a GPU index or "cpu" ("disk" only inside auto_device_map, where it is refused)
Device = Union[int, str]
_GIB = 1 << 30


class PlacementError(ValueError):
    """A device map or memory budget that cannot place the model; the message says what to do."""


def layer_class(model: nn.Module) -> type[nn.Module]:
    """The transformer layer class of one of this package's models (its family's record in
    models/families.py): the unit accelerate must never split."""
    for family in FAMILIES.values():
        if type(model) is family.model_class():
            return family.layer_class()
    raise PlacementError(
        f"{type(model).__name__} is not one of this package's models "
        f"({', '.join(f.model_class().__name__ for f in FAMILIES.values())}): only those can "
        "be placed"
    )


def placement_units(model: nn.Module) -> list[str]:
    """The names of the modules placed whole, in the order the forward pass runs them."""
    layer = layer_class(model)
    units: list[str] = []

    def visit(prefix: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            full = prefix + name
            holds = (
                next(child.parameters(recurse=False), None) is not None
                or next(child.buffers(recurse=False), None) is not None
            )
            if isinstance(child, layer) or holds:
                units.append(full)
            elif next(child.children(), None) is not None:
                visit(full + ".", child)

    visit("", model)
    return units


def _device_value(label: str, value: Any, allow_disk: bool = False) -> Device:
    """A device as a GPU index or "cpu" ("cuda:1", torch.device("cuda", 1) and 1 alike);
    `label` names where it was given, for the messages."""
    text = str(value) if isinstance(value, torch.device) else value
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    if isinstance(text, str):
        if text in ("cpu", "cuda") or (allow_disk and text == "disk"):
            return 0 if text == "cuda" else text
        if text.isdigit() or (text.startswith("cuda:") and text[5:].isdigit()):
            return int(text.removeprefix("cuda:"))
        if text == "disk":
            raise PlacementError(
                f"{label} is 'disk': disk offload is not supported; give the GPUs more memory "
                "(more GPUs, max_memory_per_gpu) or offload to the CPU (max_cpu_memory)"
            )
    raise PlacementError(
        f"{label} = {value!r} is not a device: give a GPU index (0, 'cuda:1') or 'cpu'"
    )


def _expand(model: nn.Module, device_map: dict[str, Any], allow_disk: bool) -> dict[str, Device]:
    units = placement_units(model)
    modules = dict(model.named_modules())
    for key in device_map:
        if key not in modules:
            raise PlacementError(
                f"device_map names {key!r}, which is no module of this {type(model).__name__}: "
                f"keys are module names such as {units[0]!r} or {units[1]!r}, or '' for the whole "
                "model"
            )
        inside = next((unit for unit in units if key.startswith(unit + ".")), None)
        if inside is not None:
            raise PlacementError(
                f"device_map entry {key!r} lies inside {inside!r}, which is placed whole (a layer "
                f"is never split across devices): map {inside!r} itself"
            )
    expanded: dict[str, Device] = {}
    for unit in units:
        # the most specific entry that covers the unit ("" covers every unit)
        owner = max(
            (key for key in device_map if key in ("", unit) or unit.startswith(key + ".")), key=len
        )
        expanded[unit] = _device_value(f"device_map[{owner!r}]", device_map[owner], allow_disk)
    return expanded


def expand_device_map(model: nn.Module, device_map: dict[str, Any]) -> dict[str, Device]:
    """`device_map` (module name -> device; '' is the whole model) with one entry per placement
    unit, in forward order. An entry inside a unit (it would split a layer), a name of no
    module, a unit left unmapped, or the disk are refused."""
    uncovered = [
        unit
        for unit in placement_units(model)
        if not any(key in ("", unit) or unit.startswith(key + ".") for key in device_map)
    ]
    if uncovered:
        raise PlacementError(
            f"device_map places no entry over {uncovered[:3]}: map every module, or give '' "
            "(the whole model) as the default"
        )
    return _expand(model, device_map, allow_disk=False)


def main_device(device_map: dict[str, Device]) -> torch.device:
    """The embedding's device (the first unit of an expanded map): where token ids go in and
    hidden states and logits come out."""
    first = next(iter(device_map.values()))
    if first == "cpu" and any(device != "cpu" for device in device_map.values()):
        raise PlacementError(
            "the map puts the embedding on the CPU and other modules on GPUs: the embedding must "
            "sit on the first GPU (it is where token ids enter); give GPU 0 a larger budget"
        )
    return torch.device("cpu") if first == "cpu" else torch.device("cuda", int(first))


def named_device(
    device_map: str | dict[str, Any], max_memory: dict[Any, Any] | None
) -> torch.device:
    """The first GPU that a device map (for "auto", its budget) names, else the CPU: whose dtype
    default (bfloat16 on a GPU) and checks apply, before any weight is read. A GPU that CUDA
    does not see is refused here rather than when its first weight arrives."""
    if device_map == "auto":
        named = list((max_memory or {}).keys())
    elif isinstance(device_map, dict):
        named = list(device_map.values())
    else:
        raise PlacementError(
            f"device_map={device_map!r}: give 'auto' or a dict of module name -> GPU index or 'cpu'"
        )
    gpus = sorted(
        {
            device
            for device in (_device_value("a device map's device", v) for v in named)
            if device != "cpu"
        }
    )
    count = torch.cuda.device_count()
    if gpus and gpus[-1] >= count:
        raise PlacementError(
            f"the device map names GPU {gpus[-1]}, but CUDA sees {count} GPU(s): give GPU indices "
            f"below {count}, or 'cpu'"
        )
    return torch.device("cuda", gpus[0]) if gpus else torch.device("cpu")


def _torch_device(device: Device) -> torch.device:
    return torch.device("cpu") if device == "cpu" else torch.device("cuda", int(device))


def weight_device(device_map: dict[str, Device]) -> Callable[[str], torch.device]:
    """The device each weight is read onto, by name: its unit's (an offloaded unit's weights
    stay in host memory). A name of no unit maps to the main device (load_model refuses it)."""
    devices = {unit: _torch_device(device) for unit, device in device_map.items()}
    main = main_device(device_map)

    def device_of(name: str) -> torch.device:
        parts = name.split(".")
        for end in range(len(parts) - 1, 0, -1):
            unit = ".".join(parts[:end])
            if unit in devices:
                return devices[unit]
        return main

    return device_of


def parse_size(name: str, value: Any) -> int:
    """A memory size in bytes from an int or text as accelerate reads it ("80GiB", "500MB",
    10**9)."""
    from accelerate.utils import convert_file_size_to_int

    number = value  # bytes may come as 8e10 or "80000000000" from lm-eval's model args text
    if isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value)
    try:
        size = None if isinstance(value, bool) else convert_file_size_to_int(number)
    except (
        ValueError,
        TypeError,
        AttributeError,
    ):  # accelerate calls .upper() on whatever is not an int
        size = None
    if size is None or size <= 0:
        raise PlacementError(
            f"{name}={value!r} is not a memory size: give bytes (80000000000) or text such as "
            f"'80GiB' or '500MB', or leave {name} out"
        )
    return int(size)


def _budget(max_memory: dict[Any, Any]) -> dict[Device, int]:
    """`max_memory` with GPU indices and "cpu" as keys (GPUs first) and sizes in bytes."""
    budget: dict[Device, int] = {}
    for key, value in max_memory.items():
        device = _device_value("a max_memory key", key)
        budget[device] = parse_size(f"max_memory[{key!r}]", value)
    return dict(sorted(budget.items(), key=lambda item: (item[0] == "cpu", str(item[0]).zfill(8))))


def balanced_budget(
    model: nn.Module, max_memory: dict[Any, Any], dtype: torch.dtype
) -> dict[Device, int]:
    """Byte budgets for `infer_auto_device_map`, balanced over the GPUs as transformers'
    `device_map="auto"` (what lm-eval's `parallelize=True` runs) balances them: each GPU but
    the last holds at most 1/n of the weights plus 1.25 times the largest unit, so the layers
    spread evenly and every GPU keeps room for activations; the last keeps its whole budget
    for the remainder. (accelerate's `get_balanced_memory` sizes that margin from the *first*
    layer of a class, which in LLaDA2 is the small dense one.)"""
    from accelerate.utils import compute_module_sizes

    budget = _budget(max_memory)
    gpus = [device for device, size in budget.items() if device != "cpu" and size > 0]
    if len(gpus) < 2:
        return budget
    sizes = compute_module_sizes(model, dtype=dtype)
    largest = max(sizes[unit] for unit in placement_units(model))
    per_gpu = sizes[""] // len(gpus) + int(1.25 * largest)
    for gpu in gpus[:-1]:
        budget[gpu] = min(budget[gpu], per_gpu)
    return budget


def auto_device_map(
    model: nn.Module, max_memory: dict[Any, Any], dtype: torch.dtype
) -> dict[str, Device]:
    """The expanded map of `model` (on the meta device is enough) under `max_memory` (GPU index
    or "cpu" -> bytes or "80GiB"), weights in `dtype`; refused when it would need the disk."""
    from accelerate import infer_auto_device_map

    budget = balanced_budget(model, max_memory, dtype)
    raw = infer_auto_device_map(
        model, max_memory=budget, no_split_module_classes=[layer_class(model).__name__], dtype=dtype
    )
    expanded = _expand(model, raw, allow_disk=True)
    on_disk = [unit for unit, device in expanded.items() if device == "disk"]
    if on_disk:
        raise PlacementError(
            _does_not_fit(model, _budget(max_memory), dtype, on_disk, len(expanded))
        )
    main_device(expanded)  # refuses an embedding pushed off the GPUs
    return expanded


def _does_not_fit(
    model: nn.Module, budget: dict[Device, int], dtype: torch.dtype, spilled: list[str], units: int
) -> str:
    from accelerate.utils import compute_module_sizes

    sizes = compute_module_sizes(model, dtype=dtype)
    largest = max(sizes[unit] for unit in placement_units(model))
    shown = ", ".join(f"{device}: {size / _GIB:.1f} GiB" for device, size in budget.items())
    # the CPU, too, keeps one layer's room (accelerate reserves it on GPU 0 and the CPU)
    cpu_needed = budget.get("cpu", 0) + sum(sizes[unit] for unit in spilled) + largest
    return (
        f"the model does not fit: its weights need {sizes[''] / _GIB:.1f} GiB in "
        f"{str(dtype).removeprefix('torch.')}, the memory budget ({shown}) holds "
        f"{sum(budget.values()) / _GIB:.1f} GiB, of which GPU 0 keeps {largest / _GIB:.1f} GiB "
        f"free (one layer) and layers are never split; {len(spilled)} of {units} modules would "
        "go to the disk, which is not supported. Use more GPUs, a larger max_memory_per_gpu, or "
        f"offload the rest to the CPU with max_cpu_memory={-(-cpu_needed // _GIB)}GiB"
    )


def device_shares(
    model: nn.Module, device_map: dict[str, Device], dtype: torch.dtype
) -> dict[Device, int]:
    """Bytes of weights in `dtype` that each device holds under an expanded map."""
    from accelerate.utils import compute_module_sizes

    sizes = compute_module_sizes(model, dtype=dtype)
    shares: dict[Device, int] = {}
    for unit, device in device_map.items():
        shares[device] = shares.get(device, 0) + sizes[unit]
    return shares


def dispatch(
    model: nn.Module, device_map: dict[str, Device], offload_cpu: bool | None = None
) -> None:
    """Add accelerate's hooks to `model`, whose weights already sit where the expanded
    `device_map` says; record the map (`model.device_map`) and `model.main_device`.

    Each unit gets one hook that moves its inputs to its device (accelerate's
    `dispatch_model` also hooks every submodule holding weights, which for LLaDA2-flash's
    256 experts a layer is tens of thousands of hook calls per forward pass, for nothing:
    a resident unit's submodules only ever see its own device). "cpu" units are offloaded
    when `offload_cpu` (default: when the main device is a GPU), as accelerate offloads: their
    weights stay in host memory, streamed to the main device submodule by submodule for
    each pass; otherwise they run on the CPU. The embedding is never offloaded (token ids
    enter there, and a tied head reads its weight directly).
    """
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    main = main_device(device_map)
    offload_cpu = main.type != "cpu" if offload_cpu is None else offload_cpu
    embedding = next(iter(device_map))
    offloaded = [
        unit
        for unit, device in device_map.items()
        if device == "cpu" and offload_cpu and unit != embedding
    ]
    weights = _offloaded_weights(model, offloaded)
    for unit, device in device_map.items():
        module = model.get_submodule(unit)
        if unit in offloaded:
            _hook_offloaded(module, unit, main, weights)
        else:  # resident: its weights are already there; the hook moves its inputs
            add_hook_to_module(
                module,
                AlignDevicesHook(execution_device=_torch_device(device), place_submodules=True),
            )
    # the root's: `forward` takes and returns tensors on the caller's device
    add_hook_to_module(model, AlignDevicesHook(execution_device=main, io_same_device=True))
    _results_on(model, main)
    model.device_map = dict(device_map)
    model.main_device = main


def _offloaded_weights(model: nn.Module, offloaded: list[str]) -> Any:
    """The weights of the `offloaded` units, in accelerate's loader (None: none offloaded).
    They live on there only (the modules' own become meta): never twice in host memory."""
    from accelerate.utils import OffloadedWeightsLoader, extract_submodules_state_dict

    if not offloaded:
        return None
    return OffloadedWeightsLoader(
        state_dict=extract_submodules_state_dict(model.state_dict(), offloaded)
    )


def _hook_offloaded(module: nn.Module, unit: str, main: torch.device, weights: Any) -> None:
    """accelerate's offload hooks on `module`: its weights streamed from `weights` to the
    `main` device submodule by submodule; a unit holding no weight itself (a layer) gets
    one more hook that moves its inputs."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module, attach_align_device_hook

    attach_align_device_hook(
        module, execution_device=main, offload=True, weights_map=weights, module_name=unit
    )
    if not hasattr(module, "_hf_hook"):
        add_hook_to_module(module, AlignDevicesHook(execution_device=main))


def _results_on(model: nn.Module, main: torch.device) -> None:
    """`hidden_states` returns on `main` and `logits_from_hidden` beside its input, as an undivided
    model's do: callers index hidden states with tensors made on the model's device, and the
    head (or a tied embedding) reads hidden states wherever it sits. Only these two are
    wrapped: accelerate's hooks see `forward` calls, and the decoders call these directly."""
    hidden_states, logits_from_hidden = model.hidden_states, model.logits_from_hidden

    @functools.wraps(
        hidden_states
    )  # keeps the signature, which the decoders inspect (cache, position_ids)
    def hidden_on_main(*args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states(*args, **kwargs).to(main)

    @functools.wraps(logits_from_hidden)
    def logits_beside_hidden(hidden: torch.Tensor) -> torch.Tensor:
        return logits_from_hidden(hidden.to(main)).to(hidden.device)

    model.hidden_states = hidden_on_main
    model.logits_from_hidden = logits_beside_hidden


def gpu_budget(max_memory_per_gpu: Any = None, max_cpu_memory: Any = None) -> dict[Device, int]:
    """The `max_memory` of `parallelize=true`, as lm-eval's HFLM builds it
    (`_get_accelerate_args`).

    This process's GPUs (`_own_gpus`), each with `max_memory_per_gpu`, else its free memory;
    `max_cpu_memory`, when given, is the CPU offload budget (none by default).
    """
    per_gpu = (
        None if max_memory_per_gpu is None else parse_size("max_memory_per_gpu", max_memory_per_gpu)
    )
    cpu = None if max_cpu_memory is None else parse_size("max_cpu_memory", max_cpu_memory)
    gpus = _own_gpus()
    # free memory read on this process's GPUs only (accelerate's get_max_memory, which HFLM
    # calls, opens a CUDA context on every visible GPU, other processes' too)
    budget: dict[Device, int] = {
        gpu: per_gpu if per_gpu is not None else int(torch.cuda.mem_get_info(gpu)[0])
        for gpu in gpus
    }
    if cpu is not None:
        budget["cpu"] = cpu
    return budget


def _own_gpus() -> list[int]:
    """This process's GPUs: all visible ones, or under `accelerate launch`/`torchrun` with
    several processes on a machine, those whose index modulo the local process count is
    the local rank (HFLM splits them so; unlike HFLM, also when `max_memory_per_gpu` is
    given, so two processes never share a GPU). None is refused."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    count = torch.cuda.device_count()
    gpus = [index for index in range(count) if index % local_world == local_rank]
    if not gpus:
        why = (
            "CUDA sees none"
            if count == 0
            else (
                f"none of the {count} visible falls to local process {local_rank} of "
                f"{local_world} (process r takes the GPUs whose index modulo {local_world} is r)"
            )
        )
        raise PlacementError(
            f"parallelize=True spreads the model over GPUs, but {why}: drop parallelize (one model "
            "per device), or for several processes run data parallel (accelerate launch / "
            "torchrun) with at most one process per GPU"
        )
    return gpus


def describe(device_map: dict[str, Device]) -> str:
    """A one-line summary of an expanded map: each device with its first and last unit."""
    runs: list[list[Any]] = []
    for unit, device in device_map.items():
        if runs and runs[-1][0] == device:
            runs[-1][2] = unit
        else:
            runs.append([device, unit, unit])
    return "; ".join(
        f"{'cpu' if d == 'cpu' else f'cuda:{d}'}: {a}" + ("" if a == b else f" .. {b}")
        for d, a, b in runs
    )
