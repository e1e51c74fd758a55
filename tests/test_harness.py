"""The lm-eval LM classes end to end, on tiny random checkpoints (offline, CPU)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import lm_eval  # a hard dependency: missing, it must fail loudly, not skip
import pytest
from conftest import DATA, REPO_ROOT, require_shared
from lm_eval.tasks import TaskManager

from lm_eval_dvoting.core.answers import extract_answer
from lm_eval_dvoting.integration.costs import CostedText
from lm_eval_dvoting.integration.harness import LLaDAEvalModel

TASKS = REPO_ROOT / "task_configs"


def _tasks(include: Path = TASKS) -> TaskManager:
    # include_defaults=False: indexing the ~15,000 stock task files takes seconds
    return TaskManager(include_path=str(include), include_defaults=False)


def _evaluate(lm, tasks, limit, **kwargs):
    return lm_eval.simple_evaluate(
        model=lm,
        tasks=tasks,
        limit=limit,
        task_manager=kwargs.pop("tm", None) or _tasks(),
        **kwargs,
    )


@pytest.mark.parametrize(
    "strategy, samples, nfe",
    [("single", 1, 32), ("majority", 5, 5 * 16), ("hex", 25, None), ("dvoting", None, None)],
)
def test_each_strategy_runs_through_the_harness(tiny_llada_dir, strategy, samples, nfe):
    lm = LLaDAEvalModel(
        pretrained=str(tiny_llada_dir), strategy=strategy, batch_size=16, device="cpu"
    )
    results = _evaluate(lm, ["dvoting_arith"], 3, gen_kwargs="max_gen_toks=32")
    figures = results["results"]["dvoting_arith"]
    # the score is the returned texts' answers against the targets, as logged
    records = results["samples"]["dvoting_arith"]
    answers = [r["filtered_resps"][0] for r in records]
    assert answers == [extract_answer(r["resps"][0][0], "number") or "[invalid]" for r in records]
    right = sum(answer == r["target"] for answer, r in zip(answers, records))
    assert figures["exact_match,extract"] == pytest.approx(right / 3)
    if samples is not None:
        assert figures["n_samples,extract"] == samples
    else:
        assert 2 <= figures["n_samples,extract"] <= 5  # dVoting stops between 2 and n samples
    if nfe is not None:
        assert figures["nfe,extract"] == nfe
    info = results["config"]["dvoting"]
    assert info["settings"]["strategy"] == strategy
    # the model args say L = 256; the requests ran with the task's max_gen_toks
    assert info["settings"]["gen_length"] == 256
    [used] = info["settings_used"]
    assert used["strategy"] == strategy and used["gen_length"] == 32
    # hex decodes with its own block lengths, L/32 .. L/2: no block_length is recorded for it
    # (issue 38)
    assert used.get("block_length") == (None if strategy == "hex" else 2)
    if nfe is not None and strategy != "hex":
        assert used["steps"] * samples == nfe
    assert info["totals"]["requests"] == 3
    assert info["totals"]["nfe"] == pytest.approx(3 * figures["nfe,extract"])


def _responses(lm, requests):
    return [str(r) for r in lm.generate_until(requests)]


class _Request:
    """The parts of lm-eval's Instance that generate_until reads."""

    def __init__(self, context, gen_kwargs, task_name="dvoting_arith", doc_id=0):
        self.args = (context, gen_kwargs)
        self.task_name, self.doc_id = task_name, doc_id


def test_results_do_not_depend_on_batch_size_or_order(tiny_llada_dir):
    gen_kwargs = {"until": [], "max_gen_toks": 32, "dvoting_answer": "number"}
    requests = [
        _Request(f"Please answer. {a}+{b}=?", gen_kwargs, doc_id=i)
        for i, (a, b) in enumerate([(1, 2), (3, 4), (25, 7), (8, 8), (9, 1)])
    ]
    for strategy in ("dvoting", "majority"):
        one = LLaDAEvalModel(
            pretrained=str(tiny_llada_dir), strategy=strategy, batch_size=1, device="cpu"
        )
        many = LLaDAEvalModel(
            pretrained=str(tiny_llada_dir), strategy=strategy, batch_size=8, device="cpu"
        )
        alone = _responses(one, requests)
        batched = _responses(many, requests)
        reversed_order = _responses(many, requests[::-1])[::-1]
        assert alone == batched == reversed_order
        # the sampled texts really differ between questions (the test is not vacuous)
        assert len(set(alone)) > 1


def test_returned_text_carries_cost_and_trace(tiny_llada_dir):
    lm = LLaDAEvalModel(pretrained=str(tiny_llada_dir), strategy="dvoting", device="cpu")
    (text,) = lm.generate_until([_Request("Please answer. 2+2=?", {"max_gen_toks": 32})])
    assert isinstance(text, CostedText)
    trace = text.trace
    assert text.n_samples == len(trace["candidates"]) >= 2
    assert text.nfe == sum(c["nfe"] for c in trace["candidates"])
    assert str(text) == trace["candidates"][trace["chosen"]]["text"]
    json.dumps(trace)  # serialisable for --log_samples


def test_unknown_model_args_and_gen_kwargs_are_rejected(tiny_llada_dir):
    with pytest.raises(ValueError, match="unknown model args.*accepted model args are:.*strategy"):
        LLaDAEvalModel(pretrained=str(tiny_llada_dir), stratgy="dvoting")
    # the block length is checked against each request's length, not the model arg's (issue 42)
    five = LLaDAEvalModel(pretrained=str(tiny_llada_dir), block_length=5, max_gen_toks=32)
    with pytest.raises(ValueError, match="block_length 5 does not divide the generation length 32"):
        five.generate_until([_Request("1+1=?", {})])
    lm = LLaDAEvalModel(pretrained=str(tiny_llada_dir), strategy="single", device="cpu")
    with pytest.raises(ValueError, match="unknown generation kwargs.*top_p.*accepted"):
        lm.generate_until([_Request("1+1=?", {"top_p": 0.9})])


def test_generation_kwargs_until_and_length(tiny_llada_dir):
    lm = LLaDAEvalModel(pretrained=str(tiny_llada_dir), strategy="single", device="cpu")
    (text,) = lm.generate_until([_Request("1+1=?", {"max_gen_toks": 16, "until": []})])
    assert text.nfe == 16
    first = str(text)
    assert first, "a random model should produce some characters"
    stop = first[len(first) // 2]
    (cut,) = lm.generate_until([_Request("1+1=?", {"max_gen_toks": 16, "until": [stop]})])
    assert str(cut) == first.split(stop)[0]


def test_lm_eval_cli_runs_the_plugin_model(tiny_llada_dir, tmp_path):
    """The stock `lm_eval` command finds dvoting-llada and our tasks (via the start-up hook)."""
    command = [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        "dvoting-llada",
        "--model_args",
        f"pretrained={tiny_llada_dir},strategy=single",
        "--tasks",
        "dvoting_arith",
        "--limit",
        "2",
        "--device",
        "cpu",
        "--gen_kwargs",
        "max_gen_toks=32",
        "--output_path",
        str(tmp_path / "out"),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (results_file,) = list((tmp_path / "out").rglob("results_*.json"))
    results = json.loads(results_file.read_text())
    assert results["results"]["dvoting_arith"]["nfe,extract"] == 32
    assert results["config"]["dvoting"]["settings"]["strategy"] == "single"


def test_every_reasoning_task_runs_offline(tiny_llada_dir, monkeypatch):
    """An offline harness run of a tiny model over --limit 5 of each task in the group."""
    monkeypatch.setenv("DVOTING_DATA_DIR", str(require_shared(DATA)))
    lm = LLaDAEvalModel(
        pretrained=str(tiny_llada_dir), strategy="single", batch_size=16, device="cpu"
    )
    results = _evaluate(lm, ["dvoting_reasoning"], 5, gen_kwargs="max_gen_toks=16")
    for task in (
        "dvoting_gsm8k",
        "dvoting_math500",
        "dvoting_arc_challenge",
        "dvoting_mmlu",
        "dvoting_gpqa_diamond",
    ):
        figures = results["results"][task]
        assert figures["n_samples,extract"] == 1
        assert figures["nfe,extract"] == 16
    assert lm.get_model_info()["dvoting"]["totals"]["requests"] == 25


ARC_LOCAL = """
task: arc_challenge_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question.stem}}}}\\nAnswer:"
doc_to_choice: "{{{{question.choices | map(attribute='text') | list}}}}"
doc_to_target: "{{{{(question.choices | map(attribute='label') | list).index(answerKey)}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def test_stock_loglikelihood_task_runs_offline(tiny_llada_dir, tmp_path):
    """arc_challenge's log-likelihood form (the stock prompt), on the local copy of its data."""
    arc = require_shared(DATA / "arc_challenge" / "ARC-Challenge-Test.jsonl")
    (tmp_path / "arc_challenge_local.yaml").write_text(ARC_LOCAL.format(path=arc))
    lm = LLaDAEvalModel(pretrained=str(tiny_llada_dir), mc_num=4, batch_size=16, device="cpu")
    results = _evaluate(lm, ["arc_challenge_local"], 4, tm=_tasks(tmp_path))
    right = []
    for record in results["samples"]["arc_challenge_local"]:
        scores = [
            resp[0][0] for resp in record["resps"]
        ]  # one (loglikelihood, is_greedy) per choice
        # a log-likelihood (bound) of a continuation: finite, at most 0, and it tells choices apart
        assert all(math.isfinite(x) and x <= 0 for x in scores) and len(set(scores)) > 1, scores
        right.append(scores.index(max(scores)) == int(record["target"]))
    assert results["results"]["arc_challenge_local"]["acc,none"] == pytest.approx(
        sum(right) / len(right)
    )


def test_prefix_cache_model_arg(tiny_llada_dir):
    """`prefix_cache` is off by default, accepts true/false text, lands in the results'
    config, and refuses anything else."""
    lm = LLaDAEvalModel(pretrained=str(tiny_llada_dir), strategy="single", device="cpu")
    assert lm.get_model_info()["dvoting"]["settings"]["prefix_cache"] is False
    cached = LLaDAEvalModel(
        pretrained=str(tiny_llada_dir),
        strategy="single",
        device="cpu",
        prefix_cache="True",
        max_gen_toks=32,
        block_length=8,
    )
    assert cached.get_model_info()["dvoting"]["settings"]["prefix_cache"] is True
    (text,) = cached.generate_until([_Request("1+1=?", {"max_gen_toks": 32})])
    assert text.nfe == 32
    with pytest.raises(ValueError, match="prefix_cache must be true or false"):
        LLaDAEvalModel(pretrained=str(tiny_llada_dir), prefix_cache="sometimes")
