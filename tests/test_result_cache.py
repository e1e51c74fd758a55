"""`--use_cache` (issue 17, items 1-2): a cached rerun scores exactly what a fresh run scores.

Every harness test drives `lm_eval.simple_evaluate(model="dvoting-llada", model_args=
"pretrained=tiny-arith,...", use_cache=...)` on the shipped demo model and the demo task
`dvoting_arith` (or a task YAML in tmp_path that includes it), with `--log_samples`, and
compares what a user reads: the per-task results and every logged sample.

* a cache written under one configuration is never replayed under another (each
  configuration has its own entries; result_cache.py);
* `repeats: 3` and documents with the same question are not merged on a cached rerun;
* an interrupted run resumes exactly, even when it stopped between two repeats;
* a rerun with a larger `--limit` computes only the new documents.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import lm_eval
import pytest
import torch
from conftest import REPO_ROOT
from lm_eval.tasks import TaskManager
from safetensors.torch import load_file, save_file

import lm_eval_dvoting.integration.harness as harness
import lm_eval_dvoting.integration.result_cache as result_cache
from lm_eval_dvoting.core.strategies import StrategySettings
from lm_eval_dvoting.integration.harness import LLaDAEvalModel
from lm_eval_dvoting.models.loading import PACKAGED_CHECKPOINTS

TASKS = REPO_ROOT / "task_configs"
ARITH_YAML = TASKS / "dvoting_arith.yaml"

# Three documents with the same question, then another: a cache keyed on the request alone
# merges them, as it merges the repeats of one document.
DUPLICATES_DATA = """
import datasets


def load(**kwargs):
    docs = [{"question": "9-6+4-2+1=?", "target": "6"}] * 3 + [
        {"question": "5+2-4+6=?", "target": "9"}
    ]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})
"""


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def computed(monkeypatch) -> list[int]:
    """How many requests reach the decoder in each run (one entry per generate_until call)."""
    counts: list[int] = []
    real = harness.decode_questions

    def counting(model, prompts, *args, **kwargs):
        counts.append(len(prompts))
        return real(model, prompts, *args, **kwargs)

    monkeypatch.setattr(harness, "decode_questions", counting)
    return counts


def _evaluate(
    model_args: str,
    limit: int,
    cache: Path | None = None,
    tasks: tuple[str, ...] = ("dvoting_arith",),
    task_dirs: tuple[Path, ...] = (),
    pretrained: str = "tiny-arith",
) -> dict[str, Any]:
    """One harness run, as `lm_eval --model dvoting-llada --use_cache PATH --log_samples`
    makes it."""
    manager = TaskManager(include_path=[str(TASKS), *map(str, task_dirs)], include_defaults=False)
    return lm_eval.simple_evaluate(
        model="dvoting-llada",
        model_args=f"pretrained={pretrained},{model_args}".rstrip(","),
        tasks=list(tasks),
        limit=limit,
        device="cpu",
        log_samples=True,
        task_manager=manager,
        verbosity="ERROR",
        use_cache=None if cache is None else str(cache),
    )


def _scored(results: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """What a user reads: per-task results and the logged samples, in document order."""
    samples = {
        task: sorted(records, key=lambda r: r["doc_id"])
        for task, records in results["samples"].items()
    }
    return results["results"], samples


def _texts(results: dict[str, Any], task: str) -> list[list[str]]:
    """Per document, the returned text of each repeat."""
    return [[str(t) for texts in rec["resps"] for t in texts] for rec in _scored(results)[1][task]]


def _write_task(folder: Path, name: str, extra: str) -> None:
    """dvoting_arith under another name, with extra YAML lines."""
    (folder / f"{name}.yaml").write_text(f"include: {ARITH_YAML}\ntask: {name}\ntag: []\n{extra}")


# --------------------------------------------------- item 1: one cache, several configurations


def _perturbed_copy(folder: Path) -> None:
    """Rewrite the weights in place: same file, same size and header, other values."""
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    state = load_file(weights)
    name = next(n for n in sorted(state) if n.endswith("weight") and state[n].dim() == 2)
    generator = torch.Generator().manual_seed(0)
    state[name] = state[name] + 0.5 * torch.randn(state[name].shape, generator=generator)
    save_file(state, weights, metadata={"format": "pt"})  # the header the shipped file has
    assert weights.stat().st_size == size


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("strategy=single", "strategy=dvoting"),
        ("strategy=dvoting,seed=1", "strategy=dvoting,seed=2"),
        ("strategy=dvoting,n=3", "strategy=dvoting,n=5"),
        ("strategy=dvoting,temperature=0.6", "strategy=dvoting,temperature=1.0"),
    ],  # every other setting: test_every_output_deciding_setting_is_in_the_fingerprint
)
def test_a_cache_of_other_model_args_is_not_replayed(tmp_path, first, second):
    """The second configuration's cached run scores what its fresh run scores, not the first's."""
    cache = tmp_path / "cache"
    written = _evaluate(first, 4, cache)
    replayed = _evaluate(second, 4, cache)
    fresh = _evaluate(second, 4)
    assert _scored(written) != _scored(fresh)  # the two configurations do give other results
    assert _scored(replayed) == _scored(fresh)


def test_a_cache_of_other_weights_at_the_same_path_is_not_replayed(tmp_path):
    """The checkpoint is identified by its content: weights rewritten in place are new weights."""
    folder = tmp_path / "ckpt"
    shutil.copytree(PACKAGED_CHECKPOINTS["tiny-arith"], folder)
    cache = tmp_path / "cache"
    written = _evaluate("strategy=single", 4, cache, pretrained=str(folder))
    _perturbed_copy(folder)
    replayed = _evaluate("strategy=single", 4, cache, pretrained=str(folder))
    fresh = _evaluate("strategy=single", 4, pretrained=str(folder))
    assert _texts(written, "dvoting_arith") != _texts(fresh, "dvoting_arith")
    assert _scored(replayed) == _scored(fresh)


def test_a_new_configuration_is_reported_with_the_settings_that_differ(tmp_path, caplog):
    cache = tmp_path / "cache"
    _evaluate("strategy=single", 2, cache)
    with caplog.at_level(logging.WARNING, logger="lm_eval_dvoting.integration.result_cache"):
        _evaluate("strategy=dvoting,seed=7", 2, cache)
    [message] = [
        r.getMessage()
        for r in caplog.records
        if r.name == "lm_eval_dvoting.integration.result_cache"
    ]
    assert "1 other configuration(s)" in message and "pretrained=tiny-arith" in message
    assert "strategy: 'single' -> 'dvoting'" in message and "seed: 1234 -> 7" in message
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lm_eval_dvoting.integration.result_cache"):
        _evaluate(
            "strategy=single", 2, cache
        )  # a configuration already in the file: nothing to say
    assert not [r for r in caplog.records if r.name == "lm_eval_dvoting.integration.result_cache"]


# every StrategySettings field, with another valid value: each must change the fingerprint
OTHER_SETTINGS = {
    "strategy": "majority",
    "gen_length": 64,
    "block_length": 4,
    "n": 7,
    "alpha": 0.5,
    "temperature": 0.9,
    "tau": 0.5,
    "steps": 8,
    "remasking": "random",
    "hex_samples": 5,
    "prefix_cache": True,
    "decoder": "entropy",  # tried on strategy=single (dvoting's own decoder is the entropy one)
    "cache": "dual",
    "threshold": 0.7,
    "temporal_weight": "linear",
    "temporal_alpha": 11.0,
    "vote": "temporal",
    "guidance": 2.0,
    "alg": "topk_margin",  # tried on decoder=dream (only it reads Dream's settings)
    "alg_temp": 0.5,
    "eps": 0.01,
    "top_p": 0.9,
    "top_k": 20,
    # block diffusion's (LLaDA2): tried on block_decoding="quality" (they are refused without it)
    "block_decoding": "threshold",
    "editing_threshold": 0.3,
    "max_post_steps": 3,
}
# where a setting is tried when the model's default (dvoting: the entropy rule, a plain
# vote) does not read it: an unread setting changes no output and is not in the
# fingerprint (issue 38, tests/test_unused_settings.py)
READ_WITH = {
    "steps": dict(strategy="single"),
    "remasking": dict(strategy="single"),
    "decoder": dict(strategy="single"),
    "hex_samples": dict(strategy="hex"),
    "threshold": dict(strategy="single", decoder="confidence"),
    "temporal_weight": dict(strategy="temporal"),
    "temporal_alpha": dict(strategy="temporal"),
    "guidance": dict(strategy="rfg"),
    "alg": dict(strategy="single", decoder="dream"),
    "alg_temp": dict(strategy="single", decoder="dream"),
    "eps": dict(strategy="single", decoder="dream"),
    "editing_threshold": dict(block_decoding="quality"),
    "max_post_steps": dict(block_decoding="quality"),
}


def test_every_output_deciding_setting_is_in_the_fingerprint(tmp_path):
    lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu")
    assert set(OTHER_SETTINGS) == {f.name for f in dataclasses.fields(StrategySettings)}
    base = result_cache.fingerprint_id(result_cache.fingerprint(lm))
    changed = {}
    for name, value in OTHER_SETTINGS.items():
        original = lm.settings
        context = READ_WITH.get(name, {})
        lm.settings = dataclasses.replace(original, **context)
        before = result_cache.fingerprint_id(result_cache.fingerprint(lm))
        lm.settings = dataclasses.replace(original, **context, **{name: value})
        changed[name] = result_cache.fingerprint_id(result_cache.fingerprint(lm))
        assert changed[name] != before, name
        lm.settings = original
    for name, value in {"seed": 99, "mc_num": 16, "max_length": 128, "add_bos_token": True}.items():
        original = getattr(lm, name)
        setattr(lm, name, value)
        changed[name] = result_cache.fingerprint_id(result_cache.fingerprint(lm))
        setattr(lm, name, original)
    lm.revision = "0123abc"  # a hub checkpoint: its id and commit
    changed["revision"] = result_cache.fingerprint_id(result_cache.fingerprint(lm))
    lm.revision = None
    lm.model.to(torch.bfloat16)
    changed["dtype"] = result_cache.fingerprint_id(result_cache.fingerprint(lm))
    lm.batch_rows += 1  # in bfloat16 the rows sharing a pass may change outputs ...
    changed["batch_rows in bfloat16"] = result_cache.fingerprint_id(result_cache.fingerprint(lm))
    lm.model.to(torch.float32)
    assert (
        result_cache.fingerprint_id(result_cache.fingerprint(lm)) == base
    )  # ... in float32 they do not
    lm._device = torch.device("cuda", 0)  # ... except on an accelerator, whose kernels go by shape
    assert result_cache.fingerprint(lm)["batch_rows"] == lm.batch_rows
    lm._device = torch.device("cpu")
    # the tokenizer's files: a chat template edited in a copy of the checkpoint
    folder = tmp_path / "ckpt"
    shutil.copytree(PACKAGED_CHECKPOINTS["tiny-arith"], folder)
    (folder / "chat_template.jinja").write_text((folder / "chat_template.jinja").read_text() + "\n")
    other = LLaDAEvalModel(pretrained="tiny-arith", tokenizer=str(folder), device="cpu")
    changed["tokenizer"] = result_cache.fingerprint_id(result_cache.fingerprint(other))
    assert {name: ident for name, ident in changed.items() if ident == base} == {}
    assert len(set(changed.values())) == len(changed)
    # the same checkpoint elsewhere (a copy) is the same checkpoint
    copy = LLaDAEvalModel(pretrained=str(folder), tokenizer="tiny-arith", device="cpu")
    assert (
        result_cache.fingerprint(copy)["checkpoint"] == result_cache.fingerprint(lm)["checkpoint"]
    )


def test_an_edit_to_the_plugins_code_changes_the_fingerprint(tmp_path, monkeypatch):
    """A patched or edited (editable-install) plugin must not replay what older code wrote."""
    package = Path(result_cache.__file__).resolve().parents[1]
    copy = tmp_path / "lm_eval_dvoting"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__", "demo"))
    monkeypatch.setattr(result_cache, "__file__", str(copy / "integration" / "result_cache.py"))
    result_cache.plugin_code_digest.cache_clear()  # once per process: a new process here
    before = result_cache.plugin_code_digest()
    edited = copy / "core" / "strategies.py"  # a module in another folder than result_cache's
    edited.write_text(edited.read_text() + "\n# edited\n")
    result_cache.plugin_code_digest.cache_clear()
    try:
        assert result_cache.plugin_code_digest() != before
        lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu")
        assert result_cache.fingerprint(lm)["plugin_code"] == result_cache.plugin_code_digest()
    finally:
        result_cache.plugin_code_digest.cache_clear()


def test_a_cache_hook_not_from_lm_evals_caching_lm_is_refused(tmp_path):
    """Without the CachingLM to answer for, a cache could not be bound to the settings: refused."""
    from lm_eval.api.model import CacheHook
    from sqlitedict import SqliteDict

    lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu")
    hook = CacheHook(None)
    hook.dbdict = SqliteDict(str(tmp_path / "x.db"), autocommit=True)
    with pytest.raises(RuntimeError, match="--use_cache: lm-eval's CachingLM"):
        lm.set_cache_hook(hook)
    hook.dbdict.close()
    lm.set_cache_hook(CacheHook(None))  # no cache: nothing to bind


# ------------------------------------------------- item 2: repeats and duplicated documents


@pytest.mark.parametrize(
    ("model_args", "generation"),
    [
        # voting samples at its own temperature; the task asks greedy (lm-eval caches it)
        ("strategy=dvoting,n=3", ""),
        # the harness's self-consistency recipe: sampling asked by the task (lm-eval never
        # cached it; ours are seeded per document and repeat, so they are cached exactly)
        (
            "strategy=single",
            'generation_kwargs: {"until": [], "max_gen_toks": 32, "do_sample": true, '
            '"temperature": 1.0, "dvoting_answer": "number"}\n',
        ),
    ],
)
def test_repeats_and_duplicated_documents_replay_exactly(
    tmp_path, computed, model_args, generation
):
    (tmp_path / "dup_data.py").write_text(DUPLICATES_DATA)
    _write_task(
        tmp_path,
        "arith_repeats",
        f"custom_dataset: !function dup_data.load\nrepeats: 3\n{generation}",
    )
    cache = tmp_path / "cache"
    run = dict(tasks=("arith_repeats",), task_dirs=(tmp_path,))
    written = _evaluate(model_args, 4, cache, **run)
    texts = _texts(written, "arith_repeats")
    # what a merging cache would lose: repeats differ, and so do documents with one question
    assert any(len(set(repeats)) > 1 for repeats in texts) and texts[0] != texts[1]
    assert computed == [12]
    replayed = _evaluate(model_args, 4, cache, **run)
    assert computed == [12]  # all twelve from the cache
    assert _scored(replayed) == _scored(written)


def test_a_run_interrupted_between_repeats_resumes_exactly(tmp_path, monkeypatch):
    """Stopped after 4 of 12 requests (one document has 1 of its 3 repeats cached): the
    resumed run decodes that document's repeats again as repeats 0-2, not as 0-1."""
    (tmp_path / "dup_data.py").write_text(DUPLICATES_DATA)
    _write_task(tmp_path, "arith_repeats", "custom_dataset: !function dup_data.load\nrepeats: 3\n")
    cache = tmp_path / "cache"
    run = dict(tasks=("arith_repeats",), task_dirs=(tmp_path,))
    real = harness.decode_questions

    class Interrupted(Exception):
        pass

    def interrupted_after_four(*args, on_done, **kwargs):
        finished = []

        def done(position, result):
            if len(finished) == 4:
                raise Interrupted
            on_done(position, result)
            finished.append(position)

        return real(*args, on_done=done, **kwargs)

    monkeypatch.setattr(harness, "decode_questions", interrupted_after_four)
    with pytest.raises(Interrupted):
        _evaluate("strategy=dvoting,n=3", 4, cache, **run)
    monkeypatch.setattr(harness, "decode_questions", real)
    resumed = _evaluate("strategy=dvoting,n=3", 4, cache, **run)
    fresh = _evaluate("strategy=dvoting,n=3", 4, **run)
    assert _scored(resumed) == _scored(fresh)


def test_a_larger_limit_computes_only_the_new_documents(tmp_path, computed):
    cache = tmp_path / "cache"
    _evaluate("strategy=dvoting", 3, cache)
    larger = _evaluate("strategy=dvoting", 6, cache)
    assert computed == [3, 3]
    assert _scored(larger) == _scored(_evaluate("strategy=dvoting", 6))


def test_cached_values_are_the_costed_texts(tmp_path):
    """What the cache holds is what generate_until returned: CostedText with its cost."""
    from sqlitedict import SqliteDict

    from lm_eval_dvoting.integration.costs import CostedText

    cache = tmp_path / "cache"
    _evaluate("strategy=dvoting", 2, cache)
    with SqliteDict(str(cache) + "_rank0.db") as stored:
        values = list(stored.values())
    assert len(values) == 2
    assert all(
        isinstance(v, CostedText) and v.nfe > 0 and v.n_samples >= 1 and v.trace for v in values
    )
    with SqliteDict(str(cache) + "_rank0.db", tablename=result_cache.META_TABLE) as meta:
        [record] = [v for k, v in meta.items() if k.startswith("fingerprint:")]
    assert record["fingerprint"]["strategy"] == "dvoting" and record["pretrained"] == "tiny-arith"
    json.dumps(record)  # plain data, readable by anyone inspecting the file


def test_weight_digests_are_remembered_until_the_file_changes(tmp_path, monkeypatch):
    """A digest stored for a file's size, times and inode is reused without reading the file;
    a rewrite (even of the same size) is hashed again."""
    monkeypatch.setattr(result_cache, "_DIGESTS", {})
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"a" * 1000)
    memo: dict[str, Any] = {}
    real = result_cache.file_digest(file, memo)
    assert real == hashlib.sha256(b"a" * 1000).hexdigest()
    [key] = memo
    memo[key] = memo[key] | {
        "sha256": "remembered"
    }  # as a later process reads it from the cache file
    monkeypatch.setattr(result_cache, "_DIGESTS", {})
    assert result_cache.file_digest(file, memo) == "remembered"
    file.write_bytes(b"b" * 1000)
    assert result_cache.file_digest(file, memo) == hashlib.sha256(b"b" * 1000).hexdigest()


def test_loglikelihoods_are_bound_to_the_configuration_too(tmp_path, monkeypatch):
    """Multiple choice (loglikelihood requests): another mc_num is not answered from the
    cache, the same one is answered wholly from it."""
    scored: list[int] = []
    real = harness.score_requests

    def counting(model, pairs, *args, **kwargs):
        scored.append(len(pairs))
        return real(model, pairs, *args, **kwargs)

    monkeypatch.setattr(harness, "score_requests", counting)
    cache = tmp_path / "cache"
    mc = dict(tasks=("dvoting_arith_mc",))
    written = _evaluate("mc_num=4", 2, cache, **mc)
    replayed = _evaluate("mc_num=8", 2, cache, **mc)
    fresh = _evaluate("mc_num=8", 2, **mc)
    assert _scored(written) != _scored(fresh)
    assert _scored(replayed) == _scored(fresh)
    assert scored == [8, 8, 8]  # 2 questions x 4 choices each time
    assert _scored(_evaluate("mc_num=4", 2, cache, **mc)) == _scored(written)
    assert scored == [8, 8, 8]  # nothing scored again
