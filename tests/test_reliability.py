"""Reliability (issue 8): bad input, reproducibility, resume, several processes, memory.

Everything runs offline on CPU with the tiny random LLaDA of conftest (a character
tokenizer, maximum length 256). Tests marked `slow` (skipped by default; `-m slow`)
start the `lm_eval` command in subprocesses (`torchrun` with two CPU ranks, the same
command twice) or push 2,000 requests through one model.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# hard dependencies are imported, not importorskip'ped: missing, they must fail loudly
import lm_eval
import pytest
import torch
from conftest import REPO_ROOT
from lm_eval.api.instance import Instance
from lm_eval.tasks import TaskManager

import lm_eval_dvoting.integration.harness as harness
from lm_eval_dvoting.core.strategies import StrategySettings, derive_seed
from lm_eval_dvoting.integration.costs import CostedText
from lm_eval_dvoting.integration.harness import LLaDAEvalModel
from lm_eval_dvoting.models.loading import CheckpointError, load_model, parse_dtype

TASKS = REPO_ROOT / "task_configs"
ARITH = {"until": [], "max_gen_toks": 32, "dvoting_answer": "number"}

# Keys of a results JSON that differ between two runs of the same command: when and
# how long it ran, and the machine/checkout it ran on. Everything else must match.
RUN_SPECIFIC_KEYS = (
    "date",
    "start_time",
    "end_time",
    "total_evaluation_time_seconds",
    "pretty_env_info",
    "git_hash",
    "upper_git_hash",
)
# ... and what legitimately differs when only --batch_size changes
BATCH_SPECIFIC_CONFIG_KEYS = ("batch_size", "batch_sizes")


@pytest.fixture(scope="module")
def single(tiny_llada_dir):
    """Greedy one-sample decoding: deterministic, so texts can be compared across inputs."""
    return LLaDAEvalModel(
        pretrained=str(tiny_llada_dir), strategy="single", batch_size=8, device="cpu"
    )


class _Request:
    """The parts of lm-eval's Instance that generate_until reads."""

    def __init__(self, context, gen_kwargs, task_name="dvoting_arith", doc_id=0):
        self.args = (context, gen_kwargs)
        self.task_name, self.doc_id = task_name, doc_id


def _texts(lm, contexts, gen_kwargs=ARITH):
    return [
        str(t)
        for t in lm.generate_until(
            [_Request(c, gen_kwargs, doc_id=i) for i, c in enumerate(contexts)]
        )
    ]


def _tasks() -> TaskManager:
    return TaskManager(include_path=str(TASKS), include_defaults=False)


# the demo task's length pinned, so these tests do not follow changes to the demo model
PINNED_LENGTH = "max_gen_toks=32"


def _evaluate(lm, limit, **kwargs):
    return lm_eval.simple_evaluate(
        model=lm,
        tasks=["dvoting_arith"],
        limit=limit,
        task_manager=_tasks(),
        gen_kwargs=PINNED_LENGTH,
        verbosity="ERROR",
        **kwargs,
    )


# ------------------------------------------------------------------ bad input


def test_empty_context_starts_from_end_of_text(single):
    eot = single.tokenizer.convert_ids_to_tokens(single.eot_token_id)
    empty, from_eot = _texts(single, ["", eot])
    assert empty == from_eot  # greedy: the same prompt [eot] gives the same text
    assert single._prompt_ids("", 32).tolist() == [single.eot_token_id]


def test_overlong_context_is_cut_from_the_left(single, caplog):
    room = single.max_length - 32  # 224 of the tiny model's 256 positions
    context = "".join(str(i % 7) for i in range(1000))  # one token per character
    with caplog.at_level(logging.WARNING, logger="lm_eval_dvoting.integration.harness"):
        overlong, tail, short = _texts(single, [context, context[-room:], "1+1=?"])
    assert "cut from the left to 224" in caplog.text
    assert overlong == tail  # only the last `room` tokens were seen
    assert single._prompt_ids(context, 32).numel() == room
    # a generation as long as the model leaves no room at all: a clear error before decoding
    with pytest.raises(
        ValueError,
        match="leaves no room for a prompt in the model's maximum length of 256 "
        "tokens .*--gen_kwargs max_gen_toks=128",
    ):
        single.generate_until([_Request("1+1=?", {"max_gen_toks": 256})])


@pytest.mark.parametrize("until", ["missing", None, [], "", [""], ("",)])
def test_empty_or_missing_until_stops_nowhere(single, until):
    gen_kwargs = (
        {"max_gen_toks": 32} if until == "missing" else {"max_gen_toks": 32, "until": until}
    )
    (reference,) = _texts(single, ["1+2=?"], {"max_gen_toks": 32})
    assert _texts(single, ["1+2=?"], gen_kwargs) == [reference]
    assert len(reference) > 1
    # a single string is one stop string, not a list of characters
    stop = reference[len(reference) // 2]
    assert _texts(single, ["1+2=?"], {"max_gen_toks": 32, "until": stop}) == [
        reference.split(stop)[0]
    ]


def test_generation_length_must_fit_the_block_length(single, tiny_llada_dir):
    # at construction, before the checkpoint is even looked at: what no task can change
    with pytest.raises(ValueError, match="gen_length must be positive"):
        LLaDAEvalModel(pretrained="/no/such/folder", max_gen_toks=0)
    # the block rules wait for the task's length, which replaces the model arg's (issue 42):
    # the folder is refused, not the length (tests/test_length_checks.py has the rest)
    for args in (dict(block_length=5, max_gen_toks=32), dict(strategy="hex", max_gen_toks=48)):
        with pytest.raises(Exception, match="no/such/folder"):
            LLaDAEvalModel(pretrained="/no/such/folder", **args)
    # a task's max_gen_toks that the model arg block_length does not divide
    lm = LLaDAEvalModel(
        pretrained=str(tiny_llada_dir), strategy="single", block_length=8, device="cpu"
    )
    with pytest.raises(
        ValueError,
        match=r"max_gen_toks 30 \(task dvoting_arith's generation_kwargs: .*\) "
        r"cannot be decoded: block_length 8 does not divide the generation "
        r"length 30; give block_length a divisor of 30 \(1, 2, 3, 5, 6, 10, "
        r"15, 30\), or a max_gen_toks that is a multiple of 8",
    ):
        lm.generate_until([_Request("1+1=?", {"max_gen_toks": 30})])


@pytest.mark.parametrize(
    "arg, value, message",
    [
        ("n", 0, r"n \(samples per question\) must be >= 1, got 0"),
        ("n", -3, r"n \(samples per question\) must be >= 1"),
        ("alpha", -0.1, r"alpha \(entropy threshold\) must be >= 0, got -0.1"),
        ("alpha", math.nan, r"alpha \(entropy threshold\) must be >= 0, got nan"),
        ("tau", 0.0, r"tau \(position-consistency share\) must be in \(0, 1\], got 0.0"),
        ("tau", 1.5, r"tau .* must be in \(0, 1\], got 1.5"),
        ("tau", -1.0, r"tau .* must be in \(0, 1\]"),
        ("tau", math.nan, r"tau .* must be in \(0, 1\], got nan"),
        ("temperature", -0.5, "temperature must be >= 0, got -0.5"),
        ("temperature", math.nan, "temperature must be >= 0, got nan"),
        ("strategy", "beam", "strategy must be one of"),
        ("hex_samples", 7, "hex_samples must be 25"),
    ],
)
def test_invalid_strategy_settings_fail_at_construction(arg, value, message):
    # the settings are checked before the checkpoint is loaded: the folder need not exist
    with pytest.raises(ValueError, match=message):
        LLaDAEvalModel(pretrained="/no/such/folder", **{arg: value})


def test_boundary_strategy_settings_are_accepted():
    StrategySettings(tau=1.0, alpha=0.0, n=1, temperature=0.0)
    StrategySettings(tau=1e-9, alpha=math.inf)


def test_unusual_unicode_is_encoded_not_fatal(single):
    tokenizer_unknown = single.tokenizer.unk_token_id
    contexts = [
        "héllo wörld: 2+2=?",  # letters the character tokenizer does not have
        "emoji 😀🚀👨‍👩‍👧 2+2=?",  # astral plane, a ZWJ sequence
        "مرحبا بالعالم 2+2=? שלום",  # right-to-left scripts
        "lone \ud800 surrogate \udfff 2+2=?",  # invalid unicode (e.g. from broken data)
        "paired \ud83d\ude00 surrogates",  # a surrogate pair written as two code points
        "\x00\x01\u200b\ufeff control and zero-width",
    ]
    assert tokenizer_unknown in single.tok_encode("é")
    assert single.tok_encode("😀") == [tokenizer_unknown]
    # lone surrogates become U+FFFD (unknown here), a pair becomes the character it encodes
    assert single.tok_encode("a\ud800b") == single.tok_encode("a\ufffdb")
    assert single.tok_encode("\ud83d\ude00") == single.tok_encode("😀")
    texts = single.generate_until([_Request(c, ARITH, doc_id=i) for i, c in enumerate(contexts)])
    assert all(isinstance(t, CostedText) and t.nfe == 32 for t in texts)
    for text in texts:
        json.dumps(text.trace, ensure_ascii=False).encode("utf-8")  # --log_samples can write it
    # a request with lone surrogates gets a seed of its own: derive_seed hashes them as they
    # are (never dropping them or replacing them with U+FFFD, which would merge contexts)
    seeds = {
        derive_seed(1, text)
        for text in ("lone \ud800", "lone \udc00", "lone \ufffd", "lone ", "lone ?")
    }
    assert len(seeds) == 5


@pytest.mark.parametrize("strategy", ["dvoting", "majority"])
def test_model_that_never_answers_returns_the_first_sample(tiny_llada_dir, monkeypatch, strategy):
    monkeypatch.setattr(harness, "extract_answer", lambda text, kind, n_options=None: None)
    lm = LLaDAEvalModel(
        pretrained=str(tiny_llada_dir), strategy=strategy, n=3, batch_size=8, device="cpu"
    )
    texts = lm.generate_until([_Request(f"{a}+1=?", ARITH, doc_id=a) for a in range(3)])
    for text in texts:
        assert text.votes == {}
        assert text.n_samples == 3  # no answers agree, so dVoting never stops early
        assert text.trace["chosen"] == 0
        assert str(text) == text.trace["candidates"][0]["text"]
        assert all(c["answer"] is None for c in text.trace["candidates"])
    # through the harness the run finishes and is scored
    results = _evaluate(lm, 2)
    assert results["results"]["dvoting_arith"]["n_samples,extract"] == 3


def _broken_copy(source: Path, target: Path, payload: bytes) -> Path:
    shutil.copytree(source, target)
    (target / "model.safetensors").write_bytes(payload)
    return target


def test_corrupt_or_truncated_weights_name_the_file(tiny_llada_dir, tmp_path):
    weights = (tiny_llada_dir / "model.safetensors").read_bytes()
    cases = {
        "truncated": weights[: len(weights) // 2],
        "header-only": weights[:20],
        "empty": b"",
        "garbage": os.urandom(4096),
    }
    for name, payload in cases.items():
        folder = _broken_copy(tiny_llada_dir, tmp_path / name, payload)
        with pytest.raises(CheckpointError, match="corrupt or truncated") as error:
            load_model(folder, device="cpu")
        assert str(folder / "model.safetensors") in str(error.value), name
    # a shard named in the index but absent
    folder = _broken_copy(tiny_llada_dir, tmp_path / "sharded", weights)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    index = {
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
        }
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors is missing"):
        load_model(folder, device="cpu")
    # and through the harness, the same error
    with pytest.raises(CheckpointError, match="truncated"):
        LLaDAEvalModel(pretrained=str(tmp_path / "truncated"), device="cpu")


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the fallback on a machine without CUDA"
)
def test_cuda_requested_without_cuda_falls_back_to_cpu(tiny_llada_dir):
    with pytest.warns(UserWarning, match="CUDA is not available; using the CPU"):
        lm = LLaDAEvalModel(
            pretrained=str(tiny_llada_dir), strategy="single", device="cuda", dtype="bf16"
        )
    assert lm.device.type == "cpu"
    parameter = next(lm.model.parameters())
    assert parameter.device.type == "cpu" and parameter.dtype == torch.bfloat16
    (text,) = lm.generate_until([_Request("1+1=?", {"max_gen_toks": 16})])
    assert text.nfe == 16  # bf16 runs (slowly) on the CPU
    # "cuda:0" given to the class directly (not lm-eval's default): the same fallback, float32
    with pytest.warns(UserWarning, match="CUDA is not available"):
        lm = LLaDAEvalModel(pretrained=str(tiny_llada_dir), device="cuda:0")
    assert next(lm.model.parameters()).dtype == torch.float32


def test_dtype_names(tiny_llada_dir):
    cpu = torch.device("cpu")
    assert parse_dtype("torch.float16", cpu) == parse_dtype("fp16", cpu) == torch.float16
    assert parse_dtype(None, cpu) == parse_dtype("auto", cpu) == torch.float32
    with pytest.raises(
        ValueError, match="unknown dtype 'float8'; use one of float32, bfloat16, float16"
    ):
        LLaDAEvalModel(pretrained=str(tiny_llada_dir), dtype="float8", device="cpu")


# -------------------------------------------------------------- reproducibility


def _canonical(results, drop_batch=False) -> str:
    """The results as lm-eval writes them, less the run-specific keys."""
    from lm_eval.utils import handle_non_serializable

    results = json.loads(json.dumps(results, default=handle_non_serializable))
    for key in RUN_SPECIFIC_KEYS:
        results.pop(key, None)
    if drop_batch:
        for key in BATCH_SPECIFIC_CONFIG_KEYS:
            results["config"].pop(key, None)
        results["config"]["dvoting"].pop("batch_rows", None)
    return json.dumps(results, sort_keys=True, ensure_ascii=False, indent=1)


@pytest.mark.parametrize(
    "strategy, model_args, batches",
    [
        ("single", {"temperature": 0.7}, (1, 6)),
        ("majority", {"n": 3}, (1, 6)),  # temperature 0.9
        ("hex", {}, (3, 16)),  # 25 samples, temperature 0.9
        ("dvoting", {"n": 3}, (1, 6)),  # temperature 0.6
    ],
)
def test_results_are_identical_across_runs_and_batch_sizes(
    tiny_llada_dir, strategy, model_args, batches
):
    runs = []
    for batch_size in batches:
        lm = LLaDAEvalModel(
            pretrained=str(tiny_llada_dir),
            strategy=strategy,
            batch_size=batch_size,
            device="cpu",
            **model_args,
        )
        runs.append(_evaluate(lm, 2, log_samples=True))
    assert runs[0]["config"]["dvoting"]["settings"]["temperature"] > 0
    first, second = (_canonical(r, drop_batch=True) for r in runs)
    assert first == second  # results, per-sample responses (--log_samples), config, hashes
    assert " at 0x" not in first  # no object addresses (they differ between processes)
    responses = [s["resps"] for s in runs[0]["samples"]["dvoting_arith"]]
    assert len({json.dumps(r) for r in responses}) == 2  # two different documents, two texts


# ------------------------------------------------------------------- resume


class _Interrupted(Exception):
    pass


def test_resume_from_cache_recomputes_nothing_that_finished(tiny_llada_dir, tmp_path, monkeypatch):
    """--use_cache: a run killed half-way, started again, computes only what is missing."""
    cache = str(tmp_path / "cache")

    def model():
        return LLaDAEvalModel(
            pretrained=str(tiny_llada_dir), strategy="dvoting", n=3, batch_size=1, device="cpu"
        )

    # 1. interrupted after two of four requests finished (each is cached as it finishes)
    interrupted = model()
    costed = interrupted._costed

    def costed_then_interrupt(*args, **kwargs):
        if interrupted.totals["requests"] == 2:
            raise _Interrupted
        return costed(*args, **kwargs)

    monkeypatch.setattr(interrupted, "_costed", costed_then_interrupt)
    with pytest.raises(_Interrupted):
        _evaluate(interrupted, 4, use_cache=cache, log_samples=True)
    assert interrupted.totals["requests"] == 2

    # what is cached is our CostedText, figures included (pickled by sqlitedict)
    from sqlitedict import SqliteDict

    time.sleep(0.2)  # sqlitedict's autocommit writes from a background thread
    with SqliteDict(cache + "_rank0.db") as stored:
        cached = list(stored.values())
    assert len(cached) == 2
    assert all(
        isinstance(t, CostedText) and t.nfe > 0 and t.n_samples >= 2 and t.trace for t in cached
    )

    # 2. started again: only the two missing requests reach the model
    resumed = model()
    after_resume = _evaluate(resumed, 4, use_cache=cache, log_samples=True)
    assert resumed.totals["requests"] == 2

    # 3. the same results as a run never interrupted (nfe / n_samples survive the cache)
    uninterrupted = _evaluate(model(), 4, log_samples=True)
    assert after_resume["results"] == uninterrupted["results"]
    assert after_resume["samples"] == uninterrupted["samples"]
    # config differs only where it must: the cache path, and what this run computed itself;
    # the totals are those of all four responses, two of them read from the cache
    assert after_resume["config"]["use_cache"] == cache
    assert (
        after_resume["config"]["dvoting"]["totals"] == uninterrupted["config"]["dvoting"]["totals"]
    )
    assert uninterrupted["config"]["dvoting"]["totals"]["requests"] == 4
    assert after_resume["config"]["dvoting"]["computed"]["requests"] == 2

    # 3. a third run finds everything cached and computes nothing
    third = model()
    _evaluate(third, 4, use_cache=cache)
    assert third.totals["requests"] == 0


# ------------------------------------------------------- several processes


def test_padding_copies_are_decoded_and_counted_once(tiny_llada_dir):
    """lm-eval pads a rank by repeating its last instance `repeats` times more."""
    lm = LLaDAEvalModel(
        pretrained=str(tiny_llada_dir), strategy="dvoting", n=3, batch_size=8, device="cpu"
    )

    def instance(doc_id, repeats):
        return Instance(
            "generate_until",
            {},
            (f"{doc_id}+1=?", dict(ARITH)),
            idx=0,
            metadata=("dvoting_arith", doc_id, repeats),
        )

    single_repeat, two_repeats = instance(0, 1), instance(1, 2)
    requests = [single_repeat, two_repeats, two_repeats]
    padded = requests + [two_repeats, two_repeats]  # the evaluator's padding of one request
    plain = lm.generate_until(requests)
    totals = dict(lm.totals)
    lm.use_strategy("dvoting")
    texts = lm.generate_until(padded)
    assert dict(lm.totals) == totals  # the copies were neither decoded nor counted
    assert [str(t) for t in texts[:3]] == [str(t) for t in plain]
    assert texts[3] is texts[1] and texts[4] is texts[2]  # repeat k of the copy = repeat k
    assert str(texts[1]) != str(texts[2])  # the two repeats are different samples


def _run_cli(args, env_extra=None, launcher=None, timeout=600):
    command = (launcher or [sys.executable]) + ["-m", "lm_eval"] + args
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **(env_extra or {}))
    started = time.monotonic()
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    assert run.returncode == 0, run.stderr[-4000:]
    return time.monotonic() - started


def _read_outputs(folder: Path):
    (results_file,) = folder.rglob("results_*.json")
    (samples_file,) = folder.rglob("samples_dvoting_arith_*.jsonl")
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
    return json.loads(results_file.read_text()), sorted(samples, key=lambda s: s["doc_id"])


def _cli_args(model_dir, out, batch_size=1, limit=5, strategy="dvoting"):
    return [
        "--model",
        "dvoting-llada",
        "--model_args",
        f"pretrained={model_dir},strategy={strategy},n=3",
        "--tasks",
        "dvoting_arith",
        "--gen_kwargs",
        PINNED_LENGTH,
        "--limit",
        str(limit),
        "--device",
        "cpu",
        "--batch_size",
        str(batch_size),
        "--output_path",
        str(out),
        "--log_samples",
    ]


@pytest.mark.slow
def test_same_command_twice_gives_identical_files(tiny_llada_dir, tmp_path):
    """Byte-identical results JSON (run-specific keys aside) and samples, any --batch_size."""
    timings = {}
    for name, batch_size in (("first", 4), ("again", 4), ("batch1", 1)):
        timings[name] = _run_cli(
            _cli_args(tiny_llada_dir, tmp_path / name, batch_size), timeout=300
        )
    outputs = {name: _read_outputs(tmp_path / name) for name in timings}
    first_results, first_samples = outputs["first"]
    again_results, again_samples = outputs["again"]
    assert _canonical(first_results) == _canonical(again_results)
    assert first_samples == again_samples  # every field of every logged sample
    batch1_results, batch1_samples = outputs["batch1"]
    assert _canonical(first_results, drop_batch=True) == _canonical(batch1_results, drop_batch=True)
    assert first_samples == batch1_samples
    print("CLI timings (s):", {k: round(v, 1) for k, v in timings.items()})


def _same_up_to_rounding(a, b) -> bool:
    """Equal structures; floats equal to within a few units in the last place."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_up_to_rounding(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)
    return a == b


@pytest.mark.slow
def test_two_cpu_processes_match_one(tiny_llada_dir, tmp_path):
    """`torchrun --nproc_per_node 2` (gloo, CPU): the same results, each request counted once."""
    limit = 5  # odd: rank 1 gets 2 documents, padded to 3 by repeating its last request
    one = _run_cli(_cli_args(tiny_llada_dir, tmp_path / "one", limit=limit), timeout=300)
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(29500 + os.getpid() % 1000),
    ]
    two = _run_cli(
        _cli_args(tiny_llada_dir, tmp_path / "two", limit=limit),
        {"ACCELERATE_USE_CPU": "1"},
        launcher=torchrun,
        timeout=400,
    )
    one_results, one_samples = _read_outputs(tmp_path / "one")
    two_results, two_samples = _read_outputs(tmp_path / "two")
    # equal, floats to the last bits: lm-eval gathers the ranks' per-sample values in
    # another order, so a standard error can differ in its last bit
    assert _same_up_to_rounding(one_results["results"], two_results["results"])
    assert one_results["config"]["dvoting"] == two_results["config"]["dvoting"]  # totals included
    assert two_results["config"]["dvoting"]["totals"]["requests"] == limit
    assert [s["doc_id"] for s in two_samples] == list(range(limit))
    padded = 0
    for a, b in zip(one_samples, two_samples):
        assert a["filtered_resps"] == b["filtered_resps"]
        (responses,), (two_responses,) = a["resps"], b["resps"]  # one request per document
        # lm-eval appends the padding copy's response to the padded request: the same text
        assert two_responses[: len(responses)] == responses
        assert all(r == responses[-1] for r in two_responses[len(responses) :])
        padded += len(two_responses) - len(responses)
    assert padded == 1
    print(f"one process {one:.1f} s, two processes {two:.1f} s")


# ------------------------------------------------------------------ memory


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc/self/statm (Linux)")
def test_two_thousand_requests_do_not_grow_memory(tiny_llada_dir):
    lm = LLaDAEvalModel(
        pretrained=str(tiny_llada_dir), strategy="dvoting", n=3, batch_size=16, device="cpu"
    )
    gen_kwargs = {"until": ["\n"], "max_gen_toks": 16, "dvoting_answer": "number"}
    rss, started = [], time.monotonic()
    for chunk in range(20):  # 20 calls of 100 requests, results dropped as lm-eval's filters would
        requests = [
            _Request(f"Q{chunk}-{i}: {i % 9}+{chunk % 9}=?", gen_kwargs, doc_id=chunk * 100 + i)
            for i in range(100)
        ]
        texts = lm.generate_until(requests, disable_tqdm=True)
        assert len(texts) == 100
        del texts, requests
        rss.append(_rss_mib())
    elapsed = time.monotonic() - started
    assert lm.totals["requests"] == 2000
    print(f"2000 requests in {elapsed:.1f} s; RSS MiB after each 100: {[round(r, 1) for r in rss]}")
    # after the first calls warm up (allocator pools, lazily built modules), no growth
    assert rss[-1] - rss[4] < 16, rss
