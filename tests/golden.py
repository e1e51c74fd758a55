"""Golden outputs of the decoder and the strategies, captured before the decoder was split
into units (issue 20), so that any later change to how rows are decoded shows up as a
changed sample, NFE count or chosen sample.

    .venv/bin/python tests/golden.py            # compare with tests/fixtures/golden_decoding.json
    .venv/bin/python tests/golden.py --write    # capture anew (only for an intended change)

What is captured: for both demo models (`tiny-arith`, LLaDA; `tiny-arith-dream`, Dream),
every strategy (single and majority with both decoders, hex with 25 and 5 samples,
dvoting), greedy and sampled, random remasking, a block length with several steps per
block and Fast-dLLM's prefix cache, at two seeds, for 16 held-out demo questions decoded
16 rows at a time. Per question: a digest of every sample's tokens, each sample's NFE and
the chosen sample. The test (tests/test_golden_decoding.py) also decodes one row at a
time and must find the same.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "golden_decoding.json"
MODELS = ("tiny-arith", "tiny-arith-dream")
QUESTIONS = 16
SEEDS = (0, 7)
GEN_LENGTH = 32
# name -> run_strategy keyword arguments (gen_length, seed, extract added per run)
CONFIGS: dict[str, dict[str, Any]] = {
    "single": dict(strategy="single"),
    "single-T0.9": dict(strategy="single", temperature=0.9),
    "single-random": dict(strategy="single", temperature=0.9, remasking="random"),
    "single-block8-steps16": dict(strategy="single", block_length=8, steps=16, temperature=0.6),
    # 3 steps for a block's 8 masks: 3, 3, 2 (the remainder goes to the earliest steps)
    "single-block8-steps12": dict(strategy="single", block_length=8, steps=12),
    "single-entropy": dict(strategy="single", decoder="entropy"),
    "single-entropy-T0.6": dict(strategy="single", decoder="entropy", temperature=0.6),
    "majority": dict(strategy="majority", n=3),
    "majority-entropy": dict(strategy="majority", decoder="entropy", temperature=0.6, n=3),
    "hex": dict(strategy="hex"),
    "hex5": dict(strategy="hex", hex_samples=5),
    "dvoting": dict(strategy="dvoting"),
    "dvoting-T0": dict(strategy="dvoting", temperature=0.0),
    "dvoting-block8-tau0.6": dict(strategy="dvoting", block_length=8, tau=0.6, alpha=0.1),
    "prefix-single-block8": dict(
        strategy="single", block_length=8, steps=16, temperature=0.6, prefix_cache=True
    ),
    "prefix-dvoting-block8": dict(strategy="dvoting", block_length=8, prefix_cache=True),
}


def _inputs(name: str, questions: int) -> tuple[torch.nn.Module, Any, torch.Tensor, torch.Tensor]:
    from lm_eval_dvoting.demo import arith
    from lm_eval_dvoting.models.loading import load_model, load_tokenizer

    tokenizer = load_tokenizer(name)
    questions = [arith.format_prompt(p["question"]) for p in arith.read_test_set()[:questions]]
    enc = tokenizer(questions, add_special_tokens=False, padding=True, return_tensors="pt")
    return (
        load_model(name, device="cpu", dtype="float32"),
        tokenizer,
        enc.input_ids,
        enc.attention_mask,
    )


def _digest(samples: torch.Tensor) -> str:
    return hashlib.sha256(json.dumps(samples.tolist()).encode()).hexdigest()[:16]


def capture(
    models: tuple[str, ...] = MODELS,
    max_rows: int = QUESTIONS,
    seeds: tuple[int, ...] = SEEDS,
    questions: int = QUESTIONS,
) -> dict[str, Any]:
    """{model: {config: {seed: [[digest, sample_nfe, chosen], ...per question]}}}, over the
    first `questions` demo test questions, decoded `max_rows` rows at a time."""
    from lm_eval_dvoting.core.answers import extract_answer
    from lm_eval_dvoting.core.strategies import run_strategy

    out: dict[str, Any] = {}
    for name in models:
        model, tokenizer, ids, mask = _inputs(name, questions)

        def extract(tokens: torch.Tensor) -> str | None:
            return extract_answer(
                tokenizer.decode(tokens.tolist(), skip_special_tokens=True), "number"
            )

        out[name] = {}
        for config, kwargs in CONFIGS.items():
            out[name][config] = {}
            for seed in seeds:
                results = run_strategy(
                    model,
                    ids,
                    mask,
                    extract=extract,
                    gen_length=GEN_LENGTH,
                    seed=seed,
                    max_rows=max_rows,
                    **kwargs,
                )
                out[name][config][str(seed)] = [
                    [_digest(r.samples), r.sample_nfe, r.chosen] for r in results
                ]
    return out


def differences(expected: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """One line per question whose samples, NFE or chosen sample differ."""
    lines = []
    for name, configs in expected.items():
        for config, seeds in configs.items():
            for seed, questions in seeds.items():
                got = found.get(name, {}).get(config, {}).get(seed)
                if got is None:
                    lines.append(f"{name} {config} seed {seed}: not captured")
                    continue
                for q, (want, have) in enumerate(zip(questions, got)):
                    if want != have:
                        lines.append(
                            f"{name} {config} seed {seed} question {q}: expected {want}, got {have}"
                        )
    return lines


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    found = capture()
    if "--write" in sys.argv:
        GOLDEN.write_text(json.dumps(found, indent=0, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {GOLDEN}")
    else:
        diff = differences(json.loads(GOLDEN.read_text(encoding="utf-8")), found)
        print("\n".join(diff) or "all outputs as captured")
        sys.exit(1 if diff else 0)
