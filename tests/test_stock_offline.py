"""lm-eval's stock tasks reading the local benchmark files (`DVOTING_DATA_DIR`).

Each test builds the stock task from lm-eval's own YAML with lm-eval's TaskManager (its
folder alone, not all ~14,000 files), so what is checked is what the stock task sees:
its documents, prompts, targets and few-shot examples. The mapping tests write tiny files
in the original formats into tmp_path (no ../shared needed); the tests on the real files
and the end-to-end run skip without ../shared.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterator

import datasets
import lm_eval
import lm_eval.tasks
import pytest
from conftest import DATA, require_shared
from lm_eval.tasks import TaskManager

from lm_eval_dvoting.integration import local_data, plugin

STOCK = Path(lm_eval.tasks.__file__).parent  # lm-eval's own task folder


def stock_task(name: str, folder: str) -> Any:
    """lm-eval's stock task `name`, built from its YAML folder `folder` (under STOCK)."""
    plugin.register()  # what the start-up hook does; idempotent
    manager = TaskManager(include_path=str(STOCK / folder), include_defaults=False)
    return manager.load([name])["tasks"][name]


@pytest.fixture
def no_hub(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Forbid the hub; the list records what was asked of it (tests that expect a call
    look at it, the others fail on the AssertionError)."""
    calls: list[tuple[Any, ...]] = []

    def load_dataset(path: str, name: str | None = None, **kwargs: Any) -> Any:
        calls.append((path, name))
        raise AssertionError(f"went to the hub for {path} {name}")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


GSM8K = [
    {"question": "Ann has 3 apples and buys 2. How many?", "answer": "3+2=<<3+2=5>>5\n#### 5"},
    {"question": "Bo has 9 pens, gives 4 away. How many?", "answer": "9-4=5\n#### 5"},
]
MATH500 = [
    {
        "problem": "What is $1+1$?",
        "solution": "Clearly $1+1=\\boxed{2}$.",
        "answer": "2",
        "subject": "Prealgebra",
        "level": 1,
        "unique_id": "test/prealgebra/1.json",
    }
]
ARC = [
    {
        "id": "Q1",
        "question": {
            "stem": "Which is a gas?",
            "choices": [
                {"text": "ice", "label": "1"},
                {"text": "steam", "label": "2"},
                {"text": "rock", "label": "3"},
                {"text": "wood", "label": "4"},
            ],
        },
        "answerKey": "2",
    },
    {
        "id": "Q2",
        "question": {
            "stem": "Pick C.",
            "choices": [
                {"text": "a", "label": "A"},
                {"text": "b", "label": "B"},
                {"text": "c", "label": "C"},
            ],
        },
        "answerKey": "C",
    },
]
# MMLU rows as the original CSVs hold them: no header, quoted commas and newlines, CRLF
MMLU_TEST = '"Is 2, a prime?\nAnswer it.",yes,no,maybe,never,A\r\n"Find 1+1.",0,1,2,3,C\r\n'
MMLU_DEV = '"Dev question?",w,x,y,z,D\r\n'
MMLU_VAL = '"Val question?",w,x,y,z,B\n'


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data folder in the original formats, named by DVOTING_DATA_DIR."""
    _write_jsonl(tmp_path / "gsm8k" / "test.jsonl", GSM8K)
    _write_jsonl(tmp_path / "math500" / "test.jsonl", MATH500)
    _write_jsonl(tmp_path / "arc_challenge" / "ARC-Challenge-Test.jsonl", ARC)
    for part, text in (("test", MMLU_TEST), ("dev", MMLU_DEV), ("val", MMLU_VAL)):
        folder = tmp_path / "mmlu" / "data" / part
        folder.mkdir(parents=True)
        (folder / f"abstract_algebra_{part}.csv").write_bytes(text.encode())
        (folder / f"anatomy_{part}.csv").write_bytes(MMLU_DEV.encode())
    monkeypatch.setenv("DVOTING_DATA_DIR", str(tmp_path))
    return tmp_path


# --------------------------------------------------------------------------- mapping


def test_gsm8k_reads_the_local_file_and_says_so(data: Path, no_hub: list, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="lm_eval_dvoting.integration.plugin"):
        task = stock_task("gsm8k_cot_zeroshot", "gsm8k")
    docs = list(task.test_docs())
    assert docs == GSM8K  # the hub's columns are the file's: question, answer
    assert task.doc_to_text(docs[0]) == f"Q: {GSM8K[0]['question']}\nA: Let's think step by step."
    assert task.doc_to_target(docs[1]) == GSM8K[1]["answer"]
    # its YAML names a train split (few-shot source); zero-shot, it may stay empty
    assert len(task.dataset["train"]) == 0
    (line,) = [r.getMessage() for r in caplog.records if "gsm8k_cot_zeroshot" in r.getMessage()]
    assert f"from {data}, not from the hub" in line
    assert f"test: {data / 'gsm8k' / 'test.jsonl'} (2 rows)" in line
    assert "train: empty (no gsm8k/train.jsonl)" in line
    assert no_hub == []


def test_gsm8k_train_file_is_read_when_there(data: Path, no_hub: list) -> None:
    _write_jsonl(data / "gsm8k" / "train.jsonl", GSM8K[::-1])
    task = stock_task("gsm8k", "gsm8k")  # 5-shot from train: needs the file
    assert list(task.fewshot_docs()) == GSM8K[::-1]


def test_arc_challenge_maps_to_the_hub_columns(data: Path, no_hub: list) -> None:
    task = stock_task("arc_challenge", "arc")
    first, second = task.test_docs()
    assert first["question"] == "Which is a gas?" and first["id"] == "Q1"
    assert first["choices"] == {
        "text": ["ice", "steam", "rock", "wood"],
        "label": ["1", "2", "3", "4"],
    }
    assert task.doc_to_text(first) == "Question: Which is a gas?\nAnswer:"
    assert task.doc_to_choice(first) == ["ice", "steam", "rock", "wood"]
    assert task.doc_to_target(first) == 1  # the position of label "2"
    assert task.doc_to_choice(second) == ["a", "b", "c"] and task.doc_to_target(second) == 2
    assert len(task.dataset["train"]) == len(task.dataset["validation"]) == 0


def test_mmlu_subject_maps_to_the_hub_columns(data: Path, no_hub: list) -> None:
    task = stock_task("mmlu_abstract_algebra", "mmlu/default")
    first, second = task.test_docs()
    assert first == {
        "question": "Is 2, a prime?\nAnswer it.",
        "subject": "abstract_algebra",
        "choices": ["yes", "no", "maybe", "never"],
        "answer": 0,
    }
    assert task.doc_to_target(second) == 2  # "C" is the index, as the hub's ClassLabel
    assert task.doc_to_text(second).startswith("Find 1+1.\nA. 0\nB. 1\nC. 2\nD. 3\nAnswer:")
    assert [d["question"] for d in task.fewshot_docs()] == ["Dev question?"]  # from dev
    assert [d["question"] for d in task.dataset["validation"]] == ["Val question?"]


def test_mmlu_all_is_every_subject_in_order(data: Path) -> None:
    source = local_data.stock_source("cais/mmlu", "all")
    needs = local_data.SplitNeeds(evaluated="test", fewshot=None, named=("test",))
    dataset, notes = local_data.stock_dataset("t", source, "all", data, needs)
    assert [d["subject"] for d in dataset["test"]] == ["abstract_algebra"] * 2 + ["anatomy"]
    assert notes[0] == f"test: 2 files in {data / 'mmlu' / 'data' / 'test'} (3 rows)"


@pytest.mark.parametrize("name", ["minerva_math500", "hendrycks_math500"])
def test_math500_maps_to_the_hub_columns(data: Path, no_hub: list, name: str) -> None:
    task = stock_task(name, name.split("_")[0] + "_math")
    (doc,) = task.test_docs()
    assert doc["problem"] == "What is $1+1$?" and doc["solution"] == MATH500[0]["solution"]
    assert doc["answer"] == "2"  # the stock process_docs' answer, from the solution's box


# --------------------------------------------------------------------------- refusals


def test_missing_test_file_is_an_error_naming_it(data: Path, no_hub: list) -> None:
    (data / "gsm8k" / "test.jsonl").unlink()
    with pytest.raises(
        FileNotFoundError,
        match=(
            rf"task gsm8k_cot_zeroshot evaluates on the 'test' split, and DVOTING_DATA_DIR="
            rf"{data} has no gsm8k/test.jsonl; add the file, or unset DVOTING_DATA_DIR"
        ),
    ):
        stock_task("gsm8k_cot_zeroshot", "gsm8k")
    assert no_hub == []


def test_fewshot_split_must_be_there(data: Path, no_hub: list) -> None:
    # stock gsm8k takes 5 examples from train: an empty train split would fail later
    # in lm-eval's sampler with "no documents available for sampling"
    with pytest.raises(
        FileNotFoundError,
        match=(
            r"task gsm8k takes its few-shot examples from the 'train' split, and "
            r".* has no gsm8k/train.jsonl"
        ),
    ):
        stock_task("gsm8k", "gsm8k")


def test_unknown_mmlu_subject_is_an_error(data: Path) -> None:
    source = local_data.stock_source("hails/mmlu_no_train", "astronomy")
    needs = local_data.SplitNeeds(evaluated="test", fewshot=None, named=("test",))
    with pytest.raises(FileNotFoundError, match="has no mmlu/data/test/astronomy_test.csv"):
        local_data.stock_dataset("t", source, "astronomy", data, needs)


# --------------------------------------------------------------------------- the hub


def test_without_the_variable_the_hub_is_used(no_hub: list, monkeypatch) -> None:
    monkeypatch.delenv("DVOTING_DATA_DIR", raising=False)
    with pytest.raises(AssertionError, match="went to the hub"):
        stock_task("gsm8k_cot_zeroshot", "gsm8k")
    assert no_hub == [("openai/gsm8k", "main")]


def test_datasets_without_local_files_still_use_the_hub(data: Path, no_hub: list) -> None:
    with pytest.raises(AssertionError, match="went to the hub"):
        stock_task("arc_easy", "arc")  # ARC-Easy has no local source
    assert no_hub == [("allenai/ai2_arc", "ARC-Easy")]


def test_stock_sources() -> None:
    assert local_data.stock_source("openai/gsm8k", "socratic") is None  # other answers
    assert local_data.stock_source("HuggingFaceH4/MATH-500", None) is not None
    assert (
        local_data.stock_source("cais/mmlu", "anatomy")
        is local_data.STOCK_SOURCES[("cais/mmlu", None)]
    )
    assert local_data.stock_source(None, None) is None


# --------------------------------------------------------------------------- real files


@pytest.fixture
def real_data(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("DVOTING_DATA_DIR", str(require_shared(DATA)))
    yield DATA


@pytest.mark.parametrize(
    "name, folder, size",
    [
        ("gsm8k_cot_zeroshot", "gsm8k", 1319),
        ("minerva_math500", "minerva_math", 500),
        ("arc_challenge", "arc", 1172),
        ("mmlu_professional_law", "mmlu/default", 1534),
    ],
)
def test_real_files_give_the_full_test_sets(
    real_data: Path, no_hub: list, name: str, folder: str, size: int
) -> None:
    assert len(stock_task(name, folder).dataset["test"]) == size


def test_real_mmlu_all(real_data: Path) -> None:
    source = local_data.stock_source("cais/mmlu", "all")
    needs = local_data.SplitNeeds(evaluated="test", fewshot=None, named=("test",))
    dataset, _ = local_data.stock_dataset("t", source, "all", real_data, needs)
    assert len(dataset["test"]) == 14042 and len(dataset["dev"]) == 285
    assert len(dataset["validation"]) == 1531


def test_stock_gsm8k_end_to_end_offline(real_data: Path, no_hub: list, caplog) -> None:
    """The mission's example offline: stock gsm8k_cot_zeroshot on the demo model,
    `--gen_kwargs max_gen_toks=32 --limit 2` (strategy=single: one sample per question)."""
    plugin.register()
    manager = TaskManager(include_path=str(STOCK / "gsm8k"), include_defaults=False)
    with caplog.at_level(logging.WARNING, logger="lm_eval_dvoting.integration.plugin"):
        results = lm_eval.simple_evaluate(
            model="dvoting-llada",
            model_args="pretrained=tiny-arith,strategy=single",
            tasks=["gsm8k_cot_zeroshot"],
            limit=2,
            gen_kwargs="max_gen_toks=32",
            device="cpu",
            log_samples=True,
            task_manager=manager,
            verbosity="ERROR",
        )
    expected = local_data.read_jsonl(real_data / "gsm8k" / "test.jsonl")[:2]
    records = results["samples"]["gsm8k_cot_zeroshot"]
    for record in records:
        assert record["doc"] == expected[record["doc_id"]]
    assert sorted({r["filter"] for r in records}) == ["flexible-extract", "strict-match"]
    figures = results["results"]["gsm8k_cot_zeroshot"]
    assert figures["nfe,strict-match"] == 32  # 32 tokens generated, one token per step
    assert 0 <= figures["exact_match,strict-match"] <= 1
    assert any(str(real_data / "gsm8k" / "test.jsonl") in r.getMessage() for r in caplog.records)
    assert no_hub == []
