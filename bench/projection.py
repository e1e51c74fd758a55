"""Suite `projection`: a PROJECTION, not a measurement, of the wall time of whole tasks
(GSM8K, MATH500, ARC-C, MMLU, GPQA diamond) on one GPU for `single`, `majority`, `hex` and
`dvoting` at the paper's steps per question, computed from the step times that
`python -m bench gpu` measured (issue #43). It runs on the CPU in seconds: it reads a GPU
run's JSON, the paper's table and the tasks' data files, and runs no model.

    # BENCHMARKS.md's section (the H100's run, the default --json)
    .venv/bin/python -m bench projection --data-dir /path/to/data
    # exact prompt lengths with LLaDA's own tokenizer (a local folder of the checkpoint)
    .venv/bin/python -m bench projection --data-dir DATA --tokenizer /path/to/LLaDA-8B-Instruct
    # another GPU's run
    .venv/bin/python -m bench projection --data-dir DATA --json bench/results/gpu_bench_h200.json

What it reads:

- Steps per question: the paper's averages (docs/ALGORITHM.md, "Reference numbers",
  LLaDA-8B-Instruct), each task at the paper's generation length L; the table also gives
  this project's defaults' steps for the fixed-schedule strategies, which equal the paper's.
- Prompts: each test document's user turn as lm-eval renders it from task_configs/TASK.yaml
  (its `doc_to_text`, the data read from `--data-dir` as `DVOTING_DATA_DIR` would), inside
  LLaDA-8B-Instruct's chat template (`--apply_chat_template`).
- Prompt tokens: with `--tokenizer DIR`, exact: the tokenizer's own chat template, encoded
  as the harness encodes it. Without it, an ESTIMATE: the template's `TEMPLATE_TOKENS`
  special and role tokens plus ceil(UTF-8 bytes of the user turn / `--bytes-per-token`,
  default 4); the section also says how much the totals move at 3 bytes per token.

The time model (cache `none`), from the GPU run's cells at 1 and 16 rows per pass (the
batch sizes projected): at each row count, seconds per decoding step are linear in the
tokens per row through two measured points: 64 tokens (the forward part's `Rx64` cell:
hidden states + the head, median of 5) and 512 tokens (the caches part's `none` cells:
the mean step of `single`'s fixed schedule over prompt 256 + generation 256, whole
`RowDecoder.step()` walls, median over repeats). The forward part's own `Rx512` cell is not
used: on the H100 its 1-row value (33.4 ms, the first cell timed) is 1.35x the 24.8 ms of
the decoding steps at the same shape. A length outside 64..512 tokens extends the nearest
segment's line; such questions are counted and their cells marked.

Cost of a task: every question pays its steps (row-steps: one row for one step) at its own
length, each 1/R of an R-row step: the sum over the questions. Rows per pass are R for
every strategy (the harness refills a freed row with the next sample or question at once);
the padding of a pass to its longest row (lm-eval orders requests longest first) and the
last, part-filled passes are left out.

`cache=dual` (fixed schedules only): a block of s steps costs one full step (the measured
dual full step at 512 tokens, scaled by the none model's t(T) / t(512)) plus s - 1 reuse
steps at the measured dual reuse step (block 32 over 512 tokens, taken as is: the tasks'
shorter sequences and blocks would reuse over fewer tokens). dVoting's entropy rule takes
an unknown number of steps per block, so its dual cells are not projected.

`--cached-steps FILE`: `dual`'s full and reuse steps from a `python -m bench static-steps`
run instead (bench/gpu_session.sh's `static_steps_bf16.json`: LLaDA-8B's full shape in
bfloat16, 1 and 16 rows, the caches part's prompt, answer and block), under `cached_steps=graphs`
where all its `dual` cells ran, else `static`: per rows, the mean over the first and last block
of the median over repeats of the block's first step and of its reuse steps' mean (`graphs`:
the replays, from the step after the capture, since a decode captures `dual`'s one shape once;
`static`: all the later steps). The run must be of the `--json` run's GPU, as recorded, and
shape (refused, naming what differs); the `none` cells stay the `--json` run's eager ones.

    .venv/bin/python -m bench projection --data-dir DATA --json bench/results/gpu_bench_h200.json \
        --cached-steps FILES/static_steps_bf16.json   # an H200 session's graphs
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from bench import caches_bench, static_steps_bench
from bench.common import (
    BENCHMARKS_MD,
    REPO,
    RESULTS,
    add_output_flags,
    command_line,
    load_json,
    markers,
    write_section,
)

SECTION = "projection"
START, END = markers(SECTION)
DEFAULT_BENCH = RESULTS / "gpu_bench_h100.json"
PAPER_TABLE = REPO / "docs" / "ALGORITHM.md"
STRATEGIES = ("single", "majority", "hex", "dvoting")  # the paper table's column order
ROWS = (1, 16)  # the rows per pass projected: the GPU run's cache cells have these
SHORT_TOKENS = 64  # gpu_bench.part_forward's short cells
CACHE_PROMPT = 256  # gpu_bench.part_caches's prompt (its generation: CACHE_SHAPE.gen_length)
TASKS = {  # the paper table's label -> this plugin's lm-eval task
    "GSM8K": "dvoting_gsm8k",
    "MATH500": "dvoting_math500",
    "ARC-C": "dvoting_arc_challenge",
    "MMLU": "dvoting_mmlu",
    "GPQA": "dvoting_gpqa_diamond",
}
# LLaDA-8B-Instruct's chat template (its tokenizer_config.json) around one user turn:
# <|startoftext|><|start_header_id|>user<|end_header_id|>\n\n{text|trim}<|eot_id|>
# <|start_header_id|>assistant<|end_header_id|>\n\n: 10 tokens if "user", "assistant" and
# "\n\n" are one token each (an assumption of the estimate; --tokenizer counts them)
TEMPLATE_TOKENS = 10
SENSITIVITY_BYTES_PER_TOKEN = 3.0  # the estimate's pessimistic alternative (more tokens)
Results = dict[str, Any]


# ----------------------------------------------------------------------- the time model


@dataclass(frozen=True)
class StepModel:
    """Seconds of one decoding step of `rows` rows over `tokens` tokens each: at each
    measured row count, linear in tokens through the measured `(tokens, seconds)` points
    (sorted by tokens); beyond the outer points the nearest segment's line is extended and
    `measured` says False. A row count without points is refused."""

    points: dict[int, tuple[tuple[int, float], ...]]

    def _points(self, rows: int) -> tuple[tuple[int, float], ...]:
        if rows not in self.points:
            raise ValueError(
                f"rows={rows}: the GPU run has no step times at {rows} rows per pass; "
                f"it has {sorted(self.points)}"
            )
        return self.points[rows]

    def seconds(self, rows: int, tokens: int) -> float:
        points = self._points(rows)
        upper = next((k for k in range(1, len(points)) if tokens <= points[k][0]), None)
        k = len(points) - 1 if upper is None else upper
        (t0, s0), (t1, s1) = points[k - 1], points[k]
        return s0 + (s1 - s0) * (tokens - t0) / (t1 - t0)

    def measured(self, rows: int, tokens: int) -> bool:
        points = self._points(rows)
        return points[0][0] <= tokens <= points[-1][0]


@dataclass(frozen=True)
class DualModel:
    """`cache=dual`'s mean step over a block of `steps` steps (module docstring): one full
    step, `steps - 1` reuse steps."""

    none: StepModel
    full: dict[int, float]  # seconds of dual's full step at `length` tokens, per rows
    reuse: dict[int, float]  # seconds of dual's reuse step, per rows
    length: int  # the tokens of the cells `full` and `reuse` were measured at

    def seconds(self, rows: int, tokens: int, steps: float) -> float:
        scale = self.none.seconds(rows, tokens) / self.none.seconds(rows, self.length)
        return (self.full[rows] * scale + (steps - 1) * self.reuse[rows]) / steps


def _part(bench: Results, name: str, path: Path) -> Results:
    """The GPU run's part `name`, refused when it is absent or failed."""
    part = bench.get(name)
    if not isinstance(part, dict) or "error" in part:
        why = "failed on the GPU" if isinstance(part, dict) else "is missing"
        raise ValueError(
            f"--json {path}: its '{name}' part {why}; the projection needs the forward part's "
            f"cells {', '.join(f'{r}x{SHORT_TOKENS}' for r in ROWS)} and the caches part's "
            f"cells at {' and '.join(map(str, ROWS))} rows: run `python -m bench gpu --parts "
            "forward caches` on the GPU (or give another run with --json)"
        )
    return part


def _missing_cells(forward: Results, caches: Results, last_block: int) -> list[str]:
    missing = [f"forward {r}x{SHORT_TOKENS}" for r in ROWS if f"{r}x{SHORT_TOKENS}" not in forward]
    for rows in ROWS:
        real = caches.get(str(rows), {})
        for cell in ("none/block0", "dual/block0", f"dual/block{last_block}"):
            if not any(key.startswith(f"fixed/{cell}/repeat") and real[key] for key in real):
                missing.append(f"caches {rows} row(s) fixed/{cell}")
    return missing


def load_models(bench: Results, path: Path) -> tuple[StepModel, DualModel]:
    """The `none` and `dual` models from a GPU run's JSON (refused, naming the cells, when
    a cell they read is missing)."""
    from bench.gpu_bench import CACHE_SHAPE

    forward, caches = _part(bench, "forward", path), _part(bench, "caches", path)
    blocks, gen = CACHE_SHAPE.gen_length // CACHE_SHAPE.block, CACHE_SHAPE.gen_length
    missing = _missing_cells(forward, caches, blocks - 1)
    if missing:
        raise ValueError(
            f"--json {path} lacks the cells the projection reads: {'; '.join(missing)}; run "
            "`python -m bench gpu --parts forward caches` on the GPU (or give another run)"
        )
    length = CACHE_PROMPT + gen
    points, full, reuse = {}, {}, {}
    for rows in ROWS:
        real = caches[str(rows)]
        step = caches_bench.per_question(real, "none", blocks, 1.0) / gen
        points[rows] = ((SHORT_TOKENS, forward[f"{rows}x{SHORT_TOKENS}"] / 1e3), (length, step))
        dual = [caches_bench.fixed_block(real, "dual", b, 1.0) for b in (0, blocks - 1)]
        full[rows] = caches_bench.mean([d["full"] for d in dual])
        reuse[rows] = caches_bench.mean([d["reuse"] for d in dual])
    none = StepModel(points)
    return none, DualModel(none, full, reuse, length)


# ------------------------------------------------- dual's steps from a `static-steps` run

# what a `python -m bench static-steps` run must have measured for its `dual` cells to stand
# in the time model: LLaDA-8B's full shape in bfloat16 on a GPU, at the caches part's shape
CACHED_STEPS_SHAPE = {
    "device": "cuda",
    "dtype": "bfloat16",
    "layers": 32,
    "width": 4096,
    "heads": 32,
    "prompt_length": CACHE_PROMPT,
}
CACHED_STEPS_MODES = ("graphs", "static")  # the first whose cells all ran is read
# a `graphs` cell's reuse steps are its replays (`static_steps_bench.reuse_steps`): a decode
# captures `dual`'s one shape once; the block's refill (a copy of the kept keys) is left out
RERUN = (
    "run `python -m bench static-steps --device cuda --dtype bfloat16 --layers 32 --rows 1 16` "
    "on that GPU (bench/gpu_session.sh does)"
)


@dataclass(frozen=True)
class CachedSteps:
    """`dual`'s full and reuse step per rows from a `static-steps` run, and what they are."""

    full: dict[int, float]
    reuse: dict[int, float]
    mode: str  # the `cached_steps` mode whose cells were read
    gpu: str  # the run's GPU, as recorded
    command: str
    repeats: int
    path: Path


def _cached_steps_mismatch(run: Results, gpu: str) -> list[str]:
    """How a `static-steps` run differs from the shape the projection models and from the
    `--json` run's GPU (`gpu`, as recorded: an H100 PCIe is not an H100 SXM)."""
    from bench.gpu_bench import CACHE_SHAPE

    args = run.get("args", {})
    wanted = dict(CACHED_STEPS_SHAPE, gen_length=CACHE_SHAPE.gen_length, block=CACHE_SHAPE.block)
    found = [f"{k} {args.get(k)!r} (needs {v!r})" for k, v in wanted.items() if args.get(k) != v]
    if set(ROWS) - set(args.get("rows", [])):
        found.append(f"rows {args.get('rows')} (needs {' and '.join(map(str, ROWS))} among them)")
    ran_on = run.get("meta", {}).get("facts", {}).get("gpu")
    if ran_on != gpu:
        found.append(
            f"GPU {ran_on or 'not recorded'} (--json's step times are from a {gpu}: give a "
            "static-steps run of that GPU, or as --json the eager `bench gpu` run of this one)"
        )
    return found


def _dual_cells(run: Results, mode: str, last_block: int) -> list[list[list[float]]] | None:
    """Per rows (`ROWS`), per block (first, last): each repeat's step times of `dual` under
    `mode`; None when one of them is missing, refused or without a reuse step to read."""
    cells = []
    for rows in ROWS:
        per_block = []
        for block in (0, last_block):
            key = f"dual/{mode}/rows{rows}/block{block}"
            repeats = [r.get(key) or {} for r in run.get("repeats", [])]
            if not repeats or any(
                "refused" in c or not static_steps_bench.reuse_steps(c.get("steps", []), mode)
                for c in repeats
            ):
                return None
            per_block.append([c["steps"] for c in repeats])
        cells.append(per_block)
    return cells


def _median_mean(per_block: list[list[list[float]]], pick: Callable[[list[float]], float]) -> float:
    """The mean over the blocks of the median over repeats of `pick(steps)`."""
    return caches_bench.mean([statistics.median(pick(s) for s in b) for b in per_block])


def load_cached_steps(run: Results, path: Path, gpu: str) -> CachedSteps:
    """`dual`'s steps from a `python -m bench static-steps` GPU run (`--cached-steps`): per
    rows, the mean over its first and last block of the median over repeats of the block's
    first step (full) and of its reuse steps' mean (`reuse_steps`), under `graphs` where
    those cells all ran, else `static`. Refused when the run is not the modelled shape, or
    not on the `--json` run's GPU (`gpu`, its recorded name), or lacks the cells."""
    from bench.gpu_bench import CACHE_SHAPE

    mismatch = _cached_steps_mismatch(run, gpu)
    if mismatch:
        raise ValueError(f"--cached-steps {path}: {'; '.join(mismatch)}; {RERUN}")
    last = CACHE_SHAPE.gen_length // CACHE_SHAPE.block - 1
    for mode in CACHED_STEPS_MODES:
        cells = _dual_cells(run, mode, last)
        if cells is not None:
            break
    else:
        raise ValueError(
            f"--cached-steps {path}: no cache=dual cells under cached_steps "
            f"{' or '.join(CACHED_STEPS_MODES)} at rows {list(ROWS)}, first and last block; "
            f"{RERUN}"
        )
    full = {rows: _median_mean(b, lambda s: s[0]) for rows, b in zip(ROWS, cells)}
    reuse = {
        rows: _median_mean(b, lambda s: caches_bench.mean(static_steps_bench.reuse_steps(s, mode)))
        for rows, b in zip(ROWS, cells)
    }
    meta = run.get("meta", {})
    gpu_name = meta.get("facts", {}).get("gpu", "GPU not recorded")
    command, repeats = meta.get("command", "?"), len(run["repeats"])
    return CachedSteps(full, reuse, mode, gpu_name, command, repeats, path)


# ----------------------------------------------------------------------- steps per question


@dataclass(frozen=True)
class PaperRow:
    """One task of the paper's table: its generation length and steps per question."""

    label: str
    gen_length: int
    nfe: dict[str, float]


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def paper_rows(path: Path = PAPER_TABLE) -> dict[str, PaperRow]:
    """The paper's average steps per question from docs/ALGORITHM.md's table
    `| task / L | single | majority (5) | HEX (25) | dVoting |` (cells `accuracy / steps`)."""
    lines = path.read_text().splitlines()
    header = next((_cells(x) for x in lines if x.startswith("| task / L |")), None)
    if header is None or [c.split()[0].lower() for c in header[1:]] != list(STRATEGIES):
        raise ValueError(
            f"{path}: no table headed '| task / L | single | majority (5) | HEX (25) | "
            "dVoting |' (the paper's reference numbers); restore it"
        )
    rows = {}
    for cells in map(_cells, lines):
        label, _, length = cells[0].rpartition(" / ")
        if label in TASKS and length.isdigit() and len(cells) == 1 + len(STRATEGIES):
            steps = {s: float(c.rpartition("/")[2]) for s, c in zip(STRATEGIES, cells[1:])}
            rows[label] = PaperRow(label, int(length), steps)
    missing = [label for label in TASKS if label not in rows]
    if missing:
        raise ValueError(f"{path}: the paper's table has no row for {', '.join(missing)}")
    return rows


def default_plan(strategy: str, gen_length: int) -> tuple[float | None, list[float] | None]:
    """This project's defaults at `gen_length`: steps per question and the steps per block
    of each sample kind (None for both where the entropy rule decides: dvoting)."""
    from lm_eval_dvoting.core.decoding.state import default_block_length
    from lm_eval_dvoting.core.parts.strategies.hex import BLOCK_DIVISORS
    from lm_eval_dvoting.core.settings import StrategySettings

    settings = StrategySettings(strategy=strategy, gen_length=gen_length)
    steps = settings.steps_run
    if steps is None:
        return None, None
    if strategy == "hex":
        per_block = [s / d for s, d in zip(steps, BLOCK_DIVISORS)]
        return settings.hex_samples / len(BLOCK_DIVISORS) * sum(steps), per_block
    samples = settings.n if strategy == "majority" else 1
    blocks = gen_length // default_block_length(gen_length)
    return float(samples * steps), [steps / blocks]


# ----------------------------------------------------------------------- prompts and tokens


def task_prompts(task: str, data_dir: Path) -> tuple[list[str], int]:
    """Every test document's user turn of the lm-eval task `task` (task_configs/TASK.yaml,
    rendered by its `doc_to_text` as lm-eval renders it), and the task's `max_gen_toks`."""
    from lm_eval.tasks._yaml_loader import load_yaml
    from lm_eval.utils import apply_template

    config = load_yaml(REPO / "task_configs" / f"{task}.yaml")
    docs = config["custom_dataset"](dvoting_data_dir=str(data_dir))["test"]
    render = config["doc_to_text"]
    texts = [render(doc) if callable(render) else apply_template(render, doc) for doc in docs]
    return texts, int(config["generation_kwargs"]["max_gen_toks"])


def estimated_tokens(text: str, bytes_per_token: float) -> int:
    """The estimate: the chat template's `TEMPLATE_TOKENS` + ceil(UTF-8 bytes of the user
    turn, trimmed as the template trims it, / `bytes_per_token`)."""
    return TEMPLATE_TOKENS + math.ceil(len(text.strip().encode("utf-8")) / bytes_per_token)


def tokenizer_counter(folder: Path) -> Callable[[str], int]:
    """Exact prompt tokens with the tokenizer in `folder`: its chat template with the
    generation prompt, encoded without added special tokens (as the harness encodes it)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)

    def count(text: str) -> int:
        turn = [{"role": "user", "content": text}]
        chat = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
        return len(tokenizer.encode(chat, add_special_tokens=False))

    return count


# ----------------------------------------------------------------------- the projection


@dataclass(frozen=True)
class TaskShape:
    """A task's questions as the projection sees them: prompt tokens and generation length."""

    label: str
    task: str
    gen_length: int
    prompt_tokens: tuple[int, ...]

    @property
    def lengths(self) -> list[int]:
        """Tokens per row of each question: prompt + generation region."""
        return [p + self.gen_length for p in self.prompt_tokens]


def task_seconds(lengths: Sequence[int], nfe: float, row_step: Callable[[int], float]) -> float:
    """A whole task's seconds: each question pays `nfe` row-steps at its own length,
    `row_step(tokens)` seconds each: the sum over the questions."""
    return sum(nfe * row_step(tokens) for tokens in lengths)


def none_row_step(model: StepModel, rows: int) -> Callable[[int], float]:
    """One row's share of an R-row step without a cache."""
    return lambda tokens: model.seconds(rows, tokens) / rows


def dual_row_step(model: DualModel, rows: int, per_block: list[float]) -> Callable[[int], float]:
    """One row's share of an R-row step with `cache=dual`, averaged over the sample kinds
    (hex: one per block size, each with as many steps)."""
    return lambda tokens: (
        sum(model.seconds(rows, tokens, s) for s in per_block) / (rows * len(per_block))
    )


def project(
    shape: TaskShape, paper: PaperRow, none: StepModel, dual: DualModel
) -> dict[str, Results]:
    """Per strategy: the paper's and our defaults' steps and the task's seconds per cache and
    rows (`dual` None where not projected)."""
    out = {}
    for strategy in STRATEGIES:
        ours, per_block = default_plan(strategy, shape.gen_length)
        nfe = paper.nfe[strategy]
        cells: Results = {}
        for rows in ROWS:
            cells[f"none/{rows}"] = task_seconds(shape.lengths, nfe, none_row_step(none, rows))
            cells[f"dual/{rows}"] = (
                None
                if per_block is None
                else task_seconds(shape.lengths, nfe, dual_row_step(dual, rows, per_block))
            )
        out[strategy] = {"nfe": nfe, "ours": ours, "seconds": cells}
    return out


def outside(shape: TaskShape, none: StepModel) -> list[int]:
    """The lengths of the questions outside the measured tokens (at any row count)."""
    return [t for t in shape.lengths if any(not none.measured(r, t) for r in ROWS)]


def outside_share(shape: TaskShape, none: StepModel, rows: int) -> float:
    """The share of the task's `none` time at `rows` rows that lies outside the measured
    tokens (the same for every strategy: their steps per question are constants)."""
    row_step = none_row_step(none, rows)
    return task_seconds(outside(shape, none), 1, row_step) / task_seconds(
        shape.lengths, 1, row_step
    )


def task_shapes(
    data_dir: Path, paper: dict[str, PaperRow], count: Callable[[str], int]
) -> list[TaskShape]:
    """Every task's prompt tokens (`count` of each user turn) at the paper's length, refused
    when the task's `max_gen_toks` is not the paper's L (its steps are for that L)."""
    shapes = []
    for label, task in TASKS.items():
        texts, gen_length = task_prompts(task, data_dir)
        if gen_length != paper[label].gen_length:
            raise ValueError(
                f"task_configs/{task}.yaml: max_gen_toks {gen_length}, but the paper's steps "
                f"for {label} are at L = {paper[label].gen_length}; restore the task's length"
            )
        shapes.append(TaskShape(label, task, gen_length, tuple(count(t) for t in texts)))
    return shapes


def projections(
    shapes: list[TaskShape], paper: dict[str, PaperRow], none: StepModel, dual: DualModel
) -> dict[str, dict[str, Results]]:
    """`project` for every task, by task label."""
    return {s.label: project(s, paper[s.label], none, dual) for s in shapes}


def largest_rise(
    base: dict[str, dict[str, Results]], other: dict[str, dict[str, Results]]
) -> float:
    """The largest relative change of a projected time from `base` to `other`."""
    rises = [
        other[label][strategy]["seconds"][cell] / seconds - 1
        for label, strategies in base.items()
        for strategy, row in strategies.items()
        for cell, seconds in row["seconds"].items()
        if seconds
    ]
    return max(rises)


# ----------------------------------------------------------------------- the section


def duration(seconds: float | None) -> str:
    """Seconds as a reader plans with them: s under 100 s, min under 90 min, else h;
    None (not projected): n/a."""
    if seconds is None:
        return "n/a"
    if seconds < 100:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:,.1f} h"


def gpu_of(bench: Results) -> str:
    """The GPU's short name ("NVIDIA H100 80GB HBM3": H100), or "GPU" when not recorded."""
    name = bench.get("facts", {}).get("gpu", "")
    words = name.split()
    return words[1] if len(words) > 1 and words[0] == "NVIDIA" else (name or "GPU")


def model_lines(none: StepModel, dual: DualModel, cached: CachedSteps | None = None) -> list[str]:
    """The cells the time model reads, as a table."""
    source = {
        SHORT_TOKENS: "forward part `{r}x64`: hidden states + the head, median of 5",
        dual.length: "caches part, `none`: mean step of `single`'s schedule over prompt "
        f"{CACHE_PROMPT} + generation {dual.length - CACHE_PROMPT}, median of the repeats",
    }
    lines = [
        "| rows per pass | tokens per row | ms per step | ms per row-step | cell |",
        "|---:|---:|---:|---:|---|",
    ]
    for rows, points in none.points.items():
        for tokens, seconds in points:
            cell = source[tokens].format(r=rows)
            ms = 1e3 * seconds
            lines.append(f"| {rows} | {tokens} | {ms:.1f} | {ms / rows:.2f} | {cell} |")
    lines += [
        "",
        "| rows per pass | `dual` full step ms (512 tokens) | `dual` reuse step ms (block 32) |",
        "|---:|---:|---:|",
    ]
    lines += [f"| {r} | {1e3 * dual.full[r]:.1f} | {1e3 * dual.reuse[r]:.1f} |" for r in ROWS]
    return lines + [""] + dual_source_lines(cached)


def dual_source_lines(cached: CachedSteps | None) -> list[str]:
    """Where the `dual` cells come from: the caches part of the same run, or `--cached-steps`."""
    if cached is None:
        return [
            "`dual`'s cells: the caches part of the same run (eager PyTorch, the kept keys "
            "concatenated at every step): `single`'s fixed schedule, first and last block."
        ]
    return [
        f"`dual`'s cells: `--cached-steps` run under `cached_steps={cached.mode}` "
        f"({cached.gpu}; `{cached.command}`): `single`'s fixed schedule over prompt "
        f"{CACHE_PROMPT} + answer 256, block 32, first and last block, medians of its "
        f"{cached.repeats} repeat(s); "
        + (
            "the reuse step is the mean of the block's replays (the block's refill and the "
            "shape's one capture left out, as a decode pays them once)"
            if cached.mode == "graphs"
            else "the reuse step is the mean of the block's later steps (its refill included)"
        )
        + ". It is another run than the `none` cells' (the same GPU, as recorded; not "
        "necessarily the same machine)."
    ]


def entropy_lines(bench: Results, dual: DualModel) -> list[str]:
    """dVoting's entropy rule's `none` steps in the same run against the fixed schedule's step
    that the model uses for every strategy (nothing when the run has no entropy cells)."""
    caches, parts = bench.get("caches", {}), []
    for rows in ROWS:
        later = caches_bench.entropy_steps(caches.get(str(rows), {}), "none")["later"]
        if math.isnan(later):
            return []
        fixed = dual.none.seconds(rows, dual.length)
        parts.append(f"{1e3 * later:.1f} ms at {rows} row(s), {later / fixed:.2f}x the fixed one's")
    return [
        "",
        "The model takes `single`'s fixed-schedule step for every strategy; dVoting's entropy "
        f"rule's later steps without a cache, in the same run at {dual.length} tokens: "
        f"{'; '.join(parts)}.",
    ]


def task_lines(shapes: list[TaskShape], none: StepModel) -> list[str]:
    """Each task's questions and prompt lengths, and how much of it lies outside the model."""
    shares = ", ".join(f"{r} row{'s' if r > 1 else ''}" for r in ROWS)
    lines = [
        "| task | lm-eval task | questions | L | prompt tokens, mean (min-max) "
        f"| questions outside 64-512 tokens per row | their share of the time (`none`, {shares}) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for s in shapes:
        p = s.prompt_tokens
        share = " / ".join(f"{100 * outside_share(s, none, r):.1f}%" for r in ROWS)
        lines.append(
            f"| {s.label} | `{s.task}` | {len(p):,} | {s.gen_length} | "
            f"{sum(p) / len(p):.0f} ({min(p)}-{max(p)}) | {len(outside(s, none)):,} | {share} |"
        )
    return lines


def projection_lines(
    shapes: list[TaskShape], results: dict[str, dict[str, Results]], none: StepModel
) -> list[str]:
    """The projected wall time of every task and strategy (marked where extrapolated)."""
    head = " | ".join(f"{c}, {r} row{'s' if r > 1 else ''}" for c in ("none", "dual") for r in ROWS)
    lines = [
        f"| task | strategy | steps per question (paper) | our defaults' steps | {head} |",
        "|---|---|---:|---:|" + "---:|" * (2 * len(ROWS)),
    ]
    for s in shapes:
        mark = " †" if outside(s, none) else ""
        for strategy, row in results[s.label].items():
            ours = "varies (early stop)" if row["ours"] is None else f"{row['ours']:g}"
            times = " | ".join(
                duration(row["seconds"][f"{c}/{r}"]) + (mark if row["seconds"][f"{c}/{r}"] else "")
                for c in ("none", "dual")
                for r in ROWS
            )
            lines.append(f"| {s.label} | {strategy} | {row['nfe']:g} | {ours} | {times} |")
    return lines


def check_lines(bench: Results, none: StepModel) -> list[str]:
    """The strategies part's whole-run seconds per pass (64 tokens, scheduler and rules
    included) against the model's step at 64 tokens, where its rows per pass are modelled."""
    cells = bench.get("strategies", {}).get("cells", [])
    chosen = [c for c in cells if c.get("rows_per_pass") in ROWS]
    if not chosen:
        return []
    lines = [
        "| strategy | rows per pass | measured ms per pass (strategies part, one run) "
        "| model ms per step | measured / model |",
        "|---|---:|---:|---:|---:|",
    ]
    ratios = []
    for c in chosen:
        rows = int(c["rows_per_pass"])
        measured, model = 1e3 * c["seconds_per_pass"], 1e3 * none.seconds(rows, SHORT_TOKENS)
        ratios.append(measured / model)
        lines.append(
            f"| {c['strategy']} | {rows} | {measured:.1f} | {model:.1f} | {ratios[-1]:.2f} |"
        )
    return lines + [
        "",
        f"The whole runs' passes (prompt 32 + generation 32; scheduler, rules and votes "
        f"included) took {min(ratios):.2f}x to {max(ratios):.2f}x the model's step at 64 tokens.",
    ]


def header_lines(
    bench: Results, args: argparse.Namespace, argv: list[str], cached: CachedSteps | None = None
) -> list[str]:
    """Title, command, sources and the token count method."""
    gpu, json_path = gpu_of(bench), _shown(args.json)
    tokens = (
        f"exact, with the tokenizer in `{args.tokenizer}`"
        if args.tokenizer
        else f"ESTIMATED (LLaDA's tokenizer was not available): {TEMPLATE_TOKENS} tokens of "
        "LLaDA-8B-Instruct's chat template + ceil(UTF-8 bytes of the user turn / "
        f"{args.bytes_per_token:g}); give `--tokenizer DIR` (a local LLaDA-8B-Instruct "
        "folder) for exact lengths"
    )
    return [
        START,
        f"## PROJECTION (computed, not measured): whole tasks on one {gpu} at the paper's steps",
        "",
        "Computed by `bench/projection.py` from the step times of the GPU run below and the "
        "tasks' real prompts; no model ran for this table. The module docstring gives the "
        "model in full.",
        "",
        f"- command: `{command_line('projection', argv)}` (seconds on the CPU)",
        f"- step times: `{json_path}`: {bench.get('facts', {}).get('gpu', 'GPU not recorded')}, "
        f"{bench.get('date', 'date not recorded')}, `{bench.get('command', '?')}`",
        *(
            [
                f"- `dual`'s step times: `{_shown(cached.path)}` (`cached_steps={cached.mode}`): "
                f"{cached.gpu}, `{cached.command}`"
            ]
            if cached
            else []
        ),
        "- steps per question: the paper's averages for LLaDA-8B-Instruct (docs/ALGORITHM.md, "
        '"Reference numbers"), each task at the paper\'s generation length L, which is the '
        "task's `max_gen_toks`; questions: every test document; prompts: each task's "
        "`doc_to_text` in LLaDA-8B-Instruct's chat template (`--apply_chat_template`)",
        f"- prompt tokens: {tokens}",
    ]


def _shown(path: Path) -> str:
    """`path` relative to the repository where it lies inside it."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def caveat_lines(rise: float | None, cached: CachedSteps | None = None) -> list[str]:
    """What the projection does not show."""
    kernels = (
        "eager PyTorch (no CUDA graphs, no compiled kernels)"
        if cached is None
        else f"eager PyTorch for `none`, `cached_steps={cached.mode}` for `dual` (another run)"
    )
    runs = "one run of one GPU" if cached is None else "two runs of one GPU kind"
    estimate = (
        ""
        if rise is None
        else f" The prompt lengths are estimates: at {SENSITIVITY_BYTES_PER_TOKEN:g} bytes "
        f"per token (more tokens) no time rises by more than {100 * rise:.1f}%."
    )
    return [
        "What it does not show: the step times come from random weights at LLaDA-8B's shape "
        f"in bfloat16, {kernels}, {runs}; "
        "the steps per question are the paper's averages, not this plugin's on these questions "
        "(dVoting's depend on how soon its samples agree; the fixed schedules' equal our "
        "defaults); every pass is taken as full (no padding to the longest row, no part-filled "
        "last passes); loading the model and the data and scoring the answers are left out; "
        "`dual`'s reuse step is the one measured at block 32 over 512 tokens, not at the "
        "tasks' blocks, and `dual` changes the answers (it is approximate), which the paper's "
        "steps do not account for; dVoting's `dual` cells are n/a: its entropy rule's steps "
        "per block are not known from the paper's steps per question. † marks a task with "
        "questions outside 64-512 tokens per row, whose times extend the model's line beyond "
        "what was measured (their share of the time is in the tasks' table)." + estimate,
        "",
        END,
    ]


def section(
    bench: Results,
    args: argparse.Namespace,
    argv: list[str],
    parts: tuple[list[TaskShape], dict[str, dict[str, Results]], StepModel, DualModel],
    rise: float | None,
    cached: CachedSteps | None = None,
) -> list[str]:
    """BENCHMARKS.md's section, between its markers (`cached`: `dual`'s cells from
    `--cached-steps`)."""
    shapes, results, none, dual = parts
    check = check_lines(bench, none)
    check_head = ["", "### Cross-check at 64 tokens", ""] if check else []
    return (
        header_lines(bench, args, argv, cached)
        + ["", "### Projected wall time of each whole task", ""]
        + projection_lines(shapes, results, none)
        + ["", "### The tasks", ""]
        + task_lines(shapes, none)
        + ["", "### The time model: seconds per decoding step, from the GPU run", ""]
        + model_lines(none, dual, cached)
        + entropy_lines(bench, dual)
        + check_head
        + check
        + [""]
        + caveat_lines(rise, cached)
    )


# ----------------------------------------------------------------------- command line


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench projection",
        description="Project whole-task wall times on one GPU from a GPU run's step times "
        "(reads JSON and data files only; runs on the CPU). --json: the `python -m bench gpu` "
        "run to read (default bench/results/gpu_bench_h100.json); --out: the Markdown file "
        "whose projection section is rewritten.",
    )
    add_output_flags(p, DEFAULT_BENCH, BENCHMARKS_MD, report_only=False)
    p.add_argument(
        "--data-dir",
        type=Path,
        default=os.environ.get("DVOTING_DATA_DIR"),
        help="the tasks' data files, laid out as for DVOTING_DATA_DIR (default: that variable)",
    )
    p.add_argument("--tokenizer", type=Path, help="a local tokenizer folder: exact prompt tokens")
    p.add_argument(
        "--cached-steps",
        type=Path,
        help="a `python -m bench static-steps` GPU run (bench/gpu_session.sh's "
        "static_steps_bf16.json) whose cache=dual cells (cached_steps graphs, else static) "
        "replace the --json run's; it must be of the --json run's GPU kind",
    )
    p.add_argument(
        "--bytes-per-token", type=float, default=4.0, help="the estimate's rule (no --tokenizer)"
    )
    args = p.parse_args(argv)
    check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad flags before any reading (each message names the flag and the way out)."""
    if args.data_dir is None or not Path(args.data_dir).is_dir():
        raise SystemExit(
            f"--data-dir {args.data_dir}: not a folder; give the folder of the tasks' data "
            "files (gsm8k/test.jsonl, math500/test.jsonl, ...; layout in task_configs/utils.py)"
        )
    if args.tokenizer is not None and not args.tokenizer.is_dir():
        raise SystemExit(f"--tokenizer {args.tokenizer}: not a folder; give a local tokenizer")
    if not args.bytes_per_token > 0:
        raise SystemExit(f"--bytes-per-token {args.bytes_per_token}: give a number above 0")
    if not args.json.is_file():
        raise SystemExit(f"--json {args.json}: no such file; give a `python -m bench gpu` JSON")
    if args.cached_steps is not None and not args.cached_steps.is_file():
        raise SystemExit(
            f"--cached-steps {args.cached_steps}: no such file; give a `python -m bench "
            "static-steps` JSON (bench/gpu_session.sh writes static_steps_bf16.json)"
        )


def _cached(args: argparse.Namespace, bench: Results) -> CachedSteps | None:
    """`--cached-steps`' `dual` cells, None when it is not given."""
    if args.cached_steps is None:
        return None
    try:
        run = load_json(args.cached_steps)
    except ValueError as error:
        raise ValueError(
            f"--cached-steps {args.cached_steps}: not readable JSON ({error})"
        ) from None
    gpu = bench.get("facts", {}).get("gpu", "GPU not recorded")
    return load_cached_steps(run, args.cached_steps, gpu)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    bench = load_json(args.json)
    try:
        none, dual = load_models(bench, args.json)
        cached = _cached(args, bench)
        paper = paper_rows()
    except ValueError as error:
        raise SystemExit(f"python -m bench projection: {error}") from None
    if cached is not None:
        dual = DualModel(none, cached.full, cached.reuse, dual.length)
    exact = args.tokenizer is not None
    count = tokenizer_counter(args.tokenizer) if exact else None

    def projected(bytes_per_token: float) -> tuple[list[TaskShape], dict[str, Any]]:
        counter = count or (lambda text: estimated_tokens(text, bytes_per_token))
        shapes = task_shapes(Path(args.data_dir), paper, counter)
        return shapes, projections(shapes, paper, none, dual)

    shapes, results = projected(args.bytes_per_token)
    rise = None if exact else largest_rise(results, projected(SENSITIVITY_BYTES_PER_TOKEN)[1])
    lines = section(bench, args, argv, (shapes, results, none, dual), rise, cached)
    write_section(args.out, lines, START, END)
    print("\n".join(lines[lines.index("### Projected wall time of each whole task") :]))
    return 0
