"""bench/ as one tool: `python -m bench SUITE` dispatches to every suite, the shared pieces in
bench/common.py behave as each suite relied on, and the docs name only suites that exist."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import common, report, run
from bench.__main__ import SUITES
from bench.__main__ import main as bench_main

REPO = Path(__file__).resolve().parents[1]
H100_RUN = REPO / "bench" / "results" / "gpu_bench_h100.json"


def test_help_lists_every_suite_and_an_unknown_suite_is_refused_with_the_choices(capsys):
    assert bench_main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert all(f"  {name} " in listed for name in SUITES)
    with pytest.raises(SystemExit, match="unknown suite 'gpu_bench'; choose one of throughput, "):
        bench_main(["gpu_bench"])


@pytest.mark.parametrize("suite", list(SUITES))
def test_every_suite_module_has_a_main_that_takes_the_remaining_arguments(suite):
    module = importlib.import_module(SUITES[suite][0])
    assert list(module.main.__code__.co_varnames[:1]) == ["argv"]


def test_the_suite_gets_the_arguments_after_its_name(tmp_path):
    """`python -m bench gpu --report-only ...` renders the committed H100 run as the test of
    bench/gpu_bench.py does: the flags reached the suite."""
    out = tmp_path / "B.md"
    argv = ["--report-only", "--json", str(H100_RUN), "--out", str(out)]
    assert bench_main(["gpu", *argv, "--section", "gpu_bench_h100"]) == 0
    assert out.read_text().startswith("<!-- gpu_bench_h100:start -->\n## GPU: LLaDA-8B's full")


def test_python_dash_m_bench_runs_from_the_repository_root():
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0 and "batch-invariance" in done.stdout


def test_no_module_puts_itself_on_sys_path():
    """bench is a package run with -m: no file of bench/ or of the tests edits sys.path."""
    files = [*(REPO / "bench").glob("*.py"), *(REPO / "tests").glob("test_*bench*.py")]
    needle = "sys.path" + ".insert"  # spelled apart, so that this file does not match itself
    assert [f.name for f in files if needle in f.read_text()] == []


def test_write_section_replaces_its_own_markers_only_and_appends_when_absent(tmp_path):
    start, end = common.markers("x_bench")
    path = tmp_path / "B.md"
    path.write_text(f"# B\nabove\n{start}\nold\n{end}\nbelow\n")
    common.write_section(path, [start, "new", end], start, end)
    assert path.read_text() == f"# B\nabove\n{start}\nnew\n{end}\nbelow\n"
    other = common.markers("y_bench")
    common.write_section(path, [other[0], "y", other[1]], *other)
    assert path.read_text().endswith(f"{end}\nbelow\n\n{other[0]}\ny\n{other[1]}\n")


def test_a_rerun_of_throughput_keeps_the_gpu_sections(tmp_path):
    """BENCHMARKS.md's two GPU sections come from lent machines: a CPU rerun must keep them."""
    path = tmp_path / "B.md"
    h200, h100 = (common.markers(n) for n in ("gpu_bench", "gpu_bench_h100"))
    path.write_text(f"# B\nold\n{h200[0]}\nA\n{h200[1]}\n{h100[0]}\nB\n{h100[1]}\n")
    assert report.kept_sections(path) == f"\n{h200[0]}\nA\n{h200[1]}\n\n{h100[0]}\nB\n{h100[1]}\n"


def test_throughput_refuses_rfg_before_any_model_work(capsys):
    with pytest.raises(SystemExit):
        run.parse_args(["--strategies", "single", "rfg"])
    assert "invalid choice: 'rfg'" in capsys.readouterr().err
    assert run.parse_args([]).strategies == ["single", "majority", "hex", "dvoting"]


@pytest.mark.parametrize("suite", ["throughput", "caches", "moe", "temporal", "batch-invariance"])
def test_a_suite_keeps_its_raw_numbers_under_bench_results_by_default(suite):
    args = importlib.import_module(SUITES[suite][0]).parse_args([])
    assert args.json.parent == REPO / "bench" / "results"


def test_a_cpu_suite_records_the_command_that_reruns_it():
    from bench import caches_bench

    args = caches_bench.parse_args(["--quick"])
    record = caches_bench.start_results(args, ["--quick"])
    assert record["meta"]["command"] == "OMP_NUM_THREADS=1 .venv/bin/python -m bench caches --quick"
    assert record["args"]["json"] == str(REPO / "bench" / "results" / "caches_bench.json")


def test_the_docs_run_only_suites_that_exist():
    """README.md and docs/ run the benchmarks as `python -m bench SUITE`, never a script."""
    texts = [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    text = "\n".join(p.read_text() for p in texts)
    assert not re.findall(r"python3? bench/\w+\.py", text)
    named = set(re.findall(r"python3? -m bench ([a-z][\w-]*)", text))  # not --help, SUITE
    assert named and named <= set(SUITES)


def test_host_reads_refuses_a_package_folder_without_the_package(tmp_path):
    """`--package` names a checkout to count another commit's decoder; a folder without the
    package is refused before anything is imported or loaded."""
    from bench import host_reads_bench

    with pytest.raises(SystemExit, match=r"--package .*: no lm_eval_dvoting/ package there"):
        host_reads_bench.main(["--package", str(tmp_path)])


def test_refill_counts_the_operators_of_one_refill_and_refuses_bad_repeats(capsys):
    """A refill's operators grow with the rows, not with rows x layers (32 here): a few a
    row; the dynamic path's stack likewise. (Planted: the old per-row-and-layer fill: failed
    with 263 at one row; the old per-layer stack: failed with 267.)"""
    from bench import refill_bench

    one, _, stacked_one = refill_bench.measure(1, 2, 8, repeats=1)
    sixteen, _, stacked = refill_bench.measure(16, 2, 8, repeats=1)
    assert one < refill_bench.LAYERS and sixteen < 16 * 10
    assert stacked_one < refill_bench.LAYERS and stacked < 16 * 10  # the dynamic stack too
    with pytest.raises(SystemExit):
        refill_bench.main(["--repeats", "0"])
    assert "--repeats must be at least 1, got 0" in capsys.readouterr().err


def test_experts_counts_a_fixed_number_of_operators_and_no_read_for_the_grouped_gemms(capsys):
    """The grouped GEMMs run the same operators however many experts are hit and read
    nothing on the host; the loop over experts runs a few per expert hit and reads the counts
    once; both give the same bits on the CPU. (Planted: the counts read in the grouped path:
    failed with 1 read.)"""
    from bench import experts_bench

    experts = experts_bench.random_experts(experts_bench.QUICK, "cpu", torch.float32)
    few = experts_bench.step_input(experts_bench.QUICK, 2, "cpu", torch.float32)
    many = experts_bench.step_input(experts_bench.QUICK, 40, "cpu", torch.float32)
    cells = [experts_bench.measure(experts, inputs, 1, "cpu") for inputs in (few, many)]
    assert cells[0]["hit"] < cells[1]["hit"] == experts_bench.QUICK["experts"]
    assert cells[0]["operators"]["grouped"] == cells[1]["operators"]["grouped"]
    assert cells[1]["operators"]["loop"] > cells[0]["operators"]["loop"] + 5
    assert all(c["reads"] == {"grouped": 0, "loop": 1} and c["gap"] == 0 for c in cells)
    assert experts_bench.main(["--quick", "--repeats", "1"]) == 0
    assert "| 16 x 32 | 8 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        experts_bench.main(["--repeats", "0"])
    assert "--repeats must be at least 1, got 0" in capsys.readouterr().err


def test_a_device_suite_writes_its_table_with_the_command_and_machine(tmp_path, capsys):
    """`--out` (a lent GPU's $OUT/experts.md): the printed table, with the command that made
    it and the machine (on a GPU its name), so the file says what it measured."""
    from bench import experts_bench

    out = tmp_path / "experts.md"
    assert experts_bench.main(["--quick", "--repeats", "1", "--out", str(out)]) == 0
    printed, text = capsys.readouterr().out, out.read_text()
    assert text.startswith("Written by `.venv/bin/python -m bench experts --quick --repeats 1")
    assert "- cpu: " in text and "- torch: " in text
    table = [line for line in printed.splitlines() if line.startswith("|")]
    assert table and all(line in text.splitlines() for line in table)


def test_experts_measures_an_older_package_by_its_loop_alone(monkeypatch):
    """`--package` of a commit before the grouped GEMMs (no `grouped_applies`): the cell
    holds its loop's figures only, and the table leaves the grouped columns empty."""
    from types import SimpleNamespace

    import lm_eval_dvoting.models
    from bench import experts_bench

    experts = experts_bench.random_experts(experts_bench.QUICK, "cpu", torch.float32)
    inputs = experts_bench.step_input(experts_bench.QUICK, 4, "cpu", torch.float32)
    monkeypatch.setattr(lm_eval_dvoting.models, "moe", SimpleNamespace())  # as found before
    cell = experts_bench.measure(experts, inputs, 1, "cpu")
    assert set(cell["ms"]) == {"loop"} and "gap" not in cell
    row = experts_bench.table({(1, 4): cell}, "cpu", 1)[-1]
    assert row.startswith(f"| 1 x 4 | {cell['hit']} | - / {cell['operators']['loop']} | - / ")


def test_digests_are_stable_and_tell_a_moved_token(monkeypatch, capsys, tmp_path):
    """The same decodes give the same digest; one more token committed a step (planted in
    block diffusion's fall-back) gives another; the CLI prints a line a group and writes the
    decodes with --json."""
    from bench import digests_bench
    from lm_eval_dvoting.core.decoding import blocks

    first = digests_bench.run_group("llada2", quick=True)
    assert first == digests_bench.run_group("llada2", quick=True)
    assert len(first["decodes"]) == 4
    unmasked = blocks.unmasked
    monkeypatch.setattr(blocks, "unmasked", lambda m, c, t, q: unmasked(m, c, t, q + 1))
    assert digests_bench.run_group("llada2", quick=True)["sha256"] != first["sha256"]
    monkeypatch.undo()
    digests_bench.main(["--quick", "--groups", "llada2", "--json", str(tmp_path / "d.json")])
    assert f"llada2: 4 decodes, sha256 {first['sha256']}" in capsys.readouterr().out
    assert json.loads((tmp_path / "d.json").read_text())["llada2"] == first


def test_cuda_devices_are_recognised_with_an_index_too():
    from bench.common import is_cuda

    assert is_cuda("cuda") and is_cuda("cuda:0") and is_cuda(torch.device("cuda", 1))
    assert not is_cuda("cpu") and not is_cuda("meta")


def test_modes_default_by_device_dynamic_first_and_cuda_only_ones_refused_elsewhere():
    """`--modes` (static-steps, decode-modes): the device's default; `dynamic` always, first
    (the others' tokens are compared with its); graphs or compiled off CUDA refused, with
    the flag's words, before any model work."""
    from bench.common import step_modes

    assert step_modes({"device": "cpu"}) == ["dynamic", "static"]
    assert step_modes({"device": "cuda:0", "modes": None}) == ["dynamic", "static", "graphs"]
    asked = {"device": "cuda", "modes": ["compiled", "graphs"]}
    assert step_modes(asked) == ["dynamic", "graphs", "compiled"]
    with pytest.raises(SystemExit, match="--modes compiled needs a CUDA device, got --device cpu"):
        step_modes({"device": "cpu", "modes": ["static", "compiled"]})


@pytest.mark.parametrize("suite", ["static-steps", "decode-modes"])
def test_a_cuda_mode_on_the_cpu_is_refused_before_any_model_work(suite, tmp_path, monkeypatch):
    from bench import decode_modes, static_steps_bench

    module = {"static-steps": static_steps_bench, "decode-modes": decode_modes}[suite]
    monkeypatch.setattr(module, "run", lambda *a: pytest.fail("the model work started"))
    argv = ["--device", "cpu", "--modes", "graphs", "--json", str(tmp_path / "r.json")]
    with pytest.raises(SystemExit, match="--modes graphs needs a CUDA device"):
        module.main(argv + ["--out", str(tmp_path / "B.md")])


def test_a_refused_capture_is_told_from_out_of_memory_anywhere_in_its_causes():
    """A suite goes on past a refused capture, and stops on out of memory even when a
    capture wraps a compilation that wraps it. (Planted: only the first cause looked at.)"""
    from bench.common import refused_capture

    def chained(*messages: str) -> BaseException:
        error = None
        for message in reversed(messages):  # the last is the root cause
            outer = RuntimeError(message)
            outer.__cause__ = error
            error = outer
        return error

    assert refused_capture(chained("cached_steps=graphs: capturing the reuse pass failed (x)"))
    assert refused_capture(chained("cached_steps=compiled: capturing", "torch.compile could not"))
    oom = chained("cached_steps=compiled: capturing", "compile failed", "CUDA out of memory.")
    assert not refused_capture(oom)
    assert not refused_capture(RuntimeError("CUDA out of memory"))
    assert not refused_capture(RuntimeError("an index out of range"))
