"""Every generation task's length, checked when lm-eval's `evaluate` starts.

A task's generation length (`max_gen_toks`: its YAML's, or `--gen_kwargs`', which
`simple_evaluate` writes into the task's config) must fit the strategy's block rule and
leave room for a prompt in the model's length (`request_planning.task_length`). The
earliest point where both the model and the tasks' lengths are known is the start of
lm-eval's `evaluate`: lm-eval 0.4.13's `simple_evaluate` builds the model (weights
included) before it loads any task, and only `evaluate` builds the requests. So
`evaluate` is patched (once, `install`) to hand a dvoting model every generation task's
generation kwargs, exactly as its requests will carry them (`ConfigurableTask` passes a
copy of `config.generation_kwargs` with each request), before any request is built and
before any task's model work (lm-eval runs each request type in turn: a refused
generation task no longer waits for the log-likelihood tasks of the same run).

A task whose class builds its requests another way is left to the same check per
request (`generate_until` plans every request before decoding any). Calls of
`generate_until` outside `evaluate` get that check only.

Before the weights: `simple_evaluate` (which the `lm_eval` CLI calls through the module's
attribute) is patched too (`install_early`, when `lm_eval.evaluator` is imported) so that,
given one of our model names (not an instance), each generation task's length is checked
before the model is built, where everything it needs is on this machine: the model's
maximum length from the checkpoint's config.json (`max_length_before_loading`: a packaged
name, a folder, or a hub id whose config is in the local hub cache; never a download) and
each task's `max_gen_toks` from lm-eval's task index, with `gen_kwargs` over it, as
`simple_evaluate` will write it. Where the maximum is not known the run goes on untouched,
to the checks above. Without a `task_manager`, the one `simple_evaluate` would build is
built here (same arguments) and handed on, so the task index is read once.
"""

from __future__ import annotations

import functools
import inspect
import logging
from types import ModuleType
from typing import Any, Callable, Mapping

from lm_eval_dvoting.integration import lm_eval_seam
from lm_eval_dvoting.integration.task_costs import _costed_model

log = logging.getLogger(__name__)


def generation_kwargs_of(task_dict: Any) -> dict[str, dict[str, Any] | None]:
    """Task name -> the generation kwargs its requests will carry, for each generation task
    of `evaluate`'s `task_dict` whose requests carry its config's (`ConfigurableTask`'s)."""
    tasks = task_dict.get("tasks") if isinstance(task_dict, dict) and "tasks" in task_dict else None
    if tasks is None:
        try:  # the older nested {name: task or {group: ...}} form, as `evaluate` reads it
            _, handle_back_comp = lm_eval_seam.resolve("nested_task_dict")
            _, tasks = handle_back_comp(task_dict)
        except Exception:
            return {}  # a form we do not know: the per-request check still runs
    found = {}
    for name, task in (tasks or {}).items():
        config = getattr(task, "config", None)
        kwargs = getattr(config, "generation_kwargs", None)
        if getattr(task, "OUTPUT_TYPE", None) == "generate_until" and isinstance(kwargs, dict):
            found[name] = kwargs
    return found


def _wrap_evaluate(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def evaluate(*args: Any, **kwargs: Any) -> Any:
        lm = kwargs["lm"] if "lm" in kwargs else (args[0] if args else None)
        task_dict = (
            kwargs["task_dict"] if "task_dict" in kwargs else (args[1] if len(args) > 1 else None)
        )
        model = _costed_model(lm)
        if model is not None and callable(getattr(model, "check_task_lengths", None)):
            model.check_task_lengths(generation_kwargs_of(task_dict))
        return original(*args, **kwargs)

    return evaluate


def install() -> None:
    """Patch lm-eval's `evaluate` (idempotent) to check the generation tasks' lengths first,
    and `simple_evaluate` (`install_early`) to check them before the weights where it can."""
    lm_eval_seam.patch("evaluate", "lengths", _wrap_evaluate)
    install_early()


# ------------------------------------------------- before the weights: simple_evaluate


def index_leaves(index: Mapping[str, Any], name: str) -> list[tuple[str, dict[str, Any]]]:
    """The tasks `name` runs (a group's or tag's, recursively; a task itself), each with its
    config as lm-eval's task `index` (`TaskManager.task_index`) reads it (includes resolved);
    [] for a name the index does not know (lm-eval refuses it by name when it loads it)."""
    leaves: list[tuple[str, dict[str, Any]]] = []
    todo: list[Any] = [name]
    seen: set[str] = set()
    while todo:
        item = todo.pop(0)
        if isinstance(item, dict):  # a task defined inside a group's config
            leaves.append((str(item.get("task")), item))
            continue
        entry = index.get(item)
        if item in seen or entry is None:
            continue
        seen.add(item)
        subtasks = (entry.cfg or {}).get("task")
        if entry.cfg is None:  # a tag: the tasks that carry it
            todo += sorted(entry.tags)
        elif isinstance(subtasks, list):  # a group
            todo += subtasks
        else:
            leaves.append((item, entry.cfg))
    return leaves


def indexed_generation_kwargs(
    index: Mapping[str, Any], tasks: list[Any], gen_kwargs: dict[str, Any] | None
) -> dict[str, dict[str, Any]]:
    """Task name -> its `max_gen_toks` as its requests will carry it (`{}`: none), for each
    generation task that `tasks` (names or configs, as `simple_evaluate` takes them) runs:
    the config's `generation_kwargs`, updated with `gen_kwargs` as `simple_evaluate` does.
    A task object or a name the index does not know is left to the later checks."""
    found: dict[str, dict[str, Any]] = {}
    for item in tasks:
        leaves = (
            index_leaves(index, item)
            if isinstance(item, str)
            else ([(str(item.get("task")), item)] if isinstance(item, dict) else [])
        )
        for name, cfg in leaves:
            if cfg.get("output_type", "generate_until") != "generate_until":
                continue
            kwargs = {**(cfg.get("generation_kwargs") or {}), **(gen_kwargs or {})}
            found[name] = {k: v for k, v in kwargs.items() if k == "max_gen_toks"}
    return found


def _our_model_class(model: Any) -> Any:
    """The dvoting model class `simple_evaluate`'s `model` names, else None.

    Asked of lm-eval's registry, as `simple_evaluate` asks it next; a name it refuses is
    left to `simple_evaluate` to refuse, in its own order."""
    if not isinstance(model, str):
        return None
    import lm_eval.api.registry as registry

    try:
        found = registry.get_model(model)
    except Exception:
        return None
    ours = isinstance(found, type) and found.__module__.startswith("lm_eval_dvoting.")
    return found if ours and hasattr(found, "check_lengths_before_loading") else None


def _model_args(bound: inspect.BoundArguments) -> dict[str, Any]:
    """The model's constructor args, as `simple_evaluate` will build them."""
    from lm_eval.utils import simple_parse_args_string

    given = bound.arguments.get("model_args") or {}
    if isinstance(given, str):
        given = simple_parse_args_string(given)
    run = {key: bound.arguments.get(key) for key in ("batch_size", "max_batch_size", "device")}
    return _our_model_class(bound.arguments["model"]).constructor_args(given, run)


def _task_manager(bound: inspect.BoundArguments) -> Any:
    """The given task manager, else the one `simple_evaluate` would build (lm-eval 0.4.13)."""
    if bound.arguments.get("task_manager") is not None:
        return bound.arguments["task_manager"]
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import simple_parse_args_string

    model_args = bound.arguments.get("model_args")
    metadata = (
        simple_parse_args_string(model_args)
        if isinstance(model_args, str)
        else model_args
        if isinstance(model_args, dict)
        else {}
    )
    return TaskManager(metadata=metadata | (bound.arguments.get("metadata") or {}))


def check_before_loading(bound: inspect.BoundArguments) -> None:
    """Refuse a generation task's length before `simple_evaluate` builds our model (see the
    module's docstring); sets `bound`'s `task_manager` to the one it read the index of."""
    model_class = _our_model_class(bound.arguments.get("model"))
    if model_class is None:
        return
    try:
        args = _model_args(bound)
    except Exception:  # args the constructor refuses: it says why, in its own order
        return
    max_length = model_class.max_length_before_loading(args)
    if max_length is None:
        log.debug("the model's maximum length is not known before loading: lengths checked later")
        return
    tasks = bound.arguments.get("tasks") or []
    gen_kwargs = bound.arguments.get("gen_kwargs")
    if isinstance(gen_kwargs, str):
        from lm_eval.utils import simple_parse_args_string

        gen_kwargs = simple_parse_args_string(gen_kwargs)
    manager = _task_manager(bound)
    bound.arguments["task_manager"] = manager
    lengths = indexed_generation_kwargs(manager.task_index, list(tasks), gen_kwargs or None)
    model_class.check_lengths_before_loading(args, max_length, lengths)


def _wrap_simple_evaluate(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def simple_evaluate(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)  # lm-eval's own error for a bad call
        check_before_loading(bound)
        return original(*bound.args, **bound.kwargs)

    return simple_evaluate


def install_early(evaluator: ModuleType | None = None) -> bool:
    """Patch lm-eval's `simple_evaluate` (idempotent) to check lengths before the weights;
    `evaluator` is `lm_eval.evaluator` when the caller holds it (the start-up hook)."""
    return lm_eval_seam.patch("simple_evaluate", "lengths", _wrap_simple_evaluate, evaluator)
