"""bench/gpu_bench.py: its BENCHMARKS.md section is rewritten from the committed GPU run's JSON
exactly, a part that failed on the GPU says so, and a run without CUDA is refused up front."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import gpu_bench

REPO = Path(__file__).resolve().parents[1]

RUN = REPO / "bench" / "results" / "gpu_bench_h200.json"
RUNS = [
    (RUN, gpu_bench.SECTION),
    (REPO / "bench" / "results" / "gpu_bench_h100.json", "gpu_bench_h100"),
]  # (JSON, section)


def _section(text: str, name: str) -> str:
    start, end = gpu_bench.markers(name)
    return start + text.split(start, 1)[1].split(end, 1)[0] + end


@pytest.mark.parametrize("run, name", RUNS, ids=["h200", "h100"])
def test_the_section_in_benchmarks_md_is_what_the_committed_run_renders(tmp_path, run, name):
    start, end = gpu_bench.markers(name)
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(f"# Benchmarks\nabove\n{start}\nold\n{end}\nbelow\n")
    assert (
        gpu_bench.main(["--report-only", "--json", str(run), "--out", str(out), "--section", name])
        == 0
    )
    text = out.read_text()
    assert text.startswith("# Benchmarks\nabove\n") and text.endswith(f"{end}\nbelow\n")
    assert _section(text, name) == _section((REPO / "BENCHMARKS.md").read_text(), name)
    assert "| 16 x 64 |" in text and "**16 row(s).**" in text and "| dvoting | 16 | 16 |" in text
    gpu = json.loads(run.read_text())["facts"]["gpu"].split()[1]  # "NVIDIA H100 80GB HBM3": H100
    assert f"one GPU kind (the {gpu})" in text
    assert ("## GPU: LLaDA-8B's full shape in bfloat16\n" in text) == (name == gpu_bench.SECTION)


def test_the_reading_is_computed_from_the_run(tmp_path):
    results = json.loads(RUN.read_text())
    results["forward"]["1x64"] = 99.0
    results["invariance"]["cuda/float32/dvoting/16"]["digests"][0] = "changed"
    text = "\n".join(gpu_bench.section(results))
    assert "a pass over 64 tokens costs 99.0 ms" in text
    assert "**The demo model on the GPU:** 1 of 300 question-runs changed" in text


def test_a_part_that_failed_on_the_gpu_is_reported_as_failed():
    results = json.loads(RUN.read_text())
    results["caches"] = {
        "error": "Traceback (most recent call last):\n  ...\nRuntimeError: CUDA out of memory"
    }
    del results["strategies"], results["facts"]["gpu"]  # a smoke run on the CPU records no GPU
    text = "\n".join(gpu_bench.section(results))
    assert "Failed on the GPU: `RuntimeError: CUDA out of memory`" in text
    assert (
        "### Strategies at the real shape (prompt 32, generation 32, block 2; one "
        "repeat)\n\nNot run." in text
    )
    assert "**Caches at" not in text and "**Batch 16 against batch 1**" not in text


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="the refusal is for machines without CUDA"
)
def test_asking_for_cuda_without_one_is_refused_before_any_model_work(tmp_path):
    with pytest.raises(
        SystemExit, match="--device cuda: no CUDA device is visible here; use --device cpu"
    ):
        gpu_bench.main(["--json", str(tmp_path / "g.json")])
    assert not (tmp_path / "g.json").exists()
