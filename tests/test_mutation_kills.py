"""Tests written to kill surviving mutants of the scoring core (tools/mutation.py,
docs/MUTATION.md). Each one guards a behaviour a user can see: a returned text, a voted
or scored answer, an NFE count, a seed, a stop decision or a metric.
"""

from __future__ import annotations

import math
import shutil
import sys
import threading

import pytest
import torch
from scripted import ScriptedAnswers, ScriptedModel, gen_choices

from lm_eval_dvoting.core import answers
from lm_eval_dvoting.core.answers import (
    answers_equivalent,
    extract_answer,
    infer_answer_kind,
    normalize_math,
)
from lm_eval_dvoting.core.metrics import (
    benefit_per_cost,
    consistency_from_votes,
    consistency_level,
    nupr_at_k,
)
from lm_eval_dvoting.core.strategies import (
    StrategySettings,
    decode_questions,
    remask_tokens,
    run_strategy,
)

# ---- metrics.py ----------------------------------------------------------------------


def test_benefit_per_cost_accepts_one_step_and_rejects_zero_steps():
    """A one-step run is a valid cost (BPC is defined), a zero-step one is not: the
    boundary of the `steps > 0` check, with the message naming both step counts."""
    assert benefit_per_cost(0.75, 0.5, 1, 1) == pytest.approx(0.25)
    assert benefit_per_cost(0.75, 0.5, 2, 1) == pytest.approx(0.125)
    assert benefit_per_cost(0.75, 0.5, 1, 2) == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"steps must be > 0, got method 0, single 4"):
        benefit_per_cost(0.75, 0.5, 0, 4)
    with pytest.raises(ValueError, match=r"steps must be > 0, got method 4, single 0"):
        benefit_per_cost(0.75, 0.5, 4, 0)


def test_consistency_from_votes_of_one_sample():
    """One sample that voted is full consistency; zero samples is an error that says so."""
    assert consistency_from_votes({"7": 1}, 1) == 1.0
    assert consistency_from_votes({}, 1) == 0.0
    with pytest.raises(ValueError, match=r"n_samples must be >= 1, got 0"):
        consistency_from_votes({"7": 1}, 0)


def test_metric_errors_name_the_empty_input():
    """Empty inputs fail with a message that says what was empty, not a bare ValueError."""
    with pytest.raises(ValueError, match=r"^no answers$"):
        consistency_level([])
    with pytest.raises(ValueError, match=r"^no samples$"):
        nupr_at_k([], 1)
    with pytest.raises(ValueError, match=r"^samples have no positions$"):
        nupr_at_k([[], []], 1)
    with pytest.raises(ValueError, match=r"^samples have no positions$"):
        nupr_at_k(torch.zeros(3, 0, dtype=torch.long), 1)


# ---- answers.py ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "task, kind",
    [
        ("leaderboard_math_hard", "math"),
        ("leaderboard_gpqa_main", "choice"),
        ("leaderboard-mmlu-pro", "choice"),
        ("my.minerva.copy", "math"),
    ],
)
def test_answer_kind_from_a_benchmark_name_inside_the_task_name(task, kind):
    """The task name is split at every non-alphanumeric character, so a benchmark name
    after a prefix (lm-eval's `leaderboard_*` groups) still decides the answer kind
    (the vote then groups `\\frac{1}{2}` with `0.5`, or letters with letters)."""
    assert infer_answer_kind(task) == kind


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is 3 / 4", "0.75"),
        ("The answer is 1.5/3", "0.5"),
        ("#### 4.5 / 1.5", "3"),
        ("so it is -3/4", "-0.75"),
    ],
)
def test_fraction_answers_with_spaces_or_decimals(text, expected):
    """A fraction written with spaces around the slash or with decimal parts is still
    one number (`1.5/3` is 0.5, not "no answer"), so such samples vote for it."""
    assert extract_answer(text, "number") == expected


@pytest.mark.parametrize(
    "decimal",
    [
        "0.000000000000000000001073741824",  # 1 / 5**30
        "0.000000000000000000000536870912",  # 1 / (2 * 5**30)
        "0.0000000000000000000000000000001",  # 1 / 10**31
    ],
)
def test_long_terminating_decimals_stay_decimals(decimal):
    """A terminating decimal with more digits than a float holds comes back exactly as
    written, not as a `p/q` fraction: the canonical form is computed in integers."""
    assert extract_answer(f"The answer is {decimal}", "number") == decimal


def test_en_dash_minus_sign_makes_a_negative_number():
    """An en dash before a number (a common typeset minus) is a minus sign."""
    assert extract_answer("The answer is \u20135", "number") == "-5"
    assert extract_answer("The answer is \u22125", "number") == "-5"


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"The answer is -\$5", "-5"),  # minus five dollars, LaTeX-escaped dollar sign
        (r"The answer is \$-5", "-5"),
        (r"The change is 10\%, so the answer is \%-3", "-3"),  # a sign right after `\%`
    ],
)
def test_latex_escaped_dollar_and_percent_keep_the_sign(text, expected):
    """`\\$` and `\\%` read as the plain signs, so a minus next to them stays the
    number's sign (the vote must not split `-5` from `5` by how the dollar was typed)."""
    assert extract_answer(text, "number") == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"\boxed{\frac{1,000}{3}}", "1000/3"),
        (r"\boxed{\frac{3}{1,000}}", "0.003"),
    ],
)
def test_latex_fraction_with_thousands_separators(text, expected):
    """A `\\frac` whose numerator or denominator has thousands commas is one fraction."""
    assert extract_answer(text, "number") == expected


def test_a_latex_fraction_with_zero_denominator_is_left_as_written():
    """`\\frac{5}{0}` has no value: it is left as written (its digits read as plain
    numbers, so the first number after "The answer is" is 5), never a crash, and the
    text around it is kept."""
    assert extract_answer(r"The answer is \frac{5}{0}", "number") == "5"
    assert extract_answer(r"The answer is \frac{5}{0} or 7", "number") == "5"


def test_answer_phrase_reads_only_its_own_line():
    """The number after "The answer is" is read in its clause, on the same line only
    (module rule 2); a phrase whose clause has no number falls through to the last
    number in the text, not to a number on a later line."""
    assert extract_answer("The answer is below.\n7\nCheck: 9", "number") == "9"
    assert (
        extract_answer("The answer is below\n7\nCheck: 9", "number") == "9"
    )  # not the next line's 7
    assert extract_answer("The answer is 4 apples.\nThen 7 more\nin all 11", "number") == "4"


def test_whole_number_latex_fraction_divided_again():
    """`\\frac{4}{2}` is the whole number 2, so `\\frac{4}{2}/3` reads as the fraction 2/3."""
    assert extract_answer(r"The answer is \frac{4}{2}/3", "number") == "2/3"


@pytest.mark.parametrize(
    "text, kind, expected",
    [
        # the last non-empty box counts: an empty last box falls back to the earlier one
        (r"\boxed{5} and then \boxed{}", "number", "5"),
        (r"\boxed{5}, not 7 \boxed{}", "number", "5"),
        # a generation cut off right after the command (with or without spaces): no crash,
        # and a truncated final box, so no answer (issue 38; these rows read the earlier
        # phrase's 7 before, which is the fallback reading the issue names as the bug)
        ("The answer is 7. \\boxed", "number", None),
        ("The answer is 7. \\boxed  ", "number", None),
        # `\fboxsep` is another command, not a box: the scan goes on to the real `\fbox`
        (r"\setlength{\fboxsep}{2pt}\fbox{5} so 9", "number", "5"),
        # the brace-less form takes the next token, whatever letter it is
        (r"so \boxed X", "math", "X"),
        # but only after a space: `\boxed5` is no box, as for lm-eval's own minerva_math
        # `last_boxed_only_string` (a decision: TeX would box the 5)
        (r"so \boxed5", "math", None),
    ],
)
def test_boxed_answer_edge_cases(text, kind, expected):
    """Boxes are found left to right, the last non-empty one wins, commands that merely
    start with `\\boxed`/`\\fbox` are skipped, and text ending at the command is no answer."""
    assert extract_answer(text, kind) == expected


def test_adjacent_boxes_are_both_found():
    """`\\boxed{1}\\boxed{2}`: the scan resumes right after the first box's closing brace,
    so a box that follows at once is found and, being last, is the answer."""
    assert extract_answer(r"\boxed{1}\boxed{2}", "number") == "2"
    assert extract_answer(r"\fbox{1}\fbox{2}", "number") == "2"


@pytest.mark.parametrize(
    "raw, normal",
    [
        (r"\displaystyle \frac{1}{2}", r"\frac{1}{2}"),
        ("$X + 1$", "X + 1"),
        ("x  +\n 1", "x + 1"),
        ("5 .", "5"),
        ("x = 5X.", "x = 5X"),
    ],
)
def test_normalize_math_spellings(raw, normal):
    """Spellings that never change a LaTeX answer's value are removed, so equal answers
    are equal strings (and vote together without math-verify): `\\displaystyle`,
    surrounding `$`, runs of whitespace, a final period; letters are kept."""
    assert normalize_math(raw) == normal


@pytest.fixture
def fresh_math_cache():
    """math-verify results are cached per process; each test here needs its own calls."""
    answers._parse_math.cache_clear()
    answers._math_equivalent.cache_clear()
    yield
    answers._parse_math.cache_clear()
    answers._math_equivalent.cache_clear()


def test_math_verify_runs_with_its_timeout_in_the_main_thread(monkeypatch, fresh_math_cache):
    """In the main thread math-verify gets its 5 s timeouts, so a pathological answer
    cannot hang an evaluation."""
    import math_verify

    seen = {}
    real_parse, real_verify = math_verify.parse, math_verify.verify

    def parse(text, **kwargs):
        seen.setdefault("parse", kwargs.get("parsing_timeout"))
        return real_parse(text, **kwargs)

    def verify(gold, pred, **kwargs):
        seen["verify"] = kwargs.get("timeout_seconds")
        return real_verify(gold, pred, **kwargs)

    monkeypatch.setattr(math_verify, "parse", parse)
    monkeypatch.setattr(math_verify, "verify", verify)
    assert answers_equivalent(r"\frac{13}{26}", "0.5", "math")
    assert seen == {"parse": 5, "verify": 5}


def test_math_equivalence_works_in_a_worker_thread(fresh_math_cache):
    """math-verify's timeout needs SIGALRM, which only the main thread may set; in a
    worker thread (a harness worker) the comparison runs without it and still finds
    `\\frac{13}{26}` = 0.5, instead of failing into "not equivalent"."""
    result = {}
    worker = threading.Thread(
        target=lambda: result.update(
            same=answers_equivalent(r"\frac{13}{26}", "0.5", "math"),
            different=answers_equivalent(r"\frac{13}{26}", "0.25", "math"),
        )
    )
    worker.start()
    worker.join()
    assert result == {"same": True, "different": False}


def test_math_answers_equal_after_normalisation_are_equivalent(fresh_math_cache):
    """Answers that differ only in spellings `normalize_math` removes are one answer,
    even where math-verify cannot read them (`\\text{red}`)."""
    assert answers_equivalent(r"\left(1, 2\right)", "(1, 2)", "math")
    assert answers_equivalent(r"\displaystyle \text{red}", r"\text{red}", "math")


def test_math_answers_over_1000_characters_are_compared_as_strings(fresh_math_cache):
    """math-verify gets answers of up to 1000 characters; longer ones (runaway
    generations) are compared as strings only, so they never cost sympy seconds."""
    at_limit, over_limit = "0" * 999 + "5", "0" * 1000 + "5"
    assert len(at_limit) == 1000 and len(over_limit) == 1001
    assert answers_equivalent(at_limit, "5", "math")  # math-verify reads 000...05 as 5
    assert not answers_equivalent(over_limit, "5", "math")
    assert not answers_equivalent("5", over_limit, "math")


# ---- strategies.py -------------------------------------------------------------------


def test_remask_keeps_a_position_whose_share_is_within_float_error_of_tau():
    """A share equal to tau up to float rounding (tau = 0.5 + 1e-12) keeps the position:
    the comparison allows 1e-12, so tau=2/3 typed as 0.6666666666666666 still keeps
    positions two of three samples agree on. A share clearly below tau is masked."""
    samples = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 9, 5, 6, 7, 8]])
    mask = 0
    assert remask_tokens(samples, 0.5 + 1e-12, mask).tolist() == [1, 2, 3, 4, 5, 6, 0, 0]
    assert remask_tokens(samples, 0.5 + 1e-9, mask).tolist() == [1, 2, 3, 0, 5, 6, 0, 0]


def _scripted_model() -> ScriptedModel:
    """Prompts of 3 tokens; generation index 0 writes the question id (for ScriptedAnswers)."""
    return ScriptedModel(
        gen_choices(3, lambda q, g: (q,) if g == 0 else ((20, 21) if g % 3 == 0 else (1 + g % 15,)))
    )


def test_dvoting_early_stop_groups_answers_with_same_answer():
    """dVoting's early stop counts "18.0" and "18" as one answer when `same_answer` says
    so: two agreeing samples of five stop the question after sample 2 (2 draws, not 5),
    and the vote and NFE are those of the two samples."""
    same = lambda a, b: float(a) == float(b)  # noqa: E731
    answers = ScriptedAnswers({14: ["18.0", "18", "18", "7", "7"]})
    (result,) = run_strategy(
        _scripted_model(),
        torch.tensor([[14, 5, 6]]),
        strategy="dvoting",
        extract=answers,
        gen_length=16,
        block_length=4,
        n=5,
        seed=3,
        same_answer=same,
    )
    assert result.answers == ["18.0", "18"]
    assert result.votes == [("18.0", 2)] and result.chosen == 0
    assert result.nfe == sum(result.sample_nfe) and len(result.sample_nfe) == 2
    # without the grouping the two spellings disagree, and dVoting draws on
    answers = ScriptedAnswers({14: ["18.0", "18", "18", "7", "7"]})
    (plain,) = run_strategy(
        _scripted_model(),
        torch.tensor([[14, 5, 6]]),
        strategy="dvoting",
        extract=answers,
        gen_length=16,
        block_length=4,
        n=5,
        seed=3,
    )
    assert len(plain.answers) > 2


def test_dvoting_checks_the_early_stop_before_every_sample_from_the_third():
    """Fresh samples after the first two are drawn one at a time, each after an early-stop
    check: with n=7 and every sample answering "7", the check before sample 4 stops
    (3 of 7 agree, none disagree), so exactly 3 samples are drawn and paid for."""
    answers = ScriptedAnswers({16: ["7"] * 7})
    (result,) = run_strategy(
        _scripted_model(),
        torch.tensor([[16, 5, 6]]),
        strategy="dvoting",
        extract=answers,
        gen_length=16,
        block_length=4,
        n=7,
        seed=3,
    )
    assert result.answers == ["7", "7", "7"]
    assert len(result.sample_nfe) == 3 and result.nfe == sum(result.sample_nfe)


def test_max_rows_below_one_is_refused_before_any_model_work():
    """max_rows=0 would never admit a row (the decoding loop would spin forever): it is
    refused up front, with the setting's name, value and what to give instead."""
    with pytest.raises(ValueError, match=r"^max_rows must be >= 1, got 0: give the number of rows"):
        run_strategy(
            None, torch.tensor([[1, 2]]), extract=lambda t: None, gen_length=16, max_rows=0
        )


def test_drive_takes_settings_and_extractors_per_question():
    """`decode_questions` accepts one StrategySettings and one extractor per question (requests with
    different lengths, strategies or answer kinds decode side by side): each question
    gets its own sample count, length and answers."""
    settings = [
        StrategySettings(strategy="single", gen_length=8, block_length=4),
        StrategySettings(strategy="majority", gen_length=16, block_length=4, n=3),
    ]
    extract = [lambda tokens: "first", lambda tokens: f"second-{len(tokens)}"]
    prompts = [torch.tensor([17, 5, 6]), torch.tensor([18, 5, 6])]
    first, second = decode_questions(_scripted_model(), prompts, settings, extract, seeds=[1, 2])
    assert tuple(first.samples.shape) == (1, 8) and first.answers == ["first"]
    assert tuple(second.samples.shape) == (3, 16) and second.answers == ["second-16"] * 3


@pytest.mark.parametrize(
    "seeds, settings, extract, counts",
    [
        (
            [1],
            StrategySettings(strategy="single", gen_length=8),
            lambda t: None,
            "1 seeds, 2 settings and 2 extractors",
        ),
        (
            [1, 2],
            [StrategySettings(strategy="single", gen_length=8)],
            lambda t: None,
            "2 seeds, 1 settings and 2 extractors",
        ),
        (
            [1, 2],
            StrategySettings(strategy="single", gen_length=8),
            [lambda t: None],
            "2 seeds, 2 settings and 1 extractors",
        ),
    ],
)
def test_drive_refuses_per_question_lists_of_the_wrong_length(seeds, settings, extract, counts):
    """One seed, settings and extractor per prompt: a list of another length is refused
    before any decoding, naming every count (not silently zipped short)."""
    prompts = [torch.tensor([17, 5, 6]), torch.tensor([18, 5, 6])]
    with pytest.raises(
        ValueError, match=f"^got 2 prompts but {counts}: give one of each per prompt"
    ):
        decode_questions(_scripted_model(), prompts, settings, extract, seeds)


def test_max_rows_caps_the_rows_of_every_forward_pass():
    """`max_rows` is the most rows one forward pass decodes (the memory bound a user
    sets): ten samples with max_rows=3 never put more than 3 rows through the model."""
    model = _scripted_model()
    run_strategy(
        model,
        torch.tensor([[19, 5, 6], [20, 5, 6]]),
        strategy="majority",
        extract=lambda t: None,
        gen_length=8,
        block_length=4,
        n=5,
        seed=0,
        max_rows=3,
    )
    assert max(model.calls) == 3


def test_on_done_receives_each_question_result():
    """`on_done(i, result)` reports every question once, with the result `run_strategy`
    returns for it (a caller may log or cache it as soon as it is ready)."""
    reported = {}
    results = run_strategy(
        _scripted_model(),
        torch.tensor([[19, 5, 6], [20, 5, 6]]),
        strategy="majority",
        extract=lambda t: int(t[0]),
        gen_length=8,
        block_length=4,
        n=2,
        seed=0,
        on_done=lambda i, result: reported.setdefault(i, result),
    )
    assert sorted(reported) == [0, 1]
    assert all(reported[i] is results[i] for i in (0, 1))
    assert [r.answers for r in results] == [[19, 19], [20, 20]]


def test_questions_fill_the_free_rows_of_the_first_forward_pass():
    """Questions decode side by side: with room for 16 rows, three single-sample
    questions all enter the first forward pass (not one question per pass)."""
    model = _scripted_model()
    run_strategy(
        model,
        torch.tensor([[19, 5, 6], [20, 5, 6], [21, 5, 6]]),
        strategy="single",
        extract=lambda t: None,
        gen_length=8,
        block_length=4,
        seed=0,
        max_rows=16,
    )
    assert model.calls[0] == 3


def test_remask_sample_with_nothing_left_to_decode_costs_no_forward_pass():
    """With gen_length=2 the always-regenerated last quarter is empty, so once three
    fresh samples agree on every token, dVoting's remask samples keep all positions: they
    are complete without decoding, cost 0 NFE, and still count in the vote."""
    answers = ScriptedAnswers({22: ["1", "2", "3", "4", "5"]})  # never agree: no early stop
    (result,) = run_strategy(
        _scripted_model(),
        torch.tensor([[22, 5, 6]]),
        strategy="dvoting",
        extract=answers,
        gen_length=2,
        block_length=2,
        n=5,
        seed=0,
    )
    assert result.answers == ["1", "2", "3", "4", "5"]
    assert result.sample_nfe == [1, 1, 1, 0, 0] and result.nfe == 3
    assert result.kept == [None, None, None, [0, 1], [0, 1]]


@pytest.mark.parametrize(
    "setting", [dict(prefix_cache=True), dict(cache="prefix"), dict(cache="dual")]
)
def test_cache_setting_reaches_the_decoder(setting):
    """`cache` (and its older spelling `prefix_cache=True`) is passed on to every sample's
    decoding: a model without the cache support is refused with a message naming the
    setting, not silently run exact."""
    name = setting.get("cache", "prefix")
    with pytest.raises(
        ValueError, match=f"cache={name} \\(or prefix_cache\\) needs one of this package's"
    ):
        run_strategy(
            _scripted_model(),
            torch.tensor([[19, 5, 6]]),
            strategy="single",
            extract=lambda t: None,
            gen_length=8,
            block_length=4,
            **setting,
        )


def test_remasking_rule_reaches_every_sample(monkeypatch):
    """The `remasking` setting (e.g. "random") is the rule every sample decodes with."""
    import lm_eval_dvoting.core.strategies as strategies

    rules = []
    real_row = strategies.DecodeRow

    def recording_row(**kwargs):
        rules.append(kwargs["remasking"])
        return real_row(**kwargs)

    monkeypatch.setattr(strategies, "DecodeRow", recording_row)
    run_strategy(
        _scripted_model(),
        torch.tensor([[19, 5, 6]]),
        strategy="majority",
        extract=lambda t: None,
        gen_length=8,
        block_length=4,
        n=3,
        remasking="random",
    )
    assert rules == ["random"] * 3


def test_infinite_temperature_is_refused():
    """temperature=inf would turn every sample into uniform noise: it is refused up front
    (only alpha may be infinite), naming the setting and the allowed values."""
    with pytest.raises(
        ValueError, match=r"^temperature must be finite \(>= 0\), got inf: use 0 for greedy"
    ):
        StrategySettings(temperature=float("inf"))
    assert StrategySettings(alpha=float("inf")).alpha == float("inf")


@pytest.mark.parametrize(
    "setting, message",
    [
        (
            {"n": "5"},
            "n (samples per question) must be a whole number >= 1, got '5': e.g. n=5 (the default)",
        ),
        (
            {"n": True},
            "n (samples per question) must be a whole number >= 1, got True: e.g. n=5 (the "
            "default)",
        ),
        (
            {"gen_length": 2.5},
            "gen_length must be a whole number, got 2.5: set max_gen_toks (model arg or "
            "--gen_kwargs) to the answer length in tokens, e.g. 256",
        ),
        (
            {"alpha": "0.3"},
            "alpha (entropy threshold) must be a number (>= 0), got '0.3': e.g. alpha=0.3 (the "
            "default)",
        ),
        (
            {"tau": True},
            "tau (position-consistency share) must be a number (in (0, 1]), got True: e.g. tau=1.0",
        ),
        ({"steps": 0}, "steps must be >= 1, got 0: leave it out (default: gen_length for single"),
    ],
)
def test_settings_of_the_wrong_type_get_the_full_message(setting, message):
    """A setting of the wrong type (a string, a bool, a fraction where a count belongs)
    fails with a ValueError naming it, its value, what is allowed and what to do."""
    with pytest.raises(ValueError) as error:
        StrategySettings(**setting)
    assert str(error.value).startswith(message)


def test_run_strategy_defaults_seed_0_and_16_rows_per_pass():
    """The documented defaults: without `seed` the samples are those of seed=0 (and a
    different seed draws differently), and at most 16 rows share a forward pass."""
    prompt = torch.tensor([[23, 5, 6]])
    kwargs = dict(strategy="majority", extract=lambda t: None, gen_length=16, block_length=4, n=17)
    model = _scripted_model()
    default = run_strategy(model, prompt, **kwargs)[0].samples
    assert max(model.calls) == 16
    assert torch.equal(
        default, run_strategy(_scripted_model(), prompt, seed=0, **kwargs)[0].samples
    )
    assert not torch.equal(
        default, run_strategy(_scripted_model(), prompt, seed=1, **kwargs)[0].samples
    )


def test_steps_setting_sets_the_forward_passes_per_sample():
    """`steps` is the number of forward passes a fixed-schedule sample takes (here 2
    instead of single's default of gen_length = 8), and NFE counts them."""
    (result,) = run_strategy(
        _scripted_model(),
        torch.tensor([[19, 5, 6]]),
        strategy="single",
        extract=lambda t: None,
        gen_length=8,
        block_length=4,
        steps=2,
    )
    assert result.sample_nfe == [2] and result.nfe == 2
    (default,) = run_strategy(
        _scripted_model(),
        torch.tensor([[19, 5, 6]]),
        strategy="single",
        extract=lambda t: None,
        gen_length=8,
        block_length=4,
    )
    assert default.nfe == 8


def test_left_padding_masked_out_decodes_as_the_unpadded_prompt():
    """The attention mask says which prompt tokens are real: a left-padded row decodes
    exactly like its unpadded prompt (same samples), never reading the padding."""
    kwargs = dict(
        strategy="majority", extract=lambda t: int(t[0]), gen_length=8, block_length=4, n=2
    )
    padded = torch.tensor([[7, 19, 5, 6], [7, 20, 5, 6]])
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 1]])
    results = run_strategy(_scripted_model(), padded, mask, row_seeds=[11, 12], **kwargs)
    plain = run_strategy(
        _scripted_model(), torch.tensor([[19, 5, 6], [20, 5, 6]]), row_seeds=[11, 12], **kwargs
    )
    assert [r.answers for r in results] == [[19, 19], [20, 20]]
    assert all(torch.equal(a.samples, b.samples) for a, b in zip(results, plain))


def test_a_seed_that_is_not_a_whole_number_is_refused():
    """`seed="1"` (a string from a config) is refused with the argument's name and a fix."""
    with pytest.raises(
        ValueError,
        match=r"^seed must be a whole number, got '1': give an integer seed, e\.g\. seed=0$",
    ):
        run_strategy(
            _scripted_model(),
            torch.tensor([[19, 5, 6]]),
            extract=lambda t: None,
            gen_length=8,
            block_length=4,
            seed="1",
        )


_GEN_FIX = "set max_gen_toks (model arg or --gen_kwargs) to the answer length in tokens, e.g. 256"
_TAU_FIX = "e.g. tau=1.0 (the default: keep a position only when every earlier sample agrees)"


@pytest.mark.parametrize(
    "setting, message",
    [
        (
            {"strategy": "foo"},
            "strategy must be one of ('single', 'majority', 'hex', 'dvoting', 'temporal', 'rfg'), "
            "got 'foo'",
        ),
        ({"gen_length": 0}, f"gen_length must be positive, got 0: {_GEN_FIX}"),
        ({"gen_length": -3}, f"gen_length must be positive, got -3: {_GEN_FIX}"),
        (
            {"block_length": 0},
            "block_length must be >= 1, got 0: leave it out (default gen_length/16) or give a "
            "divisor of 256",
        ),
        (
            {"block_length": "4"},
            "block_length must be a whole number >= 1, got '4': leave it out (default "
            "gen_length/16) or give a divisor of 256",
        ),
        (
            {"gen_length": 256, "block_length": 3},
            "block_length 3 does not divide the generation length 256; choose a "
            "block length that divides it",
        ),
        ({"n": 0}, "n (samples per question) must be >= 1, got 0: e.g. n=5 (the default)"),
        (
            {"steps": "2"},
            "steps must be a whole number >= 1, got '2': leave it out (default: gen_length for "
            "single and decoder=dream, gen_length/2 for majority and hex; LLaDA2: 32 per block) "
            "or give the forward passes per sample (LLaDA2: per block)",
        ),
        (
            {"alpha": -0.1},
            "alpha (entropy threshold) must be >= 0, got -0.1: e.g. alpha=0.3 (the default)",
        ),
        (
            {"alpha": float("nan")},
            "alpha (entropy threshold) must be >= 0, got nan: e.g. alpha=0.3 (the default)",
        ),
        ({"tau": 0}, f"tau (position-consistency share) must be in (0, 1], got 0: {_TAU_FIX}"),
        ({"tau": 1.5}, f"tau (position-consistency share) must be in (0, 1], got 1.5: {_TAU_FIX}"),
        (
            {"temperature": -1},
            "temperature must be >= 0, got -1: use 0 for greedy decoding or e.g. 0.6-1.0 to "
            "sample; leave it out for the strategy's default",
        ),
        ({"remasking": "x"}, "remasking must be one of ('low_confidence', 'random'), got 'x'"),
        (
            {"hex_samples": 10},
            "hex_samples must be 25 (5 block sizes x 5 seeds) or 5 (original HEX), got 10",
        ),
        (
            {"hex_samples": True},
            "hex_samples must be 25 (5 block sizes x 5 seeds) or 5 (original HEX), got True",
        ),
        (
            {"hex_samples": 5.0},
            "hex_samples must be 25 (5 block sizes x 5 seeds) or 5 (original HEX), got 5.0",
        ),
        (
            {"strategy": "hex", "gen_length": 48, "block_length": 3},
            "hex needs a generation length divisible by 32 (block sizes L/32..L/2), got 48",
        ),
    ],
)
def test_every_bad_setting_gets_its_full_message(setting, message):
    """Each bad strategy setting is refused before any model work with a message that
    names the setting, its value, what is allowed and what to do (the model args have
    the same names, so the message points at what to change)."""
    with pytest.raises(ValueError) as error:
        StrategySettings(**setting)
    assert str(error.value) == message


@pytest.mark.parametrize(
    "setting",
    [
        {"gen_length": 1},
        {"gen_length": 8, "block_length": 1},
        {"tau": 1.0},
        {"tau": 1e-9},
        {"temperature": 0},
        {"alpha": 0},
        {"n": 1},
        {"steps": 1},
        {"hex_samples": 5},
    ],
)
def test_the_smallest_allowed_settings_are_accepted(setting):
    """The boundaries of the checks are inclusive where the message says so: one token,
    blocks of one, tau of 1 (or just above 0), temperature and alpha 0, one sample,
    one step, HEX's 5 samples."""
    settings = StrategySettings(**setting)
    for name, value in setting.items():
        assert getattr(settings, name) == value


_FASTDLLM_TAU = "e.g. threshold=0.9 (Fast-dLLM's default)"
_TEMPORAL_NEEDS = (
    "the vote needs every step's whole prediction; use cache=none (the default) or cache=prefix"
)
_NOT_LLADA2 = (
    "editing_threshold and cache=block are LLaDA2's (block diffusion): use --model dvoting-llada2 "
    "or dvoting-llada21 with a LLaDA2 checkpoint"
)
_BLOCK_TEMPORAL = (
    "the temporal vote needs every step's whole prediction, which cache=block does not compute (a "
    "pass covers the current block): use cache=none with it"
)
_HEX_DECODER = (
    "does not apply to strategy=hex: HEX is defined by its schedules of `steps` over block "
    "sizes L/32..L/2 (LLaDA's fixed schedule, or decoder=dream for Dream's); leave decoder out "
    "for hex"
)
_NO_VOTE = "which has no vote: use strategy=temporal for the temporal vote over one decode's steps"


@pytest.mark.parametrize(
    "setting, message",
    [
        # the decoders (_check_decoder)
        (
            {"decoder": "foo"},
            "decoder must be one of ('fixed', 'entropy', 'confidence', 'dream') (or left out for "
            "the strategy's own), got 'foo'",
        ),
        ({"strategy": "hex", "decoder": "entropy"}, f"decoder=entropy {_HEX_DECODER}"),
        ({"strategy": "hex", "decoder": "confidence"}, f"decoder=confidence {_HEX_DECODER}"),
        (
            {"decoder": "confidence", "threshold": 0},
            f"threshold (confidence decoder) must be in (0, 1], got 0: {_FASTDLLM_TAU}",
        ),
        (
            {"decoder": "confidence", "threshold": 1.5},
            f"threshold (confidence decoder) must be in (0, 1], got 1.5: {_FASTDLLM_TAU}",
        ),
        (
            {"threshold": "0.9"},
            "threshold (confidence decoder) must be a number (in (0, 1]), got '0.9': "
            f"{_FASTDLLM_TAU}",
        ),
        (
            {"threshold": float("inf")},
            f"threshold (confidence decoder) must be finite (in (0, 1]), got inf: {_FASTDLLM_TAU}",
        ),
        (
            {"block_decoding": "threshold", "threshold": 0},
            "threshold (block diffusion) must be in (0, 1], got 0: e.g. threshold=0.95 (LLaDA2.0's "
            "default)",
        ),
        (
            {"block_decoding": "threshold", "threshold": 1.5},
            "threshold (block diffusion) must be in (0, 1], got 1.5: e.g. threshold=0.95 "
            "(LLaDA2.0's default)",
        ),
        (
            {"strategy": "dvoting", "decoder": "fixed"},
            "decoder=fixed does not apply to strategy=dvoting: dVoting decodes with its entropy "
            "threshold (alpha) or, with decoder=confidence, Fast-dLLM's rule, or with "
            "decoder=dream, Dream's own algorithms; leave decoder out for dvoting, or compare "
            "with strategy=majority,decoder=entropy",
        ),
        # the key/value caches (_check_cache)
        (
            {"cache": "foo"},
            "cache must be one of ('none', 'prefix', 'dual', 'block'), got 'foo': none (exact, the "
            "default), prefix or dual (Fast-dLLM's approximate key/value caches)",
        ),
        ({"prefix_cache": "yes"}, "prefix_cache must be true or false, got 'yes'"),
        (
            {"prefix_cache": True, "cache": "dual"},
            "prefix_cache=true and cache=dual disagree: give cache alone "
            "(prefix_cache=true is the older spelling of cache=prefix)",
        ),
        # the temporal vote (_check_temporal)
        (
            {"temporal_weight": "foo"},
            "temporal_weight must be one of ('exp', 'linear', 'fixed'), got 'foo': exp (the "
            "default), linear or fixed",
        ),
        (
            {"temporal_alpha": -1},
            "temporal_alpha must be >= 0, got -1: e.g. temporal_alpha=5.0 (the default)",
        ),
        (
            {"vote": "foo"},
            "vote must be one of ('plain', 'temporal'), got 'foo': plain (one vote per sample) or "
            "temporal (each sample's per-step answers), or leave it out for the strategy's own",
        ),
        (
            {"strategy": "single", "vote": "temporal"},
            f"vote=temporal does not apply to strategy=single, {_NO_VOTE}",
        ),
        (
            {"strategy": "rfg", "vote": "temporal"},
            f"vote=temporal does not apply to strategy=rfg, {_NO_VOTE}",
        ),
        (
            {"strategy": "temporal", "vote": "plain"},
            "vote=plain does not apply to strategy=temporal, whose answer is the "
            "temporal vote: use strategy=single for the decode's final answer",
        ),
        (
            {"strategy": "temporal", "cache": "dual"},
            "cache=dual does not apply to strategy=temporal: the dual cache "
            f"computes no prediction beyond the current block, and {_TEMPORAL_NEEDS}",
        ),
        (
            {"strategy": "majority", "vote": "temporal", "cache": "dual"},
            "cache=dual does not apply to vote=temporal: the dual cache computes no prediction "
            f"beyond the current block, and {_TEMPORAL_NEEDS}",
        ),
        # RFG (_check_guidance)
        (
            {"guidance": -1},
            "guidance (RFG strength w) must be >= 0, got -1: e.g. guidance=1.0 (the default); 0 "
            "decodes the policy alone",
        ),
        (
            {"strategy": "rfg", "cache": "prefix"},
            "cache=prefix does not apply to strategy=rfg: its two models would need "
            "a cache each; use cache=none (the default)",
        ),
        (
            {"strategy": "rfg", "cache": "dual"},
            "cache=dual does not apply to strategy=rfg: its two models would need "
            "a cache each; use cache=none (the default)",
        ),
        # block diffusion (_check_block_decoding): its settings elsewhere, the others' settings
        # on it
        ({"editing_threshold": 0.5}, _NOT_LLADA2),
        ({"editing_threshold": 0.0}, _NOT_LLADA2),
        ({"cache": "block"}, _NOT_LLADA2),
        (
            {"block_decoding": "foo"},
            "block_decoding must be one of ('threshold', 'quality', 'speed') (threshold: "
            "LLaDA2.0; quality, speed: LLaDA2.1's presets), got 'foo'",
        ),
        (
            {"block_decoding": "threshold", "remasking": "random"},
            "remasking=random does not apply to LLaDA2: its threshold rule commits by confidence; "
            "leave remasking out",
        ),
        (
            {"block_decoding": "threshold", "strategy": "majority", "decoder": "fixed"},
            "decoder=fixed does not apply to LLaDA2 (block diffusion decodes with its threshold "
            "rule): leave decoder out; threshold= and steps= tune it",
        ),
        (
            {"block_decoding": "threshold", "cache": "prefix"},
            "cache=prefix does not apply to LLaDA2: use cache=block (exact, the default) or "
            "cache=none",
        ),
        (
            {"block_decoding": "threshold", "strategy": "rfg"},
            "strategy=rfg is not available for LLaDA2 models yet: use single, majority, hex, "
            "dvoting or temporal",
        ),
        (
            {"block_decoding": "threshold", "strategy": "temporal", "cache": "block"},
            _BLOCK_TEMPORAL,
        ),
        (
            {
                "block_decoding": "threshold",
                "strategy": "majority",
                "vote": "temporal",
                "cache": "block",
            },
            _BLOCK_TEMPORAL,
        ),
        (
            {"block_decoding": "quality", "steps": 4},
            "steps does not apply to LLaDA2.1's joint threshold decoding (editing=quality), which "
            "commits at least one token per step as upstream; leave steps out",
        ),
        (
            {"block_decoding": "threshold", "editing_threshold": 0.5},
            "editing_threshold is LLaDA2.1's: use --model dvoting-llada21 (editing=quality|speed)",
        ),
        (
            {"block_decoding": "threshold", "max_post_steps": 8},
            "max_post_steps=8 is LLaDA2.1's (post-fill editing steps): use --model "
            "dvoting-llada21, or leave it out",
        ),
        (
            {"block_decoding": "quality", "editing_threshold": 1.5},
            "editing_threshold must be in [0, 1], got 1.5: e.g. 0.5 (LLaDA2.1's quality mode) or "
            "0.0 (speed mode)",
        ),
        (
            {"block_decoding": "quality", "max_post_steps": -1},
            "max_post_steps must be a whole number >= 0, got -1: e.g. 16 (LLaDA2.1's default)",
        ),
        (
            {"gen_length": 2.5},
            "gen_length must be a whole number, got 2.5: set max_gen_toks (model arg or "
            "--gen_kwargs) to the answer length in tokens, e.g. 256",
        ),
    ],
)
def test_every_bad_combination_of_settings_gets_its_full_message(setting, message):
    """Each setting that does not apply to the strategy, decoder, cache or model family it is
    given with is refused before any model work with the whole message (a reworded or
    emptied message, or a check that lets the combination through, fails)."""
    with pytest.raises(ValueError) as error:
        StrategySettings(**setting)
    assert str(error.value) == message


@pytest.mark.parametrize(
    "setting",
    [
        {"decoder": "confidence", "threshold": 1},
        {"block_decoding": "threshold", "threshold": 1},
        {"strategy": "single", "decoder": "fixed"},
        {"strategy": "hex", "decoder": "fixed"},
        {"strategy": "majority", "decoder": "entropy"},
        {"strategy": "dvoting", "decoder": "confidence"},
        {"cache": "prefix"},
        {"cache": "dual"},
        {"prefix_cache": True, "cache": "prefix"},
        {"strategy": "temporal", "cache": "prefix"},
        {"strategy": "majority", "vote": "temporal", "cache": "prefix"},
        {"strategy": "majority", "vote": "plain"},
        {"strategy": "temporal", "vote": "temporal"},
        {"temporal_weight": "fixed", "temporal_alpha": 0},
        {"strategy": "rfg", "guidance": 0},
        {"strategy": "single", "vote": "plain"},
        {"block_decoding": "threshold", "cache": "block"},
        {"block_decoding": "threshold", "cache": "none"},
        {"block_decoding": "threshold", "strategy": "temporal", "cache": "none"},
        {"block_decoding": "threshold", "steps": 4},
        {"block_decoding": "quality", "editing_threshold": 0.0},
        {"block_decoding": "speed", "editing_threshold": 1.0},
        {"block_decoding": "quality", "max_post_steps": 0},
        {"block_decoding": "threshold", "max_post_steps": 16},
        {"block_decoding": "threshold", "gen_length": 40},
    ],
)
def test_the_allowed_combinations_at_each_checks_edge_are_accepted(setting):
    """The combinations next to each refusal above are accepted, with the values given."""
    settings = StrategySettings(**setting)
    for name, value in setting.items():
        if name != "prefix_cache":
            assert getattr(settings, name) == value


def test_derive_seed_is_the_documented_hash_and_takes_lone_surrogates():
    """A sample's seed is the first 8 bytes (little-endian) of sha256 over the parts
    joined by \\x1f, cut to 63 bits: the same on every platform and version, so a
    documented run redraws the same samples. A context with a lone surrogate (broken
    data) still gets a seed."""
    import hashlib

    from lm_eval_dvoting.core.strategies import derive_seed

    def reference(*parts):
        digest = hashlib.sha256(
            "\x1f".join(map(str, parts)).encode("utf-8", "surrogatepass")
        ).digest()
        return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)

    # (0, 1) and (1, 0) give odd seeds: the lowest bit is kept too
    for parts in [(0, 0), (0, 1), (1, 0), (1234, 7), ("doc", 3, "repeat", 1)]:
        assert derive_seed(*parts) == reference(*parts)
    assert derive_seed(0, 0) != derive_seed(0, 1)
    assert derive_seed(0, 1) % 2 == 1
    assert derive_seed("broken \ud800 text", 0) == reference("broken \ud800 text", 0)


# ------------------------------------------------------------------ strategies / harness


def test_run_strategy_refuses_token_ids_beyond_the_models_embedding_before_decoding():
    """A prompt id the model has no embedding for (a tokenizer of another model) is refused
    by name before any forward pass, not met as an index error mid-run."""
    from lm_eval_dvoting.models.loading import load_model

    model = load_model("tiny-arith", device="cpu")
    rows = next(m for m in model.modules() if isinstance(m, torch.nn.Embedding)).num_embeddings
    with pytest.raises(
        ValueError, match=rf"input_ids must be token ids < {rows} \(the model's embedding size\)"
    ):
        run_strategy(
            model,
            torch.tensor([[1, rows, 2]]),
            strategy="single",
            extract=lambda t: None,
            gen_length=16,
            block_length=4,
        )


@pytest.mark.parametrize(
    "argv, typed",
    [
        (["lm_eval", "--device", "cpu"], True),
        (["lm_eval", "--device=cpu"], True),
        (["lm_eval", "-b8"], True),  # a short flag glued to its value
        (["lm_eval", "-b", "8"], True),
        (["lm_eval", "--device_map", "auto"], False),  # another flag that starts the same way
        (["--device", "lm_eval"], False),  # the program's own name is not an argument
        (["lm_eval", "--batch"], False),
        (["lm_eval"], False),
    ],
)
def test_flags_typed_on_the_command_line(argv, typed, monkeypatch):
    """`merge_run_args` tells lm-eval's defaults from values the user typed by this test."""
    import sys

    from lm_eval_dvoting.integration.lm_eval_seam import typed_on_command_line

    monkeypatch.setattr(sys, "argv", argv)
    assert typed_on_command_line(("--device", "-b")) is typed


class _FakeAccelerator:
    """Two ranks in one process: what `gather_object`/`all_gather`/`barrier` call."""

    def __init__(self) -> None:
        self.waited = 0

    def gather(self, tensor):
        return torch.cat([tensor, tensor + 100])

    def wait_for_everyone(self) -> None:
        self.waited += 1


def test_gather_object_merges_the_other_ranks_totals_on_rank_0(monkeypatch):
    """Rank 0 receives every rank's object in rank order and adds the *other* ranks' cost
    totals to its own (its own are already counted); the unsent totals are then cleared."""
    from collections import Counter

    import torch.distributed as dist

    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu")
    lm.accelerator, lm._rank, lm._world_size = _FakeAccelerator(), 0, 2
    lm.totals, lm._unshared = Counter(nfe=10, requests=2), Counter(nfe=10, requests=2)

    def gather(obj, gathered, dst=0):
        assert dst == 0 and gathered == [None, None]
        gathered[0] = obj
        gathered[1] = ("theirs", {"nfe": 7, "requests": 1}, None)

    monkeypatch.setattr(dist, "gather_object", gather)
    assert lm.gather_object("mine") == ["mine", "theirs"]
    assert lm.totals == Counter(nfe=17, requests=3) and lm._unshared == Counter()
    # during an evaluation, the other rank's per-task ledger joins rank 0's (the results'
    # per-task costs count every rank's documents)
    from lm_eval_dvoting.integration.task_costs import RunCosts

    lm.begin_cost_run().tasks["arith"] = Counter(nfe=4, requests=1)
    theirs = RunCosts({"arith": Counter(nfe=6, requests=1)})
    monkeypatch.setattr(
        dist,
        "gather_object",
        lambda obj, gathered, dst=0: gathered.__setitem__(
            slice(None), [obj, ("theirs", {}, theirs)]
        ),
    )
    lm.gather_object("mine")
    assert lm.costs.run_costs.tasks["arith"] == Counter(nfe=10, requests=2)
    # the receiving rank is the caller's `dst`, not always rank 0
    lm._rank, received = 1, []

    def gather_to(obj, gathered, dst=0):
        received.append(dst)
        gathered[:] = [("theirs", {}, None), obj]

    monkeypatch.setattr(dist, "gather_object", gather_to)
    assert lm.gather_object("mine", dst=1) == ["theirs", "mine"] and received == [1]
    lm._rank = 0
    assert lm.all_gather(torch.tensor([1])).tolist() == [1, 101]
    lm.barrier()
    assert lm.accelerator.waited == 1
    # another rank sends and receives nothing back
    lm._rank = 1
    monkeypatch.setattr(dist, "gather_object", lambda obj, gathered, dst=0: None)
    assert lm.gather_object("mine") is None
    lm.accelerator = None
    assert lm.gather_object("alone") == ["alone"] and lm.all_gather(torch.tensor([3])).tolist() == [
        3
    ]


def test_chat_template_continues_a_final_message_only_without_a_generation_prompt():
    """lm-eval's `--apply_chat_template` with `--fewshot_as_multiturn` and a final assistant
    turn (`add_generation_prompt=False`) must continue that message, not close it."""
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu")
    calls = []
    monkey = lambda history, **kwargs: calls.append((history, kwargs)) or "rendered"  # noqa: E731
    lm.tokenizer.apply_chat_template = monkey
    chat = [{"role": "user", "content": "1+2=?"}]
    assert lm.apply_chat_template(chat) == "rendered"
    assert lm.apply_chat_template(chat, add_generation_prompt=False) == "rendered"
    assert calls == [
        (chat, {"tokenize": False, "add_generation_prompt": True, "continue_final_message": False}),
        (chat, {"tokenize": False, "add_generation_prompt": False, "continue_final_message": True}),
    ]


class _GenerationRequest:
    """The parts of lm-eval's Instance that generate_until reads."""

    def __init__(self, context, gen_kwargs, task_name="dvoting_arith", doc_id=0):
        self.args = (context, gen_kwargs)
        self.task_name, self.doc_id = task_name, doc_id


def test_use_strategy_checks_its_seed_and_reports_where_the_seed_came_from(caplog):
    """`use_strategy(seed=...)` (what `dvoting compare --seeds` calls) refuses a seed that is
    not a whole number by name, and the results' config says the seed came from it; a
    switch also reports the task's unused sampling settings again for the new run."""
    import logging

    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu", strategy="dvoting", n=2)
    with pytest.raises(ValueError, match=r"^seed\b"):
        lm.use_strategy("dvoting", seed="x")
    lm.use_strategy("dvoting", seed=5)
    assert (
        lm.get_model_info()["dvoting"]["seed"],
        lm.get_model_info()["dvoting"]["seed_source"],
    ) == (5, "use_strategy")
    lm.use_strategy("dvoting")
    assert lm.get_model_info()["dvoting"]["seed_source"] == "default"

    request = _GenerationRequest(
        "1+2=?", {"max_gen_toks": 32, "until": [], "do_sample": True, "temperature": 0.3}
    )
    with caplog.at_level(logging.WARNING, logger="lm_eval_dvoting"):
        lm.generate_until([request])
        lm.generate_until([request])  # the same value in the same run: reported once
        lm.use_strategy("majority", n=2)
        lm.generate_until([request])  # a new run: reported again
    unused = [r for r in caplog.records if "temperature" in r.getMessage()]
    assert len(unused) == 2, [r.getMessage() for r in caplog.records]


# ---- strategies.py: the cache and threshold settings (issue 20/25) --------------------


def test_threshold_refusal_says_what_is_allowed_and_one_is_allowed():
    """threshold must be in (0, 1]: 1 itself is allowed (commit only certain positions
    beside the most confident), and the refusal is the whole sentence a user reads."""
    assert StrategySettings(strategy="single", decoder="confidence", threshold=1.0).threshold == 1.0
    with pytest.raises(ValueError) as refused:
        StrategySettings(strategy="single", decoder="confidence", threshold=1.5)
    assert str(refused.value) == (
        "threshold (confidence decoder) must be in (0, 1], got 1.5: "
        "e.g. threshold=0.9 (Fast-dLLM's default)"
    )


@pytest.mark.parametrize(
    "settings, says",
    [
        (
            dict(cache="full"),
            "cache must be one of ('none', 'prefix', 'dual', 'block'), got 'full': none (exact, "
            "the default), prefix or dual (Fast-dLLM's approximate key/value caches)",
        ),
        (dict(prefix_cache="yes"), "prefix_cache must be true or false, got 'yes'"),
        (
            dict(prefix_cache=True, cache="dual"),
            "prefix_cache=true and cache=dual disagree: give cache alone "
            "(prefix_cache=true is the older spelling of cache=prefix)",
        ),
    ],
)
def test_cache_refusals_are_whole_sentences(settings, says):
    with pytest.raises(ValueError) as refused:
        StrategySettings(**settings)
    assert str(refused.value) == says


def test_cache_and_prefix_cache_are_one_setting():
    """The two spellings are normalised both ways, so equal settings compare (and
    fingerprint) equal whichever spelling a user gave."""
    assert StrategySettings(cache="prefix").prefix_cache is True
    assert StrategySettings(prefix_cache=True).cache == "prefix"
    assert StrategySettings(cache="dual").prefix_cache is False
    assert StrategySettings().prefix_cache is False and StrategySettings().cache == "none"
    assert StrategySettings(cache="prefix") == StrategySettings(prefix_cache=True)
    assert not hasattr(StrategySettings(cache="prefix"), "PREFIX_CACHE")


# ---- request_planning.py: why a task's sampling values are not used ------------------


@pytest.mark.parametrize(
    "model, asked, level, why",
    [
        (
            {"strategy": "single"},
            {"temperature": 0.5},
            "WARNING",
            "strategy=single samples only with do_sample=true (as HF generate does), so it runs at "
            "temperature 0.0",
        ),
        (
            {"strategy": "single"},
            {"do_sample": True, "temperature": 0},
            "WARNING",
            "do_sample=true needs a temperature above 0; strategy=single runs at temperature 0.0",
        ),
        (
            {"strategy": "single", "temperature": 0.5},
            {"do_sample": False},
            "INFO",
            "the model arg temperature=0.5 is used",
        ),
        (
            {"strategy": "dvoting"},
            {"do_sample": True, "temperature": 0.7},
            "WARNING",
            "strategy=dvoting samples at its own temperature 0.6",
        ),
    ],
)
def test_unused_task_sampling_is_reported_with_the_reason_and_the_fix(
    model, asked, level, why, caplog
):
    """Each case in which a task's `do_sample`/`temperature` is not used says why, at WARNING
    (INFO for the greedy request every stock task carries), with the model arg that
    chooses the temperature; only `single` is also told to pass do_sample=true."""
    import logging

    from lm_eval_dvoting.integration.request_planning import task_sampling

    settings = StrategySettings(gen_length=32, **model)
    with caplog.at_level(logging.INFO, logger="lm_eval_dvoting"):
        assert task_sampling(settings, asked, "probe", set()) == settings
    [record] = caplog.records
    fix = "; set the model arg temperature (--model_args temperature=...) to choose it"
    fix += ", or pass do_sample=true with the temperature" if model["strategy"] == "single" else ""
    assert (record.levelname, record.getMessage()) == (
        level,
        f"generation kwargs {asked} (task probe: its YAML or --gen_kwargs) are not used: "
        f"{why}{fix}",
    )


def test_a_task_do_sample_that_is_no_flag_is_refused_by_name():
    """A task's (or --gen_kwargs') do_sample must be a flag; the message names it."""
    from lm_eval_dvoting.integration.request_planning import task_sampling

    with pytest.raises(ValueError, match=r"^do_sample must be true or false, got 'maybe'$"):
        task_sampling(
            StrategySettings(strategy="single", gen_length=32), {"do_sample": "maybe"}, "t", set()
        )


def test_run_wide_args_reach_the_model_from_an_arg_string_and_none_is_skipped():
    """lm-eval's run-wide --batch_size/--device come as `additional_config` beside the model
    args text; a None among them (e.g. max_batch_size) is skipped, not the end of the list."""
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel, merge_run_args

    lm = LLaDAEvalModel.create_from_arg_string(
        "pretrained=tiny-arith", {"batch_size": 4, "device": "cpu"}
    )
    assert lm.batch_rows == 4
    assert merge_run_args({}, {"max_batch_size": None, "batch_size": 4}) == {"batch_size": 4}


def test_lm_evals_other_run_args_and_its_default_batch_size_are_passed_on(monkeypatch):
    """A run arg without a CLI default (`max_batch_size`) is passed on as given, and so is lm-eval's
    default `batch_size` 1 when the model args leave it out; only the default device is dropped."""
    from lm_eval_dvoting.integration.harness import merge_run_args

    monkeypatch.setattr(sys, "argv", ["lm_eval", "--model", "dvoting-llada"])
    assert merge_run_args(
        {"n": 3}, {"max_batch_size": 64, "batch_size": 1, "device": "cuda:0"}
    ) == {"n": 3, "max_batch_size": 64, "batch_size": 1}


# -------------------------------------------------- the model a run decodes (strategies._model_for)


def test_the_model_for_a_run_is_the_guided_one_only_for_rfg():
    """strategy=rfg decodes a GuidedModel at the settings' guidance; any other strategy decodes
    the policy itself; mixing them, two guidance strengths, or rfg without a GuidedModel is
    refused with the whole reason."""
    from lm_eval_dvoting.core.guidance import GuidedModel
    from lm_eval_dvoting.core.strategies import _model_for
    from lm_eval_dvoting.models.loading import load_model

    policy = load_model("tiny-arith", device="cpu")
    guided = GuidedModel(policy, load_model("tiny-arith", device="cpu"))
    rfg = StrategySettings(strategy="rfg", gen_length=32, guidance=0.5)
    single = StrategySettings(strategy="single", gen_length=32)
    assert _model_for(guided, []) is guided and _model_for(policy, [single]) is policy
    chosen = _model_for(guided, [rfg, rfg])
    assert isinstance(chosen, GuidedModel) and chosen.guidance == 0.5 and chosen.policy is policy
    with pytest.raises(ValueError) as other:
        _model_for(guided, [single])
    assert str(other.value) == (
        "a GuidedModel (policy and reference) decodes strategy=rfg only; pass the policy "
        "itself for the other strategies"
    )
    with pytest.raises(ValueError) as mixed:
        _model_for(guided, [rfg, single])
    assert str(mixed.value) == (
        "strategy=rfg decodes with one guidance strength and no other strategy in the same "
        "run; got guidance [0.5] and strategies ['rfg', 'single']"
    )
    with pytest.raises(
        ValueError,
        match=r"one guidance strength.*got guidance \[0.5, 1.0\] and strategies \['rfg'\]",
    ):
        _model_for(guided, [rfg, StrategySettings(strategy="rfg", gen_length=32)])
    with pytest.raises(ValueError) as plain:
        _model_for(policy, [rfg])
    assert str(plain.value) == (
        "strategy=rfg needs a GuidedModel(policy, reference) (lm_eval_dvoting.core.guidance): the "
        "harness builds it from reference=... or peft=...; got a LLaDAModel"
    )


def test_the_model_info_of_a_fresh_model_is_exactly_its_settings_and_sources():
    """`config.dvoting` before any request: every key, with values that are not the defaults where
    the model args allow it, so that a renamed key or a swapped value shows (get_model_info)."""
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    lm = LLaDAEvalModel.create_from_arg_string(
        "pretrained=tiny-arith-dream,device=cpu,seed=7,n=3,mc_num=16", {"batch_size": 4}
    )
    settings = dict(
        alg="entropy",
        alg_temp=0.0,
        alpha=0.3,
        block_decoding=None,
        block_length=16,
        cache="none",
        decoder="entropy",
        editing_threshold=None,
        eps=0.001,
        gen_length=256,
        guidance=1.0,
        hex_samples=25,
        max_post_steps=16,
        n=3,
        prefix_cache=False,
        remasking="low_confidence",
        steps=128,
        steps_run=None,
        strategy="dvoting",
        tau=1.0,
        temperature=0.6,
        temporal_alpha=5.0,
        temporal_weight="exp",
        threshold=0.9,
        top_k=None,
        top_p=None,
        vote="plain",
    )
    assert lm.get_model_info() == {
        "dvoting": {
            "pretrained": "tiny-arith-dream",
            "family": "dream",
            "revision": None,
            "subfolder": None,
            "reference": None,
            "peft": None,
            "seed": 7,
            "seed_source": "model_args",
            "mc_num": 16,
            "batch_rows": 4,
            "dtype": "float32",
            "device": "cpu",
            "device_map": None,
            "cached_steps": "static",  # auto, off a GPU
            "settings": settings,
            "settings_used": [],
            "tasks": {},
            "totals": {"nfe": 0, "requests": 0, "samples": 0},
            "computed": {"nfe": 0, "requests": 0, "samples": 0},
        }
    }


_ON_PARALLELIZE = (
    "applies with parallelize=True only (one model spread over the GPUs): add parallelize=True, "
    "or drop"
)


@pytest.mark.parametrize(
    "args, run_args, message",
    [
        (
            "max_memory_per_gpu=10GiB",
            {"device": "cpu"},
            f"max_memory_per_gpu='10GiB' {_ON_PARALLELIZE} max_memory_per_gpu",
        ),
        (
            "max_cpu_memory=1GiB",
            {"device": "cpu"},
            f"max_cpu_memory='1GiB' {_ON_PARALLELIZE} max_cpu_memory",
        ),
        ("device_map=auto", {"device": "cpu"}, f"device_map='auto' {_ON_PARALLELIZE} device_map"),
        (
            "parallelize=True,device_map=balanced",
            {},
            "device_map='balanced': parallelize=True places the model with "
            "device_map='auto' (balanced over the GPUs, as lm-eval's hf model does), the only map "
            "supported here: drop device_map (in Python, load_model(device_map=...) also takes a "
            "dict)",
        ),
        (
            "parallelize=True,device=cpu",
            {},
            "device='cpu' with parallelize=True, which spreads the model over the GPUs: "
            "drop device (--device), or drop parallelize to run on cpu",
        ),
        (
            "parallelize=True,reference=tiny-arith",
            {},
            "reference='tiny-arith' with parallelize=True: RFG's second model "
            "is not spread over the GPUs; give strategy=rfg a LoRA adapter instead (peft=..., one "
            "model), or drop parallelize",
        ),
        (
            "parallelize=True,peft=/x,max_cpu_memory=1GiB",
            {},
            "peft='/x' with max_cpu_memory='1GiB': a LoRA adapter "
            "cannot sit on layers offloaded to the CPU; drop max_cpu_memory (the model must then "
            "fit the GPUs) or peft",
        ),
        (
            "offload_folder=./offload",
            {"device": "cpu"},
            "model arg offload_folder='./offload': offloading to disk is not "
            "supported: with parallelize=True the model must fit the GPUs (max_memory_per_gpu) "
            "plus the CPU (max_cpu_memory); drop offload_folder",
        ),
        (
            "delta=some/delta",
            {"device": "cpu"},
            "model arg delta='some/delta': delta weights are not supported; add them "
            "to the base weights, save the result as safetensors beside config.json and pass that "
            "folder as pretrained",
        ),
        (
            "use_fast_tokenizer=False",
            {"device": "cpu"},
            "use_fast_tokenizer=False: transformers 5 loads only fast (Rust) "
            "tokenizers, so a slow one cannot be chosen; drop use_fast_tokenizer (the fast "
            "tokenizer reads the same files)",
        ),
        (
            "add_bos_token=True",
            {"device": "cpu"},
            "add_bos_token=True, but the tokenizer of tiny-arith has no BOS token: "
            "drop add_bos_token (prompts are encoded without special tokens; a chat template adds "
            "its own)",
        ),
        (
            "batch_size=abc",
            {"device": "cpu"},
            "batch_size must be a positive integer or 'auto', got 'abc'",
        ),
        (
            "batch_size=0",
            {"device": "cpu"},
            "batch_size must be a positive integer or 'auto', got 0",
        ),
        (
            "batch_size=auto,max_batch_size=0",
            {"device": "cpu"},
            "max_batch_size must be a whole number >= 1, got 0: give "
            "max_batch_size as such a number, or leave it out for its default",
        ),
    ],
)
def test_every_bad_run_control_gets_its_full_message(args, run_args, message):
    """The harness's refusals of HFLM-style args, whole (a fragment passes a mangled message)."""
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    with pytest.raises(ValueError) as refused:
        LLaDAEvalModel.create_from_arg_string(f"pretrained=tiny-arith,{args}", run_args)
    assert str(refused.value) == message


def test_unknown_model_args_are_refused_with_the_closest_names_and_the_accepted_list():
    import inspect

    from lm_eval_dvoting.integration.harness import DVotingEvalModel, LLaDAEvalModel

    accepted = [
        p
        for p in inspect.signature(DVotingEvalModel.__init__).parameters
        if p not in ("self", "unknown")
    ]
    assert accepted[:4] == ["pretrained", "tokenizer", "strategy", "n"] and "device_map" in accepted
    with pytest.raises(ValueError) as refused:
        LLaDAEvalModel.create_from_arg_string(
            "pretrained=tiny-arith,stpes=8,nn=3,zzzz=1", {"device": "cpu"}
        )
    assert str(refused.value) == (
        "unknown model args 'nn' (did you mean 'n'?), 'stpes' (did you mean 'steps'?), "
        f"'zzzz'; accepted model args are: {', '.join(accepted)}"
    )


_LLADA2_MODELS = "dvoting-llada2 (LLaDA2.0) or dvoting-llada21 (LLaDA2.1)"


def _model_class(name: str) -> type:
    from lm_eval_dvoting.integration import harness

    classes = (
        harness.LLaDAEvalModel,
        harness.DreamEvalModel,
        harness.LLaDA2EvalModel,
        harness.LLaDA21EvalModel,
    )
    return {c.model_name: c for c in classes}[name]


@pytest.mark.parametrize(
    "model, folder, checkpoint, right",
    [
        ("dvoting-llada2", "LLaDA-2.1-mini", "LLaDA2 (block diffusion)", "dvoting-llada21"),
        ("dvoting-llada2", "llada2.1", "LLaDA2 (block diffusion)", "dvoting-llada21"),
        ("dvoting-llada21", "LLaDA-2.0-mini", "LLaDA2 (block diffusion)", "dvoting-llada2"),
        ("dvoting-llada21", "llada2.0", "LLaDA2 (block diffusion)", "dvoting-llada2"),
        ("dvoting-llada", "LLaDA2.1-mini", "LLaDA2 (block diffusion)", _LLADA2_MODELS),
        ("dvoting-dream", "ckpt", "LLaDA2 (block diffusion)", _LLADA2_MODELS),
        ("dvoting-llada21", "llada", "LLaDA", "dvoting-llada"),
        ("dvoting-llada2", "llada_moe", "LLaDA-MoE", "dvoting-llada"),
        ("dvoting-llada2", "dream", "Dream", "dvoting-dream"),
    ],
)
def test_a_checkpoint_of_another_family_is_refused_naming_the_model_that_decodes_it(
    model, folder, checkpoint, right, tiny_llada2_dir, tmp_path
):
    """`_check_family`, whole messages: the family's name and the model name to use instead,
    LLaDA2.0 and LLaDA2.1 told apart by the checkpoint's name."""
    from conftest import fixture_folder

    if checkpoint.startswith("LLaDA2"):
        path = tmp_path / folder
        shutil.copytree(tiny_llada2_dir, path)
        (path / "model.safetensors").write_bytes(
            b"not weights"
        )  # never read: the refusal comes first
    else:
        path = fixture_folder(folder)
    with pytest.raises(ValueError) as refused:
        _model_class(model)(pretrained=str(path), device="cpu")
    assert str(refused.value) == (
        f"pretrained={path} is a {checkpoint} checkpoint, which --model {model} does not "
        f"decode: use --model {right}"
    )


@pytest.mark.parametrize(
    "model, folder",
    [
        ("dvoting-llada2", "LLaDA2.0-mini"),
        ("dvoting-llada21", "llada2.1-mini"),
        ("dvoting-llada2", "ckpt"),
        ("dvoting-llada21", "ckpt"),
    ],
)
def test_each_llada2_model_decodes_its_own_and_unnamed_checkpoints(
    model, folder, tiny_llada2_dir, tmp_path
):
    path = tmp_path / folder
    shutil.copytree(tiny_llada2_dir, path)
    lm = _model_class(model)(pretrained=str(path), device="cpu")
    assert (
        lm.model.family == "llada2"
        and lm.settings.block_decoding == _model_class(model).block_decoding
    )


_DEFAULT_SETTINGS = dict(
    strategy="dvoting",
    gen_length=256,
    block_length=None,
    n=5,
    alpha=0.3,
    temperature=None,
    tau=1.0,
    steps=None,
    remasking="low_confidence",
    hex_samples=25,
    prefix_cache=False,
    decoder=None,
    cache="none",
    threshold=None,
    temporal_weight="exp",
    temporal_alpha=5.0,
    vote=None,
    guidance=1.0,
    alg="entropy",
    alg_temp=0.0,
    eps=0.001,
    top_p=None,
    top_k=None,
    block_decoding=None,
    editing_threshold=None,
    max_post_steps=16,
)


@pytest.mark.parametrize(
    "args, changed",
    [
        (
            "strategy=dvoting,max_gen_toks=64,block_length=8,n=3,alpha=0.4,temperature=0.5,tau=0.8,remasking=random,"
            "cache=prefix",
            dict(
                gen_length=64,
                block_length=8,
                n=3,
                alpha=0.4,
                temperature=0.5,
                tau=0.8,
                remasking="random",
                prefix_cache=True,
                cache="prefix",
            ),
        ),
        (
            "strategy=hex,max_gen_toks=64,hex_samples=5,steps=16,temperature=0.7",
            dict(strategy="hex", gen_length=64, hex_samples=5, steps=16, temperature=0.7),
        ),
        (
            "strategy=temporal,max_gen_toks=64,temporal_weight=linear,temporal_alpha=3.0,steps=32",
            dict(
                strategy="temporal",
                gen_length=64,
                temporal_weight="linear",
                temporal_alpha=3.0,
                steps=32,
            ),
        ),
        (
            "strategy=single,decoder=confidence,threshold=0.8",
            dict(strategy="single", decoder="confidence", threshold=0.8),
        ),
        (
            "strategy=majority,prefix_cache=true,vote=temporal",
            dict(strategy="majority", prefix_cache=True, cache="prefix", vote="temporal"),
        ),
    ],
)
def test_every_strategy_model_arg_reaches_its_own_setting(args, changed):
    """`_strategy_settings`: each model arg lands in its own field, parsed,
    and nothing else moves."""
    import dataclasses

    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    lm = LLaDAEvalModel.create_from_arg_string(f"pretrained=tiny-arith,{args}", {"device": "cpu"})
    assert dataclasses.asdict(lm.settings) == _DEFAULT_SETTINGS | changed


@pytest.mark.parametrize(
    "args, cache",
    [
        ("strategy=majority", "block"),
        ("strategy=temporal", "none"),
        ("strategy=majority,vote=temporal", "none"),
        ("strategy=majority,vote=plain", "block"),
        ("strategy=majority,cache=none", "none"),
    ],
)
def test_llada2s_cache_defaults_to_block_unless_the_temporal_vote_needs_every_step(
    args, cache, tiny_llada2_dir
):
    from lm_eval_dvoting.integration.harness import LLaDA2EvalModel

    lm = LLaDA2EvalModel.create_from_arg_string(
        f"pretrained={tiny_llada2_dir},{args}", {"device": "cpu"}
    )
    assert lm.settings.cache == cache and lm.settings.block_decoding == "threshold"


_WHOLE = (
    "{name} must be a whole number, got 'x': give {name} as such a number, or leave it out for "
    "its default"
)
_REAL = (
    "{name} must be a number, got 'x': give e.g. {name}=0.5, or leave {name} out for its default"
)


@pytest.mark.parametrize(
    "name, template",
    [
        ("max_gen_toks", _WHOLE),
        ("block_length", _WHOLE),
        ("n", _WHOLE),
        ("steps", _WHOLE),
        ("max_post_steps", _WHOLE),
        ("seed", _WHOLE),
        ("alpha", _REAL),
        ("temperature", _REAL),
        ("tau", _REAL),
        ("threshold", _REAL),
        ("temporal_alpha", _REAL),
        ("guidance", _REAL),
        ("editing_threshold", _REAL),
        (
            "hex_samples",
            "hex_samples must be 25 or 5, got 'x': give hex_samples as such a number, or leave it "
            "out for its default",
        ),
        (
            "mc_num",
            "mc_num must be a whole number >= 1, got 'x': give mc_num as such a number, or leave "
            "it out for its default",
        ),
        (
            "max_length",
            "max_length must be a whole number >= 1, got 'x': give max_length as such a number, or "
            "leave it out for its default",
        ),
    ],
)
def test_a_model_arg_that_is_no_number_is_refused_by_its_own_name(name, template):
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    with pytest.raises(ValueError) as refused:
        LLaDAEvalModel.create_from_arg_string(f"pretrained=tiny-arith,{name}=x", {"device": "cpu"})
    assert str(refused.value) == template.format(name=name)


@pytest.mark.parametrize("value", ["", "false", "False", "none", "None", "0"])
def test_a_refused_hflm_arg_left_empty_or_off_is_accepted(value):
    """`offload_folder`/`delta` set to an "off" value (what a recipe passes to mean none)
    are not refused."""
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    lm = LLaDAEvalModel.create_from_arg_string(
        f"pretrained=tiny-arith,offload_folder={value},delta={value}", {"device": "cpu"}
    )
    assert lm.batch_rows == 1


@pytest.mark.parametrize("value", ["", "false", "False", "none", "None", False, 0, None])
def test_a_refused_hflm_arg_passed_off_from_python_is_accepted(value):
    """The same "off" values as Python objects (`simple_evaluate(model_args={...})` or the class
    itself, where lm-eval's arg-string parsing does not turn "false" into False first)."""
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    assert (
        LLaDAEvalModel(
            pretrained="tiny-arith", device="cpu", offload_folder=value, delta=value
        ).batch_rows
        == 1
    )


@pytest.mark.parametrize(
    "name, reason",
    [
        ("offload_folder", "offloading to disk is not supported"),
        ("delta", "delta weights are not supported"),
    ],
)
def test_a_refused_hflm_arg_set_to_true_is_refused(name, reason):
    """`True` asks for the feature (it is no "off" value): refused with the arg's own reason."""
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    with pytest.raises(ValueError, match=rf"^model arg {name}=True: {reason}"):
        LLaDAEvalModel(pretrained="tiny-arith", device="cpu", **{name: True})


@pytest.mark.parametrize(
    "args, rows",
    [
        ("batch_size=auto", 8),
        ("batch_size=auto,max_batch_size=3", 3),
        ("batch_size=auto,max_batch_size=100", 8),
        ("batch_size=auto:4", 8),
        ("batch_size=5", 5),
        ("batch_size=5,max_batch_size=2", 5),
    ],
)
def test_batch_size_auto_is_eight_rows_on_the_cpu_capped_by_max_batch_size(args, rows):
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    assert (
        LLaDAEvalModel.create_from_arg_string(
            f"pretrained=tiny-arith,{args}", {"device": "cpu"}
        ).batch_rows
        == rows
    )


def test_max_length_beyond_the_models_is_refused_whole_and_the_models_is_the_default():
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    with pytest.raises(ValueError) as refused:
        LLaDAEvalModel.create_from_arg_string(
            "pretrained=tiny-arith,max_length=100000", {"device": "cpu"}
        )
    assert str(refused.value) == (
        "max_length 100000 exceeds the model's maximum length 256: give max_length <= 256, "
        "or leave it out for the model's"
    )
    assert (
        LLaDAEvalModel.create_from_arg_string("pretrained=tiny-arith", {"device": "cpu"}).max_length
        == 256
    )
    assert (
        LLaDAEvalModel.create_from_arg_string(
            "pretrained=tiny-arith,max_length=256", {"device": "cpu"}
        ).max_length
        == 256
    )
    assert (
        LLaDAEvalModel.create_from_arg_string(
            "pretrained=tiny-arith,max_length=100", {"device": "cpu"}
        ).max_length
        == 100
    )


def test_editing_is_refused_whole_outside_llada21_and_outside_its_presets(tiny_llada2_dir):
    from lm_eval_dvoting.integration.harness import LLaDA21EvalModel, LLaDAEvalModel

    with pytest.raises(ValueError) as outside:
        LLaDAEvalModel.create_from_arg_string(
            "pretrained=tiny-arith,editing=speed", {"device": "cpu"}
        )
    assert str(outside.value) == (
        "editing='speed' is LLaDA2.1's (joint threshold decoding): use --model "
        "dvoting-llada21, or leave editing out"
    )
    with pytest.raises(ValueError) as preset:
        LLaDA21EvalModel.create_from_arg_string(
            f"pretrained={tiny_llada2_dir},editing=fast", {"device": "cpu"}
        )
    assert (
        str(preset.value)
        == "editing must be quality or speed (LLaDA2.1's model card presets), got 'fast'"
    )


def test_trust_remote_code_is_accepted_with_one_whole_warning(caplog):
    import logging

    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    caplog.set_level(logging.WARNING, logger="lm_eval_dvoting.integration.harness")
    LLaDAEvalModel.create_from_arg_string(
        "pretrained=tiny-arith,trust_remote_code=True", {"device": "cpu"}
    )
    assert [r.getMessage() for r in caplog.records if "trust_remote_code" in r.getMessage()] == [
        "trust_remote_code=True has no effect: dvoting models are built by this plugin's own code "
        "from the checkpoint's config and weights; no downloaded code is ever run"
    ]
    caplog.clear()
    LLaDAEvalModel.create_from_arg_string(
        "pretrained=tiny-arith,trust_remote_code=False", {"device": "cpu"}
    )
    assert not [r for r in caplog.records if "trust_remote_code" in r.getMessage()]


def test_lone_surrogates_are_reported_once_naming_at_most_five_documents(caplog, monkeypatch):
    import logging
    from types import SimpleNamespace

    from lm_eval_dvoting.integration import requests as request_module
    from lm_eval_dvoting.integration.requests import sanitise_requests

    monkeypatch.setattr(
        request_module.encodable, "warned", False
    )  # the per-process warning, as in a fresh run
    caplog.set_level(logging.WARNING, logger="lm_eval_dvoting.integration.requests")
    requests = [
        SimpleNamespace(args=(f"q{i} \ud800", {"until": ["\n"]}), task_name="t", doc_id=i)
        for i in range(7)
    ]
    requests.append(SimpleNamespace(args=("fine", {}), task_name="t", doc_id=7))
    sanitise_requests(requests)
    assert [r.args[0] for r in requests] == [f"q{i} \ufffd" for i in range(7)] + ["fine"]
    assert [r.getMessage() for r in caplog.records] == [
        "text with lone surrogates (invalid unicode): they are replaced by U+FFFD",
        "7 request(s) hold lone surrogates (invalid unicode), replaced by U+FFFD before the model "
        "runs: task t, document 0; task t, document 1; task t, document 2; task t, document 3; "
        "task t, document 4; ...",
    ]
    caplog.clear()
    sanitise_requests(requests[:2])  # already clean: nothing to say
    assert caplog.records == []
    sanitise_requests(
        [SimpleNamespace(args=("again \udfff",), task_name="u", doc_id=9)]
    )  # the text warning was said
    assert [r.getMessage() for r in caplog.records] == [
        "1 request(s) hold lone surrogates (invalid unicode), replaced by U+FFFD before the model "
        "runs: task u, document 9"
    ]


def test_the_model_info_names_the_adapter_by_source_and_digest():
    """`config.dvoting.peft` with the shipped adapter: its source as given and the digest
    of its files."""
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel
    from lm_eval_dvoting.models import adapters

    lm = LLaDAEvalModel.create_from_arg_string(
        "pretrained=tiny-arith,peft=tiny-arith-lora", {"device": "cpu"}
    )
    info = lm.get_model_info()["dvoting"]
    assert info["peft"] == {"source": "tiny-arith-lora", "digest": lm.adapter.identity}
    assert (
        len(info["peft"]["digest"]) >= 16
        and info["reference"] is None
        and info["family"] == "llada"
    )
    assert lm.adapter.identity == adapters.read_adapter(lm.adapter.folder).identity


def test_a_model_built_with_no_args_has_the_documented_defaults():
    """Every default of the model args (README's table), as `config.dvoting` reports them."""
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    info = LLaDAEvalModel(pretrained="tiny-arith", device="cpu").get_model_info()["dvoting"]
    settings = dict(
        alg="entropy",
        alg_temp=0.0,
        alpha=0.3,
        block_decoding=None,
        block_length=16,
        cache="none",
        decoder="entropy",
        editing_threshold=None,
        eps=0.001,
        gen_length=256,
        guidance=1.0,
        hex_samples=25,
        max_post_steps=16,
        n=5,
        prefix_cache=False,
        remasking="low_confidence",
        steps=128,
        steps_run=None,
        strategy="dvoting",
        tau=1.0,
        temperature=0.6,
        temporal_alpha=5.0,
        temporal_weight="exp",
        threshold=0.9,
        top_k=None,
        top_p=None,
        vote="plain",
    )
    assert info == {
        "pretrained": "tiny-arith",
        "family": "llada",
        "revision": None,
        "subfolder": None,
        "reference": None,
        "peft": None,
        "seed": 1234,
        "seed_source": "default",
        "mc_num": 128,
        "batch_rows": 1,
        "dtype": "float32",
        "device": "cpu",
        "device_map": None,
        "cached_steps": "static",  # auto, off a GPU
        "settings": settings,
        "settings_used": [],
        "tasks": {},
        "totals": {"nfe": 0, "requests": 0, "samples": 0},
        "computed": {"nfe": 0, "requests": 0, "samples": 0},
    }


class _LauncherAccelerator:
    """What `_setup_processes` reads of accelerate's Accelerator on rank 1 of 2 (CPU)."""

    device = torch.device("cpu")
    process_index = 1
    num_processes = 2


def test_under_a_launcher_each_rank_takes_accelerates_device_and_rank(monkeypatch):
    import accelerate

    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(accelerate, "Accelerator", _LauncherAccelerator)
    lm = LLaDAEvalModel(pretrained="tiny-arith")
    assert (lm.rank, lm.world_size, lm.device.type) == (1, 2, "cpu") and isinstance(
        lm.accelerator, _LauncherAccelerator
    )
    assert (
        LLaDAEvalModel(pretrained="tiny-arith", device="cpu").rank == 1
    )  # the same device type is fine
    with pytest.raises(ValueError) as refused:
        LLaDAEvalModel(pretrained="tiny-arith", device="cuda:0")
    assert str(refused.value) == (
        "device 'cuda:0' was asked for, but under torchrun/accelerate each rank runs on the device "
        "accelerate gives it (cpu): drop --device/device=, or for the CPU set ACCELERATE_USE_CPU=1"
    )
    monkeypatch.setenv("WORLD_SIZE", "1")
    alone = LLaDAEvalModel(pretrained="tiny-arith", device="cpu")
    assert (alone.rank, alone.world_size, alone.accelerator) == (0, 1, None)


def test_the_reported_device_is_cpu_for_any_cpu_rank_and_the_gpu_with_its_index():
    """`config.dvoting.device`: a CPU rank's `cpu:0` is reported as `cpu` (runs on one CPU or
    several CPU ranks compare equal); a GPU keeps its index. Reporting only: no model work."""
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu")
    for device, reported in [
        (torch.device("cpu", 0), "cpu"),
        (torch.device("cpu"), "cpu"),
        (torch.device("cuda", 1), "cuda:1"),
    ]:
        lm._device = device
        assert lm.get_model_info()["dvoting"]["device"] == reported


def test_settings_used_before_any_evaluation_carry_the_models_seed_and_the_device_map_is_reported():
    """`generate_until` called directly (no lm-eval evaluation): each settings entry of
    `config.dvoting.settings_used` carries the sampling seed; `device_map` is the model's own
    (a parallelized model's layer map; None on one device)."""
    from lm_eval.api.instance import Instance

    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu", strategy="single", seed=7)
    request = Instance(
        request_type="generate_until",
        doc={},
        arguments=("1+2=", {"until": ["\n"], "max_gen_toks": 8}),
        idx=0,
        metadata=("demo", 0, 1),
    )
    lm.generate_until([request])
    [used] = lm.get_model_info()["dvoting"]["settings_used"]
    assert used["seed"] == 7 and used["strategy"] == "single" and used["gen_length"] == 8
    assert lm.get_model_info()["dvoting"]["device_map"] is None
    lm.model.device_map = {"transformer.blocks.0": 0, "transformer.blocks.1": "cpu"}
    assert lm.get_model_info()["dvoting"]["device_map"] == {
        "transformer.blocks.0": 0,
        "transformer.blocks.1": "cpu",
    }


# ---- harness.py: what generate_until reports besides the texts, and how models load ------


def _generation(context: str, doc_id: int, max_gen_toks: int = 8) -> object:
    from lm_eval.api.instance import Instance

    return Instance(
        request_type="generate_until",
        doc={},
        idx=0,
        metadata=("demo", doc_id, 1),
        arguments=(context, {"until": ["\n"], "max_gen_toks": max_gen_toks}),
    )


class _Bar:
    """tqdm's stand-in: records how generate_until builds and moves its progress bar."""

    made: list[_Bar] = []

    def __init__(self, **kwargs) -> None:
        self.kwargs, self.updates, self.closed = kwargs, [], False
        _Bar.made.append(self)

    def update(self, step) -> None:
        self.updates.append(step)

    def close(self) -> None:
        self.closed = True


def test_generate_until_shows_one_bar_step_per_computed_request_on_rank_0_only(monkeypatch):
    """The progress bar counts the computed requests (a duplicated document is decoded once),
    one step each, is shown on rank 0 only and hidden by `disable_tqdm`."""
    from lm_eval_dvoting.integration import harness

    monkeypatch.setattr(harness, "tqdm", _Bar)
    monkeypatch.setattr(_Bar, "made", [])
    lm = harness.LLaDAEvalModel(pretrained="tiny-arith", device="cpu", strategy="single")
    first = _generation("1+2=", 0)
    requests = [first, _generation("3+4=", 1), first]  # a rank's padding repeats a request object
    lm.generate_until(requests)
    lm.generate_until(requests[:1], disable_tqdm=True)
    lm._rank = 1
    lm.generate_until(requests[:1])
    shown, hidden, other_rank = _Bar.made
    assert shown.kwargs == {"total": 2, "desc": "dVoting generate_until", "disable": False}
    assert shown.updates == [1, 1] and shown.closed
    assert hidden.kwargs["disable"] is True and other_rank.kwargs["disable"] is True


def test_generate_until_decodes_at_most_batch_size_rows_per_forward_pass():
    """`batch_size` caps the rows of every forward pass (the memory a user asked for), and the
    cap is reached: 5 greedy requests at batch size 2 and 4."""
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    requests = [_generation(f"{a}+{a + 1}=", a) for a in range(5)]
    for batch_size in (2, 4):
        lm = LLaDAEvalModel(
            pretrained="tiny-arith", device="cpu", strategy="single", batch_size=batch_size
        )
        rows: list[int] = []
        hook = lm.model.model.transformer.wte.register_forward_hook(
            lambda m, args, out: rows.append(args[0].shape[0])
        )
        try:
            lm.generate_until(requests)
        finally:
            hook.remove()
        assert max(rows) == batch_size


def test_each_answer_goes_to_lm_evals_cache_under_its_request_and_repeat():
    """`--use_cache`: every computed answer is handed to lm-eval's cache hook as
    ("generate_until", the request's key with its repeat, the text)."""
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel
    from lm_eval_dvoting.integration.result_cache import generation_key_args

    class Hook:
        def __init__(self) -> None:
            self.added: list[tuple] = []

        def add_partial(self, attr, req, res) -> None:
            self.added.append((attr, req, res))

    lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu", strategy="single")
    hook = Hook()
    lm.set_cache_hook(hook)
    requests = [_generation("1+2=", 0), _generation("3+4=", 1)]
    texts = lm.generate_until(requests)
    assert sorted(hook.added, key=lambda a: a[1]) == sorted(
        [("generate_until", generation_key_args(r, 0), t) for r, t in zip(requests, texts)],
        key=lambda a: a[1],
    )
    assert all(isinstance(res, str) and res == t for (_, _, res), t in zip(hook.added, texts))


def test_a_checkpoint_of_another_decoding_family_is_loaded_with_a_whole_warning(caplog):
    """dvoting-llada given a Dream checkpoint (both bidirectional) loads it and says so."""
    import logging

    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    caplog.set_level(logging.WARNING, logger="lm_eval_dvoting.integration.harness")
    LLaDAEvalModel(pretrained="tiny-arith", device="cpu")
    assert not caplog.records
    lm = LLaDAEvalModel(pretrained="tiny-arith-dream", device="cpu")
    assert lm.model.family == "dream"
    assert [r.getMessage() for r in caplog.records] == [
        "checkpoint tiny-arith-dream is a dream model, loaded by dvoting-llada"
    ]


def _spy_on_load_model(monkeypatch) -> list[tuple[tuple, dict]]:
    from lm_eval_dvoting.integration import harness

    calls: list[tuple[tuple, dict]] = []
    real = harness.load_model

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(harness, "load_model", spy)
    return calls


def test_parallelize_loads_the_model_over_the_budget_with_device_map_auto(monkeypatch, caplog):
    """parallelize=True: the weights are read with device_map="auto" under the GPU budget in
    the asked dtype, the model's main device becomes the harness's, and the map is logged."""
    import logging

    from lm_eval_dvoting.integration import harness

    budget = {"cpu": 10**9}
    monkeypatch.setattr(harness, "gpu_budget", lambda per_gpu, cpu: budget)
    calls = _spy_on_load_model(monkeypatch)
    caplog.set_level(logging.INFO, logger="lm_eval_dvoting.integration.harness")
    lm = harness.LLaDAEvalModel(
        pretrained="tiny-arith", strategy="single", parallelize=True, dtype="bfloat16"
    )
    [(args, kwargs)] = calls
    assert kwargs == {"dtype": "bfloat16", "device_map": "auto", "max_memory": budget}
    assert next(lm.model.parameters()).dtype == torch.bfloat16
    assert lm.device == lm.model.main_device == torch.device("cpu")
    assert [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.INFO and "parallelize" in r.getMessage()
    ] == ["parallelize=True: " + harness.describe_placement(lm.model.device_map)]


def test_rfgs_reference_is_read_onto_the_policys_device_in_its_dtype(monkeypatch):
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    calls = _spy_on_load_model(monkeypatch)
    lm = LLaDAEvalModel(
        pretrained="tiny-arith",
        device="cpu",
        strategy="rfg",
        reference="tiny-arith",
        dtype="bfloat16",
    )
    assert [kwargs for _, kwargs in calls] == [{"device": lm.device, "dtype": "bfloat16"}] * 2
    assert calls[1][0] == calls[0][0]  # the same folder, resolved once each
    assert lm.reference_model is not lm.model
    assert next(lm.reference_model.parameters()).dtype == torch.bfloat16


def _inside(name: str, module: str, torch_random_seed):
    """sampling_seed(None) called from a function `name` of a module named `module` whose
    local `torch_random_seed` is given: a stand-in for lm-eval's simple_evaluate frame."""
    from lm_eval_dvoting.integration import harness

    scope = {"__name__": module, "sampling_seed": harness.sampling_seed}
    exec(f"def {name}(torch_random_seed):\n    return sampling_seed(None)\n", scope)
    return scope[name](torch_random_seed)


def test_the_harness_seed_is_read_from_lm_evals_simple_evaluate_frame_only():
    """`sampling_seed`: a model arg first; else the `torch_random_seed` local of lm-eval's
    own `simple_evaluate` (not of a function so named elsewhere, nor of another function of
    lm_eval.evaluator); else 1234, also when simple_evaluate left torch unseeded."""
    from lm_eval_dvoting.integration.harness import sampling_seed

    assert sampling_seed(5) == (5, "model_args") and sampling_seed("6") == (6, "model_args")
    assert sampling_seed(None) == (1234, "default")
    assert _inside("simple_evaluate", "lm_eval.evaluator", 7) == (7, "lm-eval --seed")
    assert _inside("simple_evaluate", "lm_eval.evaluator", None) == (1234, "default")
    assert _inside("simple_evaluate", "my_runner", 7) == (1234, "default")
    assert _inside("evaluate", "lm_eval.evaluator", 7) == (1234, "default")
    with pytest.raises(ValueError) as refused:
        sampling_seed("x")
    assert str(refused.value) == _WHOLE.format(name="seed")


def test_lone_surrogates_are_replaced_in_lm_evals_instances_of_either_argument_shape():
    """`sanitise_requests` on lm-eval's Instance: a generate_until request's argument tuple
    and a loglikelihood_rolling request's single string, each keeping its shape."""
    from lm_eval.api.instance import Instance

    from lm_eval_dvoting.integration.harness import sanitise_requests

    generation = _generation("a \ud800 b", 0)
    rolling = Instance(
        request_type="loglikelihood_rolling",
        doc={},
        idx=0,
        metadata=("demo", 1, 1),
        arguments="c \udfff d",
    )
    sanitise_requests([generation, rolling])
    assert generation.arguments == ("a \ufffd b", {"until": ["\n"], "max_gen_toks": 8})
    assert rolling.arguments == "c \ufffd d" and rolling.args == ("c \ufffd d",)


def test_tok_encode_passes_the_callers_choice_of_special_tokens_to_the_tokenizer():
    """lm-eval decides special tokens per call (`add_special_tokens=`); the demo tokenizer
    adds none either way, so a stand-in records what it is asked."""
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    class Tokenizer:
        bos_token_id = None

        def encode(self, text, add_special_tokens="not given"):
            return [text, add_special_tokens]

    lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu")
    lm.tokenizer = Tokenizer()
    assert lm.tok_encode("a", add_special_tokens=True) == ["a", True]
    assert lm.tok_encode("a", add_special_tokens=False) == lm.tok_encode("a") == ["a", False]


def test_the_smallest_mc_num_and_max_length_are_one_and_zero_is_refused_by_name():
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu", mc_num=1, max_length=1)
    assert (lm.mc_num, lm.max_length) == (1, 1)
    for name in ("mc_num", "max_length"):
        with pytest.raises(ValueError) as refused:
            LLaDAEvalModel(pretrained="tiny-arith", device="cpu", **{name: 0})
        assert str(refused.value) == (
            f"{name} must be a whole number >= 1, got 0: give {name} as such a number, "
            "or leave it out for its default"
        )


def test_a_model_built_with_no_hflm_args_warns_about_none(caplog):
    import logging

    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    caplog.set_level(logging.WARNING)
    lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu")
    assert caplog.records == [] and lm.add_bos_token is False and lm._max_memory is None


@pytest.mark.parametrize(
    "count, listed",
    [
        (5, "; ".join(f"task t, document {i}" for i in range(5))),
        (6, "; ".join(f"task t, document {i}" for i in range(5)) + "; ..."),
    ],
)
def test_the_surrogate_warning_lists_five_documents_and_marks_only_more(count, listed, caplog):
    import logging
    from types import SimpleNamespace

    from lm_eval_dvoting.integration.harness import sanitise_requests

    caplog.set_level(logging.WARNING, logger="lm_eval_dvoting.integration.harness")
    sanitise_requests(
        [SimpleNamespace(args=(f"q{i} \ud800",), task_name="t", doc_id=i) for i in range(count)]
    )
    assert caplog.records[-1].getMessage() == (
        f"{count} request(s) hold lone surrogates (invalid unicode), replaced by U+FFFD before the "
        "model runs: " + listed
    )


def test_generate_until_votes_math_answers_by_equivalence_and_keeps_kinds_apart(monkeypatch):
    """The vote's grouping that generate_until hands the decoder: `\\frac{1}{2}` and `0.5`
    are one math answer, a choice letter is compared as it is, and kinds never mix."""
    from lm_eval_dvoting.integration import harness

    handed = {}
    real = harness.decode_questions

    def spy(*args, **kwargs):
        handed.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(harness, "decode_questions", spy)
    lm = harness.LLaDAEvalModel(pretrained="tiny-arith", device="cpu", strategy="single")
    lm.generate_until([_generation("1+2=", 0)])
    same = handed["same_answer"]
    assert same(("math", "0.5"), ("math", "\\frac{1}{2}")) and same(
        ("math", "1,800"), ("math", "1800")
    )
    assert not same(("math", "0.5"), ("math", "0.6"))
    assert same(("choice", "A"), ("choice", "A")) and not same(("choice", "A"), ("choice", "B"))
    assert not same(("math", "1"), ("choice", "1"))


def test_a_checkpoint_of_no_supported_family_is_refused_naming_its_config_file(tmp_path):
    """`_check_family` reads the family before any weights: an unknown model_type is refused
    with the config file's path in the message (the file a user must look at)."""
    import json

    from lm_eval_dvoting.integration.harness import LLaDAEvalModel
    from lm_eval_dvoting.models.loading import CheckpointError

    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    )
    with pytest.raises(CheckpointError) as refused:
        LLaDAEvalModel(pretrained=str(tmp_path), device="cpu")
    assert str(refused.value).startswith(
        f"{tmp_path / 'config.json'}: model_type 'gpt2' (architectures "
        "['GPT2LMHeadModel']) is not supported; expected LLaDA"
    )


def test_the_tokenizer_name_lm_eval_sees_is_the_tokenizers_source():
    """`tokenizer_name` (lm-eval keys chat-template caches on it): the `tokenizer=` source
    when given, else the checkpoint's, with '/' made file-name safe."""
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel
    from lm_eval_dvoting.models.loading import resolve_checkpoint

    assert LLaDAEvalModel(pretrained="tiny-arith", device="cpu").tokenizer_name == "tiny-arith"

    folder = str(resolve_checkpoint("tiny-arith"))
    lm = LLaDAEvalModel(pretrained="tiny-arith", tokenizer=folder, device="cpu")
    assert lm.tokenizer_name == folder.replace("/", "__")


def test_batch_size_auto_is_32_rows_on_a_gpu_and_8_on_the_cpu():
    """`_parse_batch_size` on a CUDA device (stood in for: only the device's type is read)."""
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu")
    assert lm._parse_batch_size("auto", None) == 8
    lm._device = torch.device("cuda", 0)
    assert lm._parse_batch_size("auto", None) == 32 and lm._parse_batch_size("auto:4", 12) == 12


def test_a_parallelize_that_is_no_flag_is_refused_by_its_name():
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    with pytest.raises(ValueError) as refused:
        LLaDAEvalModel(pretrained="tiny-arith", parallelize="maybe")
    assert str(refused.value) == "parallelize must be true or false, got 'maybe'"
    with pytest.raises(ValueError) as refused:
        LLaDAEvalModel(pretrained="tiny-arith", trust_remote_code="maybe")
    assert str(refused.value) == "trust_remote_code must be true or false, got 'maybe'"


@pytest.mark.parametrize("name", ["use_fast_tokenizer", "add_bos_token"])
def test_a_tokenizer_flag_that_is_no_flag_is_refused_by_its_name(name):
    """HFLM's tokenizer flags name themselves when their value is neither true nor false."""
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    with pytest.raises(ValueError) as refused:
        LLaDAEvalModel(pretrained="tiny-arith", device="cpu", **{name: "maybe"})
    assert str(refused.value) == f"{name} must be true or false, got 'maybe'"


@pytest.mark.parametrize(
    "device_map, device, peft, max_cpu_memory",
    [
        ("auto", None, None, None),  # the one map there is, named
        (None, "cuda:0", None, None),  # a GPU device is compatible with spreading over the GPUs
        (None, "cuda", "adapter", None),  # an adapter with every layer on the GPUs
        (None, None, None, "100GiB"),  # CPU offload without an adapter
    ],
)
def test_parallelize_accepts_each_compatible_combination(
    device_map, device, peft, max_cpu_memory, monkeypatch
):
    """`_parallel_budget`'s accepted edges: each returns the GPU budget
    (stood in for: no GPU here)."""
    from lm_eval_dvoting.integration import harness

    budget, asked = {0: 1, "cpu": 2}, []
    monkeypatch.setattr(
        harness, "gpu_budget", lambda per_gpu, cpu: asked.append((per_gpu, cpu)) or budget
    )
    assert (
        harness._parallel_budget(True, "70GiB", max_cpu_memory, device_map, device, None, peft)
        is budget
    )
    assert asked == [("70GiB", max_cpu_memory)]  # the budget is built from both memory args


# ---- likelihood.py: the Monte-Carlo bound's draws, windows, seeds and devices ----------------


def _likelihood_model() -> torch.nn.Module:
    """The tiny official-format LLaDA checkpoint (max_length 128, mask id 250), loaded once."""
    from conftest import fixture_folder
    from references import load_float32

    return load_float32(str(fixture_folder("llada")))


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 240, (n,), generator=torch.Generator().manual_seed(seed))


class _UniformLogits(torch.nn.Module):
    """A mask predictor with all-zero logits over `vocab` tokens: whatever the draws, the
    bound is exactly -L * log(vocab). Records the device and dtype of what it is given."""

    mask_token_id, logits_shift, max_length = 7, 0, 64

    def __init__(self, vocab: int = 8, parameter_device: str | None = None) -> None:
        super().__init__()
        if parameter_device is not None:  # where a real model's weights would live
            self.anchor = torch.nn.Parameter(torch.empty(1, device=parameter_device))
        self.vocab, self.seen = vocab, []

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        self.seen.append(
            (ids.device.type, ids.dtype, attention_mask.device.type, attention_mask.dtype)
        )
        if ids.device.type == "meta":  # nothing can be computed there: stop once it is recorded
            raise _ReachedTheModel
        return torch.zeros(*ids.shape, self.vocab)


class _ReachedTheModel(Exception):
    """Raised by `_UniformLogits` when its rows arrive on the `meta` device."""


def test_a_model_without_parameters_is_scored_on_the_cpu():
    from lm_eval_dvoting.core.likelihood import loglikelihood

    model = _UniformLogits()
    assert loglikelihood(model, _ids(3, 1) % 7, _ids(5, 2) % 7, mc_num=4) == pytest.approx(
        -5 * math.log(8)
    )
    assert {seen[0] for seen in model.seen} == {"cpu"}


def test_ids_and_attention_mask_go_to_the_models_device_as_long_tensors():
    """The rows go where the weights are (a GPU for a real run; `meta` stands in for it here),
    with HF's 1/0 long attention mask, on the path for modules without `hidden_states`."""
    from lm_eval_dvoting.core.likelihood import score_requests

    model = _UniformLogits(parameter_device="meta")
    with pytest.raises(_ReachedTheModel):
        score_requests(model, [(_ids(3, 1) % 7, _ids(4, 2) % 7)], mc_num=3, seeds=[0], greedy=False)
    assert model.seen == [("meta", torch.long, "meta", torch.long)]


def test_independent_draws_mask_each_count_from_1_to_L_equally_often():
    """`stratified=False`: l uniform on 1..L (not 0, not L+1, not L-1)."""
    from lm_eval_dvoting.core.likelihood import _draw_masks

    counts = torch.bincount(
        _draw_masks(4, 4000, seed=3, stratified=False).sum(dim=1), minlength=6
    ).tolist()
    assert counts[0] == 0 and counts[5] == 0
    assert all(abs(count - 1000) < 150 for count in counts[1:5]), counts


@pytest.mark.parametrize(
    "length, mc_num, seed",
    [(2000, 1000, 0), (2000, 1000, 1), (2000, 1000, 2), (4000, 1999, 1), (4000, 1999, 5)],
)
def test_stratified_draws_follow_the_documented_float64_recipe(length, mc_num, seed):
    """l_j = 1 + floor(L * ((u + j / mc_num) mod 1)), u the generator's first float64 draw,
    in float64 throughout (so every l_j is exactly uniform and seeded results reproduce).
    A float32 u draws other numbers at every seed; float32 levels differ only where L * t_j
    rounds across a whole number, which the last two cases (found by search) contain."""
    from lm_eval_dvoting.core.likelihood import _draw_masks

    u = torch.rand((), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    levels = (u + torch.arange(mc_num, dtype=torch.float64) / mc_num) % 1.0
    expected = 1 + (levels * length).floor().long()
    assert torch.equal(_draw_masks(length, mc_num, seed, stratified=True).sum(dim=1), expected)


def test_loglikelihood_defaults_are_128_draws_from_seed_0_and_it_passes_stratified_on():
    from lm_eval_dvoting.core.likelihood import loglikelihood, score_requests

    model, context, continuation = _likelihood_model(), _ids(3, 1), _ids(6, 2)
    assert loglikelihood(model, context, continuation) == loglikelihood(
        model, context, continuation, mc_num=128, seed=0
    )
    independent = loglikelihood(model, context, continuation, mc_num=8, seed=4, stratified=False)
    [(direct, _)] = score_requests(
        model, [(context, continuation)], mc_num=8, seeds=[4], greedy=False, stratified=False
    )
    assert independent == direct
    assert independent != loglikelihood(model, context, continuation, mc_num=8, seed=4)


@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("stratified", [True, False])
def test_rolling_loglikelihood_sums_its_windows_seeded_seed_plus_k_stride(window, stratified):
    """Window k is scored as `loglikelihood` with seed (seed + k * 0x9E3779B97F4A7C15) mod 2**63,
    with the window and `stratified` it was given."""
    from lm_eval_dvoting.core.likelihood import (
        loglikelihood,
        rolling_loglikelihood,
        rolling_windows,
    )

    model, prefix, document = _likelihood_model(), torch.tensor([240]), _ids(158, 3)
    windows = rolling_windows(document, max_length=128, prefix_ids=prefix, window=window)
    assert len(windows) == (2 if window is None else 6)
    expected = sum(
        loglikelihood(
            model,
            context,
            continuation,
            mc_num=2,
            stratified=stratified,
            seed=(5 + k * 0x9E3779B97F4A7C15) % 2**63,
        )
        for k, (context, continuation) in enumerate(windows)
    )
    total = rolling_loglikelihood(
        model, document, mc_num=2, seed=5, prefix_ids=prefix, window=window, stratified=stratified
    )
    assert total == pytest.approx(expected, rel=1e-6)  # batching: float noise


def test_rolling_loglikelihood_defaults_are_128_draws_from_seed_0_and_no_greedy_check(monkeypatch):
    """lm-eval's loglikelihood_rolling has no is_greedy: no greedy pass is run for it."""
    from lm_eval_dvoting.core import likelihood

    def no_greedy_check(*args, **kwargs):
        raise AssertionError("rolling_loglikelihood ran greedy checks")

    monkeypatch.setattr(likelihood, "_greedy_checks", no_greedy_check)
    model, prefix, document = _likelihood_model(), torch.tensor([240]), _ids(150, 4)
    assert likelihood.rolling_loglikelihood(model, document, prefix_ids=prefix) == (
        likelihood.rolling_loglikelihood(model, document, prefix_ids=prefix, mc_num=128, seed=0)
    )


def test_rolling_windows_without_a_prefix_keep_the_nearest_history():
    from lm_eval_dvoting.core.likelihood import rolling_windows

    windows = rolling_windows(torch.arange(10), max_length=4)
    assert [(context.tolist(), continuation.tolist()) for context, continuation in windows] == [
        ([], [0, 1, 2, 3]),
        ([2, 3], [4, 5]),
        ([4, 5], [6, 7]),
        ([6, 7], [8, 9]),
    ]
    windows = rolling_windows(
        torch.arange(10), max_length=6, prefix_ids=torch.tensor([99]), window=2
    )
    assert [(context.tolist(), continuation.tolist()) for context, continuation in windows] == [
        ([99], [0, 1, 2, 3, 4]),
        ([99, 2, 3, 4], [5, 6]),
        ([99, 4, 5, 6], [7, 8]),
        ([99, 6, 7, 8], [9]),
    ]


def test_rolling_windows_with_room_for_one_token_score_one_token_each():
    """A prefix one short of max_length leaves room 1: windows of one token (the default
    window is at least 1), no history."""
    from lm_eval_dvoting.core.likelihood import rolling_windows

    windows = rolling_windows(torch.arange(3), max_length=4, prefix_ids=torch.tensor([7, 8, 9]))
    assert [(context.tolist(), continuation.tolist()) for context, continuation in windows] == [
        ([7, 8, 9], [0]),
        ([7, 8, 9], [1]),
        ([7, 8, 9], [2]),
    ]


@pytest.mark.parametrize("document", [5, 20])
def test_rolling_windows_refuse_a_window_outside_the_room_whole(document):
    """1 and the room are allowed; 0 and room + 1 refused, also for a document that fits."""
    from lm_eval_dvoting.core.likelihood import rolling_windows

    tokens, prefix = torch.arange(document), torch.tensor([99])
    for window in (1, 5):
        assert torch.equal(
            torch.cat(
                [
                    c
                    for _, c in rolling_windows(
                        tokens, max_length=6, prefix_ids=prefix, window=window
                    )
                ]
            ),
            tokens,
        )
    for window in (0, 6):
        with pytest.raises(ValueError) as refused:
            rolling_windows(tokens, max_length=6, prefix_ids=prefix, window=window)
        assert (
            str(refused.value)
            == f"window must lie in 1..5 (max_length minus the prefix), got {window}"
        )


def test_rolling_windows_refusals_name_the_argument():
    from lm_eval_dvoting.core.likelihood import rolling_windows

    with pytest.raises(ValueError) as refused:
        rolling_windows(torch.arange(4), max_length=4, prefix_ids=torch.tensor([1, 2, 3, 4]))
    assert str(refused.value) == "the prefix of 4 tokens leaves no room in max_length 4"
    with pytest.raises(ValueError) as refused:
        rolling_windows(torch.zeros(2, 3), max_length=8)
    assert str(refused.value) == "token_ids must be a 1-D sequence of token ids, got shape (2, 3)"
    with pytest.raises(ValueError) as refused:
        rolling_windows(torch.arange(3), max_length=8, prefix_ids=torch.zeros(1, 1))
    assert str(refused.value) == "prefix_ids must be a 1-D sequence of token ids, got shape (1, 1)"


def test_token_ids_of_any_integer_dtype_score_as_long_ids():
    from lm_eval_dvoting.core.likelihood import loglikelihood

    model, context, continuation = _likelihood_model(), _ids(4, 5), _ids(5, 6)
    expected = loglikelihood(model, context, continuation, mc_num=4)
    assert loglikelihood(model, context.int(), continuation.int(), mc_num=4) == expected
    assert loglikelihood(model, context.tolist(), continuation.tolist(), mc_num=4) == expected


def test_score_requests_refusals_name_the_context_or_the_continuation():
    from lm_eval_dvoting.core.likelihood import score_requests

    model = _likelihood_model()
    with pytest.raises(ValueError) as refused:
        score_requests(model, [(torch.zeros(1, 3, dtype=torch.long), _ids(2, 1))], seeds=[0])
    assert str(refused.value) == "context_ids must be a 1-D sequence of token ids, got shape (1, 3)"
    with pytest.raises(ValueError) as refused:
        score_requests(model, [(_ids(2, 1), torch.zeros(2, 2, dtype=torch.long))], seeds=[0])
    assert (
        str(refused.value)
        == "continuation_ids must be a 1-D sequence of token ids, got shape (2, 2)"
    )


def test_a_continuation_too_long_for_one_window_is_refused_whole(dream_fixture):
    """LLaDA's limit is max_length; Dream's one less (a context token must precede)."""
    from lm_eval_dvoting.core.likelihood import loglikelihood
    from lm_eval_dvoting.models.loading import load_model

    llada, dream = _likelihood_model(), load_model(str(dream_fixture))
    tail = "it cannot be scored in one window (split it, or use rolling_loglikelihood)"
    with pytest.raises(ValueError) as refused:
        loglikelihood(llada, _ids(1, 1), _ids(llada.max_length + 1, 2), mc_num=1)
    assert str(refused.value) == (
        f"the continuation has {llada.max_length + 1} tokens, more than the model's "
        f"max_length {llada.max_length}; {tail}"
    )
    with pytest.raises(ValueError) as refused:
        loglikelihood(dream, _ids(1, 1), _ids(dream.max_length, 2), mc_num=1)
    assert str(refused.value) == (
        f"the continuation has {dream.max_length} tokens, more than the model's "
        f"max_length {dream.max_length} minus one context token; {tail}"
    )


def test_dream_needs_a_context_token_before_a_continuation_but_not_before_an_empty_one(
    dream_fixture,
):
    from lm_eval_dvoting.core.likelihood import score_requests
    from lm_eval_dvoting.models.loading import load_model

    dream, empty = load_model(str(dream_fixture)), torch.zeros(0, dtype=torch.long)
    assert score_requests(dream, [(empty, empty)], mc_num=2, seeds=[0]) == [(0.0, True)]
    with pytest.raises(ValueError) as refused:
        score_requests(dream, [(empty, _ids(2, 1))], mc_num=2, seeds=[0])
    assert str(refused.value) == (
        "this model predicts token i from position i-1 (Dream), so a continuation needs at least "
        "one context token before it; prepend a BOS token to the empty context"
    )


def test_a_one_token_continuation_keeps_the_context_that_fits():
    """Too long a context loses tokens from the left, also before a single token."""
    from lm_eval_dvoting.core.likelihood import loglikelihood

    model, context, token = _likelihood_model(), _ids(140, 7), _ids(1, 8)
    assert loglikelihood(model, context, token, mc_num=2) == loglikelihood(
        model, context[-(model.max_length - 1) :], token, mc_num=2
    )


def test_four_requests_sharing_one_forward_pass_score_as_each_alone():
    from lm_eval_dvoting.core.likelihood import loglikelihood, score_requests

    model = _likelihood_model()
    requests = [(_ids(3 + i, 10 + i), _ids(2 + i, 20 + i)) for i in range(4)]
    together = score_requests(model, requests, mc_num=2, batch_size=8, seeds=range(4), greedy=False)
    alone = [
        loglikelihood(model, context, continuation, mc_num=2, seed=i)
        for i, (context, continuation) in enumerate(requests)
    ]
    assert [value for value, _ in together] == pytest.approx(
        alone, rel=1e-6
    )  # padding: float noise


def test_our_models_run_the_output_head_only_at_the_scored_positions(monkeypatch):
    """`hidden_states` + `logits_from_hidden`: the vocabulary head runs once per masked
    position of each draw, never over whole rows."""
    from lm_eval_dvoting.core.likelihood import _draw_masks, loglikelihood

    model, context, continuation = _likelihood_model(), _ids(3, 1), _ids(6, 2)
    expected = loglikelihood(model, context, continuation, mc_num=4)

    def whole_rows(*args, **kwargs):
        raise AssertionError("the model was run whole")

    head_rows, head = [], model.logits_from_hidden
    monkeypatch.setattr(model, "forward", whole_rows)
    monkeypatch.setattr(
        model, "logits_from_hidden", lambda hidden: head_rows.append(len(hidden)) or head(hidden)
    )
    assert loglikelihood(model, context, continuation, mc_num=4) == pytest.approx(
        expected, abs=1e-6
    )
    assert head_rows == [int(_draw_masks(6, 4, 0, stratified=True).sum())]


class _HiddenStatesOnly(_UniformLogits):
    """A module with `hidden_states` but no `logits_from_hidden`: it must be run whole."""

    def hidden_states(self, *args, **kwargs):
        raise AssertionError("hidden_states used without a head to read them")


def test_a_module_with_hidden_states_but_no_head_is_run_whole():
    from lm_eval_dvoting.core.likelihood import loglikelihood

    assert loglikelihood(
        _HiddenStatesOnly(), _ids(2, 1) % 7, _ids(3, 2) % 7, mc_num=2
    ) == pytest.approx(-3 * math.log(8))


def test_every_likelihood_pass_holds_at_most_batch_size_rows_32_by_default(monkeypatch):
    """`batch_size` caps the rows of each forward pass (GPU memory), in `loglikelihood` and
    `rolling_loglikelihood` alike, and the cap is reached."""
    from lm_eval_dvoting.core.likelihood import loglikelihood, rolling_loglikelihood

    model, rows = _likelihood_model(), []
    hidden_states = model.hidden_states
    monkeypatch.setattr(
        model,
        "hidden_states",
        lambda ids, **kwargs: rows.append(len(ids)) or hidden_states(ids, **kwargs),
    )
    context, continuation, prefix, document = (
        _ids(3, 1),
        _ids(4, 2),
        torch.tensor([240]),
        _ids(150, 3),
    )
    for run, passes in [
        (lambda: loglikelihood(model, context, continuation), [32] * 4),
        (lambda: loglikelihood(model, context, continuation, mc_num=10, batch_size=4), [4, 4, 2]),
        (lambda: rolling_loglikelihood(model, document, prefix_ids=prefix), [32] * 8),
        (
            lambda: rolling_loglikelihood(
                model, document, prefix_ids=prefix, mc_num=5, batch_size=3
            ),
            [3, 3, 3, 1],
        ),
    ]:
        rows.clear()
        run()
        assert rows == passes


# ---- decoding/rules.py ---------------------------------------------------------------


def test_alpha_is_a_strict_bound_on_the_entropy():
    """docs/ALGORITHM.md: a position commits by the threshold when its entropy is *below*
    alpha. With alpha exactly the entropy of every (equally certain) position, none does:
    the fallback commits one per step."""
    from lm_eval_dvoting.core.decoding import generate
    from lm_eval_dvoting.core.decoding.state import entropy, suppress_mask

    model = ScriptedModel(gen_choices(3, lambda q, g: (1,)))  # the same certain token everywhere
    prompt = torch.tensor([[1, 1, 1]])
    logits = model(torch.cat([prompt, torch.full((1, 4), model.mask_token_id)], dim=1))[0, 3:]
    entropies = entropy(suppress_mask(logits, model.mask_token_id))
    alpha = float(entropies[0])
    assert alpha > 0 and bool((entropies == alpha).all())
    assert generate(model, prompt, gen_length=4, block_length=4, alpha=alpha).nfe.tolist() == [4]
    assert generate(
        model, prompt, gen_length=4, block_length=4, alpha=alpha * 1.01
    ).nfe.tolist() == [1]


def test_rows_of_different_temperatures_decode_together_as_each_alone():
    """A batch may mix temperatures (HEX's temperature-0 samples beside sampled ones): the
    entropy rule samples only the rows with T > 0, each from its own generator."""
    from lm_eval_dvoting.core.decoding import DecodeRow, RowDecoder

    model = _likelihood_model()

    def row(temperature: float, seed: int) -> DecodeRow:
        return DecodeRow(
            prompt=_ids(4, seed),
            tokens=torch.full((8,), model.mask_token_id),
            block_length=4,
            alpha=0.3,
            temperature=temperature,
            generator=torch.Generator().manual_seed(seed),
        )

    def decode(*rows: DecodeRow) -> list[list[int]]:
        decoder = RowDecoder(model)
        for each in rows:
            decoder.add(each)
        while decoder.active:
            decoder.step()
        return [each.tokens.tolist() for each in rows]

    settings = [(0.0, 1), (0.8, 2), (0.0, 3), (0.8, 4)]
    alone = [decode(row(*each))[0] for each in settings]
    assert decode(*(row(*each) for each in settings)) == alone
    assert alone[1] != decode(row(0.0, 2))[0]  # the sampled rows are sampled
