"""The commit rules batched over rows (issue 43): one stacked logits tensor per rule and step,
the noise still drawn from each row's own generator as a row alone draws it, and one host
read per step for all of a rule's rows.

The references are today's per-row commits, transcribed: a batch of rows of different prompts,
lengths, blocks, temperatures, filters and seeds must decode to their tokens bit for bit
(float32 on the CPU), and to the tokens each row gets alone."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from references import load_float32

from bench.host_reads_bench import HostReads
from lm_eval_dvoting.core.decoding import DecodeRow, RowDecoder, rules
from lm_eval_dvoting.core.decoding.state import DreamDecoding, candidates, suppress_mask
from lm_eval_dvoting.core.parts.rules.confidence import ConfidenceThreshold
from lm_eval_dvoting.core.parts.rules.entropy import EntropyThreshold
from lm_eval_dvoting.core.parts.rules.fixed import FixedSchedule

# ---------------------------------------------------------------- the per-row references


def per_row_confidence_commit(self: ConfidenceThreshold, works: list) -> list:
    """`ConfidenceThreshold.commit` before issue 43: row by row."""
    for work in works:
        row = work.row
        masked = row.tokens[work.start : work.start + row.block_length] == self.mask_id
        logits64 = suppress_mask(work.logits, self.mask_id)
        chosen = candidates(logits64, row.temperature, row.generator, masked, row.top_p, row.top_k)
        probability = torch.softmax(logits64, dim=-1).gather(-1, chosen[:, None]).squeeze(-1)
        commit = probability >= row.threshold
        commit[int(probability.argmax())] = True
        positions = torch.tensor(work.wanted)
        row.tokens[positions[commit]] = chosen[commit].to(row.tokens.dtype)
    return []


def per_row_fixed_commit(self: FixedSchedule, works: list) -> list:
    """`FixedSchedule.commit` before issue 43: row by row."""
    for work in works:
        row, progress = work.row, work.row.progress
        if work.wanted:
            _per_row_share(work, suppress_mask(work.logits, self.mask_id), self.mask_id)
        progress.step_in_block += 1
        if progress.step_in_block == row.steps_per_block:
            progress.block, progress.step_in_block = progress.block + 1, 0
    return []


def _per_row_share(work: Any, logits64: torch.Tensor, mask_id: int) -> None:
    """`FixedSchedule._commit_share` before issue 43."""
    row = work.row
    block = row.tokens[work.start : work.start + row.block_length]
    masked = block == mask_id
    chosen = torch.zeros_like(block)
    chosen[masked] = candidates(
        logits64, row.temperature, row.generator, masked, row.top_p, row.top_k
    )
    confidence = torch.full(block.shape, float("-inf"), dtype=torch.float64)
    if row.remasking == "low_confidence":
        probs = torch.softmax(logits64, dim=-1)
        confidence[masked] = probs.gather(-1, chosen[masked][:, None]).squeeze(-1)
    else:
        noise = torch.rand(block.shape, dtype=torch.float64, generator=row.generator)
        confidence[masked] = noise[masked]
    picked = confidence.topk(row.progress.counts[row.progress.step_in_block]).indices
    block[picked] = chosen[picked]


# ------------------------------------------------------------------------- the row mix

TEMPERATURES = [0.0, 0.7, 1.0, 0.5, 2.0, 0.3]
FILTERS = [(None, None), (0.9, None), (None, 5), (0.8, 3), (1.0, None), (0.5, 1)]
SHAPES = [(16, 4), (16, 8), (12, 4), (16, 16), (8, 8)]  # (gen_length, block_length)


def mixed_rows(model: Any, seed: int, shared: bool, **rule: Any) -> list[DecodeRow]:
    """Ten rows unlike each other: prompt, lengths, block, temperature, filters, seed; every
    fourth has a given token in its first block (not all of that block is masked)."""
    prompts = torch.Generator().manual_seed(seed)
    one = torch.Generator().manual_seed(seed + 100)
    rows = []
    for i in range(10):
        gen_length, block_length = SHAPES[i % len(SHAPES)]
        tokens = torch.full((gen_length,), model.mask_token_id)
        if i % 4 == 3:
            tokens[1] = 7
        top_p, top_k = FILTERS[(i + seed) % len(FILTERS)]
        settings = {k: v[i % len(v)] if isinstance(v, list) else v for k, v in rule.items()}
        if "steps" in settings:
            settings["steps"] = gen_length // settings["steps"]  # steps per position
        rows.append(
            DecodeRow(
                prompt=torch.randint(0, 240, (2 + (i * 3) % 7,), generator=prompts),
                tokens=tokens,
                block_length=block_length,
                temperature=TEMPERATURES[(i + seed) % len(TEMPERATURES)],
                top_p=top_p,
                top_k=top_k,
                generator=one if shared else torch.Generator().manual_seed(seed * 10 + i),
                **settings,
            )
        )
    return rows


def decoded(model: Any, rows: list[DecodeRow]) -> list[list[int]]:
    decoder = RowDecoder(model)
    for row in rows:
        decoder.add(row)
    while decoder.active:
        decoder.step()
    return [row.tokens.tolist() + [row.nfe] for row in rows]


def alone(model: Any, rows: list[DecodeRow]) -> list[list[int]]:
    return [decoded(model, [row])[0] for row in rows]


CONFIDENCE = dict(threshold=[0.9, 0.3, 0.05, 0.6])
FIXED = dict(steps=[1, 2, 4], remasking=["low_confidence", "random"])  # steps: gen_length / k
DREAM_ORDERS = ["maskgit_plus", "topk_margin", "entropy"]  # origin reads which positions commit


@pytest.fixture(params=["one run", "runs of a row or two"])
def runs(request, monkeypatch) -> None:
    """A rule's rows in one `RowBatch` (the tiny vocabulary), or cut into runs of one or two
    rows (`row_batches`, as on the CPU at a real vocabulary)."""
    if request.param != "one run":
        monkeypatch.setitem(rules.BATCH_ELEMENTS, "cpu", 5000)  # 8 to 16 positions x 256


@pytest.fixture(scope="module")
def llada() -> Any:
    from conftest import fixture_folder

    return load_float32(str(fixture_folder("llada")))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_confidence_rule_gives_each_row_its_per_row_tokens(llada, seed, monkeypatch, runs):
    """Rows decoded together give, bit for bit, the tokens of today's per-row commit and the
    tokens each row gets alone (its own generator). (Planted: the noise drawn in the
    distributions' order instead of the rows'; then one row's generator read in
    another row's place; each failed.)"""
    batched = decoded(llada, mixed_rows(llada, seed, shared=False, **CONFIDENCE))
    assert batched == alone(llada, mixed_rows(llada, seed, shared=False, **CONFIDENCE))
    assert len({row[-1] for row in batched}) > 1  # rows finish at different steps
    monkeypatch.setattr(ConfidenceThreshold, "commit", per_row_confidence_commit)
    assert batched == decoded(llada, mixed_rows(llada, seed, shared=False, **CONFIDENCE))


@pytest.mark.parametrize("seed", [0, 1])
def test_batched_confidence_rule_keeps_a_shared_generators_stream(llada, seed, monkeypatch, runs):
    """Rows sharing one generator draw from it in row order, each a whole block's noise, as
    the per-row commit drew. (Planted: the noise drawn in the distributions' order instead of
    the rows': failed; the runs committed last first: failed in runs.)"""
    batched = decoded(llada, mixed_rows(llada, seed, shared=True, **CONFIDENCE))
    monkeypatch.setattr(ConfidenceThreshold, "commit", per_row_confidence_commit)
    assert batched == decoded(llada, mixed_rows(llada, seed, shared=True, **CONFIDENCE))


@pytest.mark.parametrize("seed", [0, 1])
def test_batched_fixed_schedule_gives_each_row_its_per_row_tokens(llada, seed, monkeypatch, runs):
    """As for the confidence rule: both remaskings, steps committing several tokens or one.
    (Planted: a row's remasking noise drawn before its block noise: failed; the remasking
    noise read at the block's first positions instead of its masked ones: failed.)"""
    batched = decoded(llada, mixed_rows(llada, seed, shared=False, **FIXED))
    assert batched == alone(llada, mixed_rows(llada, seed, shared=False, **FIXED))
    monkeypatch.setattr(FixedSchedule, "commit", per_row_fixed_commit)
    assert batched == decoded(llada, mixed_rows(llada, seed, shared=False, **FIXED))


@pytest.mark.parametrize("seed", [0, 1])
def test_batched_fixed_schedule_keeps_a_shared_generators_stream(llada, seed, monkeypatch, runs):
    """Rows sharing one generator: each row's block noise, then its remasking noise, row
    after row. (Planted: all the block noise first, then all the remasking noise: failed;
    the runs committed last first: failed in runs.)"""
    batched = decoded(llada, mixed_rows(llada, seed, shared=True, **FIXED))
    monkeypatch.setattr(FixedSchedule, "commit", per_row_fixed_commit)
    assert batched == decoded(llada, mixed_rows(llada, seed, shared=True, **FIXED))


# ------------------------------------------------------------------------ host syncs


@pytest.mark.parametrize("rule", ["confidence", "fixed"])
def test_a_rule_reads_the_host_once_per_step_for_all_rows(llada, rule):
    """begin and commit of ten rows (sampled and greedy, given tokens) read the device once:
    all the rows' tokens in one copy. (Planted: each row's tokens read on its own, as
    before issue 43: failed with 10 reads.)"""
    settings = CONFIDENCE if rule == "confidence" else FIXED
    rows = mixed_rows(llada, 0, shared=False, **settings)
    rule = (ConfidenceThreshold if rule == "confidence" else FixedSchedule)(llada.mask_token_id)
    logits = torch.Generator().manual_seed(5)
    for _ in range(2):  # the second step: blocks partly committed
        with HostReads() as reads:
            works = rule.begin_many([(i, row, None) for i, row in enumerate(rows)])
            for work in works:
                work.receive(torch.randn(len(work.wanted), 256, generator=logits))
            rule.commit(works)
        assert dict(reads.calls) == {"tolist": 1}


def test_a_decoder_step_reads_the_host_once_for_tokens_and_once_for_progress(llada):
    """A step of twenty rows under two rules: one read of every row's tokens (the step's
    snapshot, which both rules begin from), and one of every row's masks left (the progress
    guard and the retiring share it). (Planted: each row's masks read on its own when
    retiring, as before issue 43: failed with 23 reads; each rule reading its own rows'
    tokens, the snapshot dropped: failed with 4.)"""
    decoder = RowDecoder(llada)
    for row in mixed_rows(llada, 0, False, **CONFIDENCE) + mixed_rows(llada, 1, False, **FIXED):
        decoder.add(row)
    for _ in range(3):
        with HostReads() as reads:
            decoder.step()
        assert dict(reads.calls) == {"tolist": 2}


@pytest.mark.parametrize(
    "rule",
    [
        "fixed (steps=16)",
        "confidence (threshold=0.9)",
        "dream (alg=entropy, steps=32)",
        "block diffusion (LLaDA2.1, 0.7/0.5)",
    ],
)
def test_what_a_step_launches_outside_the_model_hardly_grows_with_the_rows(llada, rule):
    """The operators of a decoder step outside the model's calls (on a GPU each a kernel
    launch; `bench host-reads` counts them), sampled at temperature 0.7, grow by at most 4
    a row from 4 rows to 16: what is left per row is its own noise draw and its write.
    (Planted: the masks left counted row by row, as before: failed in all four; the
    attention mask of a pass written row by row: failed for block diffusion.)"""
    from bench.host_reads_bench import FIXTURES, RULES, per_step

    model = load_float32(str(FIXTURES / "llada2")) if "block" in rule else llada
    most = {}
    for rows in (4, 16):
        most[rows] = max(per_step(model, RULES[rule], "none", 0.7, rows, most_steps=6)[2])
    assert most[16] - most[4] <= 4 * 12, most


DREAM = dict(rule="dream", steps=[1, 2], dream=[DreamDecoding(alg) for alg in DREAM_ORDERS])


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("rules_of_rows", [[CONFIDENCE, FIXED], [DREAM]])
def test_a_cached_step_plans_on_the_snapshot(llada, cache, rules_of_rows):
    """With a cache, the step's plan (each row's block start and whether a later step reuses
    its pass, Dream's progress included) is taken from the same snapshot: still two reads
    per step, however many rows. (Planted: the snapshot dropped: failed with 4 to 22 reads.)"""

    def rows() -> list[DecodeRow]:
        return [
            row
            for seed, rule in enumerate(rules_of_rows)
            for row in mixed_rows(llada, seed, False, cache=cache, **rule)
        ]

    decoded(llada, rows())  # Dream's shares are computed once per schedule: here
    decoder = RowDecoder(llada)
    for row in rows():
        decoder.add(row)
    while decoder.active:
        with HostReads() as reads:
            decoder.step()
        assert dict(reads.calls) == {"tolist": 2}


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_an_entropy_step_reads_the_host_once_more_per_round(llada, cache, monkeypatch):
    """dVoting's entropy rule reads one thing more: its rows' entropies, once per round of
    the step (a round per block hand-over), and no committed token. (Planted: the committed
    tokens read back to the host, as before: failed with a read more per round.)"""
    rounds = []
    commit = EntropyThreshold.commit
    monkeypatch.setattr(EntropyThreshold, "commit", lambda *a: rounds.append(1) or commit(*a))
    decoder = RowDecoder(llada)
    for row in mixed_rows(llada, 0, False, alpha=[0.5, 2.0, 0.05], cache=cache):
        decoder.add(row)
    while decoder.active:
        rounds.clear()
        with HostReads() as reads:
            decoder.step()
        assert dict(reads.calls) == {"tolist": 2 + len(rounds)}


def test_observed_rows_get_their_predictions_on_the_host_in_one_copy(llada):
    """Rows watched by the temporal vote add two reads per step for all of them: whether
    any row's argmax is the mask token (its argmax is then redone without it), and their
    predictions, which come to the host in one copy, each row its own CPU tensor. (Planted:
    each row's prediction copied on its own: failed with 10 copies for 10 watched rows;
    the mask check row by row, as before: failed with 10 reads.)"""
    seen: list[torch.Tensor] = []
    decoder = RowDecoder(llada)
    for row in mixed_rows(llada, 0, False, **CONFIDENCE):
        row.observe = lambda step, prediction: seen.append(prediction)
        decoder.add(row)
    while decoder.active:
        with HostReads() as reads:
            decoder.step()
        assert dict(reads.calls) == {"tolist": 3, "cpu": 1}
    assert seen and all(p.device.type == "cpu" and p._base is None for p in seen)


class _CommitsThenReads(ConfidenceThreshold):
    """The confidence rule, with a commit that then reads the row's host tokens back."""

    after_commit: list[tuple[list[int], list[int]]] = []

    def commit(self, works):
        super().commit(works)
        _CommitsThenReads.after_commit = [
            (rules.host_tokens(work.row), work.row.tokens.tolist()) for work in works
        ]
        return []


def test_the_snapshot_holds_only_until_the_rules_have_begun(llada, monkeypatch):
    """The snapshot is the tokens at the step's start: a commit that reads the host tokens
    sees its own commits, and no row keeps a snapshot after a step, nor after a step that
    raised. (Planted: the snapshot not cleared: failed, the commit read the step's start.)"""
    decoder = RowDecoder(llada)
    decoder.rules["confidence"] = _CommitsThenReads(llada.mask_token_id)
    rows = mixed_rows(llada, 0, False, **CONFIDENCE)
    for row in rows:
        decoder.add(row)
    decoder.step()
    read, committed = zip(*_CommitsThenReads.after_commit)
    assert len(read) == len(rows) and read == committed
    assert all(row.step_tokens is None for row in rows)

    def fails(*args):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(decoder.forward, "run", fails)
    with pytest.raises(RuntimeError, match="out of memory"):
        decoder.step()
    assert all(row.step_tokens is None for row in rows)


# ------------------------------------------------------------- the pass's inputs, batched


def test_left_pad_lays_out_rows_given_whole_or_in_pieces():
    from lm_eval_dvoting.core.decoding.state import left_pad

    row = DecodeRow(prompt=torch.tensor([7, 8, 9]), tokens=torch.tensor([1, 2]), block_length=2)
    assert [p.tolist() for p in row.sequence()] == [[7, 8, 9], [1, 2]]
    assert [p.tolist() for p in row.sequence(1, 4)] == [[8, 9], [1]]
    assert [p.tolist() for p in row.sequence(4, 5)] == [[], [2]]
    ids, attention, positions = left_pad(
        [torch.tensor([4]), row.sequence(1, 4), torch.tensor([5, 6, 3, 2])], 0, torch.device("cpu")
    )
    assert ids.tolist() == [[0, 0, 0, 4], [0, 8, 9, 1], [5, 6, 3, 2]]
    assert attention.tolist() == [[0, 0, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1]]
    assert positions.tolist() == [[0, 0, 0, 0], [0, 0, 1, 2], [0, 1, 2, 3]]


def test_the_head_s_split_logits_are_joined_without_a_copy_and_nothing_else_is():
    logits = torch.randn(7, 5)
    parts = list(logits.split([2, 0, 4, 1]))
    joined = rules.end_to_end(parts)
    assert joined is not None and joined.data_ptr() == logits.data_ptr()
    assert torch.equal(joined, logits)
    assert rules.end_to_end(parts[2:]).data_ptr() == parts[2].data_ptr()
    assert rules.end_to_end([parts[2], parts[0]]) is None  # out of order
    assert rules.end_to_end([parts[0], parts[3]]) is None  # a gap
    assert rules.end_to_end([parts[0], logits[2:4].clone()]) is None  # another storage
    assert rules.end_to_end([logits[:, :2], logits[:, 2:4]]) is None  # not contiguous


@pytest.mark.parametrize("lengths", [[6, 6, 6], [6, 3, 9, 1]], ids=["one-length", "lengths"])
def test_the_masks_left_are_counted_for_every_row_at_once(llada, lengths):
    decoder = RowDecoder(llada)
    generator = torch.Generator().manual_seed(1)
    decoder.active = [
        DecodeRow(
            prompt=torch.tensor([1]),
            tokens=torch.randint(0, 3, (n,), generator=generator),
            block_length=1,
            steps=n,
        )
        for n in lengths
    ]
    decoder.mask_id = 2
    counted = decoder._masks_left().tolist()
    assert counted == [int((row.tokens == 2).sum()) for row in decoder.active]
    assert len(set(counted)) > 1
