"""Each family's own code and ours on the official-tiny checkpoints: are the logits the same
bits, in float32 and bfloat16 (docs/MODELS.md, "Numerics, as each family's own code computes
them")? And do LLaDA's own `generate` (its repository's generate.py; on LLaDA-MoE's model
too), Dream's own `diffusion_generate` and LLaDA2.0's and LLaDA2.1's own `generate` give our
decoders' tokens and forward passes (docs/STRATEGIES.md, docs/MODELS.md)?

    # once: the transformers the upstream files were written for (they do not import under
    # transformers 5), in a folder of its own; torch is this environment's
    pip install --target /tmp/upstream-transformers transformers==4.57.6
    # git mirrors of the public repositories that vendor the hub's files, one folder each as
    # OWNER+NAME/repo (what the `fetch` tool makes), then:
    python tools/upstream_check.py --mirrors /work/.mirror \\
        --upstream-path /tmp/upstream-transformers

Exit 0 when every logits case is equal bit for bit and every decode agrees, 1 when one does
not (printed: the largest difference, the case), 2 on bad input. Nothing of the upstream code
is committed: its files are read out of the mirrors at the commits in `UPSTREAM` into a
temporary folder, unmodified, and run in a child process whose `sys.path` puts
`--upstream-path` first; this process runs ours.

The cases, each on the fixture's `input_ids` (2 rows of 12; tests/fixtures/official-tiny):
- `plain`: no mask, every family.
- `padded` (LLaDA, Dream): the fixture's 2-D `attention_mask` (row 1 left-padded by 3) given
  to both. LLaDA-MoE has no padded case: its code ignores every mask (the fixture README).
- `padded_4d`, `block` (LLaDA2): the fixture's 4-D additive masks given to upstream, cast to
  the model's dtype as upstream's `generate` casts its mask; ours gets the 2-D mask, and the
  block lengths (4, 4) with the fixture's positions.

The decodes (float32, one row, temperature 0, 3 prompts each; LLaDA2.0 and 2.1 a fourth whose
answers meet the end token, `END_PROMPTS`), upstream's sampler against our `generate`, tokens
and forward passes:
- Dream: `diffusion_generate` (whole answer, `alg_temp` 0) x `DREAM_ALGS` x `DREAM_SCHEDULES` x
  `DREAM_FILTERS`, against `rule="dream"`;
- LLaDA: generate.py's `generate` (low-confidence remasking) x `LLADA_SCHEDULES` (one block and
  several), against LLaDA's default decoding; the same for LLaDA-MoE, generate.py driving
  LLaDA-MoE's own model (its modeling file has no sampler; dllm runs it in its LLaDA
  pipeline): LLaDA's reference sampler, not one of LLaDA-MoE's;
- LLaDA2.0: its model's `generate` x `LLADA2_SETTINGS` x `LLADA2_SHAPES`, against our block
  diffusion with `cache=none` and `cache=block` (its default), our answer cut after its first
  end token as upstream's is.
- LLaDA2.1: the `generate` of dllm's edited copy of its file (`DLLM_21`, PR #107: `.log()` on
  the block mask, which the hub file adds to the scores as 0/1, so it is block-causal as ours
  runs, MODELS.md "Block diffusion"; also a cleaner temperature-0 branch, an eos_early_stop
  return fix, renames; not compared with the hub file), run with `eos_early_stop=True` (ours
  stops after the block that holds the end token; upstream's default, False, is not
  compared), x `LLADA21_SETTINGS` x `LLADA2_SHAPES`, on the LLaDA2 fixture, against our joint
  threshold decoding with both caches; its logits are compared too.
Left out: Dream's `alg=origin`, any temperature or `alg_temp` above 0 and LLaDA's `random`
remasking (there upstream draws from torch's global generator, ours from the row's; the
distributions are tested in tests/), LLaDA's `cfg_scale` (not ours), the hub's LLaDA2.1 file
itself (its mask is not block-causal), several rows.

What is done from outside, no file changed:
- The mask token's logit is set to -inf in upstream's runs, as ours does first (STRATEGIES.md:
  on these fixtures the mask token can win an argmax), by wrapping the model's `forward` on the
  instance (`suppressed_and_counted`), which also counts the forward passes.
- Ties: ours commits the leftmost of tied positions (STRATEGIES.md), where upstream leaves
  them to `torch.topk`. So each case runs twice upstream, as it is and with the sampler
  module's `torch` replaced by a `SamplerTorch` whose `topk` returns ties leftmost first. Ours
  must give the first run's tokens and passes (`same`) or the second's (`same, ties leftmost`:
  the runs differ only where a tie decided a commit); anything else fails.
- LLaDA2.0 at temperature 0: upstream still draws with `torch.multinomial`, where ours takes
  the argmax (a deviation MODELS.md lists), so its module's `torch` has `multinomial` as the
  argmax in both runs (`"argmax_draws"`). LLaDA2.0 and 2.1: the block mask (0 and -inf, exact
  in any dtype), which they cast to bfloat16, is cast to float32, which the float32 model's
  attention accepts (`"float32_masks"`). Their module is also their model's, so the router's
  `topk` is the leftmost one in the second run too: the same values, other indices only among
  exactly tied expert scores.
- LLaDA's `LLaDAModelLM.__init__` builds its network on "cuda" whatever the config says, so the
  LLaDA network is built on the CPU through its own classes (`LLaDAModel` with
  `init_device="cpu"`, handed to `LLaDAModelLM`) and given the checkpoint's tensors with a
  strict `load_state_dict`; the others use `from_pretrained`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "official-tiny"
DLLM = "85cb53a05343601c9dfbb4f79243cd426cfa5a4c"  # ZHZisZZ/dllm: the first LLaDA2 copy
INFINILM_CONFIG = "239f1d707f54c1e95ad2ec282842a3ed87038f05"
INFINILM_MODELING = "0a7e522afb6079a30c7ecb50ce8abafe6cc3f808"
LLADA_GENERATE = "65cbed294263040cb6946c32a91e16cbdad209d2"  # ML-GSAI/LLaDA, 2025-10-23
# dllm PR #107: its LLaDA2.1 copy with `.log()` on the block mask (LLADA2_DECODING.md, G21)
DLLM_21 = "62ebe4f3df3792d978204a724f0b1c2188c1d7fe"
DTYPES = ("float32", "bfloat16")
DREAM_ALGS = ("maskgit_plus", "topk_margin", "entropy")
DREAM_SCHEDULES = ((4, 4), (7, 3), (12, 5), (12, 12), (6, 9), (5, 1), (16, 8))  # (length, steps)
DREAM_FILTERS = ((None, None), (0.95, None), (None, 3))  # (top_p, top_k)
# (length, block, steps): one block or several, steps = length or fewer, with and without a
# remainder (the first steps commit one more)
LLADA_SCHEDULES = (
    (8, 8, 8),
    (10, 10, 4),
    (12, 4, 6),
    (14, 7, 6),
    (12, 12, 3),
    (16, 4, 16),
    (9, 9, 2),
)
# LLaDA2.0: (threshold, steps; None = generate()'s 32, capped at the answer length), and
# (answer length, block)
LLADA2_SETTINGS = ((0.95, None), (0.3, None), (0.95, 3), (1.0, None), (1.0, 3))
LLADA2_SHAPES = ((5, 4), (8, 4), (12, 8), (16, 4))
# LLaDA2.1: (threshold, editing_threshold, max_post_steps): the card's Quality and Speed modes,
# Speed with 2 post steps, the file's defaults
LLADA21_SETTINGS = ((0.7, 0.5, 16), (0.5, 0.0, 16), (0.5, 0.0, 2), (0.95, 0.9, 16))
BLOCK_FAMILIES = ("llada2", "llada21")  # block diffusion: answers cut after the first end token
# a prompt whose answers hold the end token (the stop after its block and the cut compared)
END_PROMPTS = {"llada2": 32, "llada21": 41}
DECODE_PROMPTS = 3
EPS = 1e-3  # Dream's generation config's
VERDICTS = ("same", "same, ties leftmost", "differs")
# a summary line per these and, for LLaDA2, its steps (group_of)
GROUPED_BY = (
    "family", "alg", "top_p", "top_k", "threshold", "editing_threshold", "max_post_steps", "cache",
)  # fmt: skip


@dataclass(frozen=True)
class Upstream:
    """Where one family's upstream files are, and which logits cases are compared."""

    family: str  # the package its files go into; its fixture folder unless `fixture` says
    files: tuple[tuple[str, str, str], ...]  # (owner/name on GitHub, path in it, commit)
    model_class: str  # in the package's modeling module
    cases: tuple[str, ...]
    fixture: str | None = None

    @property
    def folder(self) -> str:
        """Its folder under the fixtures."""
        return self.fixture or self.family

    @property
    def modeling(self) -> str:
        return next(Path(p).stem for _, p, _ in self.files if Path(p).stem.startswith("modeling"))


def _dllm(folder: str, *names: str, commit: str = DLLM) -> tuple[tuple[str, str, str], ...]:
    """The files `names` of dllm's vendored copies in `folder`, at `commit`."""
    return tuple(
        ("ZHZisZZ/dllm", f"dllm/pipelines/{folder}/models/{name}", commit) for name in names
    )


# the sources named in tests/fixtures/official-tiny/README.md (LLaDA's and Dream's hub files
# from the same dllm commit), LLaDA's own sampler (generate.py of its repository), and
# dllm's edited copy of LLaDA2.1's file (its block mask block-causal, as ours runs)
UPSTREAM = (
    Upstream(
        "llada",
        (
            *_dllm("llada", "configuration_llada.py", "modeling_llada.py"),
            ("ML-GSAI/LLaDA", "generate.py", LLADA_GENERATE),
        ),
        "LLaDAModelLM",
        ("plain", "padded"),
    ),
    Upstream(
        "dream",
        _dllm("dream", "configuration_dream.py", "modeling_dream.py", "generation_utils.py"),
        "DreamModel",
        ("plain", "padded"),
    ),
    Upstream(
        "llada_moe",
        (
            ("InfiniTensor/InfiniLM", "configuration_lladamoe.py", INFINILM_CONFIG),
            ("InfiniTensor/InfiniLM", "modeling_lladamoe.py", INFINILM_MODELING),
        ),
        "LLaDAMoEModelLM",
        ("plain",),
    ),
    Upstream(
        "llada2",
        _dllm("llada", "configuration_llada2_moe.py", "modeling_llada2_moe.py"),
        "LLaDA2MoeModelLM",
        ("plain", "padded_4d", "block"),
    ),
    Upstream(  # LLaDA2.1's file (its generate differs), on the same fixture
        "llada21",
        _dllm("llada21", "configuration_llada21_moe.py", "modeling_llada21_moe.py", commit=DLLM_21),
        "LLaDA2MoeModelLM",
        ("plain", "padded_4d", "block"),
        fixture="llada2",
    ),
)


# ------------------------------------------------------------------ the upstream side


def _git(mirror: Path, *args: str) -> bytes:
    """`git ARGS` in `mirror`, its output; a refusal that says what to do if it fails."""
    done = subprocess.run(["git", "-C", str(mirror), *args], capture_output=True, timeout=60)
    if done.returncode:
        raise SystemExit(
            f"git {' '.join(args)} failed in {mirror}: {done.stderr.decode().strip()}; "
            "--mirrors must hold a git mirror of each repository as OWNER+NAME/repo, with the "
            "commit in it (fetch the repository again if the commit is missing)"
        )
    return done.stdout


def export(mirrors: Path, dest: Path) -> dict[str, list[dict[str, str]]]:
    """Each family's files, as at their commits, into the package `dest/<family>/`; returns
    what was read (repository, commit, path, git blob id) for the record."""
    record: dict[str, list[dict[str, str]]] = {}
    for up in UPSTREAM:
        package = dest / up.family
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        record[up.family] = []
        for repo, path, commit in up.files:
            mirror = mirrors / repo.replace("/", "+") / "repo"
            if not mirror.exists():
                raise SystemExit(
                    f"--mirrors {mirrors}: no mirror of {repo} at {mirror}; fetch "
                    f"github:{repo} (the fetch tool puts it there) or give the right folder"
                )
            blob = _git(mirror, "rev-parse", f"{commit}:{path}").decode().strip()
            (package / Path(path).name).write_bytes(_git(mirror, "cat-file", "blob", blob))
            record[up.family].append({"repo": repo, "commit": commit, "path": path, "blob": blob})
    return record


def upstream_model(up: Upstream, folder: Path, dtype: object) -> object:
    """The family's own model on the fixture in `folder` (run in the child process)."""
    import importlib

    from safetensors.torch import load_file

    modeling = importlib.import_module(f"{up.family}.{up.modeling}")
    if up.family != "llada":
        return modeling.__dict__[up.model_class].from_pretrained(folder, dtype=dtype).eval()
    configuration = importlib.import_module(f"{up.family}.configuration_llada")
    config = configuration.LLaDAConfig.from_pretrained(folder)
    network = modeling.create_model_config_from_pretrained_config(config)
    network.init_device = "cpu"  # its LLaDAModelLM would build on "cuda"
    model = modeling.LLaDAModelLM(config, model=modeling.LLaDAModel(network))
    model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=True)
    return model.to(dtype).eval()


def upstream_case(model: object, expected: dict, case: str, dtype: object) -> object:
    """`model`'s logits in `case` (the module docstring lists them)."""
    ids = expected["input_ids"]
    if case == "plain":
        return model(ids).logits
    if case == "padded":
        return model(ids, attention_mask=expected["attention_mask"]).logits
    mask = expected["attention_mask_4d_pad" if case == "padded_4d" else "block_attention_mask"]
    positions = expected["position_ids"].expand(ids.shape[0], -1)
    return model(ids, attention_mask=mask.to(dtype), position_ids=positions).logits


def _case(family: str, alg: str, length: int, block: int, steps: int | None, prompt: int,
          **settings: object) -> dict[str, object]:  # fmt: skip
    """One decode case; settings a family does not read stay None."""
    unset = dict.fromkeys(GROUPED_BY[2:])  # the settings, as the summary groups them
    return {"family": family, "alg": alg, "length": length, "block": block, "steps": steps,
            **unset, **settings, "prompt": prompt}  # fmt: skip


def _block_cases(family: str, alg: str, settings: list[dict]) -> list[dict[str, object]]:
    """LLaDA2's cases: each of `settings` (`steps` and the block settings) x `LLADA2_SHAPES` x
    both caches x the prompts and the family's end prompt."""
    cases = []
    for setting in settings:
        block = {key: value for key, value in setting.items() if key != "steps"}
        cases += [
            _case(family, alg, length, width, setting.get("steps"), i, **block, cache=cache)
            for length, width in LLADA2_SHAPES
            for cache in ("none", "block")
            for i in (*range(DECODE_PROMPTS), END_PROMPTS[family])
        ]
    return cases


def decode_cases() -> list[dict[str, object]]:
    """Every decode compared: Dream's, LLaDA's (and LLaDA-MoE's), LLaDA2.0's, LLaDA2.1's (the
    module docstring)."""
    prompts = range(DECODE_PROMPTS)
    dream = [
        _case("dream", alg, length, length, steps, i, top_p=p, top_k=k)
        for alg in DREAM_ALGS
        for length, steps in DREAM_SCHEDULES
        for p, k in DREAM_FILTERS
        for i in prompts
    ]
    llada = [
        _case(family, "low_confidence", length, block, steps, i)
        for family in ("llada", "llada_moe")
        for length, block, steps in LLADA_SCHEDULES
        for i in prompts
    ]
    llada2 = [{"threshold": t, "steps": steps} for t, steps in LLADA2_SETTINGS]
    llada21 = [
        {"threshold": t, "editing_threshold": edit, "max_post_steps": post}
        for t, edit, post in LLADA21_SETTINGS
    ]
    return [
        *dream, *llada, *_block_cases("llada2", "threshold", llada2),
        *_block_cases("llada21", "joint", llada21),
    ]  # fmt: skip


def decode_prompt(index: int) -> object:
    """Prompt `index`: ordinary tokens (below the fixtures' special ids, 240 and up)."""
    import torch

    return torch.randint(0, 240, (5 + index,), generator=torch.Generator().manual_seed(index))


def mask_id(folder: Path) -> int:
    """The fixture's mask token id, read from its config.json."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    return int(config["mask_token_id"])


class SamplerTorch:
    """`torch` as an upstream sampler module sees it, with at most these changes:
    `leftmost`: `topk` over the last dimension returns tied values leftmost first (ours'
    documented order; each case's second upstream run); in `changes`, `"argmax_draws"`
    (LLaDA2.0): `multinomial` is the argmax; `"float32_masks"` (LLaDA2.0 and 2.1): `bfloat16`
    is float32 (the module docstring)."""

    def __init__(self, torch: object, leftmost: bool = False, changes: tuple[str, ...] = ()):
        self._torch, self._leftmost = torch, leftmost
        if "argmax_draws" in changes:
            self.multinomial = lambda probs, num_samples=1: probs.argmax(-1, keepdim=True)
        if "float32_masks" in changes:
            self.bfloat16 = torch.float32

    def __getattr__(self, name: str) -> object:
        return getattr(self._torch, name)

    def topk(
        self, values: object, k: object, dim: int = -1, largest: bool = True, sorted: bool = True
    ) -> tuple[object, object]:
        """`torch.topk`; `k` an int or a 0-d tensor (LLaDA's call)."""
        if not self._leftmost or not largest or dim not in (-1, values.dim() - 1):
            return self._torch.topk(values, k, dim=dim, largest=largest, sorted=sorted)
        ranked = self._torch.sort(values, dim=-1, descending=True, stable=True).indices
        order = ranked[..., :k].contiguous()
        return values.gather(-1, order), order


@contextlib.contextmanager
def sampler_torch(module: object, leftmost: bool, changes: tuple[str, ...]) -> Iterator[None]:
    """`module` (an upstream sampler's) with a `SamplerTorch` as its `torch` for a while."""
    import torch

    changed = leftmost or changes  # else upstream's own run: its module's torch untouched
    module.torch = SamplerTorch(torch, leftmost, changes) if changed else torch
    try:
        yield
    finally:
        module.torch = torch


def suppressed_and_counted(model: object, mask: int) -> list[int]:
    """`model.forward` wrapped on the instance (no file changed): the mask token's logit set
    to -inf in every output, as ours does first, and each call counted in the one-item list
    returned. Dream's and LLaDA's samplers call the model, LLaDA2's its `forward`: all reach
    the wrapper."""
    forward, passes = model.forward, [0]

    def wrapped(*args: object, **kwargs: object) -> object:
        out = forward(*args, **kwargs)
        out.logits[..., mask] = float("-inf")
        passes[0] += 1
        return out

    model.forward = wrapped
    return passes


def dream_run(model: object, generation: object, case: dict, mask: int) -> list[int]:
    """Dream's own `diffusion_generate` on a case."""
    prompt = decode_prompt(case["prompt"])
    config = generation.DreamGenerationConfig(
        mask_token_id=mask, max_new_tokens=case["length"], steps=case["steps"],
        temperature=0.0, alg=case["alg"], alg_temp=0.0, top_p=case["top_p"],
        top_k=case["top_k"], eps=EPS, return_dict=True,
    )  # fmt: skip
    out = model.diffusion_generate(prompt[None], generation_config=config)
    return out.sequences[0, len(prompt) :].tolist()


def llada_run(model: object, sampler: object, case: dict, mask: int) -> list[int]:
    """LLaDA's own `generate` (its repository's generate.py) on a case."""
    prompt = decode_prompt(case["prompt"])
    x = sampler.generate(
        model, prompt[None], steps=case["steps"], gen_length=case["length"],
        block_length=case["block"], temperature=0.0, mask_id=mask,
    )  # fmt: skip
    return x[0, len(prompt) :].tolist()


def llada2_run(model: object, sampler: object, case: dict, mask: int) -> list[int]:
    """LLaDA2's own `generate` (a method of its model) on a case: the answer up to and
    including its first end token."""
    prompt = decode_prompt(case["prompt"])
    steps = 32 if case["steps"] is None else case["steps"]  # generate()'s default, as ours
    answer = model.generate(
        prompt[None], temperature=0.0, block_length=case["block"], steps=steps,
        gen_length=case["length"], threshold=case["threshold"],
        eos_id=model.config.eos_token_id, mask_id=mask,
    )  # fmt: skip
    return answer[0].tolist()


def llada21_run(model: object, sampler: object, case: dict, mask: int) -> list[int]:
    """LLaDA2.1's own `generate` on a case, with `eos_early_stop` (ours stops after the block
    that holds the end token; its model card's example runs so): the answer up to and
    including its first end token."""
    prompt = decode_prompt(case["prompt"])
    answer = model.generate(
        prompt[None], temperature=0.0, block_length=case["block"], gen_length=case["length"],
        threshold=case["threshold"], editing_threshold=case["editing_threshold"],
        max_post_steps=case["max_post_steps"], eos_early_stop=True,
        eos_id=model.config.eos_token_id, mask_id=mask,
    )  # fmt: skip
    return answer[0].tolist()


@dataclass(frozen=True)
class Sampler:
    """How a family's own sampler is run."""

    module: str  # the module whose `torch` it reads
    run: Callable[[object, object, dict, int], list[int]]  # (model, module, case, mask)
    changes: tuple[str, ...] = ()  # SamplerTorch's, in both runs


SAMPLERS = {
    "dream": Sampler("dream.generation_utils", dream_run),
    "llada": Sampler("llada.generate", llada_run),
    # LLaDA-MoE's file has no sampler; dllm runs it in its LLaDA pipeline
    # (dllm/pipelines/llada/models/__init__.py), and so do we (LLaDA's fixed schedule)
    "llada_moe": Sampler("llada.generate", llada_run),
    "llada2": Sampler("llada2.modeling_llada2_moe", llada2_run, ("argmax_draws", "float32_masks")),
    "llada21": Sampler("llada21.modeling_llada21_moe", llada21_run, ("float32_masks",)),
}


@dataclass
class LoadedSampler:
    """One family's upstream side in the child process."""

    model: object
    module: object  # the module whose `torch` its sampler reads
    sampler: Sampler
    passes: list[int]  # the forward passes counted since the last reset
    mask: int

    def runs(self, case: dict) -> dict[str, object]:
        """`case` run as it is (`tokens`, `passes`), then with ties leftmost (`..._leftmost`);
        the sampler's `changes` in both."""
        found = {}
        for leftmost, suffix in ((False, ""), (True, "_leftmost")):
            self.passes[0] = 0
            with sampler_torch(self.module, leftmost, self.sampler.changes):
                run = self.sampler.run(self.model, self.module, case, self.mask)
            found["tokens" + suffix], found["passes" + suffix] = run, self.passes[0]
        return found


def upstream_decodes(fixtures: Path) -> list[dict[str, object]]:
    """The child process: each decode case by its family's own sampler (`LoadedSampler.runs`)."""
    import importlib

    import torch

    loaded = {}
    for up in UPSTREAM:
        sampler = SAMPLERS[up.family]
        model = upstream_model(up, fixtures / up.folder, torch.float32)
        mask = mask_id(fixtures / up.folder)
        passes = suppressed_and_counted(model, mask)
        module = importlib.import_module(sampler.module)
        loaded[up.family] = LoadedSampler(model, module, sampler, passes, mask)
    return [{**case, **loaded[case["family"]].runs(case)} for case in decode_cases()]


def run_upstream(fixtures: Path, out: Path) -> None:
    """The child process: every family's logits cases in every dtype into
    `out/logits.safetensors`, every decode case into `out/decodes.json`, and the versions it
    ran under into `out/versions.json`."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    versions = {"transformers": transformers.__version__, "torch": torch.__version__}
    (out / "versions.json").write_text(json.dumps(versions), encoding="utf-8")
    logits = {}
    for up in UPSTREAM:
        expected = load_file(str(fixtures / up.folder / "expected.safetensors"))
        for name in DTYPES:
            dtype = getattr(torch, name)
            model = upstream_model(up, fixtures / up.folder, dtype)
            with torch.no_grad():
                for case in up.cases:
                    found = upstream_case(model, expected, case, dtype)
                    logits[f"{up.family}/{name}/{case}"] = found.contiguous()
    save_file(logits, str(out / "logits.safetensors"))
    decodes = upstream_decodes(fixtures)
    (out / "decodes.json").write_text(json.dumps(decodes), encoding="utf-8")


# ------------------------------------------------------------------ our side, and the verdict


def our_case(model: object, expected: dict, case: str) -> object:
    """Our model's logits in `case`, given what the same case gives upstream."""
    import torch

    ids = expected["input_ids"]
    if case == "plain":
        return model(ids)
    if case == "padded":
        return model(ids, attention_mask=expected["attention_mask"])
    if case == "padded_4d":
        return model(ids, expected["attention_mask"])
    positions = expected["position_ids"].expand(ids.shape[0], -1)
    return model(ids, position_ids=positions, block_lengths=torch.tensor([4] * ids.shape[0]))


def _row(family: str, dtype: str, case: str, ours: object, theirs: dict) -> dict[str, object]:
    """One logits case's verdict: equal bits (compared as float32, exact from either dtype,
    through an integer view, so that -0.0 and 0.0 differ), with both dtypes recorded."""
    import torch

    other = theirs[f"{family}/{dtype}/{case}"]
    ours32, other32 = ours.float(), other.float()
    return {
        "family": family,
        "dtype": dtype,
        "case": case,
        "dtypes": [str(ours.dtype), str(other.dtype)],
        "bit_for_bit": torch.equal(ours32.view(torch.int32), other32.view(torch.int32)),
        "max_abs": (ours32 - other32).abs().max().item(),
    }


def compare(fixtures: Path, theirs: dict) -> list[dict[str, object]]:
    """One row per (family, dtype, case): ours against `theirs`, and the largest difference."""
    import torch
    from safetensors.torch import load_file

    from lm_eval_dvoting.models.loading import load_model

    rows = []
    for up in UPSTREAM:
        expected = load_file(str(fixtures / up.folder / "expected.safetensors"))
        for name in DTYPES:
            model = load_model(str(fixtures / up.folder), device="cpu", dtype=name)
            with torch.no_grad():
                for case in up.cases:
                    ours = our_case(model, expected, case)
                    rows.append(_row(up.family, name, case, ours, theirs))
    return rows


def our_settings(case: dict) -> dict[str, object]:
    """Our `generate`'s arguments for a decode case."""
    from lm_eval_dvoting.core.decoding.state import BlockDecoding, DreamDecoding

    settings = {"gen_length": case["length"], "block_length": case["block"], "temperature": 0.0}
    if case["family"] in BLOCK_FAMILIES:
        post = 16 if case["max_post_steps"] is None else case["max_post_steps"]  # ours' default
        block = BlockDecoding(case["threshold"], case["steps"], case["editing_threshold"], post)
        return {**settings, "block": block, "cache": case["cache"]}
    settings["steps"] = case["steps"]
    if case["family"] == "dream":
        dream = DreamDecoding(alg=case["alg"], alg_temp=0.0, eps=EPS)
        settings.update(rule="dream", dream=dream, top_p=case["top_p"], top_k=case["top_k"])
    return settings


def our_decodes(fixtures: Path) -> list[tuple[list[int], int]]:
    """Our decoders on every decode case (`decode_cases`' order), float32: `decoder=dream`
    for Dream, LLaDA's default (the fixed schedule, low-confidence remasking) for LLaDA and
    LLaDA-MoE, LLaDA2's block diffusion (its answer cut after the first end token, as
    upstream returns it)."""
    import torch

    from lm_eval_dvoting.core.decoding.rows import generate
    from lm_eval_dvoting.models.loading import load_model

    folders = {up.family: up.folder for up in UPSTREAM}
    models = {
        family: load_model(str(fixtures / folder), device="cpu", dtype="float32")
        for family, folder in folders.items()
    }
    found = []
    for case in decode_cases():
        model, prompt = models[case["family"]], decode_prompt(case["prompt"])[None]
        with torch.no_grad():
            result = generate(model, prompt, **our_settings(case))
        tokens = result.tokens[0].tolist()
        if case["family"] in BLOCK_FAMILIES:
            ends = set(model.end_token_ids)
            tokens = tokens[: next((k + 1 for k, t in enumerate(tokens) if t in ends), None)]
        found.append((tokens, int(result.nfe[0])))
    return found


def decode_verdicts(theirs: list[dict], ours: list[tuple]) -> list[dict[str, object]]:
    """Each decode case with its verdict on (tokens, forward passes): `same` (upstream's own
    run's); `same, ties leftmost` (its run with ties leftmost gives ours, its own run does not:
    a tie decided a commit there); `differs`."""
    rows = []
    for case, (tokens, passes) in zip(theirs, ours, strict=True):
        if (case["tokens"], case["passes"]) == (tokens, passes):
            verdict = "same"
        elif (case["tokens_leftmost"], case["passes_leftmost"]) == (tokens, passes):
            verdict = "same, ties leftmost"
        else:
            verdict = "differs"
        rows.append({**case, "ours": tokens, "our_passes": passes, "verdict": verdict})
    return rows


def group_of(row: dict[str, object]) -> tuple:
    """The line of the summary a decode belongs to: its family, alg and settings; LLaDA2's
    steps too (a setting there; a schedule, varied within a line, for Dream and LLaDA)."""
    steps = (row["steps"] or 32) if row["family"] == "llada2" else None
    return (*(row[key] for key in GROUPED_BY), steps)


def decode_lines(rows: list[dict[str, object]]) -> list[str]:
    """One line per `group_of`: the cases and their verdicts; then each differing case."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault(group_of(row), []).append(row)
    lines = []
    for key, group in groups.items():
        count = {v: sum(r["verdict"] == v for r in group) for v in VERDICTS}
        family, alg, *rest = key
        names = (*GROUPED_BY[2:], "steps")
        named = " ".join(f"{k}={v}" for k, v in zip(names, rest) if v is not None)
        lines.append(
            f"{family:<9} decode {alg:<14} {named:<70}: {len(group)} cases, "
            f"{count['same']} same, {count['same, ties leftmost']} same with ties leftmost, "
            f"{count['differs']} differ"
        )
    return lines + [f"  DIFFERS: {r}" for r in rows if r["verdict"] == "differs"]


def verdict_line(row: dict[str, object]) -> str:
    """A logits case's line of the summary."""
    verdict = "bit for bit" if row["bit_for_bit"] else f"DIFFERS, max_abs {row['max_abs']:.3g}"
    return f"{row['family']:<10} {row['dtype']:<9} {row['case']:<10} {verdict}"


def arguments(argv: list[str] | None) -> argparse.Namespace:
    """The command line; `--upstream-path` must hold a transformers (the child's)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument(
        "--upstream-path",
        type=Path,
        help="a folder holding transformers 4.57.6 (pip install --target FOLDER ...)",
    )
    parser.add_argument("--fixtures", type=Path, default=FIXTURES)
    parser.add_argument("--json", type=Path, help="also write the rows and the record here")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # the upstream side
    args = parser.parse_args(argv)
    if args.child is None:
        found = args.upstream_path and (args.upstream_path / "transformers").is_dir()
        if not found:
            parser.error(
                f"--upstream-path {args.upstream_path}: give a folder with transformers in it "
                "(pip install --target FOLDER transformers==4.57.6): the upstream files do "
                "not import under transformers 5"
            )
    return args


def run_child(args: argparse.Namespace, packages: Path, out: Path) -> None:
    """This file again, as the upstream side, with `--upstream-path` and `packages` first."""
    import os

    path = os.pathsep.join([str(args.upstream_path), str(packages)])
    command = [sys.executable, __file__, "--child", str(out), "--fixtures", str(args.fixtures)]
    done = subprocess.run(command, env={**os.environ, "PYTHONPATH": path}, cwd=packages)
    if done.returncode:
        raise SystemExit(f"the upstream side failed (exit {done.returncode}); see above")


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if args.child is not None:
        run_upstream(args.fixtures, args.child)
        return 0
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as scratch:
        record = export(args.mirrors, Path(scratch) / "packages")
        run_child(args, Path(scratch) / "packages", Path(scratch))
        rows = compare(args.fixtures, load_file(str(Path(scratch) / "logits.safetensors")))
        theirs = json.loads((Path(scratch) / "decodes.json").read_text(encoding="utf-8"))
        versions = json.loads((Path(scratch) / "versions.json").read_text(encoding="utf-8"))
    decodes = decode_verdicts(theirs, our_decodes(args.fixtures))
    header = f"upstream side: transformers {versions['transformers']}, torch {versions['torch']}"
    print("\n".join([header, *map(verdict_line, rows), *decode_lines(decodes)]))
    if args.json:
        found = {"logits": rows, "decodes": decodes, "upstream": record, "versions": versions}
        args.json.write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")
    agree = all(r["bit_for_bit"] for r in rows) and all(r["verdict"] != "differs" for r in decodes)
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
