"""bench/gpu_session.sh on the CPU (SMOKE=1): the parts PARTS names run in its order under
their own limits, a part with too little of TOTAL left is skipped and says so, and every log
comes back in one archive (the device tool returns at most 8 files)."""

from __future__ import annotations

import os
import re
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


def test_parts_run_under_their_seconds_or_what_is_left_of_total(tmp_path):
    # PY=false: each part's command fails at once, which is all the limits need
    done = _session(tmp_path, PY="false", PARTS="experts:45 refill:500", TOTAL="300")
    assert done.returncode == 0, done.stderr
    assert re.search(r"== experts \(\S+, at most 45 s\)", done.stdout)
    refill = re.search(r"== refill \(\S+, at most (\d+) s\)", done.stdout)
    assert refill and 280 < int(refill.group(1)) <= 300  # 500 cut to what was left
    assert "exit status 1" in (tmp_path / "work" / "refill.log").read_text()
    assert {"experts.log", "refill.log", "gpu.txt"} <= _archived(tmp_path)


def test_a_parts_json_reaches_out_when_the_part_ends(tmp_path):
    done = _session(tmp_path, PARTS="step_profile")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "step_profile.json").is_file()
    assert {"step_profile.log", "step_profile.json", "step_profile.md"} <= _archived(tmp_path)


def test_parts_left_with_too_little_time_are_skipped_and_said(tmp_path):
    done = _session(tmp_path, PARTS="refill experts:5", TOTAL="10")
    assert done.returncode == 0, done.stderr
    for name in ("refill", "experts"):
        assert f"== {name} skipped: " in done.stdout
        assert "left of TOTAL=10" in (tmp_path / "work" / f"{name}.log").read_text()
    assert {"refill.log", "experts.log"} <= _archived(tmp_path)


def test_an_unknown_part_or_a_bad_limit_is_refused_before_any_part_runs(tmp_path):
    done = _session(tmp_path, PARTS="experts static_steps")
    assert done.returncode == 2
    assert "PARTS: no part named 'static_steps'" in done.stdout
    assert "static_steps_bf16" in done.stdout and "fastdllm16" in done.stdout
    assert "== experts" not in done.stdout  # the part before it did not run
    for bad in ("experts:0", "experts:ten", "experts:"):
        done = _session(tmp_path, PARTS=bad)
        assert done.returncode == 2
        assert f"PARTS: '{bad}': give NAME:SECONDS" in done.stdout
