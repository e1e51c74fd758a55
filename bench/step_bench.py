"""Part 2 of `bench/run.py`: one decoding step at the real vocabulary, naive vs `RowDecoder.step`.

Sequence 400 (prompt 144 + generation 256, block 32; `--quick`: 24 + 32, block 8), one
row, vocabulary 126,464. The decoder's own time per step, forward pass excluded:

* *naive*: `bench/naive.py`, the release-style step over the whole sequence, starting
  from the full logits (the forward pass's output, computed once beforehand);
* *ours*: `RowDecoder.step` on a model whose forward pass is a stored hidden-state
  tensor and a real output head (`FixedHidden`), with the head's time subtracted;
  timed at the first step of the first block and as the mean over that block;
* the cost of drawing one block's float64 noise alone, the floor of the fixed schedule.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from bench.naive import naive_entropy_step, naive_fixed_step
from bench.timing import TimedModel
from bench.workloads import LLADA_MASK_ID, LLADA_VOCAB
from lm_eval_dvoting.core.decoding import DecodeRow, RowDecoder


class FixedHidden(torch.nn.Module):
    """A model whose forward pass is a stored hidden-state tensor and a real output head.

    It isolates the decoder: `RowDecoder.step` runs exactly as with a real model, the
    head runs at the positions the decoder asks for, and the "transformer" costs
    nothing, so `TimedModel` separates head time from the decoder's own time.
    """

    logits_shift = 0

    def __init__(self, hidden: torch.Tensor, head: torch.nn.Linear, mask_id: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.head = head
        self.mask_token_id = mask_id
        self.max_length = 4096

    def hidden_states(self, input_ids, attention_mask=None, position_ids=None):
        return self.hidden[:, : input_ids.shape[1]].expand(input_ids.shape[0], -1, -1)

    def logits_from_hidden(self, hidden):
        return self.head(hidden)


@dataclass
class StepSetup:
    """The inputs every timed step shares: one row's prompt, hidden states, head and full logits."""

    prompt_len: int
    gen_len: int
    block: int
    head: torch.nn.Linear
    hidden: torch.Tensor
    prompt: torch.Tensor
    full_logits: torch.Tensor  # the logits the naive step starts from (the forward's output)
    mask: int = LLADA_MASK_ID


def make_setup(quick: bool, width: int) -> StepSetup:
    """A random output head of `width` x the real vocabulary and normalised random hidden states
    (seeded)."""
    prompt_len, gen_len, block = (144, 256, 32) if not quick else (24, 32, 8)
    torch.manual_seed(3)
    head = torch.nn.Linear(width, LLADA_VOCAB, bias=False)
    torch.nn.init.normal_(head.weight, std=0.05)
    head.requires_grad_(False)
    hidden = torch.nn.functional.rms_norm(torch.randn(1, prompt_len + gen_len, width), (width,))
    prompt = torch.randint(0, 126_000, (prompt_len,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full_logits = head(hidden)
    return StepSetup(prompt_len, gen_len, block, head, hidden, prompt, full_logits)


def step_rules(gen_len: int) -> dict[str, dict[str, Any]]:
    """The two commit rules timed, by their table name: `DecodeRow` keyword arguments."""
    return {
        "dvoting (entropy threshold, T=0.6)": dict(alpha=0.3, temperature=0.6),
        "majority (fixed schedule, low confidence, T=0.9)": dict(
            steps=gen_len // 2, temperature=0.9
        ),
    }


def time_naive_step(setup: StepSetup, rule: dict[str, Any], seed: int) -> float:
    """Seconds of the naive step: the first step of the first block (all masked)."""
    s = setup
    x = torch.cat([s.prompt, torch.full((s.gen_len,), s.mask)])[None]
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    if "alpha" in rule:
        naive_entropy_step(
            s.full_logits,
            x,
            s.mask,
            s.prompt_len,
            s.prompt_len + s.block,
            rule["alpha"],
            rule["temperature"],
            generator,
        )
    else:
        per_step = s.block // (rule["steps"] // (s.gen_len // s.block))
        naive_fixed_step(
            s.full_logits,
            x,
            s.mask,
            s.prompt_len + s.block,
            per_step,
            rule["temperature"],
            generator,
        )
    return time.perf_counter() - start


def time_row_decoder_block(setup: StepSetup, rule: dict[str, Any], seed: int) -> list[float]:
    """The decoder's own seconds of each `RowDecoder.step` until the first block is full (head time
    subtracted)."""
    s = setup
    timed = TimedModel(FixedHidden(s.hidden, s.head, s.mask))
    decoder = RowDecoder(timed)
    decoder.add(
        DecodeRow(
            prompt=s.prompt,
            tokens=torch.full((s.gen_len,), s.mask),
            block_length=s.block,
            generator=torch.Generator().manual_seed(seed),
            **rule,
        )
    )
    own = []
    while decoder.active and int((decoder.active[0].tokens[: s.block] == s.mask).sum()) > 0:
        timed.reset()
        start = time.perf_counter()
        decoder.step()
        own.append(time.perf_counter() - start - timed.seconds)
    return own


def time_noise_draw(block: int, repeats: int) -> float:
    """Median seconds of drawing one block's float64 noise over the whole vocabulary."""
    generator = torch.Generator().manual_seed(0)
    times = []
    for _ in range(max(3, repeats)):
        start = time.perf_counter()
        torch.rand((block, LLADA_VOCAB), dtype=torch.float64, generator=generator)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_rule(setup: StepSetup, rule: dict[str, Any], repeats: int) -> dict[str, Any]:
    """Median naive and our step times for one rule, repeat `r` seeded with `r` on both sides."""
    naive_times, first_times, mean_times, own = [], [], [], []
    for repeat in range(repeats):
        naive_times.append(time_naive_step(setup, rule, repeat))
        own = time_row_decoder_block(setup, rule, repeat)
        first_times.append(own[0])
        mean_times.append(sum(own) / len(own))
    return {
        "noise_draw_s": time_noise_draw(setup.block, repeats) if rule["temperature"] > 0 else 0.0,
        "naive_s": statistics.median(naive_times),
        "ours_first_step_s": statistics.median(first_times),
        "ours_block_mean_s": statistics.median(mean_times),
        "steps_in_block": len(own),
    }


def run_step_bench(quick: bool, width: int, repeats: int) -> dict[str, Any]:
    """Decoder-own time per step, naive full-sequence vs ours, V = 126,464, sequence 400."""
    setup = make_setup(quick, width)
    out: dict[str, Any] = {
        "sequence": setup.prompt_len + setup.gen_len,
        "prompt": setup.prompt_len,
        "gen": setup.gen_len,
        "block": setup.block,
        "vocab": LLADA_VOCAB,
        "rules": {},
    }
    for name, rule in step_rules(setup.gen_len).items():
        r = out["rules"][name] = time_rule(setup, rule, repeats)
        print(
            f"  [step] {name}: naive {r['naive_s'] * 1e3:.0f} ms, ours first step "
            f"{r['ours_first_step_s'] * 1e3:.1f} ms, ours block mean "
            f"{r['ours_block_mean_s'] * 1e3:.1f} ms",
            flush=True,
        )
    return out


def step_section(step: dict[str, Any], width: int) -> list[str]:
    """The report's section on one decoding step: what was timed, the table, what the last column
    means."""
    lines = [
        "## One decoding step at the real vocabulary: naive full-sequence vs committable positions",
        "",
        f"Vocabulary {step['vocab']:,}, sequence {step['sequence']} (prompt {step['prompt']} + "
        f"generation {step['gen']}), block {step['block']}, one row, width {width}. The "
        "decoder's own time per",
        "step, forward pass excluded. *naive*: `bench/naive.py`, the release's step: float64 "
        "Gumbel noise,",
        "softmax and entropy over all positions x the whole vocabulary, then the block is cut out.",
        "*ours*: `RowDecoder.step` (output head and float64 work at the masked positions of the "
        "committable",
        "block only; the head's time is subtracted). *first step*: all 32 block positions masked;",
        "*block mean*: mean over the steps of the first block (fewer masks left as it fills).",
        "",
        "| rule | naive ms/step | ours ms/step (first step) | ratio | ours ms/step (block mean) "
        "| ratio | of which: drawing the block's float64 noise |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in step["rules"].items():
        lines.append(
            f"| {name} | {r['naive_s'] * 1e3:,.0f} | {r['ours_first_step_s'] * 1e3:.1f} | "
            f"{r['naive_s'] / r['ours_first_step_s']:.0f}x | {r['ours_block_mean_s'] * 1e3:.1f} | "
            f"{r['naive_s'] / r['ours_block_mean_s']:.0f}x | {r['noise_draw_s'] * 1e3:.1f} ms |"
        )
    return lines + [
        "",
        "The last column is the cost of `torch.rand((32, 126464), float64, generator)` alone, "
        "the noise of",
        "a whole block. The fixed schedule needs it at every masked position of the block (the "
        "noisy",
        "candidates' confidence decides what commits); the entropy rule decides from the "
        "un-noised logits",
        "and draws noise only for the positions it commits, so its first-step cost is mostly "
        "the float64",
        "entropy over the block.",
        "",
    ]


def measured_noise_note(step: dict[str, Any] | None) -> str:
    """' (measured in this run: N ns)' per vocabulary entry of the block's noise draw, or '' without
    one."""
    if step is None:
        return ""
    per_entry = [
        r["noise_draw_s"] / (step["block"] * step["vocab"])
        for r in step["rules"].values()
        if r["noise_draw_s"]
    ]
    if not per_entry:
        return ""
    low, high = (f"{v * 1e9:.0f}" for v in (min(per_entry), max(per_entry)))
    return f" (measured in this run: {low if low == high else low + '-' + high} ns)"
