"""The vote reads a choice letter with the question's option range, as the score does.

The task configs' filter reads a letter beyond the question's options as no answer; a vote
that counted it (review of issue 38) could pick a letter the score then rejects, and
dVoting's early stop could stop on agreement about it."""

from __future__ import annotations

import pytest

from lm_eval_dvoting.core.answers import extract_answer, option_count


@pytest.mark.parametrize(
    "doc, kind, expected",
    [
        ({"choices": ["a", "b", "c", "d"]}, "choice", 4),  # this project's tasks
        ({"choices": {"text": ["a", "b", "c"], "label": ["A", "B", "C"]}}, "choice", 3),  # hub ARC
        ({"choices": ["a", "b", "c", "d"]}, "number", None),  # ranges are for letters only
        ({}, "choice", None),  # no choices: letters A to J
        ({"choices": [str(i) for i in range(11)]}, "choice", None),  # more options than letters
        (None, "choice", None),
    ],
)
def test_option_count(doc, kind, expected):
    assert option_count(doc, kind) == expected


def test_the_vote_reads_a_choice_letter_within_the_questions_options(monkeypatch):
    """generate_until hands the decoder answer readers that apply the request doc's range:
    "E" on a four-option question is no answer in the vote, as in the score."""
    from lm_eval.api.instance import Instance

    from lm_eval_dvoting.integration import harness

    handed: list = []
    real = harness.decode_questions

    def spy(*args, **kwargs):
        handed.extend(args[3])  # the answer readers, one per request
        return real(*args, **kwargs)

    monkeypatch.setattr(harness, "decode_questions", spy)
    lm = harness.LLaDAEvalModel(pretrained="tiny-arith", device="cpu", strategy="single")
    four_options, no_options = {"choices": ["w", "x", "y", "z"]}, {}
    for doc in (four_options, no_options):
        lm.generate_until(
            [
                Instance(
                    request_type="generate_until",
                    doc=doc,
                    idx=0,
                    metadata=("dvoting_arc_challenge", 0, 1),
                    arguments=("1+2=", {"until": ["\n"], "max_gen_toks": 8}),
                )
            ]
        )
    ranged, unranged = handed
    for text, letter in [("The answer is E.", "E"), ("The answer is B.", "B")]:
        monkeypatch.setattr(lm, "generated_text", lambda tokens, until, text=text: text)
        scored = extract_answer(text, "choice", option_count(four_options, "choice"))
        assert ranged(None) == (None if scored is None else ("choice", scored))
        assert unranged(None) == ("choice", letter)
    assert extract_answer("The answer is E.", "choice", 4) is None  # the case above is real
