"""Train the tiny masked-diffusion models shipped as ``pretrained=tiny-arith`` (and -dream).

    python -m lm_eval_dvoting.demo.train --out runs/tiny-arith            # train (or resume)
    python -m lm_eval_dvoting.demo.train --out runs/tiny-arith --max-minutes 30  # one sitting

(The shipped checkpoints' exact commands are in ``demo/tiny-arith*/TRAINING.md``.)
The model is a LLaDA (`models.llada.LLaDAModel`), or with ``--family dream`` a Dream
(`models.dream.DreamModel`, whose prediction for position i sits at i-1), trained with
LLaDA's supervised masked-diffusion objective: per sequence a mask ratio ``t ~ U(eps, 1]``
(stratified over the batch), every answer token masked with probability ``t``, the prompt never
masked, cross-entropy on the masked positions divided by ``t`` and normalised by the
answer length. End-of-text padding after the first end-of-text token is down-weighted
(``--pad-weight``): it is trivially predictable and otherwise hides the digits.

Reproducible and resumable: every batch and its masks are drawn from generators
seeded by ``(seed, step)``, and ``OUT/last.pt`` (written every ``--ckpt-every`` steps
and at the end of a sitting) holds the model, its moving average, the optimiser and
the step. Running the same command again resumes from it, so training can be spread
over several sittings; the result equals an uninterrupted run.

Every ``--eval-every`` steps the held-out validation problems (disjoint from the test
set and from training) are decoded greedily (temperature 0, ``steps = L``,
low-confidence remasking, blocks of ``L/16``) and the accuracy is logged to
``OUT/log.jsonl``; the best model so far is exported to ``OUT/best/`` as a LLaDA
checkpoint folder (config.json, model.safetensors, tokenizer) that `load_model` reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from lm_eval_dvoting.demo import arith
from lm_eval_dvoting.demo.sweep import score_strategies
from lm_eval_dvoting.demo.tokenizer import EOS, MASK, build_tokenizer
from lm_eval_dvoting.integration import strict_json
from lm_eval_dvoting.models.dream import DreamConfig, DreamModel
from lm_eval_dvoting.models.llada import LLaDAConfig, LLaDAModel

# The command line as data: (flag, argparse keywords), in --help's order. --device's default
# (cuda when there is one) is filled in by parse_args, when the flags are read.
FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
    (
        "--out",
        dict(
            type=Path,
            default=Path("runs/tiny-arith"),
            help="working folder (checkpoints, log, best/)",
        ),
    ),
    ("--seed", dict(type=int, default=0)),
    (
        "--steps",
        dict(type=int, default=6000, help="total optimisation steps (sets the LR schedule)"),
    ),
    ("--batch-size", dict(type=int, default=64)),
    ("--lr", dict(type=float, default=2e-3)),
    ("--warmup", dict(type=int, default=200)),
    (
        "--min-lr-ratio",
        dict(type=float, default=0.05, help="final LR as a fraction of --lr (cosine)"),
    ),
    ("--weight-decay", dict(type=float, default=0.1)),
    ("--ema", dict(type=float, default=0.995, help="decay of the weight moving average (0: off)")),
    (
        "--pad-weight",
        dict(type=float, default=0.2, help="loss weight of padding after the first EOS"),
    ),
    (
        "--family",
        dict(
            choices=("llada", "dream"),
            default="llada",
            help="checkpoint format: LLaDA, or Dream (Qwen2 parameter names; the prediction for "
            "position i is read from the logits at i-1, so the loss is too)",
        ),
    ),
    ("--d-model", dict(type=int, default=128)),
    ("--n-layers", dict(type=int, default=4)),
    ("--n-heads", dict(type=int, default=4)),
    ("--mlp", dict(type=int, default=352)),
    ("--gen-length", dict(type=int, default=32, help="answer length L (EOS-padded)")),
    ("--train-min-steps", dict(type=int, default=1, help="shortest chain in training")),
    ("--train-max-steps", dict(type=int, default=arith.TEST_DIFFICULTY.max_steps)),
    ("--max-operand", dict(type=int, default=arith.TEST_DIFFICULTY.max_operand)),
    ("--max-value", dict(type=int, default=arith.TEST_DIFFICULTY.max_value)),
    ("--min-start", dict(type=int, default=arith.TEST_DIFFICULTY.min_start)),
    ("--operations", dict(default="".join(arith.TEST_DIFFICULTY.operations))),
    (
        "--solution-order",
        dict(
            choices=("question", "any", "commuted", "aligned"),
            default="question",
            help="worked solutions in the question's order; in any valid order of its terms "
            "(arith.solution_orders): several reasoning paths per problem; 'commuted': "
            "any order, and each addition written either way round (arith.commute_additions); "
            "'aligned': the question's order, each addition either way round (paths that "
            "differ only inside steps, position by position)",
        ),
    ),
    ("--eval-every", dict(type=int, default=500)),
    (
        "--valid-size",
        dict(
            type=int,
            default=arith.VALID_SIZE,
            help="validation problems held out of training (the first of them are evaluated)",
        ),
    ),
    ("--eval-size", dict(type=int, default=200, help="validation problems per evaluation")),
    (
        "--eval-strategies",
        dict(
            nargs="*",
            default=[],
            metavar="STRATEGY",
            help="strategies also scored on the validation problems at each evaluation "
            "(e.g. dvoting majority): how much voting adds, along the learning curve",
        ),
    ),
    ("--ckpt-every", dict(type=int, default=200)),
    (
        "--snapshot-every",
        dict(
            type=int,
            default=0,
            help="also export the raw and moving-average weights to "
            "OUT/snapshots/step-N-{model,ema} every N steps (0: off), to pick a checkpoint from "
            "the learning curve later",
        ),
    ),
    (
        "--snapshot-from",
        dict(type=int, default=0, help="first step at which --snapshot-every exports"),
    ),
    (
        "--max-minutes",
        dict(type=float, default=None, help="end this sitting after so many minutes"),
    ),
    (
        "--stop-at",
        dict(
            type=int,
            default=None,
            help="end this sitting at this step (the LR schedule still follows --steps)",
        ),
    ),
    (
        "--init-from",
        dict(
            type=Path,
            default=None,
            help="start from the weights of this checkpoint folder (a curriculum stage's best/) "
            "instead of a random init",
        ),
    ),
    (
        "--threads",
        dict(
            type=int, default=1, help="torch threads (1 is fastest on a CPU shared with other work)"
        ),
    ),
    ("--device", dict(default=None)),
    (
        "--evaluate",
        dict(
            metavar="CHECKPOINT",
            default=None,
            help="train nothing: print the greedy accuracy of CHECKPOINT (a folder or "
            "'tiny-arith') on the 500 test problems",
        ),
    ),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The training command's arguments (`FLAGS`); --device defaults to cuda when present."""
    parser = argparse.ArgumentParser(
        prog="python -m lm_eval_dvoting.demo.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for flag, keywords in FLAGS:
        parser.add_argument(flag, **keywords)
    args = parser.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


# --------------------------------------------------------------------------- data


def model_config(args: argparse.Namespace, tokenizer) -> dict[str, Any]:
    """The checkpoint's config.json, in the official format of `--family`."""
    vocab = len(tokenizer)
    special = {
        "mask_token_id": tokenizer.convert_tokens_to_ids(MASK),
        "eos_token_id": tokenizer.convert_tokens_to_ids(EOS),
        "pad_token_id": tokenizer.convert_tokens_to_ids(EOS),
    }
    if args.family == "dream":
        return {
            "model_type": "Dream",
            "architectures": ["DreamModel"],
            "hidden_size": args.d_model,
            "num_attention_heads": args.n_heads,
            "num_key_value_heads": args.n_heads,
            "num_hidden_layers": args.n_layers,
            "intermediate_size": args.mlp,
            "vocab_size": (vocab + 7) // 8 * 8,  # Dream's vocab_size is its embedding size
            "rope_theta": 10000.0,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "max_position_embeddings": 256,
            "bos_token_id": special["eos_token_id"],
        } | special
    return {
        "model_type": "llada",
        "architectures": ["LLaDAModelLM"],
        "d_model": args.d_model,
        "n_heads": args.n_heads,
        "n_kv_heads": args.n_heads,
        "n_layers": args.n_layers,
        "mlp_hidden_size": args.mlp,
        "vocab_size": vocab,
        "embedding_size": (vocab + 7) // 8 * 8,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "weight_tying": False,
        "include_bias": False,
        "max_sequence_length": 256,
    } | special


def build_model(config: dict[str, Any]) -> LLaDAModel | DreamModel:
    """A fresh model for `config`, with the attributes the decoder reads (as `load_model` sets
    them)."""
    if config["model_type"] == "Dream":
        model, shift = DreamModel(DreamConfig.from_dict(config)), 1
    else:
        model, shift = LLaDAModel(LLaDAConfig.from_dict(config)), 0
    model.mask_token_id, model.end_token_ids, model.logits_shift = (
        config["mask_token_id"],
        (config["eos_token_id"],),
        shift,
    )
    return model


def train_difficulty(args: argparse.Namespace) -> arith.Difficulty:
    return arith.Difficulty(
        args.train_min_steps,
        args.train_max_steps,
        args.max_operand,
        args.max_value,
        tuple(args.operations),
        args.min_start,
    )


def held_out_problems(args: argparse.Namespace) -> tuple[set[tuple[str, ...]], list[arith.Problem]]:
    """The canonical forms training never sees, and the validation problems logged during training.

    Held out (by `arith.canonical_form`, so every reordering too): the test and validation
    sets, and the sets the same seeds give at the training's own number range (2-4 steps),
    so that an easier curriculum stage has held-out problems of its own; those are its
    validation problems.
    """
    test, valid = arith.held_out_sets(valid_size=args.valid_size)
    own = dataclasses.replace(
        arith.TEST_DIFFICULTY,
        max_operand=args.max_operand,
        max_value=args.max_value,
        operations=tuple(args.operations),
        min_start=args.min_start,
    )
    own_test, own_valid = (
        arith.held_out_sets(own, args.valid_size) if own != arith.TEST_DIFFICULTY else (test, valid)
    )
    forms = {arith.canonical_form(p.question) for p in test + valid + own_test + own_valid}
    return forms, own_valid[: args.eval_size]


def encode_batch(
    tokenizer, problems: list[arith.Problem], gen_length: int
) -> dict[str, torch.Tensor]:
    """Left-padded prompts followed by EOS-padded answers of exactly `gen_length` tokens."""
    eos = tokenizer.eos_token_id
    prompts = [
        tokenizer(arith.format_prompt(p.question), add_special_tokens=False).input_ids
        for p in problems
    ]
    answers = [tokenizer(p.solution, add_special_tokens=False).input_ids for p in problems]
    width = max(map(len, prompts))
    ids, attn, first_eos = [], [], []
    for prompt, answer in zip(prompts, answers):
        if len(answer) >= gen_length:
            raise ValueError(
                f"solution of {len(answer)} tokens does not fit --gen-length {gen_length}"
            )
        pad = width - len(prompt)
        ids.append([eos] * pad + prompt + answer + [eos] * (gen_length - len(answer)))
        attn.append([0] * pad + [1] * (width + gen_length - pad))
        first_eos.append(len(answer))
    return {
        "input_ids": torch.tensor(ids),
        "attention_mask": torch.tensor(attn),
        "prompt_width": width,
        "answer_len": torch.tensor(first_eos),
    }


def training_problems(step: int, args, held_out: set[tuple[str, ...]]) -> list[arith.Problem]:
    """The problems of batch `step`: a function of (seed, step) only, never one whose
    canonical form is held out."""
    rng = random.Random(args.seed * 1_000_003 + step)
    difficulty = train_difficulty(args)
    problems: list[arith.Problem] = []
    while len(problems) < args.batch_size:
        problem = arith.make_problem(rng, difficulty)
        if arith.canonical_form(problem.question) not in held_out:
            if args.solution_order in (
                "any",
                "commuted",
            ):  # one of the problem's valid orders, uniformly
                orders = arith.solution_orders(problem, difficulty.max_value)
                problem = dataclasses.replace(problem, solution=rng.choice(orders))
            if args.solution_order in ("commuted", "aligned"):  # each addition either way round
                problem = dataclasses.replace(
                    problem, solution=arith.commute_additions(problem.solution, rng)
                )
            problems.append(problem)
    return problems


def training_batch(
    step: int, args, tokenizer, held_out: set[tuple[str, ...]]
) -> dict[str, torch.Tensor]:
    return encode_batch(tokenizer, training_problems(step, args, held_out), args.gen_length)


# --------------------------------------------------------------------------- objective


def diffusion_loss(model, batch, step: int, args, mask_id: int, device) -> torch.Tensor:
    """LLaDA's SFT loss: masked answer tokens, CE / t, normalised per answer length."""
    gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step + 7)
    ids, attn = batch["input_ids"], batch["attention_mask"]
    n, length = ids.shape
    L, start = args.gen_length, batch["prompt_width"]
    shift = model.logits_shift  # Dream: the prediction for position i sits at i-1
    eps = 1e-3
    # stratified t ~ U(eps, 1]: one ratio per sequence, spread evenly over the batch
    t = eps + (1 - eps) * ((torch.randperm(n, generator=gen) + torch.rand(n, generator=gen)) / n)
    masked = torch.rand(n, L, generator=gen) < t[:, None]
    positions = torch.arange(L)[None, :]
    weight = torch.where(positions <= batch["answer_len"][:, None], 1.0, args.pad_weight)
    noisy = ids.clone()
    noisy[:, start:][masked] = mask_id
    # positions count real tokens only, as the decoder numbers them
    positions_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(noisy.to(device), attn.to(device), positions_ids.to(device))[
        :, start - shift : start - shift + L
    ].float()
    ce = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        ids[:, start:].reshape(-1).to(device),
        reduction="none",
    ).view(n, L)
    per_token = ce * (masked.to(device) * weight.to(device)) / t[:, None].to(device)
    return (per_token.sum(1) / L).mean()


def lr_at(step: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.lr * (
        args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    )


def init_weights(model: LLaDAModel | DreamModel, n_layers: int) -> None:
    """GPT-2 style: N(0, 0.02), the residual branches' output projections scaled down."""
    for name, param in model.named_parameters():
        if param.dim() == 2:
            # LLaDA names its output head ff_out too, outside the blocks
            residual_out = (".blocks." in name or ".layers." in name) and name.endswith(
                ("attn_out.weight", "ff_out.weight", "o_proj.weight", "down_proj.weight")
            )
            torch.nn.init.normal_(
                param, std=0.02 / math.sqrt(2 * n_layers) if residual_out else 0.02
            )


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def greedy_accuracy(
    model, tokenizer, problems: list[arith.Problem], gen_length: int, device, batch_size: int = 250
) -> dict[str, float]:
    """Share of `problems` answered right at temperature 0, steps = L, blocks of L/16,
    overall (``acc``) and by number of steps (``acc_2``, ``acc_3``, ...)."""
    from lm_eval_dvoting.core.answers import extract_answer
    from lm_eval_dvoting.core.decoding import default_block_length, generate

    model.eval()
    right: dict[int, list[bool]] = {}
    for i in range(0, len(problems), batch_size):
        chunk = problems[i : i + batch_size]
        enc = tokenizer(
            [arith.format_prompt(p.question) for p in chunk],
            add_special_tokens=False,
            padding=True,
            return_tensors="pt",
        )
        out = generate(
            model,
            enc.input_ids.to(device),
            enc.attention_mask.to(device),
            gen_length=gen_length,
            block_length=default_block_length(gen_length),
            steps=gen_length,
        )
        for problem, row in zip(chunk, out.tokens.tolist()):
            text = tokenizer.decode(row, skip_special_tokens=False).split(EOS)[0]
            right.setdefault(problem.steps, []).append(
                extract_answer(text, "number") == str(problem.answer)
            )
    model.train()
    every = [ok for oks in right.values() for ok in oks]
    return {"acc": sum(every) / len(every)} | {
        f"acc_{k}": round(sum(v) / len(v), 3) for k, v in sorted(right.items())
    }


# --------------------------------------------------------------------------- checkpoints


def export_checkpoint(
    model: LLaDAModel, config: dict[str, Any], tokenizer, folder: Path, note: dict
) -> None:
    """Write a LLaDA checkpoint folder that `load_model` / `load_tokenizer` read."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()
    }
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(strict_json.dumps(config, indent=2) + "\n")
    tokenizer.save_pretrained(str(folder))
    state = strict_json.dumps(note, indent=2, default=str)
    (folder / "training_state.json").write_text(state + "\n")


def save_state(path: Path, **state: Any) -> None:
    """The resumable training state: tensors, plain numbers, strings, lists and dicts only,
    so that `load_state` can read it with `weights_only=True`."""
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def load_state(path: Path, device: torch.device) -> dict[str, Any]:
    """The state `save_state` wrote, read with `torch.load(weights_only=True)`.

    `weights_only=True` unpickles tensors and plain containers only, never arbitrary Python
    objects, so a tampered `last.pt` cannot run code; a file holding anything else is refused.
    """
    import pickle

    try:
        return torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as err:
        raise SystemExit(
            f"{path} holds more than tensors and plain values, so it is not loaded "
            "(weights_only=True): it was not written by this script, or was tampered with; delete "
            f"it to start afresh ({err})"
        ) from None


def evaluate(checkpoint: str, args: argparse.Namespace) -> dict[str, float]:
    """Greedy (single-sample) accuracy of a checkpoint on the shipped test set."""
    from lm_eval_dvoting.models.loading import load_model, load_tokenizer

    model = load_model(checkpoint, device=args.device)
    tokenizer = load_tokenizer(checkpoint)
    test = [
        arith.Problem(r["question"], r["solution"], r["answer"], r["steps"])
        for r in arith.read_test_set()
    ]
    scores = greedy_accuracy(model, tokenizer, test, args.gen_length, args.device)
    print(json.dumps({"checkpoint": str(checkpoint), "test_problems": len(test)} | scores))
    return scores


@dataclasses.dataclass
class Training:
    """One training run's parts: what the loop, the evaluations and the checkpoints share.

    `step` and `best` (the best validation accuracy so far, its step and which weights,
    "model" or "ema") change as the run goes; the rest is fixed once the run is built.
    """

    args: argparse.Namespace
    device: torch.device
    tokenizer: Any
    config: dict[str, Any]
    model: LLaDAModel | DreamModel
    ema: LLaDAModel | DreamModel
    optimizer: torch.optim.Optimizer
    held_out: set[tuple[str, ...]]
    valid: list[arith.Problem]
    step: int = 0
    best: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"acc": -1.0, "step": None, "which": None}
    )

    @property
    def last(self) -> Path:
        """The resumable state's file."""
        return self.args.out / "last.pt"

    def nets(self) -> list[tuple[str, LLaDAModel | DreamModel]]:
        """The weights evaluated and exported: the raw model, and its moving average if on."""
        return [("model", self.model)] + ([("ema", self.ema)] if self.args.ema > 0 else [])


def make_optimizer(model: LLaDAModel | DreamModel, args: argparse.Namespace) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices only (not on embeddings, norms or biases)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        is_embedding = "wte" in name or "embed_tokens" in name
        (decay if param.dim() == 2 and not is_embedding else no_decay).append(param)
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.98),
    )


def build_training(args: argparse.Namespace) -> Training:
    """A fresh run: seeded random init, its moving average, the optimiser, the data split.
    (The order of the random draws is the checkpoints': do not reorder.)"""
    device = torch.device(args.device)
    tokenizer = build_tokenizer()
    config = model_config(args, tokenizer)
    held_out, valid = held_out_problems(args)
    torch.manual_seed(args.seed)
    model = build_model(config)
    init_weights(model, args.n_layers)
    model.to(device).train()
    ema = build_model(config).to(device)
    ema.load_state_dict(model.state_dict())
    ema.requires_grad_(False)
    optimizer = make_optimizer(model, args)
    return Training(args, device, tokenizer, config, model, ema, optimizer, held_out, valid)


def resume(run: Training) -> None:
    """Continue from `last.pt` if this run was begun before, else start from --init-from's
    weights if given."""
    args = run.args
    if run.last.exists():
        state = load_state(run.last, run.device)
        if state["args"]["steps"] != args.steps or state["args"]["seed"] != args.seed:
            print(
                f"warning: {run.last} was made with different --steps/--seed; continuing with "
                "the new ones"
            )
        run.model.load_state_dict(state["model"])
        run.ema.load_state_dict(state["ema"])
        run.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        run.step, run.best = state["step"], state["best"]
        print(f"resumed from {run.last} at step {run.step}")
    elif args.init_from is not None:
        from safetensors.torch import load_file

        weights = load_file(str(args.init_from / "model.safetensors"))
        run.model.load_state_dict(weights)
        run.ema.load_state_dict(weights)
        print(f"initialised from {args.init_from}")


def checkpoint(run: Training) -> None:
    """Write `last.pt`: everything a later sitting needs to go on as if never stopped."""
    save_state(
        run.last,
        model=run.model.state_dict(),
        ema=run.ema.state_dict(),
        optimizer=run.optimizer.state_dict(),
        torch_rng=torch.get_rng_state(),
        step=run.step,
        best=run.best,
        args={k: str(v) if isinstance(v, Path) else v for k, v in vars(run.args).items()},
    )


def train_step(run: Training) -> float:
    """One optimisation step on batch `run.step`, the moving average following; its loss."""
    args = run.args
    for group in run.optimizer.param_groups:
        group["lr"] = lr_at(run.step, args)
    batch = training_batch(run.step, args, run.tokenizer, run.held_out)
    mask_id = run.config["mask_token_id"]
    loss = diffusion_loss(run.model, batch, run.step, args, mask_id, run.device)
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(run.model.parameters(), 1.0)
    run.optimizer.step()
    with torch.no_grad():
        d = args.ema if args.ema > 0 else 0.0
        for pe, pm in zip(run.ema.parameters(), run.model.parameters()):
            pe.lerp_(pm, 1 - d)
    run.step += 1
    return loss.item()


def validation_scores(run: Training, net: LLaDAModel | DreamModel, which: str) -> dict[str, Any]:
    """`net`'s greedy validation accuracy (overall and by chain length) and, with
    --eval-strategies, each strategy's, as log fields named for `which` weights."""
    scores = greedy_accuracy(net, run.tokenizer, run.valid, run.args.gen_length, run.device)
    record = {
        f"valid_acc_{which}": scores["acc"],
        f"valid_by_steps_{which}": {k: v for k, v in scores.items() if k != "acc"},
    }
    if run.args.eval_strategies:
        net.eval()
        record[f"valid_strategies_{which}"] = score_strategies(
            net,
            run.tokenizer,
            run.args.eval_strategies,
            run.valid,
            max_rows=len(run.valid) if run.device.type == "cuda" else 64,
        )
        net.train()
    return record


def evaluate_and_export(run: Training) -> dict[str, Any]:
    """Score every net on the validation problems; export to OUT/best/ each that beats the
    best so far. The log fields."""
    record: dict[str, Any] = {}
    for which, net in run.nets():
        record |= validation_scores(run, net, which)
        acc = record[f"valid_acc_{which}"]
        if acc > run.best["acc"]:
            run.best = {"acc": acc, "step": run.step, "which": which}
            note = {"step": run.step, "weights": which, "valid_acc": acc, "args": vars(run.args)}
            export_checkpoint(net, run.config, run.tokenizer, run.args.out / "best", note)
    return record


def export_snapshots(run: Training) -> None:
    """Both weights (raw and moving average) as checkpoint folders under OUT/snapshots/."""
    for which, net in (("model", run.model), ("ema", run.ema)):
        folder = run.args.out / "snapshots" / f"step-{run.step}-{which}"
        note = {"step": run.step, "weights": which, "args": vars(run.args)}
        export_checkpoint(net, run.config, run.tokenizer, folder, note)


class LossWindow:
    """The losses and time since the last log line: its mean loss and throughput."""

    def __init__(self) -> None:
        self.began, self.total, self.n = time.time(), 0.0, 0

    def add(self, loss: float) -> None:
        self.total, self.n = self.total + loss, self.n + 1

    def fields(self, run: Training) -> dict[str, Any]:
        """The log line's step, mean loss, learning rate and sequences per second."""
        seconds = time.time() - self.began
        return {
            "step": run.step,
            "loss": round(self.total / self.n, 4),
            "lr": lr_at(run.step - 1, run.args),
            "seq_per_s": round(self.n * run.args.batch_size / seconds, 1),
        }


def log_evaluation(run: Training, window: LossWindow, began: float, log) -> None:
    """Evaluate, export the best, and write the log line (stdout and OUT/log.jsonl)."""
    record = window.fields(run) | evaluate_and_export(run)
    record["best"] = run.best
    record["elapsed_min"] = round((time.time() - began) / 60, 2)
    print(json.dumps(record), flush=True)
    log.write(strict_json.dumps(record) + "\n")  # a NaN loss: null
    log.flush()


def sitting_over(run: Training, began: float) -> bool:
    """Whether --max-minutes or --stop-at ends this sitting now."""
    args = run.args
    out_of_time = args.max_minutes is not None and time.time() - began > args.max_minutes * 60
    return out_of_time or run.step == args.stop_at


def train_loop(run: Training, log) -> float:
    """Train until --steps or the sitting's end, evaluating, snapshotting and checkpointing
    on schedule; the last step's loss (NaN if no step ran)."""
    args = run.args
    began, window, loss_value = time.time(), LossWindow(), float("nan")
    while run.step < args.steps:
        loss_value = train_step(run)
        window.add(loss_value)
        if run.step % args.eval_every == 0 or run.step == args.steps:
            log_evaluation(run, window, began, log)
            window = LossWindow()
        at_snapshot = args.snapshot_every and run.step % args.snapshot_every == 0
        if at_snapshot and run.step >= args.snapshot_from:
            export_snapshots(run)
        if run.step % args.ckpt_every == 0 or run.step == args.steps:
            checkpoint(run)
        if sitting_over(run, began):
            checkpoint(run)
            print(f"sitting over at step {run.step}; rerun the same command to resume")
            break
    return loss_value


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train (or resume, or with --evaluate only score a checkpoint); the run's final step,
    loss, best validation figures and both weights."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.evaluate:
        return evaluate(args.evaluate, args)
    args.out.mkdir(parents=True, exist_ok=True)
    run = build_training(args)
    resume(run)
    n_params = sum(p.numel() for p in run.model.parameters())
    print(
        f"model: {n_params / 1e6:.2f} M parameters; training to step {args.steps}; out {args.out}"
    )
    with (args.out / "log.jsonl").open("a") as log:
        loss_value = train_loop(run, log)
    return {
        "step": run.step,
        "loss": loss_value,
        "best": run.best,
        "model": run.model,
        "ema": run.ema,
    }


if __name__ == "__main__":
    main()
