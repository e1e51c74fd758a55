"""Dataset of the ``dvoting_arith`` task: the demo's 500 held-out arithmetic problems.

The problems ship inside the package (``lm_eval_dvoting/demo/arith_test.jsonl``,
made by ``lm_eval_dvoting.demo.arith`` from its test seed), so the task runs offline.
lm-eval imports this file by its path, so it imports only installed packages.
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
    docs = [{"question": r["question"], "solution": r["solution"], "target": str(r["answer"]),
             "steps": r["steps"]} for r in rows]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})
