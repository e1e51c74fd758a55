"""Choose the demo checkpoint from the learning curve, on validation problems only.

    python -m lm_eval_dvoting.demo.sweep runs/sweep/snapshots/step-*-model \
        --strategies single dvoting

For every checkpoint folder, runs each strategy (temperature, steps and block length as
the harness defaults: L = 32, blocks of 2) on the validation problems of
`arith.held_out_sets` (seed ``VALID_SEED``, disjoint from the test set and from
training) and prints one JSON line per checkpoint: accuracy and mean NFE per strategy.
The test set is never read here, so choosing the shipped checkpoint with this table
does not tune anything on the numbers the README reports.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Callable

import torch

from lm_eval_dvoting.core.answers import extract_answer
from lm_eval_dvoting.core.strategies import derive_seed, run_strategy
from lm_eval_dvoting.demo import arith
from lm_eval_dvoting.demo.tokenizer import EOS

GEN_LENGTH = 32


def row_kwargs(row: str) -> dict:
    """`run_strategy` keywords of a strategy or of one of `dvoting compare`'s rows
    (`single-entropy`, `majority-entropy`: the same definitions, on the default settings)."""
    from lm_eval_dvoting.commands.compare import ROWS, row_overrides
    from lm_eval_dvoting.core.strategies import StrategySettings

    if row not in ROWS:
        raise ValueError(f"unknown strategy or row {row!r}; choose from {', '.join(ROWS)}")
    strategy, overrides = row_overrides(row, StrategySettings(gen_length=GEN_LENGTH))
    return {"strategy": strategy, **overrides}


def sweep_checkpoint(
    checkpoint: str,
    strategies: list[str],
    problems: list[arith.Problem],
    max_rows: int = 64,
    salt: str = "sweep",
    device: str = "cpu",
) -> dict[str, dict[str, float]]:
    """Accuracy and mean NFE of each strategy on `problems` for one checkpoint folder."""
    from lm_eval_dvoting.models.loading import load_model, load_tokenizer

    model = load_model(checkpoint, device=device)
    return score_strategies(model, load_tokenizer(checkpoint), strategies, problems, max_rows, salt)


def answer_reader(tokenizer) -> Callable[[torch.Tensor], str | None]:
    """A decoded row's number answer (its text up to the first end-of-text), as the task
    reads it."""

    def extract(ids: torch.Tensor) -> str | None:
        text = tokenizer.decode(ids.tolist(), skip_special_tokens=False).split(EOS)[0]
        return extract_answer(text, "number")

    return extract


def score_strategy(
    model, prompts, strategy: str, problems: list[arith.Problem], **run_keywords
) -> dict[str, float]:
    """One strategy's accuracy, mean NFE and seconds on `problems` (`prompts`: their
    tokenised, left-padded prompts)."""
    began = time.perf_counter()
    results = run_strategy(
        model,
        prompts.input_ids,
        prompts.attention_mask,
        gen_length=GEN_LENGTH,
        **run_keywords,
        **row_kwargs(strategy),
    )
    right = [r.answers[r.chosen] == str(p.answer) for r, p in zip(results, problems)]
    return {
        "acc": round(sum(right) / len(right), 4),
        "nfe": round(sum(r.nfe for r in results) / len(results), 2),
        "seconds": round(time.perf_counter() - began, 1),
    }


@torch.no_grad()
def score_strategies(
    model,
    tokenizer,
    strategies: list[str],
    problems: list[arith.Problem],
    max_rows: int = 64,
    salt: str = "sweep",
) -> dict[str, dict[str, float]]:
    """Accuracy and mean NFE of each strategy on `problems` for a loaded model.

    Every question's samples are seeded from (`salt`, question): another salt draws
    other samples, to tell the sampling noise from a checkpoint's real behaviour.
    """
    prompts = tokenizer(
        [arith.format_prompt(p.question) for p in problems],
        add_special_tokens=False,
        padding=True,
        return_tensors="pt",
    )
    keywords = {
        "extract": answer_reader(tokenizer),
        "row_seeds": [derive_seed(salt, p.question) for p in problems],
        "max_rows": max_rows,
    }
    return {s: score_strategy(model, prompts, s, problems, **keywords) for s in strategies}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The sweep's checkpoints, strategies and validation problems."""
    p = argparse.ArgumentParser(
        prog="python -m lm_eval_dvoting.demo.sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("checkpoints", nargs="+", help="checkpoint folders")
    p.add_argument(
        "--strategies",
        nargs="+",
        default=["single", "dvoting"],
        help="strategies, or the ablation rows single-entropy and majority-entropy "
        "(as in `dvoting compare`)",
    )
    p.add_argument(
        "--limit",
        type=int,
        default=arith.VALID_SIZE,
        help="validation problems (the first LIMIT of the validation stream)",
    )
    p.add_argument("--salt", default="sweep", help="seeds the samples (with each question)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--max-rows", type=int, default=64, help="rows decoded per forward pass")
    return p.parse_args(argv)


def gains_over_single(scores: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each strategy's accuracy minus single's, in points ({} without a single row)."""
    return {
        s: round(100 * (v["acc"] - scores["single"]["acc"]), 1)
        for s, v in scores.items()
        if s != "single" and "single" in scores
    }


def main(argv: list[str] | None = None) -> None:
    """Print one JSON line per checkpoint: each strategy's scores and gain over single."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    _, problems = arith.held_out_sets(valid_size=args.limit)
    for checkpoint in args.checkpoints:
        scores = sweep_checkpoint(
            checkpoint, args.strategies, problems, args.max_rows, args.salt, args.device
        )
        line = {"checkpoint": str(Path(checkpoint)), "problems": len(problems), "salt": args.salt}
        gains = {"points_over_single": gains_over_single(scores)}
        print(json.dumps(line | scores | gains), flush=True)


if __name__ == "__main__":
    main()
