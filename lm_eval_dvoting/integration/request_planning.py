"""Request planning: what each of lm-eval's generation requests asks for, as decoding jobs.

From a request's context and the task's generation kwargs (`GEN_KWARGS`) it works out
the request's settings (the task's `max_gen_toks` as the generation length, checked
against the family's block rule and the model's length: `task_length`;
`do_sample`/`temperature` for the one-decode strategies only
(`single`, `temporal`):
`task_sampling`), its stop strings, its answer kind (the task's `dvoting_answer`, else
`answers.infer_answer_kind` from the task name), its prompt ids (cut from the left to fit
the model's length) and its seed (run seed, task, document, context, repeat). The
harness (harness.py) hands the jobs to a strategy; this module knows nothing of the
model class, only what it is given: the model's settings and seed, its tokenizer (as an
`encode` function) and its lengths.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch

from lm_eval_dvoting.core.answers import infer_answer_kind, option_count
from lm_eval_dvoting.core.strategies import ONE_DECODE, StrategySettings, derive_seed
from lm_eval_dvoting.integration.arg_parsing import flag, whole_number

# the harness's logger: its warnings about a run's requests are where users (and tests)
# have always looked for them, whichever module words them
log = logging.getLogger("lm_eval_dvoting.integration.harness")

# gen_kwargs this model understands; anything else is rejected with this list
GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "dvoting_answer")


@dataclass(frozen=True)
class GenerationJob:
    """One request to decode: one repeat of one lm-eval instance."""

    position: int  # its index in the requests `generate_until` was given
    repeat: int  # its repeat index (requests.repeat_indices), part of its seed and cache key
    prompt: torch.Tensor
    settings: StrategySettings
    until: list[str]
    kind: str  # answer kind: what its samples' answers are extracted and voted as
    seed: int
    n_options: int | None = None  # a choice question's letter range (`answers.option_count`)


@dataclass(frozen=True)
class GenerationPlan:
    """The jobs of one `generate_until` call, longest first, and the requests not decoded."""

    jobs: list[GenerationJob]
    copies: dict[int, int]  # position of a padding copy -> the position whose text it repeats


@dataclass
class RequestPlanner:
    """Plans generation requests with one model's settings, seed, tokenizer and lengths."""

    settings: StrategySettings  # the model's (model args, or `use_strategy`'s)
    seed: int  # the run's sampling seed
    encode: Callable[[str], list[int]]  # context text -> token ids (the model's `tok_encode`)
    eot_token_id: int
    max_length: int  # prompt plus generation, in tokens
    reported: set[tuple[Any, ...]]  # task sampling values already reported unused this run
    # told each request's settings as soon as they are known (the model's `settings_used`)
    on_settings: Callable[[StrategySettings], None] = lambda settings: None
    # where `max_length` comes from, for the messages that refuse a length
    max_length_source: str = "the model's maximum length"

    def plan(self, requests: Sequence[Any], repeats: Sequence[int]) -> GenerationPlan:
        """Jobs for `requests` (`repeats`: their repeat indices), each (request, repeat) once.

        `repeats: N` sends the same instance N times; lm-eval's padding copies for data
        parallel repeat the first ones: each repeat is decoded (and counted) once.
        """
        first_of: dict[tuple[int, int], int] = {}  # (request, repeat index) -> its first position
        copies: dict[int, int] = {}
        jobs = []
        for position, (request, repeat) in enumerate(zip(requests, repeats)):
            if (id(request), repeat) in first_of:
                copies[position] = first_of[id(request), repeat]
                continue
            first_of[id(request), repeat] = position
            jobs.append(self.job(request, position, repeat))
        # longest prompts first, as lm-eval does, so padding stays small (a stable sort)
        jobs.sort(key=lambda job: -(job.prompt.numel() + job.settings.gen_length))
        return GenerationPlan(jobs, copies)

    def job(self, request: Any, position: int, repeat: int) -> GenerationJob:
        """The job for one repeat of one request (`request.args == (context, gen_kwargs)`)."""
        context, gen_kwargs = request.args
        settings, until, kind = self.request_settings(gen_kwargs, request.task_name)
        self.on_settings(settings)
        prompt = self.prompt_ids(context, settings.gen_length)
        seed = derive_seed(self.seed, request.task_name, request.doc_id, context, repeat)
        n_options = option_count(getattr(request, "doc", None), kind)
        return GenerationJob(position, repeat, prompt, settings, until, kind, seed, n_options)

    def request_settings(
        self, gen_kwargs: dict[str, Any] | None, task_name: str | None
    ) -> tuple[StrategySettings, list[str], str]:
        """Per-request settings, stop strings and answer kind from the task's gen_kwargs."""
        kwargs = dict(gen_kwargs or {})
        unknown = sorted(set(kwargs) - set(GEN_KWARGS))
        if unknown:
            raise ValueError(
                f"unknown generation kwargs {unknown} (task {task_name}); accepted: "
                f"{', '.join(GEN_KWARGS)}"
            )
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        settings = self.length_settings(kwargs, task_name)
        settings = task_sampling(settings, kwargs, task_name, self.reported)
        kind = infer_answer_kind(task_name, kwargs.get("dvoting_answer"))
        return settings, until, kind

    def length_settings(
        self, gen_kwargs: dict[str, Any] | None, task_name: str | None
    ) -> StrategySettings:
        """The settings with the generation length a request of `task_name` with these
        `gen_kwargs` really uses, checked against the block rules and the maximum length
        (`task_length`). The harness calls it per request, and once per task when lm-eval's
        `evaluate` starts (length_checks.py)."""
        return task_length(
            self.settings,
            dict(gen_kwargs or {}),
            task_name,
            self.max_length,
            self.max_length_source,
        )

    def prompt_ids(self, context: str, gen_length: int) -> torch.Tensor:
        """`context`'s token ids, cut from the left to leave room for `gen_length` tokens."""
        ids = self.encode(context) if context else []
        if not ids:
            ids = [self.eot_token_id]  # an empty context starts from end-of-text
        room = self.max_length - gen_length
        if room < 1:  # requests are refused before (task_length); this guards direct callers
            raise ValueError(
                f"max_gen_toks {gen_length} leaves no room for a prompt in "
                f"{self.max_length_source} of {self.max_length} tokens: give "
                f"max_gen_toks below {self.max_length}"
            )
        if len(ids) > room:
            log.warning(
                "context of %d tokens cut from the left to %d to fit %d generated tokens",
                len(ids),
                room,
                gen_length,
            )
            ids = ids[-room:]
        return torch.tensor(ids, dtype=torch.long)


def task_length(
    settings: StrategySettings,
    kwargs: dict[str, Any],
    task_name: str | None,
    max_length: int | None,
    max_length_source: str = "the model's maximum length",
) -> StrategySettings:
    """`settings` with the generation length a request really uses, checked: the task's
    `max_gen_toks` (its YAML, or `--gen_kwargs`, which lm-eval writes into it) when it
    gives one, else the model's (the model arg `max_gen_toks`, default 256).

    The model args' settings leave the length checks out (`defer_length_checks`), as a
    task's length replaces theirs; they are made here, per request and per task (lm-eval
    gives a task's length only with its requests), with the length in hand: the family's
    block rule (`StrategySettings.length_problem`) and room for a prompt in `max_length`.
    Each refusal names the length, where it comes from and how to change it there.
    `max_length` None (not known yet: `dvoting compare` before the model is loaded) skips the
    room check only; the block rules are checked all the same.
    """
    given = "max_gen_toks" in kwargs
    length, where = _task_length_source(settings, kwargs, task_name)
    # first: a length that fits (the example does) fixes both
    if max_length is not None and length >= max_length:
        example = _fitting_length(settings, max_length // 2)
        raise ValueError(
            f"max_gen_toks {length} ({where}) leaves no room for a prompt in "
            f"{max_length_source} of {max_length} tokens (prompt plus generation): "
            f"give a max_gen_toks below {max_length}, e.g. {example}, "
            f"{_how_to_set(given, str(example))}"
        )
    resized = replace(settings, gen_length=length, defer_length_checks=True)
    problem = resized.length_problem()
    if problem is not None:
        raise ValueError(
            f"max_gen_toks {length} ({where}) cannot be decoded: {problem}; "
            f"{resized.length_advice()}, {_how_to_set(given, 'N')}"
        )
    return replace(settings, gen_length=length)  # checked in full (the length too)


def _task_length_source(
    settings: StrategySettings, kwargs: dict[str, Any], task_name: str | None
) -> tuple[int, str]:
    """The length a task's requests use, and where it comes from (for the messages)."""
    if "max_gen_toks" in kwargs:
        length = whole_number("max_gen_toks", kwargs["max_gen_toks"], 1)
        return length, f"task {task_name}'s generation_kwargs: its YAML or --gen_kwargs"
    where = f"the model arg max_gen_toks, default 256: task {task_name} sets none"
    return settings.gen_length, where


def _how_to_set(given: bool, value: str) -> str:
    """How to give max_gen_toks `value`: where the task's own is (`given`) or the model's."""
    if given:  # lm-eval passes the task's own value with each request, over the model arg
        return (
            f"with --gen_kwargs max_gen_toks={value} (a task's own max_gen_toks overrides "
            "the model arg)"
        )
    return f"with --gen_kwargs max_gen_toks={value} or the model arg max_gen_toks={value}"


def _fitting_length(settings: StrategySettings, most: int) -> int:
    """The longest generation length up to `most` (at least 1) that these settings decode."""
    for length in range(max(most, 1), 0, -1):
        if replace(settings, gen_length=length, defer_length_checks=True).length_problem() is None:
            return length
    return 1


def task_sampling(
    settings: StrategySettings,
    kwargs: dict[str, Any],
    task_name: str | None,
    reported: set[tuple[Any, ...]],
) -> StrategySettings:
    """A task's (or `--gen_kwargs`') `do_sample`/`temperature`: used by `strategy=single` (and
    `temporal`, which decodes as `single` does), else reported.

    `strategy=single` samples at the task's temperature when `do_sample` is true and the
    temperature above 0 (as HF generate does), so `gsm8k-cot-self-consistency` works as
    the harness's own majority baseline. Every other value is not used: the strategy
    samples at its own temperature (the model arg `temperature`). Such a value is
    reported once per run and per distinct value (`reported` holds those already
    reported), never per request: see `_report_unused_sampling`.
    """
    asked = {key: kwargs[key] for key in ("do_sample", "temperature") if key in kwargs}
    if not asked:
        return settings
    do_sample, temperature = _sampling_asked(asked, task_name)
    single = settings.strategy in ONE_DECODE
    if single and do_sample and temperature > 0:
        return replace(settings, temperature=temperature)
    greedy_ask = not do_sample and temperature == 0
    if single and greedy_ask and settings.resolved_temperature == 0:
        return settings  # asked for greedy decoding, and that is what runs
    key = (settings.strategy, tuple(sorted((k, str(v)) for k, v in asked.items())))
    if key not in reported:
        reported.add(key)
        _report_unused_sampling(settings, asked, do_sample, temperature, task_name)
    return settings


def _sampling_asked(asked: dict[str, Any], task_name: str | None) -> tuple[bool, float]:
    """`do_sample` and `temperature` as the task gave them (absent: no sampling, 0)."""
    do_sample = asked.get("do_sample") is not None and flag("do_sample", asked["do_sample"])
    try:
        temperature = float(asked.get("temperature") or 0)
    except (TypeError, ValueError):
        raise ValueError(
            f"generation kwarg temperature must be a number, got {asked['temperature']!r} "
            f"(task {task_name})"
        ) from None
    return do_sample, temperature


def _report_unused_sampling(
    settings: StrategySettings,
    asked: dict[str, Any],
    do_sample: bool,
    temperature: float,
    task_name: str | None,
) -> None:
    """Say why the task's sampling values are not used and how to choose the temperature.

    A request for sampling or for a temperature is a WARNING; the greedy request every
    stock task carries by default (`do_sample: false`) only INFO, as voting strategies
    sample by design.
    """
    single = settings.strategy in ONE_DECODE
    runs_at = settings.resolved_temperature
    if not single:
        why = f"strategy={settings.strategy} samples at its own temperature {runs_at}"
    elif not do_sample and temperature > 0:
        why = (
            f"strategy={settings.strategy} samples only with do_sample=true (as HF generate does), "
            f"so it runs at temperature {runs_at}"
        )
    elif do_sample:
        why = (
            f"do_sample=true needs a temperature above 0; strategy={settings.strategy} runs at "
            f"temperature {runs_at}"
        )
    else:
        why = f"the model arg temperature={runs_at} is used"
    message = (
        f"generation kwargs {asked} (task {task_name}: its YAML or --gen_kwargs) are not used: "
        f"{why}; set the model arg temperature (--model_args temperature=...) to choose it"
        + (", or pass do_sample=true with the temperature" if single else "")
    )
    if not do_sample and temperature == 0:
        log.info(message)
    else:
        log.warning(message)


def generated_text(
    tokenizer: Any, end_token_ids: Sequence[int], tokens: torch.Tensor, until: list[str]
) -> str:
    """Decoded text up to the first end token, then cut at the first `until` string.

    Cut *before* the answer is extracted, so what is voted is what the task's filters see.
    """
    end_ids = set(end_token_ids)
    ids = tokens.tolist()
    cut = next((i for i, t in enumerate(ids) if t in end_ids), len(ids))
    text = tokenizer.decode(ids[:cut], skip_special_tokens=True)
    for stop in until:
        if stop:
            text = text.split(stop)[0]
    return text
