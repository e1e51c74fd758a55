"""Our answer reading against lm-eval's own GSM8K filters (docs/ANSWER_READING.md).

    python tools/answer_reading.py            # print the comparison (markdown)
    python tools/answer_reading.py --write    # rewrite its section of docs/ANSWER_READING.md
    python tools/answer_reading.py --check    # exit 1 if the doc's section is out of date

Over the ``number`` rows of the conformance table (tests/fixtures/answer_conformance.py)
it runs the two filter pipelines of lm-eval's installed ``gsm8k`` and
``gsm8k_cot_zeroshot`` task YAMLs (``strict-match``: ``#### N`` resp. ``The answer is
N.``; ``flexible-extract``: the last number-like run, the same in both) with lm-eval's
own classes (`lm_eval.filters.build_filter_ensemble` on real `Instance` objects), scores
each with lm-eval's ``exact_match`` and the YAML's own options (commas, ``$``, everything
before ``#### `` and a final ``.`` ignored, case ignored) against the grader's reading
written as a GSM8K reference (``#### 18``), and counts where each reading agrees with
the grader. A row whose grader reads no answer agrees when the filter reads none
(``[invalid]``). Our reading is `extract_answer` (rows agree by the conformance test).
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ANSWER_READING.md"
TABLE = ROOT / "tests" / "fixtures" / "answer_conformance.py"
SHOWN = 3  # differing rows shown per group
BEGIN, END = "<!-- answer-reading:begin -->", "<!-- answer-reading:end -->"
# (label, task YAML under lm_eval/tasks/gsm8k/, filter name)
FILTERS = (
    ("gsm8k strict-match", "gsm8k.yaml", "strict-match"),
    ("gsm8k_cot_zeroshot strict-match", "gsm8k-cot-zeroshot.yaml", "strict-match"),
    ("flexible-extract", "gsm8k.yaml", "flexible-extract"),
)


def load_cases() -> list[Any]:
    """The conformance table's rows (loaded by path: tests/ is not a package)."""
    spec = importlib.util.spec_from_file_location("answer_conformance", TABLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.CASES)


def task_config(yaml_name: str) -> dict[str, Any]:
    """An installed lm-eval GSM8K task YAML (these hold no `!function` tags)."""
    import lm_eval

    path = Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / yaml_name
    return yaml.safe_load(path.read_text(encoding="utf-8"))


Reader = Callable[[str, Optional[str]], tuple[str, bool]]


def lm_eval_reader(yaml_name: str, filter_name: str) -> Reader:
    """A function (text, grader) -> (what the filter reads, whether lm-eval's exact_match
    credits it against the grader's reading), built from the task YAML's own filter
    pipeline and metric options."""
    from lm_eval.api.instance import Instance
    from lm_eval.api.registry import get_metric
    from lm_eval.filters import build_filter_ensemble

    config = task_config(yaml_name)
    spec = next(f for f in config["filter_list"] if f["name"] == filter_name)
    components = [
        (step["function"], {k: v for k, v in step.items() if k != "function"})
        for step in spec["filter"]
    ]
    ensemble = build_filter_ensemble(filter_name, components)
    metric = next(m for m in config["metric_list"] if m["metric"] == "exact_match")
    options = {
        k: v
        for k, v in metric.items()
        if k in ("ignore_case", "ignore_punctuation", "regexes_to_ignore")
    }
    exact_match = get_metric("exact_match")

    def read(text: str, grader: Optional[str]) -> tuple[str, bool]:
        instance = Instance("generate_until", {}, ("", {}), 0, resps=[text])
        ensemble.apply([instance])
        read_as = instance.filtered_resps[filter_name]
        if grader is None:
            return read_as, read_as == "[invalid]"
        score = exact_match(predictions=[read_as], references=[f"#### {grader}"], **options)
        return read_as, float(score["exact_match"]) == 1.0

    return read


def compare() -> list[dict[str, Any]]:
    """One record per number row: the text, the grader's, our and each filter's reading."""
    from lm_eval_dvoting.core.answers import extract_answer

    readers = {label: lm_eval_reader(yaml_name, name) for label, yaml_name, name in FILTERS}
    records = []
    for case in load_cases():
        if case.kind != "number":
            continue
        ours = extract_answer(case.text, "number")
        record = {
            "group": case.group,
            "text": case.text,
            "grader": case.grader,
            "ours": ours,
            "ours_agrees": ours == case.grader,
        }
        for label, read in readers.items():
            record[label] = read(case.text, case.grader)
        records.append(record)
    return records


def _cell(text: Optional[str]) -> str:
    shown = "none" if text is None else text
    return "`" + shown.replace("\n", "\u23ce").replace("|", "\\|").replace("`", "'") + "`"


def _row(r: dict[str, Any], labels: list[str]) -> str:
    cells = [_cell(r[label][0]) for label in labels]
    return (
        f"| {r['group']} | {_cell(r['text'])} | {_cell(r['grader'])} | {_cell(r['ours'])} | "
        + " | ".join(cells)
        + " |"
    )


def _summary(records: list[dict[str, Any]], labels: list[str]) -> list[str]:
    """How many rows each reader (ours, then each filter) agrees with the grader on."""
    total = len(records)
    ours = sum(r["ours_agrees"] for r in records)
    lines = [
        f"Number rows: {total}. Rows whose reading agrees with the grader's:",
        "",
        "| reader | agrees | differs |",
        "|---|---|---|",
        f"| this project (`extract_answer`) | {ours} | {total - ours} |",
    ]
    for label in labels:
        agree = sum(r[label][1] for r in records)
        lines.append(f"| lm-eval {label} | {agree} | {total - agree} |")
    return lines


def _per_group(groups: dict[str, list[dict[str, Any]]], labels: list[str]) -> list[str]:
    """Rows agreeing with the grader, per group of the table and per reader."""
    lines = [
        "",
        "Agreement per group of the table (rows agreeing / rows):",
        "",
        "| group | rows | ours | " + " | ".join(labels) + " |",
        "|---|---|---|" + "---|" * len(labels),
    ]
    for group, rows in groups.items():
        cells = [str(sum(r[label][1] for r in rows)) for label in labels]
        lines.append(
            f"| {group} | {len(rows)} | {sum(r['ours_agrees'] for r in rows)} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def _rows_header(title: str, labels: list[str]) -> list[str]:
    return [
        "",
        title,
        "",
        "| group | text | grader | ours | " + " | ".join(labels) + " |",
        "|---|---|---|---|" + "---|" * len(labels),
    ]


def _flexible_differs(groups: dict[str, list[dict[str, Any]]], labels: list[str]) -> list[str]:
    """The rows flexible-extract reads differently from the grader, `SHOWN` per group."""
    lines = _rows_header(
        f"Rows where flexible-extract differs from the grader, at most {SHOWN} per group "
        "(strict-match readings beside them):",
        labels,
    )
    for group, rows in groups.items():
        differing = [r for r in rows if not r["flexible-extract"][1]]
        for r in differing[:SHOWN]:
            lines.append(_row(r, labels))
        if len(differing) > SHOWN:
            more = len(differing) - SHOWN
            lines.append(f"| {group} | ({more} more) |" + " |" * (2 + len(labels)))
    return lines


def _strict_uncredited(records: list[dict[str, Any]], labels: list[str]) -> list[str]:
    """The rows where a strict-match reads a number that exact_match does not credit."""
    lines = _rows_header(
        "Rows where a strict-match reads a number and lm-eval's exact_match does not "
        "credit it (a different number, or the same value spelled otherwise):",
        labels,
    )
    for r in records:
        if any(not r[label][1] and r[label][0] != "[invalid]" for label in labels[:2]):
            lines.append(_row(r, labels))
    return lines


def render(records: list[dict[str, Any]]) -> str:
    """The doc's generated section: summary counts, counts per group, differing rows."""
    labels = [label for label, _, _ in FILTERS]
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(record["group"], []).append(record)
    lines = (
        _summary(records, labels)
        + _per_group(groups, labels)
        + _flexible_differs(groups, labels)
        + _strict_uncredited(records, labels)
    )
    return "\n".join(lines) + "\n"


def _split_doc(doc: str) -> tuple[str, str, str]:
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC} lacks the markers {BEGIN} / {END} around the generated section")
    head, rest = doc.split(BEGIN, 1)
    body, tail = rest.split(END, 1)
    return head, body, tail


def check(doc_path: Path = DOC) -> list[str]:
    """The differences between the doc's generated section and a fresh run (empty: none)."""
    _, body, _ = _split_doc(doc_path.read_text(encoding="utf-8"))
    fresh = "\n" + render(compare())
    return list(
        difflib.unified_diff(body.splitlines(), fresh.splitlines(), "doc", "fresh", lineterm="")
    )


def main(argv: Optional[list[str]] = None) -> int:
    """Print, --write or --check the doc's generated section."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help=f"rewrite the section of {DOC.name}")
    action.add_argument("--check", action="store_true", help=f"fail if {DOC.name} is out of date")
    args = parser.parse_args(argv)
    if args.check:
        diff = check()
        print("\n".join(diff) if diff else f"{DOC.name} is up to date")
        return 1 if diff else 0
    section = render(compare())
    if args.write:
        head, _, tail = _split_doc(DOC.read_text(encoding="utf-8"))
        DOC.write_text(f"{head}{BEGIN}\n{section}{END}{tail}", encoding="utf-8")
        print(f"wrote {DOC}")
    else:
        sys.stdout.write(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
