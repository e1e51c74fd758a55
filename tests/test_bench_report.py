"""bench/report.py keeps the sections other commands wrote into BENCHMARKS.md."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import kept_sections  # noqa: E402


def test_a_rerun_keeps_the_caches_and_ablation_sections(tmp_path):
    """A rerun of bench/run.py rewrites BENCHMARKS.md but must keep the sections written by
    bench/caches_bench.py and the ablation tables (docs/ABLATIONS.md), markers included."""
    caches = "<!-- caches_bench:start -->\n## Key/value caches\nstep times\n<!-- caches_bench:end -->"
    ablations = "<!-- ablations:start -->\n## Ablations\nsee docs/ABLATIONS.md\n<!-- ablations:end -->"
    old = tmp_path / "BENCHMARKS.md"
    old.write_text(f"# Benchmarks\nold tables\n{caches}\nbetween\n{ablations}\ntrailing\n")
    kept = kept_sections(old)
    assert kept == f"\n{caches}\n\n{ablations}\n"
    assert kept_sections(tmp_path / "missing.md") == ""
