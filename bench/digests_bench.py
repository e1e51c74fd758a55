"""Suite `digests`: a digest (sha256) of many decodes of the official-tiny fixtures, tokens and
forward passes, in float32 on the CPU, to tell whether a change moved any token: run it here
and on another commit's checkout, and compare.

    .venv/bin/python -m bench digests                     # this checkout (about 5 minutes)
    git worktree add /tmp/base REV && .venv/bin/python -m bench digests --package /tmp/base

Groups (`--groups`):
* `caches`: the LLaDA and Dream fixtures, five prompts of 2-9 tokens batched (left-padded),
  the fixed schedule, the entropy rule, the confidence rule at two thresholds (and Dream's
  own `alg=entropy` on Dream), `cache` none / prefix / dual under `cached_steps` dynamic and
  static, temperatures 0 and 0.8, three (answer, block) shapes: 270 decodes;
* `llada2`: block diffusion on the LLaDA2 fixture, six prompts, eight LLaDA2.0/2.1 settings,
  temperatures 0 and 0.8, `cache` none and block, four shapes, top-p/top-k, one generator
  shared by the rows or one each, kept tokens or none: 640 decodes;
* `moe`: the LLaDA-MoE fixture, the `caches` group's rules and shapes under `cache` none /
  prefix / dual (dynamic): 72 decodes.

Equal digests mean equal tokens and passes in every decode of the group; a digest does not
say which decode moved (`--json FILE` writes them all, to compare two runs' files).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import itertools
import json
import sys
from pathlib import Path
from typing import Any, Iterator

import torch

from bench import common

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "official-tiny"
GROUPS = ("caches", "llada2", "moe")
SHAPES = ((16, 4), (12, 4), (16, 8))  # (answer, block) of the caches and moe groups
Results = dict[str, Any]


def _prompts(count_lengths: tuple[int, ...]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randint(0, 240, (n,), generator=generator) for n in count_lengths]


def _cached_cases(family: str, modes: tuple[str, ...]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The caches and moe groups' decodes: (name, `generate` arguments but the model's)."""
    from lm_eval_dvoting.core.decoding.state import DreamDecoding

    rules: list[dict[str, Any]] = [dict(steps=16), dict(alpha=0.5)]
    rules += [dict(threshold=0.7), dict(threshold=0.3)]
    if family == "dream":
        rules.append(dict(rule="dream", steps=16, dream=DreamDecoding("entropy")))
    caches, temperatures = ("none", "prefix", "dual"), (0.0, 0.8)
    for rule, cache, mode, t, (gen, block) in itertools.product(
        rules, caches, modes, temperatures, SHAPES
    ):
        if cache == "none" and mode == "static":
            continue
        rule = dict(rule, steps=gen) if "steps" in rule else rule
        args = dict(gen_length=gen, block_length=block, cache=cache, temperature=t, **rule)
        yield f"{family}|{rule}|{cache}|{mode}|{t}|{gen},{block}", dict(args, cached_steps=mode)


def _llada2_cases(mask_id: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """The llada2 group's decodes: (name, `generate` arguments but the model's)."""
    from lm_eval_dvoting.core.decoding.state import BlockDecoding

    settings = {
        "2.0": BlockDecoding(),
        "2.0s2": BlockDecoding(steps=2),
        "2.0low": BlockDecoding(threshold=0.3),
        "2.0s3": BlockDecoding(threshold=0.99, steps=3),
        "2.1q": BlockDecoding(threshold=0.7, editing_threshold=0.5),
        "2.1s": BlockDecoding(threshold=0.5, editing_threshold=0.0),
        "2.1p2": BlockDecoding(0.5, None, 0.0, 2),
        "2.1p0": BlockDecoding(0.5, None, 0.0, 0),
    }
    shapes, filters = ((8, 4), (11, 4), (16, 8), (5, 8)), ((None, None), (0.9, 20))
    for (name, block), t, cache, (gen, length), (top_p, top_k), shared, kept in itertools.product(
        settings.items(), (0.0, 0.8), ("none", "block"), shapes, filters, (False, True), (0, 1)
    ):
        if t == 0 and (top_p is not None or shared):
            continue
        args = dict(gen_length=gen, block_length=length, block=block, cache=cache)
        args.update(temperature=t, top_p=top_p, top_k=top_k, shared=shared)
        args["init_tokens"] = _kept_tokens(mask_id, gen) if kept else None
        yield f"{name}|{t}|{cache}|{gen},{length}|{(top_p, top_k)}|{shared}|{bool(kept)}", args


def _kept_tokens(mask_id: int, gen: int) -> torch.Tensor:
    """Answers given in part (a dVoting remask sample's): token 17 at 1, token 5 at the end of
    every other row."""
    tokens = torch.full((6, gen), mask_id)
    tokens[:, 1] = 17
    tokens[::2, gen - 1] = 5
    return tokens


def decoded(model: Any, prompts: list[torch.Tensor], cases: Any, quick: bool) -> Results:
    """Every case decoded: its tokens and passes, by name."""
    from lm_eval_dvoting.core.decoding import generate
    from lm_eval_dvoting.core.decoding.state import left_pad

    ids, attention, _ = left_pad(prompts, 0, torch.device("cpu"))
    decodes = {}
    for name, args in itertools.islice(cases, 4 if quick else None):
        model.cached_steps = args.pop("cached_steps", "dynamic")
        seeds = [3] if args.pop("shared", False) else range(len(prompts))
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        args["generator"] = generators[0] if len(seeds) == 1 else generators
        result = generate(model, ids, attention, **args)
        decodes[name] = [result.tokens.tolist(), result.nfe.tolist()]
    return decodes


def run_group(group: str, quick: bool) -> Results:
    """The group's decodes, and the digest of them all."""
    from lm_eval_dvoting.models.loading import load_model

    def load(name: str) -> Any:
        return load_model(str(FIXTURES / name), device="cpu", dtype="float32")

    decodes: Results = {}
    if group == "llada2":
        model = load("llada2")
        prompts = _prompts((3, 4, 6, 9, 1)) + [torch.tensor([56, 216, 108, 74, 33, 86])]
        decodes = decoded(model, prompts, _llada2_cases(model.mask_token_id), quick)
    families = {"caches": ("llada", "dream"), "moe": ("llada_moe",)}.get(group, ())
    modes = ("dynamic", "static") if group == "caches" else ("dynamic",)
    for family in families:
        cases = _cached_cases(family, modes)
        decodes.update(decoded(load(family), _prompts((3, 4, 6, 9, 2)), cases, quick))
    blob = json.dumps(decodes, sort_keys=True)
    return {"decodes": decodes, "sha256": hashlib.sha256(blob.encode()).hexdigest()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench digests", description=__doc__)
    p.add_argument("--package", help="a checkout whose lm_eval_dvoting to decode with")
    p.add_argument("--groups", nargs="+", choices=GROUPS, default=list(GROUPS))
    p.add_argument("--json", type=Path, help="write every decode here, to compare two runs")
    common.add_quick_flag(p, "four decodes a model, for a smoke test")
    args = p.parse_args(argv)
    if args.package:
        common.import_package_from(args.package)
    package = importlib.import_module("lm_eval_dvoting")
    torch.set_num_threads(1)
    print(f"lm_eval_dvoting from {Path(package.__file__).parent.parent}")
    found = {}
    for group in args.groups:
        found[group] = run_group(group, args.quick)
        print(f"{group}: {len(found[group]['decodes'])} decodes, sha256 {found[group]['sha256']}")
    if args.json:
        common.save_json(args.json, found)
    return 0
