"""strategy=temporal: temporal self-consistency voting over one decode's steps (temporal.py)."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lm_eval_dvoting.answers import answers_equivalent
from lm_eval_dvoting.decoding import generate
from lm_eval_dvoting.strategies import StrategySettings, run_strategy
from lm_eval_dvoting.temporal import StepAnswers, step_weight, temporal_vote

MASK = 15
GEN = 4
# the answer token the model predicts at the last position, by the number of positions
# still masked: 7 at the first three steps, then 9 at the last (0 would be "no answer")
ANSWER_BY_MASKED = {4: 7, 3: 7, 2: 7, 1: 9}


class OscillatingModel(nn.Module):
    """A weightless model whose predictions change from step to step: every generation
    position predicts token 3, except the last, which predicts `answer_by_masked[number of
    masks left in the row]`, with a lower peak so that it is committed last."""

    mask_token_id = MASK
    logits_shift = 0

    def __init__(self, answer_by_masked: dict[int, int] = ANSWER_BY_MASKED) -> None:
        super().__init__()
        self.answer_by_masked = answer_by_masked

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        logits = torch.zeros(*input_ids.shape, 16)
        logits[:, :, 3] = 30.0
        for row, ids in enumerate(input_ids):
            logits[row, -1, 3] = 0.0
            logits[row, -1, self.answer_by_masked[int((ids == MASK).sum())]] = 10.0
        return logits


def last_token_answer(tokens: torch.Tensor) -> int | None:
    token = int(tokens[-1])
    return None if token in (0, MASK) else token


PROMPT = torch.tensor([[1, 2]])


def test_the_decoder_shows_each_steps_full_prediction_before_its_commits():
    """At every step an observed row sees its fixed tokens and the argmax at every masked
    position, future ones included; the decode itself is unchanged (same tokens, NFE)."""
    seen: list[tuple[int, list[int]]] = []
    plain = generate(OscillatingModel(), PROMPT, gen_length=GEN, block_length=GEN, steps=GEN)
    from lm_eval_dvoting.decoding import DecodeRow, RowDecoder

    decoder = RowDecoder(OscillatingModel())
    row = DecodeRow(prompt=PROMPT[0], tokens=torch.full((GEN,), MASK), block_length=GEN, steps=GEN,
                    observe=lambda step, prediction: seen.append((step, prediction.tolist())))
    decoder.add(row)
    while decoder.active:
        decoder.step()
    assert seen == [(0, [3, 3, 3, 7]), (1, [3, 3, 3, 7]), (2, [3, 3, 3, 7]), (3, [3, 3, 3, 9])]
    assert row.tokens.tolist() == plain.tokens[0].tolist() == [3, 3, 3, 9] and row.nfe == int(plain.nfe[0]) == GEN


def test_weights_are_the_releases_exp_linear_and_fixed():
    assert step_weight(3, 8, "exp", 5.0) == pytest.approx(math.exp(5.0 * 3 / 8))
    assert step_weight(3, 8, "linear", 5.0) == pytest.approx(4 / 8)
    assert step_weight(3, 8, "fixed", 5.0) == 1.0
    with pytest.raises(ValueError, match="temporal_weight must be one of"):
        step_weight(0, 8, "cubic", 5.0)


@pytest.mark.parametrize("rule, alpha, winner, weight", [
    ("exp", 5.0, 9, math.exp(5.0 * 3 / 4)),  # the last step outweighs three earlier ones
    ("exp", 0.5, 7, sum(math.exp(0.5 * s / 4) for s in range(3))),
    ("linear", 5.0, 7, (1 + 2 + 3) / 4),
    ("fixed", 5.0, 7, 3.0),
])
def test_the_heaviest_answer_wins_under_each_weight(rule, alpha, winner, weight):
    vote = temporal_vote([(0, 7), (1, 7), (2, 7), (3, 9)], 4, rule, alpha)
    assert vote.winner == winner and vote.weights[0] == (winner, pytest.approx(weight))
    assert vote.winner_step == (2 if winner == 7 else 3)  # the latest step carrying the winner


def test_ties_go_to_the_answer_seen_first_and_steps_without_an_answer_do_not_vote():
    assert temporal_vote([(0, 9), (1, 7)], 2, "fixed").winner == 9
    assert temporal_vote([(0, 7), (1, 9)], 2, "fixed").winner == 7
    steps = StepAnswers(last_token_answer)
    for step, last in enumerate([0, 7, 0, 9]):
        steps.observe(step, torch.tensor([3, last]))
    assert steps.answers == [(1, 7), (3, 9)]
    assert temporal_vote([], 4).winner is None and temporal_vote([], 4).winner_step is None


def test_equivalent_answers_pool_their_weight():
    """MATH answers spelled differently are one answer (the release splits their votes)."""
    def same(a, b):
        return answers_equivalent(a, b, "math")

    vote = temporal_vote([(0, "\\frac{1}{2}"), (1, "0.5"), (2, "3")], 3, "fixed", same_answer=same)
    assert vote.winner == "\\frac{1}{2}" and vote.weights[0][1] == 2.0 and vote.winner_step == 1
    assert temporal_vote([(0, "\\frac{1}{2}"), (1, "0.5"), (2, "3")], 3, "fixed").winner == "\\frac{1}{2}"
    assert temporal_vote([(0, "\\frac{1}{2}"), (1, "0.5"), (2, "3"), (2, "3")], 3, "fixed").winner == "3"


def test_an_unchanged_prediction_is_not_extracted_again():
    calls: list[list[int]] = []

    def counting(tokens):
        calls.append(tokens.tolist())
        return last_token_answer(tokens)

    steps = StepAnswers(counting)
    for step, last in enumerate([7, 7, 7, 9]):
        steps.observe(step, torch.tensor([3, last]))
    assert calls == [[3, 7], [3, 9]] and steps.answers == [(0, 7), (1, 7), (2, 7), (3, 9)]


@pytest.mark.parametrize("rule, alpha, returned", [
    ("exp", 5.0, [3, 3, 3, 9]),  # the final sample
    # close call: 9 weighs e^1.875 = 6.52 over T = 4 steps, the three 7s 6.36; weighed over
    # any other T (e.g. twice the steps) the 7s would win
    ("exp", 2.5, [3, 3, 3, 9]),
    ("fixed", 5.0, [3, 3, 3, 7]),  # step 2's prediction: the latest carrying 7
])
def test_temporal_returns_the_latest_prediction_carrying_the_voted_answer(rule, alpha, returned):
    [result] = run_strategy(OscillatingModel(), PROMPT, strategy="temporal", extract=last_token_answer,
                            gen_length=GEN, block_length=GEN, steps=GEN, temporal_weight=rule, temporal_alpha=alpha)
    assert result.returned_tokens.tolist() == returned
    assert result.samples.tolist() == [[3, 3, 3, 9]] and result.answers == [9]  # the decode itself
    assert result.nfe == GEN and result.step_answers == [(0, 7), (1, 7), (2, 7), (3, 9)]


def test_temporal_takes_the_papers_settings_by_default():
    settings = StrategySettings(strategy="temporal", gen_length=256)
    assert (settings.resolved_block_length, settings.steps_run, settings.resolved_temperature,
            settings.resolved_decoder, settings.temporal_weight, settings.temporal_alpha) == (32, 128, 0.0, "fixed",
                                                                                               "exp", 5.0)
    assert StrategySettings(strategy="temporal", gen_length=48).resolved_block_length == 3  # 32 does not divide 48


@pytest.mark.parametrize("settings, says", [
    ({"temporal_weight": "cubic"}, "temporal_weight must be one of ('exp', 'linear', 'fixed'), got 'cubic'"),
    ({"temporal_alpha": -1.0}, "temporal_alpha must be >= 0, got -1.0"),
    ({"temporal_alpha": math.inf}, "temporal_alpha must be finite"),
    ({"strategy": "temporal", "cache": "dual"}, "cache=dual does not apply to strategy=temporal"),
])
def test_bad_temporal_settings_are_refused_by_name(settings, says):
    with pytest.raises(ValueError, match=r"^" + says.replace("(", r"\(").replace(")", r"\)")):
        StrategySettings(**settings)


@pytest.mark.parametrize("checkpoint", ["tiny-arith", "tiny-arith-dream"])
def test_on_the_demo_temporal_costs_what_single_costs_and_a_steep_weight_gives_its_texts(checkpoint):
    """Same seed and settings: `temporal` takes exactly `single`'s forward passes; with
    temporal_alpha=50 the last step dominates and it returns exactly `single`'s tokens."""
    from lm_eval_dvoting.answers import extract_answer
    from lm_eval_dvoting.demo import arith
    from lm_eval_dvoting.demo.tokenizer import EOS
    from lm_eval_dvoting.models.loading import load_model, load_tokenizer

    torch.set_num_threads(1)
    model, tokenizer = load_model(checkpoint), load_tokenizer(checkpoint)
    _, problems = arith.held_out_sets(valid_size=16)
    enc = tokenizer([arith.format_prompt(p.question) for p in problems], add_special_tokens=False,
                    padding=True, return_tensors="pt")

    def extract(tokens):
        return extract_answer(tokenizer.decode(tokens.tolist(), skip_special_tokens=False).split(EOS)[0], "number")

    common = dict(extract=extract, gen_length=32, block_length=32, steps=16, seed=3)
    single = run_strategy(model, enc.input_ids, enc.attention_mask, strategy="single", **common)
    default = run_strategy(model, enc.input_ids, enc.attention_mask, strategy="temporal", **common)
    steep = run_strategy(model, enc.input_ids, enc.attention_mask, strategy="temporal", temporal_alpha=50.0, **common)
    assert [r.nfe for r in default] == [r.nfe for r in steep] == [r.nfe for r in single]
    assert [r.returned_tokens.tolist() for r in steep] == [r.samples[0].tolist() for r in single]
    # not vacuous: at the default weights the vote overturns some final answers
    assert any(extract(t.returned_tokens) != extract(s.samples[0]) for t, s in zip(default, single))


@pytest.mark.parametrize("setting", [{"cache": "prefix"}, {"decoder": "entropy"}, {"decoder": "confidence"}])
def test_temporal_decodes_as_single_under_the_other_decoder_settings(setting):
    """The observer works with the prefix cache and the threshold rules: the same passes
    as `single`, and its tokens when the last step dominates."""
    from lm_eval_dvoting.models.loading import load_model

    torch.set_num_threads(1)
    model = load_model("tiny-arith")
    prompts = torch.randint(4, 40, (4, 12), generator=torch.Generator().manual_seed(0))
    common = dict(extract=lambda t: int(t[-1]) % 5, gen_length=32, block_length=8, steps=16, seed=1, **setting)
    single = run_strategy(model, prompts, strategy="single", **common)
    steep = run_strategy(model, prompts, strategy="temporal", temporal_alpha=50.0, **common)
    assert [r.nfe for r in steep] == [r.nfe for r in single]
    assert [r.returned_tokens.tolist() for r in steep] == [r.samples[0].tolist() for r in single]
    assert all(len(r.step_answers) == r.nfe for r in steep)  # every step answered (the extract never says None)


def test_strategy_temporal_through_the_harness_answers_every_document():
    import lm_eval
    from lm_eval.tasks import TaskManager

    from lm_eval_dvoting.harness import LLaDAEvalModel

    torch.set_num_threads(1)
    lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu", strategy="temporal", batch_size=8)
    tasks = TaskManager(include_path=str(__import__("pathlib").Path(__file__).resolve().parents[1] / "task_configs"),
                        include_defaults=False)
    results = lm_eval.simple_evaluate(model=lm, tasks=["dvoting_arith"], limit=8, task_manager=tasks,
                                      log_samples=True)
    figures = results["results"]["dvoting_arith"]
    assert figures["nfe,extract"] == 16 and figures["n_samples,extract"] == 1  # one decode, steps L/2
    for record in results["samples"]["dvoting_arith"]:
        trace = record["dvoting_trace"]
        voted = max(trace["votes"].items(), key=lambda kv: kv[1])[0]
        assert record["filtered_resps"][0] == voted  # the task's filter reads the voted answer
        # the per-step answers, as runs [first step, answer]: the last run is the final answer
        runs = trace["steps"]
        assert [step for step, _ in runs] == sorted({step for step, _ in runs})
        assert all(a != b for (_, a), (_, b) in zip(runs, runs[1:]))
        assert runs[-1][1] == trace["candidates"][0]["answer"] and voted in {answer for _, answer in runs}
    assert any(len(record["dvoting_trace"]["steps"]) > 1 for record in results["samples"]["dvoting_arith"])


def test_temporal_follows_the_tasks_sampling_as_single_does():
    """One decode per request, like HF generate: the task's do_sample/temperature apply."""
    from lm_eval_dvoting.request_planning import task_sampling

    settings = StrategySettings(strategy="temporal", gen_length=32)
    assert task_sampling(settings, {"do_sample": True, "temperature": 0.7}, "t", set()).temperature == 0.7
    voting = StrategySettings(strategy="majority", gen_length=32)
    assert task_sampling(voting, {"do_sample": True, "temperature": 0.7}, "t", set()).temperature is None
