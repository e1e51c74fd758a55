"""bench/step_profile.py: a tiny run on the CPU profiles a steady reuse step (its operators
by category), counts what one layer adds, and writes a section naming where it ran; a block
too short for its steps is refused before any model work."""

from __future__ import annotations

import argparse
import copy
import json
from types import SimpleNamespace

import pytest
import torch

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
    assert step_profile.category("nvjet_tst_128x64_64x8_1x2_h_bz_NNT") == "matmul"
    assert step_profile.category("void gemv2T_kernel_val<int, int, __nv_bfloat16>") == "matmul"
    assert step_profile.category("void pytorch_flash::flash_fwd_kernel<Flash_fwd>") == "attention"
    for other in ("void at::native::vectorized_elementwise_kernel", "Memcpy DtoD (Device)"):
        assert step_profile.category(other) == step_profile.OTHER


def test_a_layer_adds_its_seven_projections_and_one_attention(run):
    results, _ = run
    per_layer = results["operators_per_layer"]
    assert sum(per_layer.values()) == 39  # docs/PERFORMANCE.md quotes it (float32)
    assert "aten::neg" not in per_layer  # the rotation's sign is in its sine table
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
    gpu["wall_ms"].update(graphs=9.4, compiled=6.25)
    lines = step_profile.section(gpu, "step_profile_h200")
    assert lines[0] == "<!-- step_profile_h200:start -->"
    assert lines[1].endswith("on the NVIDIA H200, bfloat16")
    assert any("under `graphs` 9.40 ms, under `compiled` 6.25 ms" in line for line in lines)
    assert any(line.startswith("| category | kernels per step |") for line in lines)


def test_a_block_too_short_for_its_steps_is_refused_first(capsys):
    with pytest.raises(SystemExit):
        step_profile.main([*TINY.replace("--block 8", "--block 4").split(), *STEPS.split()])
    assert "--block 4: a decoder steps up to 6 times in one block" in capsys.readouterr().err


def test_compiled_is_timed_on_a_gpu_only_when_asked_and_refused_elsewhere(capsys):
    def modes(**args):
        return step_profile.wall_modes(argparse.Namespace(**args))

    assert modes(device="cuda:0", cache="dual", compiled=False) == ["static", "graphs"]
    assert modes(device="cuda", cache="dual", compiled=True) == ["static", "graphs", "compiled"]
    assert modes(device="cuda", cache="none", compiled=False) == ["static", "graphs"]  # full
    with pytest.raises(SystemExit):
        step_profile.main([*TINY.split(), *STEPS.split(), "--compiled"])
    assert "--compiled needs a CUDA device, got --device cpu" in capsys.readouterr().err


class FakeEvent:
    def __init__(self, name, device_type, micros):
        self.name, self.device_type = name, device_type
        self.time_range = SimpleNamespace(elapsed_us=lambda: micros)


def test_on_a_gpu_only_the_device_kernels_are_counted_per_step(monkeypatch):
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = [
        FakeEvent("sm90_xmma_gemm_bf16", cuda, 300.0),
        FakeEvent("sm90_xmma_gemm_bf16", cuda, 100.0),
        FakeEvent("vectorized_elementwise_kernel", cuda, 10.0),
        FakeEvent("cudaLaunchKernel", cpu, 5.0),  # the host's side: not a kernel
        FakeEvent("aten::mm", cpu, 400.0),
    ]

    class FakeProfile:
        def __init__(self, activities):
            assert torch.profiler.ProfilerActivity.CUDA in activities

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def events(self):
            return events

    monkeypatch.setattr(step_profile, "profile", FakeProfile)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    stepped = []
    decoder = SimpleNamespace(step=lambda: stepped.append(1))
    kernels = step_profile.kernels_per_step(decoder, 2, "cuda")
    assert len(stepped) == 2
    assert kernels == [
        {"name": "sm90_xmma_gemm_bf16", "category": "matmul", "calls": 1.0, "us": 200.0},
        {
            "name": "vectorized_elementwise_kernel",
            "category": step_profile.OTHER,
            "calls": 0.5,
            "us": 5.0,
        },
    ]


def test_a_step_without_a_cache_is_named_a_full_step(run):
    results, _ = run
    none = copy.deepcopy(results)
    none["args"]["cache"] = "none"
    lines = step_profile.section(none)
    assert lines[1].startswith("## One full step (no cache) of `cache=none`, kernel by kernel")
    summary = next(line for line in lines if line.startswith("- a full step (no cache) of"))
    assert "ms wall eagerly (medians" in summary  # no buffers: `static` is the eager pass


def test_a_run_leaves_the_callers_gradient_setting_as_it_was(run):
    assert torch.is_grad_enabled()  # the fixture's run turned them off for itself only
