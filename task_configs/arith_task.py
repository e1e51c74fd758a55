"""Datasets of the demo tasks: ``dvoting_arith`` (the 500 held-out test problems) and
``dvoting_arith_valid`` (the 200 validation problems).

The test problems ship inside the package (``lm_eval_dvoting/demo/arith_test.jsonl``,
made by ``lm_eval_dvoting.demo.arith`` from its test seed); the validation problems are
drawn from their own seed at load time, canonically disjoint from the test set. Both run
offline. lm-eval imports this file by its path, so it imports only installed packages.
"""

from __future__ import annotations

import json
from typing import Any

import datasets


def load_test(**kwargs: Any) -> datasets.DatasetDict:
    """The test split: ``question`` (e.g. ``7+2-5=?``), ``solution``, ``target``, ``steps``.

    lm-eval passes the task metadata merged with the model args; none is needed here.
    """
    from lm_eval_dvoting.demo.arith import TEST_FILE

    rows = [json.loads(line) for line in TEST_FILE.read_text().splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list([_doc(r) for r in rows])})


def load_validation(**kwargs: Any) -> datasets.DatasetDict:
    """The validation split: the problems the demo's settings are chosen on, never the test set.

    They are `arith.held_out_sets()`'s validation problems (seed ``VALID_SEED``), the ones
    the shipped checkpoint was chosen on; same fields as the test split.
    """
    from lm_eval_dvoting.demo.arith import held_out_sets

    _, valid = held_out_sets()
    docs = [
        _doc({"question": p.question, "solution": p.solution, "answer": p.answer, "steps": p.steps})
        for p in valid
    ]
    return datasets.DatasetDict({"validation": datasets.Dataset.from_list(docs)})


def _doc(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "question": row["question"],
        "solution": row["solution"],
        "target": str(row["answer"]),
        "steps": row["steps"],
    }
