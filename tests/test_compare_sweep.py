"""`dvoting compare`: the single-confidence row and `--sweep NAME=V1,V2,...`."""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import replace

import pytest

from lm_eval_dvoting.commands import compare
from lm_eval_dvoting.core.strategies import StrategySettings
from lm_eval_dvoting.integration.bookkeeping import settings_entry

ENTRY_KEYS = {
    "value",
    "accuracy_mean",
    "accuracy_std",
    "nfe_mean",
    "accuracies",
    "nfes",
    "seeds",
    "sampled",
    "mean_samples",
    "seconds",
    "questions",
    "metric",
    "settings",
    "per_document",
    "decoder",
    "temperature",
}


def ran_sampled(settings: StrategySettings) -> bool:
    """Whether a request run with `settings` counts as sampled, read as compare reads it: from
    the `settings_used` entry the harness logs for it."""
    return compare.ran_sampled([settings_entry(settings, seed=0)])


def _run_compare(tmp_path, *argv: str) -> dict:
    out = tmp_path / "cmp"
    assert (
        compare.main(
            [
                "--tasks",
                "dvoting_arith",
                "--limit",
                "2",
                "--out",
                str(out),
                "--device",
                "cpu",
                *argv,
            ]
        )
        == 0
    )
    return json.loads((out / "compare.json").read_text())


def test_threshold_sweep_runs_every_row_at_every_value(tmp_path, capsys):
    """Every row at every value, in the order given; the sweep wins over the model args'
    threshold; single-confidence's passes rise with the threshold while single's (which
    does not use it) stay; greedy rows run once whatever --seeds says; one table per row
    and sweep.png are written."""
    result = _run_compare(
        tmp_path,
        "--model_args",
        "pretrained=tiny-arith,seed=7,threshold=0.7",
        "--strategies",
        "single,single-confidence",
        "--sweep",
        "threshold=0.5,0.9,1",
        "--seeds",
        "2",
    )
    assert set(result) == {"sweep", "seeds"} and result["seeds"] == [7, 8]
    sweep = result["sweep"]
    assert sweep["name"] == "threshold" and sweep["values"] == [0.5, 0.9, 1.0]
    assert all(isinstance(v, float) for v in sweep["values"])
    assert list(sweep["rows"]) == ["single", "single-confidence"] and sweep["paired"] == []
    for row, entries in sweep["rows"].items():
        assert [e["value"] for e in entries] == [0.5, 0.9, 1.0]
        for entry in entries:
            assert set(entry) == ENTRY_KEYS, row
            assert entry["seeds"] == [7] and entry["accuracy_std"] is None and not entry["sampled"]
            # what the requests ran with: the swept value (not the model args' 0.7), the row's
            # decoder; the fixed schedule reads no threshold, so none is recorded (issue 38)
            confident = row == "single-confidence"
            ran = {
                (s.get("threshold"), s["decoder"], s["temperature"], s["strategy"])
                for s in entry["settings"]
            }
            assert ran == {
                (
                    entry["value"] if confident else None,
                    "confidence" if confident else "fixed",
                    0.0,
                    "single",
                )
            }
            assert entry["questions"] == 2
            assert entry["accuracy_mean"] == pytest.approx(
                100 * statistics.fmean(v[0] for v in entry["per_document"].values())
            )
    confident = [e["nfe_mean"] for e in sweep["rows"]["single-confidence"]]
    # blocks of 2 in 32 tokens: at least 16 passes, at most 32; a higher threshold commits
    # less per pass
    assert 16 <= confident[0] <= confident[1] <= confident[2] <= 32 and confident[0] < confident[2]
    single = sweep["rows"]["single"]
    assert [e["nfe_mean"] for e in single] == [32, 32, 32]
    assert len({e["accuracy_mean"] for e in single}) == 1
    out = tmp_path / "cmp"
    table = (out / "compare.md").read_text()
    assert "threshold swept over [0.5, 0.9, 1.0]" in table
    for row in ("single", "single-confidence"):
        assert (
            f"### {row}, threshold swept\n\n| threshold | accuracy (%) | runs | mean NFE |" in table
        )
    assert "| 0.5 | " in table and "| 1.0 | " in table and "| 1 (greedy) | 32.0 |" in table
    assert (out / "sweep.png").stat().st_size > 1000 and not (out / "accuracy_vs_nfe.png").exists()
    captured = capsys.readouterr()
    assert "### single-confidence, threshold swept" in captured.out and "sweep.png" in captured.out
    # each progress bar names the row, the swept value and the seed
    bar = "dVoting generate_until [single-confidence threshold=0.9, seed 7, row 2/2]"
    assert bar in captured.err


def test_block_length_sweep_changes_the_schedule_and_repeats_sampled_rows(tmp_path):
    """block_length from the sweep wins over the model args' (2); majority's fixed schedule
    needs a pass per block at least (32 blocks of 1: 32 per sample instead of its 16 steps);
    the sampled row runs once per seed at every value."""
    result = _run_compare(
        tmp_path,
        "--model_args",
        "pretrained=tiny-arith,seed=7,block_length=2",
        "--strategies",
        "single-entropy,majority",
        "--sweep",
        "block_length=1,4",
        "--seeds",
        "2",
    )
    sweep = result["sweep"]
    assert sweep["name"] == "block_length" and sweep["values"] == [1, 4]
    majority, entropy = sweep["rows"]["majority"], sweep["rows"]["single-entropy"]
    assert [e["nfe_mean"] for e in majority] == [5 * 32, 5 * 16]
    for entries in (majority, entropy):
        for entry in entries:
            assert {s["block_length"] for s in entry["settings"]} == {entry["value"]}
    for entry in majority:
        assert entry["seeds"] == [7, 8] and len(entry["accuracies"]) == len(entry["nfes"]) == 2
        assert entry["accuracy_std"] == pytest.approx(statistics.stdev(entry["accuracies"]))
        assert {s["seed"] for s in entry["settings"]} == {7, 8}
    assert [e["seeds"] for e in entropy] == [[7], [7]]
    # the entropy rule's passes depend on the blocks too (here blocks of 1, handed on within a
    # pass, take fewer than blocks of 4)
    assert entropy[0]["nfe_mean"] != entropy[1]["nfe_mean"]


def test_single_confidence_row_takes_the_model_args_threshold(tmp_path):
    """Without --sweep: the model args' threshold reaches the row (it is not a constructor
    argument here), the default is StrategySettings' 0.9, and the greedy row runs once."""
    for model_args, threshold in (
        ("pretrained=tiny-arith,threshold=0.5", 0.5),
        ("pretrained=tiny-arith", 0.9),
    ):
        result = _run_compare(
            tmp_path,
            "--model_args",
            model_args,
            "--strategies",
            "single-confidence",
            "--seeds",
            "3",
        )
        [row] = result["rows"]
        assert (
            row["strategy"] == "single-confidence" and row["seeds"] == [1234] and not row["sampled"]
        )
        assert {(s["decoder"], s["threshold"], s["temperature"]) for s in row["settings"]} == {
            ("confidence", threshold, 0.0)
        }
        assert "| single-confidence | " in (tmp_path / "cmp" / "compare.md").read_text()


def test_the_loaded_models_settings_are_checked_again_before_any_evaluation(tmp_path, monkeypatch):
    """n=5.0 is a model arg the harness reads (a whole number) and StrategySettings alone
    does not, so the pre-load check sees the default settings, without prefix_cache; the
    loaded model's settings have it, and cache=none would not take effect: refused before
    the first evaluation."""

    def no_evaluation(*_):
        raise AssertionError("an evaluation ran before the sweep was checked")

    monkeypatch.setattr(compare, "_evaluate", no_evaluation)
    with pytest.raises(
        SystemExit,
        match=r"--sweep cache=none does not take effect with these --model_args "
        r"\(the settings keep cache='prefix'\)",
    ):
        compare.main(
            [
                "--model_args",
                "pretrained=tiny-arith,n=5.0,prefix_cache=true",
                "--tasks",
                "dvoting_arith",
                "--strategies",
                "single",
                "--sweep",
                "cache=none,prefix",
                "--out",
                str(tmp_path),
                "--device",
                "cpu",
            ]
        )


# in the settings' declaration order (core/settings.py)
ALLOWED = (
    r"\(sweepable: block_length, n, alpha, temperature, tau, steps, remasking, hex_samples, "
    r"decoder, cache, threshold, temporal_weight, temporal_alpha, vote, guidance, "
    r"alg, alg_temp, eps, top_p, top_k\)"
)
REFUSALS = [
    (
        ["--sweep", "foo=1,2"],
        r"--sweep foo=1,2: unknown setting 'foo'; sweepable settings: block_length, n,",
    ),
    (
        ["--sweep", "mc_num=32,128"],
        r"--sweep mc_num=32,128: mc_num cannot be swept on a loaded model \(it "
        r"needs a model reload\): run compare once per value with mc_num=V in "
        r"--model_args " + ALLOWED,
    ),
    (
        ["--sweep", "dtype=float32,bfloat16"],
        r"--sweep dtype=float32,bfloat16: dtype .* needs a model reload",
    ),
    (["--sweep", "pretrained=a,b"], r"--sweep pretrained=a,b: pretrained .* needs a model reload"),
    (
        ["--sweep", "strategy=single,hex"],
        r"--sweep strategy=single,hex: strategy cannot be swept; the rows are "
        r"chosen with --strategies",
    ),
    (["--sweep", "seed=1,2"], r"--sweep seed=1,2: seed cannot be swept; give --seeds K"),
    (
        ["--sweep", "max_gen_toks=32,64"],
        r"--sweep max_gen_toks=32,64: max_gen_toks cannot be swept; "
        r".* once per value with --gen_kwargs",
    ),
    (
        ["--sweep", "prefix_cache=true"],
        r"--sweep prefix_cache=true: prefix_cache cannot be swept; .*--sweep cache=none,prefix",
    ),
    (["--sweep", "threshold="], r"--sweep threshold=: no values; give comma-separated values"),
    (["--sweep", "threshold=0.5,,0.9"], r"--sweep threshold=0.5,,0.9: an empty value"),
    (
        ["--sweep", "threshold"],
        r"--sweep 'threshold' has no '=': give NAME=V1,V2,... with NAME one of block_length",
    ),
    (
        ["--sweep", "n=3", "--sweep", "n=5"],
        r"--sweep given 2 times \(n=3, n=5\); sweep one setting per run",
    ),
    (["--sweep", "threshold=0.5,0.50"], r"--sweep threshold=0.5,0.50: 0.5 given more than once"),
    (
        ["--sweep", "n=3,2.5"],
        r"--sweep n=2.5: n takes whole numbers, got '2.5'; give comma-separated values",
    ),
    (
        ["--sweep", "block_length=abc"],
        r"--sweep block_length=abc: block_length takes whole numbers, got 'abc'",
    ),
    (["--sweep", "threshold=high"], r"--sweep threshold=high: threshold takes numbers, got 'high'"),
    (
        ["--sweep", "threshold=0.5,1.5"],
        r"--sweep threshold=1.5: threshold \(confidence decoder\) must be in "
        r"\(0, 1\], got 1.5",
    ),
    (
        ["--sweep", "cache=none,full"],
        r"--sweep cache=full: cache must be one of \('none', 'prefix', 'dual', 'block'\)",
    ),
    (["--sweep", "hex_samples=5,7"], r"--sweep hex_samples=7: hex_samples must be 25 .* or 5"),
    # the length each request will use: the task's YAML (32), or --gen_kwargs over it; the
    # model args' (256) only for tasks that set none (issue 42 item 3: it was checked too)
    (
        ["--sweep", "block_length=2,64"],
        r"--sweep block_length=64: row 'single' cannot run with it: "
        r"max_gen_toks 32 \(task dvoting_arith's generation_kwargs: its YAML or "
        r"--gen_kwargs\) cannot be decoded: block_length 64 does not divide the "
        r"generation length 32; give block_length a divisor of 32",
    ),
    (
        ["--sweep", "block_length=16", "--gen_kwargs", "max_gen_toks=40"],
        r"--sweep block_length=16: row 'single' cannot run with it: max_gen_toks 40 "
        r"\(task dvoting_arith's generation_kwargs: its YAML or --gen_kwargs\) "
        r"cannot be decoded: block_length 16 does not divide the "
        r"generation length 40; give block_length a divisor of 40 \(1, 2, 4, 5, 8, 10, 20, 40\)",
    ),
    # hex reads no block_length, but its own rule (L a multiple of 32) still holds at 48
    (
        ["--sweep", "block_length=3", "--gen_kwargs", "max_gen_toks=48"],
        r"--sweep block_length=3: row 'hex' cannot run with it: max_gen_toks 48 "
        r"\(task dvoting_arith's "
        r"generation_kwargs.*hex needs a generation length divisible by 32",
    ),
    (["--sweep", "block_length=0"], r"--sweep block_length=0: block_length must be >= 1"),
    # rows that set the swept setting themselves, or refuse a value
    (
        ["--sweep", "decoder=fixed,confidence"],
        r"--sweep decoder=fixed: row 'single-entropy' sets decoder itself "
        r"\(it runs with decoder='entropy' whatever the sweep gives\); leave it "
        r"out of --strategies",
    ),
    (
        ["--sweep", "decoder=entropy", "--strategies", "majority,single-confidence"],
        r"--sweep decoder=entropy: row 'single-confidence' sets decoder itself",
    ),
    (
        ["--sweep", "decoder=fixed,entropy", "--strategies", "single,hex"],
        r"--sweep decoder=entropy: row 'hex' cannot run with it: "
        r"decoder=entropy does not apply to strategy=hex",
    ),
    (
        ["--sweep", "decoder=fixed", "--strategies", "single,dvoting"],
        r"--sweep decoder=fixed: row 'dvoting' cannot run with it: "
        r"decoder=fixed does not apply to strategy=dvoting",
    ),
    (
        ["--sweep", "vote=plain,temporal"],
        r"--sweep vote=plain: row 'temporal' cannot run with it: vote=plain "
        r"does not apply to strategy=temporal",
    ),
    (
        ["--sweep", "vote=temporal", "--strategies", "single,majority"],
        r"--sweep vote=temporal: row 'single' cannot run with it: "
        r"vote=temporal does not apply to strategy=single",
    ),
    (
        [
            "--sweep",
            "vote=temporal",
            "--strategies",
            "majority",
            "--model_args",
            "pretrained=/x,cache=dual",
        ],
        r"--sweep vote=temporal: cache=dual does not apply to vote=temporal",
    ),
    (
        ["--sweep", "guidance=0,1", "--strategies", "single"],
        r"--sweep guidance=0.0: row 'single' does not use guidance \(only rfg does\)",
    ),
    (
        ["--sweep", "temporal_alpha=5,11", "--strategies", "temporal,majority"],
        r"--sweep temporal_alpha=5.0: row 'majority' does not use temporal_alpha "
        r"\(its vote is plain",
    ),
    (
        [
            "--model_args",
            "pretrained=/no/such/checkpoint,prefix_cache=true",
            "--sweep",
            "cache=none,prefix",
        ],
        r"--sweep cache=none does not take effect with these --model_args "
        r"\(the settings keep cache='prefix'\)",
    ),
    (
        ["--model_args", "pretrained=/no/such/checkpoint,threshold=1.5"],
        r"threshold=1.5 in --model_args: threshold \(confidence decoder\) "
        r"must be in \(0, 1\], got 1.5",
    ),
    (
        ["--model_args", "pretrained=/no/such/checkpoint,threshold=abc"],
        r"threshold='abc' in --model_args: threshold \(confidence decoder\) must be a number",
    ),
]


@pytest.mark.parametrize("argv, message", REFUSALS, ids=[" ".join(argv) for argv, _ in REFUSALS])
def test_a_bad_sweep_is_refused_before_the_model_is_loaded(tmp_path, argv, message):
    """Each refusal names --sweep (or the model arg), the value and what to do, and comes
    before the checkpoint is read (the path does not exist, so a later check would fail
    differently)."""
    with pytest.raises(SystemExit, match="dvoting compare: " + message):
        compare.main(
            [
                "--model_args",
                "pretrained=/no/such/checkpoint",
                "--tasks",
                "dvoting_arith",
                "--out",
                str(tmp_path),
                *argv,
            ]
        )


def test_sweep_values_take_their_settings_type():
    def parsed(spec):
        name, values = compare.parse_sweep([spec])
        return name, [(type(v), v) for v in values]

    assert parsed("block_length=1, 2,+4") == ("block_length", [(int, 1), (int, 2), (int, 4)])
    assert parsed("alpha=0.1,1,inf") == (
        "alpha",
        [(float, 0.1), (float, 1.0), (float, float("inf"))],
    )
    assert parsed("temperature=0,1") == ("temperature", [(float, 0.0), (float, 1.0)])
    assert parsed("cache=none,dual") == ("cache", [(str, "none"), (str, "dual")])
    assert compare.parse_sweep(None) is None and compare.parse_args([]).sweep is None
    fields = {f.name: f for f in dataclasses.fields(StrategySettings)}
    for name, kind in compare.SWEEP_TYPES.items():
        # a field, declared with the type its values are read as ("int | None", "float", ...)
        assert name in fields, name
        assert kind.__name__ in str(fields[name].type).split(" | "), (name, fields[name].type)


def test_single_confidence_is_one_greedy_sample_with_the_confidence_decoder():
    base = StrategySettings(gen_length=32, threshold=0.6)
    settings = compare.row_settings("single-confidence", base)
    assert (
        settings.strategy,
        settings.resolved_decoder,
        settings.resolved_temperature,
        settings.threshold,
    ) == ("single", "confidence", 0.0, 0.6)
    assert not ran_sampled(settings)  # one run
    # the model args' temperature applies to it as to single and single-entropy
    warm = compare.row_settings("single-confidence", replace(base, temperature=0.5))
    assert warm.resolved_temperature == 0.5 and ran_sampled(warm)  # one run per seed
    assert compare.ROWS.index("single-confidence") == compare.ROWS.index("single-entropy") + 1


def test_every_rows_overrides_are_complete_in_any_order():
    """As test_each_row_resets_what_the_previous_row_overrode, over every row of ROWS."""
    base = StrategySettings(gen_length=32)
    current = base
    for row in (*compare.ROWS, *reversed(compare.ROWS)):
        strategy, overrides = compare.row_overrides(row, base)
        current = replace(current, strategy=strategy, **overrides)
        assert current == compare.row_settings(row, base), row


def test_sweep_tables_and_plot_from_figures(tmp_path):
    """Tables and plot from a sweep summary (no model): one table per row, values in the
    order swept, the paired line per value; coincident points share a label."""

    def summary(name, value, accuracy, nfe, sampled):
        return {
            "strategy": name,
            "decoder": "entropy",
            "temperature": 0.6,
            "sampled": sampled,
            "seeds": [1, 2] if sampled else [1],
            "accuracy": accuracy,
            "accuracy_std": 1.5 if sampled else None,
            "accuracies": [accuracy],
            "mean_nfe": nfe,
            "nfes": [nfe],
            "mean_samples": 3.0,
            "seconds": 2.0,
            "questions": 4,
            "metric": "exact_match,extract",
            "settings": [],
            "per_document": {0: [1.0, 0.0], 1: [0.0, 1.0]},
        }

    results = [
        (
            value,
            [
                summary("dvoting", value, 60 + value, 20 + value, True),
                summary("majority-entropy", value, 50.0, 40.0, True),
                summary("single-entropy", value, 70.0, 8.0, False),
            ],
        )
        for value in (1, 4)
    ]
    sweep = compare.sweep_summary("block_length", results)
    assert sweep["values"] == [1, 4] and list(sweep["rows"]) == [
        "dvoting",
        "majority-entropy",
        "single-entropy",
    ]
    assert [e["accuracy_mean"] for e in sweep["rows"]["dvoting"]] == [61, 64]
    assert [p["value"] for p in sweep["paired"]] == [1, 4] and sweep["paired"][0]["problems"] == 2
    tables = compare.sweep_tables(sweep)
    assert (
        "### dvoting, block_length swept\n\n| block_length | accuracy (%) | runs | mean NFE |"
        in tables
    )
    assert (
        "| 1 | 61.00 ± 1.50 | 2 seeds | 21.0 | 3.00 | 2.0 |\n| 4 | 64.00 ± 1.50 | 2 seeds | 24.0 |"
        in tables
    )
    assert "| 4 | 70.00 | 1 (greedy) | 8.0 |" in tables
    assert "block_length=4: dvoting - majority-entropy: " in tables
    compare.plot_sweep(sweep, tmp_path / "sweep.png", "title")
    assert (tmp_path / "sweep.png").stat().st_size > 1000


def test_a_vote_sweep_changes_the_vote_and_not_the_samples(tmp_path):
    """vote=temporal reads the same samples' steps: the same forward passes as vote=plain."""
    result = _run_compare(
        tmp_path,
        "--strategies",
        "majority,dvoting",
        "--sweep",
        "vote=plain,temporal",
        "--model_args",
        "pretrained=tiny-arith,n=3",
    )
    sweep = result["sweep"]
    assert sweep["name"] == "vote" and sweep["values"] == ["plain", "temporal"]
    for entries in sweep["rows"].values():
        plain, temporal = entries
        assert (
            plain["nfes"] == temporal["nfes"] and plain["mean_samples"] == temporal["mean_samples"]
        )
        assert {s["vote"] for s in plain["settings"]} == {"plain"} and {
            s["vote"] for s in temporal["settings"]
        } == {"temporal"}
    # each later value against the first, paired over the problems
    for row, entries in sweep["rows"].items():
        [pair] = sweep["against_first"][row]
        plain, temporal = ({int(k): v for k, v in e["per_document"].items()} for e in entries)
        assert (pair["value"], pair["against"]) == ("temporal", "plain")
        assert pair["mean_points"] == pytest.approx(
            100
            * statistics.fmean(
                statistics.fmean(temporal[p]) - statistics.fmean(plain[p]) for p in plain
            )
        )


def test_a_sweeps_later_values_are_compared_with_its_first_on_the_same_problems():
    entries = [
        {"value": "plain", "per_document": {0: [1.0, 0.0], 1: [0.0, 0.0]}, "seeds": [1, 2]},
        {"value": "temporal", "per_document": {0: [1.0, 1.0], 1: [0.0, 1.0]}, "seeds": [1, 2]},
        {"value": "other seeds", "per_document": {0: [1.0], 1: [1.0]}, "seeds": [3]},
    ]
    [pair] = compare.value_against_first(entries)  # the third ran with other seeds: not paired
    assert (pair["value"], pair["against"], pair["problems"]) == ("temporal", "plain", 2)
    assert pair["mean_points"] == pytest.approx(50.0)  # +0.5 on each problem
    text = compare.sweep_tables(
        {"name": "vote", "rows": {"dvoting": entries[:2]}, "against_first": {"dvoting": [pair]}}
        | {
            "rows": {
                "dvoting": [
                    e
                    | {
                        "accuracy_mean": 50.0,
                        "accuracy_std": None,
                        "nfe_mean": 9.0,
                        "mean_samples": 1.0,
                        "seconds": 1.0,
                        "sampled": False,
                    }
                    for e in entries[:2]
                ]
            }
        }
    )
    assert "vote=temporal - vote=plain: +50.0 points, 95% CI [+50.0, +50.0]" in text


@pytest.mark.parametrize(
    "argv",
    [
        # 3 divides the 48 the requests use; the model args' default 256 serves no request
        ["--strategies", "single", "--sweep", "block_length=3", "--gen_kwargs", "max_gen_toks=48"],
        # a block length that divides the task's 32 but not the model args' 40
        [
            "--strategies",
            "single,majority",
            "--sweep",
            "block_length=8,16",
            "--model_args",
            "pretrained=/no/such/checkpoint,max_gen_toks=40",
        ],
        # hex at the task's 32, whatever the model args' 40 (not a multiple of 32)
        [
            "--strategies",
            "single,hex",
            "--model_args",
            "pretrained=/no/such/checkpoint,max_gen_toks=40",
        ],
    ],
)
def test_block_lengths_are_checked_at_the_length_the_requests_use(tmp_path, argv):
    """Issue 42 item 3: the pre-checks (rows and --sweep) use each task's max_gen_toks (its
    YAML's, or --gen_kwargs'), as the requests do; the model arg max_gen_toks only serves a
    task that sets none. Accepted here: the run goes on to load the (missing) checkpoint."""
    if "--model_args" not in argv:
        argv = [*argv, "--model_args", "pretrained=/no/such/checkpoint"]
    with pytest.raises(Exception, match="no checkpoint folder at '/no/such/checkpoint'"):
        compare.main(["--tasks", "dvoting_arith", "--out", str(tmp_path), *argv])


def test_a_task_without_a_length_is_checked_at_the_model_args_length():
    """A task that sets no max_gen_toks runs at the model arg's: a row is refused there, the
    message naming the length and where it comes from; the task's own length is accepted."""
    base = StrategySettings(gen_length=40, defer_length_checks=True)
    assert compare.row_settings("hex", base, {"t": {"max_gen_toks": 64}}).strategy == "hex"
    with pytest.raises(
        SystemExit,
        match=r"row 'hex' cannot run with these --model_args: max_gen_toks 40 "
        r"\(the model arg max_gen_toks, default 256: task t sets none\).*"
        r"hex needs a generation length divisible by 32",
    ):
        compare.row_settings("hex", base, {"t": {}, "u": {"max_gen_toks": 64}})
    swept = StrategySettings(gen_length=48, defer_length_checks=True)
    assert compare.sweep_plan(["single"], swept, "block_length", [3], {}, {"t": {}})
    with pytest.raises(
        SystemExit,
        match=r"block_length=3: row 'single' cannot run with it: max_gen_toks 32 "
        r"\(task u's generation_kwargs.*block_length 3 does not divide",
    ):
        compare.sweep_plan(
            ["single"], swept, "block_length", [3], {}, {"t": {}, "u": {"max_gen_toks": 32}}
        )
