"""Strategies (issue 4): remask positions, the early stop, the vote, NFE, invariance, settings.

Most tests use `ScriptedModel` (tests/scripted.py), whose logits are a known
function of the input: certain positions (one peaked token) every sample agrees on,
two-way ties on which samples at temperature > 0 disagree. Answers are scripted per
question with `ScriptedAnswers` (the model writes the question id at generation
index 0), so a test decides what each sample "answered".
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from pathlib import Path

import pytest
import torch
from scripted import ScriptedAnswers, ScriptedModel, gen_choices
from torch import nn

import lm_eval_dvoting.core.strategies as strategies
from lm_eval_dvoting.core.answers import extract_answer
from lm_eval_dvoting.core.decoding import RowDecoder
from lm_eval_dvoting.core.strategies import (
    StrategySettings,
    derive_seed,
    remask_tokens,
    run_strategy,
    should_stop_early,
)
from lm_eval_dvoting.demo import arith
from lm_eval_dvoting.models.loading import load_model, load_tokenizer

PROMPT_LENGTH = 3
TWO_WAY = {2, 5, 7, 9, 13}  # generation indices where two tokens tie
THREE_WAY = {3, 10}  # ... and where three do
UNCERTAIN = TWO_WAY | THREE_WAY


def _region(q: int, g: int):
    if g == 0:
        return (q,)  # the question id, read by ScriptedAnswers
    if g in TWO_WAY:
        return (20, 21)
    if g in THREE_WAY:
        return (22, 23, 24)
    return (1 + g % 15,)


def _scripted() -> ScriptedModel:
    return ScriptedModel(gen_choices(PROMPT_LENGTH, _region))


def _prompts(questions) -> torch.Tensor:
    return torch.tensor([[q, 5, 6] for q in questions])


class Recorder:
    """Replaces the strategies' RowDecoder to record every row as it enters (sample order)."""

    def __init__(self, monkeypatch):
        self.rows = []
        recorder = self

        class RecordingDecoder(RowDecoder):
            def add(self, row):
                recorder.rows.append(
                    dict(
                        init=row.tokens.clone(),
                        block_length=row.block_length,
                        steps=row.steps,
                        alpha=row.alpha,
                        temperature=row.temperature,
                        remasking=row.remasking,
                        prompt=row.prompt.clone(),
                    )
                )
                super().add(row)

        monkeypatch.setattr(strategies, "RowDecoder", RecordingDecoder)


@pytest.fixture
def recorder(monkeypatch) -> Recorder:
    return Recorder(monkeypatch)


# --------------------------------------------------------------------- remask positions


def reference_remask(samples: torch.Tensor, tau: float, mask_id: int) -> list[int]:
    """docs/ALGORITHM.md 2, written out: per position the most frequent token (ties: the
    earliest sample's), kept if its share >= tau; the last floor(L/4) always masked."""
    k, length = samples.shape
    out = []
    for t in range(length):
        column = samples[:, t].tolist()
        counts = Counter(column)
        best = max(counts.values())
        token = next(v for v in column if counts[v] == best)
        out.append(token if best / k >= tau else mask_id)
    for t in range(length - length // 4, length):
        out[t] = mask_id
    return out


M = 99  # mask id for the direct tests


@pytest.mark.parametrize(
    "samples, tau, expected",
    [
        # unanimous positions kept, the others masked; last quarter (2 of 8) always masked
        (
            [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 0, 4, 5, 0, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8]],
            1.0,
            [1, 2, M, 4, 5, M, M, M],
        ),
        # share threshold 0.6: 2 of 3 is enough
        (
            [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 0, 4, 5, 0, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8]],
            0.6,
            [1, 2, 3, 4, 5, 6, M, M],
        ),
        # a three-way split (1/3 each) is kept only with tau <= 1/3, as the earliest's token
        ([[1, 1, 1, 1], [2, 1, 1, 1], [3, 1, 1, 1]], 1 / 3, [1, 1, 1, M]),
        ([[1, 1, 1, 1], [2, 1, 1, 1], [3, 1, 1, 1]], 0.34, [M, 1, 1, M]),
        # ties between equally frequent tokens go to the earliest sample's token
        ([[2, 5, 5, 5], [1, 6, 5, 5], [1, 6, 5, 5], [2, 5, 5, 5]], 0.5, [2, 5, 5, M]),
        ([[1, 5, 5, 5], [2, 6, 5, 5]], 0.5, [1, 5, 5, M]),
        # exactly 2/3 meets tau = 2/3
        ([[1, 1, 1, 1], [1, 1, 1, 1], [2, 1, 1, 1]], 2 / 3, [1, 1, 1, M]),
        # floor(L/4): L = 7 masks 1, L = 3 masks none
        ([[1, 2, 3, 4, 5, 6, 7]], 1.0, [1, 2, 3, 4, 5, 6, M]),
        ([[1, 2, 3], [1, 2, 3]], 1.0, [1, 2, 3]),
        # a single earlier sample: everything but the last quarter kept
        ([[4, 4, 4, 4, 4, 4, 4, 4]], 1.0, [4, 4, 4, 4, 4, 4, M, M]),
    ],
)
def test_remask_tokens_cases(samples, tau, expected):
    samples = torch.tensor(samples)
    assert remask_tokens(samples, tau, M).tolist() == expected
    assert reference_remask(samples, tau, M) == expected


def test_remask_tokens_matches_reference_on_random_samples():
    generator = torch.Generator().manual_seed(0)
    for trial in range(200):
        k = 1 + trial % 6
        length = 1 + (trial * 7) % 23
        samples = torch.randint(0, 3, (k, length), generator=generator)
        tau = [1.0, 0.75, 0.6, 0.5, 1 / 3, 0.2][trial % 6]
        assert remask_tokens(samples, tau, M).tolist() == reference_remask(samples, tau, M), (
            samples,
            tau,
        )


@pytest.mark.parametrize("tau", [1.0, 0.6, 1 / 3])
def test_remask_samples_through_run_strategy(recorder, tau):
    model = _scripted()
    answers = ScriptedAnswers({10: ["a", "b", "c", "d", "e"]})  # never agree: all 5 samples
    (result,) = run_strategy(
        model, _prompts([10]), extract=answers, gen_length=16, block_length=4, n=5, tau=tau, seed=2
    )
    mask = model.mask_token_id
    assert len(result.samples) == 5 and result.answers == ["a", "b", "c", "d", "e"]
    assert result.kept[:3] == [None, None, None]  # samples 1..3 fresh
    for k in (3, 4):  # samples 4 and 5 start from the agreement of all earlier samples
        expected_start = reference_remask(result.samples[:k], tau, mask)
        assert recorder.rows[k]["init"].tolist() == expected_start
        kept = [t for t, token in enumerate(expected_start) if token != mask]
        assert result.kept[k] == kept
        assert result.samples[k][kept].tolist() == [expected_start[t] for t in kept]
        assert all(t < 12 for t in kept)  # the last quarter (12..15) is regenerated
        assert set(range(12)) - UNCERTAIN <= set(kept)  # positions every sample agrees on
    if tau == 1.0:
        # the samples did disagree at a two-way position outside the last quarter: it was masked
        assert not {2, 5, 7, 9} <= set(result.kept[3])
    elif tau == 0.6:
        # 3 samples over 2 tokens always have a 2/3 majority: kept
        assert set(range(12)) - THREE_WAY <= set(result.kept[3])
    else:
        # tau = 1/3: everything before 12 is kept; a three-way split 1-1-1 keeps sample 1's token
        assert result.kept[3] == list(range(12))
        splits = [t for t in THREE_WAY if len(set(result.samples[:3, t].tolist())) == 3]
        assert splits
        assert all(int(recorder.rows[3]["init"][t]) == int(result.samples[0, t]) for t in splits)


# --------------------------------------------------------------------- early stop


def reference_should_stop(answers, n):
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return False
    top, valid = max(counts.values()), sum(counts.values())
    return top > n // 2 or (top == valid and top >= n // 2)


def test_should_stop_early_rule_exhaustive():
    for n in range(1, 8):
        for length in range(0, 6):
            for answers in itertools.product(["A", "B", "C", None], repeat=length):
                assert should_stop_early(list(answers), n) == reference_should_stop(answers, n), (
                    answers,
                    n,
                )
    # the rule's corners, spelled out for n = 5 (floor(n/2) = 2)
    assert should_stop_early(["A", "A"], 5)
    assert not should_stop_early(["A", None], 5)
    assert not should_stop_early(["A", "B", "A"], 5)
    assert should_stop_early(["A", "B", "A", "A"], 5)
    assert should_stop_early([None, "A", "A"], 5)
    assert not should_stop_early([None, None], 5)
    # n = 3 (floor 1): one answer and one unparseable sample already agree
    assert should_stop_early(["A", None], 3)


def test_should_stop_early_groups_with_same_answer():
    same = lambda a, b: float(a) == float(b)  # noqa: E731
    assert should_stop_early(["18", "18.0"], 5, same)
    assert not should_stop_early(["18", "18.0"], 5)


@pytest.mark.parametrize(
    "script, drawn, fresh",
    [
        (["7", "7", "x", "x", "x"], 2, 2),  # two agreeing answers: stop before sample 3
        ([None, "7", "7", "x", "x"], 3, 3),  # None does not count: 1 vote is not enough
        (["7", "8", "7", "7", "x"], 4, 3),  # 2-1 split: a 4th (remask) sample, then 3 > 2
        (["7", "8", "9", "7", "8"], 5, 3),  # never enough agreement
        ([None, None, None, None, None], 5, 3),
        (["7", "8", "7", "8", "7"], 5, 3),
    ],
)
def test_early_stop_through_run_strategy(recorder, script, drawn, fresh):
    model = _scripted()
    answers = ScriptedAnswers({11: script})
    (result,) = run_strategy(
        model, _prompts([11]), extract=answers, gen_length=16, block_length=4, n=5, seed=2
    )
    assert len(result.samples) == len(result.answers) == len(result.sample_nfe) == drawn
    assert result.answers == script[:drawn]
    assert len(recorder.rows) == drawn  # no sample was decoded and thrown away
    mask = model.mask_token_id
    is_fresh = [bool((row["init"] == mask).all()) for row in recorder.rows]
    assert is_fresh == [True] * fresh + [False] * (drawn - fresh)
    assert [k is None for k in result.kept] == is_fresh


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 7])
def test_fresh_then_remask_samples_for_any_n(recorder, n):
    model = _scripted()
    answers = ScriptedAnswers({12: [str(i) for i in range(n)]})  # all different: no early stop
    (result,) = run_strategy(
        model, _prompts([12]), extract=answers, gen_length=16, block_length=4, n=n, seed=3
    )
    assert len(result.samples) == n
    fresh = min(n, n // 2 + 1)
    assert [k is None for k in result.kept] == [True] * fresh + [False] * (n - fresh)
    assert all(
        row["alpha"] == 0.3 and row["steps"] is None and row["temperature"] == 0.6
        for row in recorder.rows
    )


# --------------------------------------------------------------------- the vote


@pytest.mark.parametrize(
    "script, winner, chosen",
    [
        (["7", "8", "9", "8", "7"], "7", 0),  # 2-2 tie: the answer seen first
        (["8", "7", "9", "7", "7"], "7", 1),  # the first sample carrying the winner
        ([None, "9", "7", "6", "9"], "9", 1),
        ([None, None, None, None, None], None, 0),  # no answer at all: the first sample
        ([None, "5", "6", "7", None], "5", 1),
    ],
)
def test_vote_and_chosen_sample(script, winner, chosen):
    model = _scripted()
    answers = ScriptedAnswers({13: script})
    (result,) = run_strategy(
        model, _prompts([13]), extract=answers, gen_length=16, block_length=4, n=5, seed=4
    )
    assert len(result.samples) == 5
    assert result.chosen == chosen
    if winner is None:
        assert result.votes == []
    else:
        assert result.votes[0][0] == winner
        assert result.answers[result.chosen] == winner
        assert result.votes == sorted(
            Counter(a for a in script if a is not None).items(),
            key=lambda kv: (-kv[1], script.index(kv[0])),
        )


def test_majority_vote_and_same_answer(recorder):
    model = _scripted()
    answers = ScriptedAnswers({14: ["18.0", "7", "18", "7", "7"]})
    same = lambda a, b: float(a) == float(b)  # noqa: E731
    (result,) = run_strategy(
        model,
        _prompts([14]),
        strategy="majority",
        extract=answers,
        gen_length=16,
        block_length=4,
        n=5,
        seed=5,
        same_answer=same,
    )
    assert result.votes == [("7", 3), ("18.0", 2)]
    assert result.chosen == 1
    answers = ScriptedAnswers({14: ["18.0", "7", "18", "7", "18"]})
    (result,) = run_strategy(
        model,
        _prompts([14]),
        strategy="majority",
        extract=answers,
        gen_length=16,
        block_length=4,
        n=5,
        seed=5,
        same_answer=same,
    )
    assert result.votes == [("18.0", 3), ("7", 2)] and result.chosen == 0


# --------------------------------------------------------------------- NFE and baselines


def test_dvoting_nfe_is_the_sum_of_sample_nfe():
    model = _scripted()
    answers = ScriptedAnswers({15: ["1", "2", "3", "1", "2"]})
    (result,) = run_strategy(
        model, _prompts([15]), extract=answers, gen_length=16, block_length=4, seed=6
    )
    assert len(result.samples) == 5
    assert result.nfe == sum(result.sample_nfe)
    assert result.nfe == model.row_steps  # each row counted once per forward pass it was in
    assert model.calls[0] == 2  # samples 1 and 2 decode side by side
    # the certain positions go together, the ties (entropy ln 2, ln 3) one per step (fallback)
    assert result.sample_nfe[0] == 1 + len(UNCERTAIN)
    assert all(nfe >= 2 for nfe in result.sample_nfe[3:])  # remask samples: position 13 and more


L = 64


def test_single_baseline(recorder):
    model = _scripted()
    (result,) = run_strategy(
        model, _prompts([10]), strategy="single", extract=lambda t: "x", gen_length=L
    )
    assert len(result.samples) == 1 and result.nfe == L == model.row_steps
    (row,) = recorder.rows
    assert (row["steps"], row["alpha"], row["temperature"], row["block_length"]) == (
        L,
        None,
        0.0,
        L // 16,
    )
    # temperature 0: the smaller id of every tie
    assert all(int(result.samples[0][g]) == 20 for g in TWO_WAY)


def test_majority_baseline(recorder):
    model = _scripted()
    (result,) = run_strategy(
        model,
        _prompts([10]),
        strategy="majority",
        extract=lambda t: int(t[2]),
        gen_length=L,
        seed=1,
    )
    assert len(result.samples) == 5
    assert result.sample_nfe == [L // 2] * 5 and result.nfe == 5 * L // 2 == model.row_steps
    assert all(
        (r["steps"], r["alpha"], r["temperature"], r["block_length"])
        == (L // 2, None, 0.9, L // 16)
        for r in recorder.rows
    )
    assert all(bool((r["init"] == model.mask_token_id).all()) for r in recorder.rows)
    # temperature 0.9: the samples differ at the ties
    assert len({tuple(s.tolist()) for s in result.samples}) > 1


def test_hex_baseline(recorder):
    model = _scripted()
    (result,) = run_strategy(
        model,
        _prompts([10]),
        strategy="hex",
        extract=lambda t: int(t[5]),
        gen_length=L,
        seed=1,
        max_rows=32,
    )
    assert len(result.samples) == 25
    assert result.sample_nfe == [L // 2] * 25 and result.nfe == 25 * L // 2 == model.row_steps
    blocks = Counter(r["block_length"] for r in recorder.rows)
    assert blocks == {L // 32: 5, L // 16: 5, L // 8: 5, L // 4: 5, L // 2: 5}
    assert all(r["temperature"] == 0.9 and r["steps"] == L // 2 for r in recorder.rows)
    assert len({tuple(s.tolist()) for s in result.samples}) > 1


def test_hex_five_samples_at_temperature_zero(recorder):
    model = _scripted()
    (result,) = run_strategy(
        model,
        _prompts([10]),
        strategy="hex",
        hex_samples=5,
        extract=lambda t: int(t[5]),
        gen_length=L,
    )
    assert len(result.samples) == 5 and result.nfe == 5 * L // 2
    assert sorted(r["block_length"] for r in recorder.rows) == [2, 4, 8, 16, 32]
    assert all(r["temperature"] == 0.0 for r in recorder.rows)
    assert all(int(s[g]) == 20 for s in result.samples for g in TWO_WAY)


def test_strategy_temperature_can_be_overridden(recorder):
    model = _scripted()
    run_strategy(
        model,
        _prompts([10]),
        strategy="majority",
        temperature=0.0,
        extract=lambda t: 1,
        gen_length=16,
        block_length=4,
        n=2,
    )
    assert [r["temperature"] for r in recorder.rows] == [0.0, 0.0]


# --------------------------------------------------------------------- invariance


@functools.lru_cache(maxsize=None)
def _llada(folder: str) -> nn.Module:
    return load_model(folder, device="cpu", dtype="float32")


def _left_pad(prompts):
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = p
        mask[i, width - len(p) :] = 1
    return ids, mask


def _summary(result):
    return (
        result.samples.tolist(),
        result.answers,
        result.nfe,
        result.sample_nfe,
        result.chosen,
        result.kept,
        result.votes,
        result.returned_tokens.tolist(),
        result.step_answers,
    )


@pytest.mark.parametrize("strategy", ["single", "majority", "hex", "dvoting", "temporal"])
def test_batch_size_and_order_invariance(llada_fixture: Path, strategy):
    model = _llada(str(llada_fixture))
    generator = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, 240, (length,), generator=generator) for length in (4, 9, 6)]
    row_seeds = [derive_seed("run", i) for i in range(3)]
    kwargs = dict(strategy=strategy, extract=lambda t: int(t[-1]) % 3, gen_length=32, n=5)
    if strategy == "hex":
        kwargs["hex_samples"] = 5  # the 25-sample hex: test_hex_25_invariance

    ids, mask = _left_pad(prompts)
    batched = run_strategy(model, ids, mask, row_seeds=row_seeds, max_rows=8, **kwargs)
    one_by_one = run_strategy(model, ids, mask, row_seeds=row_seeds, max_rows=1, **kwargs)
    ids_r, mask_r = _left_pad(prompts[::-1])
    reversed_ = run_strategy(model, ids_r, mask_r, row_seeds=row_seeds[::-1], max_rows=5, **kwargs)[
        ::-1
    ]
    for a, b, c in zip(batched, one_by_one, reversed_):
        assert _summary(a) == _summary(b) == _summary(c)
    if strategy == "dvoting":
        assert any(len(r.samples) > 2 for r in batched)  # some question drew remask samples
    if strategy in ("majority", "dvoting"):
        # the seeds matter (temperature > 0): other seeds, other samples
        other = run_strategy(model, ids, mask, row_seeds=[s + 1 for s in row_seeds], **kwargs)
        assert any(not torch.equal(x.samples[0], y.samples[0]) for x, y in zip(batched, other))


def test_hex_25_invariance(llada_fixture: Path):
    model = _llada(str(llada_fixture))
    prompts = [torch.tensor([3, 4, 5, 6]), torch.tensor([7, 8])]
    ids, mask = _left_pad(prompts)
    kwargs = dict(strategy="hex", extract=lambda t: int(t[-1]) % 3, gen_length=32, seed=3)
    wide = run_strategy(model, ids, mask, max_rows=32, **kwargs)
    narrow = run_strategy(model, ids, mask, max_rows=7, **kwargs)
    assert [_summary(r) for r in wide] == [_summary(r) for r in narrow]
    assert [len(r.samples) for r in wide] == [25, 25]


def test_results_come_back_in_question_order_and_on_done():
    model = _scripted()
    script = {10: ["a", "a"], 11: ["b", "c", "b", "b"], 12: ["z", "y", "x", "w", "v"]}
    answers = ScriptedAnswers(script)
    done = []
    results = run_strategy(
        model,
        _prompts([12, 10, 11]),
        extract=answers,
        gen_length=16,
        block_length=4,
        max_rows=2,
        on_done=lambda i, r: done.append(i),
    )
    assert [r.answers for r in results] == [script[12], script[10], script[11]]
    assert sorted(done) == [0, 1, 2]
    assert all(int(s[0]) == q for r, q in zip(results, [12, 10, 11]) for s in r.samples)


def test_derive_seed_is_stable():
    """The same parts give the same seed in other processes (Python salts `hash()` per
    process, so a seed built on it would not be), other parts or another order give other
    seeds, and seeds spread over the 63 bits a torch generator takes."""
    import os
    import subprocess
    import sys

    code = (
        "from lm_eval_dvoting.core.strategies import derive_seed; "
        "print(derive_seed(0, 1), derive_seed('x', 3, None))"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            env=dict(os.environ, PYTHONHASHSEED=salt),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        for salt in ("1", "2")
    ]
    assert runs[0] == runs[1] == [str(derive_seed(0, 1)), str(derive_seed("x", 3, None))]
    assert derive_seed(0, 1) != derive_seed(1, 0)
    seeds = {derive_seed("task", doc, repeat) for doc in range(200) for repeat in range(5)}
    assert len(seeds) == 1000  # no collisions between documents and repeats
    assert 2**62 <= max(seeds) < 2**63 and min(seeds) < 2**61


# --------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n=0), r"n \(samples per question\) must be >= 1"),
        (dict(alpha=-0.1), r"alpha .* must be >= 0"),
        (dict(tau=0.0), r"tau .* must be in \(0, 1\]"),
        (dict(tau=1.5), r"tau .* must be in \(0, 1\]"),
        (dict(gen_length=32, block_length=5), r"block_length 5 does not divide .* 32"),
        (dict(strategy="beam"), r"strategy must be one of"),
        (dict(temperature=-1.0), "temperature"),
        (dict(gen_length=0), "gen_length"),
        (dict(strategy="hex", gen_length=48), "divisible by 32"),
        (dict(hex_samples=10), "hex_samples"),
    ],
)
def test_settings_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StrategySettings(**kwargs)
    with pytest.raises(ValueError, match=message):
        run_strategy(
            _scripted(),
            _prompts([10]),
            extract=lambda t: None,
            **{"gen_length": 16, "block_length": 4, **kwargs},
        )


def test_default_settings():
    settings = StrategySettings(gen_length=256)
    assert settings.resolved_block_length == 16
    assert settings.resolved_temperature == 0.6 and settings.alpha == 0.3 and settings.tau == 1.0
    assert StrategySettings(strategy="single", gen_length=128).resolved_steps == 128
    assert StrategySettings(strategy="majority", gen_length=128).resolved_temperature == 0.9
    assert StrategySettings(strategy="majority", gen_length=128).resolved_steps == 64
    assert (
        StrategySettings(strategy="hex", gen_length=128, hex_samples=5).resolved_temperature == 0.0
    )
    assert StrategySettings(strategy="hex", gen_length=128).resolved_temperature == 0.9


# ----------------------------------------------------------------- decoder=fixed|entropy
# dVoting's entropy-threshold decoder for single and majority (issue 19's ablation rows).
# The exact checks: a `single` sample with the entropy decoder at dVoting's temperature
# *is* dVoting's first sample (same seed, same decoder), and majority's first two samples
# are dVoting's two fresh samples, token for token and pass for pass.

GEN_LENGTH = 32


@pytest.fixture(scope="module")
def demo():
    model = load_model("tiny-arith", device="cpu")
    tokenizer = load_tokenizer("tiny-arith")
    problems = arith.read_test_set()[:12]
    enc = tokenizer(
        [arith.format_prompt(p["question"]) for p in problems],
        add_special_tokens=False,
        padding=True,
        return_tensors="pt",
    )

    def extract(ids: torch.Tensor) -> str | None:
        return extract_answer(tokenizer.decode(ids.tolist()).split("<|endoftext|>")[0], "number")

    return model, enc, extract


def _run(demo, **kwargs):
    model, enc, extract = demo
    return run_strategy(
        model,
        enc.input_ids,
        enc.attention_mask,
        extract=extract,
        gen_length=GEN_LENGTH,
        seed=7,
        max_rows=8,
        **kwargs,
    )


def test_single_with_the_entropy_decoder_is_dvotings_first_sample(demo):
    dvoting = _run(demo, strategy="dvoting")
    single = _run(demo, strategy="single", decoder="entropy", temperature=0.6)
    for one, voted in zip(single, dvoting, strict=True):
        assert torch.equal(one.samples[0], voted.samples[0])
        assert one.nfe == voted.sample_nfe[0]
    # and not what the fixed schedule gives: it commits several tokens per pass
    fixed = _run(demo, strategy="single", temperature=0.6)
    assert all(r.nfe == GEN_LENGTH for r in fixed)
    assert sum(r.nfe for r in single) < sum(r.nfe for r in fixed)


def test_majority_with_the_entropy_decoder_starts_with_dvotings_fresh_samples(demo):
    dvoting = _run(demo, strategy="dvoting")
    majority = _run(demo, strategy="majority", decoder="entropy", temperature=0.6)
    for voted, plain in zip(dvoting, majority, strict=True):
        assert len(plain.samples) == 5  # n fresh samples, no early stop
        assert torch.equal(plain.samples[:2], voted.samples[:2])
        assert plain.sample_nfe[:2] == voted.sample_nfe[:2]
    # majority keeps its own default temperature with the entropy decoder
    assert StrategySettings(strategy="majority", decoder="entropy").resolved_temperature == 0.9


def test_greedy_single_with_the_entropy_decoder_follows_alpha(demo):
    loose = _run(demo, strategy="single", decoder="entropy", alpha=float("inf"))
    # every entropy is below inf: one pass commits all of a block, and hands its logits on to
    # the next
    assert all(r.nfe == 1 for r in loose)
    strict = _run(demo, strategy="single", decoder="entropy", alpha=0.0)
    assert all(r.nfe == GEN_LENGTH for r in strict)  # one token per pass


def test_settings_report_the_decoder_and_no_schedule():
    entropy = StrategySettings(strategy="single", gen_length=32, decoder="entropy", steps=8)
    assert entropy.resolved_decoder == "entropy" and entropy.steps_run is None  # steps are not used
    assert StrategySettings(strategy="single", gen_length=32).resolved_decoder == "fixed"
    assert StrategySettings(strategy="dvoting", gen_length=32).resolved_decoder == "entropy"
    assert StrategySettings(strategy="majority", gen_length=32, decoder="fixed").steps_run == 16
    # each strategy's own decoder may be named, and single/majority may take either
    for strategy, decoder in [
        ("hex", "fixed"),
        ("dvoting", "entropy"),
        ("single", "fixed"),
        ("single", "entropy"),
        ("majority", "entropy"),
        ("single", "confidence"),
        ("majority", "confidence"),
        ("dvoting", "confidence"),
    ]:
        assert (
            StrategySettings(strategy=strategy, gen_length=64, decoder=decoder).resolved_decoder
            == decoder
        )


@pytest.mark.parametrize(
    "strategy, decoder, says",
    [
        (
            "hex",
            "entropy",
            "decoder=entropy does not apply to strategy=hex: HEX is defined by its schedules "
            "of `steps` over block sizes L/32..L/2 (LLaDA's fixed schedule, or decoder=dream "
            "for Dream's); leave decoder out for hex",
        ),
        (
            "hex",
            "confidence",
            "decoder=confidence does not apply to strategy=hex: HEX is defined by its schedules "
            "of `steps` over block sizes L/32..L/2 (LLaDA's fixed schedule, or decoder=dream "
            "for Dream's); leave decoder out for hex",
        ),
        (
            "dvoting",
            "fixed",
            "decoder=fixed does not apply to strategy=dvoting: dVoting decodes with its "
            "entropy threshold (alpha) or, with decoder=confidence, Fast-dLLM's rule, or with "
            "decoder=dream, Dream's own algorithms; leave decoder out for dvoting, or compare "
            "with strategy=majority,decoder=entropy",
        ),
        (
            "single",
            "greedy",
            "decoder must be one of ('fixed', 'entropy', 'confidence', 'dream') (or left out for "
            "the "
            "strategy's own), got 'greedy'",
        ),
        (
            "majority",
            "",
            "decoder must be one of ('fixed', 'entropy', 'confidence', 'dream') (or left out for "
            "the "
            "strategy's own), got ''",
        ),
    ],
)
def test_decoder_refusals_name_the_setting(strategy, decoder, says):
    """The whole message: the setting, its value, what is allowed and what to do."""
    with pytest.raises(ValueError) as refused:
        StrategySettings(strategy=strategy, gen_length=64, decoder=decoder)
    assert str(refused.value) == says
    # the settings the refusals leave alone are accepted
    StrategySettings(strategy=strategy, gen_length=64, decoder=None)


# ------------------------------------------------------------ progress guard (issue 38)


def test_a_plan_that_asks_for_no_samples_raises_instead_of_waiting_forever(monkeypatch):
    """A question whose plan yields a draw of no samples has nothing to decode and never
    finishes: the scheduler raises, naming the strategy and the question, instead of spinning."""

    def empty_plan(settings, mask_id, same_answer):
        yield []

    spins = itertools.count()
    fill = strategies._Scheduler._fill_free_rows

    def counted_fill(self):
        if next(spins) > 1000:  # the bug: the loop spins without end; fail instead of hanging
            raise AssertionError("the scheduler spins on a question with nothing to decode")
        fill(self)

    monkeypatch.setattr(strategies, "question_plan", empty_plan)
    monkeypatch.setattr(strategies._Scheduler, "_fill_free_rows", counted_fill)
    says = r"strategy=majority's plan asked for a draw of no samples for question 0 after 0 sample"
    with pytest.raises(RuntimeError, match=says):
        run_strategy(
            _scripted(),
            _prompts([4, 5]),
            strategy="majority",
            extract=ScriptedAnswers({}),
            gen_length=16,
            block_length=4,
            max_rows=1,
        )


def test_a_rule_that_commits_nothing_names_the_question_and_sample(monkeypatch):
    """The decoder's progress guard (tests/test_decoding.py) names a strategy's row by its
    question and sample."""
    from lm_eval_dvoting.core.parts.rules.entropy import EntropyThreshold

    monkeypatch.setattr(EntropyThreshold, "_decide", staticmethod(lambda work, entropy: []))
    says = r"committed nothing in step 1 of row 0 \(question 0, sample 1\)"
    with pytest.raises(RuntimeError, match=says):
        run_strategy(
            _scripted(),
            _prompts([4]),
            strategy="dvoting",
            gen_length=16,
            extract=ScriptedAnswers({4: [1] * 5}),
            block_length=4,
            max_rows=1,
        )
