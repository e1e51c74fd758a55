"""Every point where the plugin reaches into lm-eval's internals, pinned to lm-eval 0.4.13.

lm-eval 0.4.13 offers plugins its model registry and nothing else, so the plugin depends on
its internals at the points listed in `HOOKS`. Each `HookPoint` names the object (module,
class, attribute), the parameters the plugin relies on, and what the plugin does there. The
plugin touches them in three ways, all of them in this module only:

* it wraps a function or method (`patch`, once per purpose: installing twice is a no-op);
  what the wrapper does stays with its module (plugin.py, task_costs.py, length_checks.py,
  strict_json.py), which lm-eval object is replaced, and how, is decided here;
* it reads a caller's frame: the seed `simple_evaluate` set (`simple_evaluate_torch_seed`)
  and the `CachingLM` that made a cache hook (`calling_caching_lm`);
* it reads the command line lm-eval's CLI parses, to tell a typed `--device`/`--batch_size`
  from the default lm-eval hands every model (`is_untyped_cli_default`).

A hook point that moved (renamed, removed, or without a parameter the plugin relies on, as
another lm-eval version may have it) is refused with `LmEvalHookMoved` when its patch is
installed or its value read, naming the hook, the lm-eval version found and the version
pinned. It is never skipped silently: a missing patch would silently drop the cost figures,
the length checks, the standard JSON or the result cache's binding to the run's settings.
An lm-eval of another version whose hook points are all in place is used, with one warning.
tests/test_lm_eval_seam.py checks every hook point against the installed lm-eval.

Importing this module is cheap: lm_eval is imported only inside the functions.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

log = logging.getLogger(__name__)

PINNED_VERSION = "0.4.13"
# prefix of the attribute that marks a wrapper as ours, one per purpose (`patch`)
_MARK_PREFIX = "_lm_eval_dvoting_"


@dataclass(frozen=True)
class HookPoint:
    """One lm-eval object the plugin depends on.

    `owner` is a name in `module` (a class, or an object such as the model registry), None
    for a module-level function; `params` are the parameters of `module.owner.attr` that the
    plugin passes or reads by name; `purpose` says what the plugin does there (in messages).
    """

    module: str
    owner: str | None
    attr: str
    params: tuple[str, ...]
    purpose: str

    @property
    def name(self) -> str:
        """The dotted path of the object, as a user would look it up."""
        return ".".join(part for part in (self.module, self.owner, self.attr) if part)


HOOKS: dict[str, HookPoint] = {
    hook_key: HookPoint(*fields)
    for hook_key, fields in {
        "model_registry": (
            "lm_eval.api.registry",
            "model_registry",
            "register",
            ("target",),
            "registers the dvoting models by 'module:Class'",
        ),
        "task_manager": (
            "lm_eval.tasks.manager",
            "TaskManager",
            "__init__",
            ("include_path", "include_defaults"),
            "adds the dvoting task folder to every TaskManager",
        ),
        "process_tasks": (
            "lm_eval.config.evaluate_config",
            "EvaluatorConfig",
            "process_tasks",
            (),
            "skips lm-eval's task index when --tasks names only dvoting tasks",
        ),
        "make_table": (
            "lm_eval.utils",
            None,
            "make_table",
            ("result_dict", "column"),
            "keeps dvoting_trace out of the printed results table",
        ),
        "download": (
            "lm_eval.api.task",
            "ConfigurableTask",
            "download",
            ("dataset_kwargs",),
            "reads stock tasks' datasets from DVOTING_DATA_DIR",
        ),
        "task_filters": (
            "lm_eval.api.task",
            "Task",
            "apply_filters",
            (),
            "reads each task's cost per question after its filters",
        ),
        "configurable_task_filters": (
            "lm_eval.api.task",
            "ConfigurableTask",
            "apply_filters",
            (),
            "reads each task's cost per question after its filters",
        ),
        "task_results": (
            "lm_eval.api.task",
            "Task",
            "process_results",
            ("doc", "results"),
            "adds nfe/n_samples per question to the metrics of a task whose responses cost",
        ),
        "task_aggregation": (
            "lm_eval.api.task",
            "Task",
            "aggregation",
            (),
            "aggregates such a task's nfe/n_samples by their mean",
        ),
        "task_higher_is_better": (
            "lm_eval.api.task",
            "Task",
            "higher_is_better",
            (),
            "marks such a task's nfe/n_samples lower-is-better",
        ),
        "group_aggregate": (
            "lm_eval.api.group",
            "Group",
            "aggregate",
            ("task_metrics",),
            "adds the cost per question to each group's figures",
        ),
        "evaluate": (
            "lm_eval.evaluator",
            None,
            "evaluate",
            ("lm", "task_dict"),
            "keeps the run's cost ledger and checks the tasks' lengths first",
        ),
        "simple_evaluate": (
            "lm_eval.evaluator",
            None,
            "simple_evaluate",
            (
                "model",
                "model_args",
                "tasks",
                "batch_size",
                "max_batch_size",
                "device",
                "gen_kwargs",
                "task_manager",
                "metadata",
            ),
            "checks the tasks' lengths before the weights are read",
        ),
        "simple_evaluate_seed": (
            "lm_eval.evaluator",
            None,
            "simple_evaluate",
            ("torch_random_seed",),
            "reads lm-eval's --seed from simple_evaluate's frame while the model is built",
        ),
        "save_results": (
            "lm_eval.loggers.evaluation_tracker",
            "EvaluationTracker",
            "save_results_aggregated",
            ("results", "samples"),
            "writes a dvoting run's results JSON as standard JSON",
        ),
        "save_samples": (
            "lm_eval.loggers.evaluation_tracker",
            "EvaluationTracker",
            "save_results_samples",
            ("task_name", "samples"),
            "writes a dvoting run's samples JSONL as standard JSON",
        ),
        "caching_lm": (
            "lm_eval.api.model",
            "CachingLM",
            "__init__",
            ("lm", "cache_db"),
            "binds --use_cache to the run's settings (the CachingLM is found on the stack)",
        ),
        "nested_task_dict": (
            "lm_eval.evaluator_utils",
            None,
            "_handle_back_comp",
            ("nested_dict",),
            "reads the generation tasks of `evaluate`'s nested task dict for the length checks",
        ),
        "caching_lm_requests": (
            "lm_eval.api.model",
            "CachingLM",
            "__getattr__",
            ("attr",),
            "answers --use_cache's requests itself (instance attributes win over __getattr__)",
        ),
    }.items()
}

# The lm-eval modules the start-up hook watches (`_lm_eval_dvoting_startup._WATCHED`, a copy:
# the hook may import nothing at interpreter start): right after one has executed,
# `plugin.on_lm_eval_imported` patches it.
STARTUP_MODULES = tuple(
    HOOKS[key].module for key in ("model_registry", "process_tasks", "task_manager", "evaluate")
)


class LmEvalHookMoved(RuntimeError):
    """An lm-eval object the plugin depends on is not where lm-eval 0.4.13 has it."""

    def __init__(self, hook: HookPoint, problem: str) -> None:
        super().__init__(
            f"lm-eval-dvoting: lm-eval's {hook.name} {problem} in the installed lm-eval "
            f"{lm_eval_version()}; the plugin {hook.purpose} there and is pinned to lm-eval "
            f"{PINNED_VERSION}: install lm-eval=={PINNED_VERSION} "
            f"(pip install 'lm-eval=={PINNED_VERSION}')"
        )
        self.hook = hook


def lm_eval_version() -> str:
    """The installed lm-eval's version ("unknown" when its metadata cannot be read)."""
    try:
        from importlib.metadata import version

        return version("lm_eval")
    except Exception:
        return "unknown"


@functools.lru_cache(maxsize=1)
def _warn_unpinned() -> None:
    """One warning per process when lm-eval is not the version the hook points were read in."""
    found = lm_eval_version()
    if found != PINNED_VERSION:
        log.warning(
            "lm-eval-dvoting is pinned to lm-eval %s and found %s: every hook point it "
            "patches is in place, but what lm-eval does around them is not checked",
            PINNED_VERSION,
            found,
        )


def resolve(key: str, module: ModuleType | None = None) -> tuple[Any, Any]:
    """The owner (class, object or module) of hook `key` and its current target, checked.

    `module` is the hook's module when the caller holds it already (the start-up hook hands
    over each module right after it executed), else it is imported. Raises `LmEvalHookMoved`
    when the owner or the attribute is missing or lacks a parameter in `HookPoint.params`.
    """
    hook = HOOKS[key]
    if module is None:
        try:
            module = importlib.import_module(hook.module)
        except ImportError as exc:
            raise LmEvalHookMoved(hook, f"cannot be imported ({exc})") from exc
    owner = module if hook.owner is None else getattr(module, hook.owner, None)
    target = getattr(owner, hook.attr, None) if owner is not None else None
    if target is None:
        raise LmEvalHookMoved(hook, "does not exist")
    missing = [name for name in hook.params if name not in _parameters(target)]
    if missing:
        raise LmEvalHookMoved(hook, f"has no parameter {', '.join(missing)}")
    _warn_unpinned()
    return owner, target


def _parameters(target: Any) -> frozenset[str]:
    """The parameter names of `target` (a patched target: its original's, via `__wrapped__`)."""
    try:
        return frozenset(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return frozenset()


def patch(
    key: str,
    purpose: str,
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]],
    module: ModuleType | None = None,
) -> bool:
    """Replace hook `key`'s target by `wrap(target)`, once per `purpose`; returns True.

    Idempotent: a target that already carries this purpose's mark (set on every wrapper
    here; `functools.wraps` copies it onto any wrapper put around it later) is left as it is.
    `wrap` must return a `functools.wraps` wrapper, so that the next check still reads the
    original's parameters. Raises `LmEvalHookMoved` (`resolve`) rather than leave lm-eval
    unpatched.
    """
    owner, current = resolve(key, module)
    mark = _MARK_PREFIX + purpose
    if getattr(current, mark, False):
        return True
    wrapped = wrap(current)
    setattr(wrapped, mark, True)
    setattr(owner, HOOKS[key].attr, wrapped)
    return True


def patch_instance(
    obj: Any,
    key: str,
    purpose: str,
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> None:
    """Replace hook `key`'s method on the one object `obj` by `wrap(obj.method)`, once per
    `purpose`: an instance attribute, so no other object of its class is touched."""
    resolve(key)
    attr = HOOKS[key].attr
    mark = _MARK_PREFIX + purpose
    if getattr(vars(obj).get(attr), mark, False):
        return
    wrapped = wrap(getattr(obj, attr))
    setattr(wrapped, mark, True)
    setattr(obj, attr, wrapped)


def answer_for_caching_lm(caching_lm: Any, answers: dict[str, Callable[..., Any]]) -> None:
    """Make `caching_lm` (one `CachingLM`) call `answers[request type]` for each request type,
    instead of its own lookup: lm-eval 0.4.13's `CachingLM` serves them from `__getattr__`,
    so instance attributes win over it."""
    resolve("caching_lm_requests")
    for request_type, answer in answers.items():
        setattr(caching_lm, request_type, answer)


@functools.lru_cache(maxsize=1)
def native_discovery() -> bool:
    """Whether the installed lm-eval discovers plugin entry points by itself.

    0.4.13 does not; later versions may read the `lm_eval.models` / `lm_eval.tasks`
    entry-point groups that our pyproject already declares. Registering twice would
    make lm-eval's own loader fail with "already registered", so we step aside then.
    Detected from lm-eval's source, without importing anything new.
    """
    try:
        import importlib.util

        if importlib.util.find_spec("lm_eval.plugins") is not None:
            return True
        spec = importlib.util.find_spec("lm_eval")
        if spec is None or not spec.submodule_search_locations:
            return False
        root = Path(next(iter(spec.submodule_search_locations)))
        for relative in (
            "api/registry.py",
            "models/__init__.py",
            "tasks/manager.py",
            "tasks/__init__.py",
            "_cli/run.py",
        ):
            path = root / relative
            if not path.is_file():
                continue
            source = path.read_text(encoding="utf-8", errors="replace")
            if "entry_points" in source and (
                '"lm_eval.models"' in source
                or "'lm_eval.models'" in source
                or '"lm_eval.tasks"' in source
                or "'lm_eval.tasks'" in source
            ):
                return True
    except Exception:
        return False
    return False


# ------------------------------------------------------------------ frames read


def simple_evaluate_torch_seed() -> int | None:
    """The torch seed lm-eval's `simple_evaluate` set, when the caller runs inside it.

    `simple_evaluate` seeds torch (`set_torch_seed(torch_random_seed)`) and then creates the
    model from its name, so while the model is built its frame is on the stack with the
    seed it used as the local `torch_random_seed` (None: torch was left unseeded). The
    value is read there rather than from `torch.initial_seed()`, which anything run in
    between (a task's own code) could have reseeded. None outside `simple_evaluate`.
    """
    resolve("simple_evaluate_seed")
    hook = HOOKS["simple_evaluate_seed"]
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == hook.attr and frame.f_globals.get("__name__") == hook.module:
            seed = frame.f_locals.get("torch_random_seed")
            return None if seed is None else int(seed)
        frame = frame.f_back
    return None


def calling_caching_lm(lm: Any, cache_hook: Any) -> Any:
    """The `CachingLM` wrapping `lm` that made `cache_hook`, else None.

    lm-eval 0.4.13 calls `lm.set_cache_hook(...)` from `CachingLM.__init__`, so that
    `CachingLM` is the `self` of a frame a few levels up from `set_cache_hook`.
    """
    caching_lm, _ = resolve("caching_lm")
    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if (
            isinstance(owner, caching_lm)
            and owner.lm is lm
            and getattr(owner, "dbdict", None) is cache_hook.dbdict
        ):
            return owner
        frame = frame.f_back
    return None


# ------------------------------------------------------------------ command line read

# What lm-eval's CLI hands every model (`create_from_arg_*`'s additional config) when the
# flag is not on the command line (`EvaluatorConfig`'s field defaults), and its spellings.
CLI_DEFAULTS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "device": ("cuda:0", ("--device",)),
    "batch_size": (1, ("--batch_size", "-b")),
}


def typed_on_command_line(flags: tuple[str, ...]) -> bool:
    """Whether one of `flags` was typed on this process's command line (`--flag v`, `--flag=v`)."""
    for arg in sys.argv[1:]:
        for flag in flags:
            if (
                arg == flag
                or arg.startswith(flag + "=")
                or (len(flag) == 2 and arg.startswith(flag))
            ):
                return True
    return False


def is_untyped_cli_default(key: str, value: Any) -> bool:
    """Whether lm-eval's run-wide `key=value` is its CLI's default, not typed by the user
    (only `CLI_DEFAULTS`' keys can be; in the Python API, `simple_evaluate(device="cuda:0")`
    cannot be told from the CLI's default and counts as it)."""
    default, flags = CLI_DEFAULTS.get(key, (None, ()))
    return flags != () and str(value) == str(default) and not typed_on_command_line(flags)
