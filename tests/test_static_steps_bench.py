"""bench/static_steps_bench.py: a tiny run on the CPU reports every cell, each mode's tokens
against `dynamic`'s (a changed token shows as NO), and the ratios from the step times."""

from __future__ import annotations

import argparse
import copy
import json

import pytest

from bench import static_steps_bench

TINY = "--layers 1 --width 64 --heads 4 --prompt-length 16 --gen-length 16 --block 4"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("static_steps")
    out, json_path = folder / "B.md", folder / "s.json"
    argv = TINY.split() + ["--rows", "1", "2", "--repeats", "1"]
    assert static_steps_bench.main(argv + ["--json", str(json_path), "--out", str(out)]) == 0
    return json.loads(json_path.read_text()), out.read_text()


def test_a_tiny_run_reports_every_cell_with_dynamics_tokens(run):
    results, text = run
    rows = [
        line for line in text.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")
    ]
    # per rows count: none, then prefix and dual in dynamic and static (no graphs on the CPU)
    assert [r.split(" | ")[1:3] for r in rows] == 2 * (
        [["none", "dynamic"]]
        + [[cache, mode] for cache in ("prefix", "dual") for mode in ("dynamic", "static")]
    )
    assert all(r.endswith("| yes |") for r in rows)
    assert all(len(cell["steps"]) == 4 for cell in results["repeats"][0].values())


def test_a_changed_token_and_the_ratios_come_from_the_results(run):
    results, _ = run
    cells = results["repeats"][0]
    cells["dual/static/rows2/block3"]["tokens"][1][0] += 1
    for key in cells:  # none 8 ms a step, every other cell 2 ms: none/cell = 4
        cells[key]["steps"] = [0.008 if key.startswith("none/") else 0.002] * 4
    lines = static_steps_bench.table(results)
    assert "| 2 | dual | static | 2.0 / 2.0 | 2.0 / 2.0 | 4.00x | NO |" in lines
    assert "| 2 | dual | dynamic | 2.0 / 2.0 | 2.0 / 2.0 | 4.00x | yes |" in lines


def test_the_gpu_peaks_are_listed_when_recorded(run):
    results, _ = run
    assert static_steps_bench.peak_lines(results) == []  # the CPU records none
    for key, cell in results["repeats"][0].items():
        cell["group_peak_gib"] = 3.0 if "/rows2/" in key else 1.5
    (line,) = static_steps_bench.peak_lines(results)[1:]
    assert "rows1/block0 1.5 GiB" in line and "rows2/block3 3.0 GiB" in line


def test_a_cell_that_raises_is_left_out_and_said_and_the_others_go_on(tmp_path, monkeypatch):
    """A cell whose step raises (on a GPU: `cached_steps=graphs` refusing a capture) stops;
    the other cells of its group run their block, and the report leaves it out of the table
    and says why. (Planted: the error not caught: the run stopped.)"""
    step = static_steps_bench._step

    def refusing(decoder, device):
        steps = decoder.forward.static_steps
        if steps is not None and len(decoder.active) == 2:
            raise RuntimeError("cached_steps=graphs: capturing the reuse pass failed (test)")
        return step(decoder, device)

    monkeypatch.setattr(static_steps_bench, "_step", refusing)
    json_path, out = tmp_path / "s.json", tmp_path / "B.md"
    argv = TINY.split() + ["--rows", "1", "2", "--repeats", "1", "--json", str(json_path)]
    assert static_steps_bench.main(argv + ["--out", str(out)]) == 0
    cells = json.loads(json_path.read_text())["repeats"][0]
    stopped = sorted(key for key, cell in cells.items() if "refused" in cell)
    assert stopped == [f"{c}/static/rows2/block{b}" for c in ("dual", "prefix") for b in (0, 3)]
    assert all(len(cells[key]["steps"]) == 4 for key in cells if key not in stopped)
    text = out.read_text()
    assert "| 2 | dual | static |" not in text and "| 2 | dual | dynamic |" in text
    assert "- refused, dual/static/rows2/block0: cached_steps=graphs: capturing" in text


def test_the_graphs_a_cell_held_are_listed(run):
    results, _ = run
    cells = copy.deepcopy(results)
    assert static_steps_bench.graph_lines(cells) == []  # no graphs mode on the CPU
    cell = cells["repeats"][0]["dual/static/rows1/block0"]
    cell.update(graphs=1, steps=[0.010, 0.003, 0.120, 0.002])
    (line,) = static_steps_bench.graph_lines(cells)[1:]
    assert line.startswith("CUDA graphs held at the block's end, and the step that captured")
    assert line.endswith("first repeat: dual/static/rows1/block0 1 (capture step 120 ms).")
    cells["repeats"][0]["prefix/static/rows2/block0"]["graphs"] = 0  # over the query limit
    lines = static_steps_bench.graph_lines(cells)
    assert "prefix/static/rows2/block0" not in lines[1]
    assert lines[3].startswith("Cells that captured nothing (a pass over more than")
    assert lines[3].endswith(": prefix/static/rows2/block0.")


def test_a_graphs_cell_reads_its_replays_as_a_later_block_of_a_decode(run):
    """A `graphs` cell's first reuse step ran eagerly and its second captured: its reuse
    step is the mean of the replays after them, its step over a block the full step and
    those replays; the other modes read every later step. (Planted: steps[1:] for graphs.)"""
    results = copy.deepcopy(run[0])
    results["repeats"] = [results["repeats"][0]]
    cells = results["repeats"][0]
    for key in [k for k in cells if "/static/" in k]:  # a graphs twin of each static cell
        cells[key.replace("/static/", "/graphs/")] = copy.deepcopy(cells[key])
    for key, cell in cells.items():  # 4 steps: full 10 ms, eager 6, capture 90, replay 2
        cell["steps"] = [0.010, 0.006, 0.090, 0.002]
    figures = static_steps_bench.cell_figures(results)
    graphs, static = figures["dual/graphs/rows1/block0"], figures["dual/static/rows1/block0"]
    assert graphs["reuse"] == pytest.approx(2.0) and graphs["block"] == pytest.approx(4.0)
    assert static["reuse"] == pytest.approx(98 / 3) and static["block"] == pytest.approx(27.0)


def test_an_error_that_is_not_a_refused_capture_stops_the_run(tmp_path, monkeypatch):
    """Only a refused capture is a cell's to report; anything else (out of memory, a bug)
    stops the run with its own error. (Planted: every RuntimeError caught: failed.)"""

    def out_of_memory(decoder, device):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(static_steps_bench, "_step", out_of_memory)
    argv = TINY.split() + ["--rows", "1", "--repeats", "1", "--json", str(tmp_path / "s.json")]
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        static_steps_bench.main(argv + ["--out", str(tmp_path / "B.md")])


def test_a_gpu_runs_section_names_the_gpu_and_goes_beside_the_cpu_one(run, tmp_path):
    results, text = run
    assert text.splitlines()[1] == "## Static-shape cached steps and CUDA graphs (`cached_steps`)"
    gpu_run = copy.deepcopy(results)
    gpu_run["meta"]["facts"]["gpu"] = "NVIDIA H200"
    gpu_run["args"]["dtype"] = "bfloat16"
    json_path, out = tmp_path / "gpu.json", tmp_path / "B.md"
    json_path.write_text(json.dumps(gpu_run))
    out.write_text(text)
    argv = ["--report-only", "--json", str(json_path), "--out", str(out)]
    assert static_steps_bench.main([*argv, "--section", "static_steps_h200"]) == 0
    both = out.read_text()
    assert both.startswith(text)  # the CPU run's section kept as it was
    gpu_section = both[len(text) :]
    assert gpu_section.lstrip().startswith("<!-- static_steps_h200:start -->\n## Static-shape")
    assert "(`cached_steps`) on the NVIDIA H200, bfloat16\n" in gpu_section
    assert gpu_section.rstrip().endswith("<!-- static_steps_h200:end -->")


def test_a_compiled_cell_is_read_as_a_graphs_cell_and_its_tokens_compared(run):
    """`compiled` captures as `graphs` does (its capture step also compiles): its reuse
    step is the mean of its replays, and its tokens are compared with `dynamic`'s (inductor
    rounds otherwise: a NO is what the column is for). (Planted: `mode == "graphs"` in
    `reuse_steps`: failed.)"""
    results = copy.deepcopy(run[0])
    results["repeats"] = [results["repeats"][0]]
    cells = results["repeats"][0]
    for key in [k for k in cells if "/static/" in k]:
        cells[key.replace("/static/", "/compiled/")] = copy.deepcopy(cells[key])
    for cell in cells.values():  # full 10 ms, eager 6, capture and compile 900, replay 2
        cell["steps"] = [0.010, 0.006, 0.900, 0.002]
    cells["dual/compiled/rows2/block3"]["tokens"][0][0] += 1
    figures = static_steps_bench.cell_figures(results)
    compiled = figures["dual/compiled/rows1/block0"]
    assert compiled["reuse"] == pytest.approx(2.0) and compiled["block"] == pytest.approx(4.0)
    assert compiled["same"] and figures["dual/compiled/rows2/block0"]["same"]
    assert not figures["dual/compiled/rows2/block3"]["same"]


def test_none_runs_under_the_modes_that_capture_and_reads_its_replays(run):
    """`cache=none` gets a cell under `graphs` and `compiled` (its full passes replayed),
    none under `static` (no buffers to keep); such a cell's step over a block is its
    replays' mean at every step: a decode replays every pass after its first two."""
    cuda = argparse.Namespace(
        device="cuda", modes=["graphs", "compiled"], rows=[1], gen_length=16, block=4
    )
    nones = [cell for cell in static_steps_bench.cells(cuda) if cell[0] == "none"]
    assert [mode for _, mode, _, block in nones if block == 0] == ["dynamic", "graphs", "compiled"]
    cuda.caches = ["dual"]  # --caches: the cached cells asked for; `none` always
    assert {cache for cache, *_ in static_steps_bench.cells(cuda)} == {"none", "dual"}
    steps = [0.010, 0.009, 0.090, 0.004, 0.002]
    assert static_steps_bench.block_steps(steps, "graphs", "none") == [0.003] * 5
    assert static_steps_bench.block_steps(steps, "graphs", "dual")[0] == 0.010
    assert static_steps_bench.block_steps(steps, "static", "none") == steps


def test_a_block_too_short_for_a_replay_is_refused_before_any_model_work(capsys, monkeypatch):
    monkeypatch.setattr(static_steps_bench, "run", lambda *a: pytest.fail("model work began"))
    argv = TINY.replace("--block 4", "--block 3").split() + ["--device", "cuda:0"]
    with pytest.raises(SystemExit):
        static_steps_bench.main(argv + ["--modes", "graphs"])
    err = capsys.readouterr().err
    assert "--block 3: under graphs a cell's first 3 steps run eagerly or capture" in err


def test_a_run_stopped_mid_repeat_keeps_the_steps_it_took(tmp_path, monkeypatch):
    """A run stopped inside its first repeat (on a GPU: a part's time limit, during a long
    compilation) has saved every round of steps so far under `partial_repeat`; no section
    is written from it, and the refusal says where the steps are. (Planted: no progress
    callback: failed.)"""
    step = static_steps_bench._step
    taken = []

    def stops_in_the_second_round(decoder, device):  # (5 cells a round on the CPU)
        if len(taken) == 6:
            raise RuntimeError("CUDA out of memory (a stand-in for the part's time limit)")
        taken.append(1)
        return step(decoder, device)

    monkeypatch.setattr(static_steps_bench, "_step", stops_in_the_second_round)
    json_path, out = tmp_path / "s.json", tmp_path / "B.md"
    argv = TINY.split() + ["--rows", "1", "--repeats", "1", "--json", str(json_path)]
    with pytest.raises(RuntimeError, match="out of memory"):
        static_steps_bench.main(argv + ["--out", str(out)])
    saved = json.loads(json_path.read_text())
    assert saved["repeats"] == []
    steps = {key: cell["steps"] for key, cell in saved["partial_repeat"].items()}
    assert len(steps) == 5 and all(len(s) == 1 for s in steps.values())  # round 1, whole
    with pytest.raises(SystemExit, match="the steps it took are under `partial_repeat`"):
        static_steps_bench.main(["--report-only", "--json", str(json_path), "--out", str(out)])
