"""`dvoting compare`: several strategies on one model and task, through the harness.

    dvoting compare --model_args pretrained=tiny-arith --tasks dvoting_arith

loads the model once, evaluates every row (default: single, single-entropy,
single-confidence, majority, majority-entropy, hex, dvoting) on the same documents with
lm-eval's `simple_evaluate`, prints one Markdown table (accuracy, mean NFE, seconds,
benefit per cost against `single`, for rows at least as costly) and writes the table, the
figures (compare.json, standard JSON: `strict_json`) and an accuracy-versus-NFE plot (like
the paper's Pareto figure) into `--out`.

A row runs once per seed (`--seeds K`, or `--row_seeds ROW=K` for a row of its own) when
the settings its requests really ran with draw from the seed (a temperature above 0, e.g.
`--gen_kwargs do_sample=true,temperature=1.0` on `single` or `temporal`, or random
remasking: `ran_sampled`), and once otherwise. Each progress bar names its row and seed. A
task scored by log-likelihood only (`dvoting_arith_mc`) is refused before the model is
loaded: no strategy plays a part in it (`check_generation_task`).

The two `-entropy` rows are ablations that split dVoting's gain into its parts:
`single-entropy` is one greedy sample with dVoting's entropy-threshold decoder (the
decoder alone), `majority-entropy` is majority voting with that decoder at dVoting's
temperature (decoder and voting, without dVoting's remasking and early stop). So
dvoting - majority-entropy is what remasking with the early stop adds; `--seeds K`
repeats every sampled row with K sampling seeds and gives that difference a paired
bootstrap interval over the problems. `single-confidence` is one greedy sample with
Fast-dLLM's confidence-threshold decoder (`threshold`: the model arg's, else 0.9), the
other parallel decoder to set dVoting's against. `single-dream` (run only when named) is
one sample with Dream's own `diffusion_generate` algorithm at Dream-v0-Instruct-7B's model
card's setting (`DREAM_CARD`: alg=entropy, alg_temp=0, temperature 0.2, top_p 0.95; steps
the model args', else the answer length), Dream's own baseline next to the others.

`--sweep NAME=V1,V2,...` runs every chosen row at every value of one strategy setting
(`SWEEP_TYPES`) on the same loaded model, and prints one table per row (value,
accuracy, runs, mean NFE, samples, seconds); compare.json then holds a `sweep` object
and sweep.png plots accuracy against mean NFE, one line per row (see `check_sweep` for
what is refused before the model is loaded).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import logging
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from lm_eval_dvoting.core import parts
from lm_eval_dvoting.core.settings import StrategySettings
from lm_eval_dvoting.integration.length_checks import index_leaves, indexed_generation_kwargs
from lm_eval_dvoting.integration.request_planning import task_length
from lm_eval_dvoting.integration.strict_json import dumps as strict_dumps
from lm_eval_dvoting.models.families import MODEL_NAMES

log = logging.getLogger(__name__)

# The rows `--strategies` may name, in the default order. A row is a strategy plus
# overrides of its settings (`row_overrides`); the `-entropy` rows are the ablations.
ROWS = (
    "single",
    "single-entropy",
    "single-confidence",
    "single-dream",
    "majority",
    "majority-entropy",
    "hex",
    "dvoting",
    "temporal",
    "rfg",
)
# `rfg` needs a reference (model arg `reference` or `peft`), and `single-dream` is Dream's own
# decoding (any bidirectional model decodes with it), so they run only when asked for
DEFAULT_ROWS = tuple(row for row in ROWS if row not in ("rfg", "single-dream"))
# `single-dream`: one sample with Dream's own algorithm at Dream-v0-Instruct-7B's model card's
# setting (steps: the model args', else the answer length, the card's)
DREAM_CARD = dict(decoder="dream", alg="entropy", alg_temp=0.0, temperature=0.2, top_p=0.95)
# The paired comparison: dVoting against the row that has its decoder, temperature and
# n samples but neither remasking nor the early stop.
PAIRED = ("dvoting", "majority-entropy")
# The `--model` names compare runs: the bidirectional ones (its rows are their strategies;
# block diffusion's names are left out)
COMPARED_MODELS = [name for name, model in MODEL_NAMES.items() if model.block_decoding is None]
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0  # fixed, so the interval of a given compare.json repeats exactly


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dvoting compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="dvoting-llada", choices=COMPARED_MODELS)
    parser.add_argument(
        "--model_args",
        default="pretrained=tiny-arith",
        help="comma-separated key=value model args shared by every strategy",
    )
    parser.add_argument("--tasks", default="dvoting_arith", help="one task name")
    parser.add_argument(
        "--strategies",
        default=",".join(DEFAULT_ROWS),
        help=f"comma-separated rows, from {', '.join(ROWS)}",
    )
    _add_seed_flags(parser)
    _add_run_flags(parser)
    return parser.parse_args(argv)


def _add_seed_flags(parser: argparse.ArgumentParser) -> None:
    """How many sampling seeds each row runs with."""
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="sampling seeds per sampled row (seed, seed+1, ...; the model's seed first); "
        "greedy rows run once",
    )
    parser.add_argument(
        "--row_seeds",
        default=None,
        metavar="ROW=K,...",
        help="seeds for the named rows instead of --seeds, e.g. hex=1 "
        "(HEX, 480 passes per question, is the slow row)",
    )


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of how the rows run and where the results go (limit, batch size, device,
    generation kwargs, output folder, sweep)."""
    parser.add_argument(
        "--limit", type=float, default=None, help="documents per task (as lm_eval --limit)"
    )
    parser.add_argument(
        "--batch_size",
        default=None,
        help=f"rows decoded per forward pass, or 'auto' (default {DEFAULT_BATCH_SIZE})",
    )
    parser.add_argument(
        "--device",
        default=None,
        help="cpu, cuda, cuda:1, ... (default: CUDA when there is one, else the CPU)",
    )
    parser.add_argument("--gen_kwargs", default=None, help="as lm_eval --gen_kwargs")
    parser.add_argument("--apply_chat_template", action="store_true")
    parser.add_argument("--out", default="dvoting_compare", help="folder for table, JSON and plot")
    parser.add_argument(
        "--sweep",
        action="append",
        default=None,
        metavar="NAME=V1,V2,...",
        help="run every row at every value of one setting, e.g. threshold=0.7,0.8,0.9 "
        f"(settings: {', '.join(SWEEP_TYPES)}); a value here wins over --model_args",
    )


def _parse_model_args(text: str) -> dict[str, Any]:
    from lm_eval.utils import simple_parse_args_string

    return simple_parse_args_string(text) if text else {}


DEFAULT_BATCH_SIZE = 16


def model_kwargs(model_args: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """`--model_args` plus `--device`/`--batch_size`: each given in either place, or in both alike.

    (Passing both as keywords used to fail with "got multiple values for keyword argument".)
    """
    merged = dict(model_args)
    for key in ("device", "batch_size"):
        value = getattr(args, key)
        if value is None:
            continue
        if key in merged and str(merged[key]) != str(value):
            raise SystemExit(
                f"dvoting compare: {key}={merged[key]!r} in --model_args conflicts with "
                f"--{key} {value}: give {key} in one place only"
            )
        merged[key] = value
    merged.setdefault("batch_size", DEFAULT_BATCH_SIZE)
    return merged


def accuracy_key(task_results: dict[str, Any]) -> str:
    """The accuracy metric of a task's results: exact_match (our tasks) or acc."""
    for prefix in ("exact_match,", "acc,"):
        for key in task_results:
            if key.startswith(prefix) and "_stderr" not in key:
                return key
    raise KeyError(f"no exact_match or acc metric in {sorted(task_results)}")


def _task_manager(task: str) -> Any:
    """Our tasks alone when `task` is one of ours (indexing lm-eval's ~14,000 stock task
    files takes many seconds); every task otherwise."""
    from lm_eval.tasks import TaskManager

    from lm_eval_dvoting.integration.plugin import asks_only_ours, task_dir

    return TaskManager(include_path=str(task_dir()), include_defaults=not asks_only_ours(task))


@functools.lru_cache(maxsize=2)
def _task_index(task: str) -> Any:
    """The task index the checks before loading read (once per command: indexing the stock
    tasks takes seconds)."""
    return _task_manager(task).task_index


def _evaluate(lm: Any, args: argparse.Namespace) -> dict[str, Any]:
    import lm_eval

    return lm_eval.simple_evaluate(
        model=lm,
        tasks=[args.tasks],
        limit=args.limit,
        task_manager=_task_manager(args.tasks),
        gen_kwargs=args.gen_kwargs,
        apply_chat_template=args.apply_chat_template,
        log_samples=True,  # the per-document scores the paired comparison needs
    )


# ------------------------------------------------------------------ rows and seeds


def parse_rows(text: str) -> list[str]:
    """The rows `--strategies` names, in its order; SystemExit for unknown or repeated ones."""
    rows = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        raise SystemExit(
            f"dvoting compare: unknown strategies {unknown} in --strategies; "
            f"choose rows from {', '.join(ROWS)}"
        )
    if not rows:
        raise SystemExit(
            f"dvoting compare: --strategies {text!r} names no row; choose from {', '.join(ROWS)}"
        )
    repeated = sorted({r for r in rows if rows.count(r) > 1})
    if repeated:
        raise SystemExit(
            f"dvoting compare: --strategies names {repeated} more than once; name each row once "
            "(use --seeds K to repeat sampled rows)"
        )
    return rows


def check_shared_model_args(model_args: Mapping[str, Any]) -> None:
    """Refuse the model args that each row sets itself (`--model_args` apply to every row)."""
    if "strategy" in model_args:
        raise SystemExit("dvoting compare: give strategies with --strategies, not in --model_args")
    if "decoder" in model_args:
        raise SystemExit(
            f"dvoting compare: decoder={model_args['decoder']!r} in --model_args would apply to "
            "every row, but each row sets its own decoder; leave it out and name single-entropy "
            "or majority-entropy in --strategies for the entropy decoder, single-confidence for "
            f"the confidence decoder (rows: {', '.join(ROWS)}), or --sweep decoder=... over rows "
            "without a decoder suffix"
        )


def check_rfg_reference(names: Sequence[str], model_args: Mapping[str, Any]) -> None:
    """The rfg row needs a reference: a second model, or the base under a LoRA adapter."""
    if "rfg" in names and not (model_args.get("reference") or model_args.get("peft")):
        raise SystemExit(
            "dvoting compare: the rfg row needs a reference: add reference=<hub id | folder> or "
            "peft=<adapter> to --model_args (on the demo: "
            "pretrained=tiny-arith,peft=tiny-arith-lora); the other rows then run the policy "
            "(with its adapter)"
        )


def check_seeds(seeds: int) -> None:
    """`--seeds` must be a whole number >= 1."""
    if seeds < 1:
        raise SystemExit(
            f"dvoting compare: --seeds must be >= 1, got {seeds}: the number of sampling seeds "
            "per sampled row, e.g. --seeds 3 (default 1)"
        )


def parse_row_seeds(text: str | None, names: Sequence[str], default: int) -> dict[str, int]:
    """Each row's number of seeds: `default` (--seeds), or K where `--row_seeds` gives ROW=K.

    SystemExit naming --row_seeds for a missing `=`, a row not in --strategies, a row given
    twice, or a K that is not a whole number >= 1."""
    counts = {name: default for name in names}
    given: set[str] = set()
    for part in (p.strip() for p in (text or "").split(",") if p.strip()):
        row, equals, value = (piece.strip() for piece in part.partition("="))
        if not equals:
            problem = f"has no '=' in {part!r}"
        elif row not in counts:
            problem = f"names {row!r}, not a row of --strategies ({', '.join(names)})"
        elif row in given:
            problem = f"gives {row} twice"
        elif not value.isdigit() or int(value) < 1:
            problem = f"gives {row} {value!r} seeds, not a whole number >= 1"
        else:
            given.add(row)
            counts[row] = int(value)
            continue
        raise SystemExit(
            f"dvoting compare: --row_seeds {text!r} {problem}; give ROW=K for rows of "
            "--strategies, e.g. --row_seeds hex=1"
        )
    return counts


def take_threshold(model_args: dict[str, Any]) -> float | None:
    """Remove `threshold` (the confidence decoder's) from the model args and return it, checked.

    It is applied to every row with `use_strategy`, not given to the model's constructor, so
    compare takes it whether or not the harness accepts it as a model arg."""
    if "threshold" not in model_args:
        return None
    value = model_args.pop("threshold")
    try:
        StrategySettings(threshold=value)
    except ValueError as err:
        raise SystemExit(f"dvoting compare: threshold={value!r} in --model_args: {err}") from err
    return value


# ------------------------------------------------------------------- the sweep

# Model args `--sweep` refuses, with what to do instead.
_NOT_SWEPT = {
    "strategy": "the rows are chosen with --strategies",
    "seed": "give --seeds K for K sampling seeds",
    "max_gen_toks": "the generation length is the task's: run compare once per value with "
    "--gen_kwargs max_gen_toks=V",
    "gen_length": "the generation length is the task's: run compare once per value with "
    "--gen_kwargs max_gen_toks=V",
    "prefix_cache": "it is the older spelling of cache: --sweep cache=none,prefix",
}


def _sweep_types() -> dict[str, type]:
    """The settings `--sweep` may vary, with the type its values are read as: the settings a
    decode of LLaDA or Dream reads (every decode's, and those its parts declare:
    `core/parts/`), as their declarations read them (`core/settings.py`), less those
    `_NOT_SWEPT` refuses; `use_strategy` changes each on the loaded model."""
    read = {
        name
        for kind in ("strategy", "rule", "cache", "vote")
        for part in parts.parts(kind)
        if parts.BIDIRECTIONAL in part.models
        for name in part.reads
    }
    as_type = {"whole": int, "real": float, "text": str}
    return {
        declared.name: as_type[declared.metadata["parse"]]
        for declared in dataclasses.fields(StrategySettings)
        if declared.metadata.get("parse") in as_type
        and declared.name not in _NOT_SWEPT
        and (declared.metadata["every_decode"] or declared.name in read)
    }


SWEEP_TYPES: dict[str, type] = _sweep_types()

_RELOAD = (
    "pretrained",
    "tokenizer",
    "dtype",
    "mc_num",
    "max_length",
    "device",
    "batch_size",
    "max_batch_size",
    "revision",
    "subfolder",
    "trust_remote_code",
    "use_fast_tokenizer",
    "add_bos_token",
)


def _sweep_value(name: str, text: str) -> Any:
    """One `--sweep` value as its setting's type (SystemExit naming it otherwise)."""
    kind = SWEEP_TYPES[name]
    example = {int: "e.g. 2,4,8", float: "e.g. 0.5,0.7,0.9", str: "e.g. none,prefix"}[kind]
    try:
        if kind is int:
            if not text.lstrip("+-").isdigit():
                raise ValueError
            return int(text)
        return float(text) if kind is float else text
    except ValueError:
        raise SystemExit(
            f"dvoting compare: --sweep {name}={text}: {name} takes "
            f"{'whole numbers' if kind is int else 'numbers'}, got {text!r}; give "
            f"comma-separated values, {example}"
        ) from None


def _check_sweep_name(spec: str, name: str, equals: str) -> None:
    """SystemExit unless `--sweep spec` names (with `=`) a setting `--sweep` may vary."""
    allowed = ", ".join(SWEEP_TYPES)
    if not equals:
        raise SystemExit(
            f"dvoting compare: --sweep {spec!r} has no '=': give NAME=V1,V2,... with NAME one of "
            f"{allowed}, e.g. --sweep threshold=0.7,0.8,0.9"
        )
    if name in _NOT_SWEPT:
        raise SystemExit(
            f"dvoting compare: --sweep {spec}: {name} cannot be swept; {_NOT_SWEPT[name]} "
            f"(sweepable: {allowed})"
        )
    if name in _RELOAD:
        raise SystemExit(
            f"dvoting compare: --sweep {spec}: {name} cannot be swept on a loaded model (it needs "
            f"a model reload): run compare once per value with {name}=V in --model_args "
            f"(sweepable: {allowed})"
        )
    if name not in SWEEP_TYPES:
        raise SystemExit(
            f"dvoting compare: --sweep {spec}: unknown setting {name!r}; sweepable settings: "
            f"{allowed}"
        )


def _sweep_values(spec: str, name: str, values_text: str) -> list[Any]:
    """The comma-separated values of `--sweep spec`, each of `name`'s type, none empty or
    repeated (SystemExit otherwise)."""
    texts = [text.strip() for text in values_text.split(",")]
    if not any(texts) or not all(texts):
        raise SystemExit(
            f"dvoting compare: --sweep {spec}: "
            f"{'no values' if not any(texts) else 'an empty value'}; give comma-separated values, "
            f"e.g. --sweep {name}=V1,V2,V3"
        )
    values = [_sweep_value(name, text) for text in texts]
    repeated = sorted({str(v) for i, v in enumerate(values) if v in values[:i]})
    if repeated:
        raise SystemExit(
            f"dvoting compare: --sweep {spec}: {', '.join(repeated)} given more than once; "
            "give each value once (use --seeds K to repeat sampled rows)"
        )
    return values


def parse_sweep(specs: Sequence[str] | None) -> tuple[str, list[Any]] | None:
    """`--sweep NAME=V1,V2,...` as (NAME, values of NAME's type); None without one.

    SystemExit for more than one --sweep, a missing `=`, an unknown name, a model arg
    that cannot change on a loaded model, an empty or repeated value, or a value of the
    wrong type (range checks are `check_sweep`'s)."""
    if not specs:
        return None
    if len(specs) > 1:
        raise SystemExit(
            f"dvoting compare: --sweep given {len(specs)} times ({', '.join(specs)}); sweep one "
            "setting per run"
        )
    spec = specs[0]
    name, equals, values_text = (part.strip() for part in spec.partition("="))
    _check_sweep_name(spec, name, equals)
    return name, _sweep_values(spec, name, values_text)


def probe_settings(
    model: str, model_args: Mapping[str, Any], extras: Mapping[str, Any]
) -> StrategySettings:
    """The model args' strategy settings, read as `--model model` reads them
    (`settings_from_args`: each declared setting's parser and default), for the checks before
    the model is loaded; the defaults where they cannot be read (the model then refuses those
    model args itself, before it reads the checkpoint)."""
    from lm_eval_dvoting.integration.harness import EVAL_MODELS

    model_class = EVAL_MODELS[model]
    try:
        # the model arg max_gen_toks serves only the tasks that set none (`checked_settings`)
        return model_class.settings_from_args({**model_args, **extras})
    except (TypeError, ValueError):
        return model_class.settings_from_args(dict(extras))


def request_lengths(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each generation task's `max_gen_toks` as its requests will carry it ({}: none, so its
    requests run at the model arg max_gen_toks, default 256): the task's YAML (a group's:
    each of its tasks'), with --gen_kwargs over it, as `simple_evaluate` writes it; read
    from lm-eval's task index by the harness's own reader (`indexed_generation_kwargs`)."""
    gen_kwargs = _parse_model_args(args.gen_kwargs or "")  # as simple_evaluate reads it
    index = _task_index(args.tasks)
    return indexed_generation_kwargs(index, [args.tasks], gen_kwargs or None)


def checked_settings(
    base: StrategySettings, lengths: Mapping[str, Mapping[str, Any]] | None, **changes: Any
) -> StrategySettings:
    """`base` with `changes`, its length rules checked at the length each task's requests
    really use (`request_planning.task_length`, the harness's check: a task's max_gen_toks
    wins; `base.gen_length`, the model arg, serves the tasks that set none), so a block
    length is never refused against a length no request uses. ValueError naming the
    length and its source. `lengths` None: checked at `base.gen_length` alone."""
    if lengths is None:
        return replace(base, **changes)
    settings = replace(base, defer_length_checks=True, **changes)
    for task, kwargs in lengths.items():
        task_length(settings, dict(kwargs), task, None)  # the room check: the harness's, loaded
    return settings


def leaf_tasks(name: str) -> list[tuple[str, dict[str, Any]]]:
    """The tasks `name` runs (a group's or tag's, recursively; a task itself), each with its
    config as lm-eval's task index reads it (includes resolved); [] for a name the index does
    not know (lm-eval refuses it by name at the first evaluation)."""
    return index_leaves(_task_index(name), name)


def check_generation_task(task: str) -> None:
    """Refuse, before the model is loaded, a task that asks for no generation.

    The strategies decide how answers are generated; a log-likelihood task (output_type
    `multiple_choice`, `loglikelihood`, `loglikelihood_rolling`) is scored by the
    Monte-Carlo likelihood estimate alone, so every row would be the same run under other
    names. A group mixing both kinds runs (its generation tasks are what the rows compare),
    with a warning naming the likelihood tasks, whose part is the same in every row."""
    leaves = leaf_tasks(task)
    likelihood = {
        name: cfg.get("output_type")
        for name, cfg in leaves
        if cfg.get("output_type", "generate_until") != "generate_until"
    }
    if not likelihood:
        return
    named = ", ".join(f"{name} ({kind})" for name, kind in sorted(likelihood.items()))
    if len(likelihood) == len(leaves):
        raise SystemExit(
            f"dvoting compare: --tasks {task} is scored by log-likelihood only ({named}): no "
            "strategy plays a part there (every row would be the same run of the likelihood "
            "estimate, model arg mc_num), so there is nothing to compare. Run it once with "
            f"`lm_eval --model dvoting-llada --tasks {task} --model_args ...`, or compare "
            "strategies on a generation task (e.g. --tasks dvoting_arith)"
        )
    log.warning(
        "dvoting compare: %s includes log-likelihood tasks (%s), scored the same in "
        "every row; the rows differ only in its generation tasks",
        task,
        named,
    )


def _sweep_base(
    base: StrategySettings, name: str, value: Any, swept: Mapping[str, Any]
) -> StrategySettings:
    """`base` with the swept value (and the extras): SystemExit naming --sweep and the value
    when StrategySettings refuses it or when the model args keep it from taking effect."""
    try:
        # as `single` (which takes every decoder), or for `vote` as `majority` (single has no
        # vote); each row's own strategy is checked by `_sweep_row`
        base_value = replace(
            base,
            strategy="majority" if name == "vote" else "single",
            defer_length_checks=True,
            **swept,
        )
    except ValueError as err:
        raise SystemExit(f"dvoting compare: --sweep {name}={value}: {err}") from err
    if getattr(base_value, name) != value:
        raise SystemExit(
            f"dvoting compare: --sweep {name}={value} does not take effect with these "
            f"--model_args (the settings keep {name}={getattr(base_value, name)!r}); leave "
            "the model args that set it (e.g. prefix_cache) out of --model_args"
        )
    return base_value


def _check_row_uses(row: str, settings: StrategySettings, name: str, value: Any) -> None:
    """SystemExit when row `row` (with `settings`) would not run with the swept value: it
    does not read the setting, or sets it itself."""
    if name == "guidance" and settings.strategy != "rfg":
        raise SystemExit(
            f"dvoting compare: --sweep guidance={value}: row {row!r} does not use "
            "guidance (only rfg does); leave the row out of --strategies"
        )
    if name in ("temporal_weight", "temporal_alpha") and settings.resolved_vote != "temporal":
        raise SystemExit(
            f"dvoting compare: --sweep {name}={value}: row {row!r} does not use {name} "
            "(its vote is plain, one vote per sample): give vote=temporal in --model_args "
            "for the voting rows, or leave the row out of --strategies"
        )
    if getattr(settings, name) != value:
        raise SystemExit(
            f"dvoting compare: --sweep {name}={value}: row {row!r} sets {name} itself (it "
            f"runs with {name}={getattr(settings, name)!r} whatever the sweep gives); "
            "leave it out of --strategies or sweep another setting"
        )


def _sweep_row(
    row: str,
    base_value: StrategySettings,
    name: str,
    value: Any,
    swept: Mapping[str, Any],
    lengths: Mapping[str, Mapping[str, Any]] | None,
) -> tuple[str, StrategySettings, str, dict[str, Any]]:
    """Row `row` at one swept value: (name, settings, strategy, use_strategy overrides)."""
    try:
        strategy, overrides = row_overrides(row, base_value)
        settings = checked_settings(base_value, lengths, strategy=strategy, **overrides)
    except ValueError as err:
        raise SystemExit(
            f"dvoting compare: --sweep {name}={value}: row {row!r} cannot run with it: "
            f"{err}; leave the row out of --strategies or the value out of --sweep"
        ) from err
    _check_row_uses(row, settings, name, value)
    return row, settings, strategy, {**swept, **overrides}


def sweep_plan(
    names: Sequence[str],
    base: StrategySettings,
    name: str,
    values: Sequence[Any],
    extras: Mapping[str, Any],
    lengths: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[tuple[Any, list[tuple[str, StrategySettings, str, dict[str, Any]]]]]:
    """Per swept value, each row's (name, settings, strategy, use_strategy overrides), on `base`.

    SystemExit naming --sweep, the value and the row when StrategySettings refuses the value
    (alone or for a row: e.g. threshold=1.5, decoder=entropy for hex), when it does not take
    effect with the model args (cache=none beside prefix_cache=true), or when a row sets the
    swept setting itself (decoder for the -entropy and -confidence rows), since its runs
    would repeat one setting under several labels. Each row's length rules are checked at
    the lengths its requests will use (`checked_settings`: `lengths`, `request_lengths`)."""
    plan = []
    for value in values:
        swept = {**extras, name: value}  # the sweep wins over the model args (and over extras)
        base_value = _sweep_base(base, name, value, swept)
        rows = [_sweep_row(row, base_value, name, value, swept, lengths) for row in names]
        plan.append((value, rows))
    return plan


def check_sweep(
    sweep: tuple[str, list[Any]],
    names: Sequence[str],
    probe: StrategySettings,
    extras: Mapping[str, Any],
    lengths: Mapping[str, Mapping[str, Any]],
) -> None:
    """Refuse, before the model is loaded, a sweep that could not run every row at every value.

    Checked: each value against StrategySettings' ranges on the model args' settings (as
    far as `probe_settings` reads them), each row at each value (a row that refuses the
    value or sets the swept setting itself, or whose length rules, e.g. a block length that
    divides the length, fail at a length its requests will use: `request_lengths`). The
    same plan is checked again on the loaded model's settings before the first evaluation."""
    sweep_plan(names, probe, *sweep, extras, lengths)


def row_overrides(row: str, base: StrategySettings) -> tuple[str, dict[str, Any]]:
    """The strategy and the setting overrides row `row` runs with, on the model's settings `base`.

    The overrides always set `decoder`, `temperature` and the other settings `single-dream`
    sets (`DREAM_CARD`; to `base`'s own when the row keeps them), so a row's settings are
    complete in themselves and never depend on the row before it (`use_strategy` also starts
    from the model's built settings).
    """
    strategy, _, variant = row.partition("-")
    # every setting any row sets, at `base`'s value unless this row sets it
    overrides: dict[str, Any] = {name: getattr(base, name) for name in DREAM_CARD}
    if not variant:
        return strategy, overrides
    if variant == "dream":
        return strategy, {**overrides, **DREAM_CARD}
    overrides["decoder"] = variant  # "entropy" or "confidence" (its threshold is `base`'s)
    if strategy == "majority":
        # dVoting's temperature (the model arg's, else dVoting's default): majority-entropy then
        # differs from dvoting only in remasking and the early stop
        # (decoder=None: dVoting's temperature does not depend on it, and dvoting refuses
        # decoder=fixed)
        # (lengths unchecked: only the temperature is read here)
        dvoting = replace(base, strategy="dvoting", decoder=None, defer_length_checks=True)
        overrides["temperature"] = dvoting.resolved_temperature
    return strategy, overrides


def row_settings(
    row: str, base: StrategySettings, lengths: Mapping[str, Mapping[str, Any]] | None = None
) -> StrategySettings:
    """The settings row `row` runs with, checked (at `lengths`, see `checked_settings`):
    SystemExit naming the row when they are invalid."""
    strategy, overrides = row_overrides(row, base)
    try:
        return checked_settings(base, lengths, strategy=strategy, **overrides)
    except ValueError as err:
        raise SystemExit(
            f"dvoting compare: row {row!r} cannot run with these --model_args: {err}"
        ) from err


def _draws_from_seed(temperature: float, decoder: str | None, remasking: str | None) -> bool:
    """A temperature above 0, or the fixed schedule's random remasking, draws from the seed."""
    return temperature > 0 or (decoder == "fixed" and remasking == "random")


def ran_sampled(settings_used: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a run's requests drew from the seed, read from the settings they really ran with
    (`settings_used`, resolved: the task's or --gen_kwargs' `do_sample`/`temperature` included,
    which `single` and `temporal` follow), not from the row's strategy."""
    return any(
        _draws_from_seed(
            float(entry.get("temperature") or 0), entry.get("decoder"), entry.get("remasking")
        )
        for entry in settings_used
    )


def per_document(results: Mapping[str, Any], task: str, metric_key: str) -> dict[int, float]:
    """Each document's score under `metric_key` (e.g. "exact_match,strict-match"), by doc_id,
    from lm-eval's logged samples (one entry per document and filter); {} when there are none."""
    metric, _, filter_name = metric_key.partition(",")
    scores: dict[int, float] = {}
    for sample in results.get("samples", {}).get(task, []):
        if sample.get("filter") != filter_name or metric not in sample:
            continue
        doc_id = sample["doc_id"]
        if doc_id in scores:
            raise ValueError(
                f"document {doc_id} of {task} was scored twice under filter {filter_name!r}"
            )
        scores[doc_id] = float(sample[metric])
    return scores


def mean_and_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (ddof=1) of the runs; None for one run."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


# -------------------------------------------------------------- paired bootstrap


def _check_paired(
    first: Mapping[int, Any], second: Mapping[int, Any], resamples: int, confidence: float
) -> None:
    """ValueError unless both rows scored the same, non-empty set of problems and the
    bootstrap's parameters are in range."""
    if set(first) != set(second):
        only_first, only_second = len(set(first) - set(second)), len(set(second) - set(first))
        raise ValueError(
            f"the two rows were scored on different problems ({only_first} only in the first, "
            f"{only_second} only in the second): run them on the same documents"
        )
    if not first:
        raise ValueError("no problems to compare: the rows have no per-document scores")
    if resamples < 1 or not 0 < confidence < 1:
        raise ValueError(
            f"need resamples >= 1 and 0 < confidence < 1, got {resamples} and {confidence}"
        )


def _bootstrap_means(diffs: Any, resamples: int, rng_seed: int) -> Any:
    """The means of `resamples` resamples (with replacement) of `diffs`, drawn from a numpy
    generator seeded `rng_seed`, a bounded number of rows at a time."""
    import numpy as np

    rng = np.random.default_rng(rng_seed)
    means = np.empty(resamples)
    chunk = max(1, 2_000_000 // len(diffs))  # bounded memory for large tasks
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        means[start : start + size] = diffs[
            rng.integers(0, len(diffs), size=(size, len(diffs)))
        ].mean(1)
    return means


def paired_bootstrap(
    first: Mapping[int, Sequence[float]],
    second: Mapping[int, Sequence[float]],
    resamples: int = BOOTSTRAP_RESAMPLES,
    rng_seed: int = BOOTSTRAP_SEED,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Mean difference first - second in points, with a percentile bootstrap interval over problems.

    `first` and `second` map each problem (doc_id) to its scores (0/1, or a fraction), one
    per run (seed). A problem's difference is the mean of its first-row scores minus the
    mean of its second-row scores (with the same seeds in both rows: the per-seed
    difference averaged over seeds); problems are paired by key, never by position, and
    resampled with replacement `resamples` times from a numpy generator seeded `rng_seed`.
    """
    import numpy as np

    _check_paired(first, second, resamples, confidence)
    problems = sorted(first)  # a fixed order, so the same seed draws the same resamples
    diffs = 100 * np.array(
        [statistics.fmean(first[p]) - statistics.fmean(second[p]) for p in problems]
    )
    means = _bootstrap_means(diffs, resamples, rng_seed)
    low, high = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return {
        "mean_points": float(diffs.mean()),
        "ci_points": [float(low), float(high)],
        "confidence": confidence,
        "problems": len(diffs),
        "resamples": resamples,
        "rng_seed": rng_seed,
    }


def paired_comparison(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """dvoting - majority-entropy (`PAIRED`) when both rows ran and were scored per document."""
    by_name = {row["strategy"]: row for row in rows}
    if not all(name in by_name and by_name[name]["per_document"] for name in PAIRED):
        return None
    first, second = (by_name[name] for name in PAIRED)
    return {
        "first": PAIRED[0],
        "second": PAIRED[1],
        "runs": {PAIRED[0]: len(first["seeds"]), PAIRED[1]: len(second["seeds"])},
        **paired_bootstrap(first["per_document"], second["per_document"]),
    }


def paired_line(paired: Mapping[str, Any]) -> str:
    """The paired comparison in one line, for under the table."""
    low, high = paired["ci_points"]
    runs = sorted(set(paired["runs"].values()))
    seeds = (
        f"{runs[0]} seed{'s' if runs[0] > 1 else ''}"
        if len(runs) == 1
        else ", ".join(f"{name} {count} run(s)" for name, count in paired["runs"].items())
    )
    return (
        f"{paired['first']} - {paired['second']}: {paired['mean_points']:+.1f} points, "
        f"{100 * paired['confidence']:.0f}% CI [{low:+.1f}, {high:+.1f}] "
        f"(paired bootstrap over {paired['problems']} problems, {seeds})"
    )


# --------------------------------------------------------------------- the runs


def _run(
    lm: Any, args: argparse.Namespace, strategy: str, overrides: dict[str, Any], seed: int
) -> dict[str, Any]:
    """One evaluation of one row with one sampling seed."""
    lm.use_strategy(strategy, seed=seed, **overrides)
    started = time.perf_counter()
    results = _evaluate(lm, args)
    seconds = time.perf_counter() - started
    task_results = results["results"][args.tasks]
    key = accuracy_key(task_results)
    info = lm.get_model_info()["dvoting"]
    totals = info["totals"]
    questions = totals.get("questions") or 0
    if not questions:  # what check_generation_task could not see (e.g. a task defined in Python)
        raise SystemExit(
            f"dvoting compare: --tasks {args.tasks} made no generation requests (it "
            "is scored by log-likelihood, where no strategy plays a part): there is "
            "nothing to compare; run it once with lm_eval, or compare strategies on a "
            "generation task"
        )
    return {
        "accuracy": 100 * task_results[key],
        # per question (document, all its repeats), as the column says; totals' means are per
        # request
        "nfe": totals["nfe"] / questions,
        "samples": totals["samples"] / questions,
        "seconds": seconds,
        "questions": questions,
        "metric": key,
        # what the requests ran with (the task's max_gen_toks), not the model args' defaults
        "settings": info["settings_used"] or [info["settings"]],
        "per_document": per_document(results, args.tasks, key),
    }


def _used(settings_used: Sequence[Mapping[str, Any]], name: str) -> Any:
    """A setting as the requests ran with it: its one value, or the sorted distinct values."""
    values = sorted({entry.get(name) for entry in settings_used}, key=repr)
    return values[0] if len(values) == 1 else values


def summarize_row(
    name: str, seeds: Sequence[int], runs: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """One row of figures from its runs (one per seed): means, the std of the accuracy over
    seeds, and the per-seed figures they come from. `decoder`, `temperature` and `sampled`
    are read from the settings the requests ran with (`ran_sampled`)."""
    accuracy, std = mean_and_std([run["accuracy"] for run in runs])
    settings_used: list[dict[str, Any]] = []
    for run in runs:
        settings_used += [s for s in run["settings"] if s not in settings_used]
    return {
        "strategy": name,  # the row's name (e.g. majority-entropy); its settings say the rest
        "decoder": _used(settings_used, "decoder"),
        "temperature": _used(settings_used, "temperature"),
        "sampled": ran_sampled(settings_used),
        "seeds": list(seeds),
        "accuracy": accuracy,
        "accuracy_std": std,
        "accuracies": [run["accuracy"] for run in runs],
        "mean_nfe": statistics.fmean(run["nfe"] for run in runs),
        "nfes": [run["nfe"] for run in runs],
        "mean_samples": statistics.fmean(run["samples"] for run in runs),
        "seconds": sum(run["seconds"] for run in runs),
        "questions": runs[0]["questions"],
        "metric": runs[0]["metric"],
        "settings": settings_used,
        # each document's score per seed, in the order of "seeds" (NaN, null in compare.json: a
        # document a later seed's run did not score)
        "per_document": {
            doc: [run["per_document"].get(doc, math.nan) for run in runs]
            for doc in runs[0]["per_document"]
        },
    }


def checked_plan(
    args: argparse.Namespace, model_args: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str], dict[str, int], tuple[str, list[Any]] | None, dict]:
    """Every check of the command line that needs no model, before the model is loaded:
    (extras for use_strategy, row names, seeds per row, the sweep or None, each task's
    request lengths)."""
    check_shared_model_args(model_args)
    threshold = take_threshold(model_args)  # applied with use_strategy, not given to the model
    extras = {} if threshold is None else {"threshold": threshold}
    names = parse_rows(args.strategies)
    check_rfg_reference(names, model_args)
    check_seeds(args.seeds)
    counts = parse_row_seeds(getattr(args, "row_seeds", None), names, args.seeds)
    sweep = parse_sweep(getattr(args, "sweep", None))
    lengths = request_lengths(args)  # what each task's requests will use
    probe = probe_settings(args.model, model_args, extras)
    if sweep is not None:
        check_sweep(sweep, names, probe, extras, lengths)
    else:
        for name in names:
            row_settings(name, probe, lengths)
    check_generation_task(args.tasks)
    return extras, names, counts, sweep, lengths


def planned_rows(
    names: Sequence[str],
    base: StrategySettings,
    extras: Mapping[str, Any],
    lengths: Mapping[str, Mapping[str, Any]],
) -> list[tuple[str, StrategySettings, str, dict[str, Any]]]:
    """Each row's (name, settings, strategy, use_strategy overrides) on the model args'
    settings `base`, every row's settings checked before any evaluation."""
    planned = []
    for name in names:
        strategy, overrides = row_overrides(name, base)
        planned.append((name, row_settings(name, base, lengths), strategy, {**extras, **overrides}))
    return planned


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate each row with its seeds: {"rows": [...], "paired": {...} or None, "seeds": [...]};
    with --sweep {"sweep": {...}, "seeds": [...]} (`sweep_summary`)."""
    from lm_eval_dvoting.integration.harness import EVAL_MODELS
    from lm_eval_dvoting.integration.plugin import register

    register()
    model_class = EVAL_MODELS[args.model]
    model_args = _parse_model_args(args.model_args)
    # every check on the command line before the model is loaded
    extras, names, counts, sweep, lengths = checked_plan(args, model_args)
    lm = model_class(**model_kwargs(model_args, args))
    first_seed = lm.seed  # the model arg seed, else lm-eval's default
    seeds = [first_seed + i for i in range(args.seeds)]
    with lm_eval_messages_once():
        if sweep is not None:
            # the loaded model's settings (model args read by the harness): checked again
            plan = sweep_plan(names, lm.settings, *sweep, extras, lengths)
            results = [
                (value, run_rows(lm, args, planned, first_seed, counts, f"{sweep[0]}={value}"))
                for value, planned in plan
            ]
            return {"sweep": sweep_summary(sweep[0], results), "seeds": seeds}
        # the model args' settings; every row's are derived from these
        planned = planned_rows(names, replace(lm.settings, **extras), extras, lengths)
        rows = run_rows(lm, args, planned, first_seed, counts)
    return {"rows": rows, "paired": paired_comparison(rows), "seeds": seeds}


def run_rows(
    lm: Any,
    args: argparse.Namespace,
    planned: Sequence[tuple[str, StrategySettings, str, dict[str, Any]]],
    first_seed: int,
    counts: Mapping[str, int],
    context: str = "",
) -> list[dict[str, Any]]:
    """Each planned row (name, settings, strategy, overrides) run with its seeds, summarized.

    A row runs with its first seed; when the settings its requests ran with draw from the seed
    (`ran_sampled`: whatever made them, the row's strategy or the task's `do_sample`), it runs
    with the rest of its `counts[name]` seeds (first_seed, first_seed+1, ...) too; a
    deterministic row runs once (more runs would repeat it exactly). Each progress bar names
    the row, the seed and `context` (a sweep's value)."""
    rows = []
    for number, (name, _settings, strategy, overrides) in enumerate(planned, 1):
        label = (f"{name} {context}".strip(), f"row {number}/{len(planned)}")
        seeds = [first_seed + i for i in range(counts.get(name, 1))]
        runs = [_labelled_run(lm, args, strategy, overrides, seeds[0], label)]
        if ran_sampled(runs[0]["settings"]):
            runs += [
                _labelled_run(lm, args, strategy, overrides, seed, label) for seed in seeds[1:]
            ]
        else:
            seeds = seeds[:1]
        rows.append(summarize_row(name, seeds, runs))
    return rows


def _labelled_run(
    lm: Any,
    args: argparse.Namespace,
    strategy: str,
    overrides: dict[str, Any],
    seed: int,
    label: tuple[str, str],
) -> dict[str, Any]:
    """`_run`, its progress bars named "ROW, seed S, row I/N" (`label`: the row, its position)."""
    lm.progress_label = f"{label[0]}, seed {seed}, {label[1]}"
    try:
        return _run(lm, args, strategy, overrides, seed)
    finally:
        lm.progress_label = None


class _Once(logging.Filter):
    """Lets each distinct message through once (see `lm_eval_messages_once`)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if text in self.seen:
            return False
        self.seen.add(text)
        return True


# the lm-eval loggers that repeat a message at every evaluation: the task loader's `--metadata`
# hint (our tasks build their data in Python) and the evaluator's --gen_kwargs note
_REPEATING_LOGGERS = ("lm_eval.api.task", "lm_eval.evaluator")


@contextlib.contextmanager
def lm_eval_messages_once() -> Any:
    """While compare runs its rows, each distinct message of lm-eval's task loader and
    evaluator is shown once, not once per row and seed."""
    once = _Once()
    loggers = [logging.getLogger(name) for name in _REPEATING_LOGGERS]
    for logger in loggers:
        logger.addFilter(once)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(once)


def sweep_summary(
    name: str, results: Sequence[tuple[Any, Sequence[Mapping[str, Any]]]]
) -> dict[str, Any]:
    """compare.json's `sweep`: {"name", "values", "rows": {row: [one entry per value]}, "paired"}.

    An entry is the row's figures at that value: `value`, `accuracy_mean`, `accuracy_std`
    (None for one run), `nfe_mean`, then as a row of the table without a sweep (`accuracies`,
    `nfes`, `seeds`, `mean_samples`, `seconds`, `settings`, `per_document`, ...). `paired`
    lists dvoting - majority-entropy at each value when both rows ran; `against_first`, per row,
    each later value against the first (`value_against_first`)."""
    rows: dict[str, list[dict[str, Any]]] = {}
    paired = []
    for value, summaries in results:
        for summary in summaries:
            figures = {
                k: v for k, v in summary.items() if k not in ("strategy", "accuracy", "mean_nfe")
            }
            rows.setdefault(summary["strategy"], []).append(
                {
                    "value": value,
                    "accuracy_mean": summary["accuracy"],
                    "accuracy_std": summary["accuracy_std"],
                    "nfe_mean": summary["mean_nfe"],
                    **figures,
                }
            )
        pair = paired_comparison(summaries)
        if pair is not None:
            paired.append({"value": value, **pair})
    against = {row: value_against_first(entries) for row, entries in rows.items()}
    return {
        "name": name,
        "values": [value for value, _ in results],
        "rows": rows,
        "paired": paired,
        "against_first": {row: pairs for row, pairs in against.items() if pairs},
    }


def value_against_first(entries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A row's later values against its first, paired over problems (`paired_bootstrap`):
    the sweep runs every value on the same documents with the same seeds."""
    first = entries[0]
    return [
        {
            "value": entry["value"],
            "against": first["value"],
            **paired_bootstrap(entry["per_document"], first["per_document"]),
        }
        for entry in entries[1:]
        if entry.get("per_document")
        and first.get("per_document")
        and entry["seeds"] == first["seeds"]
    ]


def accuracy_cell(row: Mapping[str, Any]) -> str:
    """ "mean ± std" over the row's seeds, or the one run's accuracy."""
    if row.get("accuracy_std") is None:
        return f"{row['accuracy']:.2f}"
    return f"{row['accuracy']:.2f} ± {row['accuracy_std']:.2f}"


def runs_cell(row: Mapping[str, Any]) -> str:
    """How often the row ran: "3 seeds", "1 seed", or "1 (greedy)" for a deterministic row."""
    if not row.get("sampled", True):
        return "1 (greedy)"
    count = len(row.get("seeds", [None]))
    return f"{count} seed{'s' if count > 1 else ''}"


def _short_accuracy(row: Mapping[str, Any]) -> str:
    """The accuracy to one decimal, with its std over seeds when there is one (plot legend)."""
    std = row.get("accuracy_std")
    return f"{row['accuracy']:.1f}" + ("" if std is None else f" ± {std:.1f}")


# under the table: what the BPC column holds, and why some of its cells are empty
BPC_NOTE = (
    "BPC vs single: (accuracy - single's) / (mean NFE / single's mean NFE), in points, "
    "for rows with at least single's mean NFE; empty for cheaper rows, where dividing by a "
    "cost ratio below 1 would magnify the accuracy difference rather than charge for cost "
    "(read their accuracy and NFE directly)."
)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The comparison as Markdown; BPC against the `single` row (on the means) when there is one,
    for rows at least as costly (`benefit_per_cost_if_costlier`), explained under the table."""
    from lm_eval_dvoting.core.metrics import benefit_per_cost_if_costlier

    single = next((r for r in rows if r["strategy"] == "single"), None)
    lines = [
        "| strategy | accuracy (%) | runs | mean NFE | samples / question | seconds | BPC vs "
        "single |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        bpc = "-"
        if single is not None and row is not single:
            value = benefit_per_cost_if_costlier(
                row["accuracy"], single["accuracy"], row["mean_nfe"], single["mean_nfe"]
            )
            bpc = "" if value is None else f"{value:.2f}"
        lines.append(
            f"| {row['strategy']} | {accuracy_cell(row)} | {runs_cell(row)} | "
            f"{row['mean_nfe']:.1f} | {row['mean_samples']:.2f} | {row['seconds']:.1f} | {bpc} |"
        )
    if single is not None:
        lines += ["", BPC_NOTE]
    return "\n".join(lines)


def sweep_tables(sweep: Mapping[str, Any]) -> str:
    """One Markdown table per row: the swept value, accuracy, runs, mean NFE, samples, seconds;
    the dvoting - majority-entropy line per value under them when both rows ran."""
    name = sweep["name"]
    parts = []
    for row, entries in sweep["rows"].items():
        lines = [
            f"### {row}, {name} swept",
            "",
            f"| {name} | accuracy (%) | runs | mean NFE | samples / question | seconds |",
            "|---|---|---|---|---|---|",
        ]
        for entry in entries:
            cell = accuracy_cell(
                {"accuracy": entry["accuracy_mean"], "accuracy_std": entry["accuracy_std"]}
            )
            lines.append(
                f"| {entry['value']} | {cell} | {runs_cell(entry)} | {entry['nfe_mean']:.1f} | "
                f"{entry['mean_samples']:.2f} | {entry['seconds']:.1f} |"
            )
        for pair in sweep.get("against_first", {}).get(row, []):
            low, high = pair["ci_points"]
            lines += [
                "",
                f"{name}={pair['value']} - {name}={pair['against']}: {pair['mean_points']:+.1f} "
                f"points, {100 * pair['confidence']:.0f}% CI [{low:+.1f}, {high:+.1f}] (paired "
                f"bootstrap over {pair['problems']} problems)",
            ]
        parts.append("\n".join(lines))
    parts += [f"{name}={pair['value']}: {paired_line(pair)}" for pair in sweep.get("paired", [])]
    return "\n\n".join(parts)


def _nfe_axis(ax: Any) -> None:
    """The x axis of both plots: mean NFE per question on a log scale, plain 1-2-5 labels."""
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    ax.set_xscale("log")  # costs span two orders of magnitude (dVoting ... HEX)
    # plain numbers at 1-2-5 steps: the default 3x10^1-style minor labels run into each other
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("mean forward passes (NFE) per question, log scale")
    ax.set_ylabel("accuracy (%)")


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Accuracy against mean NFE, one labelled point per row (mean over seeds, ±std bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    markers = "osD^vP*X"
    for i, row in enumerate(rows):
        # a legend, not annotations: points of cheap strategies sit close together
        # the error bar: +-1 std of the accuracy over seeds, when the row ran with several
        ax.errorbar(
            row["mean_nfe"],
            row["accuracy"],
            yerr=row.get("accuracy_std"),
            capsize=3,
            fmt=markers[i % len(markers)],
            markersize=7,
            label=f"{row['strategy']} ({_short_accuracy(row)}%, {row['mean_nfe']:.0f} NFE)",
        )
    _nfe_axis(ax)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _label_values(
    ax: Any, entries: Sequence[Mapping[str, Any]], nfes, accuracies, lift: int, colour: str
) -> None:
    """Each point of a row's line labelled with its swept value(s).

    Values that land on one point share a label; each row's labels are in its colour, at
    its own height (`lift` points up), so labels of rows that meet do not cover each other."""
    labels: dict[tuple[float, float], list[str]] = {}
    for entry, x, y in zip(entries, nfes, accuracies):
        labels.setdefault((x, y), []).append(str(entry["value"]))
    for (x, y), values in labels.items():
        ax.annotate(
            ", ".join(values),
            (x, y),
            textcoords="offset points",
            xytext=(5, lift),
            fontsize=7,
            color=colour,
        )


def plot_sweep(sweep: Mapping[str, Any], path: Path, title: str) -> None:
    """Accuracy against mean NFE, one line per row through its swept values (in the order
    given), each point labelled with its value (mean over seeds, ±std bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    markers = "osD^vP*X"
    for i, (row, entries) in enumerate(sweep["rows"].items()):
        nfes = [entry["nfe_mean"] for entry in entries]
        accuracies = [entry["accuracy_mean"] for entry in entries]
        stds = [entry["accuracy_std"] or 0.0 for entry in entries]
        line = ax.errorbar(
            nfes,
            accuracies,
            yerr=stds if any(stds) else None,
            capsize=3,
            fmt="-" + markers[i % len(markers)],
            markersize=6,
            label=row,
        )
        _label_values(ax, entries, nfes, accuracies, 5 - 9 * (i % 4), line[0].get_color())
    _nfe_axis(ax)
    ax.legend(fontsize=8, loc="best", title=f"points: {sweep['name']}", title_fontsize=8)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    comparison = compare(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    header = (
        f"{args.model} ({args.model_args}) on {args.tasks}, limit {args.limit}, "
        f"seeds {comparison['seeds']}"
    )
    if "sweep" in comparison:
        sweep = comparison["sweep"]
        header += f", {sweep['name']} swept over {sweep['values']}"
        table = sweep_tables(sweep)
        figure = out / "sweep.png"
        plot_sweep(sweep, figure, f"{args.tasks}: accuracy vs NFE, {sweep['name']} swept")
    else:
        rows, paired = comparison["rows"], comparison["paired"]
        table = markdown_table(rows)
        if paired is not None:
            table += "\n\n" + paired_line(paired)
        figure = out / "accuracy_vs_nfe.png"
        plot(rows, figure, f"{args.tasks}: accuracy vs NFE")
    (out / "compare.md").write_text(f"{header}\n\n{table}\n")
    # standard JSON (strict_json): alpha=inf as "inf", a missing per-document score as null
    (out / "compare.json").write_text(strict_dumps(comparison, indent=2) + "\n")
    print(header)
    print(table)
    print(f"written: {out / 'compare.md'}, {out / 'compare.json'}, {figure}")
    return 0
