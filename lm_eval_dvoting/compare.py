"""`dvoting compare`: several strategies on one model and task, through the harness.

    dvoting compare --model_args pretrained=tiny-arith --tasks dvoting_arith

loads the model once, evaluates every row (default: single, single-entropy, majority,
majority-entropy, hex, dvoting) on the same documents with lm-eval's `simple_evaluate`,
prints one Markdown table (accuracy, mean NFE, seconds, benefit per cost against
`single`) and writes the table, the figures (compare.json) and an accuracy-versus-NFE
plot (like the paper's Pareto figure) into `--out`.

The two `-entropy` rows are ablations that split dVoting's gain into its parts:
`single-entropy` is one greedy sample with dVoting's entropy-threshold decoder (the
decoder alone), `majority-entropy` is majority voting with that decoder at dVoting's
temperature (decoder and voting, without dVoting's remasking and early stop). So
dvoting - majority-entropy is what remasking with the early stop adds; `--seeds K`
repeats every sampled row with K sampling seeds and gives that difference a paired
bootstrap interval over the problems.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from .strategies import StrategySettings

# The rows `--strategies` may name, in the default order. A row is a strategy plus
# overrides of its settings (`row_overrides`); the `-entropy` rows are the ablations.
ROWS = ("single", "single-entropy", "majority", "majority-entropy", "hex", "dvoting")
# The paired comparison: dVoting against the row that has its decoder, temperature and
# n samples but neither remasking nor the early stop.
PAIRED = ("dvoting", "majority-entropy")
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0  # fixed, so the interval of a given compare.json repeats exactly


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dvoting compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="dvoting-llada", choices=["dvoting-llada", "dvoting-dream"])
    parser.add_argument("--model_args", default="pretrained=tiny-arith",
                        help="comma-separated key=value model args shared by every strategy")
    parser.add_argument("--tasks", default="dvoting_arith", help="one task name")
    parser.add_argument("--strategies", default=",".join(ROWS),
                        help=f"comma-separated rows, from {', '.join(ROWS)}")
    parser.add_argument("--seeds", type=int, default=1,
                        help="sampling seeds per sampled row (seed, seed+1, ...; the model's seed first); "
                             "greedy rows run once")
    parser.add_argument("--limit", type=float, default=None, help="documents per task (as lm_eval --limit)")
    parser.add_argument("--batch_size", default=None,
                        help=f"rows decoded per forward pass, or 'auto' (default {DEFAULT_BATCH_SIZE})")
    parser.add_argument("--device", default=None,
                        help="cpu, cuda, cuda:1, ... (default: CUDA when there is one, else the CPU)")
    parser.add_argument("--gen_kwargs", default=None, help="as lm_eval --gen_kwargs")
    parser.add_argument("--apply_chat_template", action="store_true")
    parser.add_argument("--out", default="dvoting_compare", help="folder for table, JSON and plot")
    return parser.parse_args(argv)


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
            raise SystemExit(f"dvoting compare: {key}={merged[key]!r} in --model_args conflicts with "
                             f"--{key} {value}: give {key} in one place only")
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
    """Our tasks alone when `task` is one of ours (indexing lm-eval's ~15,000 stock task
    files takes many seconds); every task otherwise."""
    import re

    from lm_eval.tasks import TaskManager

    from .plugin import task_dir

    folder = task_dir()
    declares = re.compile(rf"^(task|group):\s*{re.escape(task)}\s*$", re.MULTILINE)
    ours = any(declares.search(p.read_text()) for p in folder.glob("*.yaml"))
    return TaskManager(include_path=str(folder), include_defaults=not ours)


def _evaluate(lm: Any, args: argparse.Namespace) -> dict[str, Any]:
    import lm_eval

    return lm_eval.simple_evaluate(
        model=lm, tasks=[args.tasks], limit=args.limit, task_manager=_task_manager(args.tasks),
        gen_kwargs=args.gen_kwargs, apply_chat_template=args.apply_chat_template,
        log_samples=True,  # the per-document scores the paired comparison needs
    )


# ------------------------------------------------------------------ rows and seeds


def parse_rows(text: str) -> list[str]:
    """The rows `--strategies` names, in its order; SystemExit for unknown or repeated ones."""
    rows = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        raise SystemExit(f"dvoting compare: unknown strategies {unknown} in --strategies; "
                         f"choose rows from {', '.join(ROWS)}")
    if not rows:
        raise SystemExit(f"dvoting compare: --strategies {text!r} names no row; choose from {', '.join(ROWS)}")
    repeated = sorted({r for r in rows if rows.count(r) > 1})
    if repeated:
        raise SystemExit(f"dvoting compare: --strategies names {repeated} more than once; name each row once "
                         "(use --seeds K to repeat sampled rows)")
    return rows


def check_shared_model_args(model_args: Mapping[str, Any]) -> None:
    """Refuse the model args that each row sets itself (`--model_args` apply to every row)."""
    if "strategy" in model_args:
        raise SystemExit("dvoting compare: give strategies with --strategies, not in --model_args")
    if "decoder" in model_args:
        raise SystemExit(f"dvoting compare: decoder={model_args['decoder']!r} in --model_args would apply to every "
                         "row, but each row sets its own decoder; leave it out and name single-entropy or "
                         f"majority-entropy in --strategies for the entropy decoder (rows: {', '.join(ROWS)})")


def check_seeds(seeds: int) -> None:
    """`--seeds` must be a whole number >= 1."""
    if seeds < 1:
        raise SystemExit(f"dvoting compare: --seeds must be >= 1, got {seeds}: the number of sampling seeds "
                         "per sampled row, e.g. --seeds 3 (default 1)")


def row_overrides(row: str, base: StrategySettings) -> tuple[str, dict[str, Any]]:
    """The strategy and the setting overrides row `row` runs with, on the model's settings `base`.

    The overrides always set `decoder` and `temperature` (to `base`'s own when the row keeps
    them), so a row's settings are complete in themselves and never depend on the row
    before it (`use_strategy` also starts from the model's built settings).
    """
    strategy, _, variant = row.partition("-")
    overrides: dict[str, Any] = {"decoder": base.decoder, "temperature": base.temperature}
    if not variant:
        return strategy, overrides
    overrides["decoder"] = "entropy"
    if strategy == "majority":
        # dVoting's temperature (the model arg's, else dVoting's default): majority-entropy then
        # differs from dvoting only in remasking and the early stop
        overrides["temperature"] = replace(base, strategy="dvoting").resolved_temperature
    return strategy, overrides


def row_settings(row: str, base: StrategySettings) -> StrategySettings:
    """The settings row `row` runs with (checked: SystemExit naming the row when they are invalid)."""
    strategy, overrides = row_overrides(row, base)
    try:
        return replace(base, strategy=strategy, **overrides)
    except ValueError as err:
        raise SystemExit(f"dvoting compare: row {row!r} cannot run with these --model_args: {err}") from err


def is_sampled(settings: StrategySettings) -> bool:
    """Whether a row's results depend on the sampling seed: a temperature above 0, or the
    fixed schedule's random remasking. Anything else is deterministic and runs once."""
    random_order = settings.resolved_decoder == "fixed" and settings.remasking == "random"
    return settings.resolved_temperature > 0 or random_order


def run_seeds(settings: StrategySettings, first_seed: int, count: int) -> list[int]:
    """The sampling seeds a row runs with: first_seed .. first_seed+count-1, or just
    first_seed for a deterministic row (more runs would repeat it exactly)."""
    return [first_seed + i for i in range(count)] if is_sampled(settings) else [first_seed]


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
            raise ValueError(f"document {doc_id} of {task} was scored twice under filter {filter_name!r}")
        scores[doc_id] = float(sample[metric])
    return scores


def mean_and_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (ddof=1) of the runs; None for one run."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


# -------------------------------------------------------------- paired bootstrap


def paired_bootstrap(first: Mapping[int, Sequence[float]], second: Mapping[int, Sequence[float]],
                     resamples: int = BOOTSTRAP_RESAMPLES, rng_seed: int = BOOTSTRAP_SEED,
                     confidence: float = 0.95) -> dict[str, Any]:
    """Mean difference first - second in points, with a percentile bootstrap interval over problems.

    `first` and `second` map each problem (doc_id) to its scores (0/1, or a fraction), one
    per run (seed). A problem's difference is the mean of its first-row scores minus the
    mean of its second-row scores (with the same seeds in both rows: the per-seed
    difference averaged over seeds); problems are paired by key, never by position, and
    resampled with replacement `resamples` times from a numpy generator seeded `rng_seed`.
    """
    import numpy as np

    if set(first) != set(second):
        only_first, only_second = len(set(first) - set(second)), len(set(second) - set(first))
        raise ValueError(f"the two rows were scored on different problems ({only_first} only in the first, "
                         f"{only_second} only in the second): run them on the same documents")
    if not first:
        raise ValueError("no problems to compare: the rows have no per-document scores")
    if resamples < 1 or not 0 < confidence < 1:
        raise ValueError(f"need resamples >= 1 and 0 < confidence < 1, got {resamples} and {confidence}")
    problems = sorted(first)  # a fixed order, so the same seed draws the same resamples
    diffs = 100 * np.array([statistics.fmean(first[p]) - statistics.fmean(second[p]) for p in problems])
    rng = np.random.default_rng(rng_seed)
    means = np.empty(resamples)
    chunk = max(1, 2_000_000 // len(diffs))  # bounded memory for large tasks
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        means[start:start + size] = diffs[rng.integers(0, len(diffs), size=(size, len(diffs)))].mean(1)
    low, high = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return {"mean_points": float(diffs.mean()), "ci_points": [float(low), float(high)],
            "confidence": confidence, "problems": len(diffs), "resamples": resamples, "rng_seed": rng_seed}


def paired_comparison(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """dvoting - majority-entropy (`PAIRED`) when both rows ran and were scored per document."""
    by_name = {row["strategy"]: row for row in rows}
    if not all(name in by_name and by_name[name]["per_document"] for name in PAIRED):
        return None
    first, second = (by_name[name] for name in PAIRED)
    return {"first": PAIRED[0], "second": PAIRED[1],
            "runs": {PAIRED[0]: len(first["seeds"]), PAIRED[1]: len(second["seeds"])},
            **paired_bootstrap(first["per_document"], second["per_document"])}


def paired_line(paired: Mapping[str, Any]) -> str:
    """The paired comparison in one line, for under the table."""
    low, high = paired["ci_points"]
    runs = sorted(set(paired["runs"].values()))
    seeds = f"{runs[0]} seed{'s' if runs[0] > 1 else ''}" if len(runs) == 1 else \
        ", ".join(f"{name} {count} run(s)" for name, count in paired["runs"].items())
    return (f"{paired['first']} - {paired['second']}: {paired['mean_points']:+.1f} points, "
            f"{100 * paired['confidence']:.0f}% CI [{low:+.1f}, {high:+.1f}] "
            f"(paired bootstrap over {paired['problems']} problems, {seeds})")


# --------------------------------------------------------------------- the runs


def _run(lm: Any, args: argparse.Namespace, strategy: str, overrides: dict[str, Any], seed: int) -> dict[str, Any]:
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
    return {
        "accuracy": 100 * task_results[key],
        # per question (document, all its repeats), as the column says; totals' means are per request
        "nfe": totals["nfe"] / questions if questions else float("nan"),
        "samples": totals["samples"] / questions if questions else float("nan"),
        "seconds": seconds,
        "questions": questions,
        "metric": key,
        # what the requests ran with (the task's max_gen_toks), not the model args' defaults
        "settings": info["settings_used"] or [info["settings"]],
        "per_document": per_document(results, args.tasks, key),
    }


def summarize_row(name: str, settings: StrategySettings, seeds: Sequence[int],
                  runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One row of figures from its runs (one per seed): means, the std of the accuracy over
    seeds, and the per-seed figures they come from."""
    accuracy, std = mean_and_std([run["accuracy"] for run in runs])
    settings_used: list[dict[str, Any]] = []
    for run in runs:
        settings_used += [s for s in run["settings"] if s not in settings_used]
    return {
        "strategy": name,  # the row's name (e.g. majority-entropy); its settings say the rest
        "decoder": settings.resolved_decoder,
        "temperature": settings.resolved_temperature,
        "sampled": is_sampled(settings),
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
        # each document's score per seed, in the order of "seeds"
        "per_document": {doc: [run["per_document"].get(doc, math.nan) for run in runs]
                         for doc in runs[0]["per_document"]},
    }


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate each row with its seeds: {"rows": [...], "paired": {...} or None, "seeds": [...]}."""
    from .harness import DreamEvalModel, LLaDAEvalModel
    from .plugin import register

    register()
    model_class = LLaDAEvalModel if args.model == "dvoting-llada" else DreamEvalModel
    model_args = _parse_model_args(args.model_args)
    # every check on the command line before the model is loaded
    check_shared_model_args(model_args)
    names = parse_rows(args.strategies)
    check_seeds(args.seeds)
    lm = model_class(**model_kwargs(model_args, args))
    first_seed = lm.seed  # the model arg seed, else lm-eval's default
    base = lm.settings  # the model args' settings; every row's are derived from these
    # each row's settings checked before any evaluation
    planned = [(name, row_settings(name, base)) for name in names]
    rows = []
    for name, settings in planned:
        strategy, overrides = row_overrides(name, base)
        seeds = run_seeds(settings, first_seed, args.seeds)
        runs = [_run(lm, args, strategy, overrides, seed) for seed in seeds]
        rows.append(summarize_row(name, settings, seeds, runs))
    return {"rows": rows, "paired": paired_comparison(rows),
            "seeds": [first_seed + i for i in range(args.seeds)]}


def accuracy_cell(row: Mapping[str, Any]) -> str:
    """"mean ± std" over the row's seeds, or the one run's accuracy."""
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


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The comparison as Markdown; BPC against the `single` row (on the means) when there is one."""
    from .metrics import benefit_per_cost

    single = next((r for r in rows if r["strategy"] == "single"), None)
    lines = [
        "| strategy | accuracy (%) | runs | mean NFE | samples / question | seconds | BPC vs single |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        bpc = "-"
        if single is not None and row is not single:
            bpc = f"{benefit_per_cost(row['accuracy'], single['accuracy'], row['mean_nfe'], single['mean_nfe']):.2f}"
        lines.append(
            f"| {row['strategy']} | {accuracy_cell(row)} | {runs_cell(row)} | {row['mean_nfe']:.1f} | "
            f"{row['mean_samples']:.2f} | {row['seconds']:.1f} | {bpc} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Accuracy against mean NFE, one labelled point per row (mean over seeds, ±std bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    fig, ax = plt.subplots(figsize=(6, 4))
    markers = "osD^vP*X"
    for i, row in enumerate(rows):
        # a legend, not annotations: points of cheap strategies sit close together
        # the error bar: +-1 std of the accuracy over seeds, when the row ran with several
        ax.errorbar(row["mean_nfe"], row["accuracy"], yerr=row.get("accuracy_std"), capsize=3,
                    fmt=markers[i % len(markers)], markersize=7,
                    label=f"{row['strategy']} ({_short_accuracy(row)}%, {row['mean_nfe']:.0f} NFE)")
    ax.set_xscale("log")  # costs span two orders of magnitude (dVoting ... HEX)
    # plain numbers at 1-2-5 steps: the default 3x10^1-style minor labels run into each other
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("mean forward passes (NFE) per question, log scale")
    ax.set_ylabel("accuracy (%)")
    ax.legend(fontsize=8, loc="best")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    comparison = compare(args)
    rows, paired = comparison["rows"], comparison["paired"]
    table = markdown_table(rows)
    if paired is not None:
        table += "\n\n" + paired_line(paired)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    header = f"{args.model} ({args.model_args}) on {args.tasks}, limit {args.limit}, seeds {comparison['seeds']}"
    (out / "compare.md").write_text(f"{header}\n\n{table}\n")
    (out / "compare.json").write_text(json.dumps(comparison, indent=2) + "\n")
    plot(rows, out / "accuracy_vs_nfe.png", f"{args.tasks}: accuracy vs NFE")
    print(header)
    print(table)
    print(f"written: {out / 'compare.md'}, {out / 'compare.json'}, {out / 'accuracy_vs_nfe.png'}")
    return 0
