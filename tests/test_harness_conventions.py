"""The README's harness conventions, each checked through the real harness.

Every test drives `lm_eval.simple_evaluate(model="dvoting-llada", ...)` on the shipped
demo model `pretrained=tiny-arith` and the demo task `dvoting_arith` (or small task
YAMLs written into tmp_path that include it), with `--log_samples`, and reads what a
user would read: the logged responses, the filtered (scored) answers, the per-request
trace and the results' config. One test per convention (README, "Harness conventions"):

* the strategy owns the sampling temperature; a task's `do_sample`/`temperature`
  apply to `strategy=single` only;
* the returned text is the first sample carrying the voted answer;
* each text is cut at the task's `until` strings *before* its answer is extracted;
* the answer kind comes from the task's `dvoting_answer`, else from the task name;
* results depend neither on the batch size nor on the requests beside them;
* samples are seeded per document and per repeat (`repeats: N`), the same in every run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lm_eval
import pytest
from conftest import REPO_ROOT
from lm_eval.tasks import TaskManager

from lm_eval_dvoting.core.answers import extract_answer, vote
from lm_eval_dvoting.models.loading import load_tokenizer

TASKS = REPO_ROOT / "task_configs"
ARITH_YAML = TASKS / "dvoting_arith.yaml"


def _evaluate(
    model_args: str, tasks: list[str], limit: int, task_dirs: tuple[Path, ...] = (), **kwargs: Any
) -> dict[str, Any]:
    """One harness run of tiny-arith, as `lm_eval --model dvoting-llada --log_samples` does it."""
    # include_defaults=False: indexing lm-eval's ~15,000 stock task files takes seconds
    manager = TaskManager(include_path=[str(TASKS), *map(str, task_dirs)], include_defaults=False)
    return lm_eval.simple_evaluate(
        model="dvoting-llada",
        model_args=f"pretrained=tiny-arith,{model_args}",
        tasks=tasks,
        limit=limit,
        device="cpu",
        log_samples=True,
        task_manager=manager,
        verbosity="ERROR",
        **kwargs,
    )


def _records(results: dict[str, Any], task: str = "dvoting_arith") -> list[dict[str, Any]]:
    """The logged samples of `task`, in document order."""
    return sorted(results["samples"][task], key=lambda r: r["doc_id"])


def _texts(results: dict[str, Any], task: str = "dvoting_arith") -> list[list[str]]:
    """Per document, the returned text of each repeat (`resps` is [[text, ...]] per document)."""
    return [
        [str(text) for texts in rec["resps"] for text in texts] for rec in _records(results, task)
    ]


def _traces(results: dict[str, Any], task: str = "dvoting_arith") -> list[dict[str, Any]]:
    return [rec["dvoting_trace"] for rec in _records(results, task)]


def _write_task(
    folder: Path, name: str, generation_kwargs: dict[str, Any], extra: str = ""
) -> Path:
    """A task YAML in `folder`: dvoting_arith under another name, with these generation kwargs."""
    folder.mkdir(parents=True, exist_ok=True)
    # JSON is YAML: the kwargs (backslashes included) are written exactly
    (folder / f"{name}.yaml").write_text(
        f"include: {ARITH_YAML}\ntask: {name}\ntag: []\n"
        f"generation_kwargs: {json.dumps(generation_kwargs)}\n{extra}"
    )
    return folder


# ------------------------------------------------------------ temperature ownership


def test_single_follows_the_tasks_do_sample_and_temperature():
    """`strategy=single` samples at the task's temperature when the task asks for sampling,
    over the model arg's."""
    task_samples = _evaluate(
        "strategy=single,temperature=0.3",
        ["dvoting_arith"],
        6,
        gen_kwargs="do_sample=true,temperature=1.0",
    )
    model_samples = _evaluate("strategy=single,temperature=1.0", ["dvoting_arith"], 6)
    greedy = _evaluate("strategy=single", ["dvoting_arith"], 6)
    assert _texts(task_samples) == _texts(model_samples)
    assert _traces(task_samples) == _traces(model_samples)
    # sampling at 1.0 really changes the texts (the comparison above is not vacuous)
    assert _texts(task_samples) != _texts(greedy)
    [used] = task_samples["config"]["dvoting"]["settings_used"]
    assert used["temperature"] == 1.0


@pytest.mark.parametrize("strategy, default_temperature", [("majority", 0.9), ("dvoting", 0.6)])
def test_voting_strategies_keep_their_own_temperature(strategy, default_temperature):
    """A task's do_sample/temperature do not change a voting strategy's samples."""
    asked = _evaluate(
        f"strategy={strategy}", ["dvoting_arith"], 4, gen_kwargs="do_sample=true,temperature=0.1"
    )
    plain = _evaluate(f"strategy={strategy}", ["dvoting_arith"], 4)
    assert _texts(asked) == _texts(plain)
    assert _traces(asked) == _traces(plain)
    [used] = asked["config"]["dvoting"]["settings_used"]
    assert used["temperature"] == default_temperature
    # at the task's temperature the samples would differ (the comparison is not vacuous)
    at_task_temperature = _evaluate(f"strategy={strategy},temperature=0.1", ["dvoting_arith"], 4)
    assert _traces(at_task_temperature) != _traces(asked)


# --------------------------------------------------------------- the voted sample


def test_returned_text_is_the_first_sample_carrying_the_voted_answer():
    results = _evaluate("strategy=majority", ["dvoting_arith"], 8)
    chosen_later = 0
    for record in _records(results):
        trace = record["dvoting_trace"]
        candidates = trace["candidates"]
        answers = [c["answer"] for c in candidates]
        # the vote, recomputed from the logged answers of every sample
        result = vote(answers, "number")
        assert trace["chosen"] == result.winner_index
        assert trace["votes"] == dict(result.counts)
        [[text]] = record["resps"]
        # the returned text is that sample's, and the task scores the voted answer
        assert text == candidates[result.winner_index]["text"]
        assert record["filtered_resps"] == [result.winner]
        assert answers.index(result.winner) == result.winner_index  # first carrier
        chosen_later += result.winner_index > 0
    # some question's first sample lost the vote, so returning it would be caught
    assert chosen_later >= 1


# ----------------------------------------------------------- until cut, then extract


def test_answer_is_extracted_after_the_tasks_until_cut(tmp_path):
    """With `until: ["."]` the text ends after the first step (`4+3=7`); the voted and the
    scored answer are that text's (7), not the full generation's boxed answer."""
    _write_task(
        tmp_path,
        "probe_until_arith",
        {"until": ["."], "max_gen_toks": 32, "do_sample": False, "dvoting_answer": "number"},
    )
    results = _evaluate("strategy=dvoting", ["probe_until_arith"], 6, task_dirs=(tmp_path,))
    tokenizer = load_tokenizer("tiny-arith")
    differs_from_uncut = 0
    for record in _records(results, "probe_until_arith"):
        trace = record["dvoting_trace"]
        for candidate in trace["candidates"]:
            assert "." not in candidate["text"]
            assert candidate["answer"] == extract_answer(candidate["text"], "number")
            uncut = tokenizer.decode(candidate["tokens"], skip_special_tokens=True)
            differs_from_uncut += extract_answer(uncut, "number") != candidate["answer"]
        [[text]] = record["resps"]
        assert text == trace["candidates"][trace["chosen"]]["text"]
        winner = vote([c["answer"] for c in trace["candidates"]], "number").winner
        assert record["filtered_resps"] == [winner]
    # the cut changes answers here, so extracting before it would be caught
    assert differs_from_uncut >= 1


# ------------------------------------------------------------------ answer kind


def test_answer_kind_comes_from_dvoting_answer_else_from_the_task_name(tmp_path):
    """Declared kind first, then the task name. Cutting at `\\boxed` leaves reasoning with
    numbers but no box: `number` reads the last number, `math` and `choice` find nothing;
    uncut, `math` reads the box and `choice` still finds no letter."""
    base = {"max_gen_toks": 32, "do_sample": False}
    probes = {
        # task name -> (generation kwargs, the kind its answers must have)
        "probe_minerva_arith": ({**base, "until": ["\\boxed"]}, "math"),  # name says math
        "probe_mmlu_arith": ({**base, "until": []}, "choice"),  # name says choice
        "probe_plain_arith": ({**base, "until": ["\\boxed"]}, "number"),  # no hint: number
        # declared beats the name, both ways
        "probe_mmlu_declared_number": (
            {**base, "until": ["\\boxed"], "dvoting_answer": "number"},
            "number",
        ),
        "probe_plain_declared_math": ({**base, "until": [], "dvoting_answer": "math"}, "math"),
    }
    for name, (kwargs, _) in probes.items():
        _write_task(tmp_path, name, kwargs)
    results = _evaluate("strategy=single", list(probes), 3, task_dirs=(tmp_path,))
    for name, (_, kind) in probes.items():
        others = [k for k in ("number", "math", "choice") if k != kind]
        distinguished = set()
        for trace in _traces(results, name):
            for candidate in trace["candidates"]:
                text = candidate["text"]
                assert candidate["answer"] == extract_answer(text, kind), (name, text)
                distinguished |= {
                    k for k in others if extract_answer(text, k) != candidate["answer"]
                }
        # the texts tell this kind apart from the other kind the name or the default gives
        wrong = {
            "probe_minerva_arith": "number",
            "probe_mmlu_arith": "number",
            "probe_plain_arith": "math",
            "probe_mmlu_declared_number": "choice",
            "probe_plain_declared_math": "choice",
        }[name]
        assert wrong in distinguished, (name, distinguished)


# ------------------------------------------------------- batch size and neighbours


def test_results_do_not_depend_on_batch_size_or_the_requests_beside_them(tmp_path):
    """dVoting (early stops, waves of different sizes) alone at batch 1, and at batch 8
    mixed with another task's longer prompts, which reorders and regroups the requests."""
    _write_task(
        tmp_path,
        "probe_long_prompts",
        {"until": [], "max_gen_toks": 32, "do_sample": False, "dvoting_answer": "number"},
        extra='doc_to_text: "Think carefully, then answer. Please answer the question step by '
        'step and put the answer in \\\\boxed{}. {{question}}"\n',
    )
    alone = _evaluate("strategy=dvoting", ["dvoting_arith"], 6, batch_size=1)
    mixed = _evaluate(
        "strategy=dvoting",
        ["probe_long_prompts", "dvoting_arith"],
        6,
        task_dirs=(tmp_path,),
        batch_size=8,
    )
    assert _texts(alone) == _texts(mixed)
    assert _traces(alone) == _traces(mixed)
    assert [r["filtered_resps"] for r in _records(alone)] == [
        r["filtered_resps"] for r in _records(mixed)
    ]
    # the questions were really sampled (several samples, differing texts)
    assert len({t[0] for t in _texts(alone)}) > 1
    assert any(len(trace["candidates"]) > 1 for trace in _traces(alone))


# -------------------------------------------------------- seeds: document, repeat

PROBE_DATA = '''
import datasets


def load(**kwargs):
    """Three documents with the same question, then another one."""
    docs = [{"question": "9-6+4-2+1=?", "target": "6"}] * 3 + [
        {"question": "5+2-4+6=?", "target": "9"}
    ]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})
'''


def test_samples_are_seeded_per_document_and_repeat(tmp_path):
    """`repeats: 3` gives each repeat its own samples, documents with the same context get
    different samples, and a second run (at another batch size) gives the same ones."""
    (tmp_path / "probe_data.py").write_text(PROBE_DATA)
    _write_task(
        tmp_path,
        "probe_repeats",
        {
            "until": [],
            "max_gen_toks": 32,
            "do_sample": True,
            "temperature": 1.0,
            "dvoting_answer": "number",
        },
        extra="custom_dataset: !function probe_data.load\nrepeats: 3\n",
    )
    first = _evaluate("strategy=single", ["probe_repeats"], 4, task_dirs=(tmp_path,), batch_size=1)
    again = _evaluate("strategy=single", ["probe_repeats"], 4, task_dirs=(tmp_path,), batch_size=8)
    texts = _texts(first, "probe_repeats")
    assert [len(t) for t in texts] == [3, 3, 3, 3]
    assert texts == _texts(again, "probe_repeats")
    # repeats of one document differ ...
    assert any(len(set(repeats)) > 1 for repeats in texts)
    # ... and so do documents that share their context
    assert texts[0] != texts[1] and texts[1] != texts[2] and texts[0] != texts[2]
