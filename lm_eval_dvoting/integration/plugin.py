"""Registering the dvoting models and tasks with lm-eval 0.4.13.

lm-eval 0.4.13 finds models only in its own registry and tasks only in its own folder
plus `--include_path`. This module adds ours to both:
- models by "module:Class" string, so nothing heavy is imported until a dvoting model
  is really asked for, and so a later `@register_model` on the class itself is seen
  as the same entry (the registry allows a placeholder -> class upgrade);
- tasks by prepending our task folder to every `TaskManager`'s `include_path`
  (prepended, so a user's own `--include_path` can still override our tasks).

It also adjusts three things of lm-eval's, each documented at its function:
- `lm_eval --tasks` naming only dvoting tasks skips indexing lm-eval's ~14,000 stock task
  files (`patch_process_tasks`: some 15 s of CPU time on every call);
- the printed results table leaves out `dvoting_trace`, a per-sample record for
  `--log_samples`, not a score (`patch_results_table`);
- with `DVOTING_DATA_DIR` set, stock tasks on GSM8K, MATH-500, ARC-Challenge and MMLU read
  the local files instead of the hub (`patch_stock_datasets`, `local_data.py`).

It runs either from the start-up hook (`_lm_eval_dvoting_startup`, automatic:
`on_lm_eval_imported`) or from an explicit `register()` call (the `dvoting eval` wrapper does
that). What each patch does is written here; which lm-eval object it replaces, and how, is
lm_eval_seam.py's, which refuses a hook point that moved (`LmEvalHookMoved`) rather than
leave lm-eval unpatched.

Importing this module is cheap: lm_eval is imported only inside the functions.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import re
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

from lm_eval_dvoting.integration import lm_eval_seam
from lm_eval_dvoting.integration.length_checks import install_early
from lm_eval_dvoting.integration.lm_eval_seam import native_discovery
from lm_eval_dvoting.models.families import MODEL_NAMES

if TYPE_CHECKING:
    from lm_eval_dvoting.integration.local_data import SplitNeeds

# lm-eval model name -> "module:Class" of the module that *defines* the class, from the
# `--model` names' records (models/families.py, which imports nothing heavy). pyproject.toml's
# [project.entry-points."lm_eval.models"] is static: tests/test_families.py checks it matches.
MODELS: dict[str, str] = {name: model.target for name, model in MODEL_NAMES.items()}

_PACKAGE_DIR = Path(__file__).resolve().parents[1]
# A wheel carries the YAMLs inside the package (pyproject force-include); an editable
# install or a plain checkout has them in the top-level folder of the source tree.
_TASK_DIR_CANDIDATES = (_PACKAGE_DIR / "task_configs", _PACKAGE_DIR.parent / "task_configs")

log = logging.getLogger(__name__)

# Metrics whose per-sample values are records for `--log_samples` (and `dvoting report`),
# not scores: their aggregate (a count) stays in the results JSON, not in the printed table.
TABLE_HIDDEN_METRICS = ("dvoting_trace",)

# Set while lm-eval's CLI resolves a `--tasks` list that names only our tasks: the
# TaskManager built then indexes our folder (and `--include_path`) without lm-eval's own.
_ONLY_OURS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "dvoting_only_ours", default=False
)
_DECLARES = re.compile(r"^(?:task|group):\s*(\S+)\s*$", re.MULTILINE)


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


def register_models(registry: ModuleType | None = None) -> list[str]:
    """Add the dvoting models to lm-eval's model registry; returns the names added.

    Idempotent. Built-in models are loaded first: `get_model` fills the registry from
    `lm_eval.models` only while it is empty, so registering into an empty registry
    would hide every built-in model (`hf`, `vllm`, ...).
    """
    if native_discovery():
        return []
    model_registry, _ = lm_eval_seam.resolve("model_registry", registry)
    import lm_eval.models  # noqa: F401  (fills the built-in placeholders)

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
    While `patch_process_tasks` has found only our tasks asked for, lm-eval's own folder
    is left out (`include_defaults=False`).
    """
    if native_discovery():
        return False
    return lm_eval_seam.patch("task_manager", "tasks", _wrap_task_manager_init, manager_module)


def _wrap_task_manager_init(original: Callable[..., None]) -> Callable[..., None]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(self, *args, **kwargs)
            bound.arguments["include_path"] = _with_our_tasks(
                bound.arguments.get("include_path"), task_dir()
            )
            if _ONLY_OURS.get():
                bound.arguments["include_defaults"] = False
                log.info("only dvoting tasks asked for: lm-eval's own task folder not indexed")
            args, kwargs = bound.args[1:], bound.kwargs
        except Exception:
            pass  # bad call or no task folder: let lm-eval behave (and complain) as usual
        original(self, *args, **kwargs)

    return __init__


def our_task_names() -> frozenset[str]:
    """The task and group names our task folder declares (read as text: no YAML parsing)."""
    return frozenset(
        name
        for path in task_dir().glob("*.yaml")
        for name in _DECLARES.findall(path.read_text(encoding="utf-8"))
    )


def asks_only_ours(tasks: Any) -> bool:
    """Whether a `--tasks` value (a comma-separated text, or a list of them) names only
    tasks or groups of ours. Paths, globs, tags and stock names all answer False."""
    if isinstance(tasks, str):
        tasks = [tasks]
    if not isinstance(tasks, (list, tuple)) or not all(isinstance(t, str) for t in tasks):
        return False
    names = [name.strip() for entry in tasks for name in entry.split(",") if name.strip()]
    return bool(names) and set(names) <= our_task_names()


def patch_process_tasks(config_module: ModuleType | None = None) -> bool:
    """Let lm-eval's CLI skip its own task index when `--tasks` names only our tasks.

    lm-eval 0.4.13 parses all of its ~14,000 task YAMLs on every call before it looks at
    `--tasks` (some 15 s of CPU time; 35-85 s of wall time on a busy 2-core machine).
    When every name asked for is one of ours, none of them can be a stock task, so the
    TaskManager the CLI builds then indexes our folder and `--include_path` only: the
    same tasks load from the same files. Any other `--tasks`
    (a stock name, a path, a glob, a tag) gets lm-eval's full index as before.
    Returns whether `EvaluatorConfig.process_tasks` is patched.
    """
    return lm_eval_seam.patch("process_tasks", "tasks", _wrap_process_tasks, config_module)


def _wrap_process_tasks(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def process_tasks(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            only_ours = asks_only_ours(getattr(self, "tasks", None))
        except Exception:
            only_ours = False  # no task folder, unreadable file: index everything
        token = _ONLY_OURS.set(only_ours)
        try:
            return original(self, *args, **kwargs)
        finally:
            _ONLY_OURS.reset(token)

    return process_tasks


def _shown_metrics(metrics: Any) -> Any:
    """A task's results without the hidden metrics (and their stderr)."""
    if not isinstance(metrics, dict):
        return metrics
    return {
        key: value
        for key, value in metrics.items()
        if key.partition(",")[0].removesuffix("_stderr") not in TABLE_HIDDEN_METRICS
    }


def patch_results_table(utils_module: ModuleType | None = None) -> bool:
    """Keep `TABLE_HIDDEN_METRICS` out of the table lm-eval prints; returns if patched.

    `dvoting_trace` carries each question's candidates and votes into `--log_samples`
    (lm-eval writes every per-sample metric value there); its aggregate is only the
    number of traced questions, which the printed table showed as a row of its own.
    The results JSON keeps it: only the printed table (`lm_eval.utils.make_table`, which
    the CLI looks up when it prints) leaves it out.
    """
    return lm_eval_seam.patch("make_table", "table", _wrap_make_table, utils_module)


def _wrap_make_table(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def make_table(result_dict: Any, column: str = "results", *args: Any, **kwargs: Any) -> Any:
        try:
            shown = dict(result_dict)
            shown[column] = {
                task: _shown_metrics(metrics) for task, metrics in result_dict[column].items()
            }
        except Exception:
            shown = result_dict  # a shape we do not know: print it as lm-eval would
        return original(shown, column, *args, **kwargs)

    return make_table


def _split_needs(task: Any) -> SplitNeeds:
    """The splits a stock task reads, from its config (`local_data.SplitNeeds`)."""
    from lm_eval_dvoting.integration.local_data import SplitNeeds

    config = task.config
    fewshot_cfg = getattr(task, "fewshot_cfg", None)
    fewshot_split = getattr(fewshot_cfg, "split", None)
    fewshot = None
    # lm-eval's order (ConfigurableTask.fewshot_docs): the few-shot split, else examples
    # written in the YAML, else the training, validation or test split
    if (config.num_fewshot or 0) > 0 and (
        fewshot_split or getattr(fewshot_cfg, "samples", None) is None
    ):
        fewshot = (
            fewshot_split or config.training_split or config.validation_split or config.test_split
        )
    named = (config.training_split, config.validation_split, config.test_split, fewshot_split)
    return SplitNeeds(
        evaluated=config.test_split or config.validation_split,
        fewshot=fewshot,
        named=tuple(split for split in named if split),
    )


def _read_local_stock_data(task: Any) -> bool:
    """Load a stock task's dataset from the local data folder when the user named one and
    it holds the task's hub dataset; returns whether it did (else lm-eval loads it)."""
    from lm_eval_dvoting.integration import local_data

    config = task.config
    if callable(config.custom_dataset):
        return False  # a task with its own loader (ours read the folder themselves)
    folder = local_data.data_dir(config.metadata if isinstance(config.metadata, dict) else None)
    source = local_data.stock_source(task.DATASET_PATH, task.DATASET_NAME)
    if folder is None or source is None:
        return False
    task.dataset, notes = local_data.stock_dataset(
        config.task, source, task.DATASET_NAME, folder, _split_needs(task)
    )
    log.warning(
        "lm-eval-dvoting: task %s reads %s (%s) from %s, not from the hub: %s",
        config.task,
        task.DATASET_PATH,
        task.DATASET_NAME,
        folder,
        "; ".join(notes),
    )
    return True


def patch_stock_datasets(task_module: ModuleType | None = None) -> bool:
    """Let lm-eval's stock tasks read the local data folder; returns if patched.

    Only when the user names the folder (`DVOTING_DATA_DIR`, or the metadata key
    `dvoting_data_dir`) and only for the hub datasets `local_data.STOCK_SOURCES` knows;
    every other task, and every task without the folder, loads as lm-eval loads it.
    Each redirected task logs which files it reads.
    """
    return lm_eval_seam.patch("download", "local_data", _wrap_download, task_module)


def _wrap_download(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def download(self: Any, dataset_kwargs: Any = None, **kwargs: Any) -> None:
        if not _read_local_stock_data(self):
            original(self, dataset_kwargs, **kwargs)

    return download


def patch_lm_eval(manager_module: ModuleType | None = None) -> None:
    """Everything we change in lm-eval's task handling, once its task manager is loaded
    (loading it loads `lm_eval.api.task`, `lm_eval.utils` and `lm_eval.config` first)."""
    patch_task_manager(manager_module)
    patch_process_tasks()
    patch_results_table()
    patch_stock_datasets()


def register() -> None:
    """Register models and tasks explicitly (for use after lm_eval was imported)."""
    register_models()
    patch_lm_eval()
    install_early()


# ---- called by the start-up hook right after lm-eval executed one of its modules ------


def on_lm_eval_imported(fullname: str, module: ModuleType) -> None:
    """Start-up hook target: patch `module` (lm-eval's `fullname`, one of
    `lm_eval_seam.STARTUP_MODULES`) right after lm-eval executed it."""
    if fullname == lm_eval_seam.HOOKS["model_registry"].module:
        register_models(module)
    elif fullname == lm_eval_seam.HOOKS["process_tasks"].module:
        # patched on its own, before any `process_tasks` can run (the task manager may be
        # imported only inside that call)
        patch_process_tasks(module)
    elif fullname == lm_eval_seam.HOOKS["task_manager"].module:
        patch_lm_eval(module)
    elif fullname == lm_eval_seam.HOOKS["simple_evaluate"].module:
        # task lengths checked before the weights load when `simple_evaluate` (or the CLI)
        # is given a dvoting model's name (length_checks.py)
        install_early(module)
