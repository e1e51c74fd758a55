"""Registering the dvoting models and tasks with lm-eval 0.4.13.

lm-eval 0.4.13 finds models only in its own registry and tasks only in its own folder
plus `--include_path`. This module adds ours to both:
- models by "module:Class" string, so nothing heavy is imported until a dvoting model
  is really asked for, and so a later `@register_model` on the class itself is seen
  as the same entry (the registry allows a placeholder -> class upgrade);
- tasks by prepending our task folder to every `TaskManager`'s `include_path`
  (prepended, so a user's own `--include_path` can still override our tasks).

It runs either from the start-up hook (`_lm_eval_dvoting_startup`, automatic) or
from an explicit `register()` call (the `dvoting eval` wrapper does that).

Importing this module is cheap: lm_eval is imported only inside the functions.
"""
from __future__ import annotations

import functools
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

# lm-eval model name -> "module:Class" of the module that *defines* the class.
# Keep in sync with [project.entry-points."lm_eval.models"] in pyproject.toml
# (tests/test_plugin_hook.py checks this).
MODELS: dict[str, str] = {
    "dvoting-llada": "lm_eval_dvoting.harness:LLaDAEvalModel",
    "dvoting-dream": "lm_eval_dvoting.harness:DreamEvalModel",
    "dvoting-llada2": "lm_eval_dvoting.harness:LLaDA2EvalModel",
    "dvoting-llada21": "lm_eval_dvoting.harness:LLaDA21EvalModel",
}

_PACKAGE_DIR = Path(__file__).resolve().parent
# A wheel carries the YAMLs inside the package (pyproject force-include); an editable
# install or a plain checkout has them in the top-level folder of the source tree.
_TASK_DIR_CANDIDATES = (_PACKAGE_DIR / "task_configs", _PACKAGE_DIR.parent / "task_configs")

_PATCH_MARK = "_lm_eval_dvoting_patched"


def task_dir() -> Path:
    """Return the folder holding the dvoting task YAMLs (installed or source tree).

    Raises FileNotFoundError when neither the packaged nor the source-tree folder exists.
    """
    for candidate in _TASK_DIR_CANDIDATES:
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        "lm-eval-dvoting task folder not found; looked in "
        + ", ".join(str(c) for c in _TASK_DIR_CANDIDATES)
    )


def __getattr__(name: str) -> Any:
    # `TASK_DIR` is the target of the `lm_eval.tasks` entry point; computed on access
    # so that importing this module never touches the file system.
    if name == "TASK_DIR":
        return str(task_dir())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.lru_cache(maxsize=1)
def native_discovery() -> bool:
    """Whether the installed lm-eval discovers plugin entry points by itself.

    0.4.13 does not; later versions read the `lm_eval.models` / `lm_eval.tasks`
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
        for relative in ("api/registry.py", "models/__init__.py", "tasks/manager.py",
                         "tasks/__init__.py", "_cli/run.py"):
            path = root / relative
            if not path.is_file():
                continue
            source = path.read_text(encoding="utf-8", errors="replace")
            if "entry_points" in source and (
                '"lm_eval.models"' in source or "'lm_eval.models'" in source
                or '"lm_eval.tasks"' in source or "'lm_eval.tasks'" in source
            ):
                return True
    except Exception:
        return False
    return False


def register_models(registry: ModuleType | None = None) -> list[str]:
    """Add the dvoting models to lm-eval's model registry; returns the names added.

    Idempotent. Built-in models are loaded first: `get_model` fills the registry from
    `lm_eval.models` only while it is empty, so registering into an empty registry
    would hide every built-in model (`hf`, `vllm`, ...).
    """
    if native_discovery():
        return []
    if registry is None:
        import lm_eval.api.registry as registry
    import lm_eval.models  # noqa: F401  (fills the built-in placeholders)

    model_registry = registry.model_registry
    added = []
    for name, target in MODELS.items():
        if name not in model_registry:  # a user's or native registration wins
            model_registry.register(name, target=target)
            added.append(name)
    return added


def _with_our_tasks(include_path: Any, ours: Path) -> Any:
    """`include_path` as a TaskManager takes it, with our task folder in front."""
    if include_path is None or include_path == "":
        paths: list[Any] = []
    elif isinstance(include_path, (list, tuple)):
        paths = list(include_path)
    else:
        paths = [include_path]
    try:
        resolved = {Path(p).resolve() for p in paths}
    except Exception:
        resolved = set()
    if ours.resolve() in resolved:
        return include_path
    return [ours, *paths]


def patch_task_manager(manager_module: ModuleType | None = None) -> bool:
    """Make every new `TaskManager` also index our task folder; returns if patched.

    Our tasks are added whatever `include_defaults` says: an installed plugin's tasks
    are wanted whenever the plugin is (set LM_EVAL_DVOTING_DISABLE_HOOK=1 to opt out).
    """
    if native_discovery():
        return False
    if manager_module is None:
        import lm_eval.tasks.manager as manager_module
    cls = manager_module.TaskManager
    original = cls.__init__
    if getattr(original, _PATCH_MARK, False):
        return True
    signature = inspect.signature(original)
    if "include_path" not in signature.parameters:
        return False  # an lm-eval we do not understand: leave it alone

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(self, *args, **kwargs)
            bound.arguments["include_path"] = _with_our_tasks(
                bound.arguments.get("include_path"), task_dir()
            )
            args, kwargs = bound.args[1:], bound.kwargs
        except Exception:
            pass  # bad call or no task folder: let lm-eval behave (and complain) as usual
        original(self, *args, **kwargs)

    setattr(__init__, _PATCH_MARK, True)
    cls.__init__ = __init__
    return True


def register() -> None:
    """Register models and tasks explicitly (for use after lm_eval was imported)."""
    register_models()
    patch_task_manager()


# ---- called by the start-up hook right after lm-eval executed these modules ----------

def on_registry_imported(module: ModuleType) -> None:
    """Hook target for `lm_eval.api.registry`."""
    register_models(module)


def on_task_manager_imported(module: ModuleType) -> None:
    """Hook target for `lm_eval.tasks.manager`."""
    patch_task_manager(module)
