"""bench/projection.py: the step-time model interpolates the GPU run's cells as documented, a
task costs the sum over its questions, the paper's steps are read from docs/ALGORITHM.md,
and a GPU run that lacks a cell the model reads is refused with a message that names it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import projection
from bench.projection import DualModel, StepModel, TaskShape

REPO = Path(__file__).resolve().parents[1]


def _steps(first: float, later: float) -> list[dict[str, float | str]]:
    """One timed block of 32 steps: a full first step, then reuse steps (`none`: all full)."""
    kinds = ["full"] + ["reuse" if first != later else "full"] * 31
    walls = [first] + [later] * 31
    return [
        {"wall": w, "forward": w, "head": 0.0, "kind": k, "width": 32} for w, k in zip(walls, kinds)
    ]


def hand_run() -> dict:
    """A GPU run by hand: 1 row: 10 ms at 64 tokens, 30 ms per step at 512; 16 rows: 40 ms
    and 200 ms; dual: a 60 ms full step, then 10 ms reuse steps (both rows)."""
    caches = {}
    for rows, step in (("1", 0.030), ("16", 0.200)):
        caches[rows] = {
            "fixed/none/block0/repeat0": _steps(step, step),
            "fixed/dual/block0/repeat0": _steps(0.060, 0.010),
            "fixed/dual/block7/repeat0": _steps(0.060, 0.010),
        }
    return {
        "facts": {"gpu": "NVIDIA H100 80GB HBM3"},
        "forward": {"1x64": 10.0, "16x64": 40.0},
        "caches": caches,
    }


def test_step_times_are_linear_in_tokens_between_the_measured_cells():
    none, dual = projection.load_models(hand_run(), Path("hand.json"))
    assert none.seconds(1, 64) == pytest.approx(0.010)
    assert none.seconds(1, 512) == pytest.approx(0.030)  # 8 blocks x 32 steps of 30 ms / 256
    assert none.seconds(1, 288) == pytest.approx(0.020)  # half way
    assert none.seconds(16, 288) == pytest.approx(0.120)
    assert none.seconds(16, 960) == pytest.approx(0.360)  # the line extended ...
    assert none.measured(16, 512) and not none.measured(16, 960)  # ... and flagged
    # dual, 4 steps per block: (full 60 ms x t(288)/t(512) + 3 x 10 ms) / 4
    assert dual.seconds(1, 288, 4) == pytest.approx((0.060 * 2 / 3 + 0.030) / 4)
    with pytest.raises(ValueError, match="rows=4: the GPU run has no step times at 4 rows"):
        none.seconds(4, 288)


def test_a_task_costs_the_sum_over_its_questions():
    none = StepModel({1: ((64, 0.010), (512, 0.030)), 16: ((64, 0.040), (512, 0.200))})
    dual = DualModel(none, {1: 0.02, 16: 0.2}, {1: 0.03, 16: 0.1}, 512)
    assert projection.task_seconds([100, 200, 300], 2, lambda t: t / 1000) == pytest.approx(1.2)
    paper = projection.PaperRow(
        "T", 256, {"single": 256, "majority": 640, "hex": 3200, "dvoting": 10}
    )
    prompts = (32, 256, 480)  # lengths 288, 512 and 736 (beyond the cells)
    whole = projection.project(TaskShape("T", "t", 256, prompts), paper, none, dual)
    parts = [projection.project(TaskShape("T", "t", 256, (p,)), paper, none, dual) for p in prompts]
    for strategy in projection.STRATEGIES:
        for cell in ("none/1", "none/16", "dual/1", "dual/16"):
            each = [p[strategy]["seconds"][cell] for p in parts]
            if each[0] is None:  # dvoting's dual: not projected
                assert whole[strategy]["seconds"][cell] is None and strategy == "dvoting"
                continue
            assert whole[strategy]["seconds"][cell] == pytest.approx(sum(each))
    # by hand: 256 row-steps per question, each 1/16 of t(16, T)
    by_hand = 256 * sum(none.seconds(16, 256 + p) / 16 for p in prompts)
    assert whole["single"]["seconds"]["none/16"] == pytest.approx(by_hand)
    assert by_hand == pytest.approx(16 * (0.12 + 0.2 + 0.28))


def test_the_estimate_counts_the_template_and_the_trimmed_bytes():
    # " ééé  \n" trims to 6 bytes (3 characters): ceil(6 / 4) = 2, + the template's 10
    assert projection.estimated_tokens(" ééé  \n", 4.0) == projection.TEMPLATE_TOKENS + 2


def test_the_paper_steps_are_read_from_the_algorithm_doc():
    rows = projection.paper_rows()
    assert rows["GSM8K"].gen_length == 256 and rows["MMLU"].gen_length == 128
    assert rows["GSM8K"].nfe == {"single": 256, "majority": 640, "hex": 3200, "dvoting": 237.1}
    assert rows["MATH500"].nfe["dvoting"] == 473.7 and rows["GPQA"].nfe["hex"] == 1600
    for label, row in rows.items():  # the fixed schedules: the paper's steps are our defaults'
        for strategy in ("single", "majority", "hex"):
            ours, _ = projection.default_plan(strategy, row.gen_length)
            assert ours == row.nfe[strategy], (label, strategy)
    assert projection.default_plan("hex", 256)[1] == [4, 8, 16, 32, 64]  # steps per block
    assert projection.default_plan("dvoting", 256) == (None, None)


@pytest.mark.parametrize(
    "damage, named",
    [
        (lambda run: run["forward"].pop("16x64"), "forward 16x64"),
        (
            lambda run: run["caches"]["16"].pop("fixed/dual/block7/repeat0"),
            "caches 16 row(s) fixed/dual/block7",
        ),
        (
            lambda run: run["caches"]["1"].update({"fixed/none/block0/repeat0": []}),
            "caches 1 row(s) fixed/none/block0",
        ),
        (
            lambda run: run.update(caches={"error": "CUDA out of memory"}),
            "'caches' part failed on the GPU",
        ),
        (lambda run: run.pop("forward"), "'forward' part is missing"),
    ],
    ids=["forward cell", "dual cell", "empty none cell", "failed part", "missing part"],
)
def test_a_run_without_the_cells_is_refused_naming_them(tmp_path, damage, named):
    run = hand_run()
    damage(run)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    argv = ["--json", str(path), "--data-dir", str(tmp_path), "--out", str(tmp_path / "B.md")]
    with pytest.raises(SystemExit) as refused:
        projection.main(argv)
    message = str(refused.value)
    assert named in message and f"--json {path}" in message
    assert "python -m bench gpu --parts forward caches" in message
    assert not (tmp_path / "B.md").exists()  # refused before anything is written


def test_a_missing_data_folder_is_refused_before_reading(tmp_path):
    with pytest.raises(SystemExit, match=r"--data-dir .*nowhere: not a folder; give the folder"):
        projection.main(["--data-dir", str(tmp_path / "nowhere")])


def test_exact_counts_use_the_tokenizers_own_chat_template(tmp_path):
    from transformers import AutoTokenizer

    demo = AutoTokenizer.from_pretrained(str(REPO / "lm_eval_dvoting" / "demo" / "tiny-arith"))
    demo.chat_template = "{% for m in messages %}{{ m['content'] }}={% endfor %}"  # one token more
    demo.save_pretrained(tmp_path)
    count = projection.tokenizer_counter(tmp_path)
    assert count("12+3") == len(demo.encode("12+3=", add_special_tokens=False)) == 5


def test_the_section_is_labelled_a_projection_and_marks_what_it_extends():
    run = hand_run()
    # the entropy rule's none steps after the first: 15 ms (1 row), 100 ms (16 rows)
    run["caches"]["1"]["entropy/none/block0/repeat0"] = _steps(0.050, 0.015)
    run["caches"]["16"]["entropy/none/block0/repeat0"] = _steps(0.300, 0.100)
    none, dual = projection.load_models(run, Path("hand.json"))
    paper = {
        "T": projection.PaperRow(
            "T", 256, {"single": 256, "majority": 640, "hex": 3200, "dvoting": 9}
        )
    }
    shapes = [TaskShape("T", "dvoting_t", 256, (32, 480))]  # 736 tokens: beyond the cells
    args = projection.parse_args(["--data-dir", str(REPO), "--json", str(projection.DEFAULT_BENCH)])
    parts = (shapes, projection.projections(shapes, paper, none, dual), none, dual)
    text = "\n".join(projection.section(run, args, ["--data-dir", "D"], parts, 0.05))
    assert "## PROJECTION (computed, not measured): whole tasks on one H100" in text
    assert "- command: `.venv/bin/python -m bench projection --data-dir D`" in text
    assert "prompt tokens: ESTIMATED" in text and "no time rises by more than 5.0%" in text
    assert "| T | dvoting | 9 | varies (early stop) |" in text and "| n/a | n/a |" in text
    assert "| T | single | 256 | 256 | " in text and " † |" in text  # extended: marked
    assert "| T | `dvoting_t` | 2 | 256 | 256 (32-480) | 1 |" in text
    assert "15.0 ms at 1 row(s), 0.50x the fixed one's; 100.0 ms at 16 row(s), 0.50x" in text


H100 = "NVIDIA H100 80GB HBM3"


def _block(full: float, reuse: float, k: float) -> list[float]:
    """One block of 32 steps (x `k`): the full step, a refill step (3x `reuse`), a capture
    step (20x), then 29 reuse steps whose mean is `reuse` and whose median is not (20 of
    0.75x, 9 of 14/9x)."""
    later = [0.75 * reuse] * 20 + [14 / 9 * reuse] * 9
    return [k * x for x in [full, 3 * reuse, 20 * reuse, *later]]


def hand_static_steps(gpu: str = H100, **changed) -> dict:
    """A `python -m bench static-steps` GPU run by hand: every `dual` cell's block of 32 steps,
    three repeats whose full steps are 50, 54 and 90 ms at one row (median 54; 6x at 16
    rows); `graphs`' replays average 4 ms (30 ms at 16 rows); `static` is 1.5x `graphs`; the
    last block's steps are 1.1x the first's."""
    args = dict(projection.CACHED_STEPS_SHAPE, gen_length=256, block=32, rows=[1, 16])
    repeats = []
    for first in (0.050, 0.090, 0.054):
        cells = {}
        for rows, full, reuse in ((1, first, 0.004), (16, 6 * first, 0.030)):
            for mode, slower in (("graphs", 1.0), ("static", 1.5)):
                for block, later in ((0, 1.0), (7, 1.1)):
                    steps = _block(full, reuse, slower * later)
                    cells[f"dual/{mode}/rows{rows}/block{block}"] = {"steps": steps}
        repeats.append(cells)
    run = {"args": args, "meta": {"facts": {"gpu": gpu}, "command": "bench static-steps"}}
    run.update(repeats=repeats)
    for key, value in changed.items():
        run["args"][key] = value
    return run


def test_cached_steps_read_the_graphs_replays_as_the_dual_model_wants():
    block = _block(0.0, 0.004, 1.0)
    assert len(block) == 32 and sum(block[3:]) / 29 == pytest.approx(0.004)  # as it says
    cached = projection.load_cached_steps(hand_static_steps(), Path("s.json"), H100)
    assert cached.mode == "graphs" and cached.gpu == H100 and cached.repeats == 3
    # the median of the repeats' first steps (54 ms), averaged over blocks 0 and 7
    assert cached.full[1] == pytest.approx(0.054 * (1 + 1.1) / 2)
    assert cached.full[16] == pytest.approx(6 * 0.054 * (1 + 1.1) / 2)
    # the replays' mean: the refill and the capture steps left out
    assert cached.reuse[1] == pytest.approx(0.004 * (1 + 1.1) / 2)
    assert cached.reuse[16] == pytest.approx(0.030 * (1 + 1.1) / 2)


def test_cached_steps_fall_back_to_static_where_a_graphs_cell_stopped():
    run = hand_static_steps()
    # its steps ran eagerly up to the refusal: timed, but not `graphs`' figures
    run["repeats"][1]["dual/graphs/rows16/block7"]["refused"] = "cached_steps=graphs: capture"
    cached = projection.load_cached_steps(run, Path("s.json"), H100)
    assert cached.mode == "static"
    # all the later steps: the refill (3x) and a step of 20x included, over 31 steps
    static_reuse = 1.5 * 0.004 * (3 + 20 + 29) / 31
    assert cached.reuse[1] == pytest.approx(static_reuse * (1 + 1.1) / 2)


@pytest.mark.parametrize(
    "gpu, changed, named",
    [
        ("NVIDIA H200", {}, "GPU NVIDIA H200 (--json's step times are from a NVIDIA H100 80GB"),
        ("NVIDIA H100 PCIe", {}, "GPU NVIDIA H100 PCIe (--json's step times are from a NVIDIA"),
        (H100, {"layers": 4}, "layers 4 (needs 32)"),
        (H100, {"dtype": "float32"}, "dtype 'float32' (needs 'bfloat16')"),
        (H100, {"rows": [1, 4]}, "rows [1, 4] (needs 1 and 16 among them)"),
        (H100, {"block": 16}, "block 16 (needs 32)"),
    ],
    ids=["another GPU", "another H100", "layers", "dtype", "rows", "block"],
)
def test_cached_steps_of_another_shape_or_gpu_are_refused_naming_it(gpu, changed, named):
    with pytest.raises(ValueError, match="--cached-steps s.json: ") as refused:
        projection.load_cached_steps(hand_static_steps(gpu, **changed), Path("s.json"), H100)
    assert named in str(refused.value)
    assert "python -m bench static-steps --device cuda --dtype bfloat16" in str(refused.value)
    projection.load_cached_steps(hand_static_steps(), Path("s.json"), H100)  # unchanged: taken


def test_cached_steps_without_dual_cells_are_refused_before_anything_is_written(tmp_path):
    run = hand_static_steps()
    for cells in run["repeats"]:
        cells.pop("dual/graphs/rows1/block0")
        cells.pop("dual/static/rows1/block0")
    (tmp_path / "gpu.json").write_text(json.dumps(hand_run()))
    (tmp_path / "steps.json").write_text(json.dumps(run))
    argv = ["--json", str(tmp_path / "gpu.json"), "--cached-steps", str(tmp_path / "steps.json")]
    argv += ["--data-dir", str(tmp_path), "--out", str(tmp_path / "B.md")]
    with pytest.raises(SystemExit, match="no cache=dual cells under cached_steps graphs or static"):
        projection.main(argv)
    assert not (tmp_path / "B.md").exists()
    with pytest.raises(SystemExit, match=r"--cached-steps .*nothing.json: no such file"):
        projection.main(argv[:3] + [str(tmp_path / "nothing.json")] + argv[4:])
    (tmp_path / "steps.json").write_text("{ not json")
    with pytest.raises(SystemExit, match=r"--cached-steps .*steps.json: not readable JSON"):
        projection.main(argv)


def test_the_section_names_where_the_dual_cells_come_from(tmp_path):
    run = hand_run()
    (tmp_path / "steps.json").write_text(json.dumps(hand_static_steps()))
    argv = ["--data-dir", str(REPO), "--json", str(projection.DEFAULT_BENCH)]
    args = projection.parse_args([*argv, "--cached-steps", str(tmp_path / "steps.json")])
    cached = projection._cached(args, run)
    none, _ = projection.load_models(run, Path("hand.json"))
    dual = DualModel(none, cached.full, cached.reuse, 512)
    nfe = {"single": 256, "majority": 640, "hex": 3200, "dvoting": 9}
    paper = {"T": projection.PaperRow("T", 256, nfe)}
    shapes = [TaskShape("T", "t", 256, (32, 480))]
    parts = (shapes, projection.projections(shapes, paper, none, dual), none, dual)
    text = "\n".join(projection.section(run, args, argv, parts, None, cached))
    assert "`--cached-steps` run under `cached_steps=graphs` (NVIDIA H100 80GB HBM3;" in text
    assert "medians of its 3 repeat(s); the reuse step is the mean of the block's replays" in text
    assert "- `dual`'s step times: `" in text and "(`cached_steps=graphs`): NVIDIA H100" in text
    assert f"| 1 | {1e3 * cached.full[1]:.1f} | {1e3 * cached.reuse[1]:.1f} |" in text
    assert "eager PyTorch for `none`, `cached_steps=graphs` for `dual` (another run)" in text
    plain = "\n".join(projection.section(run, args, argv, parts, None))
    assert "the caches part of the same run (eager PyTorch" in plain
    assert "eager PyTorch (no CUDA graphs, no compiled kernels)" in plain
    assert "- `dual`'s step times" not in plain
