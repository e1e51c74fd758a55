"""Result bookkeeping: what a model's requests cost and which settings they ran with.

`CostBook` holds one model's counts: the cost totals of the requests it computed, the part
of them not yet sent to rank 0 (data parallel), the settings its requests ran with, and the
last evaluation's cost ledger (`task_costs.RunCosts`, per task, cache hits included); its
`report` is the cost and settings part of `get_model_info`. `costed_text` builds each
response: the voted text carrying its request's cost, trace and settings. Nothing here
knows the model class or lm-eval's request objects: the harness hands over what they hold.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from lm_eval_dvoting.core.settings import StrategySettings, resolved_settings, used_settings
from lm_eval_dvoting.core.temporal import answer_runs
from lm_eval_dvoting.integration.costs import CostedText
from lm_eval_dvoting.integration.strict_json import json_safe
from lm_eval_dvoting.integration.task_costs import RunCosts

_FIGURES = ("requests", "nfe", "samples")  # the cost figures counted per request
__all__ = ["CostBook", "costed_text", "resolved_settings", "settings_entry", "used_settings"]


def settings_entry(settings: StrategySettings, seed: int) -> dict[str, Any]:
    """One `settings_used` entry: the settings a request ran with and read, resolved, and
    its seed."""
    return used_settings(settings) | {"seed": seed}


def costed_text(
    text: str, result: Any, candidate_texts: list[str], settings: dict[str, Any] | None
) -> CostedText:
    """The response: the voted `text` with its request's cost, trace and `settings`.

    `result` is the strategy's result for the request, `candidate_texts` its samples as
    texts. The settings travel with the text (and so into `--use_cache`), so that a rerun
    served from the cache reports the same `settings_used` and totals (task_costs.py).
    """
    votes = {answer[1]: count for answer, count in result.votes}
    trace = {
        "candidates": [
            {
                "text": candidate,
                "answer": _value(answer),
                "nfe": nfe,
                "kept_positions": kept,
                # generation-region token ids, for token-level measures (NUPR@k, pictures)
                "tokens": sample.tolist(),
            }
            for candidate, sample, answer, nfe, kept in zip(
                candidate_texts, result.samples, result.answers, result.sample_nfe, result.kept
            )
        ],
        "votes": votes,
        "chosen": result.chosen,
    }
    if getattr(result, "step_answers", None) is not None:
        add_step_answers(trace, result)
    return CostedText(
        text,
        nfe=result.nfe,
        n_samples=len(result.answers),
        votes=votes,
        trace=trace,
        settings=settings,
    )


def add_step_answers(trace: dict[str, Any], result: Any) -> None:
    """The temporal vote's part of a trace: `vote` "temporal", `winner` and `winner_share`
    (its weight over all answers' weight; None without a voted answer), `plain_vote` and
    `plain_votes` (the answer, and the counts, of one vote per sample's final answer),
    `returned_step` ([sample, step] when the response is that step's prediction rather
    than the sample's final text) and, per candidate, `steps`: its
    per-step answers as runs (`temporal.answer_runs`: [first step, answer or None], over its
    `nfe` steps)."""
    total = sum(weight for _, weight in result.votes)
    trace["vote"] = "temporal"
    trace["winner"] = _value(result.votes[0][0]) if result.votes else None
    trace["winner_share"] = result.votes[0][1] / total if result.votes and total > 0 else None
    trace["plain_vote"] = _value(result.plain_vote)
    trace["plain_votes"] = {_value(answer): count for answer, count in result.plain_votes or []}
    if result.returned_step is not None:  # the response is a step's prediction, not samples[chosen]
        trace["returned_step"] = [result.chosen, result.returned_step]
    for candidate, answers, nfe in zip(trace["candidates"], result.step_answers, result.sample_nfe):
        candidate["steps"] = answer_runs(answers, nfe, _value)


def _value(answer: Any) -> Any:
    # the harness's answers are (kind, value) pairs; the logs keep the value
    return None if answer is None else answer[1]


@dataclass
class CostBook:
    """One model's cost counts and settings used, since it was made or its strategy switched."""

    totals: Counter[str] = field(default_factory=Counter)  # requests this process computed
    unshared: Counter[str] = field(default_factory=Counter)  # their part not yet sent to rank 0
    # the settings requests really ran with (a task's max_gen_toks sets their length)
    settings_used: list[StrategySettings] = field(default_factory=list)
    run_costs: RunCosts | None = None  # the last evaluation's cost ledger (task_costs.py)
    computed_before: Counter[str] = field(default_factory=Counter)  # `totals` when it began

    def note_settings(self, settings: StrategySettings) -> None:
        """Record that a request runs with `settings` (each distinct value once, in order)."""
        if settings not in self.settings_used:
            self.settings_used.append(settings)

    def count(self, result: Any) -> None:
        """Add one computed request's cost (a strategy result's `nfe` and samples)."""
        self.totals.update(requests=1, nfe=result.nfe, samples=len(result.answers))
        self.unshared.update(requests=1, nfe=result.nfe, samples=len(result.answers))

    def begin_run(self) -> RunCosts:
        """A fresh cost ledger for the evaluation starting now; `report` describes it afterwards."""
        self.run_costs = RunCosts()
        self.computed_before = Counter(self.totals)
        return self.run_costs

    def unsent(self) -> tuple[dict[str, Any], RunCosts | None]:
        """What this rank sends rank 0: its totals not yet sent and its ledger's unsent part.

        The ledger's part is taken now; the totals stay until `mark_sent` (after the send).
        """
        run_part = self.run_costs.take_unsent() if self.run_costs is not None else None
        return dict(self.unshared), run_part

    def mark_sent(self) -> None:
        self.unshared = Counter()

    def merge(self, totals: dict[str, Any], run_part: RunCosts | None) -> None:
        """Add another rank's `unsent` figures (on rank 0, which reports them)."""
        self.totals.update(totals)
        if run_part is not None and self.run_costs is not None:
            self.run_costs.merge(run_part)

    def report(self, settings: StrategySettings, seed: int) -> dict[str, Any]:
        """``settings``, ``settings_used``, ``totals``, ``tasks`` and ``computed`` for
        `get_model_info`.

        ``settings`` are the model's own (`settings`, every one, defaults filled in). After an
        evaluation the rest describes its responses, computed or read from `--use_cache` alike
        (the ledger); before any, the requests computed here, each settings entry with `seed`
        and only the settings its decode read (`used_settings`). Standard JSON throughout
        (`strict_json.json_safe`: `alpha=inf` is "inf"), as it lands in lm-eval's results file.
        """
        if self.run_costs is None:
            totals: dict[str, Any] = {key: self.totals[key] for key in _FIGURES}
            used = [settings_entry(s, seed) for s in self.settings_used]
            tasks: dict[str, Any] = {}
            computed = dict(totals)
        else:
            totals = self.run_costs.totals()
            used = self.run_costs.settings_used()
            tasks = self.run_costs.by_task()
            computed = {key: self.totals[key] - self.computed_before[key] for key in _FIGURES}
        if totals["requests"] and "mean_nfe" not in totals:
            totals["mean_nfe"] = totals["nfe"] / totals["requests"]
            totals["mean_samples"] = totals["samples"] / totals["requests"]
        return json_safe(
            {
                "settings": resolved_settings(settings),
                "settings_used": used,
                "totals": totals,
                "tasks": tasks,
                "computed": computed,
            }
        )
