"""`decoder=dream` committed batched over rows (issue 43): the ranked algs (maskgit_plus,
topk_margin, entropy at `alg_temp` 0 or None) of every row in one `DreamBatch`, each row's
noise still drawn from its own generator in the shapes and the order a row alone draws it;
origin and `alg_temp` > 0 rows row by row, at their place in the rows' order.

The reference is the per-row `DreamSchedule.commit` before issue 43's batching, transcribed:
a batch of rows unlike each other (prompt, lengths, block, steps, alg, temperature, filters,
seed; generators of their own or one shared) must decode to its tokens and passes bit for
bit (float32 on the CPU), in one run or cut into runs (`row_batches`)."""

from __future__ import annotations

from typing import Any

import pytest
import test_batched_rules as batched_rules
import torch

from bench.host_reads_bench import HostReads
from lm_eval_dvoting.core.decoding import RowDecoder
from lm_eval_dvoting.core.decoding.rules import host_to_device
from lm_eval_dvoting.core.decoding.sampling import filtered, gumbel_argmax, tempered
from lm_eval_dvoting.core.decoding.state import DreamDecoding, suppress_mask
from lm_eval_dvoting.core.parts.rules import dream
from lm_eval_dvoting.core.parts.rules.dream import (
    DreamSchedule,
    commit_count,
    commit_shares,
    transfer_share,
)

# ---------------------------------------------------------------- the per-row reference


def per_row_dream_commit(self: DreamSchedule, works: list) -> list:
    """`DreamSchedule.commit` before issue 43's batching: row by row."""
    for work in works:
        row, progress = work.row, work.row.progress
        step, steps = progress.step_in_block, progress.block_steps
        share = commit_shares(steps, row.dream.eps)[step]
        logits64 = suppress_mask(work.logits, self.mask_id)
        if row.dream.alg == "origin":
            _origin(work, logits64, transfer_share(share, step == steps - 1))
        else:
            last = step == steps - 1
            count = len(work.wanted) if last else commit_count(len(work.wanted), share)
            _confident(work, logits64, count)
        progress.step_in_block += 1
        if progress.step_in_block == steps:
            progress.step_in_block, progress.block_steps = 0, 0
    return []


def _confident(work: Any, logits64: torch.Tensor, count: int) -> None:
    if count == 0:
        return
    row = work.row
    logits, probs = _distribution(logits64, row)
    chosen = None
    if row.dream.alg == "maskgit_plus" and row.temperature > 0:
        chosen = gumbel_argmax(logits, _noise(logits.shape, row))
        confidence = probs.gather(-1, chosen[:, None]).squeeze(-1)
    elif row.dream.alg == "topk_margin":
        top2 = torch.sort(probs, dim=-1, descending=True).values[:, :2]
        confidence = top2[:, 0] - top2[:, 1]
    elif row.dream.alg == "entropy":
        confidence = (probs * torch.log(probs + 1e-10)).sum(-1)
    else:
        confidence = probs.max(dim=-1).values
    if not row.dream.alg_temp:
        picked = torch.sort(confidence, descending=True, stable=True).indices[:count]
    else:
        weights = torch.softmax(confidence / row.dream.alg_temp, dim=-1)
        picked = torch.multinomial(weights, count, replacement=False, generator=row.generator)
    chosen = _draw(logits[picked], probs[picked], row) if chosen is None else chosen[picked]
    positions = host_to_device(work.wanted, torch.long, row.tokens.device)[picked]
    row.tokens[positions] = chosen.to(row.tokens.dtype)


def _origin(work: Any, logits64: torch.Tensor, share: float) -> None:
    row = work.row
    transfer = _noise((len(work.wanted),), row) < share
    if not bool(transfer.any()):
        return
    logits, probs = _distribution(logits64[transfer], row)
    positions = host_to_device(work.wanted, torch.long, row.tokens.device)[transfer]
    row.tokens[positions] = _draw(logits, probs, row).to(row.tokens.dtype)


def _noise(shape: Any, row: Any) -> torch.Tensor:
    return torch.rand(tuple(shape), dtype=torch.float64, generator=row.generator)


def _distribution(logits64: torch.Tensor, row: Any) -> tuple[torch.Tensor, torch.Tensor]:
    logits = filtered(tempered(logits64, row.temperature), row.top_p, row.top_k)
    return logits, torch.softmax(logits, dim=-1)


def _draw(logits: torch.Tensor, probs: torch.Tensor, row: Any) -> torch.Tensor:
    if row.temperature == 0:
        return probs.max(dim=-1).indices
    return gumbel_argmax(logits, _noise(logits.shape, row))


# ------------------------------------------------------------------------- the row mix

llada, runs = batched_rules.llada, batched_rules.runs  # the fixtures, shared
alone, decoded, mixed_rows = batched_rules.alone, batched_rules.decoded, batched_rules.mixed_rows

RANKED = [
    DreamDecoding(alg, t) for alg in ("maskgit_plus", "topk_margin", "entropy") for t in (0.0, None)
]
# every ranked alg between rows that commit row by row (origin, alg_temp > 0)
MIXED = [
    DreamDecoding("maskgit_plus"),
    DreamDecoding("origin"),
    DreamDecoding("topk_margin", None),
    DreamDecoding("entropy", 0.5),
    DreamDecoding("maskgit_plus", 0.3),
    DreamDecoding("entropy"),
    DreamDecoding("topk_margin", 1.0),
]
STEPS = [1, 2, 4]  # a token a step (the early counts round to 0), two, four


def dream_rows(model: Any, seed: int, shared: bool, algs: list) -> list:
    """Ten Dream rows unlike each other (`mixed_rows`: prompt, lengths, block, temperature
    0 and above, top-p/top-k incl. top_k=1, whose confidences all tie; a given token)."""
    return mixed_rows(model, seed, shared, rule="dream", steps=STEPS, dream=algs)


@pytest.fixture
def batch_sizes(monkeypatch) -> list[int]:
    """The number of rows of every `DreamBatch` made."""
    sizes: list[int] = []
    made = dream.DreamBatch.__init__

    def spy(self, works, *args) -> None:
        sizes.append(len(works))
        made(self, works, *args)

    monkeypatch.setattr(dream.DreamBatch, "__init__", spy)
    return sizes


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ranked_rows_batched_give_each_row_its_per_row_tokens(
    llada, seed, monkeypatch, runs, batch_sizes
):
    """Ranked rows decoded together give, bit for bit, the tokens and passes of the per-row
    commit and those each row gets alone. (Planted: ties to the rightmost: failed; the
    chosen positions' block offsets taken for their rows in the stacked logits: failed;
    topk_margin/entropy drawing a row of noise per masked position, not per chosen one:
    failed.)"""
    batched = decoded(llada, dream_rows(llada, seed, False, RANKED))
    assert max(batch_sizes) > 1  # some commits did batch rows
    assert batched == alone(llada, dream_rows(llada, seed, False, RANKED))
    monkeypatch.setattr(DreamSchedule, "commit", per_row_dream_commit)
    assert batched == decoded(llada, dream_rows(llada, seed, False, RANKED))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("algs", [RANKED, MIXED], ids=["ranked", "mixed"])
def test_a_shared_generator_is_drawn_in_the_rows_order(llada, seed, algs, monkeypatch, runs):
    """Rows sharing one generator: each row's draws (maskgit_plus's every masked position
    before choosing, the others' chosen positions after; origin's coins, alg_temp's
    multinomial) in the rows' order, as the per-row commit drew. (Planted: the noise drawn
    in the batch's group order instead of the rows': failed; every ranked row's noise drawn
    before the row-by-row rows': failed (mixed); the runs committed last first: failed in
    runs.)"""
    batched = decoded(llada, dream_rows(llada, seed, True, algs))
    monkeypatch.setattr(DreamSchedule, "commit", per_row_dream_commit)
    assert batched == decoded(llada, dream_rows(llada, seed, True, algs))


@pytest.mark.parametrize("seed", [0, 1])
def test_mixed_rows_give_each_row_its_per_row_tokens(llada, seed, monkeypatch, runs):
    """origin and alg_temp > 0 rows between the ranked ones, each with its own generator.
    (Planted: the alg_temp > 0 rows batched as ranked, their multinomial dropped: failed.)"""
    batched = decoded(llada, dream_rows(llada, seed, False, MIXED))
    monkeypatch.setattr(DreamSchedule, "commit", per_row_dream_commit)
    assert batched == decoded(llada, dream_rows(llada, seed, False, MIXED))


# ------------------------------------------------------------------------ host reads


def test_a_ranked_commit_reads_nothing_back(llada):
    """The commit of ten ranked rows (greedy and sampled, filters, given tokens) reads
    nothing from the device; begin reads each row's tokens (no step snapshot here).
    (Planted: an `int()` of a device tensor in the commit: failed.)"""
    decoded(llada, dream_rows(llada, 0, False, RANKED))  # Dream's shares: computed once here
    rows = dream_rows(llada, 0, False, RANKED)
    rule = DreamSchedule(llada.mask_token_id)
    logits = torch.Generator().manual_seed(5)
    for _ in range(3):
        works = [rule.begin(i, row, None) for i, row in enumerate(rows)]
        for work in works:
            work.receive(torch.randn(len(work.wanted), 256, generator=logits))
        with HostReads() as reads:
            rule.commit(works)
        assert dict(reads.calls) == {}


def test_an_origin_row_reads_which_positions_commit_once_a_step(llada):
    """Ten `alg=origin` rows (greedy and sampled, filters, given tokens): a step reads the
    rows' tokens and masks left once each, and which positions commit once a row that has
    masks in its block. (Planted: the old `bool(transfer.any())` before boolean-mask
    indexing: failed, three reads a row.)"""
    decoder = RowDecoder(llada)
    for row in dream_rows(llada, 0, False, [DreamDecoding("origin")]):
        decoder.add(row)
    decoded(llada, dream_rows(llada, 0, False, [DreamDecoding("origin")]))  # shares: once
    while decoder.active:
        rows = len(decoder.active)
        with HostReads() as reads:
            decoder.step()
        calls = dict(reads.calls)
        assert calls.pop("tolist") == 2 and calls.pop("nonzero", 0) <= rows and not calls


@pytest.mark.parametrize("algs", [RANKED, [d for d in MIXED if d.alg != "origin"]])
def test_a_dream_step_reads_the_host_twice(llada, algs):
    """A decoder step of twenty Dream rows (ranked, and alg_temp > 0 ones among them; origin
    reads which positions commit): one read of every row's tokens, one of
    every row's masks left, whatever the rows. (Planted: an `int()` of a device tensor in
    the batched commit: failed.)"""
    decoder = RowDecoder(llada)
    for row in dream_rows(llada, 0, False, algs) + dream_rows(llada, 1, True, algs):
        decoder.add(row)
    decoded(llada, dream_rows(llada, 0, False, algs))  # Dream's shares: computed once here
    while decoder.active:
        with HostReads() as reads:
            decoder.step()
        assert dict(reads.calls) == {"tolist": 2}
