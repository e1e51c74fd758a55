"""Strategies: which rows to decode next for a question, when to stop, and the vote.

The parts a decode is composed of are declared once each, in a file of their own
(`core/parts/`): the strategies (single, majority, hex, dvoting, temporal, rfg), the commit
rules (fixed, entropy, confidence, LLaDA2's block rules), the cache policies and the votes.
Their settings are `core/settings.py`'s `StrategySettings`. This module drives them:

A strategy is a small coroutine per question (`question_plan`, the strategy part's `plan`):
it yields *draws* of samples (samples in one draw do not depend on each other, so they
decode side by side) and receives their tokens back. `run_strategy` drives many questions
through one `RowDecoder`, refilling a row's slot as soon as it finishes, so prompts that stop
early leave the batch at once. Every sample draws from its own generator, seeded
from the question's seed and the sample's index: no draw depends on the batch size
or on which questions run beside it (nor, in float32, do the results; in bfloat16 and
float16 the logits can change in the last bit with the batch's padding, see
the decoding package).

A setting that no part of the chosen decode reads (the parts' `reads`) is unused
(`unused_settings`): reported when given (`unused_setting_message`), and left out of
`settings_used` and of the result cache's fingerprint, as it changes no output.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Hashable, Sequence

import torch

from lm_eval_dvoting.core import parts
from lm_eval_dvoting.core.answers import tally
from lm_eval_dvoting.core.decoding import DecodeRow, RowDecoder, check_prompt_batch
from lm_eval_dvoting.core.decoding.kept import shared_block_prefix
from lm_eval_dvoting.core.parts.samples import (
    QuestionPlan,
    SameAnswer,
    SampleSpec,
    remask_tokens,
    should_stop_early,
)
from lm_eval_dvoting.core.parts.strategies.hex import BLOCK_DIVISORS as HEX_BLOCK_DIVISORS
from lm_eval_dvoting.core.parts.strategies.temporal import BLOCK_LENGTH as TEMPORAL_BLOCK_LENGTH
from lm_eval_dvoting.core.settings import (
    StrategySettings,
    block_decodings,
    decoders,
    read_by_every_decode,
    require_real,
    require_whole,
    unused_settings,
)
from lm_eval_dvoting.core.temporal import StepAnswer, StepAnswers

# The registered parts' names and who reads which setting, as the parts declare them (for
# callers that read the lists; a new part's file adds itself to them)
STRATEGIES = parts.names("strategy")
# the strategies that decode one sample per request, like HF generate: they follow the
# task's do_sample/temperature (the others sample at their own temperature by design)
ONE_DECODE = tuple(s.name for s in parts.parts("strategy") if s.follows_task_sampling)
VOTES = parts.names("vote")
DECODERS = decoders()
BLOCK_DECODINGS = block_decodings()
LLADA2_BLOCK_LENGTH = parts.commit_rule("threshold").block_length
READ_BY_EVERY_DECODE = read_by_every_decode()
READ_BY_STRATEGY = {s.name: s.reads for s in parts.parts("strategy")}
READ_BY_RULE = {r.name: r.reads for r in parts.parts("rule")}
READ_BY_VOTE = {v.name: v.reads for v in parts.parts("vote")}

__all__ = [
    "BLOCK_DECODINGS",
    "DECODERS",
    "HEX_BLOCK_DIVISORS",
    "ONE_DECODE",
    "STRATEGIES",
    "TEMPORAL_BLOCK_LENGTH",
    "VOTES",
    "QuestionPlan",
    "SampleSpec",
    "StrategyResult",
    "StrategySettings",
    "decode_questions",
    "derive_seed",
    "question_plan",
    "remask_tokens",
    "require_real",
    "require_whole",
    "run_strategy",
    "should_stop_early",
    "unused_settings",
]

log = logging.getLogger(__name__)

Answer = Hashable
Extract = Callable[[torch.Tensor], Answer | None]


def given_unused_settings(settings: StrategySettings) -> tuple[str, ...]:
    """The unused settings that hold a value other than their default, i.e. were given.

    A setting given at its default value counts as not given: it changes nothing either way
    (the harness's model args have the dataclass's defaults)."""
    defaults = {f.name: f.default for f in fields(StrategySettings)}
    return tuple(
        name for name in unused_settings(settings) if getattr(settings, name) != defaults[name]
    )


def unused_setting_message(settings: StrategySettings, name: str) -> str:
    """Why the given setting `name` does nothing here, who reads it, and what happens to it."""
    readers = (
        [f"strategy={s.name}" for s in parts.parts("strategy") if name in s.reads]
        + [r.label() for r in parts.parts("rule") if name in r.reads]
        + [f"vote={v.name}" for v in parts.parts("vote") if name in v.reads]
    )
    return (
        f"{name}={getattr(settings, name)!r} is not used by strategy={settings.strategy} "
        f"({settings.rule_part.label()}, vote={settings.resolved_vote}): only "
        f"{', '.join(readers)} read it. It is left out of settings_used and of the result "
        "cache's fingerprint; drop it, or choose a strategy, decoder or vote that reads it"
    )


def report_unused_settings(
    settings: StrategySettings, reported: set[str], logger: logging.Logger
) -> None:
    """Warn about each given setting that `settings` do not use, once per `reported` set
    (one per run: the harness keeps one per model, across its strategy switches)."""
    for name in given_unused_settings(settings):
        message = unused_setting_message(settings, name)
        if message not in reported:
            reported.add(message)
            logger.warning(message)


@dataclass
class StrategyResult:
    """One question's outcome."""

    samples: torch.Tensor  # (samples drawn, gen_length)
    nfe: int  # forward passes summed over samples
    answers: list[Any]
    chosen: int  # index of the returned sample
    sample_nfe: list[int] = field(default_factory=list)
    votes: list[tuple[Any, float]] = field(
        default_factory=list
    )  # answer, count (temporal: total weight)
    kept: list[list[int] | None] = field(default_factory=list)  # per sample: fixed positions
    # the temporal vote (strategy=temporal, vote=temporal): the prediction returned instead
    # of samples[chosen] when no sample's final answer is the winner (the latest step
    # carrying it), each sample's (step, answer) pairs, and what the plain vote gave
    returned: torch.Tensor | None = None
    returned_step: int | None = None  # the step of samples[chosen] whose prediction `returned` is
    step_answers: list[list[StepAnswer]] | None = None
    plain_votes: list[tuple[Any, float]] | None = (
        None  # (answer, count) as the plain vote counts them
    )

    @property
    def plain_vote(self) -> Any:
        """The answer one vote per sample's final answer gives (None: no sample answered)."""
        return self.plain_votes[0][0] if self.plain_votes else None

    @property
    def returned_tokens(self) -> torch.Tensor:
        """The tokens whose text is the question's response."""
        return self.returned if self.returned is not None else self.samples[self.chosen]


def question_plan(
    settings: StrategySettings, mask_id: int, same_answer: SameAnswer | None
) -> QuestionPlan:
    """The coroutine of one question: yields draws of samples, receives (tokens, answer) pairs
    (the strategy part's `plan`)."""
    return settings.strategy_part.plan(settings, mask_id, same_answer)


def derive_seed(*pieces: Any) -> int:
    """A 63-bit seed from any printable pieces, stable across processes and platforms."""
    # surrogatepass: a context with lone surrogates (broken data) still gets a seed
    digest = hashlib.sha256("\x1f".join(map(str, pieces)).encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@dataclass
class _Question:
    """One question in flight: its plan, what its samples gave so far, and the samples of
    its current draw (specs not yet decoding, and the rows decoding them)."""

    index: int
    seed: int
    plan: QuestionPlan
    answer_of: Callable[[torch.Tensor], Any]
    samples: list[torch.Tensor] = field(default_factory=list)
    answers: list[Any] = field(default_factory=list)
    sample_nfe: list[int] = field(default_factory=list)
    kept: list[list[int] | None] = field(default_factory=list)
    to_start: list[SampleSpec] = field(
        default_factory=list
    )  # the current draw's specs not yet decoding
    decoding: list[DecodeRow] = field(default_factory=list)  # the current draw's rows
    done: bool = False
    passes: int = 1  # forward passes per denoising step (2 for rfg: policy and reference)
    observed: bool = False  # whether its samples' per-step answers are kept (the temporal vote)
    steps: list[StepAnswers] = field(default_factory=list)  # per sample drawn, when observed
    draw_steps: list[StepAnswers] = field(
        default_factory=list
    )  # per row of the current draw, when observed
    donor: DecodeRow | None = (
        None  # block diffusion: a finished sample whose kept keys and values later ones share
    )

    def next_sample_seed(self) -> int:
        """The seed of the next sample to start: derived from the question's seed and the
        sample's index, so no draw depends on the batch or on the other questions."""
        return derive_seed(self.seed, len(self.samples) + len(self.decoding))

    def take_draw(self, rows: list[DecodeRow]) -> list[tuple[torch.Tensor, Any]]:
        """Record a finished draw's samples; return (tokens, answer) per sample for the plan."""
        tokens = [row.answer_tokens.cpu() for row in rows]
        if self.donor is None:
            self.donor = next(
                (row for row in rows if row.keep_cache and row.kept is not None), None
            )
        for row in rows:
            if row is not self.donor:
                row.kept = None  # only the donor's keys and values are shared
        answers = [self.answer_of(t) for t in tokens]
        self.samples += tokens
        self.answers += answers
        for steps, row, sample, answer in zip(self.draw_steps, rows, tokens, answers):
            steps.close(row.nfe - 1, sample, answer)
        self.steps, self.draw_steps = self.steps + self.draw_steps, []
        self.sample_nfe += [row.nfe * self.passes for row in rows]
        self.kept += [
            None if row.owner.kept is None else row.owner.kept.nonzero().flatten().tolist()
            for row in rows
        ]
        return list(zip(tokens, answers))

    def result(self, same_answer: SameAnswer | None) -> StrategyResult:
        """The vote over the samples; the chosen sample is the first carrying the winner."""
        votes = tally(self.answers, same_answer)
        return StrategyResult(
            samples=torch.stack(self.samples),
            nfe=sum(self.sample_nfe),
            answers=self.answers,
            chosen=votes.winner_index if votes.winner_index is not None else 0,
            sample_nfe=self.sample_nfe,
            votes=votes.counts,
            kept=self.kept,
        )


def run_strategy(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    extract: Extract,
    gen_length: int,
    seed: int = 0,
    same_answer: SameAnswer | None = None,
    row_seeds: Sequence[int] | None = None,
    max_rows: int = 16,
    on_done: Callable[[int, StrategyResult], None] | None = None,
    **settings: Any,
) -> list[StrategyResult]:
    """Run a strategy on every (left-padded) prompt row of `input_ids`; no harness needed.

    `settings`: `StrategySettings`' fields by name (`strategy="dvoting"`, `n`, `decoder`,
    `cache`, `vote`, ...), each with its declared default; `cache` and, for a block-causal
    model (LLaDA2), `block_decoding` left out are the model kind's (`_run_settings`).
    `extract` maps a sample's generated ids (1-D) to a hashable answer or None, grouped by
    `same_answer` (default `==`). Row i's samples are seeded from `row_seeds[i]` (default:
    from `seed` and i); `max_rows` caps the rows per forward pass; `on_done(i, result)` is
    called as each question finishes. A given setting that no part of the decode reads
    (`unused_settings`) is reported in a warning. `strategy="rfg"` needs a
    `guidance.GuidedModel` (its NFE counts both models' passes).
    """
    settings_of_run = _run_settings(model, dict(settings, gen_length=gen_length))
    report_unused_settings(settings_of_run, set(), log)  # each call is a run of its own
    prompts, seeds = _prompt_rows(model, input_ids, attention_mask, seed, row_seeds)
    return decode_questions(
        model,
        prompts,
        settings_of_run,
        extract,
        seeds,
        same_answer=same_answer,
        max_rows=max_rows,
        on_done=on_done,
    )


def _prompt_rows(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    seed: int,
    row_seeds: Sequence[int] | None,
) -> tuple[list[torch.Tensor], Sequence[int]]:
    """Each row's prompt without its padding, and its seed (derived from `seed` and the row
    index unless `row_seeds` are given)."""
    attention_mask = check_prompt_batch(input_ids, attention_mask, model)
    batch = input_ids.shape[0]
    if row_seeds is None:
        require_whole("seed", seed, None, "give an integer seed, e.g. seed=0")
        row_seeds = [derive_seed(seed, i) for i in range(batch)]
    return [input_ids[i][attention_mask[i].bool()] for i in range(batch)], row_seeds


def _run_settings(model: torch.nn.Module, given: dict[str, Any]) -> StrategySettings:
    """`run_strategy`'s settings: the given ones, with the model kind's where they are left
    out: a block-causal model (LLaDA2) decodes by block diffusion, `block_decoding`
    "threshold" (LLaDA2.0; "quality" and "speed" are LLaDA2.1's presets), and `cache` is
    `parts.default_cache`'s (none, exact; LLaDA2: block, exact too)."""
    block_causal = bool(getattr(model, "block_causal", False))
    if block_causal and given.get("block_decoding") is None:
        given["block_decoding"] = "threshold"
    if given.get("cache") is None:
        strategy = given.get("strategy", StrategySettings.strategy)
        given["cache"] = parts.default_cache(
            strategy, given.get("vote"), given.get("block_decoding") is not None
        )
    return StrategySettings(**given)


def decode_questions(
    model: torch.nn.Module,
    prompts: Sequence[torch.Tensor],
    settings: StrategySettings | Sequence[StrategySettings],
    extract: Extract | Sequence[Extract],
    seeds: Sequence[int],
    *,
    same_answer: SameAnswer | None = None,
    max_rows: int = 16,
    on_done: Callable[[int, StrategyResult], None] | None = None,
) -> list[StrategyResult]:
    """Decode every question's samples through one decoder, refilling freed slots.

    `settings` and `extract` may be given per question (e.g. requests with different
    generation lengths or answer kinds). Questions enter in order; a question's next
    draw enters as soon as its previous one is complete.
    """
    count = len(prompts)
    # max_rows < 1 would never admit a row: the scheduler would spin forever
    require_whole(
        "max_rows", max_rows, 1, "give the number of rows decoded per forward pass, e.g. 16"
    )
    settings_of = list(settings) if isinstance(settings, Sequence) else [settings] * count
    extract_of = list(extract) if isinstance(extract, Sequence) else [extract] * count
    if len(seeds) != count or len(settings_of) != count or len(extract_of) != count:
        raise ValueError(
            f"got {count} prompts but {len(seeds)} seeds, {len(settings_of)} settings and "
            f"{len(extract_of)} extractors: give one of each per prompt (or one settings/extract "
            "for all)"
        )
    decoder = RowDecoder(_model_for(model, settings_of))
    plan = (prompts, settings_of, extract_of, seeds, same_answer, max_rows, on_done)
    return _Scheduler(decoder, *plan).run()


def _model_for(model: torch.nn.Module, settings_of: Sequence[StrategySettings]) -> torch.nn.Module:
    """The model to decode: for strategy=rfg a `guidance.GuidedModel` at the settings'
    guidance; a guided model decodes nothing else (its NFE would count one pass of two)."""
    from lm_eval_dvoting.core.guidance import GuidedModel

    guided = {s.guidance for s in settings_of if s.strategy == "rfg"}
    if not settings_of:
        return model  # nothing to decode
    if not guided:
        if isinstance(model, GuidedModel):
            raise ValueError(
                "a GuidedModel (policy and reference) decodes strategy=rfg only; pass the policy "
                "itself for the other strategies"
            )
        return model
    if len(guided) != 1 or any(s.strategy != "rfg" for s in settings_of):
        raise ValueError(
            "strategy=rfg decodes with one guidance strength and no other strategy in the same "
            "run; "
            f"got guidance {sorted(guided)} and strategies "
            f"{sorted({s.strategy for s in settings_of})}"
        )
    if not isinstance(model, GuidedModel):
        raise ValueError(
            "strategy=rfg needs a GuidedModel(policy, reference) (lm_eval_dvoting.core.guidance): "
            "the "
            "harness builds it from reference=... or peft=...; got a "
            f"{type(model).__name__}"
        )
    return model.with_guidance(guided.pop())


class _Scheduler:
    """Feeds the questions' samples to one `RowDecoder`: fills free rows (the waiting
    samples of questions in flight first, then new questions), steps the decoder, and
    hands each finished draw back to its question's plan, which says what to draw next."""

    def __init__(
        self,
        decoder: RowDecoder,
        prompts: Sequence[torch.Tensor],
        settings_of: list[StrategySettings],
        extract_of: list[Extract],
        seeds: Sequence[int],
        same_answer: SameAnswer | None,
        max_rows: int,
        on_done: Callable[[int, StrategyResult], None] | None,
    ) -> None:
        self.decoder, self.prompts, self.settings_of, self.extract_of = (
            decoder,
            prompts,
            settings_of,
            extract_of,
        )
        self.seeds, self.same_answer, self.max_rows, self.on_done = (
            seeds,
            same_answer,
            max_rows,
            on_done,
        )
        self.results: list[StrategyResult | None] = [None] * len(prompts)
        self.in_flight: list[_Question] = []
        self.next_question = 0

    def run(self) -> list[StrategyResult]:
        while True:
            self._fill_free_rows()
            self._collect_finished_draws()  # rows that needed no decoding at all
            if not self.decoder.active:
                if not self.in_flight and self.next_question >= len(self.prompts):
                    break
                continue
            self.decoder.step()
            self._collect_finished_draws()
        return [r for r in self.results if r is not None]

    def _fill_free_rows(self) -> None:
        while len(self.decoder.active) < self.max_rows:
            question = next((q for q in self.in_flight if q.to_start), None)
            if question is not None:
                self._start_sample(question)
            elif self.next_question < len(self.prompts):
                self._start_question()
            else:
                break

    def _start_question(self) -> None:
        index = self.next_question
        self.next_question += 1
        plan = question_plan(self.settings_of[index], self.decoder.mask_id, self.same_answer)
        question = _Question(
            index=index,
            seed=self.seeds[index],
            plan=plan,
            answer_of=self.extract_of[index],
            observed=self.settings_of[index].vote_part.needs_whole_prediction,
            passes=self.settings_of[index].passes_per_step,
        )
        self.in_flight.append(question)
        self._begin_draw(question, next(plan, None))

    def _start_sample(self, question: _Question) -> None:
        """Start the next sample of `question`'s draw as a row of the decoder."""
        spec = question.to_start.pop(0)
        settings = self.settings_of[question.index]
        row = self._row(question, spec, settings)
        if (
            spec.kept is not None
            and question.donor is not None
            and question.donor.block_length == row.block_length
        ):
            row.kept = shared_block_prefix(question.donor, row.prompt, row.tokens)
        # dVoting's fresh samples keep their block cache for the remask samples to share
        row.keep_cache = (
            settings.cache == "block"
            and settings.strategy_part.shares_block_cache
            and question.donor is None
        )
        question.decoding.append(row)
        self.decoder.add(row)

    def _row(self, question: _Question, spec: SampleSpec, settings: StrategySettings) -> DecodeRow:
        """The decoder's row of one sample: its spec, its own generator, and the observer of
        its steps when the question's vote needs them."""
        generator = torch.Generator(device=self.decoder.device).manual_seed(
            question.next_sample_seed()
        )
        steps = StepAnswers(question.answer_of) if question.observed else None
        if steps is not None:
            question.draw_steps.append(steps)
        sample = len(question.samples) + len(question.decoding) + 1
        return DecodeRow(
            prompt=self.prompts[question.index],
            tokens=spec.init_tokens,
            block_length=spec.block_length,
            steps=spec.steps,
            alpha=spec.alpha,
            threshold=spec.threshold,
            block=spec.block,
            rule=spec.rule,
            dream=spec.dream,
            temperature=spec.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k,
            remasking=settings.remasking,
            generator=generator,
            cache=settings.cache,
            owner=spec,
            observe=None if steps is None else steps.observe,
            label=f"question {question.index}, sample {sample}",  # how an error names the row
        )

    def _begin_draw(self, question: _Question, draw: list[SampleSpec] | None) -> None:
        """The plan's next draw, or the question's result when the plan is over. A draw of no
        samples is refused: the question would wait for samples that never come, and the
        scheduler would spin."""
        if draw is None:
            self._finish(question)
        elif not draw:
            strategy = self.settings_of[question.index].strategy
            raise RuntimeError(
                f"strategy={strategy}'s plan asked for a draw of no samples for question "
                f"{question.index} after {len(question.samples)} sample(s): the question could "
                "never finish; this is a bug in the plan (question_plan), please report it with "
                "the settings"
            )
        else:
            question.to_start, question.decoding = list(draw), []

    def _collect_finished_draws(self) -> None:
        active = {id(row) for row in self.decoder.active}
        for question in self.in_flight:
            if question.done or question.to_start or not question.decoding:
                continue
            if any(id(row) in active for row in question.decoding):
                continue
            rows, question.decoding = question.decoding, []
            try:
                self._begin_draw(question, question.plan.send(question.take_draw(rows)))
            except StopIteration:
                self._finish(question)
        self.in_flight = [q for q in self.in_flight if not q.done]

    def _finish(self, question: _Question) -> None:
        question.done = True
        question.donor = None  # its kept keys and values are no longer needed
        settings = self.settings_of[question.index]
        result = settings.vote_part.result(question, settings, self.same_answer)
        self.results[question.index] = result
        if self.on_done is not None:
            self.on_done(question.index, result)
