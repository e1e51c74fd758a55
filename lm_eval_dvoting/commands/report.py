"""`dvoting report`: why dVoting works on *your* model, from your own harness runs.

    lm_eval --model dvoting-llada --model_args pretrained=M,strategy=single \
        --tasks T --log_samples --output_path out
    lm_eval --model dvoting-llada --model_args pretrained=M,strategy=dvoting \
        --tasks T --log_samples --output_path out
    dvoting report out --out report

reads every run (a `results_*.json` of lm-eval, found in the folders given, or given
directly) and writes into `--out`:

* `report.md`: per run and task, accuracy, mean NFE, samples per question, BPC
  against the single-sample baseline (for runs at least as costly as it:
  `metrics.benefit_per_cost_if_costlier`), NUPR@2 and NUPR@3, mean voting consistency;
  a task that reports its metric under several filters (lm-eval's `gsm8k_cot_zeroshot`:
  `strict-match`, `flexible-extract`) gets one row per filter, named `task (filter)`,
  each with its own accuracy and consistency counts. `questions` counts documents (the
  distinct doc ids logged, else lm-eval's n-samples), never logged lines: lm-eval logs one
  line per document and filter;
  then the distribution of voting consistency levels, correct versus incorrect
  questions (the paper's Table 1 and consistency analysis);
* `accuracy_vs_nfe.png`: accuracy against mean forward passes, one point per run;
* `consistency.png`: the consistency-level distributions as bars;
* for runs with the temporal vote (`strategy=temporal`, `vote=temporal`), a table of
  ever-pass, temporal semantic entropy and the questions the vote overturned against
  the plain vote over the final answers, and `accuracy_by_step.png`: the share of
  decodes right at each point of the decode, the ever-pass rate up to it, and the
  final (plain vote) and temporal-vote accuracies;
* `tokens_<run>_<task>_doc<ID>.html` / `.png` for the chosen questions: every
  candidate's generated tokens, each coloured by how many samples hold the same token
  at that position (the paper's Figure 3b); kept (not remasked) positions are framed.

Definitions: `lm_eval_dvoting.core.metrics` (docs/ALGORITHM.md section 4). NUPR@k averages over
the questions with at least k samples, over every generation position (end-of-text
padding included). In a dVoting run the remask samples copy the positions kept from
the earlier samples, so its NUPR is higher than that of independent samples (a
`majority` run measures the model's own repetition, as the paper's Table 1 does).
A consistency level's denominator is every sample drawn; a sample without an
extractable answer casts no vote. Per-question figures need the run's `--log_samples`
records (with the `dvoting_trace` the dvoting_* tasks write); without them the report
shows accuracy, NFE and BPC only.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from lm_eval_dvoting.core.metrics import (
    benefit_per_cost_if_costlier,
    consistency_from_votes,
    mean_nupr_at_k,
    token_agreement,
)
from lm_eval_dvoting.core.temporal import expand_runs
from lm_eval_dvoting.integration import strict_json

log = logging.getLogger(__name__)

DEFAULT_QUESTIONS = 3  # token pictures for this many questions (the lowest doc ids) by default
PICTURE_WIDTH = 32  # positions per line in the token pictures


# ------------------------------------------------------------------- loading


@dataclass
class TaskRun:
    """One task of one run under one of its filters: its aggregate figures and its logged
    sample records (lm-eval logs one record per document and filter; these are the filter's)."""

    task: str
    accuracy: float | None  # fraction, from the results JSON
    mean_nfe: float | None
    mean_samples: float | None
    records: list[dict[str, Any]] = field(default_factory=list)
    # the filter the accuracy is reported under (lm-eval's "exact_match,<filter>"); None: none given
    filter: str | None = None
    several_filters: bool = False  # the task reports its metric under more than one filter
    documents: int | None = None  # lm-eval's n-samples (effective) for the task, when it wrote one

    @property
    def name(self) -> str:
        """The task, and its filter when it has several: "gsm8k_cot_zeroshot (strict-match)"."""
        return f"{self.task} ({self.filter})" if self.several_filters else self.task

    @property
    def questions(self) -> int | None:
        """Documents scored: the distinct doc ids logged (never the logged lines, which a task
        with several filters writes once per filter), else lm-eval's n-samples."""
        if self.records:
            return len({record.get("doc_id") for record in self.records})
        return self.documents

    def traces(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(record, trace) of every logged question that carries a dVoting trace."""
        return [
            (r, r["dvoting_trace"])
            for r in self.records
            if isinstance(r.get("dvoting_trace"), dict)
        ]


@dataclass
class Run:
    """One lm-eval results file and its samples."""

    path: Path
    config: dict[str, Any]
    tasks: dict[str, TaskRun]
    label: str = ""

    @property
    def dvoting(self) -> dict[str, Any]:
        return self.config.get("dvoting") or {}

    @property
    def strategy(self) -> str | None:
        settings = self.dvoting.get("settings") or {}
        return settings.get("strategy") or self.model_args.get("strategy")

    @property
    def model_args(self) -> dict[str, Any]:
        args = self.config.get("model_args") or {}
        if isinstance(args, str):  # older lm-eval writes the raw "a=1,b=2" string
            args = dict(part.split("=", 1) for part in args.split(",") if "=" in part)
        return args

    @property
    def pretrained(self) -> str | None:
        return self.dvoting.get("pretrained") or self.model_args.get("pretrained")


def find_results(paths: Sequence[str | Path]) -> list[Path]:
    """Every results JSON under `paths` (files are taken as given), in time order."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found += sorted(path.rglob("results_*.json"))
        elif path.is_file():
            found.append(path)
        else:
            raise FileNotFoundError(f"no such file or folder: {path}")
    unique = list(dict.fromkeys(p.resolve() for p in found))
    if not unique:
        raise FileNotFoundError(f"no lm-eval results_*.json under {', '.join(map(str, paths))}")
    return sorted(unique, key=lambda p: (_date_id(p), str(p)))


def _date_id(results_file: Path) -> str:
    # lm-eval names both files with the same time stamp: results_<date>.json and
    # samples_<task>_<date>.jsonl (also for --output_path NAME.json: NAME_<date>.json)
    return results_file.stem.rsplit("_", 1)[-1]


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _metric(
    task_results: dict[str, Any], name: str, filter_name: str | None = None
) -> float | None:
    """The value of metric `name` under `filter_name` (else under any filter)."""
    found = {
        key.partition(",")[2]: float(value)
        for key, value in task_results.items()
        if key.partition(",")[0] == name and isinstance(value, (int, float))
    }
    if filter_name in found:
        return found[filter_name]
    return next(iter(found.values()), None)


def _filters(task_results: dict[str, Any], metric: str) -> list[str]:
    """The filters a task reports `metric` under ("exact_match,strict-match" -> strict-match)."""
    return [
        key.partition(",")[2]
        for key, value in task_results.items()
        if key.partition(",")[0] == metric and isinstance(value, (int, float))
    ]


def _filter_records(records: list[dict[str, Any]], filter_name: str) -> list[dict[str, Any]]:
    """The records logged under `filter_name` (records without a filter field: all of them)."""
    return [r for r in records if r.get("filter", filter_name) == filter_name]


def load_run(results_file: Path, metric: str = "exact_match") -> Run:
    """One results JSON and its samples files: a `TaskRun` per task and filter of `metric`."""
    data = json.loads(results_file.read_text(encoding="utf-8"))
    date = _date_id(results_file)
    samples: dict[str, list[dict[str, Any]]] = {}
    for sample_file in results_file.parent.glob(f"samples_*_{date}.jsonl"):
        task = sample_file.name[len("samples_") : -len(f"_{date}.jsonl")]
        samples[task] = _read_jsonl(sample_file)
    config = data.get("config") or {}
    totals = (config.get("dvoting") or {}).get("totals") or {}
    tasks = {}
    for task, task_results in (data.get("results") or {}).items():
        filters = _filters(task_results, metric)
        documents = ((data.get("n-samples") or {}).get(task) or {}).get("effective")
        for filter_name in filters:
            mean_nfe = _metric(task_results, "nfe", filter_name)
            mean_samples = _metric(task_results, "n_samples", filter_name)
            if mean_nfe is None and len(data["results"]) == 1:
                mean_nfe, mean_samples = totals.get("mean_nfe"), totals.get("mean_samples")
            run = TaskRun(
                task,
                _metric(task_results, metric, filter_name),
                mean_nfe,
                mean_samples,
                _filter_records(samples.get(task, []), filter_name),
                filter_name,
                len(filters) > 1,
                documents,
            )
            tasks[run.name] = run
    return Run(results_file, config, tasks)


def _short_label(run: Run) -> str:
    strategy = run.strategy or str(run.config.get("model", "run"))
    settings = run.dvoting.get("settings") or {}
    if strategy in ("dvoting", "majority") and settings.get("n") is not None:
        return f"{strategy} n={settings['n']}"
    if strategy == "hex" and settings.get("hex_samples") is not None:
        return f"hex {settings['hex_samples']}"
    return strategy


def label_runs(runs: list[Run]) -> None:
    """Short unique labels: the strategy (and n), the model when runs differ in it,
    then the file's time stamp when two runs would still share a label."""
    models = {run.pretrained for run in runs}
    for run in runs:
        label = _short_label(run)
        if len(models) > 1 and run.pretrained:
            label = f"{Path(str(run.pretrained)).name} {label}"
        run.label = label
    counts = Counter(run.label for run in runs)
    for run in runs:
        if counts[run.label] > 1:
            run.label = f"{run.label} ({_date_id(run.path)[:19]})"


def pick_baseline(runs: list[Run], choice: str | None) -> Run | None:
    """The single-sample run BPC is measured against.

    `choice`: a run's label, its results file (or a folder holding exactly one run),
    or its 1-based position in the report; default: the first run whose strategy is
    `single`, else none (no BPC).
    """
    if choice is None:
        return next((run for run in runs if run.strategy == "single"), None)
    for run in runs:
        if choice == run.label:
            return run
    path = Path(choice)
    if path.exists():
        matches = [
            run for run in runs if run.path == path.resolve() or path.resolve() in run.path.parents
        ]
        if len(matches) == 1:
            return matches[0]
    if choice.isdigit() and 1 <= int(choice) <= len(runs):
        return runs[int(choice) - 1]
    raise SystemExit(
        f"dvoting report: --baseline {choice!r} names no run; runs: "
        + ", ".join(f"{i}: {run.label}" for i, run in enumerate(runs, 1))
    )


# ------------------------------------------------------------------- figures


@dataclass
class Row:
    run: Run
    task: TaskRun
    bpc: float | None
    nupr2: float | None
    nupr3: float | None
    consistency: list[tuple[float, bool]]  # (level, correct) per traced question


def _question_tokens(trace: dict[str, Any]) -> list[list[int]] | None:
    tokens = [c.get("tokens") for c in trace.get("candidates", [])]
    if not tokens or any(t is None for t in tokens) or len({len(t) for t in tokens}) != 1:
        return None
    return tokens


def _level(trace: dict[str, Any]) -> float | None:
    candidates = trace.get("candidates") or []
    if not candidates:
        return None
    # the temporal vote's `votes` are weights: the level counts the samples' final answers
    votes = trace["plain_votes"] if "plain_votes" in trace else trace.get("votes")
    return consistency_from_votes(votes or {}, len(candidates))


def build_rows(runs: list[Run], baseline: Run | None, metric: str = "exact_match") -> list[Row]:
    rows = []
    for run in runs:
        for task in run.tasks.values():
            bpc = None
            base = baseline.tasks.get(task.name) if baseline is not None else None
            if (
                base is not None
                and run is not baseline
                and None not in (task.accuracy, base.accuracy, task.mean_nfe, base.mean_nfe)
            ):
                # None for a run cheaper than the baseline (metrics.benefit_per_cost_if_costlier)
                bpc = benefit_per_cost_if_costlier(
                    100 * task.accuracy, 100 * base.accuracy, task.mean_nfe, base.mean_nfe
                )
            traced = task.traces()
            token_lists = [
                t for t in (_question_tokens(trace) for _, trace in traced) if t is not None
            ]
            consistency = []
            for record, trace in traced:
                level = _level(trace)
                if level is not None and metric in record:
                    consistency.append((level, float(record[metric]) > 0))
            rows.append(
                Row(
                    run,
                    task,
                    bpc,
                    mean_nupr_at_k(token_lists, 2) if token_lists else None,
                    mean_nupr_at_k(token_lists, 3) if token_lists else None,
                    consistency,
                )
            )
    return rows


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def _summary_row(row: Row, baseline: Run | None) -> str:
    """One run and task's line of the accuracy, cost and repetition table."""
    task = row.task
    # with one sample per question the level is trivially 1 (or 0): not shown
    levels = [level for level, _ in row.consistency] if _max_samples(row) > 1 else []
    questions = task.questions or "–"  # documents, not logged lines (one per filter)
    bpc = "baseline" if row.run is baseline else _fmt(row.bpc)
    return (
        f"| {row.run.label} | {task.name} | {questions} | "
        f"{_fmt(None if task.accuracy is None else 100 * task.accuracy)} | "
        f"{_fmt(task.mean_nfe, '.1f')} | {_fmt(task.mean_samples)} | {bpc} | "
        f"{_fmt(row.nupr2, '.3f')} | {_fmt(row.nupr3, '.3f')} | "
        f"{_fmt(sum(levels) / len(levels) if levels else None, '.3f')} |"
    )


def _consistency_sections(rows: list[Row]) -> list[str]:
    """The consistency-level tables of the runs that voted over several samples."""
    voting = [row for row in rows if row.consistency and _max_samples(row) > 1]
    if not voting:
        return []
    parts = [
        "## Voting consistency level, correct vs incorrect questions",
        "",
        "Share of the correct (incorrect) questions at each level; level = votes for the "
        "most frequent answer / samples drawn.",
        "",
    ]
    for row in voting:
        parts += [
            f"### {row.run.label} · {row.task.name}",
            "",
            *consistency_table(row.consistency),
            "",
        ]
    return parts


def markdown(rows: list[Row], baseline: Run | None) -> str:
    """The report's tables: accuracy, cost and repetition per run and task, then the
    consistency levels of the voting runs."""
    parts = [
        "## Accuracy, cost and repetition",
        "",
        "| run | task | questions | accuracy (%) | mean NFE | samples / question | BPC vs "
        f"{baseline.label if baseline else '(no baseline)'} | NUPR@2 | NUPR@3 | mean consistency |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(_summary_row(row, baseline) for row in rows),
        "",
        "NUPR@k: share of generation positions (end-of-text padding included) where at least k "
        "samples hold the same token, averaged over questions with at least k samples. A dVoting "
        "run's remask samples copy the kept positions, so its NUPR exceeds that of independent "
        "samples (a majority run).",
        "",
    ]
    return "\n".join(parts + _consistency_sections(rows))


def _max_samples(row: Row) -> int:
    return max((len(trace.get("candidates") or []) for _, trace in row.task.traces()), default=0)


def consistency_table(consistency: list[tuple[float, bool]]) -> list[str]:
    """Markdown rows: each consistency level, the correct and incorrect questions at it."""
    correct = Counter(round(level, 2) for level, ok in consistency if ok)
    wrong = Counter(round(level, 2) for level, ok in consistency if not ok)
    n_ok, n_wrong = sum(correct.values()), sum(wrong.values())
    lines = ["| consistency level | correct | incorrect |", "|---:|---:|---:|"]
    for level in sorted(set(correct) | set(wrong), reverse=True):
        cells = [
            f"{c[level]} ({100 * c[level] / n:.0f}%)" if n else "0"
            for c, n in ((correct, n_ok), (wrong, n_wrong))
        ]
        lines.append(f"| {level:.2f} | {cells[0]} | {cells[1]} |")
    lines.append(f"| all | {n_ok} | {n_wrong} |")
    return lines


# ------------------------------------------------------------------- plots


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy_vs_nfe(rows: list[Row], baseline: Run | None, path: Path) -> bool:
    """One panel per task: accuracy against mean NFE, one labelled point per run."""
    points = [r for r in rows if r.task.accuracy is not None and r.task.mean_nfe is not None]
    if not points:
        return False
    plt = _pyplot()
    tasks = list(dict.fromkeys(r.task.name for r in points))
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for row in (r for r in points if r.task.name == task):
            x, y = row.task.mean_nfe, 100 * row.task.accuracy
            is_base = row.run is baseline
            note = row.run.label + (
                " (baseline)" if is_base else f", BPC {row.bpc:.2f}" if row.bpc is not None else ""
            )
            ax.scatter(
                x,
                y,
                s=70 if is_base else 50,
                marker="s" if is_base else "o",
                zorder=3,
                label=f"{note}: {y:.1f}% at {x:.1f} NFE",
            )
        ax.legend(fontsize=8, loc="best")
        ax.set_xlabel("mean forward passes (NFE) per question")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"{task}: accuracy vs NFE")
        ax.grid(alpha=0.3)
        ax.margins(x=0.25, y=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_consistency(rows: list[Row], path: Path) -> bool:
    """Bars: share of correct / incorrect questions at each voting consistency level."""
    voting = [row for row in rows if row.consistency and _max_samples(row) > 1]
    if not voting:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(voting), figsize=(4.8 * len(voting), 3.8), squeeze=False)
    for ax, row in zip(axes[0], voting):
        levels = sorted({round(level, 2) for level, _ in row.consistency})
        for offset, (ok, name, colour) in enumerate(
            ((True, "correct", "tab:green"), (False, "incorrect", "tab:red"))
        ):
            values = [round(level, 2) for level, good in row.consistency if good is ok]
            shares = [100 * values.count(level) / len(values) if values else 0 for level in levels]
            xs = [i + (offset - 0.5) * 0.4 for i in range(len(levels))]
            ax.bar(xs, shares, width=0.4, color=colour, label=f"{name} ({len(values)})")
        ax.set_xticks(range(len(levels)), [f"{level:.2f}" for level in levels], rotation=45)
        ax.set_xlabel("voting consistency level")
        ax.set_ylabel("share of questions (%)")
        ax.set_title(f"{row.run.label} · {row.task.name}", fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ------------------------------------------------------------- per-step answers


@dataclass
class StepRow:
    """One run and task whose samples logged per-step answers (the temporal vote), scored
    by the task (`temporal.step_figures`): per question, whether the plain vote over the
    final answers and the temporal vote were right, ever-pass and TSE; per decode, whether
    each step's answer was right."""

    run: Run
    task: TaskRun
    plain: list[bool]
    voted: list[bool]
    ever: list[bool]
    tse: list[float]
    decodes: list[list[bool]]  # per decode, per step: its answer was right

    @property
    def overturned(self) -> tuple[int, int]:
        """Questions the temporal vote turned (wrong -> right, right -> wrong)."""
        pairs = list(zip(self.plain, self.voted))
        return sum(1 for p, v in pairs if v and not p), sum(1 for p, v in pairs if p and not v)


def _decode_correctness(candidate: dict[str, Any]) -> list[bool] | None:
    runs, correct = candidate.get("steps"), candidate.get("steps_correct")
    if runs is None or correct is None or len(runs) != len(correct) or not candidate.get("nfe"):
        return None
    return expand_runs(
        [[first, ok] for (first, _), ok in zip(runs, correct)], int(candidate["nfe"])
    )


def build_step_rows(runs: list[Run], metric: str = "exact_match") -> list[StepRow]:
    rows = []
    for run in runs:
        for task in run.tasks.values():
            scored = [
                (record, trace)
                for record, trace in task.traces()
                if "plain_correct" in trace and "ever_pass" in record and metric in record
            ]
            if not scored:
                continue
            decodes = [
                d for _, trace in scored for d in map(_decode_correctness, trace["candidates"]) if d
            ]
            rows.append(
                StepRow(
                    run,
                    task,
                    [bool(t["plain_correct"]) for _, t in scored],
                    [float(r[metric]) > 0 for r, _ in scored],
                    [float(r["ever_pass"]) > 0 for r, _ in scored],
                    [float(r["tse"]) for r, _ in scored if r.get("tse") is not None],
                    decodes,
                )
            )
    return rows


def step_markdown(rows: list[StepRow]) -> list[str]:
    """The temporal-vote table (empty without such runs)."""
    if not rows:
        return []
    lines = [
        "## The temporal vote: ever-pass, temporal semantic entropy, overturns",
        "",
        "| run | task | questions | plain vote (%) | temporal vote (%) | ever-pass (%) | mean TSE "
        "(bits) | wrong -> right | right -> wrong |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        gained, lost = row.overturned
        lines.append(
            f"| {row.run.label} | {row.task.name} | {len(row.voted)} | "
            f"{_percent(row.plain):.2f} | {_percent(row.voted):.2f} | "
            f"{_percent(row.ever):.2f} | "
            f"{_fmt(sum(row.tse) / len(row.tse) if row.tse else None, '.3f')} | {gained} | {lost} |"
        )
    return lines + [
        "",
        "Plain vote: one vote per sample's final answer (for one decode, its final answer). "
        "Ever-pass: some step of some sample (or a final answer) was right. TSE: entropy of a "
        "decode's per-step answers over its answered steps, equal answers grouped, averaged over "
        "the question's decodes (`lm_eval_dvoting.core.temporal.temporal_entropy`).",
        "",
    ]


def _percent(flags: Sequence[bool]) -> float:
    return 100 * sum(flags) / len(flags)


STEP_GRID = 50  # points along the decode in accuracy_by_step.png


def step_curves(
    row: StepRow, points: int = STEP_GRID
) -> tuple[list[float], list[float], list[float]]:
    """Fractions f = g/points (g = 1..points) of the decode, the share of decodes right at
    step ceil(f T) - 1, and the share right at some step up to it (each decode over its own
    T steps; the step in whole numbers, so no rounding error picks the wrong one)."""
    fractions, at, ever = [], [], []
    for g in range(1, points + 1):
        steps = [(d, -(-g * len(d) // points) - 1) for d in row.decodes]
        fractions.append(g / points)
        at.append(100 * sum(d[s] for d, s in steps) / len(steps))
        ever.append(100 * sum(any(d[: s + 1]) for d, s in steps) / len(steps))
    return fractions, at, ever


def plot_accuracy_by_step(rows: list[StepRow], path: Path) -> bool:
    """Per run and task: accuracy along the decode, ever-pass up to each point, and the
    plain-vote and temporal-vote accuracies as lines."""
    rows = [row for row in rows if row.decodes]
    if not rows:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(rows), figsize=(5.2 * len(rows), 4.0), squeeze=False)
    for ax, row in zip(axes[0], rows):
        fractions, at, ever = step_curves(row)
        ax.plot(fractions, at, label="right at this step")
        ax.plot(fractions, ever, label="right at some step so far (ever-pass)")
        for flags, name, style in (
            (row.plain, "final answer / plain vote", ":"),
            (row.voted, "temporal vote", "--"),
        ):
            value = _percent(flags)
            ax.axhline(
                value,
                linestyle=style,
                color="black" if style == ":" else "tab:red",
                label=f"{name}: {value:.1f}%",
            )
        ax.set_xlabel("fraction of the decode's steps")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"{row.run.label} · {row.task.name}", fontsize=10)
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ------------------------------------------------------------- token pictures


class TokenNames:
    """Token id -> short display string, through the run's tokenizer when it loads."""

    def __init__(self, source: str | None) -> None:
        self.tokenizer = None
        self.special: set[int] = set()
        if source:
            try:
                from lm_eval_dvoting.models.loading import load_tokenizer

                self.tokenizer = load_tokenizer(_tokenizer_only(source))
                self.special = set(self.tokenizer.all_special_ids)
            except Exception as err:  # a missing or gated tokenizer only costs readability
                log.warning(
                    "tokenizer %s not loaded (%s); the pictures show token ids", source, err
                )
        self._cache: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        if token not in self._cache:
            if self.tokenizer is None:
                text = str(token)
            elif token in self.special:
                text = "∅"  # end-of-text padding and other special tokens
            else:
                text = (
                    self.tokenizer.decode([token]).replace("\n", "⏎").replace(" ", "·")
                    or f"[{token}]"
                )
            self._cache[token] = text
        return self._cache[token]

    def shown_length(self, tokens: list[list[int]]) -> int:
        """Positions to draw: trailing positions where every sample holds a special
        token (end-of-text padding) are left out."""
        length = len(tokens[0])
        while length > 1 and all(row[length - 1] in self.special for row in tokens):
            length -= 1
        return length


# what a tokenizer needs from a hub checkpoint (never the weights)
_TOKENIZER_FILES = [
    "config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab*",
    "merges.txt",
    "*.jinja",
]


def _tokenizer_only(source: str) -> str:
    """A local folder for `source`: a hub id is fetched without its weights (the
    checkpoint loader would fetch those too), folders and packaged names pass."""
    from lm_eval_dvoting.models.loading import PACKAGED_CHECKPOINTS

    if (
        source in PACKAGED_CHECKPOINTS
        or Path(source).expanduser().is_dir()
        or source.count("/") != 1
    ):
        return source
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id=source, allow_patterns=_TOKENIZER_FILES)


def _agreement_colour(count: int, samples: int) -> str:
    """Hex colour of a cell: pale (1 sample) to deep blue (all samples agree)."""
    import matplotlib

    share = 0.0 if samples <= 1 else (count - 1) / (samples - 1)
    r, g, b, _ = matplotlib.colormaps["YlGnBu"](0.08 + 0.82 * share)
    return "#{:02x}{:02x}{:02x}".format(int(255 * r), int(255 * g), int(255 * b))


def _candidate_label(i: int, candidate: dict[str, Any], chosen: int | None) -> str:
    kept = candidate.get("kept_positions")
    parts = [
        f"#{i + 1}{' ★' if i == chosen else ''}",
        f"answer {candidate.get('answer')}",
        f"NFE {candidate.get('nfe')}",
    ]
    if kept is not None:
        parts.append(f"remask, {len(kept)} kept")
    return " · ".join(parts)


@dataclass
class TokenGrid:
    """One question's candidates as a grid of tokens, each with how many samples hold the
    same token at its position: what both token pictures draw."""

    trace: dict[str, Any]
    names: TokenNames
    tokens: list[list[int]]
    agreement: list[list[int]]

    @classmethod
    def of(cls, trace: dict[str, Any], names: TokenNames) -> TokenGrid:
        tokens = _question_tokens(trace)
        assert tokens is not None
        return cls(trace, names, tokens, token_agreement(tokens))

    @property
    def samples(self) -> int:
        return len(self.tokens)

    @property
    def shown(self) -> int:
        """Positions drawn: the trailing end-of-text padding every sample holds is left out."""
        return self.names.shown_length(self.tokens)

    def kept(self, i: int) -> set[int]:
        """The positions candidate `i` kept from earlier samples (not remasked)."""
        return set(self.trace["candidates"][i].get("kept_positions") or [])

    def label(self, i: int) -> str:
        return _candidate_label(i, self.trace["candidates"][i], self.trace.get("chosen"))

    def dark(self, count: int) -> bool:
        """Whether a cell held by `count` samples is dark enough for white text."""
        return count > 0.75 * self.samples


def _html_cell(grid: TokenGrid, i: int, t: int, kept: set[int]) -> str:
    count, token = grid.agreement[i][t], grid.tokens[i][t]
    style = f"background:{_agreement_colour(count, grid.samples)}"
    if grid.dark(count):
        style += ";color:#fff"
    if t in kept:
        style += ";outline:2px solid #d62728;outline-offset:-2px"
    tip = f"position {t}: {count}/{grid.samples} samples; token id {token}" + (
        " (kept)" if t in kept else ""
    )
    return f'<td style="{style}" title="{html.escape(tip)}">{html.escape(grid.names(token))}</td>'


def _html_rows(grid: TokenGrid) -> list[str]:
    rows = []
    for i in range(grid.samples):
        kept = grid.kept(i)
        cells = "".join(_html_cell(grid, i, t, kept) for t in range(grid.shown))
        rows.append(f"<tr><th>{html.escape(grid.label(i))}</th>{cells}</tr>")
    return rows


def token_picture_html(title: str, trace: dict[str, Any], names: TokenNames) -> str:
    """A question's token picture as an HTML page (hover a cell for its counts)."""
    grid = TokenGrid.of(trace, names)
    samples = grid.samples
    votes = strict_json.dumps(trace.get("votes", {}))
    legend = "".join(
        f'<span style="background:{_agreement_colour(c, samples)};padding:2px 8px;margin-right:2px;'
        f'{"color:#fff" if grid.dark(c) else ""}">{c}</span>'
        for c in range(1, samples + 1)
    )
    hidden = len(grid.tokens[0]) - grid.shown
    note = (
        f"<p>{hidden} trailing positions of end-of-text padding, held by every sample, are not "
        "shown.</p>"
        if hidden
        else ""
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif}} table{{border-collapse:collapse;font-family:monospace}}
td{{border:1px solid #ddd;padding:2px 3px;text-align:center;min-width:1.1em}}
th{{text-align:left;font-weight:normal;padding-right:8px;white-space:nowrap}}</style></head>
<body><h3>{html.escape(title)}</h3>
<p>Each generated token is coloured by how many of the {samples} samples hold the same token at
that position: {legend}. Framed cells were kept from earlier samples (not remasked);
★ marks the sample returned to the harness. Votes: {html.escape(votes)}.</p>
{note}<table>{"".join(_html_rows(grid))}</table></body></html>
"""


def _png_cell(ax, grid: TokenGrid, i: int, t: int, xy: tuple[int, int], face) -> None:
    """One token's square (framed red if kept) and its text, at grid cell `xy`."""
    from matplotlib.patches import Rectangle

    kept, count = t in grid.kept(i), grid.agreement[i][t]
    edge, line = ("#d62728", 1.5) if kept else ("white", 0.5)
    ax.add_patch(Rectangle(xy, 1, 1, facecolor=face, edgecolor=edge, linewidth=line))
    text = grid.names(grid.tokens[i][t])[:5]
    ax.text(
        xy[0] + 0.5,
        xy[1] + 0.55,
        text,
        ha="center",
        va="center",
        fontsize=7 if len(text) < 4 else 5,
        family="monospace",
        color="white" if grid.dark(count) else "black",
    )


def _png_chunk(ax, grid: TokenGrid, chunk: int, width: int, chunks: int, face) -> None:
    """Positions `chunk * width` onwards of every candidate, one line each, labelled."""
    for i in range(grid.samples):
        y = chunk * (grid.samples + 1) + i
        for col in range(min(width, grid.shown - chunk * width)):
            t = chunk * width + col
            _png_cell(ax, grid, i, t, (col, y), face(grid.agreement[i][t]))
        label = grid.label(i) if chunk == 0 else f"#{i + 1}"
        ax.text(-0.3, y + 0.5, label, ha="right", va="center", fontsize=7)
    if chunks > 1:
        last = min(grid.shown, (chunk + 1) * width) - 1
        y = chunk * (grid.samples + 1) - 0.3
        where = f"positions {chunk * width}–{last}"
        ax.text(-0.3, y, where, ha="right", va="bottom", fontsize=6, color="grey")


def token_picture_png(title: str, trace: dict[str, Any], names: TokenNames, path: Path) -> None:
    """A question's token picture as a PNG, `PICTURE_WIDTH` positions a line."""
    plt = _pyplot()
    from matplotlib.colors import BoundaryNorm, ListedColormap

    grid = TokenGrid.of(trace, names)
    samples, shown = grid.samples, grid.shown
    width = min(PICTURE_WIDTH, shown)
    chunks = -(-shown // width)
    grid_rows = chunks * (samples + 1) - 1  # a blank row between chunks
    fig_w = 2.6 + 0.34 * width
    fig, ax = plt.subplots(figsize=(fig_w, 1.0 + 0.3 * grid_rows))
    colours = ListedColormap([_agreement_colour(c, samples) for c in range(1, samples + 1)])
    norm = BoundaryNorm([c + 0.5 for c in range(0, samples + 1)], samples)
    for chunk in range(chunks):
        _png_chunk(ax, grid, chunk, width, chunks, lambda count: colours(norm(count)))
    ax.set_xlim(0, width)
    ax.set_ylim(grid_rows, -0.5)
    ax.set_axis_off()
    mappable = plt.cm.ScalarMappable(norm=norm, cmap=colours)
    bar = fig.colorbar(mappable, ax=ax, ticks=range(1, samples + 1), fraction=0.03, pad=0.01)
    bar.set_label("samples holding the same token", fontsize=8)
    hidden = (
        "" if shown == len(grid.tokens[0]) else f" (end padding from position {shown} not shown)"
    )
    ax.set_title(title + hidden, fontsize=9)
    fig.subplots_adjust(left=min(0.45, 2.4 / fig_w), right=0.95)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=-]+", "_", text).strip("_")


def write_token_pictures(
    runs: list[Run], questions: list[int] | None, out: Path, tokenizer: str | None
) -> list[Path]:
    """HTML and PNG token-consistency pictures of the chosen questions, every voting run."""
    written: list[Path] = []
    names_by_source: dict[str | None, TokenNames] = {}
    for run in runs:
        for task in run.tasks.values():
            traced = {
                r["doc_id"]: trace
                for r, trace in task.traces()
                if _question_tokens(trace) is not None and len(trace["candidates"]) > 1
            }
            if not traced:
                continue
            wanted = questions if questions is not None else sorted(traced)[:DEFAULT_QUESTIONS]
            source = tokenizer or run.pretrained
            names = names_by_source.setdefault(source, TokenNames(source))
            for doc_id in wanted:
                if doc_id not in traced:
                    log.warning(
                        "%s %s: doc %s has no multi-sample trace", run.label, task.name, doc_id
                    )
                    continue
                record = next(r for r in task.records if r["doc_id"] == doc_id)
                verdict = "correct" if float(record.get("exact_match", 0)) > 0 else "incorrect"
                voted = record.get("filtered_resps", ["?"])[0]
                title = (
                    f"{run.label} · {task.name} · doc {doc_id} · "
                    f"target {record.get('target')} · voted {voted} ({verdict})"
                )
                stem = out / f"tokens_{_slug(run.label)}_{_slug(task.name)}_doc{doc_id}"
                stem.with_suffix(".html").write_text(
                    token_picture_html(title, traced[doc_id], names), encoding="utf-8"
                )
                token_picture_png(title, traced[doc_id], names, stem.with_suffix(".png"))
                written += [stem.with_suffix(".html"), stem.with_suffix(".png")]
    return written


# ------------------------------------------------------------------- command


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="dvoting report",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "paths",
        nargs="+",
        help="lm-eval output folders (searched for results_*.json) or results files",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        help="the single-sample run for BPC: its label, results file, or 1-based position; "
        "default: the first run with strategy=single",
    )
    parser.add_argument(
        "--out", default="dvoting_report", help="folder for report.md and the pictures"
    )
    parser.add_argument(
        "--questions",
        default=None,
        help="comma-separated doc ids for token pictures "
        f"(default: the first {DEFAULT_QUESTIONS}); 'none' for no pictures",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer (hub id or folder) to show tokens as text; default: each run's checkpoint",
    )
    parser.add_argument("--metric", default="exact_match", help="the accuracy metric of the tasks")
    return parser.parse_args(argv)


def _parse_questions(text: str | None) -> list[int] | None:
    if text is None:
        return None
    if text.strip().lower() == "none":
        return []
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(
            f"dvoting report: --questions takes comma-separated doc ids, got {text!r}"
        ) from None


def write_plots(rows: list[Row], step_rows: list[StepRow], baseline: Run | None, out: Path):
    """The report's plots that have something to show; their file names."""
    plots = (
        ("accuracy_vs_nfe.png", lambda path: plot_accuracy_vs_nfe(rows, baseline, path)),
        ("consistency.png", lambda path: plot_consistency(rows, path)),
        ("accuracy_by_step.png", lambda path: plot_accuracy_by_step(step_rows, path)),
    )
    return [name for name, plot in plots if plot(out / name)]


def _notes(rows: list[Row]) -> str:
    """The paragraph under the tables: definitions, and the runs logged without samples."""
    notes = [
        "Definitions: docs/ALGORITHM.md section 4 (`lm_eval_dvoting.core.metrics`); BPC in "
        "percentage points, for runs with at least the baseline's mean NFE (– for a cheaper run: "
        "dividing by a cost ratio below 1 would magnify its accuracy difference rather than "
        "charge for cost). Questions: documents scored; a task with several filters has one "
        "row per filter."
    ]
    missing = [f"{r.run.label} · {r.task.name}" for r in rows if not r.task.records]
    if missing:
        notes.append(
            "No `--log_samples` records (NUPR and consistency unavailable) for: "
            + ", ".join(missing)
            + "."
        )
    return " ".join(notes)


def report_text(runs: list[Run], table: str, notes: str, pictures: list[str], tokens) -> str:
    """report.md: the runs, the tables and notes, the plots and links to the token pictures."""
    runs_list = "\n".join(f"{i}. **{run.label}**: `{run.path}`" for i, run in enumerate(runs, 1))
    figures = "\n".join(f"![{name}]({name})" for name in pictures)
    token_links = "\n".join(f"- [{p.name}]({p.name})" for p in tokens if p.suffix == ".html")
    return f"# dVoting report\n\nRuns:\n\n{runs_list}\n\n{table}\n{notes}\n\n{figures}\n" + (
        f"\n## Token consistency\n\n{token_links}\n" if token_links else ""
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Write report.md, the plots and the token pictures into --out; print the tables."""
    args = parse_args(argv)
    try:
        files = find_results(args.paths)
    except FileNotFoundError as err:
        print(f"dvoting report: {err}", file=sys.stderr)
        return 1
    runs = [load_run(path, args.metric) for path in files]
    label_runs(runs)
    baseline = pick_baseline(runs, args.baseline)
    rows = build_rows(runs, baseline, args.metric)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    step_rows = build_step_rows(runs, args.metric)
    pictures = write_plots(rows, step_rows, baseline, out)
    tokens = write_token_pictures(runs, _parse_questions(args.questions), out, args.tokenizer)
    table = "\n".join([markdown(rows, baseline), *step_markdown(step_rows)])
    report = report_text(runs, table, _notes(rows), pictures, tokens)
    (out / "report.md").write_text(report, encoding="utf-8")
    print(table)
    print(
        f"written: {out / 'report.md'}, {len(pictures)} plots, {len(tokens)} token pictures in "
        f"{out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
