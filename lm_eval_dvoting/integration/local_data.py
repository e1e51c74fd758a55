"""The benchmark files on local disk: where they lie, how to read them, and how lm-eval's
stock tasks read them instead of the hub.

One folder holds the original files (the layout of `task_configs/utils.py`)::

    gsm8k/test.jsonl                        (openai/grade-school-math; train.jsonl optional)
    math500/test.jsonl                      (openai/prm800k math_splits)
    arc_challenge/ARC-Challenge-Test.jsonl  (AI2's ARC-V1-Feb2018; -Train, -Dev optional)
    mmlu/data/{test,val,dev}/<subject>_{test,val,dev}.csv  (hendrycks/test, no header row)
    gpqa/dataset.zip                        (dvoting_gpqa_* only)

It is named by the environment variable `DVOTING_DATA_DIR`, or by the task metadata key
`dvoting_data_dir` (`--metadata '{"dvoting_data_dir": "/data"}'`), which wins.

The dvoting_* tasks read it through `task_configs/utils.py`. lm-eval's stock tasks read it
through `stock_dataset`, which the plugin calls in place of `datasets.load_dataset` for the
hub datasets in `STOCK_SOURCES` (any task whose `dataset_path` / `dataset_name` is one of
them: `gsm8k`, `gsm8k_cot_zeroshot`, `minerva_math500`, `hendrycks_math500`,
`arc_challenge`, `mmlu_*`, ...). Each file's rows are given the hub dataset's columns, so
the stock task's prompts and scoring see what they would see from the hub. Only when the
folder is named; a file the task needs that is missing is an error, never the hub.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import datasets

DATA_DIR_ENV = "DVOTING_DATA_DIR"
DATA_DIR_KEY = "dvoting_data_dir"  # the task-metadata key, for `--metadata`
LETTERS = "ABCD"  # MMLU's answer letters, in the order of its four options


# --------------------------------------------------------------------------- files


def data_dir(metadata: Optional[Mapping[str, Any]] = None) -> Optional[Path]:
    """The local data folder the user named (metadata key first, then the environment
    variable), or None when neither is set: then every task reads the hub."""
    folder = (metadata or {}).get(DATA_DIR_KEY) or os.environ.get(DATA_DIR_ENV)
    return Path(folder).expanduser() if folder else None


def local_file(folder: Path, relative: str) -> Path:
    """`folder / relative`, which must exist; the error names both and the way out."""
    path = folder / relative
    if not path.exists():
        raise FileNotFoundError(
            f"{DATA_DIR_ENV}={folder} has no {relative}; lay the folder out as described in "
            f"task_configs/utils.py, or unset {DATA_DIR_ENV} to use the hub"
        )
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON Lines file (blank lines skipped)."""
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def read_mmlu_csv(path: Path) -> Iterator[tuple[str, list[str], str]]:
    """(question, the four options, answer letter) per row of one MMLU CSV file.

    The files have no header row and RFC-4180 quoting with commas and newlines in fields.
    """
    with path.open(encoding="utf-8", newline="") as handle:
        for question, a, b, c, d, answer in csv.reader(handle):
            yield question, [a, b, c, d], answer.strip()


# --------------------------------------------------------------------------- stock tasks


@dataclass(frozen=True)
class StockSource:
    """Where one hub dataset's splits lie in the data folder, and its hub columns.

    `files(name, folder)` maps each split to the files that make it, relative to the
    folder (`name` is the task's `dataset_name`); `rows(path)` reads one file into rows
    with the hub dataset's columns; `required` are the splits the folder must have.
    """

    features: datasets.Features
    files: Callable[[Optional[str], Path], dict[str, list[str]]]
    rows: Callable[[Path], list[dict[str, Any]]]
    required: tuple[str, ...] = ("test",)


def _gsm8k_files(name: Optional[str], folder: Path) -> dict[str, list[str]]:
    return {"test": ["gsm8k/test.jsonl"], "train": ["gsm8k/train.jsonl"]}


def _gsm8k_rows(path: Path) -> list[dict[str, Any]]:
    # the hub's columns are the file's: question, answer (a worked solution, "#### N")
    return [{"question": r["question"], "answer": r["answer"]} for r in read_jsonl(path)]


_MATH500_COLUMNS = ("problem", "solution", "answer", "subject", "level", "unique_id")


def _math500_files(name: Optional[str], folder: Path) -> dict[str, list[str]]:
    return {"test": ["math500/test.jsonl"]}


def _math500_rows(path: Path) -> list[dict[str, Any]]:
    return [{key: r[key] for key in _MATH500_COLUMNS} for r in read_jsonl(path)]


def _arc_files(name: Optional[str], folder: Path) -> dict[str, list[str]]:
    stem = "arc_challenge/ARC-Challenge-"
    return {
        "test": [stem + "Test.jsonl"],
        "train": [stem + "Train.jsonl"],
        "validation": [stem + "Dev.jsonl"],
    }


def _arc_rows(path: Path) -> list[dict[str, Any]]:
    # AI2's file nests the stem and the options under "question"; the hub has a flat
    # `question` (the stem) and `choices` {text: [...], label: [...]}, labels kept as they
    # are (22 items use 1-4; the stock task finds the answer by the label's position)
    return [
        {
            "id": r["id"],
            "question": r["question"]["stem"],
            "choices": {
                "text": [c["text"] for c in r["question"]["choices"]],
                "label": [c["label"] for c in r["question"]["choices"]],
            },
            "answerKey": r["answerKey"],
        }
        for r in read_jsonl(path)
    ]


# the hub's split names -> the folder and file suffix of the original release
_MMLU_SPLITS = {"test": "test", "validation": "val", "dev": "dev"}


def _mmlu_files(name: Optional[str], folder: Path) -> dict[str, list[str]]:
    if name == "all":  # every subject, in alphabetical order as on the hub
        tests = sorted(local_file(folder, "mmlu/data/test").glob("*_test.csv"))
        subjects = [path.name[: -len("_test.csv")] for path in tests]
    else:
        subjects = [str(name)]
    return {
        split: [f"mmlu/data/{part}/{subject}_{part}.csv" for subject in subjects]
        for split, part in _MMLU_SPLITS.items()
    }


def _mmlu_rows(path: Path) -> list[dict[str, Any]]:
    # the hub's `answer` is the option's index (a ClassLabel A-D), `subject` the file's
    subject = path.name.rsplit("_", 1)[0]
    return [
        {
            "question": question,
            "subject": subject,
            "choices": choices,
            "answer": LETTERS.index(letter),
        }
        for question, choices, letter in read_mmlu_csv(path)
    ]


_MMLU = StockSource(
    features=datasets.Features(
        {
            "question": datasets.Value("string"),
            "subject": datasets.Value("string"),
            "choices": datasets.Sequence(datasets.Value("string")),
            "answer": datasets.ClassLabel(names=list(LETTERS)),
        }
    ),
    files=_mmlu_files,
    rows=_mmlu_rows,
)

# (dataset_path, dataset_name) of a hub dataset -> its local files; a name of None
# stands for any name (MMLU's subjects)
STOCK_SOURCES: dict[tuple[str, Optional[str]], StockSource] = {
    ("openai/gsm8k", "main"): StockSource(
        features=datasets.Features(
            {"question": datasets.Value("string"), "answer": datasets.Value("string")}
        ),
        files=_gsm8k_files,
        rows=_gsm8k_rows,
    ),
    ("HuggingFaceH4/MATH-500", "default"): StockSource(
        features=datasets.Features(
            {
                **{key: datasets.Value("string") for key in _MATH500_COLUMNS},
                "level": datasets.Value("int64"),
            }
        ),
        files=_math500_files,
        rows=_math500_rows,
    ),
    ("allenai/ai2_arc", "ARC-Challenge"): StockSource(
        features=datasets.Features(
            {
                "id": datasets.Value("string"),
                "question": datasets.Value("string"),
                "choices": datasets.Sequence(
                    {"text": datasets.Value("string"), "label": datasets.Value("string")}
                ),
                "answerKey": datasets.Value("string"),
            }
        ),
        files=_arc_files,
        rows=_arc_rows,
    ),
    ("cais/mmlu", None): _MMLU,
    # lm-eval's llama3 MMLU tasks read this copy of cais/mmlu without auxiliary_train
    ("hails/mmlu_no_train", None): _MMLU,
}


def stock_source(path: Optional[str], name: Optional[str]) -> Optional[StockSource]:
    """The local source of the hub dataset `path` / `name`, or None when there is none."""
    if path is None:
        return None
    if path == "HuggingFaceH4/MATH-500" and name is None:
        name = "default"
    return STOCK_SOURCES.get((path, name)) or STOCK_SOURCES.get((path, None))


@dataclass(frozen=True)
class SplitNeeds:
    """The splits a task reads: it evaluates on `evaluated`, takes its few-shot
    examples from `fewshot` (None: zero-shot or examples given in the YAML) and names
    `named` in its config (lm-eval opens a named split even when it is not used)."""

    evaluated: str
    fewshot: Optional[str]
    named: tuple[str, ...]


def stock_dataset(
    task: str, source: StockSource, name: Optional[str], folder: Path, needs: SplitNeeds
) -> tuple[datasets.DatasetDict, list[str]]:
    """Task `task`'s dataset read from `folder`, and one note per split for the log.

    A split the task evaluates on or takes few-shot examples from must be there (else
    FileNotFoundError naming the file); another split it names but the folder lacks is
    left empty, and its note says so.
    """
    splits: dict[str, datasets.Dataset] = {}
    notes: list[str] = []
    for split, relatives in source.files(name, folder).items():
        paths = [folder / relative for relative in relatives]
        missing = [rel for rel, path in zip(relatives, paths) if not path.exists()]
        if missing:
            must = split in source.required or split in (needs.evaluated, needs.fewshot)
            if must:
                raise FileNotFoundError(_missing_message(task, split, needs, folder, missing))
            if split in needs.named:
                splits[split] = _dataset([], source.features)
                notes.append(f"{split}: empty (no {missing[0]})")
            continue
        rows = [row for path in paths for row in source.rows(path)]
        splits[split] = _dataset(rows, source.features)
        shown = str(paths[0]) if len(paths) == 1 else f"{len(paths)} files in {paths[0].parent}"
        notes.append(f"{split}: {shown} ({len(rows)} rows)")
    return datasets.DatasetDict(splits), notes


def _dataset(rows: list[dict[str, Any]], features: datasets.Features) -> datasets.Dataset:
    # from_list cannot build an empty table with columns; from_dict can
    columns = {key: [row[key] for row in rows] for key in features}
    return datasets.Dataset.from_dict(columns, features=features)


def _missing_message(
    task: str, split: str, needs: SplitNeeds, folder: Path, missing: list[str]
) -> str:
    roles = {needs.evaluated: "evaluates on", needs.fewshot: "takes its few-shot examples from"}
    more = f" (nor {len(missing) - 1} more files)" if len(missing) > 1 else ""
    return (
        f"task {task} {roles.get(split, 'needs')} the {split!r} split, and "
        f"{DATA_DIR_ENV}={folder} has no {missing[0]}{more}; add the file, or unset "
        f"{DATA_DIR_ENV} to read the hub"
    )
