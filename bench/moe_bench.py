"""Suite `moe`: a real-shape proxy of LLaDA2.0-mini on the CPU: its mixture-of-experts layer against
a dense layer with the same active parameters. Writes its own section of BENCHMARKS.md.

    # both parts (about 5 + 7 min)
    OMP_NUM_THREADS=1 .venv/bin/python -m bench moe
    # one part, keeping the other
    OMP_NUM_THREADS=1 .venv/bin/python -m bench moe --parts cache --keep
    # a smoke run
    OMP_NUM_THREADS=1 .venv/bin/python -m bench moe --quick --out /tmp/B.md
    # rewrite the section from --json (bench/results/moe_bench.json)
    OMP_NUM_THREADS=1 .venv/bin/python -m bench moe --report-only

The model: LLaDA2.0-mini's published shape (`LLADA2_MINI` below: width 2048, 16 query and 4
key/value heads of 128, 256 experts of intermediate 512, top-8 routing within the best 4 of 8
groups, one shared expert), random weights (seeded, normal with std 0.02, zero expert bias),
one layer of its 20. float32 by default: the published weights are bfloat16, but float32 is
the dtype this package runs on a CPU (`--dtype bfloat16` runs the same cells in bfloat16).

Part `moe`: one forward call of LLaDA2's MoE MLP (`LLaDA2SparseMLP`: the group-limited router,
the routed experts, the shared expert) against a dense SwiGLU of the same active width
(top-k x moe_intermediate + shared x moe_intermediate = 4608), on the tokens of one decoding
step: `--rows` rows of one block (`--block` 32 tokens, what the block cache feeds a step) and,
unless `--no-whole`, of the whole sequence (prompt 256 + generation 256, what a step without
a cache feeds). The same for the whole `LLaDA2Layer` (attention included): the MoE layer
against the same layer with the dense-active MLP; in the block cells the block attends to
`prompt + (gen - block) / 2` cached keys (the mean over the generation's blocks). Each cell
runs the two models back to back, `--repeats` times, alternating which goes first (the load
of the shared machine drifts over minutes); the section gives the medians and the median of
the per-repeat ratios. For the block cells the MoE's time is also split into the router, the
routed experts, the experts' SwiGLUs alone (inputs gathered beforehand: the part the
dispatch in `Experts.forward` cannot change) and the shared expert.

Part `cache`: the block cache against no cache at prompt 256 + generation 256, block 32. The
model: `LLaDA2Model` at the same shape with `--depth` 2 of its 20 layers (layer 0 dense, layer
1 MoE, as `first_k_dense_replace` = 1), the embedding and untied head of 157,184 tokens, random
weights as above. `RowDecoder` decodes `--cache-rows` rows of random tokens with
`BlockDecoding(threshold=1.0, steps=--cache-steps)` (4: 8 tokens a step) and `cache` `none` or
`block`; timed is the middle block (4 of 8: 128 generated tokens before it), the blocks before
it pre-filled. The block cache's rows start one block earlier and that block's steps are left
out (its first pass runs over the whole prefix, nothing kept yet), so the timed steps find what
decoding would have kept: the first step of the block runs over the finished block + the new
one (64 tokens, 352 cached keys), the others over the block (32 tokens, 384 cached keys); no
cache runs every step over all 512 tokens. Per step: the decoder's forward pass
(`ForwardPass.run`; the head is lazy and runs after it), the whole `RowDecoder.step()` (head
at the block's masked positions and float64 rules too) and each layer (hooks), from which the
20-layer model is estimated (the forward pass + 18 more MoE layers at layer 1's time). Each row
count runs `--cache-repeats` paired decodes (no cache and block cache back to back, the order
alternating); the section gives the medians and the median of the per-repeat ratios, for the
mid-block step, the first of a block and the mean over a block decoded one token a step. Random
weights route a block's mask tokens alike (few experts hit), so the MoE layer is also timed alone
on standard-normal inputs (spread routing, as in part `moe`), block pass against whole-sequence
pass, for a second 20-layer estimate.

`PARTS` maps each part to its runner and its lines; `--parts` picks which run, and `--keep`
keeps the other parts found in `--json`, so that parts can be run apart into one section.

The section goes between `<!-- moe_bench:start -->` and `<!-- moe_bench:end -->` of `--out`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from bench.common import (
    RESULTS,
    add_output_flags,
    add_quick_flag,
    add_threads_flag,
    args_record,
    busy_processes,
    command_line,
    git_commit,
    load_average,
    load_json,
    markers,
    omp_prefix,
    run_facts,
    save_json,
    timed,
    utc_now,
    write_section,
)
from lm_eval_dvoting.core.decoding import DecodeRow, RowDecoder
from lm_eval_dvoting.core.decoding.state import BlockDecoding
from lm_eval_dvoting.models.common import PrefixCache, rotary_tables
from lm_eval_dvoting.models.families import FAMILIES
from lm_eval_dvoting.models.llada2 import LLaDA2Config, LLaDA2Layer, LLaDA2Model

START, END = markers("moe_bench")
GOAL_RATIO = 1.5  # MoE / dense-active at 16 rows (issue)
CACHE_GOAL = 5.0  # no cache / block cache, per step at prompt 256 + generation 256 (issue)
Results = dict[str, Any]

# inclusionAI/LLaDA2.0-mini's config.json, the fields the forward pass reads. Source: the
# config.json of inclusionAI/LLaDA2.1-mini (https://huggingface.co/inclusionAI/LLaDA2.1-mini/
# blob/main/config.json: same `LLaDA2MoeModelLM`, 16B total / 1.4B active), identical in every
# field below to that of Zigeng/DMax-Math-16B (a LLaDA2.0-mini fine-tune, https://huggingface.co/
# Zigeng/DMax-Math-16B/blob/main/config.json); the LLaDA2.0-mini file itself (huggingface.co/
# inclusionAI/LLaDA2.0-mini/blob/main/config.json) was not readable from here. Cross-checks:
# 20 layers, 16 heads, vocabulary 157,184, 16B total and 1.4B active parameters as the model
# card and its reviews say (`parameter_counts` gives 16.3B and 1.43B from these fields).
LLADA2_MINI: dict[str, Any] = {
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_hidden_layers": 20,
    "intermediate_size": 5120,
    "vocab_size": 157184,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 512,
    "num_shared_experts": 1,
    "n_group": 8,
    "topk_group": 4,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1,
    "partial_rotary_factor": 0.5,
    "rope_theta": 600000,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "max_position_embeddings": 32768,
}
CONFIG_SOURCE = (
    "inclusionAI/LLaDA2.1-mini `config.json` (same architecture and size as LLaDA2.0-mini; "
    "equal in these fields to the LLaDA2.0-mini fine-tune Zigeng/DMax-Math-16B's)"
)
DTYPE_NOTE = {
    "float32": " (the published weights are bfloat16; float32 is what this package runs on a CPU)"
}
# a tiny model of the same structure, for --quick
QUICK: dict[str, Any] = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 32,
    "n_group": 4,
    "topk_group": 2,
    "intermediate_size": 128,
    "vocab_size": 1000,
}


# ----------------------------------------------------------------- the proxy


def proxy_config(quick: bool = False) -> LLaDA2Config:
    """LLaDA2.0-mini's config (tiny with `quick`)."""
    return LLaDA2Config.from_dict({**LLADA2_MINI, **(QUICK if quick else {})})


def dense_active_width(cfg: LLaDA2Config) -> int:
    """The intermediate size of a SwiGLU with the MoE MLP's active parameters (router aside)."""
    return (cfg.num_experts_per_tok + cfg.num_shared_experts) * cfg.moe_intermediate_size


def parameter_counts(cfg: LLaDA2Config) -> tuple[int, int]:
    """(total, active per token) parameters of the whole model (norms left out)."""
    h, heads = cfg.hidden_size, cfg.num_attention_heads + 2 * cfg.kv_heads
    attention = h * heads * cfg.dim_per_head + cfg.num_attention_heads * cfg.dim_per_head * h
    expert = 3 * h * cfg.moe_intermediate_size
    moe_layers = cfg.num_hidden_layers - cfg.first_k_dense_replace
    dense = cfg.first_k_dense_replace * (attention + 3 * h * cfg.intermediate_size)
    shared = (attention + cfg.num_experts * h + cfg.num_shared_experts * expert) * moe_layers
    head = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    total = dense + shared + cfg.num_experts * expert * moe_layers + head
    return total, dense + shared + cfg.num_experts_per_tok * expert * moe_layers + head


def random_layers(cfg: LLaDA2Config, dtype: torch.dtype, seed: int) -> dict[str, LLaDA2Layer]:
    """The MoE layer and the same layer with the dense-active MLP, random weights."""
    dense_cfg = LLaDA2Config.from_dict(
        {**asdict(cfg), "intermediate_size": dense_active_width(cfg), "first_k_dense_replace": 1}
    )
    torch.manual_seed(seed)
    with torch.device("meta"):  # no default initialisation: 256 experts' kaiming init costs seconds
        layers = {"moe": LLaDA2Layer(cfg, 1), "dense": LLaDA2Layer(dense_cfg, 0)}
    for name, layer in layers.items():
        layers[name] = layer.to_empty(device="cpu").to(dtype).eval().requires_grad_(False)
        fill_random(layers[name])
    return layers


@torch.no_grad()
def fill_random(module: torch.nn.Module, std: float = 0.02) -> None:
    """Matrices normal(0, std), norm weights 1, buffers (the router's expert bias) 0."""
    for p in module.parameters():
        if p.dim() >= 2:
            p.normal_(0, std)
        else:
            p.fill_(1.0)
    for b in module.buffers():
        b.zero_()


# ----------------------------------------------------------------- cells


@dataclass(frozen=True)
class Cell:
    """What one step feeds: `rows` x `tokens` through the MLP or the layer (with `prefix` cached
    keys)."""

    kind: str
    rows: int
    tokens: int
    prefix: int = 0

    @property
    def name(self) -> str:
        cached = f" + {self.prefix} cached keys" if self.prefix else ""
        return f"{self.kind} {self.rows}x{self.tokens}{cached}"


def cells_of(args: argparse.Namespace) -> list[Cell]:
    """The block cells, then the whole-sequence cells, for every kind and row count."""
    whole = args.prompt_length + args.gen_length
    prefix = args.prompt_length + (args.gen_length - args.block) // 2
    shapes = [(args.block, prefix)] + ([] if args.no_whole else [(whole, 0)])
    return [
        Cell(kind, rows, tokens, prefix if kind == "layer" else 0)
        for kind in args.kinds
        for tokens, prefix in shapes
        for rows in args.rows
    ]


def step_input(cell: Cell, width: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """The hidden states of one step: (rows, tokens, width), standard normal (about what a norm
    gives)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(cell.rows, cell.tokens, width, generator=gen).to(dtype)


def step_call(
    layer: LLaDA2Layer, cfg: LLaDA2Config, cell: Cell, dtype: torch.dtype, seed: int
) -> Callable[[], torch.Tensor]:
    """A call of `layer` (its MLP for kind `mlp`) on the cell's random inputs; in a layer cell
    with a prefix, the block attends to that many cached keys (random) as well."""
    x = step_input(cell, cfg.hidden_size, dtype, seed)
    if cell.kind == "mlp":
        return lambda: layer.mlp(x)
    gen = torch.Generator().manual_seed(seed + 1)
    shape = (cell.rows, cfg.kv_heads, cell.prefix, cfg.dim_per_head)
    keys, values = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
    positions = torch.arange(cell.prefix, cell.prefix + cell.tokens).expand(cell.rows, -1)
    rotary = rotary_tables(positions, cfg.rotary_dim, cfg.rope_theta, dtype)  # as the model

    def call() -> torch.Tensor:
        cache = (
            PrefixCache(keys=[keys], values=[values]) if cell.prefix else None
        )  # fresh: a pass appends to it
        return layer(x, rotary, None, cache, 0)

    return call


def moe_parts(mlp: torch.nn.Module, x: torch.Tensor, reverse: bool) -> dict[str, float]:
    """Seconds of the MoE MLP's parts: router, routed experts, their SwiGLUs alone (on inputs
    gathered beforehand), shared expert; timed in turn, in reverse order when `reverse`."""
    flat = x.reshape(-1, x.shape[-1])
    chosen, weights = mlp.gate(flat)
    routing = mlp.experts.route(chosen.sort(dim=1).values)
    gathered = flat[routing.order // chosen.shape[1]]
    calls = {
        "router": lambda: mlp.gate(flat),
        "experts": lambda: mlp.experts(flat, chosen, weights),
        "swiglus": lambda: mlp.experts.run(gathered, routing),
        "shared": lambda: mlp.shared_experts(x) if mlp.shared_experts is not None else None,
    }
    return {name: timed(calls[name]) for name in (reversed(calls) if reverse else calls)}


def experts_used(mlp: torch.nn.Module, x: torch.Tensor) -> int:
    """How many distinct experts the router sends the step's tokens to."""
    chosen, _ = mlp.gate(x.reshape(-1, x.shape[-1]))
    return int(chosen.unique().numel())


@torch.inference_mode()
def run_cell(
    layers: dict[str, LLaDA2Layer],
    cfg: LLaDA2Config,
    cell: Cell,
    args: argparse.Namespace,
    dtype: torch.dtype,
) -> Results:
    """`args.repeats` paired timings of the MoE and the dense-active model on one cell."""
    calls = {name: step_call(layer, cfg, cell, dtype, args.seed) for name, layer in layers.items()}
    x = step_input(cell, cfg.hidden_size, dtype, args.seed)
    for call in calls.values():
        call()  # warm-up
    result: Results = {
        "moe": [],
        "dense": [],
        "parts": [],
        "experts_used": experts_used(layers["moe"].mlp, x),
    }
    for repeat in range(args.repeats):
        for name in ("moe", "dense") if repeat % 2 == 0 else ("dense", "moe"):
            result[name].append(timed(calls[name]))
        if cell.kind == "mlp" and cell.tokens == args.block:
            result["parts"].append(moe_parts(layers["moe"].mlp, x, reverse=repeat % 2 == 1))
    return result


def run_moe(args: argparse.Namespace, save: Callable[[Results], None]) -> Results:
    """Part `moe`: every cell; saved after each."""
    dtype = getattr(torch, args.dtype)
    cfg = proxy_config(args.quick)
    part: Results = {
        "meta": start_meta(args),
        "cells": {},
        "model": {
            "config": asdict(cfg),
            "dense_width": dense_active_width(cfg),
            "counts": parameter_counts(cfg),
            "dtype": args.dtype,
            "quick": args.quick,
        },
    }
    began = time.perf_counter()
    layers = random_layers(cfg, dtype, args.seed)
    for cell in cells_of(args):
        part["cells"][cell.name] = {
            "cell": asdict(cell),
            **run_cell(layers, cfg, cell, args, dtype),
        }
        times = part["cells"][cell.name]
        print(
            f"  [{cell.name}] MoE {1000 * statistics.median(times['moe']):.1f} ms, dense "
            f"{1000 * statistics.median(times['dense']):.1f} ms",
            flush=True,
        )
        save(part)
    part["meta"].update(
        elapsed=time.perf_counter() - began, load_after=load_average(), busy_after=busy_processes()
    )
    save(part)
    return part


# ----------------------------------------------------------------- part `cache`


def random_model(cfg: LLaDA2Config, depth: int, dtype: torch.dtype, seed: int) -> LLaDA2Model:
    """`LLaDA2Model` at `cfg`'s shape with its first `depth` layers, random weights (`fill_random`),
    the official mask id and no end token (random weights would end a row at random)."""
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = LLaDA2Model(LLaDA2Config.from_dict({**asdict(cfg), "num_hidden_layers": depth}))
    model = model.to_empty(device="cpu").to(dtype).eval().requires_grad_(False)
    fill_random(model)
    model.mask_token_id = min(FAMILIES["llada2"].ids.mask, cfg.vocab_size - 1)
    model.end_token_ids = ()
    model.max_length = cfg.max_position_embeddings
    return model


def timed_block(gen_length: int, block: int) -> int:
    """The block whose steps are timed: the middle one (block 4 of 8 at 256 / 32)."""
    return gen_length // block // 2


def cache_rows(
    args: argparse.Namespace, model: LLaDA2Model, cache: str, rows: int
) -> list[DecodeRow]:
    """`rows` rows of random tokens, blocks before the timed one pre-filled; the block cache's rows
    from one block earlier, so that decoding that block fills their cache as decoding would."""
    gen, mask = torch.Generator().manual_seed(args.seed), model.mask_token_id
    filled = args.block * (timed_block(args.gen_length, args.block) - (cache == "block"))
    out = []
    for _ in range(rows):
        prompt = torch.randint(0, mask, (args.prompt_length,), generator=gen)
        tokens = torch.full((args.gen_length,), mask, dtype=torch.long)
        tokens[:filled] = torch.randint(0, mask, (filled,), generator=gen)
        out.append(
            DecodeRow(
                prompt=prompt,
                tokens=tokens,
                block_length=args.block,
                cache=cache,
                block=BlockDecoding(threshold=1.0, steps=args.cache_steps),
            )
        )
    return out


def layer_clock(model: LLaDA2Model, record: Results) -> list[Any]:
    """Hooks that add each layer's seconds to `record["layers"]`, the pass's (rows, tokens) to
    `record["shape"]` and how many experts the last layer's router picks to `record["experts"]`;
    returns their handles."""

    def before(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        record["shape"] = list(inputs[0].shape[:2])
        record["layers"].append(-time.perf_counter())

    def after(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        record["layers"][-1] += time.perf_counter()

    def routed(
        module: torch.nn.Module, inputs: Any, output: tuple[torch.Tensor, torch.Tensor]
    ) -> None:
        record["experts"] = int(output[0].unique().numel())

    layers = model.model.layers
    handles = [
        h
        for layer in layers
        for h in (layer.register_forward_pre_hook(before), layer.register_forward_hook(after))
    ]
    gate = getattr(layers[-1].mlp, "gate", None)
    return handles + ([gate.register_forward_hook(routed)] if gate is not None else [])


def timed_step(decoder: RowDecoder) -> Results:
    """One `decoder.step()`: where the first row stood (block, step in block, cached keys), the
    pass's shape, and the seconds of the whole step, of its forward pass and of each layer."""
    row, record = decoder.active[0], {"layers": []}
    run = decoder.forward.run

    def forward_run(*a: Any) -> Any:
        start = time.perf_counter()
        try:
            return run(*a)
        finally:
            record["forward"] = time.perf_counter() - start

    kept = 0 if row.kept is None else int(row.kept.prefix_keys[0].shape[1])
    where = {"block": row.progress.block, "step": row.progress.step_in_block, "kept": kept}
    decoder.forward.run, handles = forward_run, layer_clock(decoder.model, record)
    try:
        record["seconds"] = timed(decoder.step)
    finally:
        decoder.forward.run = run
        for handle in handles:
            handle.remove()
    return {**where, **record}


@torch.inference_mode()
def decode_steps(
    model: LLaDA2Model, args: argparse.Namespace, cache: str, rows: int
) -> list[Results]:
    """Every step of one decode of `cache_rows`, up to the end of the timed block."""
    decoder = RowDecoder(model)
    for row in cache_rows(args, model, cache, rows):
        decoder.add(row)
    steps = []
    while decoder.active and decoder.active[0].progress.block <= timed_block(
        args.gen_length, args.block
    ):
        steps.append(timed_step(decoder))
    return steps


def run_cache_cell(
    model: LLaDA2Model, args: argparse.Namespace, rows: int, repeats: int
) -> Results:
    """`repeats` paired decodes, no cache and block cache back to back (the order alternating), then
    the MoE layer on spread inputs (`spread_moe`)."""
    cell: Results = {"rows": rows, "none": [], "block": []}
    for repeat in range(repeats):
        for cache in ("none", "block") if repeat % 2 == 0 else ("block", "none"):
            cell[cache].append(decode_steps(model, args, cache, rows))
    cell["spread"] = spread_moe(model, args, rows, repeats)
    return cell


@torch.inference_mode()
def spread_moe(model: LLaDA2Model, args: argparse.Namespace, rows: int, repeats: int) -> Results:
    """The model's MoE layer on standard-normal inputs (which its router spreads over the experts,
    as a balanced router spreads distinct tokens; part `moe`'s `step_call`): a mid-block pass of the
    timed block (its tokens + the cached keys before it) and a pass over the whole sequence,
    paired."""
    cfg, dtype = model.config, next(model.parameters()).dtype
    prefix = args.prompt_length + timed_block(args.gen_length, args.block) * args.block
    cells = {
        "block": Cell("layer", rows, args.block, prefix),
        "none": Cell("layer", rows, args.prompt_length + args.gen_length),
    }
    layer = model.model.layers[-1]
    calls = {name: step_call(layer, cfg, cell, dtype, args.seed) for name, cell in cells.items()}
    for call in calls.values():
        call()  # warm-up
    out: Results = {
        "none": [],
        "block": [],
        "experts": experts_used(
            layer.mlp, step_input(cells["block"], cfg.hidden_size, dtype, args.seed)
        ),
    }
    for repeat in range(repeats):
        for name in ("none", "block") if repeat % 2 == 0 else ("block", "none"):
            out[name].append(timed(calls[name]))
    return out


def run_cache(args: argparse.Namespace, save: Callable[[Results], None]) -> Results:
    """Part `cache`: a decode at each row count; saved after each."""
    dtype = getattr(torch, args.dtype)
    cfg = proxy_config(args.quick)
    part: Results = {
        "meta": start_meta(args),
        "cells": {},
        "model": {
            "config": asdict(cfg),
            "dense_width": dense_active_width(cfg),
            "depth": args.depth,
            "dtype": args.dtype,
            "quick": args.quick,
        },
    }
    began = time.perf_counter()
    model = random_model(cfg, args.depth, dtype, args.seed)
    part["meta"]["build_seconds"] = time.perf_counter() - began
    for k, rows in enumerate(args.cache_rows):
        repeats = args.cache_repeats[min(k, len(args.cache_repeats) - 1)]
        cell = part["cells"][str(rows)] = run_cache_cell(model, args, rows, repeats)
        save(part)
        s = cache_summary(cell, "forward", part)
        print(
            f"  [cache, {rows} row(s)] forward passes, mid-block: none {s['none']['mid']:.1f} "
            f"ms, block {s['block']['mid']:.1f} ms; first of a block: {s['block']['first']:.1f} "
            "ms",
            flush=True,
        )
    part["meta"].update(
        elapsed=time.perf_counter() - began, load_after=load_average(), busy_after=busy_processes()
    )
    save(part)
    return part


# ----------------------------------------------------------------- the machine


def start_meta(args: argparse.Namespace) -> Results:
    """The command, machine, date, commit and the other processes, at the start of a part."""
    command = omp_prefix() + command_line("moe", args.argv)
    meta = run_facts(command)
    return {
        "command": meta["command"],
        "date": utc_now(),
        "commit": git_commit(),
        **{k: meta[k] for k in ("facts", "load_before", "uptime_before", "busy")},
    }


# ----------------------------------------------------------------- the section


def ms(seconds: list[float]) -> float:
    return 1000 * statistics.median(seconds)


def ratios(cell: Results) -> list[float]:
    """MoE / dense time within each repeat (the two ran back to back)."""
    return [m / d for m, d in zip(cell["moe"], cell["dense"])]


def mlp_flops(model: Results, cell: Results) -> float:
    """Multiply-adds x 2 of the dense-active MLP on the cell's tokens (the MoE's too, router
    aside)."""
    c = cell["cell"]
    return 2 * 3 * model["config"]["hidden_size"] * model["dense_width"] * c["rows"] * c["tokens"]


def weight_mib(model: Results, cell: Results) -> tuple[float, float]:
    """MiB of weights (MoE, dense) a call reads: the experts hit, the shared one and the router
    (float32) against the dense MLP; plus the attention's in a layer cell."""
    cfg, size = model["config"], torch.finfo(getattr(torch, model["dtype"])).bits // 8
    h, inter = cfg["hidden_size"], cfg["moe_intermediate_size"]
    moe = (cell["experts_used"] + cfg["num_shared_experts"]) * 3 * h * inter * size + cfg[
        "num_experts"
    ] * h * 4
    dense = 3 * h * model["dense_width"] * size
    if cell["cell"]["kind"] == "layer":
        heads = cfg["num_attention_heads"] + 2 * (
            cfg["num_key_value_heads"] or cfg["num_attention_heads"]
        )
        attention = (heads + cfg["num_attention_heads"]) * cfg["head_dim"] * h * size
        moe, dense = moe + attention, dense + attention
    return moe / 2**20, dense / 2**20


def cell_row(model: Results, name: str, cell: Results) -> str:
    """One table row: sizes, weights read, medians, the ratio with its range, GFLOP/s (MLP
    cells)."""
    c, r = cell["cell"], ratios(cell)
    moe_w, dense_w = weight_mib(model, cell)
    speed = " | |"
    if c["kind"] == "mlp":
        moe_speed, dense_speed = (
            mlp_flops(model, cell) / statistics.median(cell[k]) / 1e9 for k in ("moe", "dense")
        )
        speed = f" {moe_speed:.0f} | {dense_speed:.0f} |"
    return (
        f"| {name} | {c['rows'] * c['tokens']} | {cell['experts_used']} | {moe_w:,.0f} / "
        f"{dense_w:,.0f} | {ms(cell['moe']):.1f} | {ms(cell['dense']):.1f} | "
        f"{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f}) |{speed}"
    )


def cells_table(part: Results) -> list[str]:
    experts = part["model"]["config"]["num_experts"]
    lines = [
        f"| cell (rows x tokens) | tokens | experts hit (of {experts}) by the step's input | "
        "weights read MiB, MoE / dense | MoE ms | dense ms | MoE / dense: median of repeats "
        "(range) | MoE GFLOP/s | dense GFLOP/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    return lines + [cell_row(part["model"], name, cell) for name, cell in part["cells"].items()]


def part_medians(cell: Results) -> dict[str, float]:
    """Median ms of each MoE part over the repeats; `dispatch`: the median of the per-repeat
    differences experts - SwiGLUs alone (the two ran back to back)."""
    runs = cell["parts"]
    medians = {key: ms([run[key] for run in runs]) for key in runs[0]}
    return {**medians, "dispatch": ms([run["experts"] - run["swiglus"] for run in runs])}


def parts_table(part: Results) -> list[str]:
    """Where the MoE MLP's time goes in the block cells (medians of the repeats)."""
    lines = [
        "| cell | router ms | routed experts ms | of which the SwiGLUs alone | dispatch: the "
        "rest (median of repeats) | shared expert ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, cell in part["cells"].items():
        if cell["parts"]:
            p = part_medians(cell)
            lines.append(
                f"| {name} | {p['router']:.1f} | {p['experts']:.1f} | {p['swiglus']:.1f} | "
                f"{p['dispatch']:.1f} ({100 * p['dispatch'] / p['experts']:.0f}%) | "
                f"{p['shared']:.1f} |"
            )
    return lines


def find_cell(part: Results, kind: str, rows: int, tokens: int) -> Results | None:
    return next(
        (
            c
            for c in part["cells"].values()
            if (c["cell"]["kind"], c["cell"]["rows"], c["cell"]["tokens"]) == (kind, rows, tokens)
        ),
        None,
    )


def goal_lines(part: Results) -> list[str]:
    """The verdict on the issue's goal: the MoE MLP within 1.5x of dense-active at 16 rows of a
    block."""
    a = part["args"]
    cell = find_cell(part, "mlp", max(a["rows"]), a["block"])
    if cell is None:
        return ["- goal: not measured (no block cell at 16 rows)."]
    ratio = statistics.median(ratios(cell))
    verdict = "met" if ratio <= GOAL_RATIO else "**missed**"
    layer = find_cell(part, "layer", max(a["rows"]), a["block"])
    diluted = (
        ""
        if layer is None
        else (
            f" (the whole layer, attention over the cached keys included: "
            f"{statistics.median(ratios(layer)):.2f}x)"
        )
    )
    return [
        f"- **Goal** (issue): the MoE MLP within {GOAL_RATIO}x of its dense-active equivalent at "
        f"{max(a['rows'])} rows x {a['block']} tokens: {ratio:.2f}x, {verdict}{diluted}."
    ]


def why_lines(part: Results) -> list[str]:
    """The reasons behind the ratios, with this run's numbers."""
    a, model, cfg = part["args"], part["model"], part["model"]["config"]
    lines = []
    big = find_cell(part, "mlp", max(a["rows"]), a["block"])
    if big is not None:
        tokens = big["cell"]["rows"] * big["cell"]["tokens"]
        moe_w, dense_w = weight_mib(model, big)
        flops = mlp_flops(model, big)
        lines.append(
            f"- At {big['cell']['rows']} rows x {big['cell']['tokens']} tokens = {tokens} "
            f"tokens and top-{cfg['num_experts_per_tok']}, the router makes "
            f"{tokens * cfg['num_experts_per_tok']} assignments; they hit {big['experts_used']} "
            f"of the {cfg['num_experts']} experts, about "
            f"{tokens * cfg['num_experts_per_tok'] / big['experts_used']:.0f} tokens each. Both "
            f"layers do the same multiply-adds, but the MoE's come as {big['experts_used']} x 3 "
            f"GEMMs of ~{tokens * cfg['num_experts_per_tok'] // big['experts_used']} rows that "
            f"read {moe_w:,.0f} MiB of weights, the dense layer's as 3 GEMMs of {tokens} rows "
            f"over {dense_w:,.0f} MiB. The CPU's GEMM (MKL, one thread) runs at "
            f"{flops / statistics.median(big['moe']) / 1e9:.0f} GFLOP/s on the MoE and "
            f"{flops / statistics.median(big['dense']) / 1e9:.0f} on the dense layer: a GEMM of "
            "a few rows streams and packs a whole weight matrix for little arithmetic. That "
            f"nearly every expert is hit is the nature of a {tokens}-token step at "
            f"top-{cfg['num_experts_per_tok']}, not of this implementation."
        )
    lines += dispatch_lines(part) + small_lines(part) + whole_lines(part) + gpu_lines(part)
    return lines


def dispatch_lines(part: Results) -> list[str]:
    """How much of the MoE's time its dispatch takes, and what is left without it."""
    big = find_cell(part, "mlp", max(part["args"]["rows"]), part["args"]["block"])
    if big is None or not big["parts"]:
        return []
    p = part_medians(big)
    dispatch = p["dispatch"]
    share = f"{dispatch:.0f} ms of the routed experts' {p['experts']:.0f} ms"
    if abs(dispatch) <= 0.05 * p["experts"]:
        share = (
            f"small: {dispatch:+.0f} ms of the routed experts' {p['experts']:.0f} ms, within "
            "the noise of timing the two apart"
        )
    floor = (p["swiglus"] + p["shared"]) / ms(big["dense"])
    return [
        "- The dispatch in `Experts.forward` (sorting the assignments, gathering each expert's "
        f"tokens, weighting and adding each token's outputs) is {share}; the "
        f"experts' SwiGLUs on inputs gathered beforehand take {p['swiglus']:.0f} ms. Those "
        f"SwiGLUs and the shared expert alone come to {floor:.2f}x the dense layer's time, so "
        f"no dispatch could meet the goal with these GEMMs; the router adds {p['router']:.0f} "
        "ms."
    ]


def small_lines(part: Results) -> list[str]:
    a, cfg = part["args"], part["model"]["config"]
    one = find_cell(part, "mlp", min(a["rows"]), a["block"])
    if one is None or min(a["rows"]) == max(a["rows"]):
        return []
    tokens = one["cell"]["rows"] * one["cell"]["tokens"]
    assignments = tokens * cfg["num_experts_per_tok"]
    moe_w, dense_w = weight_mib(part["model"], one)
    return [
        f"- At {one['cell']['rows']} row ({tokens} tokens, {assignments} assignments) "
        f"{one['experts_used']} experts are hit with ~{assignments / one['experts_used']:.1f} "
        f"tokens each: the step reads {moe_w:,.0f} MiB of weights against {dense_w:,.0f} MiB "
        f"for the same arithmetic (at {moe_w * 2**20 / statistics.median(one['moe']) / 1e9:.0f} "
        "GB/s), so its cost follows the weights it touches, not its arithmetic, and the MoE "
        f"takes {statistics.median(ratios(one)):.1f}x the dense layer's time."
    ]


def whole_lines(part: Results) -> list[str]:
    a, cfg = part["args"], part["model"]["config"]
    whole = find_cell(part, "mlp", max(a["rows"]), a["prompt_length"] + a["gen_length"])
    if whole is None:
        return []
    tokens, ratio = (
        whole["cell"]["rows"] * whole["cell"]["tokens"],
        statistics.median(ratios(whole)),
    )
    per_expert = tokens * cfg["num_experts_per_tok"] // cfg["num_experts"]
    within = "within" if ratio <= GOAL_RATIO else "still outside"
    return [
        f"- Without a cache a step feeds the whole sequence: at {whole['cell']['rows']} rows x "
        f"{whole['cell']['tokens']} tokens each expert gets ~{per_expert} tokens, and the MoE "
        f"takes {ratio:.2f}x the dense layer, {within} {GOAL_RATIO}x: the closer a call comes "
        "to hundreds of tokens per expert, the closer the MoE comes to the cost of its active "
        "parameters."
    ]


def gpu_lines(part: Results) -> list[str]:
    """What a GPU would change: an estimate from the byte and FLOP counts, not a measurement."""
    a, model, cfg = part["args"], part["model"], part["model"]["config"]
    tokens = max(a["rows"]) * a["block"]
    h, inter = cfg["hidden_size"], cfg["moe_intermediate_size"]
    moe_gib = (cfg["num_experts"] + cfg["num_shared_experts"]) * 3 * h * inter * 2 / 2**30
    dense_mib = 3 * h * model["dense_width"] * 2 / 2**20
    gflop = 2 * 3 * h * model["dense_width"] * tokens / 1e9
    return [
        "- On a GPU (not measured: this machine has none) the grouped GEMMs (models/moe.py, "
        "bfloat16 on compute capability 9/10) run all experts in 3 kernels instead of "
        f"{3 * cfg['num_experts']} small ones, which removes the launch and dispatch overheads "
        f"but not the weight traffic: a {tokens}-token step still "
        f"reads every expert, {moe_gib:.2f} GiB in bfloat16 against {dense_mib:.0f} MiB for the "
        f"dense-active layer, for {gflop:.0f} GFLOP either way. On an H100 (assumed 3.3 TB/s "
        f"and 500 bf16 TFLOP/s) that is about {moe_gib * 2**30 / 3.3e12 * 1e3:.2f} ms of reads "
        f"against about {gflop / 500e3 * 1e3:.2f} ms of dense arithmetic (estimates): the ratio "
        f"there would be further from {GOAL_RATIO}x, not closer. What the MoE saves is against "
        "a dense model of its *total* size (the arithmetic of 1.4B parameters per token "
        "instead of 16B); against the dense-active layer it loses whenever a step's tokens "
        "spread over all experts, since the dense weights serve every token and each expert's "
        "only a few."
    ]


def machine_lines(meta: Results, args: Results, runs: str | None = None) -> list[str]:
    """The command, machine, settings (`runs`: how the timings were repeated; default part `moe`'s),
    load and the other busy processes of a part."""
    runs = (
        runs
        or f"repeats: {args['repeats']} (paired, the order alternating), one warm-up call per "
        "model and cell"
    )
    lines = [
        "Machine and command:",
        "",
        f"- command: `{meta['command']}` (from the repository root)",
        f"- date: {meta['date']}; commit: {meta['commit']}",
    ]
    lines += [f"- {k}: {v}" for k, v in meta["facts"].items()]
    lines += [
        f"- threads: {args['threads']}, dtype: {args['dtype']}, {runs}",
        f"- load average before: {meta['load_before']}, after: {meta.get('load_after')}; other "
        "busy processes (1% CPU or more) at the start (the 2 cores are shared):",
    ]
    lines += [f"  - `{b}`" for b in busy(meta["busy"])]
    if meta.get("busy_after"):
        lines += ["- and at the end:"] + [f"  - `{b}`" for b in busy(meta["busy_after"])]
    return lines + [f"- wall time of the part: {meta.get('elapsed', 0) / 60:.1f} min"]


def busy(processes: list[str]) -> list[str]:
    """The entries of `busy_processes` ("  12.3% command") that use 1% of a core or more."""
    return [p for p in processes if float(p.split("%", 1)[0] or 0) >= 1.0]


def moe_lines(part: Results) -> list[str]:
    """Part `moe`'s subsection."""
    model, a = part["model"], part["args"]
    total, active = model["counts"]
    quick = " (**--quick: a tiny model, not the real shape**)" if model["quick"] else ""
    return [
        "### The MoE layer against its dense-active equivalent" + quick,
        "",
        "One call per step shape; *MLP* = `LLaDA2SparseMLP` (router, "
        f"{model['config']['num_experts']} routed experts, shared expert) against a SwiGLU of "
        f"intermediate {model['dense_width']}; *layer* = the whole `LLaDA2Layer` (norms, "
        f"attention, MLP) with either MLP; in the block cells of the layer the {a['block']} "
        f"tokens attend to {a['prompt_length'] + (a['gen_length'] - a['block']) // 2} cached "
        f"keys as well (prompt {a['prompt_length']} + generation {a['gen_length']}: the mean "
        f"over the blocks). The MoE's config gives {total / 1e9:.1f}B parameters in all and "
        f"{active / 1e9:.2f}B active per token for the whole model (the published 16B / 1.4B).",
        "",
        *cells_table(part),
        "",
        "Where the MoE MLP's time goes (block cells, medians of the repeats):",
        "",
        *parts_table(part),
        "",
        *goal_lines(part),
        *why_lines(part),
        "",
        *machine_lines(part["meta"], a),
        "",
    ]


# ----------------------------------------------------------------- part `cache`'s section

# A step's seconds, by what is timed: the forward pass, the whole step (head and rules too), a
# layer (0: dense, -1: MoE); `_full`: with `extra` more MoE layers (the 20-layer model, estimated).
METRICS: dict[str, Callable[[Results, int], float]] = {
    "forward": lambda s, extra: s["forward"],
    "step": lambda s, extra: s["seconds"],
    "forward_full": lambda s, extra: s["forward"] + extra * s["layers"][-1],
    "step_full": lambda s, extra: s["seconds"] + extra * s["layers"][-1],
    "dense": lambda s, extra: s["layers"][0],
    "moe": lambda s, extra: s["layers"][-1],
}


def timed_steps(decode: list[Results], block: int) -> list[Results]:
    """The steps of one decode in the timed block (the block cache's earlier block left out)."""
    return [s for s in decode if s["block"] == block]


def step_kinds(seconds: list[float], block: int) -> dict[str, float]:
    """A decode's timed steps by kind: `first` (of the block), `mid` (median of the others), `mean`
    (the mean over a block decoded one token a step: 1 first + block - 1 mid)."""
    first, mid = seconds[0], statistics.median(seconds[1:])
    return {"first": first, "mid": mid, "mean": (first + (block - 1) * mid) / block}


def repeat_seconds(
    cell: Results, metric: str, repeat: int, part: Results
) -> dict[str, dict[str, float]]:
    """One repeat's seconds by cache (`none`, `block`) and step kind. The two are paired by the
    step's place in the block: no cache's passes are alike, but the head's and the rules' work is
    not (it follows the block's masked positions)."""
    a, cfg = part["args"], part["model"]["config"]
    block, extra = (
        timed_block(a["gen_length"], a["block"]),
        cfg["num_hidden_layers"] - part["model"]["depth"],
    )
    return {
        cache: step_kinds(
            [METRICS[metric](s, extra) for s in timed_steps(cell[cache][repeat], block)], a["block"]
        )
        for cache in ("none", "block")
    }


def cache_summary(cell: Results, metric: str, part: Results) -> Results:
    """Medians over the repeats (ms) by cache and step kind, and the per-repeat ratios none /
    block."""
    runs, kinds = (
        [repeat_seconds(cell, metric, r, part) for r in range(len(cell["none"]))],
        ("first", "mid", "mean"),
    )
    out: Results = {
        cache: {k: ms([run[cache][k] for run in runs]) for k in kinds}
        for cache in ("none", "block")
    }
    out["ratios"] = {k: [run["none"][k] / run["block"][k] for run in runs] for k in kinds}
    return out


def ratio_text(values: list[float]) -> str:
    """Median of the per-repeat ratios (their range)."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def pass_shape(cell: Results, part: Results) -> dict[str, str]:
    """What each kind of step's pass covers: rows x tokens + the cached keys it attends to."""
    block = timed_block(part["args"]["gen_length"], part["args"]["block"])
    none, cached = timed_steps(cell["none"][0], block)[0], timed_steps(cell["block"][0], block)

    def text(s: Results) -> str:
        return f"{s['shape'][0]} x {s['shape'][1]}" + (
            f" + {s['kept']} cached" if s["kept"] else ""
        )

    return {"none": text(none), "first": text(cached[0]), "mid": text(cached[1])}


STEP_KINDS = {
    "mid": "mid-block",
    "first": "first of a block",
    "mean": "mean over a block at one token a step",
}


def forward_table(part: Results) -> list[str]:
    """The forward passes at the proxy's depth: none against block, per step kind."""
    lines = [
        "| rows | step | the pass (rows x tokens + cached keys): no cache / block cache | no "
        "cache ms | block cache ms | no cache / block cache: median of repeats (range) |",
        "|---:|---|---|---:|---:|---:|",
    ]
    for rows, cell in part["cells"].items():
        s, shape = cache_summary(cell, "forward", part), pass_shape(cell, part)
        for kind, name in STEP_KINDS.items():
            covers = (
                f"{shape['none']} / {shape[kind]}"
                if kind in shape
                else (f"1 first + {part['args']['block'] - 1} mid-block")
            )
            lines.append(
                f"| {rows} | {name} | {covers} | {s['none'][kind]:.1f} | {s['block'][kind]:.1f} | "
                f"{ratio_text(s['ratios'][kind])} |"
            )
    return lines


def other_table(part: Results) -> list[str]:
    """Mid-block and block-mean ratios for the whole step and for the 20-layer model (estimated)."""
    layers = part["model"]["config"]["num_hidden_layers"]
    lines = [
        "| rows | timed | no cache ms, mid-block | block cache ms, mid-block | ratio, mid-block | "
        "ratio, mean over a block |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    names = {
        "step": "whole step (forward pass, head at the block's masked positions, rules)",
        "forward_full": f"forward pass of the {layers}-layer model (estimate)",
        "step_full": f"whole step of the {layers}-layer model (estimate)",
        "dense": "layer 0 alone (dense MLP)",
        "moe": "layer 1 alone (MoE MLP)",
    }
    for rows, cell in part["cells"].items():
        for metric, name in names.items():
            s = cache_summary(cell, metric, part)
            lines.append(
                f"| {rows} | {name} | {s['none']['mid']:.1f} | {s['block']['mid']:.1f} | "
                f"{ratio_text(s['ratios']['mid'])} | "
                f"{ratio_text(s['ratios']['mean'])} |"
            )
        lines += spread_rows(rows, cell, part)
    return lines


def spread_rows(rows: str, cell: Results, part: Results) -> list[str]:
    """The MoE layer on spread inputs, and the full-depth forward pass estimated with it."""
    if "spread" not in cell:
        return []
    spread, est, cfg = cell["spread"], spread_estimate(cell, part), part["model"]["config"]
    per_repeat = [n / b for n, b in zip(spread["none"], spread["block"])]
    return [
        f"| {rows} | layer 1 alone on standard-normal inputs ({spread['experts']} of "
        f"{cfg['num_experts']} experts hit by a block's tokens) | {ms(spread['none']):.1f} | "
        f"{ms(spread['block']):.1f} | {ratio_text(per_repeat)} | |",
        f"| {rows} | forward pass of the {cfg['num_hidden_layers']}-layer model, its MoE layers "
        f"as on those inputs (estimate, from the medians) | {est['none']:.1f} | "
        f"{est['block']:.1f} | {spread_ratio(cell, part):.2f} | |",
    ]


def spread_ratio(cell: Results, part: Results) -> float:
    """No cache / block cache for the full-depth forward pass of `spread_estimate`."""
    estimate = spread_estimate(cell, part)
    return estimate["none"] / estimate["block"]


def spread_estimate(cell: Results, part: Results) -> dict[str, float]:
    """The full-depth forward pass (ms, mid-block) with every MoE layer at the spread inputs' time:
    the proxy's forward pass, its MoE layers' time taken out and the full model's MoE layers' put
    in."""
    cfg, depth = part["model"]["config"], part["model"]["depth"]
    proxy_moe, full_moe = (
        depth - cfg["first_k_dense_replace"],
        cfg["num_hidden_layers"] - cfg["first_k_dense_replace"],
    )
    fwd, moe = cache_summary(cell, "forward", part), cache_summary(cell, "moe", part)
    return {
        cache: fwd[cache]["mid"]
        - proxy_moe * moe[cache]["mid"]
        + full_moe * ms(cell["spread"][cache])
        for cache in ("none", "block")
    }


def cache_model_text(part: Results) -> str:
    """What part `cache` decodes and times, in words."""
    a, model, cfg = part["args"], part["model"], part["model"]["config"]
    blocks, timed = a["gen_length"] // a["block"], timed_block(a["gen_length"], a["block"])
    per_step = a["block"] // a["cache_steps"]
    return (
        f"`LLaDA2Model` at the proxy's shape with {model['depth']} of its "
        f"{cfg['num_hidden_layers']} layers (layer 0 dense, a SwiGLU of intermediate "
        f"{cfg['intermediate_size']}, then MoE layers, as `first_k_dense_replace` = "
        f"{cfg['first_k_dense_replace']}), the embedding and untied head of "
        f"{cfg['vocab_size']:,} tokens, random weights as above, {model['dtype']}; decoded by "
        f"`RowDecoder` (`BlockDecoding(threshold=1.0, steps={a['cache_steps']})`: {per_step} "
        f"tokens a step, {a['cache_steps']} steps a block) with `cache` `none` or `block`, "
        f"prompt {a['prompt_length']} + generation {a['gen_length']} (random tokens), block "
        f"{a['block']}. Timed: block {timed} of {blocks} (0-based: {timed * a['block']} "
        "generated tokens before it), the blocks before it pre-filled; the block cache's rows "
        "start one block earlier, and that block's steps (the first of which runs over the "
        "whole prefix, as no cache is kept yet) are left out, so that the timed steps find the "
        "cache decoding would have kept. Per step: `ForwardPass.run` (the decoder's forward "
        "pass: embedding, layers, final norm, gathering and keeping the cached keys and "
        "values; the output head is lazy and runs after it), the whole `RowDecoder.step()` "
        "(also the head at the block's masked positions and the float64 rules) and each layer "
        "(forward hooks). The block cache is exact: it decodes the same tokens as no cache "
        "(tests/test_block_diffusion.py)."
    )


def cache_goal_lines(part: Results) -> list[str]:
    """The verdict on the issue's goal: the block cache at least `CACHE_GOAL` x faster per step."""
    found = []
    for rows, cell in part["cells"].items():
        s = cache_summary(cell, "forward", part)
        mid, mean = (statistics.median(s["ratios"][k]) for k in ("mid", "mean"))
        found.append((rows, mid, mean))
    met = all(min(mid, mean) >= CACHE_GOAL for _, mid, mean in found)
    ratios_text = "; ".join(
        f"{rows} row(s): {mid:.1f}x mid-block, {mean:.1f}x over a block"
        for rows, mid, mean in found
    )
    a, layers = part["args"], part["model"]["config"]["num_hidden_layers"]
    whole = "; ".join(
        f"{rows} row(s): {mean_ratio(cell, 'step', part):.1f}x at {part['model']['depth']} layers, "
        f"{mean_ratio(cell, 'step_full', part):.1f}x at {layers} (estimated)"
        for rows, cell in part["cells"].items()
    )
    spreads = {
        rows: spread_ratio(cell, part) for rows, cell in part["cells"].items() if "spread" in cell
    }
    short = [rows for rows, ratio in spreads.items() if ratio < CACHE_GOAL]
    spread = spreads and (
        f" With the MoE layers' routing spread as far as it goes (standard-normal inputs, below) "
        f"instead of the random weights' narrow one, the {layers}-layer forward pass, mid-block, "
        "is estimated at "
        + "; ".join(f"{r} row(s): {v:.1f}x" for r, v in spreads.items())
        + (
            f": a trained model could miss the goal at {' and '.join(short)} row(s)."
            if short
            else ": the goal holds there too."
        )
    )
    return [
        f"- **Goal** (issue): the block cache at least {CACHE_GOAL:.0f}x faster per step than "
        f"no cache at prompt {a['prompt_length']} + generation {a['gen_length']}, the decoder's "
        f"forward pass at the proxy's depth: {ratios_text}: **{'met' if met else 'missed'}** on "
        "this proxy. The whole step (the output head and the rules, which no cache changes, "
        f"included), over a block: {whole}.{spread}"
    ]


def mean_ratio(cell: Results, metric: str, part: Results) -> float:
    """The median over the repeats of none / block, for a block decoded one token a step."""
    return statistics.median(cache_summary(cell, metric, part)["ratios"]["mean"])


def cache_why_lines(part: Results) -> list[str]:
    """Why the ratios are what they are: tokens per pass, the layers' ratios, the head's share."""
    a, cfg = part["args"], part["model"]["config"]
    lines = []
    for rows, cell in part["cells"].items():
        dense, moe = (cache_summary(cell, k, part) for k in ("dense", "moe"))
        fwd, step = cache_summary(cell, "forward", part), cache_summary(cell, "step", part)
        full = cache_summary(cell, "step_full", part)
        shared = step["block"]["mid"] - fwd["block"]["mid"]
        experts = cache_experts(cell, part)
        lines.append(
            f"- {rows} row(s): a mid-block step feeds {a['prompt_length'] + a['gen_length']} / "
            f"{a['block']} = {(a['prompt_length'] + a['gen_length']) // a['block']}x fewer "
            "tokens through every layer. The dense layer's time falls "
            f"{statistics.median(dense['ratios']['mid']):.1f}x, the MoE layer's "
            f"{statistics.median(moe['ratios']['mid']):.1f}x: its router sends the block's "
            f"tokens to {experts['mid']:.0f} of the {cfg['num_experts']} experts (no cache: "
            f"{experts['none']:.0f}), and a call of the MoE costs about the expert weights it "
            f"reads (part `moe` above). The head ({cfg['vocab_size']:,} x {cfg['hidden_size']}, "
            "at the block's masked positions) and the float64 rules cost the same with either "
            f"cache, {shared:.0f} ms of the block cache's mid-block step of "
            f"{step['block']['mid']:.0f} ms: at {part['model']['depth']} layers the whole step "
            f"is {statistics.median(step['ratios']['mid']):.1f}x, at {cfg['num_hidden_layers']} "
            f"(estimated) {statistics.median(full['ratios']['mid']):.1f}x faster."
        )
    return lines + routing_lines(part)


def routing_lines(part: Results) -> list[str]:
    """What the estimates assume, and how the block's mask tokens route (the fewest rows' first
    decode)."""
    a, cfg, depth = part["args"], part["model"]["config"], part["model"]["depth"]
    rows, cell = next(iter(part["cells"].items()))
    steps = timed_steps(cell["block"][0], timed_block(a["gen_length"], a["block"]))[1:]
    masks = [a["block"] - (a["block"] // a["cache_steps"]) * s["step"] for s in steps]
    lines = [
        f"- The {cfg['num_hidden_layers']}-layer estimates add "
        f"{cfg['num_hidden_layers'] - depth} more MoE layers at the time the MoE layer took in "
        "the same step: the same shape, but trained weights would route otherwise than random "
        f"ones. Random weights route the block's mask tokens alike: at {rows} row(s) the "
        f"mid-block steps, with {', '.join(map(str, masks))} masks of {a['block']} tokens, hit "
        f"{', '.join(str(s['experts']) for s in steps)} experts."
    ]
    if "spread" not in cell:
        return lines
    n = cfg["num_experts"]
    picks = int(rows) * a["block"] * cfg["num_experts_per_tok"]
    return lines + [
        "- A trained model's routing is not measured here; it may spread a block's tokens "
        "further. Standard-normal inputs spread them about as far as they can go "
        f"({cell['spread']['experts']} experts for the {int(rows) * a['block']} tokens of a "
        f"block at {rows} row(s); {picks} uniform picks of {n} hit "
        f"{n * (1 - (1 - 1 / n) ** picks):.0f} on average): on them the MoE layer runs "
        f"{ms(cell['spread']['none']) / ms(cell['spread']['block']):.1f}x faster on the block "
        f"than on the whole sequence, and the {cfg['num_hidden_layers']}-layer forward pass "
        f"with every MoE layer so is estimated {spread_ratio(cell, part):.1f}x faster with the "
        "block cache: a narrow and a wide case."
    ]


def cache_experts(cell: Results, part: Results) -> dict[str, float]:
    """Median experts hit by the MoE layer's router: no cache's steps and the block cache's
    mid-block ones."""
    block = timed_block(part["args"]["gen_length"], part["args"]["block"])
    none = [s["experts"] for d in cell["none"] for s in timed_steps(d, block)]
    mid = [s["experts"] for d in cell["block"] for s in timed_steps(d, block)[1:]]
    return {"none": statistics.median(none), "mid": statistics.median(mid)}


def cache_lines(part: Results) -> list[str]:
    """Part `cache`'s subsection."""
    a, quick = (
        part["args"],
        " (**--quick: a tiny model, not the real shape**)" if part["model"]["quick"] else "",
    )
    repeats = ", ".join(f"{len(c['none'])} at {rows} row(s)" for rows, c in part["cells"].items())
    runs = (
        "paired decodes (no cache and block cache back to back, the order alternating): "
        f"{repeats}; per repeat the median of its steps of each kind, then the median over the "
        "repeats"
    )
    return [
        "### The block cache against no cache" + quick,
        "",
        cache_model_text(part),
        "",
        "The decoder's forward pass per step (medians over the repeats; no cache's steps, all "
        "over the whole sequence, paired with the block cache's by their place in the block; "
        "*mean over a block*: a block decoded one token a step, as "
        f"`BlockDecoding(threshold=1.0)`, takes 1 first and {a['block'] - 1} mid-block steps):",
        "",
        *forward_table(part),
        "",
        *cache_goal_lines(part),
        "",
        "The whole step, the model at full depth (estimated), and the two layers alone:",
        "",
        *other_table(part),
        "",
        *cache_why_lines(part),
        "",
        *machine_lines(part["meta"], a, runs),
        f"- building the model: {part['meta']['build_seconds']:.0f} s",
        "",
    ]


PARTS: dict[
    str,
    tuple[
        Callable[[argparse.Namespace, Callable[[Results], None]], Results],
        Callable[[Results], list[str]],
    ],
] = {"moe": (run_moe, moe_lines), "cache": (run_cache, cache_lines)}


def model_description(model: Results) -> str:
    """The proxy's shape in words, from the config a part ran."""
    c = model["config"]
    return (
        f"width {c['hidden_size']}, {c['num_attention_heads']} query and "
        f"{c['num_key_value_heads']} key/value heads of {c['head_dim']}, {c['num_experts']} "
        f"experts of intermediate {c['moe_intermediate_size']}, top-{c['num_experts_per_tok']} "
        f"within the best {c['topk_group']} of {c['n_group']} groups, {c['num_shared_experts']} "
        f"shared expert(s); one layer of its {c['num_hidden_layers']}, random weights (std "
        f"0.02, zero expert bias), {model['dtype']}{DTYPE_NOTE.get(model['dtype'], '')}, inputs "
        "standard normal. The dense-active equivalent is a SwiGLU of intermediate "
        f"({c['num_experts_per_tok']} + {c['num_shared_experts']}) x "
        f"{c['moe_intermediate_size']} = {model['dense_width']}: the MoE MLP's multiply-adds "
        "per token, router aside"
    )


def section(results: Results) -> list[str]:
    """The whole section: the model, then each part that ran, in `PARTS` order."""
    model = next(iter(results["parts"].values()))["model"]
    lines = [
        START,
        "## LLaDA2.0-mini proxy on the CPU",
        "",
        "Written by `python -m bench moe` (`bench/moe_bench.py`; its docstring says what "
        f"runs). The model: LLaDA2.0-mini's shape from {CONFIG_SOURCE}: "
        f"{model_description(model)}.",
        "",
    ]
    for name, (_, part_lines) in PARTS.items():
        if name in results["parts"]:
            lines += part_lines(results["parts"][name])
    return lines + [END]


# ----------------------------------------------------------------- command line


def add_cache_part_flags(p: argparse.ArgumentParser) -> None:
    """Part `cache`'s sizes and repeats."""
    p.add_argument(
        "--cache-rows", type=int, nargs="+", default=[1, 16], help="rows per decode (part cache)"
    )
    p.add_argument(
        "--cache-steps",
        type=int,
        default=4,
        help="steps per block (part cache; 32 / 4 tokens a step)",
    )
    p.add_argument(
        "--cache-repeats",
        type=int,
        nargs="+",
        default=[3, 2],
        help="paired decodes per row count, in --cache-rows' order (the last for the rest; "
        "part cache)",
    )
    p.add_argument(
        "--depth", type=int, default=2, help="layers of the part cache's model (0 dense, then MoE)"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16], help="rows per step")
    p.add_argument(
        "--block",
        type=int,
        default=32,
        help="tokens of one block: a step's input with the block cache",
    )
    p.add_argument("--prompt-length", type=int, default=256)
    p.add_argument("--gen-length", type=int, default=256)
    p.add_argument("--kinds", nargs="+", default=["mlp", "layer"], choices=["mlp", "layer"])
    p.add_argument(
        "--no-whole", action="store_true", help="skip the whole-sequence (no cache) cells"
    )
    p.add_argument("--repeats", type=int, default=7, help="paired timings per cell (medians)")
    add_cache_part_flags(p)
    add_threads_flag(p)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--seed", type=int, default=0)
    add_quick_flag(p, "a tiny model and sizes, for a smoke test")
    p.add_argument(
        "--keep", action="store_true", help="keep the parts found in --json that this run skips"
    )
    add_output_flags(p, RESULTS / "moe_bench.json")
    args = p.parse_args(argv)
    args.argv = list(argv or [])
    if args.quick:
        args.rows, args.block, args.prompt_length, args.gen_length, args.repeats = (
            [1, 2],
            4,
            8,
            8,
            2,
        )
        args.cache_rows, args.cache_steps, args.cache_repeats = [1, 2], 2, [2]
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.report_only:
        write_section(args.out, section(load_json(args.json)), START, END)
        return 0
    kept = load_json(args.json)["parts"] if args.keep and args.json.exists() else {}
    results: Results = {"parts": {k: v for k, v in kept.items() if k not in args.parts}}
    for name in args.parts:

        def save(part: Results, name: str = name) -> None:
            part["args"] = args_record(args)
            results["parts"][name] = part
            save_json(args.json, results)

        PARTS[name][0](args, save)
    write_section(args.out, section(results), START, END)
    print("\n".join(section(results)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
