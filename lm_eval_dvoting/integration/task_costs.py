"""What each task cost: mean NFE and samples per question, for every task a dVoting model runs.

lm-eval keeps whatever `generate_until` returns, so each response is a `CostedText`
carrying its request's cost (`nfe`, `n_samples`) and the settings it ran with
(`settings`), whether it was computed now or read back from `--use_cache`. Our own
tasks report the cost as metrics, but a stock task's filters (regex, majority vote)
build plain strings, and its `process_results` knows nothing of cost. So this module
reads the cost where the evaluator holds every response, right after a task's filters
ran (`Task.apply_filters`, called once per task on every rank in lm-eval 0.4.13's
`evaluate`), and from there:

* **per question** (per document): the cost of all the document's responses, i.e. all
  of its `repeats` (a `repeats: 64` self-consistency task costs 64 requests' worth per
  question). Each filtered response of the document carries it (`question_cost`), and
  the task's `process_results` is wrapped to add it as the metrics ``nfe`` and
  ``n_samples`` (aggregation mean, lower is better) under every filter. lm-eval then
  does the rest as for any metric: gathered across ranks, aggregated per task, printed
  in the results table, written to the results JSON, and into every logged sample with
  `--log_samples`. Padding copies that lm-eval appends to a rank's last request for data
  parallel runs are not counted (only the first `repeats` responses of an instance are).
* **per group**: a group whose every task reports cost gets the mean over all of its
  questions (each task weighted by its number of questions), under each filter name its
  tasks use (the cost does not depend on the filter).
* **per run** (`RunCosts`): the sums per task and the settings the responses ran with, for
  `results["config"]["dvoting"]` (`DVotingEvalModel.get_model_info`). As they are read
  from the responses the evaluator holds, a run resumed from `--use_cache`, or fully
  cached, reports the same totals and settings as the run that computed them.

Only responses that carry cost are counted, so other lm-eval models and log-likelihood
tasks are left exactly as they were. `install()` patches lm-eval once; the harness
module calls it when it is imported, which every way of running a dvoting model does
(`lm_eval` CLI, `python -m lm_eval`, `simple_evaluate`, `dvoting compare`). The run
ledger needs lm-eval's `evaluate` looked up in `lm_eval.evaluator` at call time (as
`simple_evaluate` and `lm_eval.evaluate` do); code that bound `evaluate` itself before
the harness was imported still gets the per-task metrics, but `get_model_info` then
falls back to counting the requests this model computed.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from lm_eval_dvoting.integration import lm_eval_seam
from lm_eval_dvoting.integration.costs import CostedText

log = logging.getLogger(__name__)

# the per-question metrics added to every task whose responses carry cost
COST_METRICS = ("nfe", "n_samples")
# per-question figure -> the response attribute summed into it
_FIGURES = {"nfe": "nfe", "n_samples": "n_samples"}

# the cost ledger of the evaluation running now (set by the patched `evaluate`)
_ACTIVE: contextvars.ContextVar[RunCosts | None] = contextvars.ContextVar(
    "dvoting_run_costs", default=None
)


class CostedList(list):
    """A filtered response that is a list (a task with `repeats` and no `take_first`),
    carrying its question's cost as the attribute `question_cost`."""


# ----------------------------------------------------------------- reading cost


def request_cost(instance: Any) -> dict[str, Any] | None:
    """The cost of one lm-eval `Instance`: its responses summed, or None if one carries none.

    Only the first `repeats` responses count: with several processes lm-eval pads a rank
    by sending its last instance again and appends those copies' responses to it.
    """
    responses = list(instance.resps)
    repeats = getattr(instance, "repeats", None)
    if repeats:
        responses = responses[:repeats]
    if not responses or not all(_carries_cost(r) for r in responses):
        return None
    return {
        "requests": len(responses),
        "nfe": sum(r.nfe for r in responses),
        "n_samples": sum(r.n_samples for r in responses),
        "settings": [getattr(r, "settings", None) for r in responses],
    }


def _carries_cost(response: Any) -> bool:
    return isinstance(response, CostedText) and all(hasattr(response, f) for f in _FIGURES.values())


def _carrying(value: Any, cost: dict[str, Any]) -> Any:
    """`value` (a filtered response) carrying its question's `cost`, or `value` itself when
    its type cannot carry attributes (then the task reports no cost metric: `_after_filters`)."""
    if isinstance(value, str):
        carried = CostedText(value, **getattr(value, "__dict__", {}))
    elif isinstance(value, list):
        carried = CostedList(value)
    else:
        return value
    carried.question_cost = cost
    return carried


def question_metrics(results: Iterable[Any]) -> dict[str, float] | None:
    """``nfe`` and ``n_samples`` of one question from the filtered responses lm-eval hands
    `process_results` (one per instance of the document), or None if one carries no cost."""
    costs = [getattr(r, "question_cost", None) for r in results]
    if not costs or any(c is None for c in costs):
        return None
    return {metric: float(sum(c[metric] for c in costs)) for metric in COST_METRICS}


# ----------------------------------------------------------------- run ledger


@dataclass
class RunCosts:
    """The cost of the responses one evaluation's results are built on, per task.

    `tasks` maps a task name to the sums ``questions`` (documents), ``requests`` (one per
    repeat), ``nfe`` and ``samples``; `settings` are the distinct settings the responses
    ran with. Each rank holds its own part until it is sent to rank 0 (`take_unsent`).
    """

    tasks: dict[str, Counter] = field(default_factory=dict)
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    sent: bool = False

    def add(self, task_name: str, instances: list[Any], costs: dict[int, dict[str, Any]]) -> None:
        """Count a task's instances (`costs`: id(instance) -> `request_cost`)."""
        sums = self.tasks.setdefault(task_name, Counter())
        questions = set()
        for instance in instances:
            cost = costs.get(id(instance))
            if cost is None:
                continue
            questions.add(instance.doc_id)
            sums.update(requests=cost["requests"], nfe=cost["nfe"], samples=cost["n_samples"])
            for settings in cost["settings"]:
                if settings is not None:
                    self.settings.setdefault(json.dumps(settings, sort_keys=True), settings)
        sums.update(questions=len(questions))

    def take_unsent(self) -> RunCosts | None:
        """This rank's part for rank 0, once (lm-eval gathers up to twice per evaluation)."""
        if self.sent:
            return None
        self.sent = True
        return RunCosts(
            {name: Counter(c) for name, c in self.tasks.items()}, dict(self.settings), sent=True
        )

    def merge(self, other: RunCosts) -> None:
        """Add another rank's part (documents are split between ranks, never shared)."""
        for name, sums in other.tasks.items():
            self.tasks.setdefault(name, Counter()).update(sums)
        for key, settings in other.settings.items():
            self.settings.setdefault(key, settings)

    def totals(self) -> dict[str, Any]:
        """Sums over all tasks, with the means per request (``mean_nfe``, ``mean_samples``)."""
        totals: Counter[str] = Counter()
        for sums in self.tasks.values():
            totals.update(sums)
        result = {key: totals[key] for key in ("questions", "requests", "nfe", "samples")}
        if result["requests"]:
            result["mean_nfe"] = result["nfe"] / result["requests"]
            result["mean_samples"] = result["samples"] / result["requests"]
        return result

    def by_task(self) -> dict[str, dict[str, int]]:
        return {
            name: {key: sums[key] for key in ("questions", "requests", "nfe", "samples")}
            for name, sums in sorted(self.tasks.items())
        }

    def settings_used(self) -> list[dict[str, Any]]:
        """The distinct settings, in a fixed order (the same for any number of ranks)."""
        return [self.settings[key] for key in sorted(self.settings)]


# ----------------------------------------------------------------- lm-eval patches


def _after_filters(task: Any) -> None:
    """Attach each question's cost to its filtered responses; count the task in the ledger."""
    instances = list(getattr(task, "_instances", None) or [])
    costs = {}
    for instance in instances:
        cost = request_cost(instance)
        if cost is not None:
            costs[id(instance)] = cost
    if not costs:
        return  # another model's plain responses, or log-likelihoods: nothing to report
    task_name = instances[0].task_name or getattr(task, "task_name", "?")
    carried: dict[int, dict[str, Any]] = {}
    uncarried: dict[str, str] = {}  # filter -> the type of a value it output that cannot carry cost
    for instance in instances:
        cost = costs.get(id(instance))
        if cost is None:
            continue
        figures = {key: cost[key] for key in ("requests", "nfe", "n_samples")}
        carried[id(instance)] = {}
        for key, value in instance.filtered_resps.items():
            carried[id(instance)][key] = _carrying(value, figures)
            if not hasattr(carried[id(instance)][key], "question_cost"):
                uncarried.setdefault(key, type(value).__name__)
    if uncarried:
        # a mean over only the questions whose value could carry it would be silently wrong
        log.warning(
            "task %s: filter(s) %s output %s, which cannot carry the cost, so the task reports "
            "no nfe/n_samples metrics; its sums are in results['config']['dvoting']['tasks']",
            task_name,
            sorted(uncarried),
            sorted(set(uncarried.values())),
        )
    else:
        for instance in instances:
            instance.filtered_resps.update(carried.get(id(instance), {}))
        _add_cost_metrics(task)
    ledger = _ACTIVE.get()
    if ledger is not None:
        ledger.add(task_name, instances, costs)


def _add_cost_metrics(task: Any) -> None:
    """Make `task` report ``nfe``/``n_samples`` per question (wrapping its own methods, on
    this task object only, so any Task subclass works and no other task is touched)."""
    lm_eval_seam.patch_instance(task, "task_results", "costs", _with_cost_figures)
    lm_eval_seam.patch_instance(task, "task_aggregation", "costs", _with_cost_aggregation)
    lm_eval_seam.patch_instance(task, "task_higher_is_better", "costs", _with_cost_direction)


def _with_cost_figures(process_results: Callable[..., Any]) -> Callable[..., Any]:
    def process_results_with_cost(doc: Any, results: Any) -> dict[str, Any]:
        metrics = process_results(doc, results)
        figures = question_metrics(results)
        if figures is None or not isinstance(metrics, dict):
            return metrics
        # per question, all repeats summed: replaces a per-response figure a task may report
        return {**metrics, **figures}

    return process_results_with_cost


def _with_cost_aggregation(aggregation: Callable[[], Any]) -> Callable[[], Any]:
    def aggregation_with_cost() -> dict[str, Any]:
        from lm_eval.api.metrics import mean

        return {**aggregation(), **{metric: mean for metric in COST_METRICS}}

    return aggregation_with_cost


def _with_cost_direction(higher_is_better: Callable[[], Any]) -> Callable[[], Any]:
    def higher_is_better_with_cost() -> dict[str, Any]:
        return {**higher_is_better(), **{metric: False for metric in COST_METRICS}}

    return higher_is_better_with_cost


def _wrap_apply_filters(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def apply_filters(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        _after_filters(self)
        return out

    return apply_filters


def _group_cost(group: Any, task_metrics: dict[str, Any]) -> dict[str, float]:
    """A group's ``nfe``/``n_samples`` per question over all its tasks' questions, under each
    filter name its tasks use; nothing unless every task of the group reports cost."""
    leaves = [task.task_name for task in group.get_all_tasks()]
    filters: set[str] = set()
    weighted = {metric: 0.0 for metric in COST_METRICS}
    questions = 0
    for name in leaves:
        metrics = task_metrics.get(name) or {}
        size = metrics.get("sample_len", 0)
        for metric in COST_METRICS:
            keys = sorted(k for k in metrics if k.partition(",")[0] == metric)
            if not keys:
                return {}
            filters.update(k.partition(",")[2] for k in keys)
            weighted[metric] += metrics[keys[0]] * size  # every filter holds the same cost
        questions += size
    if not leaves or not questions:
        return {}
    return {
        f"{metric},{name}": weighted[metric] / questions
        for metric in COST_METRICS
        for name in sorted(filters)
    }


def _wrap_group_aggregate(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def aggregate(self: Any, task_metrics: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        result = original(self, task_metrics, *args, **kwargs)
        if isinstance(result, dict):
            result.update(_group_cost(self, task_metrics))
        return result

    return aggregate


def _wrap_evaluate(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def evaluate(*args: Any, **kwargs: Any) -> Any:
        model = _costed_model(kwargs["lm"] if "lm" in kwargs else (args[0] if args else None))
        if model is None:
            return original(*args, **kwargs)
        token = _ACTIVE.set(model.begin_cost_run())
        try:
            return original(*args, **kwargs)
        finally:
            _ACTIVE.reset(token)

    return evaluate


def _costed_model(lm: Any) -> Any:
    """The dvoting model behind `lm` (lm-eval's `CachingLM` wraps it for `--use_cache`)."""
    for _ in range(4):
        if lm is None or callable(getattr(type(lm), "begin_cost_run", None)):
            return lm
        lm = lm.__dict__.get("lm") if hasattr(lm, "__dict__") else None
    return None


def install() -> None:
    """Patch lm-eval (idempotent): tasks report cost, groups aggregate it, runs keep a ledger.

    `Task.apply_filters` is patched for task classes that do not override it, and
    `ConfigurableTask`'s own override beside it."""
    lm_eval_seam.patch("task_filters", "costs", _wrap_apply_filters)
    lm_eval_seam.patch("configurable_task_filters", "costs", _wrap_apply_filters)
    lm_eval_seam.patch("group_aggregate", "costs", _wrap_group_aggregate)
    lm_eval_seam.patch("evaluate", "costs", _wrap_evaluate)
