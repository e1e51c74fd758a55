"""bench/decode_modes.py: a tiny run on the CPU decodes every cell under `dynamic` and
`static` with the same tokens; the table marks a changed or unrepeatable answer; a GPU
run's section names the GPU and lists its graphs column and warm-up decodes."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from bench import decode_modes

TINY = "--tiny --prompt-length 16 --gen-length 16 --block 8 --rows 1 2 --repeats 1 --device cpu"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("decode_modes")
    out, json_path = folder / "B.md", folder / "d.json"
    assert decode_modes.main([*TINY.split(), "--json", str(json_path), "--out", str(out)]) == 0
    return json.loads(json_path.read_text()), out.read_text()


def _rows(lines: list[str]) -> list[str]:
    """The table's rows (one per rows x schedule x cache)."""
    return [line for line in lines if line.startswith(("| 1 |", "| 2 |"))]


def test_every_cell_ran_in_both_modes_with_dynamics_tokens(run):
    results, text = run
    assert [(c["rows"], c["schedule"], c["cache"], c["mode"]) for c in results["cells"]] == [
        (rows, schedule, cache, mode)
        for rows in (1, 2)
        for schedule in ("threshold", "fixed")
        for cache in ("prefix", "dual")
        for mode in ("dynamic", "static")
    ]
    rows = _rows(text.splitlines())
    groups = [[s, c] for s in ("threshold", "fixed") for c in ("prefix", "dual")]
    assert [r.split(" | ")[1:3] for r in rows] == 2 * groups
    assert all(r.endswith("| yes |") for r in rows)
    fixed = [c for c in results["cells"] if c["schedule"] == "fixed"]
    assert all(c["nfe"] == 16 for c in fixed)  # one token a step over the 16-token answer
    assert "| rows | schedule | cache | dynamic s | static s | fastest |" in text


def test_a_changed_or_unrepeatable_answer_shows(run):
    results, _ = run
    changed = copy.deepcopy(results)
    changed["cells"][1]["tokens"][0][3] += 1  # 1 row, threshold, prefix, static
    assert _rows(decode_modes.table(changed))[0].endswith("| NO |")
    unrepeatable = copy.deepcopy(results)
    unrepeatable["cells"][3]["repeatable"] = False  # 1 row, threshold, dual, static
    rows = _rows(decode_modes.table(unrepeatable))
    assert rows[0].endswith("| yes |") and rows[1].endswith("| NO |")


def test_the_fastest_mode_is_read_from_the_medians(run):
    results, _ = run
    timed = copy.deepcopy(results)
    for cell in timed["cells"]:
        cell["median_s"] = 1.0 if cell["mode"] == "dynamic" else 2.0
    assert all("| dynamic |" in row for row in _rows(decode_modes.table(timed)))
    timed["cells"][1]["median_s"] = 0.5  # static faster in the first group only
    rows = _rows(decode_modes.table(timed))
    assert "| static |" in rows[0] and "| dynamic |" in rows[1]


def test_a_gpu_runs_section_has_the_graphs_column_and_warm_ups(run):
    results, _ = run
    gpu = copy.deepcopy(results)
    gpu["meta"]["facts"]["gpu"] = "NVIDIA H200"
    gpu["args"]["device"] = "cuda"
    graphs = copy.deepcopy(gpu["cells"][1])
    graphs.update(mode="graphs", warm_up_s=1.25)
    gpu["cells"].insert(2, graphs)
    lines = decode_modes.section(gpu, "decode_modes_h200")
    assert lines[0] == "<!-- decode_modes_h200:start -->"
    assert lines[1].endswith("(`decode-modes`) on the NVIDIA H200, float32")
    assert any(
        line.startswith("| rows | schedule | cache | dynamic s | static s | graphs s |")
        for line in lines
    )
    assert "1 rows threshold prefix graphs 1.25 s" in "\n".join(lines)
    assert any("| not run |" in line for line in _rows(lines))  # the groups without graphs


def test_no_timed_decode_is_refused_first(capsys):
    with pytest.raises(SystemExit):
        decode_modes.main([*TINY.split(), "--repeats", "0"])
    assert "--repeats 0: give 1 or more" in capsys.readouterr().err


def test_a_refused_capture_is_said_and_the_run_goes_on(monkeypatch, tmp_path):
    real = decode_modes.measure_cell

    def refusing(model, prompts, cell, args):
        if cell[3] == "static" and cell[0] == 2:
            raise RuntimeError("cached_steps=graphs: capturing the reuse pass failed (x)")
        return real(model, prompts, cell, args)

    monkeypatch.setattr(decode_modes, "measure_cell", refusing)
    out, json_path = tmp_path / "B.md", tmp_path / "d.json"
    argv = [*TINY.split(), "--schedules", "fixed", "--caches", "dual"]
    argv += ["--json", str(json_path), "--out", str(out)]
    assert decode_modes.main(argv) == 0
    rows = _rows(out.read_text().splitlines())
    assert "| refused (a capture failed) |" in rows[1] and rows[1].endswith("| yes |")
    assert "refused" not in rows[0]

    def failing(model, prompts, cell, args):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(decode_modes, "measure_cell", failing)
    with pytest.raises(RuntimeError, match="out of memory"):
        decode_modes.main(argv)

    def out_of_memory_in_a_capture(model, prompts, cell, args):
        try:
            raise torch.OutOfMemoryError("CUDA out of memory")
        except torch.OutOfMemoryError as error:
            raise RuntimeError("cached_steps=graphs: capturing the reuse pass failed") from error

    monkeypatch.setattr(decode_modes, "measure_cell", out_of_memory_in_a_capture)
    with pytest.raises(RuntimeError, match="cached_steps=graphs"):  # not a refusal: it stops
        decode_modes.main(argv)


def test_each_cell_decodes_in_its_own_mode(monkeypatch, tmp_path):
    """`static` cells run the static buffers' reuse passes, `dynamic` cells none of them."""
    from lm_eval_dvoting.core.decoding.static_steps import StaticSteps

    passes, seen = [], {}
    real_run, real_decode = StaticSteps.run, decode_modes.timed_decode

    def counted_run(self, *args, **kwargs):
        passes.append(self.mode)
        return real_run(self, *args, **kwargs)

    def noted_decode(model, prompts, cache, kwargs):
        before = len(passes)
        result = real_decode(model, prompts, cache, kwargs)
        seen.setdefault(model.cached_steps, []).append(len(passes) - before)
        return result

    monkeypatch.setattr(StaticSteps, "run", counted_run)
    monkeypatch.setattr(decode_modes, "timed_decode", noted_decode)
    argv = ["--tiny", "--rows", "1", "--repeats", "1", "--schedules", "fixed", "--device", "cpu"]
    assert (
        decode_modes.main(
            [*argv, "--json", str(tmp_path / "d.json"), "--out", str(tmp_path / "B.md")]
        )
        == 0
    )
    assert set(seen) == {"dynamic", "static"}
    assert all(n == 0 for n in seen["dynamic"]) and all(n > 0 for n in seen["static"])


def test_none_is_a_cache_to_ask_for_and_not_a_default():
    """`--caches none` adds whole decodes without a cache (their full passes captured under
    `graphs` on a GPU); the default stays `prefix` and `dual`."""
    assert decode_modes.parse_args(["--tiny", "--device", "cpu"]).caches == ["prefix", "dual"]
    args = decode_modes.parse_args(["--tiny", "--device", "cpu", "--caches", "none"])
    assert {cache for _, _, cache, _ in decode_modes.cells(args)} == {"none"}


def test_refills_are_counted_per_decode_and_the_counters_leave(run):
    """The fixed schedule at one row refills once a block (2 blocks of 8: 2 refills over its
    14 reuse passes); `dynamic` fills no buffers; the counters are gone after each decode.
    (Planted: `_fill` not counted: failed.)"""
    from lm_eval_dvoting.core.decoding import static_steps

    results, text = run
    fixed = {c["mode"]: c for c in results["cells"] if c["rows"] == 1 and c["schedule"] == "fixed"}
    assert (fixed["static"]["refills"], fixed["static"]["reuse_passes"]) == (2, 14)
    assert fixed["dynamic"]["reuse_passes"] == fixed["dynamic"]["refills"] == 0
    assert "| static 2/14 | yes |" in text
    assert static_steps.StaticSteps.run.__name__ == "run" and static_steps._fill.__name__ == "_fill"
