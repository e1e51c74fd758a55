"""bench/gpu_session.sh on the CPU (SMOKE=1): the parts PARTS names run in its order under
their own limits, a part with too little of TOTAL left is skipped and says so, and every log
comes back in one archive (the device tool returns at most 8 files)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _session(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "out"
    full = {**os.environ, "SMOKE": "1", "OUT": str(out), "PY": sys.executable, **env}
    full["WORK"] = str(tmp_path / "work")
    return subprocess.run(
        ["bash", "bench/gpu_session.sh"], cwd=ROOT, env=full, capture_output=True, text=True
    )


def _archived(tmp_path: Path) -> set[str]:
    with tarfile.open(tmp_path / "out" / "gpu_session.tgz") as archive:
        return {Path(name).name for name in archive.getnames()}


def test_a_part_given_seconds_runs_under_them_and_its_files_are_archived(tmp_path):
    done = _session(tmp_path, PARTS="experts:45", TOTAL="200")
    assert done.returncode == 0, done.stderr
    assert "== experts (" in done.stdout and "at most 45 s)" in done.stdout
    assert {"experts.log", "experts.md", "gpu.txt"} <= _archived(tmp_path)
    assert "exit status 0" in (tmp_path / "work" / "experts.log").read_text()


def test_parts_left_with_too_little_time_are_skipped_and_said(tmp_path):
    done = _session(tmp_path, PARTS="refill experts:5", TOTAL="10")
    assert done.returncode == 0, done.stderr
    for name in ("refill", "experts"):
        assert f"== {name} skipped: " in done.stdout
        assert "left of TOTAL=10" in (tmp_path / "work" / f"{name}.log").read_text()
    assert {"refill.log", "experts.log"} <= _archived(tmp_path)


def test_an_unknown_part_is_refused_naming_it_and_the_parts_there_are(tmp_path):
    done = _session(tmp_path, PARTS="static_steps")
    assert done.returncode == 2
    assert "== static_steps: no such part" in done.stdout
    assert "static_steps_bf16" in done.stdout and "fastdllm16" in done.stdout
