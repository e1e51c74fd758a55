"""strategy=temporal: temporal self-consistency voting over one decode's steps (temporal.py)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lm_eval_dvoting.core.answers import answers_equivalent
from lm_eval_dvoting.core.decoding import generate
from lm_eval_dvoting.core.strategies import StrategySettings, run_strategy
from lm_eval_dvoting.core.temporal import StepAnswers, step_weight, temporal_vote

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

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
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
    from lm_eval_dvoting.core.decoding import DecodeRow, RowDecoder

    decoder = RowDecoder(OscillatingModel())
    row = DecodeRow(
        prompt=PROMPT[0],
        tokens=torch.full((GEN,), MASK),
        block_length=GEN,
        steps=GEN,
        observe=lambda step, prediction: seen.append((step, prediction.tolist())),
    )
    decoder.add(row)
    while decoder.active:
        decoder.step()
    assert seen == [(0, [3, 3, 3, 7]), (1, [3, 3, 3, 7]), (2, [3, 3, 3, 7]), (3, [3, 3, 3, 9])]
    assert (
        row.tokens.tolist() == plain.tokens[0].tolist() == [3, 3, 3, 9]
        and row.nfe == int(plain.nfe[0]) == GEN
    )


def test_weights_are_the_releases_exp_linear_and_fixed():
    assert step_weight(3, 8, "exp", 5.0) == pytest.approx(math.exp(5.0 * 3 / 8))
    assert step_weight(3, 8, "linear", 5.0) == pytest.approx(4 / 8)
    assert step_weight(3, 8, "fixed", 5.0) == 1.0
    with pytest.raises(ValueError, match="temporal_weight must be one of"):
        step_weight(0, 8, "cubic", 5.0)


@pytest.mark.parametrize(
    "rule, alpha, winner, weight",
    [
        ("exp", 5.0, 9, math.exp(5.0 * 3 / 4)),  # the last step outweighs three earlier ones
        ("exp", 0.5, 7, sum(math.exp(0.5 * s / 4) for s in range(3))),
        ("linear", 5.0, 7, (1 + 2 + 3) / 4),
        ("fixed", 5.0, 7, 3.0),
    ],
)
def test_the_heaviest_answer_wins_under_each_weight(rule, alpha, winner, weight):
    vote = temporal_vote([[(0, 7), (1, 7), (2, 7), (3, 9)]], [4], rule, alpha)
    total = sum(step_weight(s, 4, rule, alpha) for s in range(4))
    assert vote.winner == winner and vote.weights[0] == (
        winner,
        pytest.approx(weight / total),
    )  # its share
    assert sum(w for _, w in vote.weights) == pytest.approx(1.0)
    assert vote.carrier == (0, 2 if winner == 7 else 3)  # the latest step carrying the winner


def test_ties_go_to_the_answer_seen_first_and_steps_without_an_answer_do_not_vote():
    assert temporal_vote([[(0, 9), (1, 7)]], [2], "fixed").winner == 9
    assert temporal_vote([[(0, 7), (1, 9)]], [2], "fixed").winner == 7
    steps = StepAnswers(last_token_answer)
    for step, last in enumerate([0, 7, 0, 9]):
        steps.observe(step, torch.tensor([3, last]))
    assert steps.answers == [(1, 7), (3, 9)]
    assert temporal_vote([[]], [4]).winner is None and temporal_vote([[]], [4]).carrier is None
    # the shares are over the answered steps only: 7 at step 1 and 9 at step 3, 1/2 each
    assert temporal_vote([steps.answers], [4], "fixed").weights == [(7, 0.5), (9, 0.5)]


def test_several_decodes_each_cast_one_vote_spread_over_their_steps():
    """vote=temporal: every decode's weights sum to 1, however many steps it answered at;
    a tie across decodes goes to the answer seen first (decodes in order, then steps)."""
    all_seven, all_nine = (
        [(s, 7) for s in range(8)],
        [(0, 9), (1, 9)],
    )  # 8 steps vs 2: one vote each
    split = [(0, 9), (1, 9), (2, 7), (3, 7)]  # half a vote each
    vote = temporal_vote([all_seven, all_nine, split], [8, 2, 4], "fixed")
    assert vote.weights == [(7, 1.5), (9, 1.5)] and vote.winner == 7
    assert temporal_vote([all_nine, all_seven, split], [2, 8, 4], "fixed").winner == 9
    # the carrier: the decode giving the winner the most weight, at its latest step with it
    assert vote.carrier == (0, 7)
    assert temporal_vote([split, all_seven], [4, 8], "fixed").carrier == (1, 7)
    # a decode that answered nowhere votes for nothing
    assert temporal_vote([[], split], [4, 4], "fixed").weights == [(9, 0.5), (7, 0.5)]


def test_equal_weights_tie_whatever_the_rounding_of_their_sums():
    """Ten shares of 1/10 sum to 0.9999999999999999 in floats: still a tie with one share of 1,
    which goes to the answer seen first, as in a plain vote."""
    vote = temporal_vote([[(s, 7) for s in range(10)], [(0, 9)]], [10, 1], "fixed")
    assert vote.winner == 7 and vote.carrier == (0, 9)
    assert temporal_vote([[(0, 9)], [(s, 7) for s in range(10)]], [1, 10], "fixed").winner == 9


def test_a_decodes_last_step_answers_what_it_committed():
    """At temperature > 0 the last commit is sampled while the predictions are argmaxes: the
    last step's answer and prediction become the final sample's."""
    steps = StepAnswers(last_token_answer)
    for step in range(4):
        steps.observe(step, torch.tensor([3, 7]))
    steps.close(3, torch.tensor([3, 9]), 9)
    assert steps.answers == [(0, 7), (1, 7), (2, 7), (3, 9)] and steps.predictions[3].tolist() == [
        3,
        9,
    ]
    steps.close(
        3, torch.tensor([3, 0]), None
    )  # a final sample without an answer: its last step casts none
    assert steps.answers == [(0, 7), (1, 7), (2, 7)] and 3 not in steps.predictions


def test_exp_shares_never_overflow():
    """exp(alpha * s / T) overflows a float for alpha * s / T > 709; the shares do not."""
    vote = temporal_vote([[(0, 7), (1, 9)]], [1], "exp", 5000.0)
    assert vote.weights == [(9, 1.0), (7, 0.0)]


def test_equivalent_answers_pool_their_weight():
    """MATH answers spelled differently are one answer (the release splits their votes)."""

    def same(a, b):
        return answers_equivalent(a, b, "math")

    vote = temporal_vote(
        [[(0, "\\frac{1}{2}"), (1, "0.5"), (2, "3")]], [3], "fixed", same_answer=same
    )
    assert (
        vote.winner == "\\frac{1}{2}"
        and vote.weights[0][1] == pytest.approx(2 / 3)
        and vote.carrier == (0, 1)
    )
    assert (
        temporal_vote([[(0, "\\frac{1}{2}"), (1, "0.5"), (2, "3")]], [3], "fixed").winner
        == "\\frac{1}{2}"
    )
    assert (
        temporal_vote([[(0, "\\frac{1}{2}"), (1, "0.5"), (2, "3"), (2, "3")]], [3], "fixed").winner
        == "3"
    )


def test_an_unchanged_prediction_is_not_extracted_again():
    calls: list[list[int]] = []

    def counting(tokens):
        calls.append(tokens.tolist())
        return last_token_answer(tokens)

    steps = StepAnswers(counting)
    for step, last in enumerate([7, 7, 7, 9]):
        steps.observe(step, torch.tensor([3, last]))
    assert calls == [[3, 7], [3, 9]] and steps.answers == [(0, 7), (1, 7), (2, 7), (3, 9)]


@pytest.mark.parametrize(
    "rule, alpha, returned",
    [
        ("exp", 5.0, [3, 3, 3, 9]),  # the final sample
        # close call: 9 weighs e^1.875 = 6.52 over T = 4 steps, the three 7s 6.36; weighed over
        # any other T (e.g. twice the steps) the 7s would win
        ("exp", 2.5, [3, 3, 3, 9]),
        ("fixed", 5.0, [3, 3, 3, 7]),  # step 2's prediction: the latest carrying 7
    ],
)
def test_temporal_returns_the_latest_prediction_carrying_the_voted_answer(rule, alpha, returned):
    [result] = run_strategy(
        OscillatingModel(),
        PROMPT,
        strategy="temporal",
        extract=last_token_answer,
        gen_length=GEN,
        block_length=GEN,
        steps=GEN,
        temporal_weight=rule,
        temporal_alpha=alpha,
    )
    assert result.returned_tokens.tolist() == returned
    assert result.samples.tolist() == [[3, 3, 3, 9]] and result.answers == [9]  # the decode itself
    assert result.nfe == GEN and result.step_answers == [[(0, 7), (1, 7), (2, 7), (3, 9)]]
    assert result.plain_vote == 9  # what the final answer alone gives


def test_temporal_takes_the_papers_settings_by_default():
    settings = StrategySettings(strategy="temporal", gen_length=256)
    assert (
        settings.resolved_block_length,
        settings.steps_run,
        settings.resolved_temperature,
        settings.resolved_decoder,
        settings.temporal_weight,
        settings.temporal_alpha,
    ) == (32, 128, 0.0, "fixed", "exp", 5.0)
    assert (
        StrategySettings(strategy="temporal", gen_length=48).resolved_block_length == 3
    )  # 32 does not divide 48


@pytest.mark.parametrize(
    "settings, says",
    [
        (
            {"temporal_weight": "cubic"},
            "temporal_weight must be one of ('exp', 'linear', 'fixed'), got 'cubic'",
        ),
        ({"temporal_alpha": -1.0}, "temporal_alpha must be >= 0, got -1.0"),
        ({"temporal_alpha": math.inf}, "temporal_alpha must be finite"),
        (
            {"strategy": "temporal", "cache": "dual"},
            "cache=dual does not apply to strategy=temporal",
        ),
    ],
)
def test_bad_temporal_settings_are_refused_by_name(settings, says):
    with pytest.raises(ValueError, match=r"^" + says.replace("(", r"\(").replace(")", r"\)")):
        StrategySettings(**settings)


@pytest.mark.parametrize("checkpoint", ["tiny-arith", "tiny-arith-dream"])
def test_on_the_demo_temporal_costs_what_single_costs_and_a_steep_weight_gives_its_texts(
    checkpoint,
):
    """Same seed and settings: `temporal` takes exactly `single`'s forward passes; with
    temporal_alpha=50 the last step dominates and it returns exactly `single`'s tokens."""
    from lm_eval_dvoting.core.answers import extract_answer
    from lm_eval_dvoting.demo import arith
    from lm_eval_dvoting.demo.tokenizer import EOS
    from lm_eval_dvoting.models.loading import load_model, load_tokenizer

    torch.set_num_threads(1)
    model, tokenizer = load_model(checkpoint), load_tokenizer(checkpoint)
    _, problems = arith.held_out_sets(valid_size=16)
    enc = tokenizer(
        [arith.format_prompt(p.question) for p in problems],
        add_special_tokens=False,
        padding=True,
        return_tensors="pt",
    )

    def extract(tokens):
        return extract_answer(
            tokenizer.decode(tokens.tolist(), skip_special_tokens=False).split(EOS)[0], "number"
        )

    common = dict(extract=extract, gen_length=32, block_length=32, steps=16, seed=3)
    single = run_strategy(model, enc.input_ids, enc.attention_mask, strategy="single", **common)
    default = run_strategy(model, enc.input_ids, enc.attention_mask, strategy="temporal", **common)
    steep = run_strategy(
        model, enc.input_ids, enc.attention_mask, strategy="temporal", temporal_alpha=50.0, **common
    )
    assert [r.nfe for r in default] == [r.nfe for r in steep] == [r.nfe for r in single]
    assert [r.returned_tokens.tolist() for r in steep] == [r.samples[0].tolist() for r in single]
    # not vacuous: at the default weights the vote overturns some final answers
    assert any(extract(t.returned_tokens) != extract(s.samples[0]) for t, s in zip(default, single))


@pytest.mark.parametrize(
    "setting", [{"cache": "prefix"}, {"decoder": "entropy"}, {"decoder": "confidence"}]
)
def test_temporal_decodes_as_single_under_the_other_decoder_settings(setting):
    """The observer works with the prefix cache and the threshold rules: the same passes
    as `single`, and its tokens when the last step dominates."""
    from lm_eval_dvoting.models.loading import load_model

    torch.set_num_threads(1)
    model = load_model("tiny-arith")
    prompts = torch.randint(4, 40, (4, 12), generator=torch.Generator().manual_seed(0))
    common = dict(
        extract=lambda t: int(t[-1]) % 5, gen_length=32, block_length=8, steps=16, seed=1, **setting
    )
    single = run_strategy(model, prompts, strategy="single", **common)
    steep = run_strategy(model, prompts, strategy="temporal", temporal_alpha=50.0, **common)
    assert [r.nfe for r in steep] == [r.nfe for r in single]
    assert [r.returned_tokens.tolist() for r in steep] == [r.samples[0].tolist() for r in single]
    assert all(
        len(r.step_answers[0]) == r.nfe for r in steep
    )  # every step answered (the extract never says None)


def test_strategy_temporal_through_the_harness_answers_every_document():
    import lm_eval
    from lm_eval.tasks import TaskManager

    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    torch.set_num_threads(1)
    lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu", strategy="temporal", batch_size=8)
    tasks = TaskManager(
        include_path=str(
            __import__("pathlib").Path(__file__).resolve().parents[1] / "task_configs"
        ),
        include_defaults=False,
    )
    results = lm_eval.simple_evaluate(
        model=lm, tasks=["dvoting_arith"], limit=8, task_manager=tasks, log_samples=True
    )
    figures = results["results"]["dvoting_arith"]
    assert (
        figures["nfe,extract"] == 16 and figures["n_samples,extract"] == 1
    )  # one decode, steps L/2
    records = results["samples"]["dvoting_arith"]
    for record in records:
        trace = record["dvoting_trace"]
        voted = max(trace["votes"].items(), key=lambda kv: kv[1])[0]
        assert record["filtered_resps"][0] == voted  # the task's filter reads the voted answer
        assert sum(trace["votes"].values()) == pytest.approx(1.0)  # one decode: the answers' shares
        assert trace["winner"] == voted and trace["winner_share"] == pytest.approx(
            trace["votes"][voted]
        )
        # the per-step answers, as runs [first step, answer or None] over the 16 steps:
        # the last run is the final answer, which is also the plain vote
        [candidate] = trace["candidates"]
        runs = candidate["steps"]
        assert runs[0][0] == 0 and [step for step, _ in runs] == sorted({step for step, _ in runs})
        assert (
            all(a != b for (_, a), (_, b) in zip(runs, runs[1:]))
            and runs[-1][0] < candidate["nfe"] == 16
        )
        assert runs[-1][1] == candidate["answer"] == trace["plain_vote"] and voted in {
            a for _, a in runs
        }
        # scored against the gold by the task: each run, the plain vote, ever-pass
        gold = record["target"]
        assert candidate["steps_correct"] == [answer == gold for _, answer in runs]
        assert trace["plain_correct"] == (trace["plain_vote"] == gold)
        assert record["ever_pass"] == float(any(candidate["steps_correct"]))
        assert record["ever_pass"] >= record["exact_match"]
    assert any(len(record["dvoting_trace"]["candidates"][0]["steps"]) > 1 for record in records)
    assert figures["ever_pass,extract"] == pytest.approx(
        sum(r["ever_pass"] for r in records) / len(records)
    )
    assert figures["tse,extract"] == pytest.approx(sum(r["tse"] for r in records) / len(records))


def test_temporal_follows_the_tasks_sampling_as_single_does():
    """One decode per request, like HF generate: the task's do_sample/temperature apply."""
    from lm_eval_dvoting.integration.request_planning import task_sampling

    settings = StrategySettings(strategy="temporal", gen_length=32)
    assert (
        task_sampling(settings, {"do_sample": True, "temperature": 0.7}, "t", set()).temperature
        == 0.7
    )
    voting = StrategySettings(strategy="majority", gen_length=32)
    assert (
        task_sampling(voting, {"do_sample": True, "temperature": 0.7}, "t", set()).temperature
        is None
    )


# ----------------------------------------------------------- vote=temporal on the voting strategies


def test_majority_with_the_temporal_vote_returns_the_carriers_prediction_when_no_final_answer_won():
    """Three greedy samples, each 7 at three steps and 9 at the last: under equal weights 7
    wins though every final answer is 9, so the response is the latest prediction with 7;
    under steep weights 9 wins and the response is the first sample, as plain voting's."""
    common = dict(
        strategy="majority",
        n=3,
        temperature=0.0,
        extract=last_token_answer,
        gen_length=GEN,
        block_length=GEN,
        steps=GEN,
        vote="temporal",
    )
    [flat] = run_strategy(OscillatingModel(), PROMPT, temporal_weight="fixed", **common)
    assert (
        flat.votes == [(7, pytest.approx(2.25)), (9, pytest.approx(0.75))] and flat.plain_vote == 9
    )
    assert flat.returned_tokens.tolist() == [3, 3, 3, 7] and flat.chosen == 0
    assert (
        flat.returned_step == GEN - 2
    )  # the latest step whose prediction answers 7 (the last says 9)
    assert (
        flat.nfe == 3 * GEN and len(flat.step_answers) == 3
    )  # no extra pass; every sample's steps
    [steep] = run_strategy(OscillatingModel(), PROMPT, temporal_alpha=50.0, **common)
    assert (
        steep.votes[0][0] == 9
        and steep.returned is None
        and steep.returned_tokens.tolist() == [3, 3, 3, 9]
    )


def test_the_temporal_vote_groups_answers_with_same_answer():
    """Answers that `same_answer` calls equal are one answer for the temporal vote, the plain
    vote beside it and the choice of the returned sample: grouping 7 with 9, the steps' 7s
    and the finals' 9s are one answer, so the first sample is returned as it is."""
    [grouped] = run_strategy(
        OscillatingModel(),
        PROMPT,
        strategy="majority",
        n=3,
        temperature=0.0,
        extract=last_token_answer,
        gen_length=GEN,
        block_length=GEN,
        steps=GEN,
        vote="temporal",
        temporal_weight="fixed",
        same_answer=lambda a, b: {a, b} <= {7, 9},
    )
    assert len(grouped.votes) == 1 and grouped.votes[0][1] == pytest.approx(3.0)
    assert grouped.returned is None and grouped.returned_step is None and grouped.chosen == 0
    mixed = [
        r
        for seed in range(8)
        for r in run_strategy(
            CloseCallModel(),
            PROMPT,
            strategy="majority",
            n=4,
            temperature=1.0,
            seed=seed,
            extract=last_token_answer,
            gen_length=GEN,
            block_length=GEN,
            steps=GEN,
            vote="temporal",
            same_answer=lambda a, b: {a, b} <= {7, 9},
        )
        if set(r.answers) == {7, 9}
    ]
    assert mixed, "no seed mixed the final answers: the plain-vote check below is vacuous"
    assert all(r.plain_votes == [(r.answers[0], 4)] for r in mixed)


def test_run_strategy_hands_every_setting_to_the_strategy(monkeypatch):
    """run_strategy's keywords reach StrategySettings as given, and its defaults are the
    settings'."""
    from lm_eval_dvoting.core import strategies

    seen = []
    monkeypatch.setattr(
        strategies,
        "decode_questions",
        lambda model, prompts, settings, *a, **k: seen.append(settings),
    )
    given_values = dict(
        strategy="majority",
        gen_length=8,
        block_length=4,
        n=3,
        alpha=0.4,
        temperature=0.5,
        tau=0.8,
        steps=4,
        remasking="random",
        hex_samples=5,
        decoder="fixed",
        threshold=0.8,
        temporal_weight="linear",
        temporal_alpha=7.0,
        vote="temporal",
        guidance=0.5,
    )
    run_strategy(OscillatingModel(), PROMPT, extract=last_token_answer, **given_values)
    assert all(getattr(seen[0], name) == value for name, value in given_values.items())
    # left out, each comes out as the settings' own default (checked on the settings that
    # reach the decoder, not on the signature, which a wrapper could hide)
    run_strategy(OscillatingModel(), PROMPT, extract=last_token_answer, gen_length=8)
    defaults = StrategySettings(gen_length=8)
    for field in (
        "strategy",
        "alpha",
        "tau",
        "hex_samples",
        "temporal_weight",
        "temporal_alpha",
        "guidance",
        "n",
        "max_post_steps",
        "remasking",
        "temperature",
        "steps",
        "decoder",
        "threshold",
        "vote",
        "editing_threshold",
        "block_decoding",
        "block_length",
        "prefix_cache",
    ):
        assert getattr(seen[1], field) == getattr(defaults, field), field


class CloseCallModel(OscillatingModel):
    """The last position's argmax is 7 at every step (so every step's prediction answers
    7), but 9 is nearly as likely, so a sampled final commit is 7 or 9 by the seed."""

    def __init__(self) -> None:
        super().__init__({4: 7, 3: 7, 2: 7, 1: 7})

    def forward(self, input_ids, attention_mask=None):
        logits = super().forward(input_ids, attention_mask)
        logits[:, -1, 9] = 9.9
        return logits


def test_the_temporal_vote_returns_the_first_sample_whose_final_answer_is_the_winner():
    chosen = []
    for seed in range(8):
        [result] = run_strategy(
            CloseCallModel(),
            PROMPT,
            strategy="majority",
            n=4,
            temperature=1.0,
            seed=seed,
            extract=last_token_answer,
            gen_length=GEN,
            block_length=GEN,
            steps=GEN,
            vote="temporal",
            temporal_weight="fixed",
        )
        finals = result.answers
        # every step's prediction is 7, but each sample's last step votes for its own final answer
        assert dict(result.votes) == pytest.approx(
            {7: 3.0 + 0.25 * finals.count(7)} | ({9: 0.25 * finals.count(9)} if 9 in finals else {})
        )
        assert [steps[-1] for steps in result.step_answers] == [
            (GEN - 1, answer) for answer in finals
        ]
        if 7 in finals:  # the first sample ending on the winner, as it is
            assert result.returned is None and result.chosen == finals.index(7)
        else:  # none: the latest prediction with 7, of the first sample (all weigh 7 alike)
            assert result.chosen == 0 and result.returned_tokens.tolist() == [3, 3, 3, 7]
        chosen.append(result.chosen)
    assert any(c > 0 for c in chosen)  # not vacuous: some seed's first sample ended on 9


@pytest.mark.parametrize(
    "settings, says",
    [
        ({"vote": "weighted"}, "vote must be one of ('plain', 'temporal'), got 'weighted'"),
        (
            {"strategy": "single", "vote": "temporal"},
            "vote=temporal does not apply to strategy=single",
        ),
        (
            {"strategy": "temporal", "vote": "plain"},
            "vote=plain does not apply to strategy=temporal",
        ),
        (
            {"strategy": "majority", "vote": "temporal", "cache": "dual"},
            "cache=dual does not apply to vote=temporal",
        ),
    ],
)
def test_bad_vote_settings_are_refused_by_name(settings, says):
    with pytest.raises(ValueError, match=r"^" + says.replace("(", r"\(").replace(")", r"\)")):
        StrategySettings(**settings)


def test_the_vote_defaults_to_the_strategys_own():
    assert [
        StrategySettings(strategy=s).resolved_vote
        for s in ("single", "majority", "hex", "dvoting", "temporal")
    ] == ["plain", "plain", "plain", "plain", "temporal"]
    assert (
        StrategySettings(strategy="dvoting", vote="temporal", cache="prefix").resolved_vote
        == "temporal"
    )


# ------------------------------------------------------------- sample logs and figures

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from lm_eval_dvoting.core.temporal import (  # noqa: E402
    answer_runs,
    expand_runs,
    step_figures,
    temporal_entropy,
)


def test_runs_keep_the_steps_without_an_answer():
    answers = [(1, 7), (2, 7), (4, 7), (5, 9)]
    assert answer_runs(answers, 8) == [[0, None], [1, 7], [3, None], [4, 7], [5, 9], [6, None]]
    assert expand_runs(answer_runs(answers, 8), 8) == [None, 7, 7, None, 7, 9, None, None]
    assert answer_runs([], 3) == [[0, None]] and answer_runs([(0, 7)], 1) == [[0, 7]]


@given(st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=1, max_size=40))
def test_runs_are_lossless(per_step):
    answers = [(step, answer) for step, answer in enumerate(per_step) if answer is not None]
    runs = answer_runs(answers, len(per_step))
    assert expand_runs(runs, len(per_step)) == per_step
    assert all(a[1] != b[1] for a, b in zip(runs, runs[1:]))  # as few runs as there can be


def test_temporal_entropy_is_in_bits_over_the_answered_steps():
    assert temporal_entropy([7, 7, 7, 7]) == 0.0
    assert temporal_entropy([7, None, 9, None]) == pytest.approx(1.0)
    assert temporal_entropy([7, 7, 9, 5]) == pytest.approx(1.5)
    assert temporal_entropy([None, None]) is None
    same = lambda a, b: answers_equivalent(a, b, "math")  # noqa: E731
    assert (
        temporal_entropy(["\\frac{1}{2}", "0.5"], same) == 0.0
        and temporal_entropy(["\\frac{1}{2}", "0.5"]) == 1.0
    )


def test_step_figures_score_every_run_the_plain_vote_and_ever_pass():
    trace = {
        "plain_vote": "9",
        "votes": {"7": 0.6, "9": 0.4},
        "candidates": [
            {"answer": "9", "nfe": 4, "steps": [[0, None], [1, "7"], [3, "9"]]},
            {"answer": "5", "nfe": 2, "steps": [[0, "5"]]},
        ],
    }
    scored, figures = step_figures(trace, lambda answer: answer == "7")
    assert [c["steps_correct"] for c in scored["candidates"]] == [[False, True, False], [False]]
    assert scored["plain_correct"] is False and figures["ever_pass"] == 1.0
    assert figures["tse"] == pytest.approx((temporal_entropy(["7", "7", "9"]) + 0.0) / 2)
    assert "steps_correct" not in trace["candidates"][0]  # the model's trace is left as it was
    _, none_right = step_figures(trace, lambda answer: answer == "3")
    assert none_right["ever_pass"] == 0.0
    # a final answer counts too (a sampled last commit can differ from the last prediction)
    sampled_end = {"candidates": [{"answer": "8", "nfe": 2, "steps": [[0, "7"]]}]}
    assert step_figures(sampled_end, lambda answer: answer == "8")[1]["ever_pass"] == 1.0
    _, no_answer = step_figures(
        {"candidates": [{"answer": None, "nfe": 2, "steps": [[0, None]]}]}, bool
    )
    assert no_answer == {"ever_pass": 0.0}  # no TSE without an answered step


def test_majority_with_vote_temporal_through_the_harness_logs_every_samples_steps():
    import lm_eval
    from lm_eval.tasks import TaskManager

    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    torch.set_num_threads(1)
    lm = LLaDAEvalModel(
        pretrained="tiny-arith",
        device="cpu",
        strategy="majority",
        n=3,
        vote="temporal",
        batch_size=8,
    )
    tasks = TaskManager(
        include_path=str(
            __import__("pathlib").Path(__file__).resolve().parents[1] / "task_configs"
        ),
        include_defaults=False,
    )
    results = lm_eval.simple_evaluate(
        model=lm, tasks=["dvoting_arith"], limit=6, task_manager=tasks, log_samples=True
    )
    assert results["config"]["dvoting"]["settings"]["vote"] == "temporal"
    assert results["results"]["dvoting_arith"]["n_samples,extract"] == 3
    for record in results["samples"]["dvoting_arith"]:
        trace = record["dvoting_trace"]
        assert trace["vote"] == "temporal" and len(trace["candidates"]) == 3
        assert all(
            "steps" in c and len(c["steps_correct"]) == len(c["steps"]) for c in trace["candidates"]
        )
        answering = sum(
            any(answer is not None for _, answer in c["steps"]) for c in trace["candidates"]
        )
        assert sum(trace["votes"].values()) == pytest.approx(
            answering
        )  # one vote per sample that answered
        assert trace["winner_share"] == pytest.approx(
            max(trace["votes"].values()) / sum(trace["votes"].values())
        )
        voted = max(trace["votes"].items(), key=lambda kv: kv[1])[0]
        assert record["filtered_resps"][0] == voted


def test_the_rules_reuse_the_observers_logits_so_temporal_runs_singles_head_calls():
    """The observer computes every masked position's logits; the rules' request for the
    block's is served from them: per step one head call, as for single, not two."""
    from lm_eval_dvoting.models.loading import load_model

    torch.set_num_threads(1)
    model = load_model("tiny-arith")
    calls = []
    head = model.logits_from_hidden
    model.logits_from_hidden = lambda hidden: calls.append(hidden.shape[0]) or head(hidden)
    prompts = torch.randint(4, 40, (3, 12), generator=torch.Generator().manual_seed(0))
    common = dict(extract=lambda t: int(t[-1]) % 5, gen_length=32, block_length=8, steps=16, seed=1)
    single = run_strategy(model, prompts, strategy="single", **common)
    single_calls, calls[:] = list(calls), []
    steep = run_strategy(model, prompts, strategy="temporal", temporal_alpha=50.0, **common)
    assert len(calls) == len(single_calls) == 16  # one call per step for the three rows
    assert sum(calls) > sum(single_calls)  # the observer's call covers the future blocks too
    assert [r.returned_tokens.tolist() for r in steep] == [r.samples[0].tolist() for r in single]


@pytest.mark.parametrize("strategy", ["majority", "dvoting", "hex"])
def test_the_temporal_vote_changes_no_sample(strategy):
    """vote=temporal reads the steps of the very samples vote=plain draws (dVoting's early
    stop included, which reads the final answers): same tokens, same passes."""
    from lm_eval_dvoting.models.loading import load_model

    torch.set_num_threads(1)
    model = load_model("tiny-arith")
    prompts = torch.randint(4, 40, (3, 12), generator=torch.Generator().manual_seed(0))
    common = dict(
        strategy=strategy, extract=lambda t: int(t[-1]) % 3, gen_length=32, seed=2, hex_samples=5
    )
    plain = run_strategy(model, prompts, **common)
    temporal = run_strategy(model, prompts, vote="temporal", **common)
    assert [r.samples.tolist() for r in temporal] == [r.samples.tolist() for r in plain]
    assert [r.nfe for r in temporal] == [r.nfe for r in plain]
    assert [r.plain_votes for r in temporal] == [r.votes for r in plain]


def test_closing_a_decode_replaces_only_its_last_steps_answer():
    """A last step without an answer: the earlier steps' answers stay, the final one is added."""
    steps = StepAnswers(last_token_answer)
    for step, last in enumerate([7, 7, 7, 0]):
        steps.observe(step, torch.tensor([3, last]))
    steps.close(3, torch.tensor([3, 9]), 9)
    assert steps.answers == [(0, 7), (1, 7), (2, 7), (3, 9)]


def test_a_decode_that_never_wavered_has_an_entropy_of_plus_zero():
    """Logged as 0.0, not -0.0 (the sum of -1 * log2(1))."""
    assert math.copysign(1.0, temporal_entropy([7, 7, 7])) == 1.0


def test_step_figures_read_every_candidate_with_steps_and_group_equivalent_answers():
    same = lambda a, b: answers_equivalent(a, b, "math")  # noqa: E731
    trace = {
        "plain_vote": "1/2",
        "candidates": [
            {"answer": "3", "nfe": 2},  # no steps logged for this one
            {"answer": "0.5", "nfe": 2, "steps": [[0, "\\frac{1}{2}"], [1, "0.5"]]},
        ],
    }
    scored, figures = step_figures(trace, lambda answer: same("1/2", answer), same)
    assert (
        scored["candidates"][1]["steps_correct"] == [True, True]
        and "steps_correct" not in scored["candidates"][0]
    )
    assert figures == {"ever_pass": 1.0, "tse": 0.0}  # one answer, spelled two ways


def test_the_temporal_vote_returns_a_later_samples_carrier_with_that_sample_chosen():
    """When the temporal winner is no sample's final answer and the latest step carrying it
    is in another sample than the plain vote's choice, the response is that step's
    prediction and `chosen` names its sample (the trace and `returned_step` refer to it)."""
    from lm_eval_dvoting.core.strategies import _Question

    def decode(per_step: list[int]) -> tuple[torch.Tensor, StepAnswers]:
        steps = StepAnswers(answer_of=lambda t: int(t[-1]))
        for step, answer in enumerate(per_step):
            steps.observe(step, torch.tensor([3, answer]))
        final = torch.tensor([3, per_step[-1]])
        steps.close(len(per_step) - 1, final, per_step[-1])
        return final, steps

    # finals 9, 8, 8, 9: the plain vote ties 9 and 8 and takes 9 (seen first): sample 0;
    # over the steps 7 wins (1.5 against 1.25 and 1.25 at equal weights), carried by samples 2 and 3
    decodes = [decode(s) for s in ([9, 9, 9, 9], [8, 8, 8, 8], [7, 7, 7, 8], [7, 7, 7, 9])]
    question = _Question(
        index=0,
        seed=0,
        plan=iter(()),
        answer_of=lambda t: int(t[-1]),
        samples=[final for final, _ in decodes],
        answers=[9, 8, 8, 9],
        sample_nfe=[4] * 4,
        kept=[None] * 4,
        observed=True,
        steps=[steps for _, steps in decodes],
    )
    settings = StrategySettings(
        strategy="majority",
        gen_length=GEN,
        block_length=GEN,
        steps=GEN,
        n=4,
        vote="temporal",
        temporal_weight="fixed",
    )
    result = settings.vote_part.result(question, settings, None)  # the temporal vote
    assert result.plain_vote == 9 and result.votes[0] == (7, pytest.approx(1.5))
    assert result.chosen in (2, 3) and result.returned_step == 2
    assert result.returned.tolist() == [3, 7] and result.returned_tokens.tolist() == [3, 7]
    assert result.step_answers[result.chosen][result.returned_step] == (2, 7)
