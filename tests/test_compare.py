"""`dvoting compare`: several strategies, one table and one plot."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace

import pytest

from lm_eval_dvoting.commands import compare
from lm_eval_dvoting.core.strategies import StrategySettings
from lm_eval_dvoting.integration.bookkeeping import settings_entry


def ran_sampled(settings: StrategySettings) -> bool:
    """Whether a request run with `settings` counts as sampled, read as compare reads it: from
    the `settings_used` entry the harness logs for it."""
    return compare.ran_sampled([settings_entry(settings, seed=0)])


def test_compare_writes_table_json_and_plot(tiny_llada_dir, tmp_path, capsys):
    """Rows (ablations included) with two seeds: each sampled row runs once per seed, each
    row with its own settings (majority after majority-entropy must not inherit its decoder
    or temperature), and the paired interval comes from the per-document scores."""
    out = tmp_path / "cmp"
    code = compare.main(
        [
            "--model_args",
            f"pretrained={tiny_llada_dir},seed=7",
            "--tasks",
            "dvoting_arith",
            "--strategies",
            "single,majority-entropy,majority,dvoting,single-entropy",
            "--seeds",
            "2",
            "--limit",
            "2",
            "--gen_kwargs",
            "max_gen_toks=32",
            "--out",
            str(out),
            "--device",
            "cpu",
        ]
    )
    assert code == 0
    result = json.loads((out / "compare.json").read_text())
    assert result["seeds"] == [7, 8]  # the model's seed, then the next one
    rows = result["rows"]
    assert [r["strategy"] for r in rows] == [
        "single",
        "majority-entropy",
        "majority",
        "dvoting",
        "single-entropy",
    ]
    by_name = {r["strategy"]: r for r in rows}
    assert by_name["single"]["mean_nfe"] == 32 and by_name["single"]["mean_samples"] == 1
    assert by_name["majority"]["mean_nfe"] == 5 * 16
    # the settings the requests ran with: the task's length, the strategy's steps, each seed
    assert [(s["gen_length"], s["steps"], s["seed"]) for s in by_name["majority"]["settings"]] == [
        (32, 16, 7),
        (32, 16, 8),
    ]
    # (n is recorded where it is read: single draws one sample whatever n says, issue 38)
    used = {
        name: {(s["strategy"], s["decoder"], s["temperature"], s.get("n")) for s in row["settings"]}
        for name, row in by_name.items()
    }
    assert used["majority"] == {("majority", "fixed", 0.9, 5)}
    assert used["single"] == {("single", "fixed", 0.0, None)}
    assert used["single-entropy"] == {("single", "entropy", 0.0, None)}
    assert used["dvoting"] == {("dvoting", "entropy", 0.6, 5)}
    assert used["majority-entropy"] == {
        ("majority", "entropy", by_name["dvoting"]["temperature"], 5)
    }
    # greedy rows run once, sampled rows once per seed
    assert by_name["single"]["seeds"] == by_name["single-entropy"]["seeds"] == [7]
    assert by_name["single"]["accuracy_std"] is None
    for name in ("majority-entropy", "majority", "dvoting"):
        row = by_name[name]
        assert row["seeds"] == [7, 8] and len(row["accuracies"]) == len(row["nfes"]) == 2
        assert row["accuracy"] == pytest.approx(statistics.fmean(row["accuracies"]))
        assert row["accuracy_std"] == pytest.approx(statistics.stdev(row["accuracies"]))
        assert row["mean_nfe"] == pytest.approx(statistics.fmean(row["nfes"]))
    for row in rows:
        assert row["questions"] == 2 and sorted(row["per_document"]) == ["0", "1"]
        # lm-eval's per-document scores give each run's accuracy
        for i, accuracy in enumerate(row["accuracies"]):
            assert 100 * statistics.fmean(
                v[i] for v in row["per_document"].values()
            ) == pytest.approx(accuracy)
    paired = result["paired"]
    dv, me = by_name["dvoting"]["per_document"], by_name["majority-entropy"]["per_document"]
    expected = 100 * statistics.fmean(statistics.fmean(dv[d]) - statistics.fmean(me[d]) for d in dv)
    assert paired["problems"] == 2 and paired["runs"] == {"dvoting": 2, "majority-entropy": 2}
    assert paired["mean_points"] == pytest.approx(expected)
    assert paired["ci_points"][0] <= paired["mean_points"] <= paired["ci_points"][1]
    assert (paired["resamples"], paired["rng_seed"]) == (
        compare.BOOTSTRAP_RESAMPLES,
        compare.BOOTSTRAP_SEED,
    )
    table = (out / "compare.md").read_text()
    assert "| dvoting |" in table and "BPC vs single" in table
    assert "| single | " in table and "| 1 (greedy) |" in table and "| 2 seeds |" in table
    assert (
        "dvoting - majority-entropy: " in table
        and "(paired bootstrap over 2 problems, 2 seeds)" in table
    )
    assert (out / "accuracy_vs_nfe.png").stat().st_size > 1000
    assert "| single |" in capsys.readouterr().out


def test_compare_rejects_unknown_strategy(tiny_llada_dir, tmp_path):
    with pytest.raises(SystemExit, match="unknown strategies"):
        compare.main(
            [
                "--model_args",
                f"pretrained={tiny_llada_dir}",
                "--strategies",
                "single,best",
                "--out",
                str(tmp_path),
            ]
        )


def test_compare_refuses_bad_command_lines_before_loading_the_model(tmp_path):
    """Each refusal names the argument and what to do, and comes before the checkpoint is
    read (the path below does not exist, so a later check would fail differently)."""

    def run(*argv: str) -> None:
        compare.main(
            ["--model_args", "pretrained=/no/such/checkpoint", "--out", str(tmp_path), *argv]
        )

    with pytest.raises(
        SystemExit,
        match=r"decoder='entropy' in --model_args would apply to every row.*"
        r"name single-entropy or majority-entropy in --strategies",
    ):
        run("--model_args", "pretrained=/no/such/checkpoint,decoder=entropy")
    with pytest.raises(SystemExit, match="give strategies with --strategies, not in --model_args"):
        run("--model_args", "pretrained=/no/such/checkpoint,strategy=single")
    with pytest.raises(SystemExit, match=r"--seeds must be >= 1, got 0"):
        run("--seeds", "0")
    with pytest.raises(SystemExit, match=r"names \['dvoting'\] more than once"):
        run("--strategies", "dvoting,single,dvoting")
    with pytest.raises(
        SystemExit,
        match="unknown strategies.*single, single-entropy, single-confidence, single-dream, "
        "majority, majority-entropy",
    ):
        run("--strategies", "hex-entropy")


def test_default_rows_are_the_five_strategies_with_the_three_ablations():
    assert compare.parse_rows(compare.parse_args([]).strategies) == [
        "single",
        "single-entropy",
        "single-confidence",
        "majority",
        "majority-entropy",
        "hex",
        "dvoting",
        "temporal",
    ]
    temporal = compare.row_settings("temporal", StrategySettings(gen_length=32))
    assert (temporal.strategy, temporal.resolved_decoder, temporal.resolved_temperature) == (
        "temporal",
        "fixed",
        0.0,
    )


@pytest.mark.parametrize("temperature", [None, 0.8])
def test_ablation_rows_take_dvotings_decoder_and_temperature(temperature):
    base = StrategySettings(gen_length=32, n=7, temperature=temperature)
    dvoting = compare.row_settings("dvoting", base)
    single_entropy = compare.row_settings("single-entropy", base)
    assert (single_entropy.strategy, single_entropy.resolved_decoder) == ("single", "entropy")
    assert (
        single_entropy.resolved_temperature
        == compare.row_settings("single", base).resolved_temperature
    )
    majority_entropy = compare.row_settings("majority-entropy", base)
    assert (majority_entropy.strategy, majority_entropy.resolved_decoder, majority_entropy.n) == (
        "majority",
        "entropy",
        7,
    )
    # dVoting's temperature: its default, or the model arg's when one is given
    assert (
        majority_entropy.resolved_temperature
        == dvoting.resolved_temperature
        == (temperature or 0.6)
    )
    assert compare.row_settings("majority", base).resolved_decoder == "fixed"


def test_each_row_resets_what_the_previous_row_overrode():
    """A row's overrides are complete: applied on top of any earlier row's settings they give
    the row's own (here in the order that would leak them), whatever `use_strategy` starts from."""
    base = StrategySettings(gen_length=32)
    current = base
    for row in ("majority-entropy", "majority", "single-entropy", "single", "dvoting", "hex"):
        strategy, overrides = compare.row_overrides(row, base)
        current = replace(current, strategy=strategy, **overrides)  # what use_strategy does
        assert current == compare.row_settings(row, base), row


def test_a_row_the_model_args_do_not_allow_is_named():
    base = StrategySettings(gen_length=40)  # hex needs a multiple of 32
    with pytest.raises(SystemExit, match="row 'hex' cannot run with these --model_args: hex needs"):
        compare.row_settings("hex", base)


def test_only_sampled_settings_draw_from_the_seed():
    base = StrategySettings(gen_length=32)
    assert not ran_sampled(compare.row_settings("single", base))
    assert not ran_sampled(compare.row_settings("single-entropy", base))
    assert ran_sampled(compare.row_settings("dvoting", base))
    greedy_majority = replace(base, strategy="majority", temperature=0.0)
    assert not ran_sampled(greedy_majority)
    # random remasking draws from the seed even at temperature 0 (the fixed schedule only)
    assert ran_sampled(replace(greedy_majority, remasking="random"))
    greedy_dvoting = replace(base, strategy="dvoting", temperature=0.0, remasking="random")
    assert not ran_sampled(greedy_dvoting)


def test_a_run_sampled_when_any_request_ran_with_a_seeded_draw():
    """`ran_sampled` reads the settings the requests ran with (resolved entries of
    settings_used), as the same predicate does on settings."""
    greedy = {
        "strategy": "single",
        "temperature": 0.0,
        "decoder": "fixed",
        "remasking": "low_confidence",
    }
    assert not compare.ran_sampled([greedy])
    assert compare.ran_sampled([greedy, {**greedy, "temperature": 1.0}])
    assert compare.ran_sampled([{**greedy, "remasking": "random"}])
    assert not compare.ran_sampled([{**greedy, "decoder": "entropy", "remasking": "random"}])


def test_per_document_reads_the_metrics_filter_only():
    samples = [
        {"doc_id": 1, "filter": "strict-match", "exact_match": 1.0},
        {"doc_id": 0, "filter": "strict-match", "exact_match": 0.0},
        {"doc_id": 1, "filter": "flexible", "exact_match": 0.0},
        {"doc_id": 0, "filter": "flexible", "exact_match": 1.0},
    ]
    results = {"samples": {"task": samples}}
    assert compare.per_document(results, "task", "exact_match,strict-match") == {0: 0.0, 1: 1.0}
    assert compare.per_document(results, "task", "exact_match,flexible") == {0: 1.0, 1: 0.0}
    assert compare.per_document({}, "task", "exact_match,none") == {}


def test_paired_bootstrap_of_identical_rows_is_zero():
    scores = {doc: [doc % 2, doc % 3 == 0] for doc in range(50)}
    result = compare.paired_bootstrap(scores, dict(scores))
    assert (
        result["mean_points"] == 0
        and result["ci_points"] == [0.0, 0.0]
        and result["problems"] == 50
    )


def test_paired_bootstrap_pairs_problems_by_doc_id_not_by_order():
    """The same scores listed in another order are the same row: no difference at all."""
    first = {doc: [float(doc % 2)] for doc in range(40)}
    second = {doc: first[doc] for doc in reversed(range(40))}
    result = compare.paired_bootstrap(first, second)
    assert result["mean_points"] == 0 and result["ci_points"] == [0.0, 0.0]
    with pytest.raises(ValueError, match="different problems"):
        compare.paired_bootstrap(first, {doc: v for doc, v in first.items() if doc != 3})


def test_paired_bootstrap_interval_covers_the_true_difference():
    """Problems drawn with a known mean difference of 20 points (seed-averaged scores: each
    problem's two runs count half each); the 95% interval covers it and has the width of
    the normal approximation, 2 x 1.96 x sd / sqrt(n)."""
    import random

    rng = random.Random(5)
    first, second = {}, {}
    for doc in range(400):
        # per run: first right with p 0.6, second with p 0.4, independently: mean +0.2
        first[doc] = [float(rng.random() < 0.6) for _ in range(2)]
        second[doc] = [float(rng.random() < 0.4) for _ in range(2)]
    result = compare.paired_bootstrap(first, second)
    low, high = result["ci_points"]
    assert low < 20 < high
    diffs = [100 * (statistics.fmean(first[d]) - statistics.fmean(second[d])) for d in first]
    assert result["mean_points"] == pytest.approx(statistics.fmean(diffs))
    normal_width = 2 * 1.96 * statistics.stdev(diffs) / len(diffs) ** 0.5
    assert high - low == pytest.approx(normal_width, rel=0.1)
    # the fixed seed makes it repeat exactly; another seed moves it only a little
    assert compare.paired_bootstrap(first, second) == result
    other = compare.paired_bootstrap(first, second, rng_seed=1)["ci_points"]
    assert other != [low, high] and other == pytest.approx([low, high], abs=1.0)


def test_paired_bootstrap_averages_each_problems_seeds():
    first = {doc: [1.0, 0.0, 1.0, 0.0] for doc in range(10)}
    second = {doc: [0.0, 0.0, 0.0, 0.0] for doc in range(10)}
    assert compare.paired_bootstrap(first, second)["ci_points"] == [50.0, 50.0]


def test_table_and_paired_line_show_spread_and_runs():
    row = {
        "strategy": "dvoting",
        "accuracy": 61.0,
        "accuracy_std": 1.5,
        "sampled": True,
        "seeds": [1, 2, 3],
        "mean_nfe": 25.0,
        "mean_samples": 3.0,
        "seconds": 4.0,
    }
    single = {
        "strategy": "single",
        "accuracy": 51.0,
        "accuracy_std": None,
        "sampled": False,
        "seeds": [1],
        "mean_nfe": 32.0,
        "mean_samples": 1.0,
        "seconds": 2.0,
    }
    costlier = {**row, "strategy": "hex", "mean_nfe": 64.0}
    same_cost = {**row, "strategy": "majority", "accuracy": 41.0, "mean_nfe": 32.0}
    table = compare.markdown_table([single, row, costlier, same_cost])
    assert "| single | 51.00 | 1 (greedy) | 32.0 | 1.00 | 2.0 | - |" in table
    # BPC on the means for rows at least as costly: (61 - 51) / (64 / 32), (41 - 51) / 1
    assert "| hex | 61.00 ± 1.50 | 3 seeds | 64.0 | 3.00 | 4.0 | 5.00 |" in table
    assert "| majority | 41.00 ± 1.50 | 3 seeds | 32.0 | 3.00 | 4.0 | -10.00 |" in table
    # a cheaper row's cell is empty (not (61 - 51) / (25 / 32) = 12.80), and the note says why
    assert "| dvoting | 61.00 ± 1.50 | 3 seeds | 25.0 | 3.00 | 4.0 |  |" in table
    assert table.endswith("\n\n" + compare.BPC_NOTE)
    assert "empty for cheaper rows" in compare.BPC_NOTE
    assert compare.BPC_NOTE not in compare.markdown_table([row])  # no single row: no BPC figures
    paired = {
        "first": "dvoting",
        "second": "majority-entropy",
        "runs": {"dvoting": 3, "majority-entropy": 3},
        "mean_points": 1.25,
        "ci_points": [-0.8, 3.1],
        "confidence": 0.95,
        "problems": 500,
    }
    assert compare.paired_line(paired) == (
        "dvoting - majority-entropy: +1.2 points, 95% CI [-0.8, +3.1] "
        "(paired bootstrap over 500 problems, 3 seeds)"
    )


# ------------------------------------------------- issue 38 and 42: labels, encodings, the demo


def test_a_row_that_samples_runs_every_seed_whatever_its_strategy(tmp_path, capsys, caplog):
    """`--gen_kwargs do_sample=true,temperature=1.0` makes `single` and `temporal` sample: each
    then runs its seeds and shows its spread, labelled by seeds, not "1 (greedy)" (issue 38).
    `--row_seeds temporal=1` gives temporal one seed of its own (a sampled row, "1 seed"). Each
    progress bar names its row and seed, and lm-eval's `--metadata` hint is shown once
    (issue 42, item 5)."""
    import logging

    caplog.set_level(logging.WARNING)
    out = tmp_path / "cmp"
    assert (
        compare.main(
            [
                "--model_args",
                "pretrained=tiny-arith",
                "--tasks",
                "dvoting_arith",
                "--strategies",
                "single,temporal",
                "--seeds",
                "2",
                "--row_seeds",
                "temporal=1",
                "--limit",
                "3",
                "--out",
                str(out),
                "--device",
                "cpu",
                "--gen_kwargs",
                "do_sample=true,temperature=1.0",
            ]
        )
        == 0
    )
    rows = {r["strategy"]: r for r in json.loads((out / "compare.json").read_text())["rows"]}
    single, temporal = rows["single"], rows["temporal"]
    assert single["sampled"] and temporal["sampled"]
    assert single["temperature"] == temporal["temperature"] == 1.0  # as the requests ran
    assert single["seeds"] == [1234, 1235] and len(single["accuracies"]) == 2
    assert single["accuracy_std"] is not None
    assert temporal["seeds"] == [1234] and temporal["accuracy_std"] is None
    table = (out / "compare.md").read_text()
    assert "| single | " in table and "| 2 seeds |" in table and "| 1 seed |" in table
    assert "(greedy)" not in table
    err = capsys.readouterr().err
    for label in (
        "single, seed 1234, row 1/2",
        "single, seed 1235, row 1/2",
        "temporal, seed 1234, row 2/2",
    ):
        assert f"dVoting generate_until [{label}]" in err, label
    assert "temporal, seed 1235" not in err
    hint = "Custom kwargs can be passed to `--metadata`"
    hints = [r for r in caplog.records if hint in r.getMessage()]
    assert len(hints) == 1  # three evaluations, one hint
    assert not logging.getLogger("lm_eval.api.task").filters  # the filter leaves with compare


def test_compare_json_is_standard_json_with_alpha_inf(tmp_path):
    """alpha=inf (allowed) is written as "inf", never as the non-standard `Infinity` (issue 38)."""
    from lm_eval_dvoting.integration.strict_json import loads_strict

    out = tmp_path / "cmp"
    assert (
        compare.main(
            [
                "--model_args",
                "pretrained=tiny-arith,alpha=inf",
                "--tasks",
                "dvoting_arith",
                "--strategies",
                "single-entropy",
                "--limit",
                "2",
                "--out",
                str(out),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    [row] = loads_strict((out / "compare.json").read_text())["rows"]
    assert {entry["alpha"] for entry in row["settings"]} == {"inf"}


def test_a_document_missing_from_a_later_seed_is_null_in_compare_json():
    """summarize_row marks a document a later seed did not score with NaN; the file has null."""
    from lm_eval_dvoting.integration.strict_json import dumps, loads_strict

    entry = {"temperature": 0.6, "decoder": "entropy", "remasking": "low_confidence"}
    runs = [
        {
            "accuracy": 50.0,
            "nfe": 10.0,
            "samples": 3.0,
            "seconds": 1.0,
            "questions": 2,
            "metric": "m",
            "settings": [entry],
            "per_document": per_doc,
        }
        for per_doc in ({0: 1.0, 1: 0.0}, {0: 1.0})
    ]
    row = compare.summarize_row("dvoting", [1, 2], runs)
    assert row["sampled"] and row["temperature"] == 0.6
    assert loads_strict(dumps(row))["per_document"] == {"0": [1.0, 1.0], "1": [0.0, None]}


def test_a_log_likelihood_task_is_refused_before_the_model_is_loaded(tmp_path):
    """dvoting_arith_mc is scored by the likelihood estimate: no strategy plays a part, so
    compare refuses it by name before reading the (here missing) checkpoint (issue 38)."""
    message = (
        r"--tasks dvoting_arith_mc is scored by log-likelihood only "
        r"\(dvoting_arith_mc \(multiple_choice\)\): no strategy plays a part"
    )
    with pytest.raises(SystemExit, match=message):
        compare.main(
            [
                "--model_args",
                "pretrained=/no/such/checkpoint",
                "--tasks",
                "dvoting_arith_mc",
                "--out",
                str(tmp_path),
            ]
        )


def test_leaf_tasks_expand_groups_and_tags(monkeypatch):
    reasoning = dict(compare.leaf_tasks("dvoting_reasoning"))  # our group, from lm-eval's index
    assert {"dvoting_gsm8k", "dvoting_math500", "dvoting_arc_challenge"} <= set(reasoning)
    assert "dvoting_reasoning" not in reasoning
    assert compare.leaf_tasks("dvoting_arith_mc")[0][1]["output_type"] == "multiple_choice"
    # a tag (the tasks carrying it), a group naming a tag, an inline task; an unknown name: none
    from types import SimpleNamespace

    from lm_eval.tasks._index import Entry, Kind

    group = {"group": "g", "task": ["t", {"task": "inline", "x": 1}]}
    index = {
        "g": Entry("g", Kind.GROUP, None, group),
        "t": Entry("t", Kind.TAG, None, tags={"a", "b"}),
        "a": Entry("a", Kind.TASK, None, {"task": "a", "output_type": "multiple_choice"}),
        "b": Entry("b", Kind.TASK, None, {"task": "b"}),
    }
    monkeypatch.setattr(compare, "_task_manager", lambda name: SimpleNamespace(task_index=index))
    assert [name for name, _ in compare.leaf_tasks("g")] == ["inline", "a", "b"]
    assert compare.leaf_tasks("no_such_task_anywhere") == []


def test_a_group_mixing_likelihood_tasks_runs_with_a_warning(monkeypatch, caplog):
    mixed = [("gen", {"output_type": "generate_until"}), ("mc", {"output_type": "multiple_choice"})]
    monkeypatch.setattr(compare, "leaf_tasks", lambda name: mixed)
    compare.check_generation_task("group")
    assert "includes log-likelihood tasks (mc (multiple_choice))" in caplog.text
    monkeypatch.setattr(compare, "leaf_tasks", lambda name: mixed[1:])
    with pytest.raises(SystemExit, match="scored by log-likelihood only"):
        compare.check_generation_task("group")


def test_a_run_without_generation_requests_is_refused_not_nan(monkeypatch):
    """What the task index cannot tell (a task defined in Python) is caught after the first
    run: no NaN mean NFE reaches the table or the JSON."""

    class Model:
        def use_strategy(self, strategy, seed=None, **overrides):
            pass

        def get_model_info(self):
            totals = {"questions": 0, "nfe": 0, "samples": 0}
            return {"dvoting": {"totals": totals, "settings_used": [], "settings": {}}}

    results = {"results": {"t": {"acc,none": 0.5}}, "samples": {}}
    monkeypatch.setattr(compare, "_evaluate", lambda lm, args: results)
    args = compare.parse_args(["--tasks", "t"])
    with pytest.raises(SystemExit, match="--tasks t made no generation requests"):
        compare._run(Model(), args, "single", {}, 1234)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hex", r"has no '=' in 'hex'"),
        ("best=1", r"names 'best', not a row of --strategies \(single, hex\)"),
        ("hex=1,hex=2", "gives hex twice"),
        ("hex=0", "gives hex '0' seeds, not a whole number >= 1"),
        ("hex=1.5", "gives hex '1.5' seeds"),
    ],
)
def test_bad_row_seeds_are_refused_by_name(text, message):
    with pytest.raises(SystemExit, match=rf"--row_seeds {text!r} {message}"):
        compare.parse_row_seeds(text, ["single", "hex"], 3)


def test_row_seeds_override_seeds_for_the_rows_named():
    assert compare.parse_row_seeds(None, ["single", "hex"], 3) == {"single": 3, "hex": 3}
    assert compare.parse_row_seeds(" hex = 1 ", ["single", "hex"], 3) == {"single": 3, "hex": 1}


def test_lm_eval_messages_are_shown_once_while_compare_runs(caplog):
    import logging

    task_log = logging.getLogger("lm_eval.api.task")
    with caplog.at_level(logging.WARNING), compare.lm_eval_messages_once():
        for _ in range(3):
            task_log.warning("the hint")
            logging.getLogger("lm_eval.evaluator").warning("the note %s", 1)
        task_log.warning("another hint")
    task_log.warning("the hint")  # after compare: as lm-eval logs it
    shown = [r.getMessage() for r in caplog.records]
    assert shown == ["the hint", "the note 1", "another hint", "the hint"]


def test_the_readme_demo_output_is_what_compare_prints_now():
    """The README's first command gives HEX one seed (the quick demo), its table (in
    docs/DEMO.md) leaves the BPC of cheaper rows empty with the note compare prints, and no
    row shows a magnified BPC."""
    import re
    from pathlib import Path

    demo = (Path(__file__).resolve().parents[1] / "docs" / "DEMO.md").read_text()
    first = demo[: demo.index("\n## The model")]
    assert (
        "dvoting compare --model_args pretrained=tiny-arith --tasks dvoting_arith "
        "--limit 100 --seeds 3 --row_seeds hex=1\n"
    ) in first
    assert compare.BPC_NOTE in first
    assert re.search(r"^\| hex \| [\d.]+ \| 1 seed \|", first, re.MULTILINE)
    single = re.search(r"^\| single \| [^|]+ \| [^|]+ \| ([\d.]+) \|", first, re.MULTILINE)
    single_nfe = float(single.group(1))
    checked = 0
    for line in re.findall(r"^\| (?!strategy|---|single \|).*$", first, re.MULTILINE):
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 7:
            assert (cells[6] == "") == (float(cells[3]) < single_nfe), line
            checked += 1
    assert checked == 7  # every row but single
