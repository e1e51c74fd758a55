"""`dvoting compare`: several strategies, one table and one plot."""
from __future__ import annotations

import json
import statistics
from dataclasses import replace

import pytest

from lm_eval_dvoting import compare
from lm_eval_dvoting.strategies import StrategySettings


def test_compare_writes_table_json_and_plot(tiny_llada_dir, tmp_path, capsys):
    """Rows (ablations included) with two seeds: each sampled row runs once per seed, each
    row with its own settings (majority after majority-entropy must not inherit its decoder
    or temperature), and the paired interval comes from the per-document scores."""
    out = tmp_path / "cmp"
    code = compare.main([
        "--model_args", f"pretrained={tiny_llada_dir},seed=7", "--tasks", "dvoting_arith",
        "--strategies", "single,majority-entropy,majority,dvoting,single-entropy", "--seeds", "2",
        "--limit", "2", "--gen_kwargs", "max_gen_toks=32", "--out", str(out), "--device", "cpu",
    ])
    assert code == 0
    result = json.loads((out / "compare.json").read_text())
    assert result["seeds"] == [7, 8]  # the model's seed, then the next one
    rows = result["rows"]
    assert [r["strategy"] for r in rows] == ["single", "majority-entropy", "majority", "dvoting", "single-entropy"]
    by_name = {r["strategy"]: r for r in rows}
    assert by_name["single"]["mean_nfe"] == 32 and by_name["single"]["mean_samples"] == 1
    assert by_name["majority"]["mean_nfe"] == 5 * 16
    # the settings the requests ran with: the task's length, the strategy's steps, each seed
    assert [(s["gen_length"], s["steps"], s["seed"]) for s in by_name["majority"]["settings"]] == [
        (32, 16, 7), (32, 16, 8)]
    # (n is recorded where it is read: single draws one sample whatever n says, issue 38)
    used = {name: {(s["strategy"], s["decoder"], s["temperature"], s.get("n"))
                   for s in row["settings"]}
            for name, row in by_name.items()}
    assert used["majority"] == {("majority", "fixed", 0.9, 5)}
    assert used["single"] == {("single", "fixed", 0.0, None)}
    assert used["single-entropy"] == {("single", "entropy", 0.0, None)}
    assert used["dvoting"] == {("dvoting", "entropy", 0.6, 5)}
    assert used["majority-entropy"] == {("majority", "entropy", by_name["dvoting"]["temperature"], 5)}
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
            assert 100 * statistics.fmean(v[i] for v in row["per_document"].values()) == pytest.approx(accuracy)
    paired = result["paired"]
    dv, me = by_name["dvoting"]["per_document"], by_name["majority-entropy"]["per_document"]
    expected = 100 * statistics.fmean(statistics.fmean(dv[d]) - statistics.fmean(me[d]) for d in dv)
    assert paired["problems"] == 2 and paired["runs"] == {"dvoting": 2, "majority-entropy": 2}
    assert paired["mean_points"] == pytest.approx(expected)
    assert paired["ci_points"][0] <= paired["mean_points"] <= paired["ci_points"][1]
    assert (paired["resamples"], paired["rng_seed"]) == (compare.BOOTSTRAP_RESAMPLES, compare.BOOTSTRAP_SEED)
    table = (out / "compare.md").read_text()
    assert "| dvoting |" in table and "BPC vs single" in table
    assert "| single | " in table and "| 1 (greedy) |" in table and "| 2 seeds |" in table
    assert "dvoting - majority-entropy: " in table and "(paired bootstrap over 2 problems, 2 seeds)" in table
    assert (out / "accuracy_vs_nfe.png").stat().st_size > 1000
    assert "| single |" in capsys.readouterr().out


def test_compare_rejects_unknown_strategy(tiny_llada_dir, tmp_path):
    with pytest.raises(SystemExit, match="unknown strategies"):
        compare.main(["--model_args", f"pretrained={tiny_llada_dir}", "--strategies", "single,best",
                      "--out", str(tmp_path)])


def test_compare_refuses_bad_command_lines_before_loading_the_model(tmp_path):
    """Each refusal names the argument and what to do, and comes before the checkpoint is
    read (the path below does not exist, so a later check would fail differently)."""
    def run(*argv: str) -> None:
        compare.main(["--model_args", "pretrained=/no/such/checkpoint", "--out", str(tmp_path), *argv])

    with pytest.raises(SystemExit, match=r"decoder='entropy' in --model_args would apply to every row.*"
                                         r"name single-entropy or majority-entropy in --strategies"):
        run("--model_args", "pretrained=/no/such/checkpoint,decoder=entropy")
    with pytest.raises(SystemExit, match="give strategies with --strategies, not in --model_args"):
        run("--model_args", "pretrained=/no/such/checkpoint,strategy=single")
    with pytest.raises(SystemExit, match=r"--seeds must be >= 1, got 0"):
        run("--seeds", "0")
    with pytest.raises(SystemExit, match=r"names \['dvoting'\] more than once"):
        run("--strategies", "dvoting,single,dvoting")
    with pytest.raises(SystemExit, match="unknown strategies.*single, single-entropy, single-confidence, majority, majority-entropy"):
        run("--strategies", "hex-entropy")


def test_default_rows_are_the_five_strategies_with_the_three_ablations():
    assert compare.parse_rows(compare.parse_args([]).strategies) == [
        "single", "single-entropy", "single-confidence", "majority", "majority-entropy", "hex", "dvoting",
        "temporal"]
    temporal = compare.row_settings("temporal", StrategySettings(gen_length=32))
    assert (temporal.strategy, temporal.resolved_decoder, temporal.resolved_temperature) == ("temporal", "fixed", 0.0)


@pytest.mark.parametrize("temperature", [None, 0.8])
def test_ablation_rows_take_dvotings_decoder_and_temperature(temperature):
    base = StrategySettings(gen_length=32, n=7, temperature=temperature)
    dvoting = compare.row_settings("dvoting", base)
    single_entropy = compare.row_settings("single-entropy", base)
    assert (single_entropy.strategy, single_entropy.resolved_decoder) == ("single", "entropy")
    assert single_entropy.resolved_temperature == compare.row_settings("single", base).resolved_temperature
    majority_entropy = compare.row_settings("majority-entropy", base)
    assert (majority_entropy.strategy, majority_entropy.resolved_decoder, majority_entropy.n) == ("majority", "entropy", 7)
    # dVoting's temperature: its default, or the model arg's when one is given
    assert majority_entropy.resolved_temperature == dvoting.resolved_temperature == (temperature or 0.6)
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


def test_only_sampled_rows_run_with_several_seeds():
    base = StrategySettings(gen_length=32)
    assert compare.run_seeds(compare.row_settings("single", base), 7, 3) == [7]
    assert compare.run_seeds(compare.row_settings("single-entropy", base), 7, 3) == [7]
    assert compare.run_seeds(compare.row_settings("dvoting", base), 7, 3) == [7, 8, 9]
    greedy_majority = replace(base, strategy="majority", temperature=0.0)
    assert compare.run_seeds(greedy_majority, 7, 3) == [7]
    # random remasking draws from the seed even at temperature 0 (the fixed schedule only)
    assert compare.run_seeds(replace(greedy_majority, remasking="random"), 7, 3) == [7, 8, 9]
    assert compare.run_seeds(replace(base, strategy="dvoting", temperature=0.0, remasking="random"), 7, 3) == [7]


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
    assert result["mean_points"] == 0 and result["ci_points"] == [0.0, 0.0] and result["problems"] == 50


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
    row = {"strategy": "dvoting", "accuracy": 61.0, "accuracy_std": 1.5, "sampled": True, "seeds": [1, 2, 3],
           "mean_nfe": 25.0, "mean_samples": 3.0, "seconds": 4.0}
    single = {"strategy": "single", "accuracy": 51.0, "accuracy_std": None, "sampled": False, "seeds": [1],
              "mean_nfe": 32.0, "mean_samples": 1.0, "seconds": 2.0}
    table = compare.markdown_table([single, row])
    assert "| single | 51.00 | 1 (greedy) | 32.0 |" in table
    # BPC on the means: (61 - 51) / (25 / 32)
    assert "| dvoting | 61.00 ± 1.50 | 3 seeds | 25.0 | 3.00 | 4.0 | 12.80 |" in table
    paired = {"first": "dvoting", "second": "majority-entropy", "runs": {"dvoting": 3, "majority-entropy": 3},
              "mean_points": 1.25, "ci_points": [-0.8, 3.1], "confidence": 0.95, "problems": 500}
    assert compare.paired_line(paired) == (
        "dvoting - majority-entropy: +1.2 points, 95% CI [-0.8, +3.1] (paired bootstrap over 500 problems, 3 seeds)")
