"""Each family's own code and ours on the official-tiny checkpoints: are the logits the same
bits, in float32 and bfloat16 (docs/MODELS.md, "Numerics, as each family's own code computes
them")? And does Dream's own `diffusion_generate` give our `decoder=dream`'s tokens
(docs/STRATEGIES.md, Dream's decoder)?

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

The decodes (Dream, float32, one row, whole answer, temperature 0, `alg_temp` 0): 3 prompts x
`DECODE_ALGS` x `DECODE_SCHEDULES` x `DECODE_FILTERS`, each Dream's `diffusion_generate`
against our `generate(..., rule="dream")`. `alg=origin` and any temperature or `alg_temp`
above 0 are left out: there Dream's file draws from torch's global generator, ours from the
row's (the distributions are compared in tests/test_dream_rule.py). Two things are done
through Dream's own logits hook (`generation_logits_hook_func`), no file changed: the mask
token's logit is set to -inf, as ours does first (STRATEGIES.md: on this fixture Dream's file
would commit the mask token itself); and each step where a tie at the commit boundary lets
`torch.topk` choose is recorded (the hook recomputes the confidences with the file's own
`sample_tokens` and the count with the file's formula). Ours commits the leftmost of tied
positions (STRATEGIES.md), so a case whose upstream run met such a tie is run once more with
the file's `torch.topk` returning ties leftmost first (`LeftmostTopk`, given to the file as its
`torch`); ours must then equal that run. Any other difference fails.

One setting is made from outside, no file changed: LLaDA's `LLaDAModelLM.__init__` builds its
network on "cuda" whatever the config says, so the LLaDA network is built on the CPU through
its own classes (`LLaDAModel` with `init_device="cpu"`, handed to `LLaDAModelLM`) and given the
checkpoint's tensors with a strict `load_state_dict`; the other three use `from_pretrained`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "official-tiny"
DLLM = "85cb53a05343601c9dfbb4f79243cd426cfa5a4c"  # ZHZisZZ/dllm: the first LLaDA2 copy
DTYPES = ("float32", "bfloat16")
DECODE_ALGS = ("maskgit_plus", "topk_margin", "entropy")
DECODE_SCHEDULES = ((4, 4), (7, 3), (12, 5), (12, 12), (6, 9), (5, 1), (16, 8))  # (length, steps)
DECODE_FILTERS = ((None, None), (0.95, None), (None, 3))  # (top_p, top_k)
DECODE_PROMPTS = 3
EPS = 1e-3  # Dream's generation config's
VERDICTS = ("same", "same, ties leftmost", "differs")


@dataclass(frozen=True)
class Upstream:
    """Where one family's upstream files are, and what is compared."""

    family: str  # its folder under the fixtures, and the package its files go into
    repo: str  # owner/name on GitHub
    files: tuple[tuple[str, str], ...]  # (path in the repository, commit)
    model_class: str  # in the package's modeling module
    cases: tuple[str, ...]

    @property
    def modeling(self) -> str:
        return next(Path(p).stem for p, _ in self.files if Path(p).stem.startswith("modeling"))


def _dllm(folder: str, *names: str) -> tuple[tuple[str, str], ...]:
    return tuple((f"dllm/pipelines/{folder}/models/{name}", DLLM) for name in names)


# the sources named in tests/fixtures/official-tiny/README.md; LLaDA's and Dream's hub files
# from the same dllm commit
UPSTREAM = (
    Upstream(
        "llada",
        "ZHZisZZ/dllm",
        _dllm("llada", "configuration_llada.py", "modeling_llada.py"),
        "LLaDAModelLM",
        ("plain", "padded"),
    ),
    Upstream(
        "dream",
        "ZHZisZZ/dllm",
        _dllm("dream", "configuration_dream.py", "modeling_dream.py", "generation_utils.py"),
        "DreamModel",
        ("plain", "padded"),
    ),
    Upstream(
        "llada_moe",
        "InfiniTensor/InfiniLM",
        (
            ("configuration_lladamoe.py", "239f1d707f54c1e95ad2ec282842a3ed87038f05"),
            ("modeling_lladamoe.py", "0a7e522afb6079a30c7ecb50ce8abafe6cc3f808"),
        ),
        "LLaDAMoEModelLM",
        ("plain",),
    ),
    Upstream(
        "llada2",
        "ZHZisZZ/dllm",
        _dllm("llada", "configuration_llada2_moe.py", "modeling_llada2_moe.py"),
        "LLaDA2MoeModelLM",
        ("plain", "padded_4d", "block"),
    ),
)


# ------------------------------------------------------------------ the upstream side


def _git(mirror: Path, *args: str) -> bytes:
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
        mirror = mirrors / up.repo.replace("/", "+") / "repo"
        if not mirror.exists():
            raise SystemExit(
                f"--mirrors {mirrors}: no mirror of {up.repo} at {mirror}; fetch "
                f"github:{up.repo} (the fetch tool puts it there) or give the right folder"
            )
        package = dest / up.family
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        record[up.family] = []
        for path, commit in up.files:
            blob = _git(mirror, "rev-parse", f"{commit}:{path}").decode().strip()
            (package / Path(path).name).write_bytes(_git(mirror, "cat-file", "blob", blob))
            record[up.family].append(
                {"repo": up.repo, "commit": commit, "path": path, "blob": blob}
            )
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


def decode_cases() -> list[dict[str, object]]:
    """Every decode compared, as (alg, length, steps, top_p, top_k, prompt)."""
    return [
        {"alg": alg, "length": length, "steps": steps, "top_p": p, "top_k": k, "prompt": i}
        for alg in DECODE_ALGS
        for length, steps in DECODE_SCHEDULES
        for p, k in DECODE_FILTERS
        for i in range(DECODE_PROMPTS)
    ]


def decode_prompt(index: int) -> object:
    """Prompt `index`: ordinary tokens (below the fixture's special ids, 240 and up)."""
    import torch

    return torch.randint(0, 240, (5 + index,), generator=torch.Generator().manual_seed(index))


def tie_watch(generation: object, case: dict, mask_id: int, ties: list[int]) -> object:
    """Dream's logits hook for `case`: the mask token's logit to -inf, and each step whose
    commit boundary falls inside a tie appended to `ties` (the module docstring)."""
    import torch

    timesteps = torch.linspace(1, EPS, case["steps"] + 1)

    def hook(step: int, x: object, logits: object) -> object:
        logits[..., mask_id] = float("-inf")
        masked = x == mask_id
        confidence, _ = generation.sample_tokens(
            logits[masked], 0.0, top_p=case["top_p"], top_k=case["top_k"],
            margin_confidence=case["alg"] == "topk_margin", neg_entropy=case["alg"] == "entropy",
        )  # fmt: skip
        count = masked.sum() / masked.shape[0]  # the file's formula, at one row
        t, s = timesteps[step], timesteps[step + 1]
        commits = int(count * (1 - s / t)) if step < case["steps"] - 1 else int(count)
        if 0 < commits < confidence.numel():
            top = confidence.topk(commits + 1).values
            if top[commits - 1] == top[commits]:
                ties.append(step)
        return logits

    return hook


class LeftmostTopk:
    """`torch` as Dream's file sees it, but `topk` returns tied values leftmost first (ours'
    documented order): the second run of a case whose first run met a tie."""

    def __init__(self, torch: object) -> None:
        self._torch = torch

    def __getattr__(self, name: str) -> object:
        return getattr(self._torch, name)

    def topk(self, values: object, k: int) -> tuple[object, object]:
        order = self._torch.sort(values, dim=-1, descending=True, stable=True).indices[..., :k]
        return values.gather(-1, order), order


def _dream_decode(model: object, generation: object, case: dict) -> tuple[list[int], list[int]]:
    """Dream's own decode of `case`: (the answer's tokens, the steps that met a tie)."""
    mask_id, prompt, ties = model.config.mask_token_id, decode_prompt(case["prompt"]), []
    config = generation.DreamGenerationConfig(
        mask_token_id=mask_id, max_new_tokens=case["length"], steps=case["steps"],
        temperature=0.0, alg=case["alg"], alg_temp=0.0, top_p=case["top_p"],
        top_k=case["top_k"], eps=EPS, return_dict=True,
    )  # fmt: skip
    hook = tie_watch(generation, case, mask_id, ties)
    out = model.diffusion_generate(
        prompt[None], generation_config=config, generation_logits_hook_func=hook
    )
    return out.sequences[0, len(prompt) :].tolist(), ties


def upstream_decodes(fixtures: Path) -> list[dict[str, object]]:
    """The child process: Dream's `diffusion_generate` on every decode case; a case that met
    a tie is run again with ties to the leftmost (`tokens_leftmost`)."""
    import importlib

    import torch

    dream = next(up for up in UPSTREAM if up.family == "dream")
    model = upstream_model(dream, fixtures / "dream", torch.float32)
    generation = importlib.import_module("dream.generation_utils")
    found = []
    for case in decode_cases():
        tokens, ties = _dream_decode(model, generation, case)
        row = {**case, "tokens": tokens, "ties": ties}
        if ties:
            generation.torch = LeftmostTopk(torch)
            try:
                row["tokens_leftmost"] = _dream_decode(model, generation, case)[0]
            finally:
                generation.torch = torch
        found.append(row)
    return found


def run_upstream(fixtures: Path, out: Path) -> None:
    """The child process: every family's logits cases in every dtype into
    `out/logits.safetensors`, and Dream's decodes into `out/decodes.json`."""
    import torch
    from safetensors.torch import load_file, save_file

    logits = {}
    for up in UPSTREAM:
        expected = load_file(str(fixtures / up.family / "expected.safetensors"))
        for name in DTYPES:
            dtype = getattr(torch, name)
            model = upstream_model(up, fixtures / up.family, dtype)
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
    import torch

    other = theirs[f"{family}/{dtype}/{case}"].float()
    ours = ours.float()  # exact from either dtype: the comparison is of the values' bits
    return {
        "family": family,
        "dtype": dtype,
        "case": case,
        "bit_for_bit": torch.equal(ours, other),
        "max_abs": (ours - other).abs().max().item(),
    }


def compare(fixtures: Path, theirs: dict) -> list[dict[str, object]]:
    """One row per (family, dtype, case): ours against `theirs`, and the largest difference."""
    import torch
    from safetensors.torch import load_file

    from lm_eval_dvoting.models.loading import load_model

    rows = []
    for up in UPSTREAM:
        expected = load_file(str(fixtures / up.family / "expected.safetensors"))
        for name in DTYPES:
            model = load_model(str(fixtures / up.family), device="cpu", dtype=name)
            with torch.no_grad():
                for case in up.cases:
                    ours = our_case(model, expected, case)
                    rows.append(_row(up.family, name, case, ours, theirs))
    return rows


def our_decodes(fixtures: Path) -> list[list[int]]:
    """Our `decoder=dream` on every decode case (`decode_cases`' order), float32."""
    import torch

    from lm_eval_dvoting.core.decoding.rows import generate
    from lm_eval_dvoting.core.decoding.state import DreamDecoding
    from lm_eval_dvoting.models.loading import load_model

    model = load_model(str(fixtures / "dream"), device="cpu", dtype="float32")
    found = []
    for case in decode_cases():
        with torch.no_grad():
            result = generate(
                model, decode_prompt(case["prompt"])[None], gen_length=case["length"],
                block_length=case["length"], steps=case["steps"], rule="dream",
                dream=DreamDecoding(alg=case["alg"], alg_temp=0.0, eps=EPS), temperature=0.0,
                top_p=case["top_p"], top_k=case["top_k"],
            )  # fmt: skip
        found.append(result.tokens[0].tolist())
    return found


def decode_verdicts(theirs: list[dict], ours: list[list[int]]) -> list[dict[str, object]]:
    """Each decode case with its verdict: `same` (Dream's tokens); `same, ties leftmost`
    (Dream's run met a tie, and its run with ties to the leftmost gives ours); `differs`."""
    rows = []
    for case, tokens in zip(theirs, ours, strict=True):
        if case["tokens"] == tokens:
            verdict = "same"
        elif case["ties"] and case.get("tokens_leftmost") == tokens:
            verdict = "same, ties leftmost"
        else:
            verdict = "differs"
        rows.append({**case, "ours": tokens, "verdict": verdict})
    return rows


def decode_lines(rows: list[dict[str, object]]) -> list[str]:
    """One line per (alg, filter): how many cases agree, how many met a tie, how many differ;
    then each differing case."""
    lines = []
    for alg in DECODE_ALGS:
        for top_p, top_k in DECODE_FILTERS:
            group = [r for r in rows if (r["alg"], r["top_p"], r["top_k"]) == (alg, top_p, top_k)]
            tied = sum(bool(r["ties"]) for r in group)
            by_verdict = {v: sum(r["verdict"] == v for r in group) for v in VERDICTS}
            lines.append(
                f"dream decode {alg:<12} top_p={top_p} top_k={top_k}: {len(group)} cases, "
                f"{tied} met a tie; {by_verdict['same']} same, "
                f"{by_verdict['same, ties leftmost']} same with ties leftmost, "
                f"{by_verdict['differs']} differ"
            )
    return lines + [f"  DIFFERS: {r}" for r in rows if r["verdict"] == "differs"]


def verdict_line(row: dict[str, object]) -> str:
    verdict = "bit for bit" if row["bit_for_bit"] else f"DIFFERS, max_abs {row['max_abs']:.3g}"
    return f"{row['family']:<10} {row['dtype']:<9} {row['case']:<10} {verdict}"


def arguments(argv: list[str] | None) -> argparse.Namespace:
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
    decodes = decode_verdicts(theirs, our_decodes(args.fixtures))
    print("\n".join([*map(verdict_line, rows), *decode_lines(decodes)]))
    if args.json:
        found = {"logits": rows, "decodes": decodes, "upstream": record}
        args.json.write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")
    agree = all(r["bit_for_bit"] for r in rows) and all(r["verdict"] != "differs" for r in decodes)
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
