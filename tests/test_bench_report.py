"""bench/report.py keeps the sections other commands wrote into BENCHMARKS.md."""

from __future__ import annotations

from bench.report import kept_sections


def test_a_rerun_keeps_the_caches_and_ablation_sections(tmp_path):
    """A rerun of bench/run.py rewrites BENCHMARKS.md but must keep the sections written by
    bench/caches_bench.py and the ablation tables (docs/ABLATIONS.md), markers included."""
    caches = (
        "<!-- caches_bench:start -->\n## Key/value caches\nstep times\n<!-- caches_bench:end -->"
    )
    ablations = (
        "<!-- ablations:start -->\n## Ablations\nsee docs/ABLATIONS.md\n<!-- ablations:end -->"
    )
    old = tmp_path / "BENCHMARKS.md"
    temporal = "<!-- temporal_bench:start -->\n## temporal vs single\n<!-- temporal_bench:end -->"
    old.write_text(
        f"# Benchmarks\nold tables\n{caches}\nbetween\n{ablations}\n{temporal}\ntrailing\n"
    )
    kept = kept_sections(old)
    assert kept == f"\n{caches}\n\n{ablations}\n\n{temporal}\n"
    assert kept_sections(tmp_path / "missing.md") == ""


def test_the_temporal_bench_writes_its_section_and_checks_that_temporal_decodes_as_single(tmp_path):
    """A smoke run of bench/temporal_bench.py on the demo: its own section replaced in place,
    the rest of the file kept, and the check that temporal made single's passes and tokens."""
    from bench import temporal_bench

    out = tmp_path / "BENCHMARKS.md"
    out.write_text(
        "# Benchmarks\nabove\n<!-- temporal_bench:start -->\nold\n<!-- temporal_bench:end "
        "-->\nbelow\n"
    )
    assert (
        temporal_bench.main(
            [
                "--quick",
                "--skip-real",
                "--models",
                "tiny-arith",
                "--out",
                str(out),
                "--json",
                str(tmp_path / "t.json"),
            ]
        )
        == 0
    )
    text = out.read_text()
    assert text.startswith("# Benchmarks\nabove\n<!-- temporal_bench:start -->") and text.endswith(
        "<!-- temporal_bench:end -->\nbelow\n"
    )
    assert "old" not in text and "identical NFE and tokens in every run: yes" in text
    assert "| tiny-arith | temporal | 2 |" in text
