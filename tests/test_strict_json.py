"""Standard JSON in every file the plugin writes (issue 38): no NaN, no Infinity.

`alpha=inf` is a documented setting; a strict parser (`loads_strict`, as JavaScript's
`JSON.parse` reads) must accept every file of a run that uses it. The run below is lm-eval's
own two-filter `gsm8k_cot_zeroshot` YAML on local rows (tests/test_task_costs.py's recipe),
saved as `lm_eval --output_path --log_samples` saves it, so the same files also show
`dvoting report` counting documents, not logged lines, per filter (issue 42, item 4).
compare.json is tested in tests/test_compare.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from test_task_costs import LOCAL, TASKS, _stock_task

from lm_eval_dvoting.commands import report
from lm_eval_dvoting.core.strategies import StrategySettings
from lm_eval_dvoting.integration import strict_json
from lm_eval_dvoting.integration.bookkeeping import CostBook
from lm_eval_dvoting.integration.strict_json import dumps, json_safe, loads_strict

FILTERS = ("strict-match", "flexible-extract")


def test_non_finite_floats_are_encoded_as_documented():
    value = {"a": math.inf, "b": [-math.inf, (math.nan, 1.5)], "c": {"d": "inf", "e": None, "f": 2}}
    encoded = {"a": "inf", "b": ["-inf", [None, 1.5]], "c": {"d": "inf", "e": None, "f": 2}}
    assert json_safe(value) == encoded
    assert loads_strict(dumps(value)) == json_safe(value)
    assert float(json_safe(math.inf)) == math.inf  # "inf" reads back as the model arg does


@pytest.mark.parametrize("text", ['{"a": NaN}', "[Infinity]", '{"a": [-Infinity]}'])
def test_the_strict_parser_refuses_what_strict_parsers_refuse(text):
    json.loads(text)  # Python's own parser takes it
    with pytest.raises(ValueError, match="non-standard JSON constant"):
        loads_strict(text)


def test_config_dvoting_holds_standard_json_with_alpha_inf():
    """What `get_model_info` hands lm-eval (`CostBook.report`) before and after an evaluation."""
    settings = StrategySettings(strategy="single", decoder="entropy", alpha=math.inf, gen_length=32)
    book = CostBook()
    book.note_settings(settings)
    before = book.report(settings, 7)
    assert before["settings"]["alpha"] == "inf" and before["settings_used"][0]["alpha"] == "inf"
    json.dumps(before, allow_nan=False)  # raises on any NaN or Infinity left


@pytest.fixture(scope="module")
def stock_run(tmp_path_factory) -> Path:
    """`gsm8k_cot_zeroshot` (two filters) on 3 local rows with alpha=inf, written by lm-eval's
    EvaluationTracker as `lm_eval --output_path out --log_samples` writes it, with the model
    args as lm-eval's CLI hands them over (a dict: "inf" read as a float)."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("stock")
    folder = _stock_task(root / "tasks", rows=3)
    out = root / "out"
    tracker = EvaluationTracker(output_path=str(out))
    model_args = {
        "pretrained": "tiny-arith",
        "strategy": "single",
        "decoder": "entropy",
        "alpha": math.inf,
    }
    # lm-eval's CLI: the model args are also every task's metadata (EvaluationConfig)
    manager = TaskManager(
        include_path=[str(folder), str(TASKS)], include_defaults=False, metadata=dict(model_args)
    )
    results = lm_eval.simple_evaluate(
        model="dvoting-llada",
        model_args=model_args,
        tasks=[LOCAL],
        device="cpu",
        log_samples=True,
        task_manager=manager,
        evaluation_tracker=tracker,
        gen_kwargs="max_gen_toks=32",
        verbosity="ERROR",
        metadata=dict(model_args),
    )
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    tracker.save_results_samples(task_name=LOCAL, samples=samples[LOCAL])
    return out


def test_a_runs_results_and_samples_files_parse_strictly_with_alpha_inf(stock_run: Path):
    """Infinity used to reach four places of the results file: lm-eval's copies of the model
    args (`config.model_args`, each task's `metadata`) and ours (`config.dvoting.settings`,
    `settings_used`). Each is "inf" now, and every samples line parses strictly."""
    (results_file,) = stock_run.rglob("results_*.json")
    results = loads_strict(results_file.read_text())
    assert results["config"]["model_args"]["alpha"] == "inf"
    assert results["configs"][LOCAL]["metadata"]["alpha"] == "inf"
    info = results["config"]["dvoting"]
    assert info["settings"]["alpha"] == "inf"
    assert [entry["alpha"] for entry in info["settings_used"]] == ["inf"]
    (samples_file,) = stock_run.rglob(f"samples_{LOCAL}_*.jsonl")
    lines = [loads_strict(line) for line in samples_file.read_text().splitlines()]
    assert len(lines) == 3 * len(FILTERS)  # one line per document and filter


def test_the_report_counts_documents_of_a_real_two_filter_run(stock_run: Path, tmp_path: Path):
    """3 documents, logged twice: 3 questions per filter, each filter's accuracy as the results
    JSON gives it under its name (issue 42, item 4: the report said "questions 6")."""
    (results_file,) = stock_run.rglob("results_*.json")
    figures = loads_strict(results_file.read_text())["results"][LOCAL]
    out = tmp_path / "report"
    assert report.main([str(stock_run), "--out", str(out), "--questions", "none"]) == 0
    text = (out / "report.md").read_text()
    for name in FILTERS:
        accuracy = 100 * figures[f"exact_match,{name}"]
        assert f"| single | {LOCAL} ({name}) | 3 | {accuracy:.2f} |" in text, text


def test_other_models_files_are_left_as_lm_eval_writes_them(tmp_path: Path):
    """The tracker patch touches a dvoting model's files only."""
    from lm_eval.loggers import EvaluationTracker

    strict_json.install()
    for source, expected in (("hf", "Infinity"), ("dvoting-llada", '"inf"')):
        tracker = EvaluationTracker(output_path=str(tmp_path / source))
        tracker.general_config_tracker.model_source = source
        tracker.general_config_tracker.model_name = "m"
        tracker.general_config_tracker.model_name_sanitized = "m"
        results = {"config": {"model_args": {"alpha": math.inf}}}
        tracker.save_results_aggregated(results=results, samples=None)
        (written,) = (tmp_path / source).rglob("results_*.json")
        assert f'"alpha": {expected}' in written.read_text(), source


def _strictly_parsed_files(folder: Path) -> list[Path]:
    """Every results JSON and samples JSONL under `folder`, each parsed strictly."""
    files = sorted(folder.rglob("results_*.json")) + sorted(folder.rglob("samples_*.jsonl"))
    for file in files:
        text = file.read_text()
        for part in [text] if file.suffix == ".json" else text.splitlines():
            loads_strict(part)
    return files


def test_a_log_likelihood_runs_files_parse_strictly_with_alpha_inf(tmp_path: Path):
    """The log-likelihood path (`dvoting_arith_mc`, no generation: no cost figures) writes
    standard JSON too, lm-eval's copies of `alpha=inf` included."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    torch.set_num_threads(1)
    tracker = EvaluationTracker(output_path=str(tmp_path / "out"))
    model_args = {"pretrained": "tiny-arith", "mc_num": 4, "alpha": math.inf}
    manager = TaskManager(
        include_path=str(TASKS), include_defaults=False, metadata=dict(model_args)
    )
    results = lm_eval.simple_evaluate(
        model="dvoting-llada",
        model_args=model_args,
        tasks=["dvoting_arith_mc"],
        limit=2,
        device="cpu",
        log_samples=True,
        task_manager=manager,
        evaluation_tracker=tracker,
        verbosity="ERROR",
        metadata=dict(model_args),
    )
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    tracker.save_results_samples(task_name="dvoting_arith_mc", samples=samples["dvoting_arith_mc"])
    assert len(_strictly_parsed_files(tmp_path / "out")) == 2


def test_the_callers_results_keep_their_values_and_the_table_still_prints(tmp_path: Path):
    """Only the file is encoded: lm-eval's CLI prints the results it saved next, formatting
    each stderr as a float, so a NaN or infinite stderr left as null / "inf" in the caller's
    dict would crash the table after the run (review of issue 38). What lm-eval adds while
    saving (`task_hashes`, the tracker's config) still reaches the caller."""
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.utils import make_table

    strict_json.install()
    tracker = EvaluationTracker(output_path=str(tmp_path))
    tracker.general_config_tracker.model_source = "dvoting-llada"
    tracker.general_config_tracker.model_name = "m"
    tracker.general_config_tracker.model_name_sanitized = "m"
    results = {
        "config": {"model_args": {"alpha": math.inf}},
        "results": {
            "t": {"alias": "t", "exact_match,none": 0.5, "exact_match_stderr,none": math.nan}
        },
        "versions": {"t": 1},
        "n-shot": {"t": 0},
        "higher_is_better": {"t": {}},
    }
    tracker.save_results_aggregated(results=results, samples=None)
    (written,) = tmp_path.rglob("results_*.json")
    loads_strict(written.read_text())
    assert math.isnan(results["results"]["t"]["exact_match_stderr,none"])
    assert results["config"]["model_args"]["alpha"] == math.inf
    assert "task_hashes" in results and results["model_name"] == "m"
    make_table(results)  # raised on the in-place encoding
