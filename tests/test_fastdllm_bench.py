"""bench/fastdllm_bench.py without Fast-dLLM's code: the export of a mirror (a small git repo
made here stands in for it), the refusals of a missing mirror or a changed file, the cells'
settings, the token comparison and the report from a small JSON."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from bench import fastdllm_bench as fd

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")


def _fake_mirror(root: Path) -> Path:
    """A git repo holding every exported path (a stand-in for Fast-dLLM's mirror)."""
    root.mkdir()
    for name in fd.FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"# {name}\nprint('unchanged')\n")
    (root / "README.md").write_text("not exported\n")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "fake"], check=True)
    return root


def test_the_export_refuses_a_missing_mirror_naming_it_and_what_to_give(tmp_path):
    missing = tmp_path / "no-such-mirror"
    with pytest.raises(fd.ExportError, match=r"--mirror .*no-such-mirror does not exist: give"):
        fd.export(missing, "HEAD", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_command_line_turns_a_refused_export_into_a_one_line_exit(tmp_path):
    argv = ["--export", str(tmp_path / "out"), "--mirror", str(tmp_path / "none")]
    with pytest.raises(SystemExit, match="^python -m bench fastdllm: --mirror .* does not exist"):
        fd.main(argv)


@needs_git
def test_the_export_copies_the_files_byte_for_byte_and_records_the_commit(tmp_path):
    mirror = _fake_mirror(tmp_path / "mirror")
    head = subprocess.run(
        ["git", "-C", str(mirror), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    record = fd.export(mirror, "HEAD", tmp_path / "out")
    assert record["commit"] == head and sorted(record["files"]) == sorted(fd.FILES)
    for name in fd.FILES:
        assert (tmp_path / "out" / name).read_bytes() == (mirror / name).read_bytes()
    assert not (tmp_path / "out" / "README.md").exists()
    assert fd.check_export(tmp_path / "out") == record


@needs_git
def test_the_export_refuses_a_commit_the_mirror_lacks(tmp_path):
    mirror = _fake_mirror(tmp_path / "mirror")
    with pytest.raises(fd.ExportError, match="failed in --mirror"):
        fd.export(mirror, "0" * 40, tmp_path / "out")


@needs_git
def test_a_run_refuses_exported_files_that_were_changed_or_removed(tmp_path):
    out = tmp_path / "out"
    fd.export(_fake_mirror(tmp_path / "mirror"), "HEAD", out)
    generate = out / "llada" / "generate.py"
    generate.write_text(generate.read_text() + "# patched\n")
    with pytest.raises(fd.ExportError, match="generate.py is missing or differs .* export again"):
        fd.check_export(out)
    generate.unlink()
    with pytest.raises(fd.ExportError, match="generate.py is missing or differs"):
        fd.check_export(out)


def test_a_run_without_an_export_says_how_to_make_one(tmp_path):
    with pytest.raises(fd.ExportError, match=r"holds no fastdllm_export.json: .*--export"):
        fd.load_fastdllm(tmp_path)


def test_blob_id_is_gits_object_id():
    # `printf 'hello\n' | git hash-object --stdin`
    assert fd.blob_id(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


def _args(**kw):
    base = dict(gen_length=256, block=32, threshold=0.9)
    return argparse.Namespace(**{**base, **kw})


def test_the_threshold_cell_gives_ours_the_confidence_rule_and_theirs_its_threshold():
    theirs, ours = fd.cell_settings("threshold", _args(), mask_id=7)
    assert ours == dict(
        gen_length=256, block_length=32, temperature=0.0, threshold=0.9, remasking="low_confidence"
    )  # no steps: steps would select the fixed schedule over the threshold
    assert theirs["threshold"] == 0.9 and theirs["mask_id"] == 7
    assert theirs["remasking"] == "low_confidence" and theirs["temperature"] == 0.0


def test_the_fixed_cell_is_one_token_per_step_on_both_sides():
    theirs, ours = fd.cell_settings("fixed", _args(), mask_id=7)
    assert ours["steps"] == theirs["steps"] == 256 and "threshold" not in ours
    assert theirs["threshold"] is None and theirs["block_length"] == ours["block_length"] == 32


def test_sizes_their_generate_cannot_take_are_refused_before_any_model_work():
    sizes = dict(tiny=True, layers=None, vocab=None, prompt_length=None, block=8, rows=[1])
    args = argparse.Namespace(**sizes, gen_length=30, their_rows=None)
    with pytest.raises(SystemExit, match="--gen-length 30 must be a multiple of --block 8"):
        fd.resolve_sizes(args)
    args = argparse.Namespace(**sizes, gen_length=32, their_rows=0)
    with pytest.raises(SystemExit, match="--their-rows 0: give 1 or more .* or leave it out"):
        fd.resolve_sizes(args)


def test_the_tiny_shape_keeps_the_mask_id_out_of_the_prompts():
    config = fd.llada_config(fd.TINY_SHAPE)
    assert config["mask_token_id"] == 500 and config["vocab_size"] == 512
    args = argparse.Namespace(seed=0, rows=[1, 64], prompt_length=512)
    prompts = fd.random_prompts(args, config["mask_token_id"], torch.device("cpu"))
    assert prompts.shape == (64, 512) and int(prompts.max()) < 500
    assert fd.llada_config(fd.FULL_SHAPE)["mask_token_id"] == 126336


def test_first_difference_names_the_first_row_and_position_and_counts_the_rows():
    ours = torch.zeros(3, 5, dtype=torch.long)
    theirs = ours.clone()
    assert fd.first_difference(ours, theirs) is None
    theirs[1, 4] = theirs[2, 0] = 9
    assert fd.first_difference(ours, theirs) == {"row": 1, "position": 4, "rows_differing": 2}


def _cell(cache, ratio, identical=True, rows=1):
    side = lambda s: {"seconds": [s], "median_s": s, "min_s": s, "max_s": s, "nfe": [4]}  # noqa: E731
    return {
        "cache": cache,
        "schedule": "fixed",
        "rows": rows,
        "ours": side(ratio),
        "theirs": {**side(1.0), "forward_calls": 4},
        "identical": identical,
        "first_difference": None if identical else {"row": 0, "position": 3, "rows_differing": 1},
        "repeatable": {"ours": True, "theirs": True},
        "ratio": ratio,
    }


def _results(device="cuda"):
    return {
        "command": "python3 -m bench fastdllm",
        "facts": {"cpu": "some CPU", "torch": "2.11", "gpu": "NVIDIA H100 80GB HBM3"},
        "device": device,
        "dtype": "bfloat16",
        "date": "2026-11-27 17:00 UTC",
        "shape": dict(fd.FULL_SHAPE),
        "sizes": {"prompt_length": 256, "gen_length": 256, "block": 32},
        "fastdllm": {"source": fd.SOURCE, "commit": "24cc59e75f20a6384bae8c905965bb090b96388e"},
        "args": {
            **{"repeats": 3, "logit_std": 16.0, "threshold": 0.9, "seed": 2},
            **{"rows": [1, 16], "caches": list(fd.CACHES), "schedules": ["fixed"]},
        },
        "cells": [
            _cell("none", 0.4),
            _cell("none", 0.3, rows=16),
            _cell("prefix", 0.45, identical=False),
            _cell("dual", 0.6),
        ],
    }


def test_the_report_gives_each_cache_its_verdict_from_every_cell():
    lines = fd.report_lines(_results())
    assert (lines[0], lines[-1]) == fd.markers("fastdllm_bench")
    assert lines[1].endswith("side by side (NVIDIA H100 80GB HBM3, bfloat16)")
    verdict = {line.split("`")[1]: line for line in lines if line.startswith("- `")}
    assert verdict["none"].endswith("**yes**") and "0.30 to 0.40 over 2 cells" in verdict["none"]
    assert verdict["prefix"].endswith("**no**")  # fast enough, but the tokens differ
    assert verdict["dual"].endswith("**no**")  # the tokens agree, but 0.6x
    row = next(line for line in lines if line.startswith("| prefix |"))
    assert row.endswith("| no: row 0, position 3 (1 rows) |")
    assert "| 1.000 (1.000-1.000, 1x) | 0.450 (0.450-0.450, 1x) | 0.45 |" in row
    assert any("NVIDIA H100 80GB HBM3" in line for line in lines)
    assert not any("smoke" in line for line in lines)


def test_a_cpu_run_is_labelled_a_smoke_run():
    assert "tiny CPU smoke run" in fd.report_lines(_results(device="cpu"))[1]


def test_report_only_writes_the_section_between_its_markers(tmp_path):
    json_path, out = tmp_path / "r.json", tmp_path / "B.md"
    fd.save_json(json_path, _results())
    start, end = fd.markers("fastdllm_bench")
    out.write_text(f"# B\n{start}\nold\n{end}\nafter\n")
    assert fd.main(["--report-only", "--json", str(json_path), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith(f"# B\n{start}\n## Fast-dLLM") and text.endswith(f"{end}\nafter\n")
    assert "\nold\n" not in text


def test_another_runs_section_goes_beside_the_first_under_its_own_markers(tmp_path):
    json_path, out = tmp_path / "r.json", tmp_path / "B.md"
    fd.save_json(json_path, _results())
    start, end = fd.markers("fastdllm_bench")
    out.write_text(f"# B\n{start}\nkept\n{end}\n")
    argv = ["--report-only", "--json", str(json_path), "--out", str(out)]
    assert fd.main([*argv, "--section", "fastdllm_f32"]) == 0
    text = out.read_text()
    assert text.startswith(f"# B\n{start}\nkept\n{end}\n")
    assert "\n<!-- fastdllm_f32:start -->\n## Fast-dLLM" in text
    assert text.endswith("<!-- fastdllm_f32:end -->\n")


def test_cells_a_stopped_run_never_reached_are_listed_and_withhold_the_verdict():
    killed = _results()  # asked for the 1- and 16-row cells; stopped after these two
    killed["cells"] = [c for c in killed["cells"] if c["cache"] == "none"]
    assert fd.stopped_cells(killed) == [
        ["dual", "fixed", 1],
        ["prefix", "fixed", 1],
        ["dual", "fixed", 16],
        ["prefix", "fixed", 16],
    ]
    lines = fd.report_lines(fd.merged(killed, {}))
    assert "| prefix | fixed | 16 | not run (the run ended first) ||||||" in lines
    killed["cells"] = [_cell("dual", 0.3)]  # fast, same tokens; its 16-row cell never ran
    lines = fd.report_lines(fd.merged(killed, {}))
    verdict = next(line for line in lines if line.startswith("- `dual`"))
    assert verdict.endswith("no verdict, 1 cells not run")


def test_a_cache_with_cells_left_unmeasured_gets_no_verdict():
    results = _results()
    results["not_run"] = [["none", "fixed", 16]]
    lines = fd.report_lines(results)
    verdict = next(line for line in lines if line.startswith("- `none`"))
    assert verdict.endswith("no verdict, 1 cells not run")
    assert "| none | fixed | 16 | not run (--deadline-s) ||||||" in lines


def test_the_cells_run_cheapest_first_and_only_those_asked_for():
    args = argparse.Namespace(
        rows=[16, 1], schedules=["fixed", "threshold"], caches=["none", "dual"]
    )
    assert fd.cell_order(args) == [
        ("dual", "threshold", 1),
        ("none", "threshold", 1),
        ("dual", "fixed", 1),
        ("none", "fixed", 1),
        ("dual", "threshold", 16),
        ("none", "threshold", 16),
        ("dual", "fixed", 16),
        ("none", "fixed", 16),
    ]


def test_building_their_model_leaves_torchs_attention_kernels_as_they_were():
    """Their constructor turns the memory-efficient kernel off for the whole process."""
    before = torch.backends.cuda.mem_efficient_sdp_enabled()
    try:
        torch.backends.cuda.enable_mem_efficient_sdp(True)
        with fd.kept_attention_kernels():
            torch.backends.cuda.enable_mem_efficient_sdp(False)
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
    finally:
        torch.backends.cuda.enable_mem_efficient_sdp(before)


def _split_run():
    """A run of the 1-row cells that left one 16-row cell to a second run, and that run."""
    first, second = _results(), _results()
    first["cells"] = [c for c in first["cells"] if c["rows"] == 1]
    first["not_run"] = [["none", "fixed", 16]]
    second["cells"] = [c for c in second["cells"] if c["rows"] == 16]
    second["command"], second["date"] = "python3 -m bench fastdllm --rows 16", "later"
    return first, second


def test_merged_runs_fill_one_table_and_name_both_commands():
    first, second = _split_run()
    both = fd.merged(first, {"b.json": second})
    assert [c["rows"] for c in both["cells"]] == [1, 1, 1, 16] and both["not_run"] == []
    text = "\n".join(fd.report_lines(both))
    assert "; and of later: `python3 -m bench fastdllm --rows 16`" in text
    assert "no verdict" not in text


def test_merge_refuses_another_machine_kind_and_a_cell_measured_twice():
    first, second = _split_run()
    second["facts"] = {**second["facts"], "gpu": "NVIDIA H200"}
    with pytest.raises(SystemExit, match="--merge b.json: its gpu is 'NVIDIA H200'"):
        fd.merged(first, {"b.json": second})
    with pytest.raises(SystemExit, match=r"cell \('none', 'fixed', 1\) was measured in"):
        fd.merged(first, {"b.json": _results()})


def test_the_extra_pass_of_their_cached_loops_is_explained_only_where_it_shows():
    results = _results()
    assert not any("one more pass" in line for line in fd.report_lines(results))
    results["cells"][3]["theirs"]["nfe"] = [5]  # dual, same tokens: theirs 5 passes, ours 4
    assert any("one more pass" in line for line in fd.report_lines(results))


class FakeSides:
    """Both sides' `generate` without a model: each answer is the prompt's first ids; a unit
    of work per call of ours (all rows at once) and per row of theirs (one row a call), which
    `_synced` below reports as the call's seconds."""

    def __init__(self, answer_length: int) -> None:
        self.work, self.answer_length, self.ours_differ_at = 0, answer_length, None

    def theirs(self, model, prompt, **kwargs):
        self.work += 1
        return torch.cat([prompt, prompt[:, : self.answer_length]], dim=1), 7

    def ours(self, model, prompts, cache, **kwargs):
        self.work += 1
        tokens = prompts[:, : self.answer_length].clone()
        if self.ours_differ_at is not None:
            tokens[self.ours_differ_at] += 1
        return argparse.Namespace(tokens=tokens, nfe=torch.full((len(prompts),), 5))

    def synced(self, device, run):
        before = self.work
        result = run()
        return float(self.work - before), result


def _fake_bench(monkeypatch, their_rows):
    fake = FakeSides(answer_length=4)
    monkeypatch.setattr(fd, "our_generate", fake.ours)
    monkeypatch.setattr(fd, "_synced", fake.synced)
    generate = argparse.Namespace(**{name: fake.theirs for name in fd.THEIR_FUNCTIONS.values()})
    args = _args(gen_length=8, block=4, repeats=2, repeat_budget_s=None, their_rows=their_rows)
    prompts = torch.arange(16 * 6).reshape(16, 6)
    ours = argparse.Namespace(mask_token_id=99)
    return fake, fd.Bench(args, generate, ours, torch.nn.Linear(1, 1), prompts)


@pytest.mark.parametrize("their_rows", [None, 16, 4])
def test_their_time_is_scaled_from_the_rows_they_ran_and_only_those_are_compared(
    monkeypatch, their_rows
):
    fake, bench = _fake_bench(monkeypatch, their_rows)
    cell = fd.measure_cell(bench, "dual", "fixed", rows=16)
    ran = 16 if their_rows is None else their_rows
    assert cell["theirs"]["rows_run"] == ran and len(cell["theirs"]["nfe"]) == ran
    assert cell["theirs"]["seconds"] == [16.0, 16.0]  # ran rows' units x 16 / ran
    assert cell["ours"]["seconds"] == [1.0, 1.0] and cell["ratio"] == 1 / 16
    assert cell["identical"] and len(cell["ours"]["nfe"]) == 16
    fake.ours_differ_at = ran - 1  # the last row both ran: seen
    cell = fd.measure_cell(bench, "dual", "fixed", rows=16)
    assert not cell["identical"]
    assert cell["first_difference"] == {"row": ran - 1, "position": 0, "rows_differing": 1}
    if ran < 16:  # a row only ours ran: not compared
        fake.ours_differ_at = ran
        assert fd.measure_cell(bench, "dual", "fixed", rows=16)["identical"]
    fake.ours_differ_at = None
    one_row = fd.measure_cell(bench, "none", "threshold", rows=1)
    assert one_row["theirs"]["rows_run"] == 1 and one_row["theirs"]["seconds"] == [1.0, 1.0]


def test_the_report_marks_a_time_scaled_from_fewer_rows():
    assert not any("*est.:" in line for line in fd.report_lines(_results()))  # none scaled
    results = _results()
    scaled = results["cells"][1]  # none, 16 rows
    scaled["theirs"].update(rows_run=4, nfe=[4, 4, 4, 4])
    scaled["ours"]["nfe"] = [4] * 4 + [30] * 12  # rows theirs did not run: not in the mean
    lines = fd.report_lines(results)
    row = next(line for line in lines if line.startswith("| none | fixed | 16 "))
    assert "| 1.000 (1.000-1.000, 1x, est.: 4 of 16 rows run, x 16/4) |" in row
    assert row.endswith("| 4.0 (first 4 rows) | 4.0 (first 4 rows) | yes (the first 4 rows) |")
    verdict = next(line for line in lines if line.startswith("- `none`"))
    assert (
        "over 2 cells (1 with Fast-dLLM's time scaled from, and the tokens compared on" in verdict
    )
    assert any("*est.: K of R rows run*" in line and "an estimate" in line for line in lines)
    plain = next(line for line in lines if line.startswith("| none | fixed | 1 "))
    assert "est." not in plain and plain.endswith("| 4.0 | 4.0 | yes |")


def test_the_extra_pass_note_compares_the_rows_both_ran():
    """Theirs ran 4 rows at 9 passes, ours 16 at 8: theirs is above ours per row."""
    results = _results()
    results["cells"] = [_cell("dual", 0.3, rows=16)]
    results["cells"][0]["theirs"].update(rows_run=4, nfe=[9] * 4)
    results["cells"][0]["ours"]["nfe"] = [8] * 16
    assert any("one more pass" in line for line in fd.notes(results))
    results["cells"][0]["theirs"]["nfe"] = [8] * 4
    assert fd.notes(results) == []


def test_cells_whose_tokens_part_are_compared_per_pass_too():
    results = _results()
    prefix = results["cells"][2]  # tokens differ, one row: 0.45 s over 4 passes, theirs 1.0 s
    prefix["theirs"]["nfe"] = [5]  # more passes on their path: no "one more pass" note
    text = "\n".join(fd.report_lines(results))
    assert "one more pass" not in text
    assert "ours / theirs: `prefix` fixed 112.5 / 200.0 ms (0.56)." in text
    assert "`none` fixed" not in text  # the cells whose tokens agree are not listed


def test_merged_runs_list_each_unreached_cell_once_and_drop_those_run_elsewhere():
    first, rerun = _results(), _results()  # both asked for every cache at 1 and 16 rows
    first["cells"] = [c for c in first["cells"] if c["rows"] == 1]
    first["not_run"] = [["prefix", "fixed", 16]]  # --deadline-s
    rerun["cells"] = [c for c in rerun["cells"] if c["rows"] == 16]  # none at 16 rows
    rerun["command"], rerun["date"] = "python3 -m bench fastdllm --rows 16", "later"
    both = fd.merged(first, {"b.json": rerun})
    assert both["not_run"] == [["prefix", "fixed", 16]]
    # dual at 16 rows: unreached by both runs, listed once; none at 16: run by the second
    assert both["stopped"] == [["dual", "fixed", 16]]
    lines = fd.report_lines(both)
    assert sum(line.startswith("| dual | fixed | 16 | not run") for line in lines) == 1


class ShiftedTheirs:
    """'Their' model: our plain forward's logits, with position `at` of the answer's
    second-best token raised by `by` (so that it wins where `by` exceeds our top-2 margin),
    and `edit(logits)` applied last when given."""

    def __init__(self, ours, prompt_length, at, by, edit=None):
        self.ours, self.index, self.by, self.edit = ours, prompt_length + at, by, edit

    def __call__(self, x: torch.Tensor) -> argparse.Namespace:
        logits = self.ours(x).clone()
        second = logits[0, self.index].topk(2).indices[1]
        logits[0, self.index, second] += self.by
        if self.edit is not None:
            self.edit(logits)
        return argparse.Namespace(logits=logits)


def _tiny_ours():
    model = fd.our_model(fd.llada_config(dict(fd.TINY_SHAPE)), 16.0, "cpu", torch.float32)
    prompt = torch.randint(0, 400, (32,), generator=torch.Generator().manual_seed(0))
    return model, prompt, argparse.Namespace(gen_length=32, threshold=0.9)


def test_the_first_pass_logits_of_the_same_model_agree_exactly():
    ours, prompt, args = _tiny_ours()
    same = fd.logit_agreement(ours, ShiftedTheirs(ours, 32, 0, 0.0), prompt, args)
    assert same == {
        "positions": 32,
        "max_abs": 0.0,
        "mean_abs": 0.0,
        "not_finite": 0,
        "argmax_differ": 0,
        "largest_margin_where_differ": None,
        "threshold_differ": 0,
    }


def test_a_flipped_arg_max_is_counted_with_our_margin_there():
    ours, prompt, args = _tiny_ours()
    with torch.no_grad():
        top2 = ours(torch.cat([prompt, torch.full((32,), ours.mask_token_id)])[None])[0, 32 + 5]
    values = top2.topk(2).values
    margin = float(values[0] - values[1])
    found = fd.logit_agreement(ours, ShiftedTheirs(ours, 32, 5, margin + 1.0), prompt, args)
    assert found["argmax_differ"] == 1
    assert found["largest_margin_where_differ"] == pytest.approx(margin)
    assert found["max_abs"] == pytest.approx(margin + 1.0)
    line = fd.logit_lines({"logits": found})[-1]
    assert "pick different tokens at 1 position(s); where they do, our top-2 margin" in line
    assert fd.logit_lines({}) == []  # a run from before the comparison


def test_the_mask_tokens_column_is_left_out_and_values_not_finite_are_counted():
    ours, prompt, args = _tiny_ours()
    mask_id = ours.mask_token_id

    def lower_the_mask(logits):  # their mask column far below: no pick changes
        logits[0, 32:, mask_id] -= 50.0

    found = fd.logit_agreement(ours, ShiftedTheirs(ours, 32, 0, 0.0, lower_the_mask), prompt, args)
    assert (found["max_abs"], found["argmax_differ"], found["not_finite"]) == (0.0, 0, 0)

    def one_nan(logits):
        logits[0, 40, 7] = float("nan")

    found = fd.logit_agreement(ours, ShiftedTheirs(ours, 32, 0, 0.0, one_nan), prompt, args)
    assert (found["max_abs"], found["not_finite"]) == (0.0, 1)  # not read as "0 apart"
    assert ", 1 values not finite;" in fd.logit_lines({"logits": found})[-1]


def test_the_report_says_how_our_passes_ran_and_merges_only_runs_alike():
    """`our_cached_steps` (graphs on CUDA under auto, for `none`'s full passes too) is named
    in the header; a run from before it was recorded says so; runs of different modes are
    not merged into one table (their `none` cells measure other work)."""
    results = _results()
    assert any("ours under `cached_steps` not recorded" in line for line in fd.header(results))
    first, second = _split_run()
    first["our_cached_steps"] = second["our_cached_steps"] = "graphs"
    assert any("; ours under `cached_steps=graphs`." in line for line in fd.header(first))
    fd.merged(first, {"b.json": second})
    second["our_cached_steps"] = "compiled"
    with pytest.raises(SystemExit, match="--merge b.json: its our cached_steps is 'compiled'"):
        fd.merged(first, {"b.json": second})


def test_a_capturing_mode_off_cuda_is_refused_before_any_model_work(capsys):
    with pytest.raises(SystemExit):
        fd.parse_args(["--tiny", "--device", "cpu", "--cached-steps", "compiled"])
    assert "--cached-steps compiled needs a CUDA device, got cpu" in capsys.readouterr().err
    assert fd.parse_args(["--tiny", "--device", "cpu"]).cached_steps == "auto"
