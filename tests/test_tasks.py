"""The dvoting_* task configs: offline data, prompts, and the YAML-wired scoring.

Everything goes through task objects built by lm-eval's own TaskManager from
task_configs/, so what is tested is the YAML wiring (custom_dataset, doc_to_text,
generation_kwargs, filter_list, process_results), not just the helpers.

GPQA's authors ask that its questions are never published in plain text: these
tests never print or store question text (assertion messages name ids only).
"""

from __future__ import annotations

import collections
import importlib.util
from pathlib import Path
from typing import Any, Iterator

import datasets
import pytest
from conftest import DATA, REPO_ROOT, require_shared

from lm_eval_dvoting.integration.costs import CostedText

TASK_CONFIGS = REPO_ROOT / "task_configs"
FILTER = "extract"  # the filter_list name of every dvoting_* task
SIZES = {
    "dvoting_gsm8k": 1319,
    "dvoting_math500": 500,
    "dvoting_arc_challenge": 1172,
    "dvoting_mmlu": 14042,
    "dvoting_gpqa_diamond": 198,
    "dvoting_gpqa_main": 448,
}
REASONING = [
    "dvoting_gsm8k",
    "dvoting_math500",
    "dvoting_arc_challenge",
    "dvoting_mmlu",
    "dvoting_gpqa_diamond",
]


@pytest.fixture(scope="module")
def offline_tasks() -> Iterator[dict[str, Any]]:
    """All six tasks plus the group, built once from the local data, hub forbidden."""
    require_shared(DATA)
    from lm_eval.tasks import TaskManager

    def no_hub(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a dvoting task went to the hub: {args}")

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DVOTING_DATA_DIR", str(DATA))
        mp.setattr(datasets, "load_dataset", no_hub)
        # include_defaults=False: indexing lm-eval's own ~10k task files takes ~10 s
        # and tests nothing of ours
        manager = TaskManager(include_path=str(TASK_CONFIGS), include_defaults=False)
        loaded = manager.load(["dvoting_reasoning", "dvoting_gpqa_main"])
        yield loaded


def _docs(task: Any) -> list[dict[str, Any]]:
    if not hasattr(task, "_test_docs_list"):
        task._test_docs_list = list(task.test_docs())
    return task._test_docs_list


def score(task: Any, responses: list[Any]) -> list[dict[str, float]]:
    """Score one response per document as the evaluator does: the task's
    requests, its filter_list, then its process_results."""
    docs = _docs(task)
    assert len(responses) == len(docs)
    if getattr(task, "_instances", None) is None:
        # construct_requests per doc rather than build_all_requests, which renders
        # every prompt and takes ~10 s for MMLU; the requests are the same objects
        task._instances = [
            task.construct_requests(doc=doc, ctx="", metadata=(task.config.task, i, 1))
            for i, doc in enumerate(docs)
        ]
    for inst, response in zip(task._instances, responses):
        inst.resps = [response]
        inst.filtered_resps = {}
    task.apply_filters()
    return [
        task.process_results(inst.doc, [inst.filtered_resps[FILTER]]) for inst in task._instances
    ]


def exact(results: list[dict[str, float]]) -> list[float]:
    return [r["exact_match"] for r in results]


# --------------------------------------------------------------------------- building


def test_tasks_and_group_build_offline_with_full_test_sets(offline_tasks: dict[str, Any]) -> None:
    tasks = offline_tasks["tasks"]
    assert {name: len(_docs(tasks[name])) for name in SIZES} == SIZES
    assert sorted(offline_tasks["group_map"]["dvoting_reasoning"]) == sorted(REASONING)


@pytest.mark.parametrize(
    "name, kind, length",
    [
        ("dvoting_gsm8k", "number", 256),
        ("dvoting_math500", "math", 256),
        ("dvoting_arc_challenge", "choice", 128),
        ("dvoting_mmlu", "choice", 128),
        ("dvoting_gpqa_diamond", "choice", 128),
        ("dvoting_gpqa_main", "choice", 128),
    ],
)
def test_generation_kwargs(
    offline_tasks: dict[str, Any], name: str, kind: str, length: int
) -> None:
    task = offline_tasks["tasks"][name]
    assert task.OUTPUT_TYPE == "generate_until"
    assert task.config.num_fewshot == 0
    assert task.config.generation_kwargs == {
        "until": [],
        "max_gen_toks": length,
        "do_sample": False,
        "dvoting_answer": kind,
    }
    # what a model receives with each request
    (inst,) = [task.construct_requests(doc=_docs(task)[0], ctx="ctx", metadata=(name, 0, 1))]
    assert inst.args[1]["dvoting_answer"] == kind


def test_prompts(offline_tasks: dict[str, Any]) -> None:
    tasks = offline_tasks["tasks"]
    gsm8k = tasks["dvoting_gsm8k"]
    doc = _docs(gsm8k)[0]
    assert gsm8k.doc_to_text(doc) == (
        "Please answer the question step by step and put the answer in \\boxed{}. "
        + doc["question"]
    )
    assert gsm8k.doc_to_target(doc) == "18"
    math500 = tasks["dvoting_math500"]
    doc = _docs(math500)[0]
    assert math500.doc_to_text(doc) == (
        "Please answer the question step by step and put the answer in \\boxed{}. " + doc["problem"]
    )
    arc = tasks["dvoting_arc_challenge"]
    prompt = arc.doc_to_text(_docs(arc)[0])
    assert "in \\boxed{}" in prompt and "(A, B, C or D)" in prompt
    assert "\nA) Planetary density will decrease.\nB) " in prompt and "\nE) " not in prompt
    mmlu = tasks["dvoting_mmlu"]
    prompt = mmlu.doc_to_text(_docs(mmlu)[0])
    assert '"Answer: LETTER"' in prompt and prompt.endswith("\nA) 0\nB) 4\nC) 2\nD) 6")
    gpqa = tasks["dvoting_gpqa_diamond"]
    for doc in _docs(gpqa):
        prompt = gpqa.doc_to_text(doc)
        assert "in \\boxed{}" in prompt and all(f"\n{x}) " in prompt for x in "ABCD"), doc["id"]


def test_arc_options_and_labels(offline_tasks: dict[str, Any]) -> None:
    arc = offline_tasks["tasks"]["dvoting_arc_challenge"]
    docs = _docs(arc)
    sizes = collections.Counter(len(d["choices"]) for d in docs)
    assert sizes == {4: 1165, 3: 4, 5: 3}
    # every answer letter names one of the options shown
    assert all(d["answer"] in "ABCDE"[: len(d["choices"])] for d in docs)
    three = next(d for d in docs if len(d["choices"]) == 3)
    prompt = arc.doc_to_text(three)
    assert "(A, B or C)" in prompt and "\nC) " in prompt and "\nD) " not in prompt
    five = next(d for d in docs if len(d["choices"]) == 5)
    assert "(A, B, C, D or E)" in arc.doc_to_text(five) and "\nE) " in arc.doc_to_text(five)


def test_arc_numeric_labels_map_to_letters(data_dir: Path, offline_tasks: dict[str, Any]) -> None:
    import json

    raw = [
        json.loads(line)
        for line in (data_dir / "arc_challenge" / "ARC-Challenge-Test.jsonl")
        .read_text(encoding="utf-8")
        .splitlines()
    ]
    docs = {d["id"]: d for d in _docs(offline_tasks["tasks"]["dvoting_arc_challenge"])}
    numeric = [r for r in raw if r["answerKey"] in "1234"]
    assert len(numeric) == 22
    for r in numeric:
        assert docs[r["id"]]["answer"] == "ABCD"[int(r["answerKey"]) - 1]


def test_gpqa_option_order_is_the_same_in_every_process(utils: Any) -> None:
    """Seeded by SHA-256 of the Record ID, not by `hash()` (salted per process)."""
    import os
    import subprocess
    import sys

    code = (
        "import importlib.util, sys; spec = importlib.util.spec_from_file_location('u', "
        "sys.argv[1]); u = importlib.util.module_from_spec(spec); spec.loader.exec_module(u); "
        "print([u.gpqa_option_order(f'rec{i}') for i in range(8)])"
    )
    here = str([utils.gpqa_option_order(f"rec{i}") for i in range(8)])
    for salt in ("1", "2"):
        run = subprocess.run(
            [sys.executable, "-c", code, str(TASK_CONFIGS / "utils.py")],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, PYTHONHASHSEED=salt),
        )
        assert run.stdout.strip() == here
    assert len(set(here.split("], ["))) > 1  # the orders differ between records


def test_gpqa_shuffle_is_fixed_and_balanced(offline_tasks: dict[str, Any], utils: Any) -> None:
    gpqa_utils = utils
    assert sorted(gpqa_utils.gpqa_option_order("recABC")) == [0, 1, 2, 3]
    for name in ("dvoting_gpqa_diamond", "dvoting_gpqa_main"):
        docs = _docs(offline_tasks["tasks"][name])
        letters = collections.Counter(d["answer"] for d in docs)
        assert set(letters) == set("ABCD")
        assert min(letters.values()) > len(docs) / 4 * 0.6, letters  # no letter starved
        assert len({d["id"] for d in docs}) == len(docs)


def test_gpqa_order_is_pinned(utils: Any) -> None:
    # Golden values: SHA-256 and random.Random(int).shuffle give the same order in
    # every process (unlike hash(), salted per process) and every CPython 3.x; a
    # change here silently reshuffles GPQA and breaks comparability of results.
    order = utils.gpqa_option_order
    assert [order(x) for x in ("recABC", "recXYZ123", "rec0")] == [
        [0, 2, 1, 3],
        [1, 0, 3, 2],
        [0, 2, 1, 3],
    ]


@pytest.fixture(scope="module")
def utils() -> Any:
    """task_configs/utils.py, loaded by path as lm-eval loads it (no shared data needed)."""
    spec = importlib.util.spec_from_file_location(
        "dvoting_task_utils_under_test", TASK_CONFIGS / "utils.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- scoring


def test_gsm8k_scoring_all_items(offline_tasks: dict[str, Any]) -> None:
    task = offline_tasks["tasks"]["dvoting_gsm8k"]
    docs = _docs(task)
    references = [d["answer"].split("#### ")[-1].strip() for d in docs]  # e.g. "1,600"
    right = [f"Let me think. 3 + 4 = 7.\nSo the total is \\boxed{{{ref}}}." for ref in references]
    assert exact(score(task, right)) == [1.0] * len(docs)
    wrong = [f"So the total is \\boxed{{{float(d['target']) + 1:g}}}." for d in docs]
    assert exact(score(task, wrong)) == [0.0] * len(docs)
    # the reference solution itself ends in `#### N`
    assert exact(score(task, [d["answer"] for d in docs])) == [1.0] * len(docs)


def test_math500_reference_solutions_score(offline_tasks: dict[str, Any]) -> None:
    task = offline_tasks["tasks"]["dvoting_math500"]
    docs = _docs(task)
    results = exact(score(task, [d["solution"] for d in docs]))
    misses = [d["unique_id"] for d, r in zip(docs, results) if r != 1.0]
    assert len(misses) <= 5, misses  # >= 99 %; in fact none
    # a model's own spelling: `\dfrac` and a `$...$` wrapper, scored by equivalence
    respelled = ["Hence $\\boxed{" + d["answer"].replace("\\frac", "\\dfrac") + "}$." for d in docs]
    assert sum(exact(score(task, respelled))) >= 0.99 * len(docs)


def test_math500_other_items_answers_score_zero(offline_tasks: dict[str, Any]) -> None:
    task = offline_tasks["tasks"]["dvoting_math500"]
    docs = _docs(task)
    shifted = [f"\\boxed{{{docs[(i + 1) % len(docs)]['answer']}}}" for i in range(len(docs))]
    results = exact(score(task, shifted))
    hits = [docs[i]["unique_id"] for i, r in enumerate(results) if r]
    # only neighbours whose answers really are equal ("7" and "7", "5" and "x=5")
    assert len(hits) <= 5, hits


@pytest.mark.parametrize(
    "name", ["dvoting_arc_challenge", "dvoting_mmlu", "dvoting_gpqa_diamond", "dvoting_gpqa_main"]
)
def test_choice_scoring_all_items(offline_tasks: dict[str, Any], name: str) -> None:
    task = offline_tasks["tasks"][name]
    docs = _docs(task)
    # each task's own requested answer form
    form = (
        "Reasoning...\nAnswer: {}" if name == "dvoting_mmlu" else "Reasoning... so \\boxed{{{}}}."
    )
    assert exact(score(task, [form.format(d["answer"]) for d in docs])) == [1.0] * len(docs)
    for shift in (1, 2, 3):
        others = [
            "ABCD"[("ABCD".index(d["answer"]) + shift) % 4] if d["answer"] in "ABCD" else "A"
            for d in docs
        ]
        assert exact(score(task, [form.format(x) for x in others])) == [0.0] * len(docs)


def test_no_answer_scores_zero(offline_tasks: dict[str, Any]) -> None:
    for name in REASONING:
        task = offline_tasks["tasks"][name]
        results = score(task, ["I do not know."] * len(_docs(task)))
        assert exact(results) == [0.0] * len(results), name


# --------------------------------------------------------------------------- figures


def test_costed_text_figures_reach_the_metrics(offline_tasks: dict[str, Any]) -> None:
    task = offline_tasks["tasks"]["dvoting_gpqa_diamond"]
    docs = _docs(task)
    responses = [
        CostedText(f"\\boxed{{{d['answer']}}}", nfe=100 + i, n_samples=3, votes={}, trace={})
        for i, d in enumerate(docs)
    ]
    results = score(task, responses)
    assert [r["nfe"] for r in results] == [float(100 + i) for i in range(len(docs))]
    assert {r["n_samples"] for r in results} == {3.0}
    assert {r["exact_match"] for r in results} == {1.0}
    # the filtered response is the extracted letter, still carrying the figures
    filtered = task._instances[0].filtered_resps[FILTER]
    assert filtered == docs[0]["answer"] and filtered.nfe == 100


def test_plain_str_reports_no_figures(offline_tasks: dict[str, Any]) -> None:
    task = offline_tasks["tasks"]["dvoting_gsm8k"]
    results = score(task, [f"\\boxed{{{d['target']}}}" for d in _docs(task)])
    assert all(set(r) == {"exact_match"} for r in results)


def test_group_aggregates(offline_tasks: dict[str, Any]) -> None:
    group = offline_tasks["groups"]["dvoting_reasoning"]
    configured = {
        (a.metric, a.weight_by_size, tuple(a.filter_list)) for a in group.aggregate_metric_list
    }
    assert configured == {(m, False, (FILTER,)) for m in ("exact_match", "nfe", "n_samples")}


# --------------------------------------------------------------------------- hub path


def test_hub_rows_map_to_the_same_schema(utils: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without DVOTING_DATA_DIR the loaders read the hub datasets, whose layouts
    differ from the original files; a fake hub checks the mapping offline."""
    hub_rows = {
        ("openai/gsm8k", "main", "test"): [{"question": "q", "answer": "so\n#### 1,600"}],
        ("HuggingFaceH4/MATH-500", None, "test"): [
            {
                "problem": "p",
                "solution": "\\boxed{5}",
                "answer": "5",
                "subject": "Algebra",
                "level": 1,
                "unique_id": "test/algebra/1.json",
            }
        ],
        ("allenai/ai2_arc", "ARC-Challenge", "test"): [
            {
                "id": "x1",
                "question": "q",
                "choices": {"text": ["a", "b", "c", "d"], "label": ["1", "2", "3", "4"]},
                "answerKey": "3",
            }
        ],
        ("cais/mmlu", "all", "test"): [
            {"question": "q", "subject": "anatomy", "choices": ["a", "b", "c", "d"], "answer": 2}
        ],
        ("Idavidrein/gpqa", "gpqa_diamond", "train"): [
            {
                "Question": " q ",
                "Correct Answer": "right",
                "Incorrect Answer 1": "w1",
                "Incorrect Answer 2": "w2",
                "Incorrect Answer 3": "w3",
                "Record ID": "recABC",
                "High-level domain": "Physics",
                "Subdomain": "Optics",
            }
        ],
    }
    calls = []

    def fake_load_dataset(path: str, name: str | None = None, split: str | None = None, **kw: Any):
        calls.append((path, name, split))
        return datasets.Dataset.from_list(hub_rows[(path, name, split)])

    monkeypatch.delenv("DVOTING_DATA_DIR", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    gsm8k = utils.load_gsm8k(version=1.0, pretrained="some/model")["test"][0]
    assert gsm8k["target"] == "1600"
    assert utils.load_math500()["test"][0]["answer"] == "5"
    arc = utils.load_arc_challenge()["test"][0]
    assert arc["choices"] == ["a", "b", "c", "d"] and arc["answer"] == "C"
    mmlu = utils.load_mmlu()["test"][0]
    assert mmlu["answer"] == "C" and mmlu["subject"] == "anatomy"
    gpqa = utils.load_gpqa_diamond()["test"][0]
    order = utils.gpqa_option_order("recABC")
    assert gpqa["choices"] == [["right", "w1", "w2", "w3"][i] for i in order]
    assert gpqa["choices"]["ABCD".index(gpqa["answer"])] == "right" and gpqa["question"] == "q"
    assert len(calls) == 5


def test_missing_local_file_is_an_error(
    utils: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DVOTING_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="gsm8k/test.jsonl"):
        utils.load_gsm8k()
