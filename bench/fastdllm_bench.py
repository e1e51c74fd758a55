"""Suite `fastdllm`: NVlabs Fast-dLLM's own LLaDA `generate` and ours, side by side, on the same
random-weight LLaDA (issue #43). Writes its own section of BENCHMARKS.md.

    # once, where the Fast-dLLM mirror is: its llada/ files, unmodified, into bench/.fastdllm/
    python -m bench fastdllm --export
    # a CPU smoke run (a tiny LLaDA; checks the tokens, its times mean nothing)
    OMP_NUM_THREADS=1 python -m bench fastdllm --tiny --json /tmp/fastdllm_tiny.json
    # on a GPU machine (bench/.fastdllm/ carried there): LLaDA-8B's shape in bfloat16
    python3 -m bench fastdllm --json $OUT/fastdllm_bench.json
    # the section of BENCHMARKS.md from --json
    python -m bench fastdllm --report-only --json bench/results/fastdllm_bench.json

Fast-dLLM's files are never committed: `--export` copies `llada/generate.py` and
`llada/model/` (and the LICENSE) from a local git mirror of github.com/NVlabs/Fast-dLLM at a
commit (`--mirror`, `--commit`) into `--fastdllm` (bench/.fastdllm/, git-ignored) with a
record of the commit and each file's git blob id; a run refuses files that differ from that
record. Their `generate.py` imports `model.modeling_llada`, so their `llada/model/` is
imported as the top-level package `model` and `llada/generate.py` as `generate` (a process
that already holds other modules of those names is refused); `einops`, which their modeling
file imports for a block type LLaDA does not use, is replaced by a stand-in that refuses
every call where it is not installed. Two settings made from outside, with no file changed:
their config's `use_cache = False` (transformers 5 drops the keyword their config class
passes on), and their model is built on the meta device through their own classes (their
`LLaDAModel` with `init_device="meta"` handed to `LLaDAModelLM`), then given our weights.

Both sides decode the same model: our `LLaDAModel` built with random weights
(`bench.workloads.random_llada`, N(0, 0.02)), its state dict loaded into their
`LLaDAModelLM` (the parameter names are the official checkpoint's on both sides; every
tensor is checked equal after the copy). Two changes to the random weights, made before
the copy so both sides see them: the output head is drawn with std `--logit-std /
sqrt(d_model)`, so that the logits have about that spread and the 0.9 threshold is met at
some positions (with N(0, 0.02) no position of a 126,464-token vocabulary ever reaches it,
and the threshold rule would commit one token per step); and the head's row for the mask
token is zeroed, so that no position predicts the mask (we exclude the mask token from the
candidates; Fast-dLLM does not, and its fixed schedule then fails with an IndexError).

Cells: cache `none|prefix|dual` (their `generate`, `generate_with_prefix_cache`,
`generate_with_dual_cache`; our `generate(..., cache=...)`) x schedule (`threshold`: their
`threshold=0.9`, our `decoder=confidence`, i.e. `threshold=0.9, steps=None`; `fixed`: steps
= answer length, one token per step, low-confidence remasking) x rows (1 and 16),
temperature 0, prompt 256 + answer 256, block 32, the same random prompts (no mask id in
them, all of one length). Their `generate` builds a batch of one row
(`torch.full((1, ...))`), so a cell of 16 rows runs it once per prompt, one after the other;
ours decodes the 16 rows in one call. With `--their-rows K` theirs runs only the first K
prompts of a cell, its time scaled by rows / K (its calls are independent and one row each:
an estimate, exact in steps for the fixed schedule, not for the threshold, whose steps
depend on the prompt), and the tokens and NFE are compared on those K rows; the report marks
such cells (bench/gpu_session.sh's 16-row call uses K = 4, to fit a lent GPU's time). Each
cell times every whole call (`torch.cuda.synchronize()` around it on a GPU), ours and theirs
in turn (the order alternating between repeats), `--repeats` times (fewer where a cell has
taken `--repeat-budget-s` already), after one warm-up call of each side per cache (one block
long; ours with all the rows); the median and the range are kept. The cells run cheapest
first (1 row before 16, threshold before fixed, dual before prefix before none), and none
starts after `--deadline-s`, so that a bounded run measures the most cells. The answers of
the first repeat are compared token by token (identical, and the first differing row and
position), and every later repeat must give each side's own answers again. NFE: ours is
`DecodeResult.nfe` per row; theirs is the count their `generate` returns per call, and a
forward hook on their model counts its calls too.

Before the cells, both sides' logits on one decode's first pass (row 0's prompt and an
all-masked answer), each computed as its decoder does (ours: attention mask and positions
from `left_pad`, the head on the masked positions only; theirs: `model(x).logits`), are
compared on the answer's positions (`logit_agreement`): how far apart, where the picks differ
and our top-2 margin there, and where the threshold is met on one side only; so a run whose
tokens part says whether the two passes disagree or only round differently.

`--json` is rewritten after every cell, so a crash loses little. `--report-only` writes the
section from `--json`, with the cells of `--merge FILE...` (other runs of the same model,
lengths and machine kind, e.g. the 16-row cells run apart) added. The section goes between
`<!-- fastdllm_bench:start -->` and `<!-- fastdllm_bench:end -->` of `--out`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import importlib.util
import json
import math
import operator
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from bench.common import (
    REPO,
    RESULTS,
    add_output_flags,
    add_section_flag,
    add_threads_flag,
    args_record,
    command_line,
    is_cuda,
    launcher_for,
    load_json,
    markers,
    run_facts,
    save_json,
    timed_call,
    utc_now,
    write_section,
)
from bench.workloads import LLADA_EOS_ID, LLADA_MASK_ID, LLADA_VOCAB, random_llada
from lm_eval_dvoting.core.decoding import generate as our_generate
from lm_eval_dvoting.core.decoding.state import left_pad
from lm_eval_dvoting.core.decoding.static_steps import (
    CACHED_STEPS,
    CAPTURED,
    resolve_cached_steps,
)

SECTION = "fastdllm_bench"  # the markers' name; another run's section gets its own (--section)
DEFAULT_MIRROR = Path("/work/.mirror/NVlabs+Fast-dLLM/repo")
DEFAULT_DIR = REPO / "bench" / ".fastdllm"
RECORD = "fastdllm_export.json"  # the export's record, beside the files
SOURCE = "https://github.com/NVlabs/Fast-dLLM"
# what is exported: the LLaDA side of Fast-dLLM, and its licence
FILES = (
    "LICENSE",
    "llada/generate.py",
    "llada/model/__init__.py",
    "llada/model/configuration_llada.py",
    "llada/model/modeling_llada.py",
)
CACHES = ("none", "prefix", "dual")
SCHEDULES = ("threshold", "fixed")
THEIR_FUNCTIONS = {
    "none": "generate",
    "prefix": "generate_with_prefix_cache",
    "dual": "generate_with_dual_cache",
}
# LLaDA-8B's shape (its config.json) and the --tiny one
FULL_SHAPE = {
    "d_model": 4096,
    "n_layers": 32,
    "n_heads": 32,
    "mlp_hidden_size": 12288,
    "vocab_size": LLADA_VOCAB,
}
# a small vocabulary: their decoder's float64 softmax over the whole vocabulary at every
# position of every step dominates a CPU run with LLaDA's
TINY_SHAPE = {"d_model": 64, "n_layers": 2, "n_heads": 4, "mlp_hidden_size": 192, "vocab_size": 512}
FULL_SIZES = {"prompt_length": 256, "gen_length": 256, "block": 32}
TINY_SIZES = {"prompt_length": 32, "gen_length": 32, "block": 8}
Results = dict[str, Any]


class ExportError(RuntimeError):
    """Fast-dLLM's files cannot be exported or are not the exported ones."""


# ----------------------------------------------------------------- export


def blob_id(data: bytes) -> str:
    """Git's object id of a file holding `data` (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _git(mirror: Path, *args: str) -> bytes:
    done = subprocess.run(["git", "-C", str(mirror), *args], capture_output=True, timeout=60)
    if done.returncode:
        raise ExportError(
            f"git {' '.join(args)} failed in --mirror {mirror}: "
            f"{done.stderr.decode(errors='replace').strip()}"
        )
    return done.stdout


def resolve_commit(mirror: Path, commit: str) -> str:
    """The full hash of `commit` in the git mirror `mirror`; a clear refusal where either is
    missing."""
    if not mirror.exists():
        raise ExportError(
            f"--mirror {mirror} does not exist: give the path of a git clone (bare or not) of "
            f"{SOURCE}"
        )
    return _git(mirror, "rev-parse", "--verify", f"{commit}^{{commit}}").decode().strip()


def export(mirror: Path, commit: str, dest: Path) -> Results:
    """Copy `FILES` at `commit` of `mirror` into `dest`, byte for byte, and write the record
    (source, commit, each file's blob id) beside them."""
    full = resolve_commit(mirror, commit)
    files: dict[str, str] = {}
    for name in FILES:
        data = _git(mirror, "cat-file", "blob", f"{full}:{name}")
        expected = _git(mirror, "rev-parse", f"{full}:{name}").decode().strip()
        if blob_id(data) != expected:
            raise ExportError(f"{name} at {full} read back as another blob than git's")
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        files[name] = expected
    record = {"source": SOURCE, "mirror": str(mirror), "commit": full, "files": files}
    (dest / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return record


def check_export(dest: Path) -> Results:
    """The export's record, after checking that every file in `dest` is the one exported."""
    path = dest / RECORD
    if not path.exists():
        raise ExportError(
            f"--fastdllm {dest} holds no {RECORD}: export Fast-dLLM's files first "
            "(python -m bench fastdllm --export, with --mirror if its mirror is elsewhere)"
        )
    record = json.loads(path.read_text())
    for name, expected in record["files"].items():
        file = dest / name
        if not file.exists() or blob_id(file.read_bytes()) != expected:
            raise ExportError(
                f"{file} is missing or differs from Fast-dLLM {record['commit'][:7]}'s "
                "(blob {expected[:7]}): export again (python -m bench fastdllm --export)"
            )
    return record


# ----------------------------------------------------------------- their code


def _stand_in_einops() -> None:
    """Their modeling file imports `einops.rearrange` for the block-diffusion block that
    LLaDA does not use; where einops is missing, a module whose function refuses stands in."""
    try:
        importlib.import_module("einops")
    except ImportError:

        def rearrange(*args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("einops is not installed (the bench's stand-in)")

        stand_in = types.ModuleType("einops")
        stand_in.rearrange = rearrange  # type: ignore[attr-defined]
        sys.modules["einops"] = stand_in


def _import_file(name: str, path: Path, package: bool = False) -> types.ModuleType:
    """Import `path` as the top-level module `name` (a package when `package`: its folder is
    then where its submodules are found), without touching `sys.path`."""
    locations = [str(path.parent)] if package else None
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=locations)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_fastdllm(dest: Path) -> tuple[types.ModuleType, types.ModuleType, Results]:
    """Their `generate` and `model.modeling_llada` modules, imported from `dest/llada`
    (checked unmodified first) under the names their code imports them by, and the
    export's record."""
    record = check_export(dest)
    folder = (dest / "llada").resolve()
    for name in ("generate", "model"):
        loaded = sys.modules.get(name)
        if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(str(folder)):
            raise ExportError(
                f"a module named {name!r} is already imported from {loaded.__file__}: "
                "their code imports its own under that name; run the suite in a fresh process"
            )
    _stand_in_einops()
    _import_file("model", folder / "model" / "__init__.py", package=True)
    generate = _import_file("generate", folder / "generate.py")
    return generate, importlib.import_module("model.modeling_llada"), record


# ----------------------------------------------------------------- models


def llada_config(shape: dict[str, int]) -> Results:
    """An official-format LLaDA `config.json` (LLaDA-8B's fields, rope theta...) with
    `shape`'s width, depth, heads, MLP and vocabulary; LLaDA's mask and end ids with its
    vocabulary, else the 12th and 13th ids from the top (as the tiny fixtures place them)."""
    real = shape["vocab_size"] == LLADA_VOCAB
    mask_id = LLADA_MASK_ID if real else shape["vocab_size"] - 12
    eos_id = LLADA_EOS_ID if real else mask_id - 1
    return {
        "model_type": "llada",
        "activation_type": "silu",
        "block_type": "llama",
        "layer_norm_type": "rms",
        "rms_norm_eps": 1e-5,
        "rope": True,
        "rope_full_precision": True,
        "rope_theta": 500000.0,
        "alibi": False,
        "flash_attention": False,
        "include_bias": False,
        "include_qkv_bias": False,
        "weight_tying": False,
        "scale_logits": False,
        "input_emb_norm": False,
        "block_group_size": 1,
        "n_kv_heads": shape["n_heads"],
        "embedding_size": shape["vocab_size"],
        "max_sequence_length": 4096,
        "mask_token_id": mask_id,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "use_cache": False,
        **shape,
    }


def our_model(config: Results, logit_std: float, device: str, dtype: torch.dtype) -> Any:
    """Our random-weight LLaDA, with the head drawn for logits of spread about `logit_std`
    and its mask-token row zeroed (module docstring)."""
    model = random_llada(config, seed=1, device=device, dtype=dtype)
    head = model.output_head().weight
    with torch.no_grad():
        head.normal_(0, logit_std / math.sqrt(config["d_model"]))
        head[config["mask_token_id"]].zero_()
    return model


@contextlib.contextmanager
def kept_attention_kernels() -> Iterator[None]:
    """Restore torch's choice of attention kernels on leaving. Their `LLaDAModel` constructor
    switches the memory-efficient kernel off for the whole process; their passes need none
    (they give no mask, so the flash kernel runs), nor do ours where no row is padded, but
    ours give a key mask where rows are, and would fall back to the slow math kernel on a
    GPU."""
    flags = {
        "flash": torch.backends.cuda.flash_sdp_enabled(),
        "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
        "math": torch.backends.cuda.math_sdp_enabled(),
    }
    try:
        yield
    finally:
        torch.backends.cuda.enable_flash_sdp(flags["flash"])
        torch.backends.cuda.enable_mem_efficient_sdp(flags["mem_efficient"])
        torch.backends.cuda.enable_math_sdp(flags["math"])


def their_model(modeling: types.ModuleType, config: Results, ours: Any) -> Any:
    """Their `LLaDAModelLM` of `config` holding `ours`'s weights, on its device and in its
    dtype (built on the meta device through their own constructors, then filled)."""
    pretrained = modeling.LLaDAConfig(**config)
    # transformers 5 drops the `use_cache` keyword their config passes on, and their forward
    # reads the attribute when a call gives none (their `generate` without a cache)
    pretrained.use_cache = False
    inner_config = modeling.create_model_config_from_pretrained_config(pretrained)
    inner_config.init_device = "meta"  # no initialisation: the weights are copied next
    with kept_attention_kernels():
        theirs = modeling.LLaDAModelLM(
            pretrained, model=modeling.LLaDAModel(inner_config, init_params=False)
        )
    first = next(ours.parameters())
    # the dtype first, on the meta device: no float32 copy of LLaDA-8B is ever allocated
    theirs = theirs.to(first.dtype).to_empty(device=first.device).eval().requires_grad_(False)
    mine, their_names = ours.state_dict(), set(theirs.state_dict())
    if set(mine) != their_names:
        raise RuntimeError(
            "our LLaDA's parameter names differ from Fast-dLLM's: only ours "
            f"{sorted(set(mine) - their_names)[:5]}, only theirs "
            f"{sorted(their_names - set(mine))[:5]}"
        )
    theirs.load_state_dict(mine, strict=True)
    for name, tensor in theirs.state_dict().items():
        if not torch.equal(tensor, mine[name]):
            raise RuntimeError(f"{name} differs after copying our weights into Fast-dLLM's")
    return theirs


class CallCounter:
    """Counts a module's forward calls (a forward hook)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.calls = 0
        module.register_forward_hook(self._count)

    def _count(self, *args: Any) -> None:
        self.calls += 1


# ----------------------------------------------------------------- one cell


def cell_settings(schedule: str, args: argparse.Namespace, mask_id: int) -> tuple[Results, Results]:
    """Their and our keyword arguments for `schedule` (module docstring)."""
    common = {"gen_length": args.gen_length, "block_length": args.block, "temperature": 0.0}
    if schedule == "threshold":
        theirs = {**common, "steps": args.gen_length, "threshold": args.threshold}
        ours = {**common, "threshold": args.threshold}
    else:
        theirs = {**common, "steps": args.gen_length, "threshold": None}
        ours = {**common, "steps": args.gen_length}
    theirs.update(remasking="low_confidence", mask_id=mask_id)
    return theirs, {**ours, "remasking": "low_confidence"}


def _synced(device: torch.device, run: Callable[[], Any]) -> tuple[float, Any]:
    """`run()`'s wall time and result, the device synchronised around it (`timed_call`;
    one name here, which the tests replace with a clock of their own)."""
    return timed_call(run, device)


def run_theirs(
    function: Callable[..., Any], model: Any, prompts: torch.Tensor, kwargs: Results
) -> tuple[torch.Tensor, list[int]]:
    """Their answers (rows, answer length) on the CPU and their NFE per row: one call per
    prompt, as their `generate` decodes one row."""
    answers, nfe = [], []
    for prompt in prompts:
        x, count = function(model, prompt[None], **kwargs)
        answers.append(x[0, prompt.numel() :].cpu())
        nfe.append(int(count))
    return torch.stack(answers), nfe


def run_ours(model: Any, prompts: torch.Tensor, cache: str, kwargs: Results) -> Any:
    """Our answers and NFE per row: one call for all rows."""
    result = our_generate(model, prompts, cache=cache, **kwargs)
    return result.tokens, [int(n) for n in result.nfe]


def logit_agreement(ours: Any, theirs: Any, prompt: torch.Tensor, args: Any) -> Results:
    """Both sides' logits on one decode's first pass (`prompt` and an all-masked answer),
    each computed as its decoder does (`our_first_pass`; theirs `model(x).logits`), compared
    on the answer's positions: how far apart (the mask token's column left out, values that
    are not finite counted apart), where each side's pick differs (ours never picks the mask
    token, theirs may) and our top-2 margin there (a near-tie that rounding flips has a small
    one), and where each side's rule meets `--threshold` on one side only (float64 softmax,
    as both do; ours without the mask token, theirs with it)."""
    mask_id = int(ours.mask_token_id)
    answer = torch.full((args.gen_length,), mask_id, dtype=prompt.dtype, device=prompt.device)
    x = torch.cat([prompt, answer])[None]
    with torch.no_grad():
        mine = our_first_pass(ours, x, prompt.numel())
        other = theirs(x).logits[0, prompt.numel() :].double()
    kept = torch.arange(mine.shape[-1], device=mine.device) != mask_id
    finite = mine[:, kept].isfinite() & other[:, kept].isfinite()
    gap = (mine[:, kept] - other[:, kept]).abs()[finite]
    mine[:, mask_id] = -torch.inf  # ours never picks the mask token; theirs may
    differ = mine.argmax(-1) != other.argmax(-1)
    top2 = mine.topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1])[differ]
    sure = [logits.softmax(-1).max(-1).values >= args.threshold for logits in (mine, other)]
    return {
        "positions": int(mine.shape[0]),
        "max_abs": float(gap.max()) if len(gap) else None,
        "mean_abs": float(gap.mean()) if len(gap) else None,
        "not_finite": int((~finite).sum()),
        "argmax_differ": int(differ.sum()),
        "largest_margin_where_differ": float(margin.max()) if len(margin) else None,
        "threshold_differ": int((sure[0] != sure[1]).sum()),
    }


def our_first_pass(model: Any, x: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """Our logits at the answer's positions (float64) as the decoder's `none` pass computes
    them: the sequence laid out by `left_pad` (one row: no attention mask, as the decoder
    gives none where nothing is padded; positions), the hidden states, then the head on the
    gathered masked positions only."""
    ids, attention, positions = left_pad([x[0]], 0, x.device, mask_only_if_padded=True)
    hidden = model.hidden_states(ids, attention, position_ids=positions)
    columns = torch.arange(prompt_length, x.shape[1], device=x.device)
    picked = hidden[torch.zeros_like(columns), columns]
    return model.logits_from_hidden(picked).double()


def logit_lines(results: Results) -> list[str]:
    """The first pass's logits compared (runs before this comparison existed have none)."""
    found = results.get("logits")
    if found is None:
        return []
    margin = found["largest_margin_where_differ"]
    where = "" if margin is None else f"; where they do, our top-2 margin is at most {margin:.3g}"
    apart = (
        f"at most {found['max_abs']:.3g} apart (mean {found['mean_abs']:.3g})"
        if found["max_abs"] is not None
        else "no finite pair to compare"
    )
    bad = f", {found['not_finite']} values not finite" if found["not_finite"] else ""
    return [
        "",
        f"The first pass's logits, each side's as its decoder computes them (row 0: the prompt "
        f"and an all-masked answer, {found['positions']} answer positions): {apart}{bad}; the "
        f"two sides pick different tokens at {found['argmax_differ']} position(s){where}; "
        f"the threshold is met on one side only at {found['threshold_differ']}.",
    ]


def first_difference(ours: torch.Tensor, theirs: torch.Tensor) -> Results | None:
    """The first (row, answer position) where the answers differ, and how many rows differ;
    None when they are identical."""
    differs = (ours != theirs).nonzero()
    if not len(differs):
        return None
    row, position = (int(v) for v in differs[0])
    rows = int((ours != theirs).any(dim=1).sum())
    return {"row": row, "position": position, "rows_differing": rows}


def summary(seconds: list[float]) -> Results:
    """Median and range of a side's timed calls."""
    return {
        "seconds": seconds,
        "median_s": statistics.median(seconds),
        "min_s": min(seconds),
        "max_s": max(seconds),
    }


class Bench:
    """What every cell of a run shares: the two models, their `generate` module, the call
    counter on their model, the prompts, the flags."""

    def __init__(
        self, args: argparse.Namespace, generate: Any, ours: Any, theirs: Any, prompts: Any
    ) -> None:
        self.args, self.generate, self.ours, self.theirs = args, generate, ours, theirs
        self.prompts, self.device = prompts, prompts.device
        self.counter = CallCounter(theirs)

    def sides(self, cache: str, schedule: str, rows: int) -> dict[str, Callable[[], Any]]:
        """Each side's call for the cell, as a function of nothing."""
        theirs_kwargs, ours_kwargs = cell_settings(schedule, self.args, self.ours.mask_token_id)
        function = getattr(self.generate, THEIR_FUNCTIONS[cache])
        prompts, their_prompts = self.prompts[:rows], self.prompts[: their_rows(self.args, rows)]
        return {
            "ours": lambda: run_ours(self.ours, prompts, cache, ours_kwargs),
            "theirs": lambda: run_theirs(function, self.theirs, their_prompts, theirs_kwargs),
        }

    def warm_up(self) -> None:
        """One call of each side per cache, one block long, before anything is timed
        (kernels chosen, memory pools grown): ours with all the rows, as its largest
        cells batch them; theirs with one row, as it always runs."""
        short = argparse.Namespace(**{**vars(self.args), "gen_length": self.args.block})
        theirs_kwargs, ours_kwargs = cell_settings("threshold", short, self.ours.mask_token_id)
        for cache in self.args.caches:
            function = getattr(self.generate, THEIR_FUNCTIONS[cache])
            _synced(self.device, lambda: run_ours(self.ours, self.prompts, cache, ours_kwargs))
            _synced(
                self.device,
                lambda: run_theirs(function, self.theirs, self.prompts[:1], theirs_kwargs),
            )


def their_rows(args: argparse.Namespace, rows: int) -> int:
    """The prompts their `generate` runs at a cell of `rows` rows: all of them, or the first
    `--their-rows` (its time then scaled by rows / those: it runs one row a call)."""
    return rows if args.their_rows is None else min(rows, args.their_rows)


def _timed_calls(bench: Bench, sides: dict[str, Callable[[], Any]], scale: Results) -> Any:
    """Both sides' calls `--repeats` times in alternating order (fewer past
    `--repeat-budget-s`): each side's times (x `scale[side]`), first answers (tokens, NFE,
    their model's forward calls) and whether later repeats gave the same tokens."""
    times: dict[str, list[float]] = {"ours": [], "theirs": []}
    answers: dict[str, Any] = {}
    repeatable = {"ours": True, "theirs": True}
    start = time.perf_counter()
    for repeat in range(bench.args.repeats):
        budget = bench.args.repeat_budget_s
        if repeat and budget is not None and time.perf_counter() - start > budget:
            break  # a long cell is not repeated: --repeat-budget-s
        for side in ("ours", "theirs") if repeat % 2 == 0 else ("theirs", "ours"):
            calls = bench.counter.calls
            elapsed, found = _synced(bench.device, sides[side])
            times[side].append(elapsed * scale[side])
            if side not in answers:
                answers[side] = (*found, bench.counter.calls - calls)
            elif not torch.equal(found[0], answers[side][0]):
                repeatable[side] = False
    return times, answers, repeatable


def measure_cell(bench: Bench, cache: str, schedule: str, rows: int) -> Results:
    """One cell: times, NFE, and whether the answers agree (module docstring): on the rows
    theirs ran (`their_rows`), whose time is scaled to the cell's rows."""
    ran = their_rows(bench.args, rows)
    scale = {"ours": 1.0, "theirs": rows / ran}
    times, answers, repeatable = _timed_calls(bench, bench.sides(cache, schedule, rows), scale)
    difference = first_difference(answers["ours"][0][:ran], answers["theirs"][0])
    ours, theirs = summary(times["ours"]), summary(times["theirs"])
    their_record = {"nfe": answers["theirs"][1], "forward_calls": answers["theirs"][2]}
    return {
        "cache": cache,
        "schedule": schedule,
        "rows": rows,
        "ours": {**ours, "nfe": answers["ours"][1]},
        "theirs": {**theirs, **their_record, "rows_run": ran},
        "identical": difference is None,
        "first_difference": difference,
        "repeatable": repeatable,
        "ratio": ours["median_s"] / theirs["median_s"],
    }


# ----------------------------------------------------------------- a run


def resolve_sizes(args: argparse.Namespace) -> Results:
    """The model shape and sizes (`model_shape`); refuses sizes their `generate` cannot
    take and a `--their-rows` below 1."""
    if args.their_rows is not None and args.their_rows < 1:
        raise SystemExit(
            f"--their-rows {args.their_rows}: give 1 or more (the prompts Fast-dLLM runs per "
            "cell), or leave it out (all the cell's rows)"
        )
    return model_shape(args, why="their generate asserts it")


def model_shape(args: argparse.Namespace, why: str = "the blocks tile the answer") -> Results:
    """LLaDA-8B's shape or `--tiny`'s, with `--layers` (and `--vocab`, where the suite has
    it) given; the length flags left out filled in; an answer that blocks do not tile
    refused (`why`: what requires it)."""
    shape = dict(TINY_SHAPE if args.tiny else FULL_SHAPE)
    if args.layers is not None:
        shape["n_layers"] = args.layers
    if getattr(args, "vocab", None) is not None:
        shape["vocab_size"] = args.vocab
    for name, value in (TINY_SIZES if args.tiny else FULL_SIZES).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.gen_length % args.block:
        raise SystemExit(
            f"--gen-length {args.gen_length} must be a multiple of --block {args.block} ({why})"
        )
    return shape


def random_prompts(args: argparse.Namespace, mask_id: int, device: torch.device) -> torch.Tensor:
    """`max(--rows)` random prompts of `--prompt-length` ids below the mask id and 126,000
    (LLaDA's special tokens start above it)."""
    generator = torch.Generator().manual_seed(args.seed)
    shape = (max(args.rows), args.prompt_length)
    return torch.randint(0, min(mask_id, 126_000), shape, generator=generator).to(device)


def build(args: argparse.Namespace) -> tuple[Bench, Results]:
    """The run's models, prompts and the record of what was built."""
    shape = resolve_sizes(args)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}.get(args.dtype)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    generate, modeling, record = load_fastdllm(args.fastdllm)
    config = llada_config(shape)
    ours = our_model(config, args.logit_std, str(device), dtype)
    ours.cached_steps = args.cached_steps
    theirs = their_model(modeling, config, ours)
    prompts = random_prompts(args, config["mask_token_id"], device)
    bench = Bench(args, generate, ours, theirs, prompts)
    meta = {
        "device": device.type,
        "dtype": str(dtype).removeprefix("torch."),
        "shape": shape,
        "sizes": {k: getattr(args, k) for k in FULL_SIZES},
        "fastdllm": record,
    }
    return bench, meta


def run(args: argparse.Namespace, argv: list[str]) -> Results:
    """Measure every cell, writing `--json` after each; the results."""
    torch.set_num_threads(args.threads)
    bench, meta = build(args)
    command = command_line("fastdllm", argv, launcher_for(bench.device.type))
    results: Results = {
        **run_facts(command, bench.device.type),
        **meta,
        "date": utc_now(),
        "args": args_record(args),
        "cells": [],
    }
    bench.warm_up()
    results["logits"] = logit_agreement(bench.ours, bench.theirs, bench.prompts[0], args)
    print(logit_lines(results)[-1], flush=True)
    started = time.perf_counter()
    for cache, schedule, rows in cell_order(args):
        if args.deadline_s is not None and time.perf_counter() - started > args.deadline_s:
            results.setdefault("not_run", []).append([cache, schedule, rows])
        else:
            results["cells"].append(measure_cell(bench, cache, schedule, rows))
            print(cell_line(results["cells"][-1]), flush=True)
        # how our steps' passes ran (auto resolved: graphs on CUDA, also for `none`; a capture
        # that failed under auto leaves ours on static), recorded with every cell
        results["our_cached_steps"] = resolve_cached_steps(
            bench.ours.cached_steps, bench.ours, bench.device
        )
        save_json(args.json, results, indent=1)
    return results


def cell_order(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """The cells, cheapest first (fewer rows, the threshold, the dual cache), so that a run
    stopped by `--deadline-s` or killed has measured the most cells."""
    return [
        (cache, schedule, rows)
        for rows in sorted(args.rows)
        for schedule in SCHEDULES
        if schedule in args.schedules
        for cache in reversed(CACHES)
        if cache in args.caches
    ]


# ----------------------------------------------------------------- report


def cell_line(cell: Results) -> str:
    """One cell as a line of text (printed as the run goes)."""
    same = "same tokens" if cell["identical"] else f"DIFFER {cell['first_difference']}"
    return (
        f"{cell['cache']:>6} {cell['schedule']:>9} {cell['rows']:>2} rows: "
        f"ours {cell['ours']['median_s']:.3f} s, theirs {cell['theirs']['median_s']:.3f} s, "
        f"ours/theirs {cell['ratio']:.2f}; {same}"
    )


def _seconds(side: Results, rows: int | None = None) -> str:
    """Median (range, repeats); `rows`: the cell's, where the side ran fewer (scaled)."""
    spread = f"{side['min_s']:.3f}-{side['max_s']:.3f}, {len(side['seconds'])}x"
    ran = side.get("rows_run", rows)
    scaled = f", est.: {ran} of {rows} rows run, x {rows}/{ran}" if rows and ran < rows else ""
    return f"{side['median_s']:.3f} ({spread}{scaled})"


def _compared_rows(cell: Results) -> int:
    """The rows whose tokens were compared: those theirs ran (all, unless `--their-rows`)."""
    return cell["theirs"].get("rows_run", cell["rows"])


def _same(cell: Results) -> str:
    if cell["identical"]:
        compared = _compared_rows(cell)
        return "yes" if compared == cell["rows"] else f"yes (the first {compared} rows)"
    diff = cell["first_difference"]
    return f"no: row {diff['row']}, position {diff['position']} ({diff['rows_differing']} rows)"


def nfe_means(cell: Results) -> tuple[float, float]:
    """Theirs' and our mean NFE over the rows both ran (`_compared_rows`)."""
    compared = _compared_rows(cell)
    theirs, ours = cell["theirs"]["nfe"][:compared], cell["ours"]["nfe"][:compared]
    return statistics.fmean(theirs), statistics.fmean(ours)


def cell_row(cell: Results) -> str:
    """One cell as a row of the section's table."""
    theirs, ours = nfe_means(cell)
    compared = _compared_rows(cell)
    first = f" (first {compared} rows)" if compared < cell["rows"] else ""
    repeatable = all(cell["repeatable"].values())
    return (
        f"| {cell['cache']} | {cell['schedule']} | {cell['rows']} "
        f"| {_seconds(cell['theirs'], cell['rows'])} | {_seconds(cell['ours'])} "
        f"| {cell['ratio']:.2f} "
        f"| {theirs:.1f}{first} | {ours:.1f}{first} | {_same(cell)}"
        f"{'' if repeatable else ' (a side changed its answers between repeats)'} |"
    )


def verdicts(cells: list[Results], not_run: list[list[Any]]) -> list[str]:
    """Per cache mode: the worst ratio over its cells and whether issue #43's bar is met
    (ours at most 0.5x theirs in every cell, and the same tokens); no verdict for a cache
    with cells left unmeasured (`--deadline-s`)."""
    lines = []
    for cache in CACHES:
        mine = [c for c in cells if c["cache"] == cache]
        missing = [cell for cell in not_run if cell[0] == cache]
        if not mine:
            continue
        worst = max(c["ratio"] for c in mine)
        met = worst <= 0.5 and all(c["identical"] for c in mine)
        verdict = f"**{'yes' if met else 'no'}**"
        if missing and met:
            verdict = f"no verdict, {len(missing)} cells not run"
        scaled = sum(_compared_rows(c) < c["rows"] for c in mine)
        estimated = (
            f" ({scaled} with Fast-dLLM's time scaled from, and the tokens compared on, its "
            "first rows)"
            if scaled
            else ""
        )
        lines.append(
            f"- `{cache}`: ours/theirs {min(c['ratio'] for c in mine):.2f} to {worst:.2f} over "
            f"{len(mine)} cells{estimated}; same tokens in {sum(c['identical'] for c in mine)} "
            f"of {len(mine)}; at most 0.5x with the same tokens everywhere: {verdict}"
        )
    return lines


def our_mode(results: Results) -> str:
    """How our passes ran (runs before it was recorded: unknown, said so)."""
    mode = results.get("our_cached_steps")
    if mode is None:
        return "; ours under `cached_steps` not recorded (before 2026-11-28's full-pass graphs)"
    return f"; ours under `cached_steps={mode}`"


def header(results: Results) -> list[str]:
    """The section's title and what the numbers were measured on."""
    facts, shape, sizes = results["facts"], results["shape"], results["sizes"]
    cpu = results["device"] == "cpu"
    title = "## Fast-dLLM's own `generate` and ours, side by side"
    title += f" ({facts['gpu']}, {results['dtype']})" if "gpu" in facts else ""
    if cpu:
        title += " (a tiny CPU smoke run: its times are no speed measurement)"
    machine = facts.get("gpu", "no GPU") + f"; {facts['cpu']}; torch {facts['torch']}"
    record = results["fastdllm"]
    return [
        title,
        "",
        f"Written by `python -m bench fastdllm --report-only` from the run of {results['date']}:",
        f"`{results['command']}`"
        + "".join(f"; and of {r['date']}: `{r['command']}`" for r in results.get("also", []))
        + f". Machine: {machine}.",
        f"Fast-dLLM {record['source']} at commit `{record['commit'][:12]}`, files unmodified. "
        f"Random-weight LLaDA, d_model {shape['d_model']}, {shape['n_layers']} layers, "
        f"{shape['n_heads']} heads, MLP {shape['mlp_hidden_size']}, "
        f"vocabulary {shape['vocab_size']:,}, "
        f"{results['dtype']}; prompt {sizes['prompt_length']} + answer {sizes['gen_length']}, "
        f"block {sizes['block']}, temperature 0, logit spread {results['args']['logit_std']}"
        + our_mode(results)
        + ".",
        "Seconds per whole `generate` call, median (min-max, repeats); theirs runs one row "
        "per call (16 rows: 16 calls in turn), ours all rows in one call. NFE: forward passes "
        "per row, the mean over the rows."
        + (
            " *est.: K of R rows run*: Fast-dLLM ran the first K of the cell's prompts "
            "(`--their-rows K`), its time scaled by R / K (an estimate: its other rows are "
            "taken to cost what the first K did, which holds for the fixed schedule's steps, "
            "not for the threshold's), its tokens and both sides' NFE compared on those K."
            if any(_compared_rows(c) < c["rows"] for c in results["cells"])
            else ""
        ),
        "",
    ]


def report_lines(results: Results, section: str = SECTION) -> list[str]:
    """The section of BENCHMARKS.md for one run (or merged runs), between the markers
    `section`."""
    table = [
        "| cache | schedule | rows | Fast-dLLM s | ours s | ours/theirs | NFE theirs "
        "| NFE ours | same tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    table += [cell_row(cell) for cell in results["cells"]]
    not_run, stopped = results.get("not_run", []), results.get("stopped", [])
    table += [f"| {c} | {s} | {r} | not run (--deadline-s) ||||||" for c, s, r in not_run]
    table += [f"| {c} | {s} | {r} | not run (the run ended first) ||||||" for c, s, r in stopped]
    start, end = markers(section)
    cells = results["cells"]
    return [
        start,
        *header(results),
        *table,
        "",
        *verdicts(cells, not_run + stopped),
        *notes(results),
        *logit_lines(results),
        end,
    ]


def notes(results: Results) -> list[str]:
    """What explains a difference the table shows (only where it shows)."""
    cells = results["cells"]
    more = [
        c for c in cells if c["identical"] and c["cache"] != "none" and operator.gt(*nfe_means(c))
    ]
    lines = []
    if more:
        lines += [
            "",
            "NFE theirs above ours in the prefix and dual cells: their loop runs one more pass "
            "in a block whose first (full) pass already committed all of it; that pass commits "
            "nothing, so the tokens are the same. Ours goes on to the next block.",
        ]
    parted = [c for c in cells if not c["identical"] and c["rows"] == 1]
    if parted:
        lines += ["", per_pass_note(parted)]
    return lines


def per_pass_note(cells: list[Results]) -> str:
    """Where the answers part, the two sides ran different passes: their time per pass
    (one-row cells: seconds over NFE) compares the work itself."""
    ratios = []
    for cell in cells:
        theirs_nfe, ours_nfe = nfe_means(cell)
        theirs = cell["theirs"]["median_s"] / theirs_nfe
        ours = cell["ours"]["median_s"] / ours_nfe
        ratios.append(
            f"`{cell['cache']}` {cell['schedule']} {ours * 1e3:.1f} / {theirs * 1e3:.1f} ms "
            f"({ours / theirs:.2f})"
        )
    return (
        "Where the tokens differ the two sides took different paths, and the threshold cells "
        "different numbers of passes, so their times compare different work. Per pass (one "
        "row: seconds over NFE), ours / theirs: " + "; ".join(ratios) + "."
    )


def _run_identity(results: Results) -> Results:
    """What two runs must share for their cells to stand in one table."""
    args = results["args"]
    return {
        "device": results["device"],
        "gpu": results["facts"].get("gpu"),
        "dtype": results["dtype"],
        "shape": results["shape"],
        "sizes": results["sizes"],
        "Fast-dLLM commit": results["fastdllm"]["commit"],
        "logit_std": args["logit_std"],
        "threshold": args["threshold"],
        "seed": args["seed"],
        "our cached_steps": results.get("our_cached_steps"),
    }


def merged(results: Results, others: dict[str, Results]) -> Results:
    """`results` with the cells of `others` (by file name) added; refuses a run of another
    model, machine kind or setting, and a cell measured twice."""
    out = {**results, "cells": list(results["cells"]), "also": []}
    seen = {(c["cache"], c["schedule"], c["rows"]) for c in out["cells"]}
    mine = _run_identity(results)
    for name, other in others.items():
        theirs = _run_identity(other)
        for key in mine:
            if mine[key] != theirs[key]:
                raise SystemExit(
                    f"--merge {name}: its {key} is {theirs[key]!r}, --json's is {mine[key]!r}: "
                    "merge only runs of the same model, lengths and machine kind"
                )
        for cell in other["cells"]:
            key = (cell["cache"], cell["schedule"], cell["rows"])
            if key in seen:
                raise SystemExit(f"--merge {name}: cell {key} was measured in another file too")
            seen.add(key)
            out["cells"].append(cell)
        out["not_run"] = out.get("not_run", []) + other.get("not_run", [])
        out["also"].append({"command": other["command"], "date": other["date"]})
    out["not_run"] = _unique([c for c in out.get("not_run", []) if tuple(c) not in seen])
    listed = seen | {tuple(c) for c in out["not_run"]}
    stopped = [c for run in (results, *others.values()) for c in stopped_cells(run)]
    out["stopped"] = _unique([c for c in stopped if tuple(c) not in listed])
    return out


def _unique(cells: list[list[Any]]) -> list[list[Any]]:
    """`cells` with each (cache, schedule, rows) once, in their first order."""
    return [list(cell) for cell in dict.fromkeys(tuple(c) for c in cells)]


def stopped_cells(run: Results) -> list[list[Any]]:
    """The cells a run's flags asked for that it neither measured nor listed as not run
    (`--deadline-s`): those left when it ended, killed at a part's time limit or failed."""
    done = {(c["cache"], c["schedule"], c["rows"]) for c in run["cells"]}
    done |= {tuple(c) for c in run.get("not_run", [])}
    asked = cell_order(argparse.Namespace(**run["args"]))
    return [list(cell) for cell in asked if cell not in done]


def write_report(results: Results, out: Path, section: str = SECTION) -> None:
    """Write the run's section into `out` between the markers `section`."""
    write_section(out, report_lines(results, section), *markers(section))


# ----------------------------------------------------------------- flags


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The flags: what to export, or the cells to run, or the runs to report."""
    p = argparse.ArgumentParser(
        prog="python -m bench fastdllm", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--export",
        nargs="?",
        const="",
        metavar="DIR",
        help="copy Fast-dLLM's llada/ files into DIR (default: --fastdllm's) and stop",
    )
    p.add_argument("--mirror", type=Path, default=DEFAULT_MIRROR, help="git mirror of Fast-dLLM")
    p.add_argument("--commit", default="HEAD", help="the mirror's commit to export")
    p.add_argument(
        "--fastdllm", type=Path, default=DEFAULT_DIR, help=f"the exported files ({DEFAULT_DIR})"
    )
    add_cell_flags(p)
    add_threads_flag(p)
    add_output_flags(p, json_default=RESULTS / "fastdllm_bench.json")
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=[],
        help="with --report-only: other runs' JSON whose cells join --json's",
    )
    add_section_flag(p, SECTION)
    args = p.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.cached_steps in CAPTURED and not is_cuda(device):
        p.error(f"--cached-steps {args.cached_steps} needs a CUDA device, got {device}")
    return args


def add_cell_flags(p: argparse.ArgumentParser) -> None:
    """The model's and the cells' sizes, and how long to measure."""
    p.add_argument("--tiny", action="store_true", help="a tiny LLaDA and lengths, for the CPU")
    p.add_argument("--layers", type=int, help="layers (default: LLaDA-8B's 32, --tiny 2)")
    p.add_argument("--vocab", type=int, help=f"default LLaDA's {LLADA_VOCAB} (--tiny 512)")
    p.add_argument("--prompt-length", type=int, help="default 256 (--tiny 32)")
    p.add_argument("--gen-length", type=int, help="answer length, default 256 (--tiny 32)")
    p.add_argument("--block", type=int, help="block length, default 32 (--tiny 8)")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    p.add_argument(
        "--their-rows",
        type=int,
        help="Fast-dLLM runs only the first K prompts of a cell (one call each), its time "
        "scaled by rows / K, an estimate (default: all; for the 16-row cells in a short GPU "
        "session)",
    )
    p.add_argument("--caches", nargs="+", choices=CACHES, default=list(CACHES))
    p.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES))
    p.add_argument("--threshold", type=float, default=0.9)
    p.add_argument("--logit-std", type=float, default=16.0, help="spread of the random logits")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--repeat-budget-s",
        type=float,
        help="repeat a cell only while it has taken less than this (default: always)",
    )
    p.add_argument(
        "--deadline-s",
        type=float,
        help="start no cell after this many seconds of measuring (the JSON lists the rest)",
    )
    add_model_flags(p)


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """Where and how the two models run, and the prompts' seed."""
    p.add_argument(
        "--dtype", choices=("bfloat16", "float32"), help="bfloat16 on a GPU, else float32"
    )
    p.add_argument("--seed", type=int, default=2, help="the prompts' seed")
    p.add_argument("--device", help="cuda when there is one, else cpu")
    p.add_argument(
        "--cached-steps",
        choices=CACHED_STEPS,
        default="auto",
        help="how our steps' passes run (the model arg; default auto: graphs on CUDA)",
    )


def main(argv: list[str] | None = None) -> int:
    """Export Fast-dLLM's files, run the cells, or write the section from runs' JSON."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        if args.export is not None:
            dest = Path(args.export) if args.export else args.fastdllm
            record = export(args.mirror, args.commit, dest)
            print(f"exported Fast-dLLM {record['commit'][:12]} into {dest}")
        elif args.report_only:
            others = {str(path): load_json(path) for path in args.merge}
            write_report(merged(load_json(args.json), others), args.out, args.section)
            print(f"wrote the {args.section} section of {args.out}")
        else:
            run(args, argv)
    except ExportError as error:
        raise SystemExit(f"python -m bench fastdllm: {error}") from None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
