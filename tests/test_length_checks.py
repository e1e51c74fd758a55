"""Generation lengths checked against each family's block rule and the model's length, with
the length each request really uses (issue 38 "LLaDA2's length check", issue 42 items 2-3).

* LLaDA2 decodes in blocks of 32 aligned to the prompt's start: any length runs, and its
  decoding keeps the model card's block of 32 (no advice to change block_length).
* A task's length that leaves no room for a prompt is refused when lm-eval's `evaluate`
  starts, before any request is built or decoded, naming the length, where it comes from
  and the fix (`--gen_kwargs max_gen_toks=N`, or the model arg for a task that sets none).
* The model arg `block_length` is checked against the length each request uses (the
  task's `max_gen_toks` or `--gen_kwargs`), not against the model's default of 256.

Offline on CPU: the shipped demo model `tiny-arith` (LLaDA, maximum length 256) and the
tiny random LLaDA2 folder of conftest, through `lm_eval.simple_evaluate`.
"""

from __future__ import annotations

import logging
import re
import shutil
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import huggingface_hub
import lm_eval
import lm_eval.evaluator
import lm_eval.tasks
import pytest
from conftest import REPO_ROOT
from lm_eval.api.task import ConfigurableTask
from lm_eval.tasks import TaskManager
from test_plugin_hook import run_hooked
from test_task_costs import LOCAL, _stock_task

from lm_eval_dvoting.core.strategies import StrategySettings
from lm_eval_dvoting.integration import harness
from lm_eval_dvoting.integration.harness import LLaDAEvalModel
from lm_eval_dvoting.models import loading
from lm_eval_dvoting.models.loading import PACKAGED_CHECKPOINTS

TASKS = REPO_ROOT / "task_configs"
ARITH = "max_gen_toks {} (task dvoting_arith's generation_kwargs: its YAML or --gen_kwargs)"
OVERRIDES = "(a task's own max_gen_toks overrides the model arg)"
DEMO = "pretrained=tiny-arith,strategy=single"


def _evaluate(
    model: str, model_args: str, tasks: list[str], include: list[Path] = (), **kwargs: Any
) -> dict[str, Any]:
    manager = TaskManager(include_path=[*map(str, include), str(TASKS)], include_defaults=False)
    return lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=tasks,
        limit=1,
        device="cpu",
        log_samples=True,
        task_manager=manager,
        verbosity="ERROR",
        **kwargs,
    )


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tasks whose requests lm-eval built (the names, in order)."""
    names: list[str] = []
    original = ConfigurableTask.build_all_requests

    def build_all_requests(self: ConfigurableTask, *args: Any, **kwargs: Any) -> Any:
        names.append(self.config.task)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ConfigurableTask, "build_all_requests", build_all_requests)
    return names


class _Request:
    """The parts of lm-eval's Instance that generate_until reads."""

    def __init__(
        self, context: str, gen_kwargs: dict[str, Any], task_name: str = "dvoting_arith"
    ) -> None:
        self.args = (context, gen_kwargs)
        self.task_name, self.doc_id = task_name, 0


# ------------------------------------------------------------ issue 38: LLaDA2's block rule


@pytest.mark.parametrize("strategy", ["single", "dvoting"])
def test_llada2_decodes_a_length_no_block_divides(tiny_llada2_dir: Path, strategy: str):
    results = _evaluate(
        "dvoting-llada2",
        f"pretrained={tiny_llada2_dir},strategy={strategy},n=3",
        ["dvoting_arith"],
        gen_kwargs="max_gen_toks=50",
    )
    [used] = results["config"]["dvoting"]["settings_used"]
    # the model card's block of 32, not a block chosen to divide 50
    assert (used["gen_length"], used["block_length"]) == (50, 32)
    [record] = results["samples"]["dvoting_arith"]
    assert all(len(c["tokens"]) == 50 for c in record["dvoting_trace"]["candidates"])


def test_each_family_has_its_own_block_rule():
    llada2 = StrategySettings(gen_length=50, block_decoding="threshold")
    assert llada2.length_problem() is None and llada2.resolved_block_length == 32
    assert replace(llada2, block_length=16).length_problem() is None
    # LLaDA and Dream tile the answer with blocks: the default L/16 = 3 does not divide 50
    assert StrategySettings(gen_length=50, defer_length_checks=True).length_problem() == (
        "the default block length 3 (max_gen_toks/16) does not divide the generation length 50"
    )
    # hex's block sizes L/32..L/2, in every family
    hex_llada2 = replace(llada2, strategy="hex", defer_length_checks=True)
    assert hex_llada2.length_problem() == (
        "hex needs a generation length divisible by 32 (block sizes L/32..L/2), got 50"
    )


def test_llada_length_its_default_block_does_not_divide_is_refused_with_the_fix(built):
    with pytest.raises(ValueError) as refused:
        _evaluate("dvoting-llada", DEMO, ["dvoting_arith"], gen_kwargs="max_gen_toks=50")
    assert str(refused.value) == (
        f"{ARITH.format(50)} cannot be decoded: the default block length 3 (max_gen_toks/16) "
        "does not divide the generation length 50; give the model arg block_length, a divisor of "
        "50 (1, 2, 5, 10, 25, 50), or a max_gen_toks that is a multiple of 16, with --gen_kwargs "
        f"max_gen_toks=N {OVERRIDES}"
    )
    assert built == []


# ------------------------------------------------- issue 42 item 2: room for a prompt, early


def test_a_task_length_without_room_for_a_prompt_is_refused_before_any_request(built):
    # dvoting_gsm8k's 256 on the demo model's 256 positions; here dvoting_arith (no data
    # files needed) asks for the same through --gen_kwargs
    with pytest.raises(ValueError) as refused:
        _evaluate("dvoting-llada", DEMO, ["dvoting_arith"], gen_kwargs="max_gen_toks=256")
    assert str(refused.value) == (
        f"{ARITH.format(256)} leaves no room for a prompt in the model's maximum length of 256 "
        "tokens (prompt plus generation): give a max_gen_toks below 256, e.g. 128, with "
        f"--gen_kwargs max_gen_toks=128 {OVERRIDES}"
    )
    assert built == []  # refused before lm-eval built (or the model decoded) any request


def test_the_issues_dvoting_gsm8k_on_the_demo_model(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, built
):
    """Issue 42's own case, on the real GSM8K files: dvoting_gsm8k's YAML asks for 256."""
    monkeypatch.setenv("DVOTING_DATA_DIR", str(data_dir))
    message = (
        r"^max_gen_toks 256 \(task dvoting_gsm8k's generation_kwargs: .* e\.g\. 128, with "
        r"--gen_kwargs max_gen_toks=128 "
    )
    with pytest.raises(ValueError, match=message):
        _evaluate("dvoting-llada", DEMO, ["dvoting_gsm8k"])
    assert built == []


def test_a_stock_task_without_a_length_names_the_model_arg_too(tmp_path: Path, built):
    """lm-eval's gsm8k_cot_zeroshot gives no max_gen_toks: the model's 256 is what it runs
    with, so both fixes work; a task listed first is not run before the refusal either."""
    folder = _stock_task(tmp_path / "tasks")
    with pytest.raises(ValueError) as refused:
        _evaluate("dvoting-llada", DEMO, ["dvoting_arith", LOCAL], include=[folder])
    assert str(refused.value) == (
        f"max_gen_toks 256 (the model arg max_gen_toks, default 256: task {LOCAL} sets none) "
        "leaves no room for a prompt in the model's maximum length of 256 tokens (prompt plus "
        "generation): give a max_gen_toks below 256, e.g. 128, with --gen_kwargs "
        "max_gen_toks=128 or the model arg max_gen_toks=128"
    )
    assert built == []
    # the fix the message names runs
    results = _evaluate("dvoting-llada", f"{DEMO},max_gen_toks=128", [LOCAL], include=[folder])
    assert [used["gen_length"] for used in results["config"]["dvoting"]["settings_used"]] == [128]


def test_a_request_is_refused_before_any_forward_pass(monkeypatch: pytest.MonkeyPatch):
    """`generate_until` called directly (no `evaluate`): every request is checked before the
    first is decoded; the message names where the limit comes from, and its example length
    fits the block rule too (100 fits neither: the default block 6 does not divide it)."""
    lm = LLaDAEvalModel(pretrained="tiny-arith", strategy="single", max_length=100, device="cpu")
    passes = []
    monkeypatch.setattr(lm.model, "forward", lambda *a, **k: passes.append(1) or 1 / 0)
    good, bad = _Request("1+1=?", {"max_gen_toks": 32}), _Request("1+1=?", {"max_gen_toks": 100})
    message = (
        rf"^{re.escape(ARITH.format(100))} leaves no room for a prompt in the model arg "
        r"max_length of 100 tokens .* e\.g\. 48, with --gen_kwargs max_gen_toks=48"
    )
    with pytest.raises(ValueError, match=message):
        lm.generate_until([good, bad])
    assert passes == []


# --------------------------------------- issue 42 item 3: the block length and the task's length


def test_block_length_is_checked_against_the_task_length_and_names_it(built):
    with pytest.raises(ValueError) as refused:
        _evaluate("dvoting-llada", f"{DEMO},block_length=5", ["dvoting_arith"])
    assert str(refused.value) == (
        f"{ARITH.format(32)} cannot be decoded: block_length 5 does not divide the generation "
        "length 32; give block_length a divisor of 32 (1, 2, 4, 8, 16, 32), or a max_gen_toks "
        f"that is a multiple of 5, with --gen_kwargs max_gen_toks=N {OVERRIDES}"
    )
    assert built == []


def test_block_length_that_divides_the_gen_kwargs_length_runs_without_the_model_arg():
    results = _evaluate(
        "dvoting-llada", f"{DEMO},block_length=24", ["dvoting_arith"], gen_kwargs="max_gen_toks=48"
    )
    info = results["config"]["dvoting"]
    [used] = info["settings_used"]
    assert (used["gen_length"], used["block_length"], used["steps_run"]) == (48, 24, 48)
    assert info["settings"]["gen_length"] == 256  # the model arg's default, which no request used


def test_the_model_length_is_checked_for_requests_that_give_none():
    lm = LLaDAEvalModel(
        pretrained="tiny-arith", strategy="single", block_length=24, max_gen_toks=40, device="cpu"
    )
    message = (
        r"^max_gen_toks 40 \(the model arg max_gen_toks, default 256: task dvoting_arith "
        r"sets none\) cannot be decoded: block_length 24 does not divide the generation "
        r"length 40; .* with --gen_kwargs max_gen_toks=N or the model arg max_gen_toks=N$"
    )
    with pytest.raises(ValueError, match=message):
        lm.generate_until([_Request("1+1=?", {})])
    # a task's own length replaces it; `use_strategy` waits for it too
    lm.use_strategy("single", block_length=16)
    (text,) = lm.generate_until([_Request("1+1=?", {"max_gen_toks": 32})])
    assert text.settings["gen_length"] == 32 and text.settings["block_length"] == 16


def test_deferred_length_checks_are_not_a_setting():
    deferred = StrategySettings(block_length=5, defer_length_checks=True)  # 5 does not divide 256
    # not stored, compared, reported or fingerprinted (asdict is what settings_used and the
    # result cache's fingerprint are made of)
    assert "defer_length_checks" not in asdict(deferred) and "defer" not in repr(deferred)
    assert deferred == replace(
        StrategySettings(block_length=5, gen_length=40), gen_length=256, defer_length_checks=True
    )
    # a copy with another setting is checked in full again
    refusal = "^block_length 5 does not divide the generation length 256; choose a block length"
    with pytest.raises(ValueError, match=refusal):
        replace(deferred, n=3)
    assert replace(deferred, gen_length=40).gen_length == 40


# ---------------------------- issue 42 item 2: before the weights are read (simple_evaluate, CLI)

NO_ROOM = (
    f"{ARITH.format(256)} leaves no room for a prompt in the model's maximum length of 256 "
    "tokens (prompt plus generation): give a max_gen_toks below 256, e.g. 128, with "
    f"--gen_kwargs max_gen_toks=128 {OVERRIDES}"
)


class _Reached(Exception):
    """Raised by a stand-in for model work: the run got that far."""


@pytest.fixture
def weights_read(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The checkpoints whose weights the harness started to read (none are: it raises)."""
    read: list[str] = []

    def load_model(folder: Any, *args: Any, **kwargs: Any) -> Any:
        read.append(str(folder))
        raise _Reached(f"weights of {folder} read")

    monkeypatch.setattr(harness, "load_model", load_model)
    return read


def test_a_task_too_long_is_refused_before_the_weights_are_read(weights_read):
    with pytest.raises(ValueError) as refused:
        _evaluate("dvoting-llada", DEMO, ["dvoting_arith"], gen_kwargs="max_gen_toks=256")
    assert str(refused.value) == NO_ROOM
    assert weights_read == []


def test_a_cached_hub_config_is_read_without_the_network(
    tmp_path: Path, weights_read, monkeypatch: pytest.MonkeyPatch
):
    """A hub id (an 8B model's case) whose config.json is in the local hub cache: refused
    before its weights, and before anything is fetched."""
    snapshot = tmp_path / "models--someone--tiny" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    shutil.copy(PACKAGED_CHECKPOINTS["tiny-arith"] / "config.json", snapshot)
    (tmp_path / "models--someone--tiny" / "refs").mkdir()
    (tmp_path / "models--someone--tiny" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    fetched = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: fetched.append(a))
    with pytest.raises(ValueError) as refused:
        _evaluate(
            "dvoting-llada",
            "pretrained=someone/tiny,strategy=single",
            ["dvoting_arith"],
            gen_kwargs="max_gen_toks=256",
        )
    assert str(refused.value) == NO_ROOM
    assert (weights_read, fetched) == ([], [])


def test_an_unknown_maximum_skips_the_early_check_silently(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog
):
    """A hub id whose config is not cached: nothing is fetched for the check, nothing is
    said, and the run goes on to build the model (which would fetch it, then check)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    fetched = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: fetched.append(a))

    def resolve_checkpoint(name: Any, *args: Any, **kwargs: Any) -> Any:
        raise _Reached(f"building the model of {name}")

    monkeypatch.setattr(harness, "resolve_checkpoint", resolve_checkpoint)
    with caplog.at_level(logging.INFO, logger="lm_eval_dvoting"):
        with pytest.raises(_Reached, match="building the model of someone/not-cached"):
            _evaluate(
                "dvoting-llada",
                "pretrained=someone/not-cached,strategy=single",
                ["dvoting_arith"],
                gen_kwargs="max_gen_toks=256",
            )
    assert fetched == []
    assert [r.getMessage() for r in caplog.records if r.name.startswith("lm_eval_dvoting")] == []


def test_without_a_task_manager_the_index_is_read_once(
    monkeypatch: pytest.MonkeyPatch, weights_read
):
    """`simple_evaluate(model=..., model_args=..., tasks=[...])`: the task manager the
    check reads is the one the run uses (lm-eval's own folder left out here, for speed)."""
    built_managers = []

    class OursOnly(TaskManager):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built_managers.append(kwargs)
            super().__init__(*args, **{**kwargs, "include_defaults": False})

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", OursOnly)
    monkeypatch.setattr(lm_eval.evaluator, "TaskManager", OursOnly)
    with pytest.raises(ValueError, match=re.escape(NO_ROOM)):
        lm_eval.simple_evaluate(
            model="dvoting-llada",
            model_args=DEMO,
            tasks=["dvoting_arith"],
            gen_kwargs={"max_gen_toks": 256},
            device="cpu",
            limit=1,
        )
    assert weights_read == []
    # a run that fits goes on with that manager: built once, with simple_evaluate's metadata
    built_managers.clear()
    monkeypatch.setattr(harness, "load_model", loading.load_model)
    results = lm_eval.simple_evaluate(
        model="dvoting-llada", model_args=DEMO, tasks=["dvoting_arith"], device="cpu", limit=1
    )
    assert list(results["results"]) == ["dvoting_arith"]
    assert built_managers == [{"metadata": {"pretrained": "tiny-arith", "strategy": "single"}}]


def test_a_model_instance_keeps_the_check_when_evaluate_starts(
    monkeypatch: pytest.MonkeyPatch, built
):
    lm = LLaDAEvalModel(pretrained="tiny-arith", strategy="single", device="cpu")
    monkeypatch.setattr(
        LLaDAEvalModel, "max_length_before_loading", classmethod(lambda cls, args: 1 / 0)
    )  # never asked for an instance
    manager = TaskManager(include_path=str(TASKS), include_defaults=False)
    with pytest.raises(ValueError, match=re.escape(NO_ROOM)):
        lm_eval.simple_evaluate(
            model=lm,
            tasks=["dvoting_arith"],
            task_manager=manager,
            gen_kwargs="max_gen_toks=256",
            limit=1,
        )
    assert built == []


def test_the_cli_refuses_before_the_weights_are_read():
    """`lm_eval --model dvoting-llada ...` in a fresh interpreter: the start-up hook's patch of
    `simple_evaluate` is the one the CLI calls; the weights' loader records any call."""
    out = run_hooked("""
        import sys
        import lm_eval_dvoting.models.loading as loading
        def load_model(*args, **kwargs):
            print("WEIGHTS READ")
            raise SystemExit(3)
        loading.load_model = load_model
        sys.argv = ["lm_eval", "--model", "dvoting-llada", "--model_args",
                    "pretrained=tiny-arith,strategy=single", "--tasks", "dvoting_arith",
                    "--gen_kwargs", "max_gen_toks=256", "--device", "cpu", "--limit", "1"]
        from lm_eval.__main__ import cli_evaluate
        try:
            cli_evaluate()
        except ValueError as err:
            print("REFUSED:", err)
    """)
    assert out.strip().splitlines()[-1] == f"REFUSED: {NO_ROOM}"
    assert "WEIGHTS READ" not in out
