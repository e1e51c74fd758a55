"""lm-eval's run controls and HFLM's habits (issue 26; issue 17 items 9 and 10).

* `--seed` (lm-eval's torch seed) is the sampling seed unless the model arg `seed` is
  given; a run with no harness seed repeats exactly; the seed used is recorded.
* a task's or `--gen_kwargs`' `temperature`/`do_sample` that the strategy does not use is
  reported once per run.
* HFLM's model args (`trust_remote_code`, `revision`, `subfolder`, `use_fast_tokenizer`,
  `add_bos_token`, `parallelize`, `peft`, `delta`) are honoured or refused by name; an
  unknown arg's message names the closest accepted one.
* `revision=` picks the right snapshot of a hub cache laid out here, read offline.
* a hub load fetches data files only; `demo/train.py` resumes with `weights_only=True`.
* `device=` in the model args works beside lm-eval's default `--device cuda:0` (real CLI
  and `dvoting compare`); without a GPU the default is the CPU, silently.

Runs use the shipped demo model `pretrained=tiny-arith` on a few documents of the demo
task `dvoting_arith`.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import lm_eval
import pytest
import torch
from conftest import REPO_ROOT, _write_random_llada
from lm_eval.tasks import TaskManager

from lm_eval_dvoting.integration import harness
from lm_eval_dvoting.integration.harness import LLaDAEvalModel
from lm_eval_dvoting.models import loading

TASKS = REPO_ROOT / "task_configs"
LIMIT = 6


def _evaluate(model_args: str, limit: int = LIMIT, **kwargs: Any) -> dict[str, Any]:
    """`lm_eval --model dvoting-llada --model_args pretrained=tiny-arith,... --log_samples`."""
    manager = TaskManager(include_path=str(TASKS), include_defaults=False)  # our tasks only: fast
    return lm_eval.simple_evaluate(
        model="dvoting-llada",
        model_args=f"pretrained=tiny-arith,{model_args}".rstrip(","),
        tasks=["dvoting_arith"],
        limit=limit,
        device="cpu",
        log_samples=True,
        task_manager=manager,
        verbosity="ERROR",
        **kwargs,
    )


def _responses(results: dict[str, Any]) -> list[Any]:
    return [
        rec["resps"]
        for rec in sorted(results["samples"]["dvoting_arith"], key=lambda r: r["doc_id"])
    ]


def _traces(results: dict[str, Any]) -> list[Any]:
    return [
        rec["dvoting_trace"]
        for rec in sorted(results["samples"]["dvoting_arith"], key=lambda r: r["doc_id"])
    ]


# ------------------------------------------------------------------- --seed


@pytest.mark.parametrize("strategy", ["majority", "hex", "dvoting"])
def test_harness_seed_changes_the_samples_of_voting_strategies(strategy):
    """`--seed 1` and `--seed 2` (lm-eval's torch seed) draw different samples; `--seed 1`
    twice draws the same ones, and the results record the seed and where it came from."""
    args = f"strategy={strategy}"  # hex: 25 samples at temperature 0.9 (hex_samples=5 is greedy)
    limit = {"hex": 1, "majority": 2}.get(strategy, 4)  # enough samples to differ, kept quick
    one = _evaluate(args, limit=limit, torch_random_seed=1)
    again = _evaluate(args, limit=limit, torch_random_seed=1)
    two = _evaluate(args, limit=limit, torch_random_seed=2)
    assert _traces(one) == _traces(again) and one["results"] == again["results"]
    assert _traces(one) != _traces(
        two
    )  # every sample of every question: sampled at temperature > 0
    info = one["config"]["dvoting"]
    assert (info["seed"], info["seed_source"]) == (1, "lm-eval --seed")
    assert two["config"]["dvoting"]["seed"] == 2
    assert all(used["seed"] == 1 for used in info["settings_used"])


def test_harness_seed_leaves_greedy_single_unchanged():
    one = _evaluate("strategy=single", torch_random_seed=1)
    two = _evaluate("strategy=single", torch_random_seed=2)
    assert _traces(one) == _traces(two)


def test_model_arg_seed_wins_over_the_harness_seed():
    """The model arg `seed=7` under `--seed 1` or `--seed 2` samples as `--seed 7` alone does."""
    under_one = _evaluate("strategy=dvoting,seed=7", torch_random_seed=1)
    under_two = _evaluate("strategy=dvoting,seed=7", torch_random_seed=2)
    harness_seven = _evaluate("strategy=dvoting", torch_random_seed=7)
    assert _traces(under_one) == _traces(under_two) == _traces(harness_seven)
    info = under_one["config"]["dvoting"]
    assert (info["seed"], info["seed_source"]) == (7, "model_args")


def test_batch_size_does_not_change_results_under_a_harness_seed():
    small = _evaluate("strategy=dvoting", torch_random_seed=5, batch_size=1)
    large = _evaluate("strategy=dvoting", torch_random_seed=5, batch_size=16)
    assert _traces(small) == _traces(large)
    assert small["results"] == large["results"]


def test_no_harness_seed_is_deterministic():
    """`simple_evaluate(torch_random_seed=None)` leaves torch unseeded (its initial seed is then
    whatever came before, random per process): the run still samples with the default seed."""
    torch.manual_seed(99)  # a torch seed that lm-eval did not set must not leak into the sampling
    first = _evaluate("strategy=dvoting", torch_random_seed=None)
    torch.manual_seed(3)
    second = _evaluate("strategy=dvoting", torch_random_seed=None)
    default = _evaluate("strategy=dvoting")  # lm-eval's default torch seed is 1234 too
    assert _traces(first) == _traces(second) == _traces(default)
    assert (first["config"]["dvoting"]["seed"], first["config"]["dvoting"]["seed_source"]) == (
        1234,
        "default",
    )
    # a model built directly in Python: the same default, whatever torch's seed
    torch.manual_seed(42)
    assert LLaDAEvalModel(pretrained="tiny-arith", device="cpu").seed == 1234


# -------------------------------------------------------- ignored temperature


def _unused_sampling_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "lm_eval_dvoting.integration.harness"
        and r.levelno == logging.WARNING
        and "are not used" in r.getMessage()
    ]


@pytest.mark.parametrize("strategy", ["dvoting", "single"])
def test_an_unused_temperature_is_reported_once_per_run(strategy, caplog):
    caplog.set_level(logging.INFO, logger="lm_eval_dvoting.integration.harness")
    _evaluate(f"strategy={strategy}", gen_kwargs="temperature=0.1")
    [message] = _unused_sampling_warnings(caplog)  # one, not one per request
    assert "0.1" in message and f"strategy={strategy}" in message
    assert "model arg temperature" in message


def test_a_used_or_greedy_request_is_not_warned_about(caplog):
    caplog.set_level(logging.INFO, logger="lm_eval_dvoting.integration.harness")
    _evaluate("strategy=single", gen_kwargs="do_sample=true,temperature=0.5")  # used by single
    _evaluate("strategy=dvoting")  # the task's do_sample: false, the default of every task
    assert _unused_sampling_warnings(caplog) == []


# ------------------------------------------------------------ HFLM's model args


@pytest.mark.parametrize(
    "arg, says",
    [
        (
            "max_memory_per_gpu=10GiB",
            "applies with parallelize=True only",
        ),  # parallelize: tests/test_parallelize.py
        ("offload_folder=./offload", "offloading to disk is not supported"),
        (
            "peft=/no/such/adapter",
            "peft='/no/such/adapter': no such folder; give a folder holding adapter_config.json",
        ),
        ("delta=some/delta", "delta weights are not supported"),
        ("use_fast_tokenizer=False", "only fast"),
        ("add_bos_token=True", "has no BOS token"),  # tiny-arith's tokenizer has none
        ("revision=v2", "applies to hub ids only"),
        ("subfolder=llada", "applies to hub ids only"),
        ("stpes=8", "did you mean 'steps'"),
    ],
)
def test_hflm_args_are_refused_by_name_before_the_model_loads(arg, says, monkeypatch):
    def no_model(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model was loaded before the bad argument was refused")

    monkeypatch.setattr(harness, "load_model", no_model)
    with pytest.raises(ValueError) as refused:
        LLaDAEvalModel.create_from_arg_string(f"pretrained=tiny-arith,{arg}", {"device": "cpu"})
    message = str(refused.value)
    assert says in message and arg.split("=")[0] in message
    assert "accepted model args are" not in message or arg.startswith("stpes")


def test_hflm_defaults_are_accepted():
    lm = LLaDAEvalModel.create_from_arg_string(
        "pretrained=tiny-arith,parallelize=False,trust_remote_code=False,use_fast_tokenizer=True,add_bos_token=False",
        {"device": "cpu"},
    )
    assert lm.revision is None and lm.tok_encode("1+2") == lm.tokenizer.encode(
        "1+2", add_special_tokens=False
    )


def test_add_bos_token_prepends_the_tokenizers_bos(tmp_path):
    from transformers import AutoTokenizer

    folder = _write_random_llada(tmp_path / "ckpt")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.add_special_tokens({"bos_token": "<|startoftext|>"})
    tokenizer.save_pretrained(str(folder))
    with_bos = LLaDAEvalModel(pretrained=str(folder), add_bos_token=True, device="cpu")
    without = LLaDAEvalModel(pretrained=str(folder), device="cpu")
    bos = with_bos.tokenizer.bos_token_id
    assert with_bos.tok_encode("1+2") == [bos, *without.tok_encode("1+2")]
    assert with_bos.tok_encode("<|startoftext|>1+2") == with_bos.tok_encode("1+2")  # never doubled
    assert with_bos.tok_encode("1+2", add_special_tokens=False)[0] != bos  # the caller decides


# ------------------------------------------------------- revision= from a hub cache


def _hub_cache(root: Path) -> dict[str, Path]:
    """A hub cache as `snapshot_download` leaves it: `org/tiny` with two revisions (refs/main
    and refs/v2, different weights) and a third (refs/nested) holding the checkpoint in a
    subfolder."""
    repo = root / "models--org--tiny"
    snapshots = {}
    for ref, commit, seed, sub in (
        ("main", "a" * 40, 0, ""),
        ("v2", "b" * 40, 1, ""),
        ("nested", "c" * 40, 2, "llada"),
    ):
        folder = repo / "snapshots" / commit
        _write_random_llada(folder / sub if sub else folder, seed=seed)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
        snapshots[ref] = folder / sub if sub else folder
    return snapshots


@pytest.fixture
def offline_hub(tmp_path, monkeypatch) -> dict[str, Path]:
    import huggingface_hub.constants as hub

    snapshots = _hub_cache(tmp_path / "hub")
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    return snapshots


def _logits(lm: LLaDAEvalModel) -> torch.Tensor:
    with torch.no_grad():
        return lm.model(torch.arange(8).unsqueeze(0))


def test_revision_picks_the_snapshot_of_that_revision(offline_hub):
    main = LLaDAEvalModel(pretrained="org/tiny", device="cpu")
    v2 = LLaDAEvalModel(pretrained="org/tiny", revision="v2", device="cpu")
    by_commit = LLaDAEvalModel(pretrained="org/tiny", revision="b" * 40, device="cpu")
    assert Path(main.model.source) == offline_hub["main"] and main.revision == "a" * 40
    assert Path(v2.model.source) == offline_hub["v2"] and v2.revision == "b" * 40
    # weights, config and tokenizer all from the v2 snapshot
    assert Path(v2.tokenizer.name_or_path) == offline_hub["v2"]
    assert not torch.equal(_logits(main), _logits(v2))
    assert torch.equal(_logits(v2), _logits(by_commit))
    info = v2.get_model_info()["dvoting"]
    assert info["revision"] == "b" * 40 and info["pretrained"] == "org/tiny"


def test_subfolder_reads_inside_the_hub_snapshot(offline_hub):
    lm = LLaDAEvalModel(pretrained="org/tiny", revision="nested", subfolder="llada", device="cpu")
    assert Path(lm.model.source) == offline_hub["nested"] and lm.revision == "c" * 40
    assert lm.get_model_info()["dvoting"]["subfolder"] == "llada"


def test_an_unknown_revision_is_a_clear_error(offline_hub):
    with pytest.raises(loading.CheckpointError, match="'org/tiny' at revision 'v9'"):
        LLaDAEvalModel(pretrained="org/tiny", revision="v9", device="cpu")


def test_hub_loads_fetch_data_files_only():
    from huggingface_hub.utils import filter_repo_objects

    repo = [
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        "special_tokens_map.json",
        "vocab.json",
        "merges.txt",
        "added_tokens.json",
        "chat_template.jinja",
        # code and other files a model repo holds
        "tokenization_dream.py",
        "tokenizer_dream.py",
        "tokenizer.py",
        "modeling_llada.py",
        "configuration_llada.py",
        "generation_utils.py",
        "pytorch_model.bin",
        "README.md",
    ]
    fetched = set(filter_repo_objects(repo, allow_patterns=loading.hub_patterns()))
    assert fetched == set(repo[:12])
    assert set(
        filter_repo_objects(
            [f"llada/{f}" for f in repo], allow_patterns=loading.hub_patterns("llada")
        )
    ) == {f"llada/{f}" for f in repo[:12]}


# --------------------------------------------------------------- demo training


class _Trap:
    """Unpickling this runs code (here: writes a marker file), as a tampered checkpoint could."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "code ran"))


MICRO = [
    "--d-model",
    "16",
    "--n-layers",
    "1",
    "--n-heads",
    "2",
    "--mlp",
    "32",
    "--batch-size",
    "8",
    "--steps",
    "4",
    "--warmup",
    "2",
    "--eval-every",
    "1000",
    "--eval-size",
    "8",
    "--ckpt-every",
    "2",
]


def test_training_resume_reads_the_state_weights_only(tmp_path):
    from lm_eval_dvoting.demo import train

    train.main(["--out", str(tmp_path / "run"), *MICRO, "--max-minutes", "0"])  # stops after step 1
    state = torch.load(tmp_path / "run" / "last.pt", weights_only=True)  # the state is weights-only
    assert state["step"] == 1
    assert train.main(["--out", str(tmp_path / "run"), *MICRO])["step"] == 4  # and resumes
    # a last.pt carrying a Python object is refused, and its code never runs
    marker = tmp_path / "ran.txt"
    state["extra"] = _Trap(marker)
    torch.save(state, tmp_path / "run" / "last.pt")
    with pytest.raises(SystemExit, match="last.pt holds more than tensors"):
        train.main(["--out", str(tmp_path / "run"), *MICRO, "--steps", "6"])
    assert not marker.exists()


# ----------------------------------------------------------------------- device


def _cli(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model_args: str, *flags: str
) -> dict[str, Any]:
    """`lm_eval --model dvoting-llada --model_args ... --tasks dvoting_arith --limit 2 FLAGS`,
    in this process (lm-eval's own entry point); the results json it wrote."""
    from lm_eval.__main__ import cli_evaluate

    out = tmp_path / "out"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "lm_eval",
            "--model",
            "dvoting-llada",
            "--model_args",
            model_args,
            "--tasks",
            "dvoting_arith",
            "--include_path",
            str(TASKS),
            "--limit",
            "2",
            "--output_path",
            str(out),
            *flags,
        ],
    )
    cli_evaluate()
    [written] = out.rglob("results_*.json")
    return json.loads(written.read_text())


def _no_cuda_warnings(record: list[warnings.WarningMessage]) -> bool:
    return not any("CUDA" in str(w.message) for w in record)


def test_the_real_cli_takes_model_arg_device_and_trust_remote_code(tmp_path, monkeypatch, caplog):
    """`lm_eval --model_args ...,device=cpu --trust_remote_code` (one run: indexing lm-eval's
    stock tasks costs seconds). lm-eval adds its default `device="cuda:0"` beside the model
    arg, which used to end in "got multiple values for keyword argument 'device'", and
    `trust_remote_code=True`, which used to be an unknown model arg; the run works, says once
    that no downloaded code runs, and records the device it used."""
    import datasets

    # lm-eval's --trust_remote_code also sets this global of `datasets`; undo it afterwards
    monkeypatch.setattr(
        datasets.config,
        "HF_DATASETS_TRUST_REMOTE_CODE",
        getattr(datasets.config, "HF_DATASETS_TRUST_REMOTE_CODE", False),
        raising=False,
    )
    caplog.set_level(logging.WARNING, logger="lm_eval_dvoting.integration.harness")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        results = _cli(
            monkeypatch,
            tmp_path,
            "pretrained=tiny-arith,strategy=single,device=cpu",
            "--trust_remote_code",
        )
    assert results["n-samples"]["dvoting_arith"]["effective"] == 2  # both documents were scored
    assert results["results"]["dvoting_arith"]["nfe,extract"] > 0
    assert results["config"]["dvoting"]["device"] == "cpu" and _no_cuda_warnings(record)
    notes = [r.getMessage() for r in caplog.records if "trust_remote_code" in r.getMessage()]
    assert len(notes) == 1 and "no downloaded code" in notes[0]


@pytest.mark.parametrize(
    "argv, run_device, model_device, used",
    [
        ([], "cuda:0", "cpu", "cpu"),  # lm-eval's default beside a model arg: the model arg
        (["--device", "cpu"], "cpu", "cpu", "cpu"),  # the same in both places
        (
            [],
            "cuda:0",
            None,
            "cuda" if torch.cuda.is_available() else "cpu",
        ),  # lm-eval's default alone
    ],
)
def test_lm_evals_device_beside_the_model_arg(argv, run_device, model_device, used, monkeypatch):
    """What lm-eval's CLI calls (`create_from_arg_obj(model_args, {"device": ..., ...})`)."""
    monkeypatch.setattr(sys, "argv", ["lm_eval", "--model", "dvoting-llada", *argv])
    args = {"pretrained": "tiny-arith"} | ({"device": model_device} if model_device else {})
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        lm = LLaDAEvalModel.create_from_arg_obj(
            args, {"device": run_device, "batch_size": 1, "max_batch_size": None}
        )
    assert lm.get_model_info()["dvoting"]["device"] == used and _no_cuda_warnings(record)


@pytest.mark.parametrize(
    "argv, run_args, model_args, says",
    [
        (
            ["--device", "cuda:0"],
            {"device": "cuda:0"},
            {"device": "cpu"},
            "device='cpu' in --model_args conflicts with --device cuda:0",
        ),
        (
            [],
            {"device": "cuda:1"},
            {"device": "cpu"},
            "conflicts with --device cuda:1",
        ),  # Python API: always explicit
        (
            ["-b", "4"],
            {"batch_size": "4"},
            {"batch_size": 8},
            "batch_size=8 in --model_args conflicts with --batch_size 4",
        ),
    ],
)
def test_two_different_explicit_values_are_refused(argv, run_args, model_args, says, monkeypatch):
    def no_model(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model was loaded before the clash was refused")

    monkeypatch.setattr(harness, "load_model", no_model)
    monkeypatch.setattr(sys, "argv", ["lm_eval", *argv])
    with pytest.raises(ValueError, match=re.escape(says)):
        LLaDAEvalModel.create_from_arg_obj({"pretrained": "tiny-arith", **model_args}, run_args)


def test_model_arg_batch_size_beside_lm_evals_default(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["lm_eval"])
    lm = LLaDAEvalModel.create_from_arg_obj(
        {"pretrained": "tiny-arith", "batch_size": 8}, {"batch_size": 1, "device": "cpu"}
    )
    assert lm.batch_rows == 8


def test_model_arg_device_works_with_compare(tmp_path):
    from lm_eval_dvoting.commands import compare

    common = [
        "--tasks",
        "dvoting_arith",
        "--strategies",
        "single",
        "--limit",
        "2",
        "--out",
        str(tmp_path),
    ]
    assert (
        compare.main(["--model_args", "pretrained=tiny-arith,device=cpu,batch_size=4", *common])
        == 0
    )
    rows = json.loads((tmp_path / "compare.json").read_text())["rows"]
    assert rows[0]["questions"] == 2
    with pytest.raises(
        SystemExit, match="device='cpu' in --model_args conflicts with --device cuda"
    ):
        compare.main(
            ["--model_args", "pretrained=tiny-arith,device=cpu", "--device", "cuda", *common]
        )


def test_a_device_that_data_parallel_would_not_honour_is_refused(monkeypatch):
    """Under torchrun/accelerate each rank runs where accelerate puts it: a different device
    asked for (e.g. --device cuda on CPU ranks, or cpu on GPU ranks) is refused, not ignored."""
    import accelerate

    class OneOfTwoCpuRanks:
        device, process_index, num_processes = torch.device("cpu"), 0, 2

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(accelerate, "Accelerator", OneOfTwoCpuRanks)
    with pytest.raises(
        ValueError, match=r"device 'cuda:1' was asked for, but under torchrun/accelerate .* \(cpu\)"
    ):
        LLaDAEvalModel(pretrained="tiny-arith", device="cuda:1")
    lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu")  # the same device: fine
    assert (lm.device.type, lm.world_size) == ("cpu", 2)
