"""Train the demo's LoRA adapter: `tiny-arith` post-trained on the longest chains, the
policy of the demo's RFG row (its reference: `tiny-arith` itself, the adapter switched off).

    python -m lm_eval_dvoting.demo.train_adapter --threads 2
    # writes lm_eval_dvoting/demo/tiny-arith-lora

A PEFT LoRA (rank `--r`, alpha `--alpha`) on `q_proj k_proj v_proj up_proj` of every block,
trained with the base model's objective (`train.diffusion_loss`: LLaDA's SFT loss) on
problems of `--chain` steps only, the longest the test set holds and the ones the base
model gets wrong most often, from a data stream of its own seed (training never sees a
test or validation problem: `train.training_problems`). Greedy accuracy on the 200
validation problems, base and adapter, is printed and written to TRAINING.md beside the
adapter; the test set is not read here. About a minute on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from lm_eval_dvoting.demo import train
from lm_eval_dvoting.demo.tokenizer import build_tokenizer

DEFAULT_OUT = Path(__file__).resolve().parent / "tiny-arith-lora"
TARGETS = ("q_proj", "k_proj", "v_proj", "up_proj")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m lm_eval_dvoting.demo.train_adapter",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--base", default="tiny-arith")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--r", type=int, default=8)
    p.add_argument("--alpha", type=int, default=16)
    p.add_argument(
        "--chain",
        type=int,
        default=4,
        help="steps per training problem (the test set's longest: 4)",
    )
    p.add_argument(
        "--seed", type=int, default=11, help="the data stream's seed (the base model's was 0)"
    )
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def data_args(args: argparse.Namespace) -> argparse.Namespace:
    """The base model's data and objective settings (its TRAINING.md recipe), at `--chain` steps."""
    return train.parse_args(
        [
            "--gen-length",
            "32",
            "--solution-order",
            "aligned",
            "--max-value",
            "9",
            "--min-start",
            "1",
            "--train-min-steps",
            str(args.chain),
            "--train-max-steps",
            str(args.chain),
            "--seed",
            str(args.seed),
            "--batch-size",
            str(args.batch_size),
            "--steps",
            str(args.steps),
            "--lr",
            str(args.lr),
            "--warmup",
            str(args.steps // 10),
        ]
    )


def validation_accuracy(model: torch.nn.Module, tokenizer, valid) -> dict[str, float]:
    return train.greedy_accuracy(model, tokenizer, valid, 32, torch.device("cpu"))


def lora_policy(model: torch.nn.Module, args: argparse.Namespace) -> torch.nn.Module:
    """`model` wrapped in a fresh PEFT LoRA of rank --r, alpha --alpha on `TARGETS`."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=args.r, lora_alpha=args.alpha, target_modules=list(TARGETS), lora_dropout=0.0
    )
    return get_peft_model(model, config)


def train_policy(policy: torch.nn.Module, targs: argparse.Namespace, tokenizer, began: float):
    """--steps steps of the base model's objective on the adapter's weights only, the loss
    printed every 50 steps."""
    optimizer = torch.optim.AdamW(
        [p for p in policy.parameters() if p.requires_grad],
        lr=targs.lr,
        betas=(0.9, 0.98),
        weight_decay=0.0,
    )
    held_out, _ = train.held_out_problems(targs)
    mask_id = policy.get_base_model().mask_token_id
    policy.train()
    losses = []
    for step in range(targs.steps):
        for group in optimizer.param_groups:
            group["lr"] = train.lr_at(step, targs)
        batch = train.training_batch(step, targs, tokenizer, held_out)
        loss = train.diffusion_loss(policy, batch, step, targs, mask_id, torch.device("cpu"))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % 50 == 0:
            mean = sum(losses[-50:]) / 50
            print(f"step {step + 1}: loss {mean:.4f} ({time.time() - began:.0f} s)", flush=True)
    policy.eval()


def save_adapter(policy: torch.nn.Module, note: dict, out: Path) -> None:
    """The adapter's weights and config, and TRAINING.md from `note` (PEFT's model-card stub,
    which says nothing about this adapter, removed)."""
    out.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(str(out))
    (out / "README.md").unlink(missing_ok=True)
    (out / "TRAINING.md").write_text(training_note(note))


def main(argv: list[str] | None = None) -> dict[str, object]:
    """Train the adapter, write it to --out with its TRAINING.md; the note (command, arguments,
    minutes, validation accuracy of the base and of base + adapter)."""
    from lm_eval_dvoting.demo.arith import held_out_sets
    from lm_eval_dvoting.models.loading import load_model

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    targs = data_args(args)
    tokenizer = build_tokenizer()
    _, valid = held_out_sets()
    model = load_model(args.base, device="cpu", dtype="float32")
    base_valid = validation_accuracy(model, tokenizer, valid)
    policy = lora_policy(model, args)
    began = time.time()
    train_policy(policy, targs, tokenizer, began)
    adapter_valid = validation_accuracy(policy, tokenizer, valid)
    note = {
        "command": "python -m lm_eval_dvoting.demo.train_adapter " + " ".join(argv),
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "minutes": round((time.time() - began) / 60, 1),
        "validation": {"base": base_valid, "adapter": adapter_valid},
    }
    save_adapter(policy, note, args.out)
    print(json.dumps(note["validation"]), flush=True)
    return note


def training_note(note: dict) -> str:
    base, adapter = note["validation"]["base"], note["validation"]["adapter"]
    return (
        f"# tiny-arith-lora: how this adapter was made\n\n`{note['command'].strip()}` "
        f"({note['minutes']} min of training on a 2-core CPU), with the arguments\n"
        f"`{json.dumps(note['args'])}`. See `lm_eval_dvoting/demo/train_adapter.py` for the "
        "recipe.\n\nGreedy accuracy on the 200 validation problems (steps = L = 32, blocks of 2), "
        "by chain length:\n\n"
        f"| model | all | " + " | ".join(k for k in base if k != "acc") + " |\n"
        "|---|---|" + "---|" * (len(base) - 1) + "\n"
        f"| tiny-arith | {base['acc']:.3f} | "
        + " | ".join(str(v) for k, v in base.items() if k != "acc")
        + " |\n"
        f"| tiny-arith + this adapter | {adapter['acc']:.3f} | "
        + " | ".join(str(v) for k, v in adapter.items() if k != "acc")
        + " |\n\n"
        'The test set was not read to make it. Its test-set figures are in the README ("The '
        'offline demo").\n'
    )


if __name__ == "__main__":
    main()
