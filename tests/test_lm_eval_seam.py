"""The lm-eval seam: every hook point is where lm-eval 0.4.13 has it, and a moved one is refused
with a message naming the hook, the lm-eval version found and the version pinned.

The first tests read the installed lm-eval (a newer lm-eval that moved a hook point fails
them by name); the others plant a moved hook point (an attribute taken away, a parameter
renamed) and check the refusal, so that no patch is ever silently left out.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import re
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from conftest import REPO_ROOT

from lm_eval_dvoting.integration import lm_eval_seam, plugin, strict_json, task_costs
from lm_eval_dvoting.integration.lm_eval_seam import HOOKS, LmEvalHookMoved

# ---- every hook point is in the installed lm-eval, as pinned --------------------------------


def test_the_installed_lm_eval_is_the_pinned_one() -> None:
    assert lm_eval_seam.lm_eval_version() == lm_eval_seam.PINNED_VERSION == "0.4.13"


@pytest.mark.parametrize("key", sorted(HOOKS))
def test_hook_point_exists_with_the_parameters_relied_on(key: str) -> None:
    hook = HOOKS[key]
    owner, target = lm_eval_seam.resolve(key)
    parameters = inspect.signature(target).parameters
    for name in hook.params:
        assert name in parameters, f"{hook.name} lost its parameter {name}"
    assert getattr(owner, hook.attr) == target  # (a bound method is made anew each time)


def test_simple_evaluate_seeds_torch_before_it_builds_the_model() -> None:
    """`simple_evaluate_torch_seed` reads the seed `simple_evaluate` set before `get_model`."""
    _, simple_evaluate = lm_eval_seam.resolve("simple_evaluate_seed")
    source = inspect.getsource(inspect.unwrap(simple_evaluate))
    seeded = source.index("set_torch_seed(torch_random_seed)")
    assert seeded < source.index(".get_model(model)")


def test_caching_lm_hands_its_hook_from_its_init(tmp_path: Path) -> None:
    """lm-eval's `CachingLM.__init__` calls `set_cache_hook`, so the stack walk finds it; the
    request types it serves from `__getattr__` are answered by instance attributes."""
    from lm_eval.api.model import CachingLM

    class Model:
        found: Any = None

        def set_cache_hook(self, hook: Any) -> None:
            Model.found = lm_eval_seam.calling_caching_lm(self, hook)

    model = Model()
    caching = CachingLM(model, str(tmp_path / "cache.db"))
    assert Model.found is caching
    assert lm_eval_seam.calling_caching_lm(model, SimpleNamespace(dbdict=caching.dbdict)) is None

    def answer(requests: list[Any]) -> list[str]:
        return ["ours"] * len(requests)

    lm_eval_seam.answer_for_caching_lm(caching, {"generate_until": answer})
    assert caching.generate_until([1, 2]) == ["ours", "ours"]
    caching.dbdict.close()


def test_seed_is_read_from_simple_evaluates_frame_only() -> None:
    namespace: dict[str, Any] = {"__name__": "lm_eval.evaluator", "seam": lm_eval_seam}
    exec(
        "def simple_evaluate(torch_random_seed):\n    return seam.simple_evaluate_torch_seed()\n",
        namespace,
    )
    assert namespace["simple_evaluate"](77) == 77
    assert namespace["simple_evaluate"](None) is None
    assert lm_eval_seam.simple_evaluate_torch_seed() is None  # not inside simple_evaluate
    elsewhere: dict[str, Any] = {"__name__": "my_code", "seam": lm_eval_seam}
    exec(
        "def simple_evaluate(torch_random_seed):\n    return seam.simple_evaluate_torch_seed()\n",
        elsewhere,
    )
    assert elsewhere["simple_evaluate"](77) is None  # a function of the same name elsewhere


def test_cli_defaults_are_lm_evals() -> None:
    """What lm-eval's CLI hands every model when `--device`/`--batch_size` are not typed, and
    the spellings its parser takes for them."""
    from lm_eval._cli.harness import HarnessCLI
    from lm_eval.config.evaluate_config import EvaluatorConfig

    defaults = {field.name: field.default for field in dataclasses.fields(EvaluatorConfig)}
    parser = HarnessCLI()._parser
    for key, (default, flags) in lm_eval_seam.CLI_DEFAULTS.items():
        assert defaults[key] == default, key
        for flag in flags:
            parsed = parser.parse_args(["run", "--model", "hf", flag, "7"])
            assert str(getattr(parsed, key)) == "7", flag


def test_startup_hook_watches_the_seams_modules() -> None:
    import _lm_eval_dvoting_startup as startup

    assert tuple(startup._WATCHED) == lm_eval_seam.STARTUP_MODULES
    modules = {hook.module for hook in HOOKS.values()}
    assert set(lm_eval_seam.STARTUP_MODULES) <= modules


def test_no_other_module_walks_the_stack() -> None:
    """Frames are read in the seam only (the plugin's patches are checked by `patch`)."""
    walk = re.compile(r"_getframe|inspect\.stack|\.f_back|\.f_locals")
    package = REPO_ROOT / "lm_eval_dvoting"
    found = [
        str(path.relative_to(REPO_ROOT))
        for path in package.rglob("*.py")
        if path.name != "lm_eval_seam.py" and walk.search(path.read_text())
    ]
    assert found == []


# ---- a moved hook point is refused clearly --------------------------------------------------


def _message(hook_name: str, problem: str) -> str:
    return (
        rf"lm-eval's {re.escape(hook_name)} {problem} in the installed lm-eval 0\.4\.13; the "
        r"plugin .+ there and is pinned to lm-eval 0\.4\.13: install lm-eval==0\.4\.13"
    )


@pytest.mark.parametrize("key", sorted(HOOKS))
def test_a_missing_hook_point_is_refused_by_name(key: str) -> None:
    hook = HOOKS[key]
    empty = ModuleType(hook.module)
    if hook.owner is not None:
        setattr(empty, hook.owner, type(hook.owner, (), {}))
    # (a class without its own `__init__` has object's, which lacks the parameters)
    problem = "has no parameter .+" if hook.attr == "__init__" else "does not exist"
    with pytest.raises(LmEvalHookMoved, match=_message(hook.name, problem)):
        lm_eval_seam.resolve(key, empty)


@pytest.mark.parametrize("key", sorted(k for k, hook in HOOKS.items() if hook.params))
def test_a_hook_point_without_a_parameter_is_refused_by_name(key: str) -> None:
    hook = HOOKS[key]
    lost = hook.params[-1]
    module = ModuleType(hook.module)

    def target(*_args: Any, **_kwargs: Any) -> None:
        return None

    kept = [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY) for p in hook.params[:-1]]
    target.__signature__ = inspect.Signature(kept)  # type: ignore[attr-defined]
    owner = module if hook.owner is None else type(hook.owner, (), {hook.attr: target})
    if hook.owner is not None:
        setattr(module, hook.owner, owner)
    else:
        setattr(module, hook.attr, target)
    with pytest.raises(LmEvalHookMoved, match=_message(hook.name, f"has no parameter {lost}")):
        lm_eval_seam.resolve(key, module)


def test_installing_a_patch_refuses_a_moved_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """Installing is where a moved hook point shows: never silently unpatched."""
    from lm_eval.loggers.evaluation_tracker import EvaluationTracker

    monkeypatch.delattr(EvaluationTracker, "save_results_samples")
    with pytest.raises(LmEvalHookMoved, match="EvaluationTracker.save_results_samples"):
        strict_json.install()
    with pytest.raises(LmEvalHookMoved, match="EvaluatorConfig.process_tasks does not exist"):
        plugin.patch_process_tasks(ModuleType("lm_eval.config.evaluate_config"))


def test_reading_the_seed_refuses_a_moved_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    import lm_eval.evaluator

    def simple_evaluate(model: Any, seed: int = 0) -> None:  # the seed renamed
        return None

    monkeypatch.setattr(lm_eval.evaluator, "simple_evaluate", simple_evaluate)
    with pytest.raises(LmEvalHookMoved, match="has no parameter torch_random_seed"):
        lm_eval_seam.simple_evaluate_torch_seed()


def test_a_moved_caching_lm_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import lm_eval.api.model

    monkeypatch.delattr(lm_eval.api.model, "CachingLM")
    with pytest.raises(LmEvalHookMoved, match="lm_eval.api.model.CachingLM.__init__ does not"):
        lm_eval_seam.calling_caching_lm(object(), SimpleNamespace(dbdict=None))


def test_another_lm_eval_version_is_named_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(lm_eval_seam, "lm_eval_version", lambda: "0.9.1")
    lm_eval_seam._warn_unpinned.cache_clear()
    caplog.set_level(logging.WARNING, logger=lm_eval_seam.__name__)
    try:
        lm_eval_seam.resolve("make_table")
        lm_eval_seam.resolve("evaluate")
        with pytest.raises(LmEvalHookMoved, match="installed lm-eval 0.9.1; .* pinned to"):
            lm_eval_seam.resolve("make_table", ModuleType("lm_eval.utils"))
    finally:
        lm_eval_seam._warn_unpinned.cache_clear()
    assert [r.getMessage() for r in caplog.records] == [
        "lm-eval-dvoting is pinned to lm-eval 0.4.13 and found 0.9.1: every hook point it "
        "patches is in place, but what lm-eval does around them is not checked"
    ]


# ---- patching: once per purpose -------------------------------------------------------------


def _fake_utils() -> ModuleType:
    module = ModuleType("lm_eval.utils")

    def make_table(result_dict: Any, column: str = "results") -> list[str]:
        return ["table"]

    module.make_table = make_table  # type: ignore[attr-defined]
    return module


def _tagging(tag: str) -> Any:
    def wrap(original: Any) -> Any:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> list[str]:
            return [tag, *original(*args, **kwargs)]

        return wrapper

    return wrap


def test_patch_wraps_once_per_purpose() -> None:
    module = _fake_utils()
    for _ in range(2):
        assert lm_eval_seam.patch("make_table", "a", _tagging("a"), module) is True
    assert module.make_table({}) == ["a", "table"]
    lm_eval_seam.patch("make_table", "b", _tagging("b"), module)
    lm_eval_seam.patch("make_table", "a", _tagging("a"), module)  # still marked under "b"
    assert module.make_table({}) == ["b", "a", "table"]


def test_patch_instance_wraps_one_object_once() -> None:
    from lm_eval.api.task import Task

    class Stub:
        def aggregation(self) -> dict[str, Any]:
            return {"acc": "mean"}

    one, other = Stub(), Stub()

    def counting(aggregation: Any) -> Any:
        return lambda: {**aggregation(), "wrapped": aggregation().get("wrapped", 0) + 1}

    for _ in range(2):
        lm_eval_seam.patch_instance(one, "task_aggregation", "t", counting)
    assert one.aggregation() == {"acc": "mean", "wrapped": 1}
    assert other.aggregation() == {"acc": "mean"}
    assert "aggregation" in vars(Task)  # the hook point checked against lm-eval's Task


def test_task_costs_install_is_idempotent() -> None:
    import lm_eval.evaluator

    task_costs.install()
    before = lm_eval.evaluator.evaluate
    task_costs.install()
    assert lm_eval.evaluator.evaluate is before
    # the wrappers in the chain down to lm-eval's own function (itself wrapped by lm-eval's
    # `positional_deprecated`); `functools.wraps` copies names and marks, so ours are told
    # apart by where their code lives
    ours, target = [], before
    while target is not None:
        if "lm_eval_dvoting" in target.__code__.co_filename:
            ours.append(target.__code__.co_filename)
        target = getattr(target, "__wrapped__", None)
    assert len(ours) == len(set(ours)) <= 2, ours  # costs and lengths: each once
