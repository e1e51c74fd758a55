"""Suite `host-reads`: how many times a decoder step waits for the device on the host (on a
GPU each such read, or blocking copy to the device, waits for the queued kernels), per commit
rule and cache, 16 rows (`--rows`) of the official-tiny LLaDA fixture (block diffusion: the
LLaDA2 fixture) on the CPU (prompts of 3 to 7 tokens, answer 32, block 8, every step after the
first; temperature 0 and 0.7).

    .venv/bin/python -m bench host-reads
    # another commit's decoder under the same counter:
    git worktree add /tmp/base REV && .venv/bin/python -m bench host-reads --package /tmp/base

What it counts (`HostReads`, which tests/test_batched_rules.py pins with): the calls that copy
a tensor's values to the host (`tolist`, `item`, `bool`/`int`/`float`/`index`, `nonzero`,
`cpu`, `numpy`, boolean-mask indexing) and the blocking copies of host data to the device
(`tensor(..., device=)`, `.to(device)` of a host tensor without `non_blocking`), the model's
included: LLaDA2's MoE layers read nothing on the CPU (their grouped GEMMs, models/moe.py).
Packages before that change read their experts' token counts once per MoE layer and pass,
which `--package` then counts in the block-diffusion rows (the tables of docs/PERFORMANCE.md
left those reads out). What it does not count: the time a wait costs, which on a GPU depends
on what is queued before it (no GPU here).

It also counts the operators of each step's commits (`RowDecoder._commit`, every rule's commit
of every row: the `aten::` operators called at the top level, views left out, each a kernel
launch on a GPU), which tell a commit batched over the rows from a loop over them.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import statistics
import sys
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode

from bench import common

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "official-tiny"
RULES: dict[str, dict[str, Any]] = {
    "entropy (alpha=0.5)": dict(alpha=0.5),
    "confidence (threshold=0.9)": dict(threshold=0.9),
    "fixed (steps=16)": dict(steps=16),
    "dream (alg=entropy, steps=32)": dict(rule="dream", steps=32, dream="entropy"),
    # block diffusion, on the LLaDA2 fixture: LLaDA2.0's default, LLaDA2.1's quality mode
    "block diffusion (LLaDA2.0)": dict(block=dict()),
    "block diffusion (LLaDA2.1, 0.7/0.5)": dict(block=dict(threshold=0.7, editing_threshold=0.5)),
}


class HostReads(TorchFunctionMode):
    """Counts the calls that wait for the device on a GPU: the reads of a tensor's values on
    the host (tolist, item, bool/int/float, nonzero, cpu, numpy, boolean-mask indexing) and
    the blocking copies of host data to the device (`tensor(..., device=)` /
    `as_tensor(..., device=)`, counted as `to_device`, and `.to(device)` of a host tensor
    without `non_blocking=True`: PyTorch waits for the stream after such a copy). On the CPU
    these read or copy nothing, but are counted all the same: the decoder runs the same calls
    on a GPU."""

    READS = {
        *("tolist", "item", "nonzero", "cpu", "numpy"),
        *("__bool__", "__int__", "__float__", "__index__"),
    }

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in self.READS or (name in ("__getitem__", "__setitem__") and _by_mask(args[1])):
            self.calls[name] += 1
        elif _blocking_copy_to_device(name, args, kwargs):
            self.calls["to_device"] += 1
        return func(*args, **kwargs)


def _by_mask(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _blocking_copy_to_device(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Host data to a device without `non_blocking=True` (the device named: on the CPU it is
    the CPU, on a GPU the GPU)."""
    if name in ("tensor", "as_tensor"):
        return kwargs.get("device") is not None
    if name != "to" or kwargs.get("non_blocking") or args[0].device.type != "cpu":
        return False
    targets = [*args[1:], kwargs.get("device")]
    return any(isinstance(t, (torch.device, str)) for t in targets) and not _in_host_to_device()


def _in_host_to_device() -> bool:
    """Whether the copy is `host_to_device`'s (decoding/rules.py): on CUDA it is pinned and
    non-blocking; on the CPU it may be a plain `.to`, which waits for nothing there."""
    frame = sys._getframe(1)
    for _ in range(12):  # the mode's own frames, then the caller's (however torch nests them)
        if frame is None:
            return False
        if frame.f_code.co_name == "host_to_device" and frame.f_code.co_filename.endswith(
            "rules.py"
        ):
            return True
        frame = frame.f_back
    return False


def per_step(
    model: Any,
    rule: dict[str, Any],
    cache: str,
    temperature: float,
    rows: int = 16,
    most_steps: int | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """Of each step but the first (which may make a schedule's constants): the host reads,
    the operators of its commits (`RowDecoder._commit`: every rule's commit of every row)
    and those of the whole step but the model's calls (views left out; each a kernel launch
    on a GPU: what the decoder adds to the model's pass); `most_steps`: stop after these."""
    decoder = _decoder(model, rule, cache, temperature, rows)
    decoder.step()
    reads, commits, steps = [], [], []
    decoder._commit = _labelled(decoder._commit, COMMIT_LABEL)
    while decoder.active and len(reads) != most_steps:
        with HostReads() as counted, _labelled_model(model):
            events = common.top_operators(decoder.step)
        reads.append(sum(counted.calls.values()))
        commits.append(sum(common.within(e, COMMIT_LABEL) for e in events))
        steps.append(sum(not common.within(e, MODEL_LABEL) for e in events))
    return reads, commits, steps


def _decoder(model: Any, rule: dict[str, Any], cache: str, temperature: float, rows: int) -> Any:
    """A `RowDecoder` holding `rows` rows: prompts of 3 to 7 tokens, answer 32, block 8."""
    from lm_eval_dvoting.core.decoding import DecodeRow, RowDecoder
    from lm_eval_dvoting.core.decoding.state import BlockDecoding, DreamDecoding

    if "dream" in rule:
        rule = dict(rule, dream=DreamDecoding(rule["dream"]))
    if "block" in rule:
        rule = dict(rule, block=BlockDecoding(**rule["block"]))
    decoder = RowDecoder(model)
    for i in range(rows):
        row = DecodeRow(
            prompt=torch.arange(3 + i % 5),
            tokens=torch.full((32,), model.mask_token_id),
            block_length=8,
            temperature=temperature,
            generator=torch.Generator().manual_seed(i),
            cache=cache,
            **rule,
        )
        decoder.add(row)
    return decoder


MODEL_LABEL, COMMIT_LABEL = "the model", "the commits"  # the profiler's labels


@contextlib.contextmanager
def _labelled_model(model: Any) -> Iterator[None]:
    """The model's calls labelled `MODEL_LABEL` for the profiler (signatures kept: the
    decoder inspects them), so that a step's operators can leave the model's out."""
    names = [n for n in ("forward", "hidden_states", "logits_from_hidden") if hasattr(model, n)]
    own = {name: model.__dict__[name] for name in names if name in model.__dict__}
    for name in names:
        setattr(model, name, _labelled(getattr(model, name), MODEL_LABEL))
    try:
        yield
    finally:
        for name in names:  # what the instance had of its own, else the class's method
            if name in own:
                setattr(model, name, own[name])
            else:
                delattr(model, name)


def _labelled(method: Any, label: str) -> Any:
    """`method`, its calls labelled `label` for the profiler."""

    @functools.wraps(method)
    def labelled(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(label):
            return method(*args, **kwargs)

    return labelled


def table(models: dict[str, Any], rows: int = 16) -> list[str]:
    lines = [
        "| rule | cache | temperature | reads per step: mean (min-max) "
        "| commit operators per step | step operators outside the model |",
        "|---|---|---:|---|---|---|",
    ]
    for name, rule in RULES.items():
        model = models["llada2" if "block" in rule else "llada"]
        for cache in ("none", "block" if "block" in rule else "dual"):
            for temperature in (0.0, 0.7):
                reads, commits, steps = per_step(model, rule, cache, temperature, rows)
                spreads = " | ".join(_spread(counts) for counts in (reads, commits, steps))
                lines.append(f"| {name} | {cache} | {temperature} | {spreads} |")
    return lines


def _spread(counts: list[int]) -> str:
    return f"{statistics.mean(counts):.1f} ({min(counts)}-{max(counts)})"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench host-reads", description=__doc__)
    p.add_argument("--package", help="a checkout whose lm_eval_dvoting to count (default: this)")
    p.add_argument("--rows", type=int, default=16, help="rows decoded together (default 16)")
    args = p.parse_args(argv)
    if args.rows < 1:
        p.error(f"--rows must be 1 or more, got {args.rows}")
    if args.package:
        common.import_package_from(args.package)
    from lm_eval_dvoting.models.loading import load_model

    torch.set_num_threads(1)
    models = {
        name: load_model(str(FIXTURES / name), device="cpu", dtype="float32")
        for name in ("llada", "llada2")
    }
    print(f"lm_eval_dvoting from {Path(sys.modules['lm_eval_dvoting'].__file__).parent.parent}")
    print("\n".join(table(models, args.rows)))
    return 0
