"""Suite `throughput`: every strategy's speed and decoder overhead; writes BENCHMARKS.md.

    .venv/bin/python -m bench throughput    # the full run (about 10 minutes on 2 quiet cores)
    .venv/bin/python -m bench throughput --demo runs/tiny-arith/best --out /tmp/B.md
    .venv/bin/python -m bench throughput --quick    # a smoke run (seconds)

Part 1, strategies: for each strategy (single, majority, hex, dvoting) and batch size
(`max_rows` 1, 4, 16), the questions go through `strategies.decode_questions` and we record
questions per second, mean NFE per question, seconds per forward pass, the decoder's
own share of the wall time (everything but the forward pass: batching, float64
softmax/entropy/noise, commit rules, the strategy's bookkeeping), and peak memory.
The cells are run in an interleaved order and repeated (`--repeats`); the table shows
medians. Three models: the demo model (`--demo`); a random-weight LLaDA with the real
vocabulary (126,464) at reduced depth and width; and one at LLaDA-8B's width with one
layer (`--real-shape-layers`), the model of the decoder-share target. Then the demo's
strategies without and with the opt-in prefix cache: accuracy, NFE and speed.

Part 2, one decoding step at the real vocabulary and sequence 400 (prompt 144 +
generation 256, block 32): the decoder's own time per step (forward pass excluded)
of the naive release-style step over the whole sequence (`bench/naive.py`) and of
`RowDecoder.step`, which works only at the committable block's masked positions.

Part 3, the targets of the issue, checked on the numbers above.

This file parses the flags and runs the parts in order; each part lives in its own unit:
`bench/strategies_bench.py` (part 1), `bench/prefix_cache_bench.py` (the prefix cache),
`bench/step_bench.py` (part 2), `bench/targets.py` (part 3) and `bench/report.py`
(BENCHMARKS.md and `--json`).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from bench.common import (
    RESULTS,
    add_output_flags,
    add_quick_flag,
    add_threads_flag,
    busy_processes,
    command_line,
    load_average,
    machine_description,
)
from bench.prefix_cache_bench import run_prefix_cache
from bench.report import RunResults, write_json, write_report
from bench.step_bench import run_step_bench
from bench.strategies_bench import run_cells
from bench.targets import targets
from bench.workloads import demo_workload, real_vocab_workload
from lm_eval_dvoting.core.decoding import default_block_length
from lm_eval_dvoting.core.strategies import STRATEGIES

# The strategies BENCHMARKS.md's tables measure. `temporal` has a suite of its own (its cost
# over `single`), and `rfg` needs a reference model that the benchmark does not build, so a
# run that asked for it failed after minutes of other cells: it is refused up front instead.
MEASURED = ("single", "majority", "hex", "dvoting")
CHOICES = tuple(s for s in STRATEGIES if s != "rfg")


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """The three models' flags: the demo, the real-vocabulary model, the real-shape model."""
    p.add_argument(
        "--demo",
        default="tiny-arith",
        help="demo checkpoint: 'tiny-arith' or a folder (random "
        "weights of the demo's shape when it has none)",
    )
    p.add_argument("--questions", type=int, default=16, help="demo questions per cell")
    p.add_argument(
        "--hex-questions", type=int, default=8, help="demo questions for hex (25 samples each)"
    )
    p.add_argument(
        "--real-questions", type=int, default=4, help="real-vocabulary questions per cell"
    )
    p.add_argument("--real-hex-questions", type=int, default=2)
    p.add_argument("--real-gen-length", type=int, default=32)
    p.add_argument("--real-prompt-length", type=int, default=32)
    p.add_argument("--real-width", type=int, default=256)
    p.add_argument("--real-layers", type=int, default=2)
    p.add_argument(
        "--real-shape-layers",
        type=int,
        default=1,
        help="layers of the model at LLaDA-8B's width (4096, 32 heads, MLP 12,288); 0: skip it",
    )
    p.add_argument("--real-shape-batch-sizes", type=int, nargs="+", default=[1, 4])
    p.add_argument(
        "--real-shape-strategies",
        nargs="+",
        default=["single", "majority", "dvoting"],
        choices=CHOICES,
    )


def argument_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_model_flags(p)
    p.add_argument(
        "--cache-questions",
        type=int,
        default=200,
        help="demo questions for the prefix-cache comparison (0: skip it)",
    )
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--strategies", nargs="+", default=list(MEASURED), choices=CHOICES)
    p.add_argument(
        "--repeats", type=int, default=2, help="repeats of every demo cell (medians reported)"
    )
    p.add_argument("--real-repeats", type=int, default=1)
    p.add_argument("--step-repeats", type=int, default=3, help="repeats of the one-step benchmark")
    p.add_argument("--skip-step", action="store_true", help="skip part 2 (the one-step benchmark)")
    p.add_argument(
        "--skip-real", action="store_true", help="skip the real-vocabulary model in part 1"
    )
    add_threads_flag(p)
    add_quick_flag(p)
    add_output_flags(p, RESULTS / "throughput.json", report_only=False)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; `--quick` overrides the sizes with tiny ones (a smoke test)."""
    args = argument_parser().parse_args(argv)
    if args.quick:
        args.questions, args.hex_questions, args.real_questions, args.real_hex_questions = (
            4,
            1,
            2,
            1,
        )
        args.real_gen_length, args.repeats, args.step_repeats = 32, 1, 1
        args.real_shape_layers, args.cache_questions = 0, 8
    return args


def run_demo(args: argparse.Namespace, results: RunResults) -> None:
    """Part 1 on the demo model."""
    demo = demo_workload(args.demo, max(args.questions, args.hex_questions))
    results.descriptions["demo"] = (
        f"{demo.description}. Questions: the first {args.questions} of `demo/arith_test.jsonl` "
        f"(hex: the first {args.hex_questions}), generation length {demo.gen_length}, block "
        f"{default_block_length(demo.gen_length)}, repeats {args.repeats}."
    )
    print(f"part 1: demo model ({demo.description})", flush=True)
    results.cells["demo"] = run_cells(
        demo, args.strategies, args.batch_sizes, args.questions, args.hex_questions, args.repeats
    )


def run_demo_prefix_cache(args: argparse.Namespace, results: RunResults) -> None:
    """The demo's strategies without and with the prefix cache, on `--cache-questions` questions."""
    cache_demo = demo_workload(args.demo, args.cache_questions)
    print(f"prefix cache: demo model, {args.cache_questions} questions", flush=True)
    results.cache_rows = run_prefix_cache(cache_demo, args.cache_questions)


def run_real_vocab(args: argparse.Namespace, results: RunResults) -> None:
    """Part 1 on the random-weight LLaDA with the real vocabulary at reduced depth and width."""
    real = real_vocab_workload(
        max(args.real_questions, args.real_hex_questions),
        args.real_gen_length,
        args.real_prompt_length,
        args.real_width,
        args.real_layers,
    )
    results.descriptions["real-vocab"] = (
        f"{real.description}. {args.real_questions} questions (hex: {args.real_hex_questions}), "
        f"generation length {real.gen_length}, block {default_block_length(real.gen_length)}, "
        f"repeats {args.real_repeats}."
    )
    print(f"part 1: real-vocabulary model ({real.description})", flush=True)
    results.cells["real-vocab"] = run_cells(
        real,
        args.strategies,
        args.batch_sizes,
        args.real_questions,
        args.real_hex_questions,
        args.real_repeats,
    )


def run_real_shape(args: argparse.Namespace, results: RunResults) -> None:
    """Part 1 at LLaDA-8B's width with `--real-shape-layers` layers: the decoder-share target's
    model."""
    shape = real_vocab_workload(
        args.real_questions,
        args.real_gen_length,
        args.real_prompt_length,
        d_model=4096,
        n_layers=args.real_shape_layers,
        n_heads=32,
        name="real-shape",
        std=0.02,
    )
    results.descriptions["real-shape"] = (
        f"{shape.description}: LLaDA-8B's width and vocabulary, {args.real_shape_layers} of its "
        "32 layers. 1 question per cell (its 5 samples fill up to 4 rows), generation length "
        f"{shape.gen_length}, block {default_block_length(shape.gen_length)}, repeats 1. "
        f"Strategies {', '.join(args.real_shape_strategies)} (hex: 480 forward passes of about "
        "a second each here, left out)."
    )
    print(f"part 1: real-shape model ({shape.description})", flush=True)
    results.cells["real-shape"] = run_cells(
        shape, args.real_shape_strategies, args.real_shape_batch_sizes, 1, 1, 1
    )


def run_parts(args: argparse.Namespace, results: RunResults) -> None:
    """Parts 1 and 2, each workload as the flags ask; every model is freed before the next loads."""
    run_demo(args, results)
    if args.cache_questions:
        run_demo_prefix_cache(args, results)
    if not args.skip_real:
        run_real_vocab(args, results)
    if args.real_shape_layers and not args.skip_real:
        run_real_shape(args, results)
    if not args.skip_step:
        print("part 2: one step at the real vocabulary", flush=True)
        results.step = run_step_bench(args.quick, args.real_width, args.step_repeats)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    began = time.perf_counter()
    results = RunResults(
        load_before=load_average(),
        busy=busy_processes(),
        facts=machine_description(torch.device("cpu")),
        command=command_line("throughput", argv, launcher="python"),
    )
    run_parts(args, results)
    verdict_lines, verdicts = targets(results.cells)  # part 3
    results.elapsed = time.perf_counter() - began
    results.load_after = load_average()
    write_report(args, results, verdict_lines)
    write_json(args.json, results, verdicts)
    print(f"wrote {args.out} and {args.json} in {results.elapsed / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
