"""Standard JSON in every file the plugin writes: no NaN, no Infinity.

Python's `json` writes `NaN`, `Infinity` and `-Infinity` for non-finite floats, which no
strict parser accepts (JavaScript's `JSON.parse`, leaderboards' loaders, `jq` in strict
mode). A documented setting can be infinite (`alpha=inf`: no share of the positions is
remasked by the confidence bound) and a figure can be undefined, so every JSON the plugin
writes goes through `json_safe`, which encodes

* `inf` and `-inf` as the strings ``"inf"`` and ``"-inf"`` (as model args spell them;
  `float("inf")` reads them back), and
* NaN (a figure that does not exist, e.g. a document a run did not score) as ``null``.

Files: `dvoting compare`'s compare.json, lm-eval's results JSON and samples JSONL of a run
of a dvoting model (`install` patches lm-eval's `EvaluationTracker`, so lm-eval's own copies
of the model args, `config.model_args` and each task's `metadata`, are encoded too), the
`config.dvoting` block itself (`bookkeeping.CostBook.report`), and the bench scripts' JSON.
The result cache (`--use_cache`) stores pickles, not JSON.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any, Callable

from lm_eval_dvoting.integration import lm_eval_seam

# the encodings of the non-finite floats (NaN: None, written as null)
INFINITY, NEGATIVE_INFINITY = "inf", "-inf"


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float encoded (`inf` -> "inf", `-inf` -> "-inf", NaN ->
    None), inside dicts, lists and tuples (tuples become lists, as JSON writes them); anything
    else is returned as it is, for the writer's own `default` to convert."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return INFINITY if value > 0 else NEGATIVE_INFINITY
        return value
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """`json.dumps` of `json_safe(value)`, refusing (ValueError) any non-finite float left."""
    return json.dumps(json_safe(value), allow_nan=False, **kwargs)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name} (strict JSON has no NaN or Infinity)")


def loads_strict(text: str) -> Any:
    """`json.loads` as a strict parser reads: `NaN`, `Infinity` and `-Infinity` are refused."""
    return json.loads(text, parse_constant=_refuse_constant)


# ------------------------------------------------------------ lm-eval's writer


def _is_ours(tracker: Any, results: Any = None) -> bool:
    """Whether lm-eval's tracker is writing a run of a dvoting model (other models' files
    are left exactly as lm-eval writes them)."""
    general = getattr(tracker, "general_config_tracker", None)
    source = str(getattr(general, "model_source", None) or "")
    config = results.get("config") if isinstance(results, dict) else None
    return source.startswith("dvoting-") or (isinstance(config, dict) and "dvoting" in config)


def _wrap_aggregated(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def save_results_aggregated(self: Any, results: dict, samples: dict | None = None) -> None:
        if not _is_ours(self, results):
            return original(self, results=results, samples=samples)
        # an encoded copy is written; the caller keeps its own values (lm-eval's CLI prints
        # them next, formatting each stderr as a float) and gets back only what lm-eval adds
        # to `results` while saving (`task_hashes` and the tracker's general config)
        safe = json_safe(results)
        saved = original(self, results=safe, samples=samples)
        for key in safe.keys() - results.keys():
            results[key] = safe[key]
        for key in ("task_hashes", *_tracker_fields(self)):
            if key in safe:
                results[key] = safe[key]
        return saved

    return save_results_aggregated


def _tracker_fields(tracker: Any) -> tuple[str, ...]:
    """The keys lm-eval's `save_results_aggregated` writes into `results` from its tracker."""
    config = getattr(tracker, "general_config_tracker", None)
    return tuple(vars(config)) if config is not None and hasattr(config, "__dict__") else ()


def _wrap_samples(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def save_results_samples(self: Any, task_name: str, samples: list) -> None:
        if _is_ours(self):
            samples = json_safe(samples)
        return original(self, task_name=task_name, samples=samples)

    return save_results_samples


def install() -> None:
    """Patch lm-eval's `EvaluationTracker` (idempotent) so that a dvoting model's results JSON
    and samples JSONL hold standard JSON (`json_safe`)."""
    lm_eval_seam.patch("save_results", "strict_json", _wrap_aggregated)
    lm_eval_seam.patch("save_samples", "strict_json", _wrap_samples)
