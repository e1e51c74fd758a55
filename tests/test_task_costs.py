"""Cost per task on any task, and whole cost figures on cached reruns (issue 17, items 3-4).

* Every task a dvoting model runs, the harness's own included, reports ``nfe`` and
  ``n_samples`` per question (all repeats of a document summed): in the results JSON, in
  the printed table and in every logged sample; a group reports the mean over all its
  questions; `config.dvoting.tasks` has the sums per task.
* `config.dvoting.totals` and `settings_used` describe the responses the results are built
  on, so a rerun served partly or wholly from `--use_cache` reports what the run that
  computed them reported; `computed` says how much of it this run decoded.

The stock task is lm-eval's own `gsm8k_cot_zeroshot` YAML (read from the installed
lm-eval), renamed and pointed at a small local jsonl, as a user offline would run it with
`--include_path`. The model is the shipped demo `pretrained=tiny-arith` at 32 (or 16)
generated tokens; its answers to these questions are wrong, which does not matter here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lm_eval
import lm_eval.tasks
import pytest
import yaml
from conftest import REPO_ROOT
from lm_eval.tasks import TaskManager

from lm_eval_dvoting.integration.costs import CostedText

TASKS = REPO_ROOT / "task_configs"
STOCK_YAML = Path(lm_eval.tasks.__file__).parent / "gsm8k" / "gsm8k-cot-zeroshot.yaml"
LOCAL = "gsm8k_cot_zeroshot_local"
# GSM8K-style rows (the answer ends in "#### N"), arithmetic the demo model has seen
ROWS = [("3-1+5", 7), ("9-8+4-2+1", 4), ("7-7+2+5-7", 0), ("4+3-2", 5), ("2+2+2", 6), ("8-3-1", 4)]


def _stock_task(folder: Path, name: str = LOCAL, rows: int = 4, **overrides: Any) -> Path:
    """lm-eval's gsm8k-cot-zeroshot.yaml as `name`, reading `rows` local GSM8K-style rows."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"{q}=?", "answer": f"{q}={a}.\n#### {a}"}) + "\n"
            for q, a in ROWS[:rows]
        )
    )
    config = yaml.safe_load(STOCK_YAML.read_text())
    assert config["task"] == "gsm8k_cot_zeroshot" and config["dataset_path"] == "openai/gsm8k"
    for key in ("dataset_name", "training_split", "fewshot_split", "tag"):
        config.pop(key, None)
    config.update(
        task=name,
        dataset_path="json",
        dataset_kwargs={"data_files": {"test": str(data)}},
        **overrides,
    )
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


def _evaluate(
    model_args: str, tasks: list[str], folder: Path, limit: int | None = None, **kwargs: Any
) -> dict[str, Any]:
    # include_defaults=False: indexing lm-eval's ~15,000 stock task files takes seconds
    manager = TaskManager(include_path=[str(folder), str(TASKS)], include_defaults=False)
    return lm_eval.simple_evaluate(
        model="dvoting-llada",
        model_args=f"pretrained=tiny-arith,{model_args}",
        tasks=tasks,
        limit=limit,
        device="cpu",
        log_samples=True,
        task_manager=manager,
        verbosity="ERROR",
        **kwargs,
    )


def _samples(results: dict[str, Any], task: str, filter_name: str) -> list[dict[str, Any]]:
    records = [r for r in results["samples"][task] if r["filter"] == filter_name]
    return sorted(records, key=lambda r: r["doc_id"])


# ----------------------------------------------------------- stock tasks, the CLI


def test_stock_gsm8k_cot_zeroshot_reports_cost_per_task_through_the_cli(tmp_path):
    """`python -m lm_eval --include_path ... --log_samples` on the stock YAML: nfe and
    n_samples per question in the printed table, the results JSON and every sample."""
    folder = _stock_task(tmp_path / "tasks", rows=4)
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        "dvoting-llada",
        "--model_args",
        "pretrained=tiny-arith,strategy=single",
        "--tasks",
        LOCAL,
        "--include_path",
        str(folder),
        "--gen_kwargs",
        "max_gen_toks=32",
        "--device",
        "cpu",
        "--output_path",
        str(out),
        "--log_samples",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]

    # single: one sample of `steps = L = 32` forward passes per question
    filters = ("strict-match", "flexible-extract")
    table = [
        [cell.strip() for cell in line.split("|")[1:-1]]
        for line in run.stdout.splitlines()
        if line.startswith("|")
    ]
    rows = {(row[2], row[4]): row[6] for row in table if len(row) > 6}
    for name in filters:
        # (the printed precision is pytablewriter's per-column choice: "32", or "32.00"
        # when the column's other numbers have decimals)
        assert float(rows[name, "nfe"]) == 32 and float(rows[name, "n_samples"]) == 1, run.stdout

    (results_file,) = out.rglob("results_*.json")
    results = json.loads(results_file.read_text())
    figures = results["results"][LOCAL]
    for name in filters:
        assert figures[f"nfe,{name}"] == 32.0 and figures[f"n_samples,{name}"] == 1.0
        assert "exact_match," + name in figures  # the task's own metric is still there
    assert results["higher_is_better"][LOCAL]["nfe"] is False
    info = results["config"]["dvoting"]
    assert info["tasks"] == {LOCAL: {"questions": 4, "requests": 4, "nfe": 128, "samples": 4}}
    assert info["totals"]["nfe"] == 128 and info["totals"]["questions"] == 4

    (samples_file,) = out.rglob(f"samples_{LOCAL}_*.jsonl")
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
    assert len(samples) == 4 * len(filters)  # one record per document and filter
    assert all(s["nfe"] == 32.0 and s["n_samples"] == 1.0 for s in samples)


# ------------------------------------------------------- repeats: per question


def test_cost_per_question_sums_every_repeat(tmp_path):
    """`repeats: 3` (as gsm8k-cot-self-consistency has 64): a question costs its three
    requests, whatever the filters make of them (first, majority vote, or all)."""
    folder = tmp_path / "tasks"
    filters = [
        {
            "name": "score-first",
            "filter": [
                {"function": "regex", "regex_pattern": r"(-?[0-9]+)"},
                {"function": "take_first"},
            ],
        },
        {
            "name": "maj@3",
            "filter": [
                {"function": "regex", "regex_pattern": r"(-?[0-9]+)"},
                {"function": "majority_vote"},
                {"function": "take_first"},
            ],
        },
        # no take_first: the task's process_results receives the list of all three answers
        {"name": "all", "filter": [{"function": "regex", "regex_pattern": r"(-?[0-9]+)"}]},
    ]
    _stock_task(
        folder,
        rows=5,
        repeats=3,
        filter_list=filters,
        process_results="!function probe_utils.process_results",
    )
    (folder / "probe_utils.py").write_text(
        "def process_results(doc, results):\n"
        "    answers = results[0] if isinstance(results[0], list) else [results[0]]\n"
        "    gold = doc['answer'].split('#### ')[-1]\n"
        "    return {'exact_match': float(any(str(a) == gold for a in answers))}\n"
    )
    # safe_dump quoted the tag; lm-eval reads `!function` only as a YAML tag
    path = folder / f"{LOCAL}.yaml"
    path.write_text(
        path.read_text().replace(
            "'!function probe_utils.process_results'", "!function probe_utils.process_results"
        )
    )

    results = _evaluate("strategy=dvoting,n=3", [LOCAL], folder, gen_kwargs="max_gen_toks=32")
    figures = results["results"][LOCAL]
    per_request_nfe = []
    for name in ("score-first", "maj@3", "all"):
        records = _samples(results, LOCAL, name)
        assert len(records) == 5
        for record in records:
            [responses] = record["resps"]  # one instance per document, its three repeats
            assert len(responses) == 3 and all(isinstance(r, CostedText) for r in responses)
            assert record["nfe"] == sum(r.nfe for r in responses)
            assert record["n_samples"] == sum(r.n_samples for r in responses)
            per_request_nfe += [r.nfe for r in responses]
        assert figures[f"nfe,{name}"] == pytest.approx(sum(r["nfe"] for r in records) / 5)
        assert figures[f"n_samples,{name}"] == pytest.approx(
            sum(r["n_samples"] for r in records) / 5
        )
    assert len(set(per_request_nfe)) > 1  # repeats really differ in cost (the sums are not 3x one)
    info = results["config"]["dvoting"]
    assert info["tasks"][LOCAL]["questions"] == 5 and info["tasks"][LOCAL]["requests"] == 15
    assert info["tasks"][LOCAL]["nfe"] == pytest.approx(5 * figures["nfe,maj@3"])


# ------------------------------------------------------------- several tasks, groups


def test_each_task_of_a_group_reports_its_own_cost(tmp_path):
    """Two stock-task copies at 32 and 16 generated tokens, with our dvoting_arith, in
    a group: each reports its own cost, the group the mean over all its questions."""
    folder = tmp_path / "tasks"
    _stock_task(folder, "gsm_long", rows=4, generation_kwargs={"until": ["Q:"], "max_gen_toks": 32})
    _stock_task(
        folder, "gsm_short", rows=2, generation_kwargs={"until": ["Q:"], "max_gen_toks": 16}
    )
    (folder / "probe_group.yaml").write_text(
        "group: probe_group\ntask: [gsm_long, gsm_short, dvoting_arith]\n"
        "aggregate_metric_list:\n  - metric: exact_match\n    weight_by_size: true\n"
    )
    results = _evaluate("strategy=single", ["probe_group"], folder, limit=4)
    figures = results["results"]
    # single: one sample of L forward passes per question, L the task's max_gen_toks
    assert figures["gsm_long"]["nfe,flexible-extract"] == 32.0
    assert figures["gsm_short"]["nfe,strict-match"] == 16.0
    assert figures["dvoting_arith"]["nfe,extract"] == 32.0
    assert all(
        figures[t][f"n_samples,{f}"] == 1.0
        for t, f in (
            ("gsm_long", "strict-match"),
            ("gsm_short", "flexible-extract"),
            ("dvoting_arith", "extract"),
        )
    )
    # the group: 4 + 2 + 4 questions, under each filter name its tasks use
    group = figures["probe_group"]
    for name in ("strict-match", "flexible-extract", "extract"):
        assert group[f"nfe,{name}"] == pytest.approx((4 * 32 + 2 * 16 + 4 * 32) / 10)
        assert group[f"n_samples,{name}"] == 1.0
    assert results["groups"]["probe_group"]["nfe,extract"] == group["nfe,extract"]
    info = results["config"]["dvoting"]
    assert info["tasks"] == {
        "dvoting_arith": {"questions": 4, "requests": 4, "nfe": 128, "samples": 4},
        "gsm_long": {"questions": 4, "requests": 4, "nfe": 128, "samples": 4},
        "gsm_short": {"questions": 2, "requests": 2, "nfe": 32, "samples": 2},
    }
    assert info["totals"]["nfe"] == 288 and info["totals"]["requests"] == 10
    lengths = sorted(s["gen_length"] for s in info["settings_used"])
    assert lengths == [16, 32]  # the two lengths the requests ran with


INT_FILTER = """
import re


def to_int(resps, docs):
    # the boxed number as an int where it is even, else the text: a value of another type
    # for some questions only, as a user's custom or map filter may output
    def one(text):
        found = re.findall(r"boxed\\{(-?\\d+)\\}", text)
        return int(found[-1]) if found and int(found[-1]) % 2 == 0 else text
    return [[one(r) for r in rs] for rs in resps]


def score(doc, results):
    return {"exact_match": float(str(results[0]) == str(doc["target"]))}
"""


def test_a_filter_whose_values_cannot_carry_the_cost_reports_none_rather_than_a_partial_mean(
    tmp_path, caplog
):
    """A custom filter that outputs ints for some questions: a mean over only the questions
    whose value could carry the cost would be silently wrong, so the task reports no cost
    metric (with a warning) and the run's ledger keeps its whole sums."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "int_filter.py").write_text(INT_FILTER)
    (folder / "arith_int.yaml").write_text(
        f"include: {TASKS / 'dvoting_arith.yaml'}\ntask: arith_int\ntag: []\n"
        "process_results: !function int_filter.score\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
        "filter_list:\n  - name: int\n    filter:\n      - function: custom\n"
        "        filter_fn: !function int_filter.to_int\n      - function: take_first\n"
    )
    results = _evaluate("strategy=single", ["arith_int"], folder, limit=6)
    values = [r["filtered_resps"] for r in _samples(results, "arith_int", "int")]
    flat = [v[0] if isinstance(v, list) else v for v in values]
    assert any(isinstance(v, int) for v in flat) and any(isinstance(v, str) for v in flat)  # mixed
    figures = results["results"]["arith_int"]
    assert (
        "exact_match,int" in figures and "nfe,int" not in figures and "n_samples,int" not in figures
    )
    assert any("cannot carry the cost" in r.getMessage() for r in caplog.records)
    assert results["config"]["dvoting"]["tasks"]["arith_int"] == {
        "questions": 6,
        "requests": 6,
        "nfe": 6 * 32,
        "samples": 6,
    }


# ------------------------------------------------------------------ --use_cache


def _without_computed(info: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in info.items() if key != "computed"}


def test_cached_reruns_report_the_whole_cost_and_settings(tmp_path):
    """A rerun from `--use_cache` reports the totals, per-task cost and `settings_used` of
    the run that computed the responses, whether it computed part of them or none."""
    folder = _stock_task(tmp_path / "tasks", rows=6)
    cache = str(tmp_path / "cache" / "run")
    args = ("strategy=dvoting,n=3", [LOCAL, "dvoting_arith"], folder)
    fresh = _evaluate(*args, limit=4, gen_kwargs="max_gen_toks=32")
    half = _evaluate(*args, limit=2, gen_kwargs="max_gen_toks=32", use_cache=cache)

    # every entry stored carries its cost and the settings it ran with
    from sqlitedict import SqliteDict

    time.sleep(0.2)  # sqlitedict's autocommit writes from a background thread
    with SqliteDict(cache + "_rank0.db") as stored:
        entries = [value for value in stored.values() if isinstance(value, CostedText)]
    assert len(entries) == 4
    assert all(
        e.nfe > 0 and e.n_samples >= 2 and e.settings["strategy"] == "dvoting" for e in entries
    )

    partly = _evaluate(*args, limit=4, gen_kwargs="max_gen_toks=32", use_cache=cache)
    fully = _evaluate(*args, limit=4, gen_kwargs="max_gen_toks=32", use_cache=cache)
    expected = fresh["config"]["dvoting"]
    assert expected["totals"]["requests"] == 8 and expected["settings_used"]
    for rerun in (partly, fully):
        info = rerun["config"]["dvoting"]
        assert info["totals"] == expected["totals"]
        assert info["settings_used"] == expected["settings_used"]
        assert _without_computed(info) == _without_computed(expected)  # per-task sums too
        for task in (LOCAL, "dvoting_arith"):
            assert rerun["results"][task] == fresh["results"][task]  # nfe / n_samples per task too
    # what each run decoded itself: 2 + 2 documents, then the 2 + 2 missing, then nothing
    computed = [run["config"]["dvoting"]["computed"]["requests"] for run in (half, partly, fully)]
    assert computed == [4, 4, 0]


# ------------------------------------------------------------ several processes


@pytest.mark.slow
def test_two_processes_report_the_same_cost_per_task(tmp_path):
    """`torchrun --nproc_per_node 2` (gloo, CPU): per-task cost and totals equal a
    one-process run, padding copies not counted, also when served from the cache."""
    folder = _stock_task(tmp_path / "tasks", rows=5, repeats=2)  # odd: rank 1 is padded

    def run(name: str, launcher: list[str], extra: list[str] = ()) -> dict[str, Any]:
        command = launcher + [
            "-m",
            "lm_eval",
            "--model",
            "dvoting-llada",
            "--model_args",
            "pretrained=tiny-arith,strategy=dvoting,n=3",
            "--tasks",
            f"{LOCAL},dvoting_arith",
            "--include_path",
            str(folder),
            "--gen_kwargs",
            "max_gen_toks=32",
            "--limit",
            "5",
            "--device",
            "cpu",
            "--output_path",
            str(tmp_path / name),
            *extra,
        ]
        env = dict(
            os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", ACCELERATE_USE_CPU="1"
        )
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        (results_file,) = (tmp_path / name).rglob("results_*.json")
        return json.loads(results_file.read_text())

    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(29500 + os.getpid() % 1000),
    ]
    cache = ["--use_cache", str(tmp_path / "cache" / "run")]
    one = run("one", [sys.executable])
    two = run("two", torchrun, cache)
    two_cached = run("two_cached", torchrun, cache)
    expected = one["config"]["dvoting"]
    assert expected["tasks"][LOCAL] == {
        "questions": 5,
        "requests": 10,
        "nfe": expected["tasks"][LOCAL]["nfe"],
        "samples": expected["tasks"][LOCAL]["samples"],
    }
    for results, computed in ((two, 15), (two_cached, 0)):
        info = results["config"]["dvoting"]
        for key in ("totals", "tasks", "settings_used"):
            assert info[key] == expected[key], key
        assert info["computed"]["requests"] == computed
        for task in (LOCAL, "dvoting_arith"):
            for key, value in one["results"][task].items():
                if key.split(",")[0] in ("nfe", "n_samples"):
                    assert results["results"][task][key] == pytest.approx(value, rel=1e-12)
