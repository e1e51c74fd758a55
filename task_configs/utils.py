"""Helpers of the ``dvoting_*`` tasks: data loading, prompts, answer filters, scoring.

The YAMLs next to this file name these functions with ``!function utils.NAME``.
lm-eval imports this file by its path (not as a package module), so it imports
only installed packages, never siblings.

Data
    Each ``load_*`` function is a task's ``custom_dataset``: lm-eval calls it with
    the task's metadata merged with the model args, hence ``**kwargs``. It returns a
    `datasets.DatasetDict` with one ``test`` split in a fixed, per-task schema (the
    same whether the data came from the hub or from local files), so prompts and
    scoring never care where the data came from:

    - online (default): the hub datasets a user expects (``openai/gsm8k`` main/test,
      ``HuggingFaceH4/MATH-500`` test, ``allenai/ai2_arc`` ARC-Challenge/test,
      ``cais/mmlu`` all/test, ``Idavidrein/gpqa`` gpqa_diamond/gpqa_main train; GPQA
      is gated: accept its terms on the hub and log in first);
    - offline: when the environment variable ``DVOTING_DATA_DIR`` (or the metadata
      key ``dvoting_data_dir``, e.g. ``--metadata '{"dvoting_data_dir": "/data"}'``)
      names a folder, the original files are read from it::

          gsm8k/test.jsonl                       (openai/grade-school-math)
          math500/test.jsonl                     (openai/prm800k math_splits)
          arc_challenge/ARC-Challenge-Test.jsonl (AI2's ARC-V1-Feb2018)
          mmlu/data/test/<subject>_test.csv      (hendrycks/test, no header row)
          gpqa/dataset.zip                       (the authors' password-protected zip)

      A file missing there is an error, never a silent fall back to the hub. GPQA's
      zip is opened in memory only (the authors ask that its questions are never
      stored in plain text). `lm_eval_dvoting.integration.local_data` reads the files; with the
      folder named, lm-eval's stock tasks on the same datasets read it too
      (docs/OFFLINE_DATA.md).

Answers
    The filters extract each response's answer with
    `lm_eval_dvoting.core.answers.extract_answer`, the very function the voting
    strategies use, so what is voted is what is scored. The choice filter also passes
    the question's number of options, so a letter beyond them is ``[invalid]``; the
    vote, which does not see the question, reads letters A-J, and since the range
    only decides whether a letter counts, never which one is read, both give each
    text the same score. A response may be a
    `lm_eval_dvoting.integration.costs.CostedText` carrying ``nfe`` / ``n_samples``; the
    filters keep those figures on their output and ``process_results`` reports
    them as metrics. A plain ``str`` response (any other lm-eval model) has no
    figures: the ``nfe`` / ``n_samples`` metrics are then left out of the results
    rather than reported as 0 or NaN (lm-eval aggregates only the metrics that
    ``process_results`` returns, and NaN would spoil the results JSON).
"""

from __future__ import annotations

import csv
import hashlib
import io
import random
import zipfile
from typing import Any, Callable, Iterable, Optional

import datasets

from lm_eval_dvoting.core.answers import answers_equivalent, extract_answer, option_count
from lm_eval_dvoting.core.temporal import step_figures
from lm_eval_dvoting.integration import local_data
from lm_eval_dvoting.integration.costs import CostedText

# What a filter writes when a response has no extractable answer (lm-eval's own
# regex filter uses the same word), so `--log_samples` shows it plainly.
INVALID = "[invalid]"

GPQA_ZIP_PASSWORD = b"deserted-untie-orchid"  # published in the authors' README
LETTERS = "ABCDEFGHIJ"


# --------------------------------------------------------------------------- data


def _test_split(rows: Iterable[dict[str, Any]]) -> datasets.DatasetDict:
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(list(rows))})


def _hub(path: str, name: Optional[str], split: str) -> datasets.Dataset:
    return datasets.load_dataset(path, name, split=split)


def _gsm8k_doc(row: dict[str, Any]) -> dict[str, Any]:
    # `target` is the canonical reference number (text after `#### `, normalised
    # like a model's answer), so scoring is a plain string comparison.
    return {
        "question": row["question"],
        "answer": row["answer"],
        "target": extract_answer(row["answer"].split("####")[-1], "number"),
    }


def load_gsm8k(**kwargs: Any) -> datasets.DatasetDict:
    """GSM8K test (1319): ``question``, ``answer`` (worked solution), ``target``."""
    data_dir = local_data.data_dir(kwargs)
    if data_dir:
        rows = local_data.read_jsonl(local_data.local_file(data_dir, "gsm8k/test.jsonl"))
    else:
        rows = _hub("openai/gsm8k", "main", "test")
    return _test_split(_gsm8k_doc(row) for row in rows)


_MATH500_FIELDS = ("problem", "solution", "answer", "subject", "level", "unique_id")


def load_math500(**kwargs: Any) -> datasets.DatasetDict:
    """MATH500 test (500): ``problem``, ``solution``, ``answer`` (LaTeX), ``subject``,
    ``level``, ``unique_id``."""
    data_dir = local_data.data_dir(kwargs)
    if data_dir:
        rows = local_data.read_jsonl(local_data.local_file(data_dir, "math500/test.jsonl"))
    else:
        rows = _hub("HuggingFaceH4/MATH-500", None, "test")
    return _test_split({key: row[key] for key in _MATH500_FIELDS} for row in rows)


def _arc_doc(
    row_id: str, stem: str, texts: list[str], labels: list[str], key: str
) -> dict[str, Any]:
    # The answer letter is the *position* of the keyed label, so the 22 items with
    # labels 1-4 become A-D and every item is shown as A), B), ... in order.
    return {
        "id": row_id,
        "question": stem,
        "choices": list(texts),
        "answer": LETTERS[list(labels).index(key)],
    }


def load_arc_challenge(**kwargs: Any) -> datasets.DatasetDict:
    """ARC-Challenge test (1172): ``id``, ``question``, ``choices``, ``answer`` (letter).

    Items keep their own number of options (4 for 1165 items, 3 for 4, 5 for 3);
    see the task YAML for why 3-option items are not padded.
    """
    data_dir = local_data.data_dir(kwargs)
    if data_dir:
        rows = local_data.read_jsonl(
            local_data.local_file(data_dir, "arc_challenge/ARC-Challenge-Test.jsonl")
        )
        docs = (
            _arc_doc(
                r["id"],
                r["question"]["stem"],
                [c["text"] for c in r["question"]["choices"]],
                [c["label"] for c in r["question"]["choices"]],
                r["answerKey"],
            )
            for r in rows
        )
    else:
        rows = _hub("allenai/ai2_arc", "ARC-Challenge", "test")
        docs = (
            _arc_doc(
                r["id"], r["question"], r["choices"]["text"], r["choices"]["label"], r["answerKey"]
            )
            for r in rows
        )
    return _test_split(docs)


def load_mmlu(**kwargs: Any) -> datasets.DatasetDict:
    """MMLU test, all 57 subjects (14042): ``question``, ``subject``, ``choices``,
    ``answer`` (letter); subjects in alphabetical order."""
    data_dir = local_data.data_dir(kwargs)
    docs: list[dict[str, Any]] = []
    if data_dir:
        folder = local_data.local_file(data_dir, "mmlu/data/test")
        for path in sorted(folder.glob("*_test.csv")):
            subject = path.name[: -len("_test.csv")]
            for question, choices, answer in local_data.read_mmlu_csv(path):
                docs.append(
                    {"question": question, "subject": subject, "choices": choices, "answer": answer}
                )
    else:
        for row in _hub("cais/mmlu", "all", "test"):
            docs.append(
                {
                    "question": row["question"],
                    "subject": row["subject"],
                    "choices": list(row["choices"]),
                    "answer": LETTERS[int(row["answer"])],
                }
            )
    return _test_split(docs)


def gpqa_option_order(record_id: str) -> list[int]:
    """The fixed shuffle of GPQA's options for one question.

    Returns a permutation of ``[0, 1, 2, 3]`` = (correct, incorrect 1, 2, 3): the
    option shown as ``A)`` is ``original[order[0]]``, and so on. It is seeded by the
    SHA-256 of the ``Record ID`` (not Python's ``hash()``, which changes per
    process), so every run, process and machine shows the same order, and the
    order of one question does not depend on which others are loaded.
    """
    seed = int.from_bytes(hashlib.sha256(record_id.encode("utf-8")).digest()[:8], "big")
    order = [0, 1, 2, 3]
    random.Random(seed).shuffle(order)
    return order


def _gpqa_doc(row: dict[str, Any]) -> dict[str, Any]:
    original = [
        row["Correct Answer"],
        row["Incorrect Answer 1"],
        row["Incorrect Answer 2"],
        row["Incorrect Answer 3"],
    ]
    order = gpqa_option_order(row["Record ID"])
    return {
        "id": row["Record ID"],
        "question": row["Question"].strip(),
        "choices": [original[i].strip() for i in order],
        "answer": LETTERS[order.index(0)],
        "domain": row["High-level domain"],
        "subdomain": row["Subdomain"],
    }


def _load_gpqa(subset: str, kwargs: dict[str, Any]) -> datasets.DatasetDict:
    data_dir = local_data.data_dir(kwargs)
    if data_dir:
        archive = local_data.local_file(data_dir, "gpqa/dataset.zip")
        # read into memory only: the authors ask that GPQA is never stored unpacked
        with zipfile.ZipFile(archive) as zf:
            text = zf.read(f"dataset/{subset}.csv", pwd=GPQA_ZIP_PASSWORD).decode("utf-8")
        rows: Iterable[dict[str, Any]] = csv.DictReader(io.StringIO(text, newline=""))
    else:
        # the hub copy has only a `train` split; it is the whole subset
        rows = _hub("Idavidrein/gpqa", subset, "train")
    return _test_split(_gpqa_doc(row) for row in rows)


def load_gpqa_diamond(**kwargs: Any) -> datasets.DatasetDict:
    """GPQA diamond (198): ``id``, ``question``, ``choices`` (shuffled, see
    `gpqa_option_order`), ``answer`` (letter), ``domain``, ``subdomain``."""
    return _load_gpqa("gpqa_diamond", kwargs)


def load_gpqa_main(**kwargs: Any) -> datasets.DatasetDict:
    """GPQA main (448), same schema as `load_gpqa_diamond`."""
    return _load_gpqa("gpqa_main", kwargs)


# --------------------------------------------------------------------------- prompts


def _letters_phrase(n: int) -> str:
    letters = list(LETTERS[:n])
    return ", ".join(letters[:-1]) + " or " + letters[-1]


def _options(doc: dict[str, Any]) -> str:
    return "\n".join(f"{LETTERS[i]}) {text}" for i, text in enumerate(doc["choices"]))


def doc_to_text_choice_boxed(doc: dict[str, Any]) -> str:
    """ARC-Challenge / GPQA prompt (paper, section 5): options ``A)``.., answer as
    ``\\boxed{LETTER}``."""
    return (
        "Please answer the multiple-choice question step by step and put the letter of "
        f"the correct option ({_letters_phrase(len(doc['choices']))}) in \\boxed{{}}.\n\n"
        f"{doc['question'].strip()}\n\n{_options(doc)}"
    )


def doc_to_text_choice_answer_line(doc: dict[str, Any]) -> str:
    """MMLU prompt (paper, section 5): options ``A)``.., a last line ``Answer: LETTER``."""
    return (
        "Please answer the multiple-choice question step by step. The last line of your "
        'response must be of the form "Answer: LETTER", where LETTER is one of '
        f"{_letters_phrase(len(doc['choices']))}.\n\n"
        f"{doc['question'].strip()}\n\n{_options(doc)}"
    )


# --------------------------------------------------------------------------- filters


def _extract_filter(kind: str) -> Callable[[list[list[Any]], list[dict]], list[list[str]]]:
    def apply(resps: list[list[Any]], docs: list[dict]) -> list[list[str]]:
        # `CostedText.like` keeps the response's cost figures on the extracted text; a
        # letter beyond the question's options is no answer, in the vote too (the harness
        # reads the same `option_count` from the request's doc)
        return [
            [
                CostedText.like(extract_answer(str(r), kind, option_count(doc, kind)) or INVALID, r)
                for r in sample_resps
            ]
            for sample_resps, doc in zip(resps, docs, strict=True)
        ]

    apply.__name__ = f"extract_{kind}"
    apply.__doc__ = (
        f"lm-eval `custom` filter: each response -> its {kind!r} answer, or {INVALID!r}."
    )
    return _NamedFilter(apply)


class _NamedFilter:
    """A filter function that prints as its name: lm-eval writes `str(filter_fn)` into the
    results' task configs, and a closure's repr holds a memory address that changes
    from run to run (two runs of one command would not give identical results files)."""

    def __init__(self, function: Callable[[list[list[Any]], list[dict]], list[list[str]]]) -> None:
        self.function = function
        self.__name__, self.__doc__ = function.__name__, function.__doc__

    def __call__(self, resps: list[list[Any]], docs: list[dict]) -> list[list[str]]:
        return self.function(resps, docs)

    def __repr__(self) -> str:
        return f"<filter {self.__name__}>"


extract_number = _extract_filter("number")
extract_math = _extract_filter("math")
extract_choice = _extract_filter("choice")


# --------------------------------------------------------------------------- scoring


def _score(gold: str, results: list[Any], kind: str) -> dict[str, Any]:
    response = results[0]
    predicted = None if str(response) == INVALID else str(response)
    scores = {"exact_match": float(answers_equivalent(gold, predicted, kind))}
    # Only a dVoting model's CostedText carries figures; another model's plain str
    # reports none (omitted, not 0, so no fake cost enters the mean).
    for figure in ("nfe", "n_samples"):
        value = getattr(response, figure, None)
        if value is not None:
            scores[figure] = float(value)
    # The per-request trace (every candidate's text, answer, NFE, kept positions and
    # token ids; the votes; the chosen sample) rides along as the per-sample value of
    # the `dvoting_trace` "metric", so `--log_samples` writes it into each sample
    # record; `count_traces` aggregates it to a plain count. `dvoting report` reads it.
    trace = getattr(response, "trace", None)
    if trace is not None and any("steps" in c for c in trace.get("candidates", [])):
        # the temporal vote's per-step answers: scored against the gold here, where it is
        # known; `ever_pass` and `tse` become per-question metrics (temporal.step_figures)
        trace, figures = step_figures(
            trace,
            lambda answer: answers_equivalent(gold, answer, kind),
            lambda a, b: answers_equivalent(a, b, kind),
        )
        scores.update(figures)
    if trace is not None:
        scores["dvoting_trace"] = trace
    return scores


def count_traces(traces: list[Any]) -> int:
    """Aggregation of the `dvoting_trace` metric: the number of questions traced.

    The traces themselves are per-sample values (written by `--log_samples`); the
    results table shows only how many there were, never a mean of dicts.
    """
    return len(traces)


def process_results_number(doc: dict[str, Any], results: list[Any]) -> dict[str, Any]:
    """GSM8K: the extracted number equals the canonical reference number."""
    return _score(doc["target"], results, "number")


def process_results_math(doc: dict[str, Any], results: list[Any]) -> dict[str, Any]:
    """MATH500: the boxed answer is the reference answer, or mathematically
    equivalent to it (math-verify)."""
    return _score(doc["answer"], results, "math")


def process_results_choice(doc: dict[str, Any], results: list[Any]) -> dict[str, Any]:
    """Multiple choice: the extracted letter is the reference letter."""
    return _score(doc["answer"], results, "choice")
