"""`dvoting compare`: several strategies on one model and task, through the harness.

    dvoting compare --model_args pretrained=tiny-arith --tasks dvoting_arith

loads the model once, evaluates every strategy (default: single, majority, hex,
dvoting) on the same documents with lm-eval's `simple_evaluate`, prints one Markdown
table (accuracy, mean NFE, seconds, benefit per cost against `single`) and writes the
table, the raw results and an accuracy-versus-NFE plot (like the paper's Pareto
figure) into `--out`.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Sequence

from .strategies import STRATEGIES


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="dvoting compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="dvoting-llada", choices=["dvoting-llada", "dvoting-dream"])
    parser.add_argument("--model_args", default="pretrained=tiny-arith",
                        help="comma-separated key=value model args shared by every strategy")
    parser.add_argument("--tasks", default="dvoting_arith", help="one task name")
    parser.add_argument("--strategies", default=",".join(STRATEGIES),
                        help=f"comma-separated, from {', '.join(STRATEGIES)}")
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
    )


def compare(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Evaluate each strategy; one row of figures per strategy."""
    from .harness import DreamEvalModel, LLaDAEvalModel
    from .plugin import register

    register()
    model_class = LLaDAEvalModel if args.model == "dvoting-llada" else DreamEvalModel
    model_args = _parse_model_args(args.model_args)
    if "strategy" in model_args:
        raise SystemExit("dvoting compare: give strategies with --strategies, not in --model_args")
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = sorted(set(strategies) - set(STRATEGIES))
    if unknown:
        raise SystemExit(f"dvoting compare: unknown strategies {unknown}; choose from {', '.join(STRATEGIES)}")
    lm = model_class(**model_kwargs(model_args, args))
    rows = []
    for strategy in strategies:
        lm.use_strategy(strategy)
        started = time.perf_counter()
        results = _evaluate(lm, args)
        seconds = time.perf_counter() - started
        task_results = results["results"][args.tasks]
        key = accuracy_key(task_results)
        info = lm.get_model_info()["dvoting"]
        totals = info["totals"]
        questions = totals.get("questions") or 0
        rows.append({
            "strategy": strategy,
            "accuracy": 100 * task_results[key],
            # per question (document, all its repeats), as the column says; totals' means are per request
            "mean_nfe": totals["nfe"] / questions if questions else float("nan"),
            "mean_samples": totals["samples"] / questions if questions else float("nan"),
            "seconds": seconds,
            "questions": questions,
            "metric": key,
            # what the requests ran with (the task's max_gen_toks), not the model args' defaults
            "settings": info["settings_used"] or [info["settings"]],
        })
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The comparison as Markdown; BPC against the `single` row when there is one."""
    from .metrics import benefit_per_cost

    single = next((r for r in rows if r["strategy"] == "single"), None)
    lines = [
        "| strategy | accuracy (%) | mean NFE | samples / question | seconds | BPC vs single |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        bpc = "-"
        if single is not None and row is not single:
            bpc = f"{benefit_per_cost(row['accuracy'], single['accuracy'], row['mean_nfe'], single['mean_nfe']):.2f}"
        lines.append(
            f"| {row['strategy']} | {row['accuracy']:.2f} | {row['mean_nfe']:.1f} | "
            f"{row['mean_samples']:.2f} | {row['seconds']:.1f} | {bpc} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Accuracy against mean NFE, one labelled point per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    fig, ax = plt.subplots(figsize=(6, 4))
    markers = "osD^vP*X"
    for i, row in enumerate(rows):
        # a legend, not annotations: points of cheap strategies sit close together
        ax.scatter(row["mean_nfe"], row["accuracy"], s=60, marker=markers[i % len(markers)],
                   label=f"{row['strategy']} ({row['accuracy']:.1f}%, {row['mean_nfe']:.0f} NFE)")
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
    rows = compare(args)
    table = markdown_table(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    header = f"{args.model} ({args.model_args}) on {args.tasks}, limit {args.limit}"
    (out / "compare.md").write_text(f"{header}\n\n{table}\n")
    (out / "compare.json").write_text(json.dumps(rows, indent=2) + "\n")
    plot(rows, out / "accuracy_vs_nfe.png", f"{args.tasks}: accuracy vs NFE")
    print(header)
    print(table)
    print(f"written: {out / 'compare.md'}, {out / 'compare.json'}, {out / 'accuracy_vs_nfe.png'}")
    return 0
