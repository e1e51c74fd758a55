"""LoRA adapters written by `peft` itself, for the adapter and RFG tests."""

from __future__ import annotations

from pathlib import Path

import torch

from lm_eval_dvoting.models.loading import load_model

OFFICIAL = Path(__file__).resolve().parent / "fixtures" / "official-tiny"
# d1's and wd1's target list (RFG.md section 4): on LLaDA only q/k/v/up exist
D1_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj"]


def peft_adapter(
    checkpoint: Path,
    folder: Path,
    targets: list[str] | str,
    r: int = 4,
    alpha: int = 8,
    seed: int = 0,
    **extra,
) -> tuple[Path, torch.nn.Module]:
    """An adapter with random (non-zero) LoRA weights, saved by peft's save_pretrained; and
    the PEFT model that wrote it, to compare with."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        target_modules=targets,
        lora_dropout=0.0,
        init_lora_weights=False,
        **extra,
    )
    written = get_peft_model(load_model(checkpoint, device="cpu", dtype="float32"), config)
    written.save_pretrained(str(folder))
    return folder, written.eval()
