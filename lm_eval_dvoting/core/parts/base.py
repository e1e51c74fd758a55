"""What a part of a decode is: a `Strategy`, a `CommitRule`, a `CachePolicy` or a `Vote`.

Each part is a small class in a file of its own under `core/parts/<kind>/`, registered by
the `register` decorator when its folder is discovered (`core/parts/__init__.py`). A part
states, as class attributes:

* `name` (the value of its selecting setting: `strategy=`, `decoder=`, `cache=`, `vote=`)
  and `order` (its place in the lists users see in messages, e.g. `strategy must be one of
  ('single', ...)`);
* `reads`: the `StrategySettings` fields it reads. A setting that no part of a decode reads
  is unused there (`strategies.unused_settings`): warned about when given, and left out of
  `settings_used` and of the result cache's fingerprint;
* its capabilities, which the combination checks (`core/parts/checks.py`) read instead of
  naming pairs of parts: e.g. a cache's `predicts_beyond_block`, a vote's
  `needs_whole_prediction`, the model kinds (`BIDIRECTIONAL`, `BLOCK_CAUSAL`) each works with.

Parts hold no state: the registry keeps the class itself, and every method is a
classmethod over the settings.
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

from lm_eval_dvoting.core.parts.registry import (  # first: see registry.py
    BIDIRECTIONAL,
    BLOCK_CAUSAL,
    REGISTRY,
    names,
    parts,
    register,
)
from lm_eval_dvoting.core.parts.samples import QuestionPlan, SameAnswer, fixed_steps

# `core.settings.StrategySettings`, which imports the parts (not imported here: no circle)
StrategySettings = Any

__all__ = ["BIDIRECTIONAL", "BLOCK_CAUSAL", "REGISTRY", "names", "parts", "register"]


class Part:
    """The common declaration of every part (see the module docstring)."""

    kind: ClassVar[str] = ""  # "strategy", "rule", "cache" or "vote": the registry it joins
    name: ClassVar[str] = ""
    order: ClassVar[int] = 0
    reads: ClassVar[tuple[str, ...]] = ()
    models: ClassVar[tuple[str, ...]] = (BIDIRECTIONAL,)


class Strategy(Part):
    """Which samples to draw for a question and how they are combined."""

    kind = "strategy"
    # the task's do_sample/temperature apply (one decode per request, as HF generate)
    follows_task_sampling: ClassVar[bool] = False
    default_rule: ClassVar[str] = "fixed"  # the commit rule when `decoder` is left out
    default_vote: ClassVar[str] = "plain"  # the vote when `vote` is left out
    temperature: ClassVar[float] = 0.0  # the sampling temperature when it is left out
    full_steps: ClassVar[bool] = False  # default steps: L (True) or L/2 (False)
    passes_per_step: ClassVar[int] = 1  # forward passes per denoising step
    # what `decoder=`, `vote=` and `cache=` it accepts (None: every one), and why not
    rules: ClassVar[tuple[str, ...] | None] = None
    rule_refusal: ClassVar[str] = ""  # formatted with `rule`
    votes: ClassVar[tuple[str, ...] | None] = None
    vote_refusal: ClassVar[str] = ""  # formatted with `vote`
    caches: ClassVar[tuple[str, ...] | None] = None
    cache_refusal: ClassVar[str] = ""  # formatted with `cache`
    block_causal_refusal: ClassVar[str] = ""  # why it does not decode LLaDA2 (when it doesn't)
    # block diffusion: its fresh samples keep their block cache for later samples to share
    shares_block_cache: ClassVar[bool] = False
    default_block_doc: ClassVar[str] = "max_gen_toks/16"  # the default block length, in words

    @classmethod
    def default_temperature(cls, settings: StrategySettings) -> float:
        """The temperature it samples at when `temperature` is left out."""
        return cls.temperature

    @classmethod
    def default_block_length(cls, gen_length: int) -> int | None:
        """Its own default block length for this length (None: the decoder's, L/16)."""
        return None

    @classmethod
    def steps_run(cls, settings: StrategySettings) -> int | list[int]:
        """The steps a fixed-schedule sample really takes (`steps` rounded up per block)."""
        return fixed_steps(
            settings.resolved_steps, settings.gen_length, settings.resolved_block_length
        )

    @classmethod
    def length_problem(cls, settings: StrategySettings) -> str | None:
        """Why it cannot decode `settings.gen_length` beyond the block rule (None: it can)."""
        return None

    @classmethod
    def plan(
        cls, settings: StrategySettings, mask_id: int, same_answer: SameAnswer | None
    ) -> QuestionPlan:
        """The coroutine of one question: yields draws of samples, receives (tokens, answer)."""
        raise NotImplementedError(f"strategy {cls.name} has no plan")


class CommitRule(Part):
    """Which masked positions a step commits (LLaDA's schedule, dVoting's entropy, ...)."""

    kind = "rule"
    # block diffusion's rules are chosen by the model name (`block_decoding`), the others by
    # `decoder=`; `label` is how messages name the rule
    block_preset: ClassVar[tuple[float, float | None] | None] = None
    # settings refused when given (not merely unused), with why: name -> message template
    # formatted with `settings` (e.g. LLaDA2.0's threshold rule and LLaDA2.1's editing)
    refused_when_given: ClassVar[dict[str, str]] = {}
    # its own defaults of the block length and of `steps` (None: the strategy's)
    block_length: ClassVar[int | None] = None
    default_steps: ClassVar[int | None] = None
    # whether it runs a schedule of `steps` per sample (rounded up per block: `steps_run`)
    runs_steps: ClassVar[bool] = False

    @classmethod
    def default_block_length(cls, gen_length: int) -> int | None:
        """Its own default block length for this answer length (None: the strategy's)."""
        return cls.block_length

    @classmethod
    def default_steps_for(cls, gen_length: int) -> int | None:
        """Its own default `steps` for this answer length (None: the strategy's)."""
        return cls.default_steps

    @classmethod
    def label(cls) -> str:
        if cls.block_preset is not None:
            return f"LLaDA2's block decoding {cls.name}"
        return f"decoder={cls.name}"

    @classmethod
    def row_settings(cls, settings: StrategySettings) -> dict[str, Any]:
        """Its settings as `DecodeRow` takes them: by default the row names the rule
        (`rule`); the built-in rules' rows carry their setting (steps, alpha, threshold or
        block) instead, as `generate` takes it."""
        return dict(steps=None, alpha=None, threshold=None, rule=cls.name)

    @classmethod
    def decodes(cls, row: Any) -> bool:
        """Whether it decodes the `DecodeRow` `row`: a row that names it (`row.rule`). The
        row batch (`RowDecoder`) gives a row to the first rule, in `order`, that decodes it;
        the built-in rules also take the rows their setting selects (`selects`)."""
        return row.rule == cls.name or (row.rule is None and cls.selects(row))

    @classmethod
    def selects(cls, row: Any) -> bool:
        """Whether the row's settings select it when the row names no rule (e.g. `steps`
        given: the fixed schedule). A new rule is chosen by name only."""
        return False

    @classmethod
    def worker(cls, mask_id: int, end_ids: Sequence[int]) -> Any:
        """Its arithmetic for one row batch (one per `RowDecoder`): `block_start(row)`,
        `is_done(row)`, `begin(index, row, window) -> RowWork` (the positions whose logits
        it wants this step) and `commit(works) -> works going on` (decoding/rules.py's
        `RowWork`; `end_ids` are the model's end-of-text tokens)."""
        raise NotImplementedError(f"commit rule {cls.name} has no worker")


class CachePolicy(Part):
    """What a step's forward pass covers, and which keys and values it keeps."""

    kind = "cache"
    # whether a pass computes the prediction at every masked position (the temporal vote
    # needs it), or only at the current block's
    predicts_beyond_block: ClassVar[bool] = True
    # why an observing vote (vote=temporal) cannot run with it, formatted with `which`
    whole_prediction_refusal: ClassVar[str] = ""
    # the model kinds whose default it is when `cache` is left out (`parts.default_cache`)
    default_for: ClassVar[tuple[str, ...]] = ()
    # whether its passes use the model's key/value cache (this package's LLaDA/Dream models)
    uses_cache: ClassVar[bool] = True

    @classmethod
    def pass_group(cls) -> type[CachePolicy]:
        """The policy whose pass its rows share (itself; `dual` rows share `prefix`'s): the
        forward pass (`decoding/caches.py`'s `ForwardPass`) groups a step's rows by it."""
        return cls

    @classmethod
    def run_pass(
        cls,
        forward: Any,
        rows: Sequence[Any],
        members: list[int],
        starts: Sequence[int],
        keeps: Sequence[bool],
        logits: Any,
    ) -> None:
        """Run this step's pass (or passes) for the `DecodeRow`s `rows[i]`, i in `members`
        (batch order), and add their outputs to `logits` (`StepLogits.add`). `forward` is
        the `ForwardPass` (model, pad id, device, `block_lengths`); `starts[i]`: row i's
        current block start, `keeps[i]`: whether a later step in that block could reuse
        what this pass keeps (both empty when no row of the step `uses_cache`)."""
        raise NotImplementedError(f"cache policy {cls.name} has no pass")


class Vote(Part):
    """How the samples' answers are combined into the question's answer."""

    kind = "vote"
    needs_whole_prediction: ClassVar[bool] = False  # observes every step's whole prediction

    @classmethod
    def result(
        cls, question: Any, settings: StrategySettings, same_answer: SameAnswer | None
    ) -> Any:
        """The question's `StrategyResult` from its samples (`strategies._Question`: their
        tokens, answers and, when `needs_whole_prediction`, their steps' answers)."""
        raise NotImplementedError(f"vote {cls.name} has no result")
