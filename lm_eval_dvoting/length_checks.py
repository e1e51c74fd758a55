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
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from .task_costs import _costed_model

_PATCH_MARK = "_lm_eval_dvoting_lengths"


def generation_kwargs_of(task_dict: Any) -> dict[str, dict[str, Any] | None]:
    """Task name -> the generation kwargs its requests will carry, for each generation task
    of `evaluate`'s `task_dict` whose requests carry its config's (`ConfigurableTask`'s)."""
    tasks = task_dict.get("tasks") if isinstance(task_dict, dict) and "tasks" in task_dict else None
    if tasks is None:
        try:  # the older nested {name: task or {group: ...}} form, as `evaluate` reads it
            from lm_eval.evaluator_utils import _handle_back_comp

            _, tasks = _handle_back_comp(task_dict)
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
        task_dict = kwargs["task_dict"] if "task_dict" in kwargs else (args[1] if len(args) > 1 else None)
        model = _costed_model(lm)
        if model is not None and callable(getattr(model, "check_task_lengths", None)):
            model.check_task_lengths(generation_kwargs_of(task_dict))
        return original(*args, **kwargs)

    setattr(evaluate, _PATCH_MARK, True)
    return evaluate


def install() -> None:
    """Patch lm-eval's `evaluate` (idempotent) to check the generation tasks' lengths first."""
    import lm_eval.evaluator as evaluator

    current = evaluator.evaluate
    if not getattr(current, _PATCH_MARK, False):
        evaluator.evaluate = _wrap_evaluate(current)
