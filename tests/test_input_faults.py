"""Faults that used to give a wrong, partial or lost result without a word (issue 17, items 5-8).

* numerics: with a bfloat16 model the decision path (softmax, entropy, confidence, Gumbel
  noise) still runs in float64 (the likelihood's cross-entropy in float32), and the
  results record the dtype, device and batch rows a rerun must repeat;
* a weight file holding NaN/inf (a corrupt file of the right size), or a tensor that
  overflows the requested dtype, is refused at load, naming the file and the tensor;
* every bad model arg, config.json or `generate`/`run_strategy` input is refused before
  any model work, with a message naming the argument, its value and what is allowed;
* a prompt with lone surrogates, run through the real `lm_eval` CLI with
  `--log_samples`, finishes and logs every sample (it used to crash in lm-eval's sample
  hashing after all generation).
"""

from __future__ import annotations

import json
import math
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import REPO_ROOT, _write_random_llada
from lm_eval.api.instance import Instance

from lm_eval_dvoting.core import likelihood
from lm_eval_dvoting.core.decoding import generate
from lm_eval_dvoting.core.decoding import rules as batched
from lm_eval_dvoting.core.likelihood import score_requests
from lm_eval_dvoting.core.parts.rules import entropy as entropy_rule
from lm_eval_dvoting.core.strategies import StrategySettings, run_strategy
from lm_eval_dvoting.integration.arg_parsing import whole_number as _whole_number
from lm_eval_dvoting.integration.harness import LLaDAEvalModel
from lm_eval_dvoting.models.loading import CheckpointError, load_model

NO_FOLDER = (
    "/no/such/folder"  # a check that passes with this ran before the checkpoint was looked at
)


# ------------------------------------------------------------------ 5. numerics


def test_decision_path_is_float64_with_a_bfloat16_model(tiny_llada_dir, monkeypatch):
    """The model runs in bfloat16; every tensor a decision is taken from is float64
    (float32 for the likelihood's cross-entropy), at temperature 0 and above."""
    model = load_model(tiny_llada_dir, device="cpu", dtype="bfloat16")
    assert (
        model(torch.tensor([[3, 4, 5]])).dtype == torch.bfloat16
    )  # the forward pass really is bf16
    seen: dict[str, list[torch.dtype]] = {
        "entropy": [],
        "candidates": [],
        "committed": [],
        "confidence": [],
        "likelihood": [],
    }

    def spy(name: str, original: Any, argument: int = 0) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            seen[name].append(args[argument].dtype)
            return original(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(entropy_rule, "entropy", spy("entropy", entropy_rule.entropy))
    # the fixed schedule and the confidence rule batch their rows (decoding/rules.py, RowBatch)
    monkeypatch.setattr(batched, "filtered_gumbel", spy("candidates", batched.filtered_gumbel))
    committed = spy("committed", entropy_rule.committed_candidates)
    monkeypatch.setattr(entropy_rule, "committed_candidates", committed)
    original_batch = batched.RowBatch.__init__

    def batch(self: Any, *args: Any) -> None:
        original_batch(self, *args)
        seen["confidence"].append(self.logits64.dtype)  # the softmax confidence is taken of these

    monkeypatch.setattr(batched.RowBatch, "__init__", batch)
    original_logits = likelihood._logits_at

    def logits_at(*args: Any) -> torch.Tensor:
        logits = original_logits(*args)
        seen["likelihood"].append(logits.dtype)
        return logits

    monkeypatch.setattr(likelihood, "_logits_at", logits_at)

    prompts = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10]])
    for temperature in (0.0, 0.8):
        generators = [torch.Generator().manual_seed(k) for k in range(2)]
        generate(
            model,
            prompts,
            gen_length=8,
            block_length=4,
            steps=4,
            temperature=temperature,
            generator=generators,
        )
        generate(
            model,
            prompts,
            gen_length=8,
            block_length=4,
            alpha=0.3,
            temperature=temperature,
            generator=[torch.Generator().manual_seed(k) for k in range(2)],
        )
    score_requests(
        model, [(torch.tensor([3, 4, 5]), torch.tensor([6, 7]))], mc_num=4, batch_size=4, seeds=[1]
    )

    assert all(seen.values()), {k: len(v) for k, v in seen.items()}  # every path ran
    for name in ("entropy", "candidates", "committed", "confidence"):
        assert set(seen[name]) == {torch.float64}, (name, seen[name])
    assert set(seen["likelihood"]) == {torch.float32}


def test_results_record_dtype_device_and_batch_rows():
    """A bfloat16 run's outputs can depend on the batch (README, Reproducibility), so the
    results say what a rerun must repeat."""
    lm = LLaDAEvalModel(pretrained="tiny-arith", dtype="bfloat16", device="cpu", batch_size=8)
    info = lm.get_model_info()["dvoting"]
    assert (info["dtype"], info["device"], info["batch_rows"]) == ("bfloat16", "cpu", 8)
    assert (
        LLaDAEvalModel(pretrained="tiny-arith", device="cpu").get_model_info()["dvoting"]["dtype"]
        == "float32"
    )


# ------------------------------------------------------- 6. non-finite weights


def _corrupt_tensor(file: Path, tensor: str, value: float) -> None:
    """Overwrite the first element of `tensor` in a safetensors file in place (the size stays)."""
    raw = bytearray(file.read_bytes())
    (header_size,) = struct.unpack("<Q", raw[:8])
    entry = json.loads(raw[8 : 8 + header_size])[tensor]
    assert entry["dtype"] == "F32"
    start = 8 + header_size + entry["data_offsets"][0]
    raw[start : start + 4] = struct.pack("<f", value)
    file.write_bytes(bytes(raw))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_weights_are_refused_naming_file_and_tensor(tmp_path, value):
    folder = _write_random_llada(tmp_path / "ckpt")
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    tensor = "model.transformer.blocks.1.ff_out.weight"
    _corrupt_tensor(weights, tensor, value)
    assert weights.stat().st_size == size  # a corrupt file of the right size
    for dtype in ("float32", "bfloat16"):
        with pytest.raises(CheckpointError) as caught:
            load_model(folder, device="cpu", dtype=dtype)
        message = str(caught.value)
        assert str(weights) in message and tensor in message and "NaN/inf" in message, message
        assert "download it again" in message


def test_weights_overflowing_float16_are_refused_with_what_to_use(tmp_path):
    folder = _write_random_llada(tmp_path / "ckpt")
    tensor = "model.transformer.wte.weight"
    _corrupt_tensor(folder / "model.safetensors", tensor, 1e6)  # finite, but beyond float16's 65504
    load_model(folder, device="cpu", dtype="bfloat16")  # fine where it fits
    with pytest.raises(
        CheckpointError, match=rf"(?s){tensor}.*overflows torch.float16.*dtype=bfloat16 or float32"
    ):
        load_model(folder, device="cpu", dtype="float16")


# ------------------------------------------------------------------ 7. validation


@pytest.mark.parametrize(
    "args, pattern",
    [
        (
            {"temperature": math.inf},
            r"temperature must be finite \(>= 0\), got inf: use 0 for greedy",
        ),
        ({"temperature": "inf"}, r"temperature must be finite \(>= 0\), got inf"),
        ({"temperature": math.nan}, r"temperature must be >= 0, got nan: use 0 for greedy"),
        ({"temperature": -0.5}, r"temperature must be >= 0, got -0.5: use 0 for greedy"),
        ({"temperature": "hot"}, r"temperature must be a number, got 'hot'"),
        ({"steps": 0}, r"steps must be >= 1, got 0: leave it out"),
        ({"steps": -4}, r"steps must be >= 1, got -4"),
        ({"steps": 2.5}, r"steps must be a whole number, got 2.5"),
        ({"n": 2.5}, r"n must be a whole number, got 2.5"),
        ({"n": True}, r"n must be a whole number, got True"),
        (
            {"block_length": 0},
            r"block_length must be >= 1, got 0: leave it out \(default gen_length/16\)",
        ),
        ({"block_length": -2}, r"block_length must be >= 1, got -2"),
        ({"seed": "abc"}, r"seed must be a whole number, got 'abc'"),
        ({"seed": 1.5}, r"seed must be a whole number, got 1.5"),
        ({"alpha": math.nan}, r"alpha \(entropy threshold\) must be >= 0, got nan"),
        ({"alpha": "abc"}, r"alpha must be a number, got 'abc'"),
        (
            {"tau": math.inf},
            r"tau \(position-consistency share\) must be finite \(in \(0, 1\]\), got inf",
        ),
        ({"mc_num": 0}, r"mc_num must be a whole number >= 1, got 0"),
        ({"mc_num": 2.5}, r"mc_num must be a whole number >= 1, got 2.5"),
        ({"hex_samples": 5.5}, r"hex_samples must be 25 or 5, got 5.5"),
        ({"max_gen_toks": 0}, r"gen_length must be positive, got 0: set max_gen_toks"),
        ({"max_gen_toks": -1}, r"gen_length must be positive, got -1"),
        ({"max_gen_toks": 2.5}, r"max_gen_toks must be a whole number, got 2.5"),
        ({"max_length": 0}, r"max_length must be a whole number >= 1, got 0"),
        ({"max_length": -5}, r"max_length must be a whole number >= 1, got -5"),
        ({"batch_size": 2.5}, r"batch_size must be a positive integer or 'auto', got 2.5"),
        ({"vote": "ranked"}, r"vote must be one of \('plain', 'temporal'\), got 'ranked'"),
        (
            {"strategy": "single", "vote": "temporal"},
            r"vote=temporal does not apply to strategy=single",
        ),
        (
            {"temporal_weight": "cubic"},
            r"temporal_weight must be one of \('exp', 'linear', 'fixed'\), got 'cubic'",
        ),
        ({"temporal_alpha": "-1"}, r"temporal_alpha must be >= 0, got -1.0"),
        ({"temporal_alpha": "steep"}, r"temporal_alpha must be a number, got 'steep'"),
    ],
)
def test_bad_model_args_are_refused_before_the_checkpoint_is_read(args, pattern):
    with pytest.raises(ValueError, match=pattern):
        LLaDAEvalModel(pretrained=NO_FOLDER, device="cpu", **args)


def test_whole_number_model_args_accept_their_usual_spellings():
    for value in (5, "5", " 5 ", 5.0, "5.0"):
        assert _whole_number("n", value) == 5
    for value in (2.5, "2.5", "abc", True, math.inf, math.nan, None, ""):
        with pytest.raises(ValueError, match=rf"n must be a whole number, got {value!r}"):
            _whole_number("n", value)
    lm = LLaDAEvalModel(
        pretrained="tiny-arith", device="cpu", n="3", steps=16.0, seed="7", max_gen_toks="32"
    )
    assert (lm.settings.n, lm.settings.steps, lm.seed, lm.settings.gen_length) == (3, 16, 7, 32)
    assert isinstance(lm.settings.steps, int)


def test_the_results_record_the_steps_the_schedule_really_runs():
    """steps=9 over 2 blocks runs 10 (equal steps per block): the results say 10, not only 9."""
    from lm_eval_dvoting.core.strategies import question_plan
    from lm_eval_dvoting.integration.bookkeeping import resolved_settings as _resolved

    settings = StrategySettings(strategy="majority", gen_length=32, block_length=16, steps=9)
    draw = next(question_plan(settings, mask_id=0, same_answer=None))
    assert {spec.steps for spec in draw} == {10}
    assert _resolved(settings)["steps"] == 9 and _resolved(settings)["steps_run"] == 10
    hex_settings = StrategySettings(strategy="hex", gen_length=64, steps=3)
    assert _resolved(hex_settings)["steps_run"] == [
        32,
        16,
        8,
        4,
        4,
    ]  # >= 1 step per block, equal per block
    assert _resolved(StrategySettings(strategy="dvoting"))["steps_run"] is None


def test_steps_zero_is_no_longer_recorded_as_run():
    """steps=0 used to be accepted, run with one step per block and recorded as 0."""
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        StrategySettings(strategy="single", gen_length=32, steps=0)


def test_max_length_beyond_the_model_is_refused_before_any_forward_pass():
    with pytest.raises(
        ValueError,
        match=r"max_length 100000 exceeds the model's maximum length 256: give max_length <= 256",
    ):
        LLaDAEvalModel(pretrained="tiny-arith", device="cpu", max_length=100_000)


def test_task_max_gen_toks_that_is_not_whole_is_refused():
    lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu", strategy="single")
    request = Instance(
        request_type="generate_until",
        doc={},
        arguments=("1+1=?", {"max_gen_toks": 32.5}),
        idx=0,
        metadata=("probe", 0, 1),
    )
    with pytest.raises(ValueError, match=r"max_gen_toks must be a whole number >= 1, got 32.5"):
        lm.generate_until([request])


def _write_config(folder: Path, config: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_config_that_is_not_an_object_is_refused(tmp_path):
    folder = _write_config(tmp_path / "ckpt", [])
    with pytest.raises(
        CheckpointError,
        match=rf"{folder / 'config.json'} holds a JSON list \(\[\]\), not an object",
    ):
        load_model(folder, device="cpu")


@pytest.mark.parametrize("missing", ["vocab_size", "d_model"])
def test_config_without_a_required_size_is_refused_naming_it(tmp_path, missing):
    folder = _write_random_llada(tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    del config[missing]
    if missing == "vocab_size":
        del config["embedding_size"]  # else it stands in for the vocabulary size
    _write_config(folder, config)
    with pytest.raises(
        CheckpointError, match=rf"config\.json lacks {missing}: a llada config needs .*vocab_size"
    ):
        load_model(folder, device="cpu")


def test_config_with_a_non_numeric_size_is_refused(tmp_path):
    folder = _write_random_llada(tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text()) | {"n_layers": "two"}
    _write_config(folder, config)
    with pytest.raises(
        CheckpointError,
        match=r"config\.json has n_layers='two' \(each must be a whole number >= 1\)",
    ):
        load_model(folder, device="cpu")


@pytest.fixture(scope="module")
def demo_model() -> torch.nn.Module:
    return load_model("tiny-arith", device="cpu")


BAD_IDS = [
    (
        torch.tensor([5, 6, 7]),
        r"input_ids must be 2-D \(batch, length\), got shape \(3,\): for one prompt pass "
        r"input_ids\[None\]",
    ),
    (
        torch.tensor([[5.7, 6.2, 7.0]]),
        r"input_ids must hold integer token ids, got dtype torch.float32",
    ),
    (torch.tensor([[True, False]]), r"input_ids must hold integer token ids, got dtype torch.bool"),
    (torch.tensor([[5, -1, 7]]), r"input_ids must be token ids >= 0, got -1"),
    # the demo's embedding has 104 rows; id 104 used to end in torch's bare IndexError
    (
        torch.tensor([[5, 104, 7]]),
        r"input_ids must be token ids < 104 \(the model's embedding size\), got 104",
    ),
]


@pytest.mark.parametrize(
    "ids, pattern", BAD_IDS, ids=["1-D", "float", "bool", "negative", "too large"]
)
def test_generate_refuses_misreadable_input_ids(demo_model, ids, pattern):
    with pytest.raises(ValueError, match=pattern):
        generate(demo_model, ids, gen_length=4, block_length=2, steps=2)


@pytest.mark.parametrize(
    "ids, pattern", BAD_IDS, ids=["1-D", "float", "bool", "negative", "too large"]
)
def test_run_strategy_refuses_misreadable_input_ids(demo_model, ids, pattern):
    with pytest.raises(ValueError, match=pattern):
        run_strategy(
            demo_model, ids, strategy="single", extract=lambda t: None, gen_length=4, block_length=2
        )


def test_generate_refuses_a_mask_of_another_shape_or_values(demo_model):
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(
        ValueError,
        match=r"attention_mask must be a tensor of input_ids' shape \(1, 3\), got \(1, 2\)",
    ):
        generate(
            demo_model,
            ids,
            torch.ones(1, 2, dtype=torch.long),
            gen_length=4,
            block_length=2,
            steps=2,
        )
    with pytest.raises(ValueError, match="attention_mask must hold only 0"):
        generate(demo_model, ids, torch.tensor([[0, 2, 1]]), gen_length=4, block_length=2, steps=2)


@pytest.mark.parametrize("settings", [{"temperature": math.inf}, {"temperature": math.nan}])
def test_generate_refuses_a_non_finite_temperature(demo_model, settings):
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        generate(
            demo_model, torch.tensor([[5, 6]]), gen_length=4, block_length=2, steps=2, **settings
        )


@pytest.mark.parametrize("max_rows", [0, -1, 2.5])
def test_run_strategy_refuses_max_rows_below_one_instead_of_hanging(demo_model, max_rows):
    def hung(*_: Any) -> None:
        raise TimeoutError(f"run_strategy(max_rows={max_rows}) hung")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)  # today's code loops forever: fail, don't hang the suite
    try:
        with pytest.raises(
            ValueError, match=rf"max_rows must be .*got {max_rows}: give the number of rows"
        ):
            run_strategy(
                demo_model,
                torch.tensor([[5, 6, 7]]),
                strategy="single",
                extract=lambda t: None,
                gen_length=4,
                block_length=2,
                max_rows=max_rows,
            )
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------------- 8. odd text, real CLI

ODD_LOADER = """
import json
from pathlib import Path

import datasets


def load(**kwargs):
    rows = [
        json.loads(line)
        for line in (Path(__file__).parent / "odd.jsonl").read_text().splitlines()
        if line.strip()
    ]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def to_text(doc):
    # a prompt function that emits broken text: JSON's "\\\\ud800" escape decodes to a lone
    # surrogate, which the Arrow-backed dataset itself cannot hold
    question = (
        doc["question"]
        .replace("<lone>", json.loads('"\\\\ud800"'))
        .replace("<low>", json.loads('"\\\\udfff"'))
    )
    return "Please answer the question step by step and put the answer in \\\\boxed{}. " + question
"""

ODD_DOCS = [
    {"question": "lone <lone> surrogate 1+2=?", "target": "3"},
    {"question": "", "target": "0"},  # empty question
    {
        "question": "emoji \U0001f600 and a ZWJ \U0001f468\u200d\U0001f469\u200d\U0001f467 2+2=?",
        "target": "4",
    },
    {
        "question": "\u0645\u0631\u062d\u0628\u0627 3+1=? \u05e9\u05dc\u05d5\u05dd",
        "target": "4",
    },  # RTL
    {"question": "nul \u0000 byte and \ufeff zero-width 1+1=?", "target": "2"},
    {"question": "low <low> surrogate at the end", "target": "1"},
]


def _samples(out: Path) -> list[dict[str, Any]]:
    (samples_file,) = out.rglob("samples_probe_odd_*.jsonl")
    return sorted(
        (json.loads(line) for line in samples_file.read_text(encoding="utf-8").splitlines()),
        key=lambda r: r["doc_id"],
    )


def test_lm_eval_cli_log_samples_over_odd_text_keeps_the_run(tmp_path):
    """`python -m lm_eval ... --log_samples` over prompts with lone surrogates, an empty
    question, emoji, right-to-left text and NUL: the run finishes and writes every sample;
    so does a rerun answered entirely from its `--use_cache` (whose requests never reach
    the model)."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "odd_data.py").write_text(ODD_LOADER)
    (tasks / "odd.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in ODD_DOCS))
    (tasks / "probe_odd.yaml").write_text(
        f"include: {REPO_ROOT / 'task_configs' / 'dvoting_arith.yaml'}\ntask: probe_odd\ntag: []\n"
        "custom_dataset: !function odd_data.load\ndoc_to_text: !function odd_data.to_text\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")

    def lm_eval_run(out: Path) -> subprocess.CompletedProcess:
        command = [
            sys.executable,
            "-m",
            "lm_eval",
            "--model",
            "dvoting-llada",
            "--model_args",
            "pretrained=tiny-arith,strategy=single",
            "--tasks",
            "probe_odd",
            "--include_path",
            str(tasks),
            "--device",
            "cpu",
            "--log_samples",
            "--output_path",
            str(out),
            "--use_cache",
            str(tmp_path / "cache"),
        ]
        run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        return run

    out = tmp_path / "out"
    run = lm_eval_run(out)
    # one warning for the run, naming the affected documents, before the model ran
    assert "2 request(s) hold lone surrogates" in run.stderr  # one warning naming both documents
    assert "task probe_odd, document 0; task probe_odd, document 5" in run.stderr
    records = _samples(out)
    assert [r["doc_id"] for r in records] == list(range(len(ODD_DOCS)))
    prompts = [r["arguments"]["gen_args_0"]["arg_0"] for r in records]
    assert "lone \ufffd surrogate" in prompts[0] and "low \ufffd surrogate" in prompts[5]
    for doc, prompt in zip(
        ODD_DOCS[1:5], prompts[1:5]
    ):  # valid odd text reaches the model as it is
        assert prompt.endswith(doc["question"])
    assert all(len(r["prompt_hash"]) == 64 for r in records)
    (results_file,) = out.rglob("results_*.json")
    results = json.loads(results_file.read_text(encoding="utf-8"))
    assert results["results"]["probe_odd"]["nfe,extract"] == 32
    # the rerun answers every request from the cache and logs the same samples
    lm_eval_run(tmp_path / "again")
    assert [
        (r["arguments"], r["resps"], r["prompt_hash"]) for r in _samples(tmp_path / "again")
    ] == [(r["arguments"], r["resps"], r["prompt_hash"]) for r in records]
