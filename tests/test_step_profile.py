"""bench/step_profile.py: a tiny run on the CPU profiles a steady reuse step (its operators
by category), counts what one layer adds, and writes a section naming where it ran; a block
too short for its steps is refused before any model work."""

from __future__ import annotations

import copy
import json

import pytest

from bench import step_profile

TINY = "--layers 1 --width 64 --heads 4 --prompt-length 16 --gen-length 16 --block 8"
STEPS = "--profile-steps 1 --timed-steps 2"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("step_profile")
    out, json_path = folder / "B.md", folder / "p.json"
    argv = [*TINY.split(), *STEPS.split(), "--json", str(json_path), "--out", str(out)]
    assert step_profile.main(argv) == 0
    return json.loads(json_path.read_text()), out.read_text()


def test_names_fall_in_their_categories():
    assert step_profile.category("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n") == "matmul"
    assert step_profile.category("aten::linear") == "matmul"
    assert step_profile.category("fmha_cutlassF_bf16_aligned_64x64_rf_sm80") == "attention"
    assert step_profile.category("aten::scaled_dot_product_attention") == "attention"
    assert step_profile.category("void at::native::vectorized_elementwise_kernel") == (
        step_profile.OTHER
    )


def test_a_layer_adds_its_seven_projections_and_one_attention(run):
    results, _ = run
    per_layer = results["operators_per_layer"]
    # LLaDA's layer: q, k, v, out, and the MLP's gate, up and down
    assert per_layer["aten::linear"] == 7
    assert per_layer["aten::scaled_dot_product_attention"] == 1
    assert "aten::embedding" not in per_layer  # once per pass, not per layer


def test_the_profiled_step_holds_the_layers_projections_and_the_head(run):
    results, text = run
    calls = {k["name"]: k["calls"] for k in results["kernels"]}
    assert calls["aten::linear"] == 7 + 1  # one layer and the output head
    assert results["wall_ms"]["static"] > 0 and "graphs" not in results["wall_ms"]
    total = sum(k["calls"] for k in results["kernels"])
    assert f"| all | {total:.0f} |" in text
    assert text.splitlines()[1].endswith("(`step-profile`) on the CPU, float32")


def test_a_gpu_runs_section_names_the_gpu_and_its_graphs_step(run, tmp_path):
    results, _ = run
    gpu = copy.deepcopy(results)
    gpu["meta"]["facts"]["gpu"] = "NVIDIA H200"
    gpu["args"].update(device="cuda", dtype="bfloat16")
    gpu["wall_ms"]["graphs"] = 9.4
    lines = step_profile.section(gpu, "step_profile_h200")
    assert lines[0] == "<!-- step_profile_h200:start -->"
    assert lines[1].endswith("on the NVIDIA H200, bfloat16")
    assert any("under `graphs` 9.40 ms" in line for line in lines)
    assert any(line.startswith("| category | kernels per step |") for line in lines)


def test_a_block_too_short_for_its_steps_is_refused_first(capsys):
    with pytest.raises(SystemExit):
        step_profile.main([*TINY.replace("--block 8", "--block 4").split(), *STEPS.split()])
    assert "--block 4: the decoder steps 7 times in one block" in capsys.readouterr().err
