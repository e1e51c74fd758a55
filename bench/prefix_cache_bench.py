"""The demo's strategies without and with the opt-in prefix cache: accuracy, NFE and speed.

Each strategy drives the first `--cache-questions` demo questions at batch 16 rows,
once with `prefix_cache=False` and once with `prefix_cache=True`. The table compares
each cached run with its uncached twin: speed-up and how many returned answers changed.
"""

from __future__ import annotations

import time
from typing import Any

from bench.timing import TimedModel
from bench.workloads import Workload
from lm_eval_dvoting.core.strategies import StrategySettings, decode_questions

CACHE_STRATEGIES = ("single", "majority", "dvoting")
CACHE_BATCH_ROWS = 16


def _run_one(
    work: Workload, timed: TimedModel, strategy: str, cache: bool, count: int
) -> dict[str, Any]:
    """One strategy over the first `count` questions, with or without the prefix cache."""
    settings = StrategySettings(strategy=strategy, gen_length=work.gen_length, prefix_cache=cache)
    timed.reset()
    start = time.perf_counter()
    results = decode_questions(
        timed,
        work.prompts[:count],
        settings,
        work.extract,
        list(range(count)),
        max_rows=CACHE_BATCH_ROWS,
    )
    wall = time.perf_counter() - start
    right = sum(r.answers[r.chosen] == t for r, t in zip(results, work.targets))
    print(
        f"  [cache] {strategy:8s} prefix_cache={cache!s:5s}: accuracy {right / count:.3f}, "
        f"{wall:6.2f} s",
        flush=True,
    )
    return {
        "strategy": strategy,
        "prefix_cache": cache,
        "questions": count,
        "accuracy": right / count,
        "nfe": sum(r.nfe for r in results) / count,
        "seconds": wall,
        "forward_seconds": timed.seconds,
        "answers": [r.answers[r.chosen] for r in results],
    }


def run_prefix_cache(work: Workload, questions: int) -> list[dict[str, Any]]:
    """Accuracy and speed of each strategy on the demo, without and with the prefix cache."""
    count = min(questions, len(work.prompts))
    timed = TimedModel(work.model)
    return [
        _run_one(work, timed, strategy, cache, count)
        for strategy in CACHE_STRATEGIES
        for cache in (False, True)
    ]


def prefix_cache_table(rows: list[dict[str, Any]]) -> list[str]:
    """One Markdown row per run; speed-up and changed answers are relative to the same strategy
    without the cache."""
    lines = [
        "| strategy | prefix cache | questions | accuracy (%) | mean NFE | s/question | "
        "speed-up | answers changed |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    by = {(r["strategy"], r["prefix_cache"]): r for r in rows}
    for r in rows:
        base = by[(r["strategy"], False)]
        changed = sum(a != b for a, b in zip(r["answers"], base["answers"]))
        lines.append(
            f"| {r['strategy']} | {'on' if r['prefix_cache'] else 'off'} | {r['questions']} | "
            f"{100 * r['accuracy']:.1f} | {r['nfe']:.1f} | {r['seconds'] / r['questions']:.4f} | "
            f"{base['seconds'] / r['seconds']:.2f}x | {changed} |"
        )
    return lines


def prefix_cache_section(rows: list[dict[str, Any]]) -> list[str]:
    """The report's section on the prefix cache: what was run, then the table."""
    questions = rows[0]["questions"]
    return (
        [
            "## The prefix cache (`prefix_cache=true`) on the demo",
            "",
            f"The first {questions} questions of `demo/arith_test.jsonl`, batch 16 rows, each "
            "strategy",
            "without and with Fast-dLLM's prefix key/value cache (see the README). *answers "
            "changed*: questions",
            "whose returned answer differs from the run without the cache. Accuracy is over "
            "these questions",
            f"only (standard error about {100 * (0.25 / questions) ** 0.5:.1f} points).",
            "",
        ]
        + prefix_cache_table(rows)
        + [""]
    )
