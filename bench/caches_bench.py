"""Suite `caches`: Fast-dLLM's key/value caches (`cache=none|prefix|dual`): step time at LLaDA-8B's
shape, accuracy and speed on the demo. Writes its own section of BENCHMARKS.md.

    # the full run (30-60 min on 2 busy cores)
    OMP_NUM_THREADS=1 .venv/bin/python -m bench caches
    # a smoke run
    OMP_NUM_THREADS=1 .venv/bin/python -m bench caches --quick --out /tmp/B.md
    # go on from --json (bench/results/caches_bench.json) after a crash
    OMP_NUM_THREADS=1 .venv/bin/python -m bench caches --resume
    # rewrite the section from --json
    OMP_NUM_THREADS=1 .venv/bin/python -m bench caches --report-only

Part 1, real shape: a random-weight LLaDA at LLaDA-8B's width (d_model 4096, 32 heads,
MLP 12,288, vocabulary 126,464) with `--layers` of its 32 layers, one row, prompt 256 +
generation 256, block 32. Single `RowDecoder.step()` calls are timed, each classed as a
*full* pass (over the whole sequence: every step of `none`, a row's first step in a block
otherwise) or a *reuse* pass (over the block and what follows for `prefix`, the block alone
for `dual`) by what the model's `hidden_states` receives. The fixed schedule as `single`
runs it (steps = 256: 32 steps per block of 32, one commit each) is timed over whole
blocks: `none` in the first block (every `none` pass covers the whole sequence, so every
block costs the same), `prefix` and `dual` in the first and in the last block (earlier
blocks pre-filled), since `prefix`'s reuse pass shrinks as the block moves right. The
cells of a repeat run side by side, one step of each in turn, so that the load of the
shared machine, which drifts over minutes, hits every cache alike. The entropy rule
(dVoting's, alpha 0.3, temperature 0.6) is timed over the first steps of the first block
only: random weights give near-uniform logits, so it commits one token per step here, and
its steps per block come from the demo (part 2).

Part 2, demo: the shipped `tiny-arith` (LLaDA) and `tiny-arith-dream` (Dream) on the 500
held-out problems, `single` (greedy: one seed) and `dvoting` (seeds 0, 1, 2) with each
cache, via `run_strategy(..., cache=...)`, 16 rows per pass; scored as the `dvoting_arith`
task scores (text up to the first end token, `extract_answer(..., "number")`, equal to the
target). Every forward pass is classed full or reuse as above, per row.

Every finished demo cell and real-shape repeat is written to `--json` at once, so a crash
loses little (`--resume` skips what is found there). The section goes between the marker lines
`<!-- caches_bench:start -->` and `<!-- caches_bench:end -->` of `--out` (appended when
absent); nothing else in the file is touched.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from typing import Any, Callable

import torch

from bench.common import (
    RESULTS,
    add_output_flags,
    add_quick_flag,
    add_real_shape_arguments,
    add_threads_flag,
    args_record,
    command_line,
    load_average,
    load_json,
    markers,
    run_facts,
    save_json,
    uptime,
    write_section,
)
from bench.timing import TimedModel
from bench.workloads import real_shape_workload
from lm_eval_dvoting.core.decoding import DecodeRow, RowDecoder

CACHES = ("none", "prefix", "dual")
START, END = markers("caches_bench")
FULL_DEPTH = 32  # LLaDA-8B's layers, for the extrapolated column
ENTROPY_RULE = {"alpha": 0.3, "temperature": 0.6}  # dVoting's defaults
Results = dict[str, Any]


# ----------------------------------------------------------------- counting passes


class PassCounter(TimedModel):
    """`TimedModel` that also classes every forward pass as full or reuse.

    A reuse pass is one given kept keys/values to attend to (`cache.keys` non-empty);
    a full pass runs over the whole sequence (with no cache, or with an empty one that
    only records). Counted per call and per row (the call's batch size): the rows are
    what the compute scales with.
    """

    def reset(self) -> None:
        super().reset()
        self.calls = {"full": 0, "reuse": 0}
        self.rows = {"full": 0, "reuse": 0}
        self.last_kind, self.last_width = "", 0

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
    ) -> torch.Tensor:
        kind = "reuse" if cache is not None and cache.keys else "full"
        self.calls[kind] += 1
        self.rows[kind] += int(input_ids.shape[0])
        self.last_kind, self.last_width = kind, int(input_ids.shape[1])
        return super().hidden_states(input_ids, attention_mask, position_ids, cache)


# ----------------------------------------------------------------- part 1: real shape


def real_rule(rule: str, gen_length: int) -> dict[str, Any]:
    """The row settings of a rule: `single`'s fixed schedule (steps = L, greedy) or dVoting's
    threshold."""
    return {"steps": gen_length, "temperature": 0.0} if rule == "fixed" else dict(ENTROPY_RULE)


def entering_decoder(
    model: PassCounter,
    prompt: torch.Tensor,
    args: argparse.Namespace,
    rule: str,
    cache: str,
    block_index: int,
    rows: int = 1,
) -> RowDecoder:
    """A decoder holding `rows` rows (the same prompt, each its own noise) about to enter block
    `block_index` (earlier blocks pre-filled); the noise is drawn on the prompt's device."""
    mask_id = int(model.mask_token_id)
    decoder = RowDecoder(model)
    for r in range(rows):
        tokens = torch.full((args.gen_length,), mask_id, dtype=torch.long)
        filled = block_index * args.block
        tokens[:filled] = torch.randint(
            0, 126_000, (filled,), generator=torch.Generator().manual_seed(5 + r)
        )
        row = DecodeRow(
            prompt=prompt,
            tokens=tokens,
            block_length=args.block,
            cache=cache,
            generator=torch.Generator(device=prompt.device).manual_seed(6 + r),
            **real_rule(rule, args.gen_length),
        )
        decoder.add(row)
        # add() starts the fixed schedule at block 0; it walks blocks by count, not by
        # masks, so point it at the block we time (the entropy rule finds it by itself)
        row.progress.block = block_index
    return decoder


def timed_steps(model: PassCounter, decoder: RowDecoder, count: int) -> list[dict[str, Any]]:
    """Wall, forward, head seconds and pass kind of each of the next `count` steps."""
    steps = []
    for _ in range(count):
        if not decoder.active:
            break
        model.reset()
        start = time.perf_counter()
        decoder.step()
        wall = time.perf_counter() - start
        steps.append(
            {
                "wall": wall,
                "forward": model.seconds,
                "head": model.head_seconds,
                "kind": model.last_kind,
                "width": model.last_width,
                "passes": model.passes,
            }
        )
    return steps


def real_cells(args: argparse.Namespace) -> list[tuple[str, str, int, int]]:
    """(rule, cache, block index, steps to time) of every real-shape cell."""
    last, per_block = args.gen_length // args.block - 1, args.block  # steps = L: one step per token
    cells = [("fixed", "none", 0, per_block)]
    cells += [("fixed", cache, b, per_block) for cache in ("prefix", "dual") for b in (0, last)]
    cells += [("entropy", cache, 0, args.entropy_steps) for cache in CACHES]
    return cells


def run_repeat(
    model: PassCounter,
    prompt: torch.Tensor,
    args: argparse.Namespace,
    repeat: int,
    rows: int = 1,
    warm_up: int = 0,
) -> Results:
    """One repeat of every real-shape cell, stepped round-robin (one step of each cell in turn),
    so that the other processes' load, which drifts over minutes here, hits every cache alike.
    `warm_up` untimed steps of a throwaway `none` row go first (on a GPU the first step of a
    repeat cost ~20x a later one)."""
    if warm_up:
        timed_steps(model, entering_decoder(model, prompt, args, "fixed", "none", 0, rows), warm_up)
    cells = {
        f"{rule}/{cache}/block{b}/repeat{repeat}": (
            entering_decoder(model, prompt, args, rule, cache, b, rows),
            count,
        )
        for rule, cache, b, count in real_cells(args)
    }
    timings: Results = {key: [] for key in cells}
    while True:
        pending = [
            key
            for key, (decoder, count) in cells.items()
            if len(timings[key]) < count and decoder.active
        ]
        if not pending:
            return timings
        for key in pending:
            timings[key] += timed_steps(model, cells[key][0], 1)


def run_real(args: argparse.Namespace, results: Results, save: Callable[[], None]) -> None:
    """Part 1: every real-shape cell, `--repeats` times; saved after each repeat."""
    work = real_shape_workload(args)
    results["real_description"] = work.description
    model = PassCounter(work.model)
    real = results.setdefault("real", {})
    for repeat in range(args.repeats):
        if any(key.endswith(f"/repeat{repeat}") for key in real):
            continue
        real.update(run_repeat(model, work.prompts[0], args, repeat))
        walls = {
            key.rsplit("/", 1)[0]: sum(s["wall"] for s in steps)
            for key, steps in real.items()
            if key.endswith(f"/repeat{repeat}")
        }
        print(
            f"  [real] repeat {repeat}: " + ", ".join(f"{k} {v:.0f} s" for k, v in walls.items()),
            flush=True,
        )
        save()


# ----------------------------------------------------------------- part 2: demo


def demo_inputs(name: str, count: int) -> dict[str, Any]:
    """The demo model, its tokenizer, the first `count` test prompts (padded) and targets."""
    from lm_eval_dvoting.demo import arith
    from lm_eval_dvoting.models.loading import load_model, load_tokenizer

    tokenizer = load_tokenizer(name)
    records = arith.read_test_set()[:count]
    encoded = tokenizer(
        [arith.format_prompt(r["question"]) for r in records],
        add_special_tokens=False,
        padding=True,
        return_tensors="pt",
    )
    model = PassCounter(load_model(name, device="cpu", dtype="float32"))
    return {
        "model": model,
        "tokenizer": tokenizer,
        "ids": encoded.input_ids,
        "mask": encoded.attention_mask,
        "targets": [str(r["answer"]) for r in records],
    }


def answer_extractor(
    tokenizer: Any, end_ids: tuple[int, ...]
) -> Callable[[torch.Tensor], str | None]:
    """The harness's reading of a sample: text up to the first end token, its number (task
    `dvoting_arith`)."""
    from lm_eval_dvoting.core.answers import extract_answer

    ends = set(end_ids)

    def extract(tokens: torch.Tensor) -> str | None:
        ids = tokens.tolist()
        cut = next((i for i, t in enumerate(ids) if t in ends), len(ids))
        return extract_answer(tokenizer.decode(ids[:cut], skip_special_tokens=True), "number")

    return extract


def blocks_decoded(result: Any, gen_length: int, block: int) -> int:
    """Blocks that had a mask when each sample started (a dVoting remask sample keeps some whole
    blocks)."""
    total = 0
    for kept in result.kept:
        kept_set = set(kept or [])
        total += sum(
            any(p not in kept_set for p in range(b, b + block)) for b in range(0, gen_length, block)
        )
    return total


def demo_accuracy(targets: list[str], out: list[Any]) -> float:
    """The share of questions whose chosen answer equals the target, as the task scores."""
    from lm_eval_dvoting.core.answers import answers_equivalent

    chosen = [r.answers[r.chosen] for r in out]
    return sum(answers_equivalent(t, a, "number") for t, a in zip(targets, chosen)) / len(out)


def demo_cell(
    inputs: dict[str, Any], strategy: str, cache: str, seed: int, args: argparse.Namespace
) -> Results:
    """One run of a strategy with a cache over the demo questions: accuracy, NFE, wall, passes."""
    from lm_eval_dvoting.core.strategies import run_strategy

    model = inputs["model"]
    model.reset()
    start = time.perf_counter()
    out = run_strategy(
        model,
        inputs["ids"],
        inputs["mask"],
        strategy=strategy,
        gen_length=args.demo_gen_length,
        extract=answer_extractor(inputs["tokenizer"], model.end_token_ids),
        seed=seed,
        cache=cache,
        max_rows=args.max_rows,
    )
    wall = time.perf_counter() - start
    block = args.demo_gen_length // 16  # the strategies' default block length, L/16
    return {
        "strategy": strategy,
        "cache": cache,
        "seed": seed,
        "questions": len(out),
        "wall": wall,
        "accuracy": demo_accuracy(inputs["targets"], out),
        "nfe": sum(r.nfe for r in out) / len(out),
        "forward": model.seconds,
        "calls": dict(model.calls),
        "rows": dict(model.rows),
        "blocks": sum(blocks_decoded(r, args.demo_gen_length, block) for r in out),
        "digests": [
            hashlib.sha256(json.dumps(r.samples.tolist()).encode()).hexdigest()[:16] for r in out
        ],
    }


def run_demo(args: argparse.Namespace, results: Results, save: Callable[[], None]) -> None:
    """Part 2: each demo model, strategy, seed and cache (caches innermost, so load drifts hit them
    alike)."""
    demo = results.setdefault("demo", {})
    for name in args.models:
        inputs = demo_inputs(name, args.questions)
        for strategy in ("single", "dvoting"):
            seeds = (
                args.seeds[:1] if strategy == "single" else args.seeds
            )  # single is greedy: seeds agree
            for seed in seeds:
                for cache in CACHES:
                    key = f"{name}/{strategy}/{cache}/seed{seed}"
                    if key in demo:
                        continue
                    demo[key] = {"model": name, **demo_cell(inputs, strategy, cache, seed, args)}
                    cell = demo[key]
                    print(
                        f"  [demo] {key}: accuracy {cell['accuracy']:.3f}, NFE {cell['nfe']:.2f}, "
                        f"{cell['wall']:.1f} s",
                        flush=True,
                    )
                    save()


# ----------------------------------------------------------------- summaries


def median_over_repeats(
    real: Results, prefix: str, measure: Callable[[list[dict[str, Any]]], float]
) -> float:
    """The median over repeats of `measure` applied to each repeat's steps of one cell."""
    values = [
        measure(steps)
        for key, steps in real.items()
        if key.startswith(prefix + "/repeat") and steps
    ]
    return statistics.median(values) if values else float("nan")


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def fixed_block(real: Results, cache: str, block_index: int, scale: float) -> dict[str, float]:
    """One block of the fixed schedule: first (full) step, mean reuse step, block total, reuse
    width.

    `scale` multiplies each step's body time (forward pass less the head) to extrapolate
    to another depth: scale 1 is what was measured.
    """

    def wall(step: dict[str, Any]) -> float:
        return step["wall"] + (scale - 1) * (step["forward"] - step["head"])

    def reuse(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [x for x in steps if x["kind"] == "reuse"]

    prefix = f"fixed/{cache}/block{block_index}"
    return {
        "full": median_over_repeats(real, prefix, lambda s: wall(s[0])),
        "reuse": median_over_repeats(real, prefix, lambda s: mean([wall(x) for x in reuse(s)])),
        "total": median_over_repeats(real, prefix, lambda s: sum(wall(x) for x in s)),
        "head": median_over_repeats(real, prefix, lambda s: mean([x["head"] for x in s])),
        "width": median_over_repeats(real, prefix, lambda s: mean([x["width"] for x in reuse(s)])),
    }


def per_question(real: Results, cache: str, blocks: int, scale: float) -> float:
    """Seconds per `single` question: `none` pays its first block's cost in every block; `prefix`
    and `dual` the mean of their first and last block's (their reuse pass shrinks linearly
    with the block index for `prefix`, stays put for `dual`)."""
    if cache == "none":
        return blocks * fixed_block(real, "none", 0, scale)["total"]
    return blocks * mean([fixed_block(real, cache, b, scale)["total"] for b in (0, blocks - 1)])


def entropy_steps(real: Results, cache: str) -> dict[str, float]:
    """The entropy rule's first (full) step and mean later step, medians over repeats."""
    prefix = f"entropy/{cache}/block0"
    return {
        "full": median_over_repeats(real, prefix, lambda s: s[0]["wall"]),
        "later": median_over_repeats(real, prefix, lambda s: mean([x["wall"] for x in s[1:]])),
    }


def demo_summary(demo: Results, name: str, strategy: str, cache: str) -> dict[str, Any]:
    """Mean ± std over seeds, and the pass counts summed over seeds, of one demo cell."""
    runs = [
        c
        for c in demo.values()
        if (c["model"], c["strategy"], c["cache"]) == (name, strategy, cache)
    ]
    accuracy = [100 * c["accuracy"] for c in runs]
    rows = {k: sum(c["rows"][k] for c in runs) for k in ("full", "reuse")}
    questions = sum(c["questions"] for c in runs)
    return {
        "runs": len(runs),
        "accuracy": mean(accuracy),
        "std": statistics.stdev(accuracy) if len(accuracy) > 1 else 0.0,
        "nfe": mean([c["nfe"] for c in runs]),
        "wall": mean([c["wall"] for c in runs]),
        "calls": {k: mean([c["calls"][k] for c in runs]) for k in ("full", "reuse")},
        "full_share": rows["full"] / max(1, rows["full"] + rows["reuse"]),
        "steps_per_block": sum(c["nfe"] * c["questions"] for c in runs)
        / max(1, sum(c["blocks"] for c in runs)),
        "questions": questions,
        "digests": [c["digests"] for c in sorted(runs, key=lambda c: c["seed"])],
    }


# ----------------------------------------------------------------- the section


def fmt(value: float, digits: int = 2) -> str:
    return "n/a" if value != value else f"{value:.{digits}f}"  # NaN: not measured


def real_fixed_table(real: Results, blocks: int, layers: int) -> list[str]:
    """Per-block step times of `single`'s fixed schedule, then per question and the ratios
    (`per_question_table`)."""
    lines = [
        "| cache | block | full step s | reuse step s | reuse pass tokens | mean step s (over "
        "the block) | head s/step |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for cache, block_index in [
        ("none", 0),
        ("prefix", 0),
        ("prefix", blocks - 1),
        ("dual", 0),
        ("dual", blocks - 1),
    ]:
        b = fixed_block(real, cache, block_index, 1.0)
        steps = real.get(f"fixed/{cache}/block{block_index}/repeat0", [])
        reuse, width = ("-", "-") if cache == "none" else (fmt(b["reuse"]), fmt(b["width"], 0))
        lines.append(
            f"| {cache} | {block_index + 1} of {blocks} | {fmt(b['full'])} | {reuse} | {width} | "
            f"{fmt(b['total'] / max(1, len(steps)))} | {fmt(b['head'])} |"
        )
    return lines + [""] + per_question_table(real, blocks, layers)


def per_question_table(real: Results, blocks: int, layers: int) -> list[str]:
    """`single`'s fixed schedule per question and per step, measured and extrapolated."""
    scale = FULL_DEPTH / layers
    lines = [
        f"| cache | s/question (`single`, {blocks} blocks) | mean s/step | none/cache per step "
        f"| extrapolated to {FULL_DEPTH} layers: s/step | none/cache ({FULL_DEPTH} layers, "
        "extrapolated) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    steps_per_question = blocks * len(real.get("fixed/none/block0/repeat0", [])) or 1
    base, base_deep = (
        per_question(real, "none", blocks, 1.0),
        per_question(real, "none", blocks, scale),
    )
    for cache in CACHES:
        measured, deep = (
            per_question(real, cache, blocks, 1.0),
            per_question(real, cache, blocks, scale),
        )
        lines.append(
            f"| {cache} | {fmt(measured, 1)} | {fmt(measured / steps_per_question)} | "
            f"{fmt(base / measured)}x | {fmt(deep / steps_per_question)} | "
            f"{fmt(base_deep / deep)}x |"
        )
    return lines


def real_entropy_table(real: Results, demo: Results, llada: str) -> list[str]:
    """The entropy rule's full and later steps, and dVoting's expected step time at this shape."""
    lines = [
        "| cache | first step of a block s (full) | later step s | dVoting's full-pass share on "
        "the demo | expected dVoting s/step | none/cache |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    base = entropy_steps(real, "none")["full"]
    for cache in CACHES:
        step = entropy_steps(real, cache)
        share = demo_summary(demo, llada, "dvoting", cache)["full_share"] if demo else float("nan")
        expected = (
            step["full"] if cache == "none" else share * step["full"] + (1 - share) * step["later"]
        )
        lines.append(
            f"| {cache} | {fmt(step['full'])} | {fmt(step['later'])} | {fmt(100 * share, 0)}% | "
            f"{fmt(expected)} | {fmt(base / expected)}x |"
        )
    return lines


def demo_table(demo: Results, models: list[str]) -> list[str]:
    """Accuracy, NFE, speed and passes of each demo model, strategy and cache."""
    lines = [
        "| model | strategy | cache | seeds | accuracy % (mean ± std) | mean NFE | wall s | "
        "speed-up vs none | full passes (of row-passes) | model calls: full + reuse | steps per "
        "block | outputs token-identical to none |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in models:
        for strategy in ("single", "dvoting"):
            base = demo_summary(demo, name, strategy, "none")
            for cache in CACHES:
                s = demo_summary(demo, name, strategy, cache)
                if not s["runs"]:
                    continue
                same = sum(
                    a == b
                    for run, ref in zip(s["digests"], base["digests"])
                    for a, b in zip(run, ref)
                )
                lines.append(
                    f"| {name} | {strategy} | {cache} | {s['runs']} | {fmt(s['accuracy'], 1)} ± "
                    f"{fmt(s['std'], 1)} | {fmt(s['nfe'], 2)} | {fmt(s['wall'], 1)} | "
                    f"{fmt(base['wall'] / s['wall'])}x | {fmt(100 * s['full_share'], 0)}% | "
                    f"{s['calls']['full']:.0f} + {s['calls']['reuse']:.0f} | "
                    f"{fmt(s['steps_per_block'], 2)} | {same} of {s['questions']} |"
                )
    return lines


def verdicts(results: Results, blocks: int) -> list[str]:
    """The issue's two goals, checked on this run's numbers."""
    real, demo, lines = results.get("real", {}), results.get("demo", {}), []
    if real:
        ratio = per_question(real, "none", blocks, 1.0) / per_question(real, "dual", blocks, 1.0)
        deep = FULL_DEPTH / results["args"]["layers"]
        ratio_deep = per_question(real, "none", blocks, deep) / per_question(
            real, "dual", blocks, deep
        )
        lines.append(
            "- **Goal 1, `dual` at least 5x faster per step than `none` for `single` at this "
            f"length:** {'met' if ratio >= 5 else 'not met'} as measured ({fmt(ratio)}x with "
            f"{results['args']['layers']} layer(s)); extrapolated to {FULL_DEPTH} layers "
            f"{fmt(ratio_deep)}x (an estimate from the measured body and head times, not a "
            "measurement)."
        )
    if demo:
        worst = []
        for name in results["args"]["models"]:
            for strategy in ("single", "dvoting"):
                base = demo_summary(demo, name, strategy, "none")["accuracy"]
                worst += [
                    (
                        abs(demo_summary(demo, name, strategy, c)["accuracy"] - base),
                        f"{name} {strategy} {c}",
                    )
                    for c in ("prefix", "dual")
                    if demo_summary(demo, name, strategy, c)["runs"]
                ]
        gap, where = max(worst) if worst else (float("nan"), "-")
        met = (
            round(gap, 6) <= 1
        )  # accuracies are multiples of 0.2 points: no float noise in the verdict
        lines.append(
            "- **Goal 2, demo accuracy within 1 point of `none`:** "
            f"{'met' if met else 'not met'}; largest gap {fmt(gap, 1)} points ({where}), on "
            f"{results['args']['questions']} questions (one question is "
            f"{fmt(100 / results['args']['questions'], 1)} points)."
        )
    return lines


def intro_lines(results: Results) -> list[str]:
    """What the caches do, what is measured and what is not."""
    a = results["args"]
    return [
        "## Key/value caches (`cache=none|prefix|dual`): step time at LLaDA-8B's shape, "
        "accuracy on the demo",
        "",
        "Written by `python -m bench caches` (rerun it to refresh this section only; "
        "`python -m bench throughput` writes the rest).",
        "`none` runs every step over the whole sequence (exact). `prefix` (Fast-dLLM's prefix "
        "cache): a row",
        "entering a block runs one full pass and keeps the keys/values before the block; its "
        "later steps in",
        "the block run over the block and everything after it. `dual` keeps the keys/values "
        "after the block",
        "too; its later steps run over the block only (plus one token for Dream), and with the "
        "entropy rule a",
        "block completed in such a step hands over to the next block at the next step (a full "
        "pass).",
        "The kept keys/values are stale, so `prefix` and `dual` are approximations.",
        "",
        f"What it does not show: the real-shape model has random weights and {a['layers']} of "
        "LLaDA-8B's 32",
        "layers, in float32 on a 2-core CPU with one thread, and the machine is shared with "
        "other work (load",
        "below), so the seconds are noisy; at reduced depth the output head (run at the block's "
        "masked",
        "positions, the same for every cache) weighs far more than in the 32-layer model. The "
        "extrapolated",
        "columns scale each step's measured body time (forward pass less the head) to 32 "
        "layers: an",
        "estimate, not a measurement. No GPU was measured: a GPU run (bfloat16, 32 layers, "
        "batched rows)",
        "would give the real ratios. The demo models are tiny (short prompts, 2-token blocks), "
        "so their",
        "wall times say little about the speed-up on a real model; their accuracy says how much "
        "the stale",
        "keys/values cost.",
        "",
    ]


def machine_lines(results: Results) -> list[str]:
    facts = results["meta"]["facts"]
    lines = [
        "### Machine and command",
        "",
        f"- command: `{results['meta']['command']}` (from the repository root)",
    ]
    lines += [f"- {k}: {v}" for k, v in facts.items()]
    lines += [
        f"- load average (1/5/15 min) before: {results['meta']['load_before']}, after: "
        f"{results['meta'].get('load_after')} (`uptime`: before "
        f"`{results['meta']['uptime_before']}`, after "
        f"`{results['meta'].get('uptime_after', '')}`)",
        "- other busy processes at the start (the 2 cores are shared with other sessions' tests "
        "and benchmarks, so timings are noisy):",
    ]
    lines += [f"  - `{p}`" for p in results["meta"]["busy"]]
    lines.append(
        f"- wall time of the whole run: {results['meta'].get('elapsed', 0) / 60:.1f} min"
        + (" (resumed after an interruption)" if results["meta"].get("resumed") else "")
    )
    return lines + [""]


def real_intro(results: Results, blocks: int) -> list[str]:
    """Part 1's description: the model, what a full and a reuse step are, the head's share."""
    a, real = results["args"], results["real"]
    shape = (
        f"LLaDA-8B's width, heads, MLP and vocabulary, {a['layers']} of its 32 layers"
        if a["width"] == 4096
        else f"a smoke-test width, {a['layers']} layer(s)"
    )
    L, B = a["gen_length"], a["block"]
    head = [
        median_over_repeats(real, "fixed/none/block0", lambda steps: steps[k]["head"])
        for k in (0, -1)
    ]
    return [
        "### Real shape: seconds per decoding step",
        "",
        f"{results['real_description']}: {shape}.",
        f"One row, prompt {a['prompt_length']} + generation {L}, block {B} ({blocks} "
        f"blocks); medians over {a['repeats']} repeats; the cells run side by side, one "
        "step of each in turn, so load",
        "changes on the shared cores hit them alike. A step is *full* when the model's pass covers",
        "the whole sequence, *reuse* when it attends to kept keys/values (told apart by "
        "what `hidden_states`",
        f"receives). `single`'s fixed schedule (steps = {L}: {B} steps per block, one "
        "commit each) is timed over",
        "whole blocks: `none` in the first block (all its passes cover the whole sequence, "
        "so every block",
        "costs the same), `prefix` and `dual` in the first and the last block (earlier "
        "blocks pre-filled).",
        "*head s/step*: the output head's part of a step (the block's masked positions x "
        "the vocabulary: the",
        f"same for every cache, {B} positions at a block's first step, {fmt(head[0])} s "
        f"here, down to 1 at its last, {fmt(head[1])} s).",
        "At reduced depth it is a large part of a `dual` or late-`prefix` step and caps "
        "their ratio to",
        "`none`; in the 32-layer model it is a far smaller part of a step.",
        "",
    ]


def real_fixed_notes(a: Results, blocks: int) -> list[str]:
    """How to read the fixed-schedule table, and what the entropy-rule table shows."""
    L, B = a["gen_length"], a["block"]
    return [
        "",
        f"*s/question*: `none` {blocks} x its block; `prefix`/`dual` {blocks} x the mean of "
        "their first and last",
        f"block (1 full + {B - 1} reuse steps each; `prefix`'s reuse pass shrinks linearly "
        "with the block index,",
        f"`dual`'s does not). *mean s/step* = s/question / {L}, so *none/cache per step* is "
        "also the ratio per",
        "question.",
        "",
        "The entropy rule (dVoting's, alpha 0.3, temperature 0.6), first "
        f"{a['entropy_steps']} steps of the first block. With random weights it commits one "
        "token per step, so its real steps per block are",
        "not measurable here: *expected dVoting s/step* weights the full and later steps by "
        "the share of full",
        "passes dVoting has on the LLaDA demo (table below).",
        "",
    ]


def real_lines(results: Results, blocks: int) -> list[str]:
    """Part 1's description and tables."""
    a, real = results["args"], results["real"]
    return (
        real_intro(results, blocks)
        + real_fixed_table(real, blocks, a["layers"])
        + real_fixed_notes(a, blocks)
        + real_entropy_table(real, results.get("demo", {}), a["models"][0])
        + [""]
    )


def demo_lines(results: Results) -> list[str]:
    """Part 2's description and table."""
    a = results["args"]
    return (
        [
            "### Demo: accuracy and speed",
            "",
            f"The shipped demo models, the first {a['questions']} of the 500 held-out problems "
            "(`demo/arith_test.jsonl`), generation 32, block 2 (16 blocks), 16 rows per pass, "
            "scored as the task",
            "`dvoting_arith` scores (text up to the first end token, its number equal to the "
            "target). `single` is",
            "greedy (temperature 0), so every seed gives the same output: it ran once (seed "
            f"{a['seeds'][0]}); `dvoting` ran with seeds {', '.join(map(str, a['seeds']))} (std "
            "over seeds, n-1).",
            "*wall s*: one run (mean over seeds); on this shared CPU the same cell has differed "
            "by up to 1.5x",
            "between runs of this script, so read the speed-ups as rough. *full passes*: the "
            "share of row-passes",
            "over the whole sequence.",
            "*model calls*: `hidden_states` calls per run (a step whose rows mix full and reuse "
            "passes makes two).",
            "*steps per block*: NFE / blocks decoded (a dVoting remask sample skips the blocks "
            "it keeps whole).",
            "*token-identical*: outputs (every sample's tokens) equal to `none`'s at the same "
            "seed.",
            "",
        ]
        + demo_table(results["demo"], a["models"])
        + [""]
    )


def dvoting_numbers(results: Results) -> dict[str, Any]:
    """The LLaDA demo's dVoting summary per cache (`s`), the steps a block takes once entered,
    the extra model calls of `dual` and `prefix` (%), and every model's speed-ups over `none`."""
    demo, name = results["demo"], results["args"]["models"][0]
    s = {c: demo_summary(demo, name, "dvoting", c) for c in CACHES}
    calls = {c: s[c]["calls"]["full"] + s[c]["calls"]["reuse"] for c in CACHES}
    return {
        "s": s,
        "entered": {
            c: 1 / s[c]["full_share"] if s[c]["full_share"] else float("nan")
            for c in ("prefix", "dual")
        },
        "more_calls": {c: 100 * (calls[c] / calls["none"] - 1) for c in ("prefix", "dual")},
        "speed": [
            demo_summary(demo, m, "dvoting", "none")["wall"]
            / demo_summary(demo, m, "dvoting", c)["wall"]
            for m in results["args"]["models"]
            for c in ("prefix", "dual")
        ],
    }


def dvoting_lines(results: Results) -> list[str]:
    """Why dVoting gains less from the caches than `single`, with this run's numbers."""
    if not results.get("demo", {}):
        return []
    n = dvoting_numbers(results)
    return dvoting_steps_lines(n) + dvoting_calls_lines(n)


def dvoting_steps_lines(n: dict[str, Any]) -> list[str]:
    """dVoting's steps per block and share of full passes with each cache."""
    s, entered = n["s"], n["entered"]
    return [
        "### Why dVoting gains less",
        "",
        "A cache saves only on a block's steps after its first, the block's full pass. On the "
        "LLaDA demo",
        f"dVoting's entropy rule needs {fmt(s['none']['steps_per_block'])} steps per block on "
        f"average with `none` ({fmt(s['prefix']['steps_per_block'])} with `prefix`, "
        f"{fmt(s['dual']['steps_per_block'])} with `dual`):",
        "a step usually completes its block and hands the same logits on to the next ones, and "
        "a block that",
        f"starts a step takes {fmt(entered['prefix'])} steps (`prefix`) and "
        f"{fmt(entered['dual'])} (`dual`) on average. So refresh passes dominate:",
        f"{fmt(100 * s['prefix']['full_share'], 0)}% of its row-passes are full with `prefix` "
        f"and {fmt(100 * s['dual']['full_share'], 0)}% with `dual`, against 1 in 32 for "
        "`single` at the real shape",
        "(steps = L, block 32) and 1 in 2 for `single` on the demo (2 steps per 2-token block); "
        "its steps cost",
        "about what `none`'s do, and its outputs and accuracy stay close to `none`'s. (With "
        "random weights the",
        "rule commits one token per step, 32 steps per block of 32: the worst case, not "
        "dVoting's behaviour.)",
    ]


def dvoting_calls_lines(n: dict[str, Any]) -> list[str]:
    """The model calls that reuse passes add, and what they cost on the demo."""
    speed = n["speed"]
    return [
        "The few reuse passes also cost model calls of their own: the rows of a step that reuse "
        "and those",
        "that refresh run in two calls, so on the LLaDA demo dVoting makes "
        f"{fmt(n['more_calls']['dual'], 0)}% more calls with `dual` "
        f"({fmt(n['more_calls']['prefix'], 0)}% with `prefix`) for the",
        "same row-passes. Where a call's fixed cost dominates, they eat the saving: on the tiny "
        "demo model",
        f"dVoting with a cache runs at {fmt(min(speed))}-{fmt(max(speed))}x `none`'s speed, and "
        "on a GPU, where a pass over 16",
        "rows costs little more than over one, the same could happen at the real shape. (On "
        "this CPU at",
        "the real shape the cost follows the rows, and the table above expects about `none`'s "
        "speed.)",
        "",
    ]


def section(results: Results) -> list[str]:
    a = results["args"]
    blocks = a["gen_length"] // a["block"]
    lines = [START] + intro_lines(results) + machine_lines(results)
    if results.get("real"):
        lines += real_lines(results, blocks)
    if results.get("demo"):
        lines += demo_lines(results) + dvoting_lines(results)
    lines += ["### Goals", ""] + verdicts(results, blocks) + ["", END]
    return lines


# ----------------------------------------------------------------- command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_real_shape_arguments(p, prompt_length=256, gen_length=256)
    p.add_argument("--block", type=int, default=32)
    p.add_argument(
        "--repeats", type=int, default=3, help="repeats of every real-shape cell (medians)"
    )
    p.add_argument(
        "--entropy-steps", type=int, default=4, help="entropy-rule steps timed per repeat"
    )
    p.add_argument(
        "--models", nargs="+", default=["tiny-arith", "tiny-arith-dream"], help="LLaDA first"
    )
    p.add_argument("--questions", type=int, default=500)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--max-rows", type=int, default=16)
    p.add_argument("--demo-gen-length", type=int, default=32)
    p.add_argument("--skip-real", action="store_true")
    p.add_argument("--skip-demo", action="store_true")
    add_quick_flag(p)
    add_threads_flag(p)
    p.add_argument("--resume", action="store_true", help="keep the cells already in --json")
    add_output_flags(p, RESULTS / "caches_bench.json")
    args = p.parse_args(argv)
    if args.quick:
        args.width, args.heads, args.prompt_length, args.gen_length = 256, 4, 32, 64
        args.repeats, args.entropy_steps, args.questions, args.seeds = 1, 2, 16, args.seeds[:2]
    return args


def start_results(args: argparse.Namespace, argv: list[str]) -> Results:
    """The saved results when resuming, else a fresh record of the machine and the command."""
    if args.resume and args.json.exists():
        results = load_json(args.json)
        results["meta"]["resumed"] = True
        return results
    command = "OMP_NUM_THREADS=1 " + command_line("caches", argv)
    meta = {**run_facts(command), "started": time.time()}
    return {"meta": meta, "args": args_record(args)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.report_only:
        # e.g. after changing the section's text: the numbers and the run's facts stay
        write_section(args.out, section(load_json(args.json)), START, END)
        return 0
    results = start_results(args, argv)
    began = time.perf_counter()

    def save() -> None:
        save_json(args.json, results)

    if not args.skip_demo:  # first: the entropy table uses the demo's full-pass share
        run_demo(args, results, save)
    if not args.skip_real:
        run_real(args, results, save)
    meta = results["meta"]
    meta["elapsed"] = meta.get("elapsed", 0.0) + time.perf_counter() - began
    meta["load_after"], meta["uptime_after"] = load_average(), uptime()
    save()
    write_section(args.out, section(results), START, END)
    print(
        f"wrote the caches section of {args.out} and {args.json} in {meta['elapsed'] / 60:.1f} min",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
