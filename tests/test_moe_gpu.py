"""The MoE layers' grouped GEMMs on a CUDA device (models/moe.py): run with
`python -m pytest -m gpu -n 0 tests/test_moe_gpu.py` (bench/gpu_session.sh runs it); skipped
where no CUDA device is present, as on the CPU machines and in CI.

* In bfloat16 on compute capability 9/10 the grouped GEMMs apply, wait for nothing (CUDA's
  sync debug mode), and agree with the loop over experts up to bfloat16 rounding, empty
  experts included; elsewhere the loop runs.
* The official-tiny LLaDA2 and LLaDA-MoE fixtures give the CPU's float32 logits on the GPU in
  float32 (where the loop runs). Not compared in bfloat16: there a router's top-k flips with
  rounding at some positions, whichever way the experts run; the layer test above pins the
  grouped GEMMs in bfloat16 on one routing.
"""

from __future__ import annotations

import pytest
import torch
from conftest import fixture_folder
from safetensors.torch import load_file

from lm_eval_dvoting.models import moe
from lm_eval_dvoting.models.loading import load_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda")


def _grouped_kernel() -> bool:
    return torch.cuda.get_device_capability(CUDA)[0] in (9, 10)


def _experts(dtype: torch.dtype) -> tuple[moe.Experts, tuple[torch.Tensor, ...]]:
    """64 experts; the tokens go to the odd ones from 1 to 61 only, so that empty groups lie
    at the start, between and at the end."""
    torch.manual_seed(0)
    experts = moe.Experts(64, 256, 128)
    for weight in experts.parameters():
        torch.nn.init.normal_(weight, std=0.05)
    experts = experts.to(CUDA, dtype).requires_grad_(False)
    x = torch.randn(96, 256, device=CUDA).to(dtype)
    chosen = 2 * torch.rand(96, 31, device=CUDA).argsort(dim=1)[:, :8] + 1
    return experts, (x, chosen, torch.rand(96, 8, device=CUDA))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32"])
def test_grouped_gemms_apply_in_bfloat16_on_hopper_and_wait_for_nothing(monkeypatch, dtype):
    """Where they apply, the grouped GEMMs wait for nothing (CUDA's sync debug mode raises at
    any synchronising call, PyTorch's own included) and agree with the loop over experts up
    to bfloat16 rounding; elsewhere the loop runs (compared with itself: only its one read is
    checked)."""
    from bench.host_reads_bench import HostReads

    experts, inputs = _experts(dtype)
    applies = moe.grouped_applies(inputs[0], experts.gate_proj)
    assert applies == (dtype == torch.bfloat16 and _grouped_kernel())
    if applies:
        experts(*inputs)  # a first call may set things up
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = experts(*inputs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    else:
        with HostReads() as reads:
            out = experts(*inputs)
        assert sum(reads.calls.values()) == 1
    monkeypatch.setattr(moe, "grouped_applies", lambda x, weight: False)
    looped = experts(*inputs)
    scale = looped.float().abs().max().item()
    tolerance = 0.0 if not applies else 2e-2 * scale
    assert (out.float() - looped.float()).abs().max().item() <= tolerance


@pytest.mark.parametrize("family", ["llada2", "llada_moe"])
def test_moe_fixtures_give_the_cpu_logits_on_the_gpu(family):
    folder = fixture_folder(family)
    expected = load_file(str(folder / "expected.safetensors"))
    model = load_model(str(folder), device="cuda", dtype="float32")
    ids = expected["input_ids"][1:, 3:].to(CUDA)  # the unpadded row
    extra = {"block_lengths": torch.tensor([4], device=CUDA)} if family == "llada2" else {}
    with torch.no_grad():
        logits = model(ids, **extra).float().cpu()
    reference = load_model(str(folder), device="cpu", dtype="float32")
    with torch.no_grad():
        wanted = reference(ids.cpu(), **extra)
    assert (logits - wanted).abs().max().item() <= 1e-3
