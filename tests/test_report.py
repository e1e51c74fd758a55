"""`dvoting report` on hand-made harness output folders, and on a real (tiny) run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lm_eval_dvoting.commands import report
from lm_eval_dvoting.commands.cli import main as dvoting_main
from lm_eval_dvoting.core.answers import vote

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# Hand-made dVoting traces of four questions (tokens, answers, votes, correct?).
# NUPR@2 per question: 3/4, 3/4, 3/4, 1 -> mean 0.8125
# NUPR@3 per question: 1/4, (K=2: left out), 2/4, 1 -> mean 0.5833
# consistency: 3/3, 1/2, 2/5, 1/5 -> mean 0.525; the first three are correct
QUESTIONS = [
    ([[1, 2, 3, 4], [1, 2, 5, 6], [1, 7, 5, 8]], ["7", "7", "7"], {"7": 3}, True),
    ([[9, 9, 0, 0], [9, 8, 0, 0]], ["4", "5"], {"4": 1, "5": 1}, True),
    (
        [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6, 7], [1, 8, 9, 10], [11, 12, 13, 14]],
        ["3", "3", "1", None, None],
        {"3": 2, "1": 1},
        True,
    ),
    ([[5, 5, 5, 5]] * 5, ["2", "6", "8", None, None], {"2": 1, "6": 1, "8": 1}, False),
]


def _trace(tokens, answers, votes, kept_from=None):
    candidates = [
        {
            "text": f"text {i}",
            "answer": a,
            "nfe": 4,
            "tokens": t,
            "kept_positions": [0] if kept_from is not None and i >= kept_from else None,
        }
        for i, (t, a) in enumerate(zip(tokens, answers))
    ]
    return {"candidates": candidates, "votes": votes, "chosen": 0}


def _write_run(
    folder: Path,
    date: str,
    strategy: str,
    accuracy: float,
    nfe: float,
    samples: float,
    records: list[dict],
    pretrained: str,
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    results = {
        "results": {
            "dvoting_arith": {
                "alias": "dvoting_arith",
                "exact_match,extract": accuracy,
                "exact_match_stderr,extract": 0.1,
                "nfe,extract": nfe,
                "n_samples,extract": samples,
                "dvoting_trace,extract": len(records),
            }
        },
        "config": {
            "model": "dvoting-llada",
            "model_args": {"pretrained": pretrained, "strategy": strategy},
            "dvoting": {"pretrained": pretrained, "settings": {"strategy": strategy, "n": 5}},
        },
    }
    path = folder / f"results_{date}.json"
    path.write_text(json.dumps(results))
    with (folder / f"samples_dvoting_arith_{date}.jsonl").open("w") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    return path


def _record(doc_id, correct, trace):
    return {
        "doc_id": doc_id,
        "target": "7",
        "filtered_resps": ["7" if correct else "2"],
        "exact_match": float(correct),
        "nfe": 4.0,
        "n_samples": float(len(trace["candidates"])),
        "dvoting_trace": trace,
    }


@pytest.fixture
def outputs(tmp_path: Path, tiny_llada_dir: Path) -> Path:
    model = tmp_path / "runs" / "tiny"
    single = [
        _record(i, i < 2, _trace([tokens[0]], answers[:1], {answers[0]: 1} if answers[0] else {}))
        for i, (tokens, answers, _, _) in enumerate(QUESTIONS)
    ]
    _write_run(
        model, "2026-01-01T00-00-00.000001", "single", 0.5, 32.0, 1.0, single, str(tiny_llada_dir)
    )
    voted = [
        _record(i, ok, _trace(tokens, answers, votes, kept_from=3))
        for i, (tokens, answers, votes, ok) in enumerate(QUESTIONS)
    ]
    _write_run(
        model, "2026-01-01T00-00-01.000001", "dvoting", 0.75, 64.0, 3.75, voted, str(tiny_llada_dir)
    )
    return tmp_path / "runs"


def test_report_table_and_files(outputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    assert dvoting_main(["report", str(outputs), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    # default baseline: the strategy=single run; BPC = (75 - 50) / (64 / 32) = 12.5
    assert "| single | dvoting_arith | 4 | 50.00 | 32.0 | 1.00 | baseline | – | – | – |" in text
    assert (
        "| dvoting n=5 | dvoting_arith | 4 | 75.00 | 64.0 | 3.75 | 12.50 | 0.812 | 0.583 | 0.525 |"
        in text
    )
    # consistency levels: correct 1.0, 0.5, 0.4; incorrect 0.2
    section = text.split("### dvoting n=5 · dvoting_arith")[1]
    assert "| 1.00 | 1 (33%) | 0 (0%) |" in section
    assert "| 0.50 | 1 (33%) | 0 (0%) |" in section
    assert "| 0.20 | 0 (0%) | 1 (100%) |" in section
    assert "| all | 3 | 1 |" in section
    assert "### single" not in text  # one sample per question: no distribution
    for name in ("accuracy_vs_nfe.png", "consistency.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    # token pictures: the first three questions with several samples, of the voting run only
    pictures = sorted(p.name for p in out.glob("tokens_*"))
    assert pictures == [
        f"tokens_dvoting_n=5_dvoting_arith_doc{i}.{ext}"
        for i in range(3)
        for ext in ("html", "png")
    ]
    page = (out / "tokens_dvoting_n=5_dvoting_arith_doc0.html").read_text()
    assert "position 2: 2/3 samples" in page and "position 3: 1/3 samples" in page
    assert "correct" in page and "Votes: {&quot;7&quot;: 3}" in page


def test_token_picture_drops_shared_end_padding_and_frames_kept(
    outputs: Path, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    report.main([str(outputs), "--out", str(out), "--questions", "1,2"])
    page = (out / "tokens_dvoting_n=5_dvoting_arith_doc1.html").read_text()
    # question 1 ends in two positions of token 0 (the tokenizer's end-of-text) in both samples
    assert "2 trailing positions" in page and "position 2:" not in page
    page = (out / "tokens_dvoting_n=5_dvoting_arith_doc2.html").read_text()
    assert page.count("outline:2px") == 2  # samples 4 and 5 kept position 0
    assert not (out / "tokens_dvoting_n=5_dvoting_arith_doc0.html").exists()
    assert (out / "tokens_dvoting_n=5_dvoting_arith_doc2.png").read_bytes()[:8] == PNG_MAGIC


def test_baseline_choice(outputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    # the dVoting run as baseline (by position): single is cheaper (32 vs 64 NFE), so it has no
    # BPC (not (50 - 75) / (32 / 64) = -50, a difference magnified by a cost ratio below 1)
    report.main([str(outputs), "--out", str(out), "--baseline", "2", "--questions", "none"])
    text = (out / "report.md").read_text()
    assert "| single | dvoting_arith | 4 | 50.00 | 32.0 | 1.00 | – |" in text
    assert "– for a cheaper run" in text
    assert "| dvoting n=5 | dvoting_arith | 4 | 75.00 | 64.0 | 3.75 | baseline |" in text
    assert not list(out.glob("tokens_*"))
    # by label, and results file given directly (no single run among them: no BPC)
    dvoting_file = next(outputs.rglob("results_*00-00-01*.json"))
    report.main([str(dvoting_file), "--out", str(out), "--questions", "none"])
    assert (
        "| dvoting n=5 | dvoting_arith | 4 | 75.00 | 64.0 | 3.75 | – |"
        in (out / "report.md").read_text()
    )
    with pytest.raises(SystemExit, match="names no run"):
        report.main([str(outputs), "--out", str(out), "--baseline", "majority"])


def test_missing_input_is_an_error(tmp_path: Path, capsys) -> None:
    assert report.main([str(tmp_path), "--out", str(tmp_path / "r")]) == 1
    assert "no lm-eval results" in capsys.readouterr().err


def test_results_without_samples_still_report_accuracy_and_bpc(
    outputs: Path, tmp_path: Path
) -> None:
    for sample_file in outputs.rglob("samples_*.jsonl"):
        sample_file.unlink()
    out = tmp_path / "report"
    report.main([str(outputs), "--out", str(out)])
    text = (out / "report.md").read_text()
    assert "| dvoting n=5 | dvoting_arith | – | 75.00 | 64.0 | 3.75 | 12.50 | – | – | – |" in text
    assert "No `--log_samples` records" in text


def test_report_on_a_real_harness_run(tiny_llada_dir: Path, tmp_path: Path) -> None:
    """The trace travels from generate_until through the task's filters and
    process_results into lm-eval's --log_samples files, and the report reads them."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    torch.set_num_threads(1)
    manager = TaskManager(
        include_path=str(Path(__file__).resolve().parents[1] / "task_configs"),
        include_defaults=False,
    )
    lm = LLaDAEvalModel(
        pretrained=str(tiny_llada_dir), strategy="dvoting", batch_size=16, device="cpu"
    )
    # saved as `lm_eval ... --log_samples --output_path out` saves them
    tracker = EvaluationTracker(output_path=str(tmp_path / "out"))
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=["dvoting_arith"],
        limit=2,
        task_manager=manager,
        log_samples=True,
        evaluation_tracker=tracker,
        gen_kwargs="max_gen_toks=32",
    )
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    tracker.save_results_samples(task_name="dvoting_arith", samples=samples["dvoting_arith"])
    assert (
        results["results"]["dvoting_arith"]["dvoting_trace,extract"] == 2
    )  # the aggregate: a count

    records = [
        json.loads(line)
        for f in (tmp_path / "out").rglob("samples_*.jsonl")
        for line in f.read_text().splitlines()
    ]
    assert len(records) == 2
    for record in records:
        trace = record["dvoting_trace"]
        assert "dvoting_trace" in record["metrics"]
        # the votes are the candidates' answers counted; the chosen one carries the winner
        result = vote([c["answer"] for c in trace["candidates"]], "number")
        assert trace["votes"] == dict(result.counts)
        assert trace["chosen"] == (0 if result.winner_index is None else result.winner_index)
        for candidate in trace["candidates"]:
            assert len(candidate["tokens"]) == 32  # max_gen_toks
            assert set(candidate) >= {"text", "answer", "nfe", "kept_positions"}
        assert sum(c["nfe"] for c in trace["candidates"]) == record["nfe"]

    out = tmp_path / "report"
    assert report.main([str(tmp_path / "out"), "--out", str(out), "--questions", "0"]) == 0
    text = (out / "report.md").read_text()
    assert "| dvoting n=5 | dvoting_arith | 2 |" in text
    assert (out / "tokens_dvoting_n=5_dvoting_arith_doc0.png").read_bytes()[:8] == PNG_MAGIC


def _two_filter_run(folder: Path, tiny_llada_dir: Path) -> None:
    """A run shaped as lm-eval writes `gsm8k_cot_zeroshot --limit 3 --log_samples`: two filters,
    so two logged lines per document; strict-match right on doc 0, flexible-extract on 0 and 1."""
    task, date = "gsm8k_cot_zeroshot", "2026-01-02T00-00-00.000001"
    right = {"strict-match": {0}, "flexible-extract": {0, 1}}
    folder.mkdir(parents=True)
    figures = {
        "alias": task,
        **{f"exact_match,{f}": len(ok) / 3 for f, ok in right.items()},
        **{f"nfe,{f}": 20.0 for f in right},
        **{f"n_samples,{f}": 3.0 for f in right},
    }
    dvoting = {"pretrained": str(tiny_llada_dir), "settings": {"strategy": "dvoting", "n": 3}}
    results = {
        "results": {task: figures},
        "n-samples": {task: {"original": 1319, "effective": 3}},
        "config": {
            "model": "dvoting-llada",
            "dvoting": dvoting,
            "model_args": {"pretrained": str(tiny_llada_dir)},
        },
    }
    (folder / f"results_{date}.json").write_text(json.dumps(results))
    tokens, answers, votes, _ = QUESTIONS[0]
    lines = [
        _record(doc, doc in ok, _trace(tokens, answers, votes)) | {"filter": name}
        for name, ok in right.items()
        for doc in range(3)
    ]
    text = "".join(json.dumps(r) + "\n" for r in lines)
    (folder / f"samples_{task}_{date}.jsonl").write_text(text)


def test_a_two_filter_task_counts_documents_and_reports_each_filter(
    tmp_path: Path, tiny_llada_dir: Path
) -> None:
    """Issue 42, item 4: 3 documents logged twice (one line per filter) are 3 questions, not 6;
    each filter's accuracy is reported under its name, with its own consistency counts."""
    _two_filter_run(tmp_path / "runs", tiny_llada_dir)
    out = tmp_path / "report"
    assert report.main([str(tmp_path / "runs"), "--out", str(out), "--questions", "none"]) == 0
    text = (out / "report.md").read_text()
    task = "gsm8k_cot_zeroshot"
    assert f"| dvoting n=3 | {task} (strict-match) | 3 | 33.33 | 20.0 | 3.00 |" in text
    assert f"| dvoting n=3 | {task} (flexible-extract) | 3 | 66.67 | 20.0 | 3.00 |" in text
    # the consistency table of each filter counts its 3 documents, each once
    strict = text.split("### dvoting n=3 · gsm8k_cot_zeroshot (strict-match)")[1]
    assert "| all | 1 | 2 |" in strict.split("###")[0]
    flexible = text.split("### dvoting n=3 · gsm8k_cot_zeroshot (flexible-extract)")[1]
    assert "| all | 2 | 1 |" in flexible.split("###")[0]
    [run] = [report.load_run(p) for p in report.find_results([tmp_path / "runs"])]
    assert {name: task.questions for name, task in run.tasks.items()} == {
        "gsm8k_cot_zeroshot (strict-match)": 3,
        "gsm8k_cot_zeroshot (flexible-extract)": 3,
    }
    for sample_file in (tmp_path / "runs").glob("samples_*.jsonl"):
        sample_file.unlink()  # without logged samples: lm-eval's n-samples (effective), not "–"
    [run] = [report.load_run(p) for p in report.find_results([tmp_path / "runs"])]
    assert [task.questions for task in run.tasks.values()] == [3, 3]


# (plain vote right, temporal vote right, ever-pass, TSE, per-step runs, runs right) per question
TEMPORAL_QUESTIONS = [
    (False, True, True, 1.0, [[0, "7"], [2, "9"]], [True, False]),  # the vote turned it right
    (True, False, True, 0.5, [[0, "2"], [3, "7"]], [False, True]),  # ... and this one wrong
    (True, True, True, 0.0, [[0, "7"]], [True]),
    (False, False, False, None, [[0, None], [1, "2"]], [False, False]),
    (True, False, True, 1.0, [[0, "9"], [2, "7"]], [False, True]),  # right at the end, voted wrong
]


def _temporal_record(doc_id, plain, voted, ever, tse, runs, correct):
    trace = {
        "vote": "temporal",
        "plain_vote": "7" if plain else "9",
        "plain_correct": plain,
        "chosen": 0,
        "votes": {"7": 1.0},
        "candidates": [
            {
                "answer": runs[-1][1],
                "nfe": 4,
                "tokens": [1, 2, 3, 4],
                "steps": runs,
                "steps_correct": correct,
            }
        ],
    }
    record = _record(doc_id, voted, trace) | {"ever_pass": float(ever)}
    return record if tse is None else record | {"tse": tse}


def test_temporal_runs_get_ever_pass_tse_overturns_and_accuracy_by_step(tmp_path: Path) -> None:
    records = [_temporal_record(i, *question) for i, question in enumerate(TEMPORAL_QUESTIONS)]
    _write_run(
        tmp_path / "runs",
        "2026-01-01T00-00-02.000001",
        "temporal",
        0.5,
        4.0,
        1.0,
        records,
        "tiny-arith",
    )
    [row] = report.build_step_rows(
        [report.load_run(p) for p in report.find_results([tmp_path / "runs"])]
    )
    assert (row.plain, row.voted, row.ever) == (
        [False, True, True, False, True],
        [True, False, True, False, False],
        [True, True, True, False, True],
    )
    assert row.tse == [1.0, 0.5, 0.0, 1.0] and row.overturned == (1, 2)
    assert row.decodes == [
        [True, True, False, False],
        [False, False, False, True],
        [True] * 4,
        [False] * 4,
        [False, False, True, True],
    ]
    assert report.step_curves(row, points=4) == (
        [0.25, 0.5, 0.75, 1.0],
        [40.0, 40.0, 40.0, 60.0],
        [40.0, 40.0, 60.0, 80.0],
    )
    out = tmp_path / "report"
    assert report.main([str(tmp_path / "runs"), "--out", str(out), "--questions", "none"]) == 0
    text = (out / "report.md").read_text()
    assert "| temporal | dvoting_arith | 5 | 60.00 | 40.00 | 80.00 | 0.625 | 1 | 2 |" in text
    assert (out / "accuracy_by_step.png").read_bytes()[:8] == PNG_MAGIC


def test_step_curves_pick_the_step_in_whole_numbers():
    """ceil(7/50 * 50) is 8 in floats; the curve must read step 6 of 50 at the 7th point."""
    row = report.StepRow(None, None, [], [], [], [], [[False] * 6 + [True] + [False] * 43])
    _, at, ever = report.step_curves(row, points=50)
    assert at[6] == 100.0 and at[5] == at[7] == 0.0 and ever[5] == 0.0 and ever[6] == 100.0


def test_the_consistency_level_of_a_temporal_vote_counts_final_answers():
    """Its `votes` are step weights; the level is the plain vote's (the samples' final answers)."""
    trace = {
        "vote": "temporal",
        "votes": {"7": 1.7, "9": 0.3},
        "plain_votes": {"9": 2},
        "candidates": [{"answer": "9"}, {"answer": "9"}],
    }
    assert report._level(trace) == 1.0


def test_runs_without_per_step_answers_get_no_temporal_section(
    outputs: Path, tmp_path: Path
) -> None:
    assert report.main([str(outputs), "--out", str(tmp_path / "r"), "--questions", "none"]) == 0
    assert "ever-pass" not in (tmp_path / "r" / "report.md").read_text()
    assert not (tmp_path / "r" / "accuracy_by_step.png").exists()


def test_report_on_a_real_temporal_run(tmp_path: Path) -> None:
    """strategy=temporal's per-step answers go through the task's scoring into the sample
    log, and the report's temporal table agrees with the run's own metrics."""
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    torch.set_num_threads(1)
    manager = TaskManager(
        include_path=str(Path(__file__).resolve().parents[1] / "task_configs"),
        include_defaults=False,
    )
    lm = LLaDAEvalModel(pretrained="tiny-arith", strategy="temporal", batch_size=16, device="cpu")
    tracker = EvaluationTracker(output_path=str(tmp_path / "out"))
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=["dvoting_arith"],
        limit=12,
        task_manager=manager,
        log_samples=True,
        evaluation_tracker=tracker,
    )
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    tracker.save_results_samples(task_name="dvoting_arith", samples=samples["dvoting_arith"])
    [run] = [report.load_run(p) for p in report.find_results([tmp_path / "out"])]
    [row] = report.build_step_rows([run])
    figures = results["results"]["dvoting_arith"]
    assert len(row.voted) == 12 and 100 * sum(row.voted) / 12 == pytest.approx(
        100 * figures["exact_match,extract"]
    )
    assert sum(row.ever) / 12 == pytest.approx(figures["ever_pass,extract"])
    assert sum(row.tse) / len(row.tse) == pytest.approx(figures["tse,extract"])
    assert len(row.decodes) == 12 and all(
        len(d) == 16 for d in row.decodes
    )  # one decode of L/2 steps each
    # the last step's answer is the final answer, which is the plain vote of one decode
    assert [d[-1] for d in row.decodes] == row.plain
