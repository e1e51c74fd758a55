"""The strategy settings, each declared once: `StrategySettings`' fields.

A field's declaration (`setting`) is everything there is to know about the setting: its
name, type and default (the dataclass's), how a model arg's text is read (`parse`: "text",
"whole", "real" or "flag", for the harness, which builds its model args from these
fields), the model arg's name where it differs (`gen_length` is `max_gen_toks`), the
model arg's default where it differs (`cache`: the model kind's, `parts.default_cache`),
its own value check, and whether every decode reads it (the settings that choose the parts;
the others are read by the parts that declare them, `core/parts/`).

The checks run at construction, before any model work: first each setting's own value
(in field order), then the combination of parts (`parts/checks.py`), each message naming
the setting, its value, what is allowed and what to do (the model args have the same names).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import InitVar, asdict, dataclass, field, fields
from typing import Any, Callable

from lm_eval_dvoting.core import parts
from lm_eval_dvoting.core.decoding.sampling import DREAM_ALGS
from lm_eval_dvoting.core.decoding.state import REMASKING_RULES, BlockDecoding, DreamDecoding
from lm_eval_dvoting.core.decoding.state import default_block_length as decoder_block_length
from lm_eval_dvoting.core.parts.checks import combination_problem
from lm_eval_dvoting.core.parts.rules.confidence import DEFAULT_THRESHOLD as CONFIDENCE_THRESHOLD
from lm_eval_dvoting.core.temporal import TEMPORAL_WEIGHTS

_NO_DEFAULT = object()


def setting(
    default: Any,
    parse: str | None,
    *,
    check: Callable[[StrategySettings], None] | None = None,
    arg: str | None = None,
    arg_default: Any = _NO_DEFAULT,
    every_decode: bool = False,
    allowed: str | None = None,
) -> Any:
    """One setting's declaration (see the module docstring); `parse` None: not a model arg."""
    metadata = dict(
        parse=parse,
        check=check,
        arg=arg,
        arg_default=default if arg_default is _NO_DEFAULT else arg_default,
        every_decode=every_decode,
        allowed=allowed,
    )
    return field(default=default, metadata=metadata)


def require_whole(name: str, value: Any, minimum: int | None, what_to_do: str) -> None:
    """Raise a ValueError unless `value` is an int (not a bool), >= `minimum` if one is given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        allowed = "a whole number" + ("" if minimum is None else f" >= {minimum}")
        raise ValueError(f"{name} must be {allowed}, got {value!r}: {what_to_do}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}: {what_to_do}")


def require_real(
    name: str,
    value: Any,
    allowed: str,
    ok: Callable[[float], bool],
    what_to_do: str,
    allow_inf: bool = False,
) -> None:
    """Raise a ValueError unless `value` is a real number (not a bool), finite unless
    `allow_inf`, for which `ok` holds (NaN never passes: every comparison with it is False)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number ({allowed}), got {value!r}: {what_to_do}")
    if math.isinf(value) and not allow_inf:
        raise ValueError(f"{name} must be finite ({allowed}), got {value}: {what_to_do}")
    if not ok(value):
        raise ValueError(f"{name} must be {allowed}, got {value}: {what_to_do}")


def require_choice(name: str, value: Any, kind: str, what: str = "") -> None:
    """Raise a ValueError unless `value` names a registered part of `kind`."""
    if value not in parts.names(kind):
        raise ValueError(f"{name} must be one of {parts.names(kind)}{what}, got {value!r}")


# ------------------------------------------------------------------ each setting's check

_LENGTH_TODO = (
    "set max_gen_toks (model arg or --gen_kwargs) to the answer length in tokens, e.g. 256"
)


def _check_strategy(s: StrategySettings) -> None:
    require_choice("strategy", s.strategy, "strategy")


def _check_gen_length(s: StrategySettings) -> None:
    require_whole("gen_length", s.gen_length, None, _LENGTH_TODO)
    if s.gen_length <= 0:
        raise ValueError(f"gen_length must be positive, got {s.gen_length}: {_LENGTH_TODO}")


def _check_block_length(s: StrategySettings) -> None:
    # 0 would divide by zero; a negative one "divides" the length
    if s.block_length is not None:
        what_to_do = f"leave it out (default gen_length/16) or give a divisor of {s.gen_length}"
        require_whole("block_length", s.block_length, 1, what_to_do)


def _check_steps(s: StrategySettings) -> None:
    if s.steps is not None:
        require_whole(
            "steps",
            s.steps,
            1,
            "leave it out (default: gen_length for single and decoder=dream, gen_length/2 for "
            "majority and hex; LLaDA2: 32 per block) or give the forward passes per sample "
            "(LLaDA2: per block)",
        )


def _check_temperature(s: StrategySettings) -> None:
    if s.temperature is not None:
        require_real(
            "temperature",
            s.temperature,
            ">= 0",
            lambda t: t >= 0,
            "use 0 for greedy decoding or e.g. 0.6-1.0 to sample; leave it out for the "
            "strategy's default",
        )


def _check_remasking(s: StrategySettings) -> None:
    if s.remasking not in REMASKING_RULES:
        raise ValueError(f"remasking must be one of {REMASKING_RULES}, got {s.remasking!r}")


def _check_hex_samples(s: StrategySettings) -> None:
    value = s.hex_samples
    if isinstance(value, bool) or not isinstance(value, int) or value not in (5, 25):
        raise ValueError(
            f"hex_samples must be 25 (5 block sizes x 5 seeds) or 5 (original HEX), got {value!r}"
        )


def _check_prefix_cache(s: StrategySettings) -> None:
    if not isinstance(s.prefix_cache, bool):
        raise ValueError(f"prefix_cache must be true or false, got {s.prefix_cache!r}")


def _check_decoder(s: StrategySettings) -> None:
    if s.decoder is not None and s.decoder not in decoders():
        raise ValueError(
            f"decoder must be one of {decoders()} (or left out for the strategy's own), "
            f"got {s.decoder!r}"
        )


def _check_cache(s: StrategySettings) -> None:
    if s.cache not in parts.names("cache"):
        raise ValueError(
            f"cache must be one of {parts.names('cache')}, got {s.cache!r}: none (exact, the "
            "default), prefix or dual (Fast-dLLM's approximate key/value caches)"
        )


def _check_threshold(s: StrategySettings) -> None:
    if s.threshold is None:
        return
    if s.block_decoding is None:
        which, example = "confidence decoder", "e.g. threshold=0.9 (Fast-dLLM's default)"
    else:
        which, example = "block diffusion", "e.g. threshold=0.95 (LLaDA2.0's default)"
    require_real(f"threshold ({which})", s.threshold, "in (0, 1]", lambda t: 0 < t <= 1, example)


def _check_temporal_weight(s: StrategySettings) -> None:
    if s.temporal_weight not in TEMPORAL_WEIGHTS:
        raise ValueError(
            f"temporal_weight must be one of {TEMPORAL_WEIGHTS}, got {s.temporal_weight!r}: "
            "exp (the default), linear or fixed"
        )


def _check_vote(s: StrategySettings) -> None:
    if s.vote is not None and s.vote not in parts.names("vote"):
        raise ValueError(
            f"vote must be one of {parts.names('vote')}, got {s.vote!r}: plain (one vote per "
            "sample) or temporal (each sample's per-step answers), or leave it out for the "
            "strategy's own"
        )


def _check_block_decoding(s: StrategySettings) -> None:
    if s.block_decoding is not None and s.block_decoding not in block_decodings():
        raise ValueError(
            f"block_decoding must be one of {tuple(block_decodings())} (threshold: LLaDA2.0; "
            f"quality, speed: LLaDA2.1's presets), got {s.block_decoding!r}"
        )


def _check_alg(s: StrategySettings) -> None:
    if s.alg not in DREAM_ALGS:
        raise ValueError(
            f"alg must be one of {DREAM_ALGS} (Dream's algorithms, decoder=dream), got "
            f"{s.alg!r}: e.g. alg=entropy (Dream's model card, the default)"
        )


def _check_top_p(s: StrategySettings) -> None:
    if s.top_p is not None:
        require_real(
            "top_p", s.top_p, "in (0, 1]", lambda p: 0 < p <= 1, "e.g. 0.95 (Dream's model card)"
        )


def _check_top_k(s: StrategySettings) -> None:
    if s.top_k is not None:
        require_whole("top_k", s.top_k, 1, "leave it out (no top-k filter) or give e.g. 50")


def _real_check(name: str, allowed: str, ok: Callable[[float], bool], todo: str, **kw: Any) -> Any:
    """The check of a real-valued setting `name` (its field, with `require_real`)."""
    field_name = name.split(" ")[0]
    return lambda s: require_real(name, getattr(s, field_name), allowed, ok, todo, **kw)


def decoders() -> tuple[str, ...]:
    """The commit rules `decoder=` chooses (block diffusion's are the model name's)."""
    return tuple(r.name for r in parts.parts("rule") if r.block_preset is None)


def block_decodings() -> dict[str, tuple[float, float | None]]:
    """Block diffusion's rules: name -> (threshold, editing_threshold) preset."""
    return {r.name: r.block_preset for r in parts.parts("rule") if r.block_preset is not None}


# ------------------------------------------------------------------ the settings


@dataclass(frozen=True)
class StrategySettings:
    """Everything that decides a strategy's samples (each is a model arg in the harness)."""

    strategy: str = setting("dvoting", "text", check=_check_strategy, every_decode=True)
    # the answer length L; the model arg max_gen_toks (a task's own replaces it)
    gen_length: int = setting(
        256, "whole", check=_check_gen_length, arg="max_gen_toks", every_decode=True
    )
    # default L/16 (temporal: 32 where it divides L; LLaDA2: 32)
    block_length: int | None = setting(None, "whole", check=_check_block_length)
    n: int = setting(
        5,
        "whole",
        check=lambda s: require_whole("n (samples per question)", s.n, 1, "e.g. n=5 (the default)"),
    )
    # alpha=inf is allowed: every entropy is finite, so it commits every masked position at once
    alpha: float = setting(
        0.3,
        "real",
        check=_real_check(
            "alpha (entropy threshold)",
            ">= 0",
            lambda a: a >= 0,
            "e.g. alpha=0.3 (the default)",
            allow_inf=True,
        ),
    )
    # default per strategy (`Strategy.default_temperature`)
    temperature: float | None = setting(None, "real", check=_check_temperature, every_decode=True)
    tau: float = setting(
        1.0,
        "real",
        check=_real_check(
            "tau (position-consistency share)",
            "in (0, 1]",
            lambda t: 0 < t <= 1,
            "e.g. tau=1.0 (the default: keep a position only when every earlier sample agrees)",
        ),
    )
    # default per strategy: L (single, rfg), L/2 (the others); LLaDA2: 32 per block
    steps: int | None = setting(None, "whole", check=_check_steps)
    remasking: str = setting("low_confidence", "text", check=_check_remasking)
    hex_samples: int = setting(25, "whole", check=_check_hex_samples, allowed="25 or 5")
    # the older spelling of cache="prefix"
    prefix_cache: bool = setting(False, "flag", check=_check_prefix_cache, every_decode=True)
    # a `decoder=` commit rule (parts/rules/); default: the strategy's (`Strategy.default_rule`)
    decoder: str | None = setting(None, "text", check=_check_decoder, every_decode=True)
    # a cache policy (parts/caches/): "none" (exact), "prefix" or "dual" (Fast-dLLM's, faster
    # at long lengths, slightly different samples), "block" (LLaDA2's, exact); the model arg
    # left out is the model kind's (`parts.default_cache`)
    cache: str = setting("none", "text", check=_check_cache, arg_default=None, every_decode=True)
    # the confidence decoder's (default 0.9, Fast-dLLM's) or block diffusion's (default the
    # preset's): `resolved_threshold`
    threshold: float | None = setting(None, "real", check=_check_threshold)
    # the temporal vote's weight of a step's answer, exp(temporal_alpha * s / T), (s + 1) / T
    # or 1 (temporal.py); 5.0 is the TSCV release's README example (its batch script uses 11;
    # which value the paper's tables used we could not read)
    temporal_weight: str = setting("exp", "text", check=_check_temporal_weight)
    temporal_alpha: float = setting(
        5.0,
        "real",
        check=_real_check(
            "temporal_alpha", ">= 0", lambda a: a >= 0, "e.g. temporal_alpha=5.0 (the default)"
        ),
    )
    # how the samples' answers are combined (parts/votes/); default: the strategy's
    vote: str | None = setting(None, "text", check=_check_vote, every_decode=True)
    # strategy=rfg: the guidance strength w of (1 + w) log p_policy - w log p_ref (guidance.py)
    guidance: float = setting(
        1.0,
        "real",
        check=_real_check(
            "guidance (RFG strength w)",
            ">= 0",
            lambda w: w >= 0,
            "e.g. guidance=1.0 (the default); 0 decodes the policy alone",
        ),
    )
    # decoder=dream: Dream's `alg` (what orders the masked positions), `alg_temp` (0: the most
    # confident commit; > 0: drawn from softmax(confidence / alg_temp)) and `eps` (timesteps
    # linspace(1, eps, steps + 1)); defaults: Dream-v0-Instruct-7B's model card and its
    # generation config
    alg: str = setting("entropy", "text", check=_check_alg)
    alg_temp: float = setting(
        0.0,
        "real",
        check=_real_check(
            "alg_temp", ">= 0", lambda a: a >= 0, "e.g. alg_temp=0 (Dream's model card)"
        ),
    )
    eps: float = setting(
        1e-3,
        "real",
        check=_real_check("eps", "in (0, 1)", lambda e: 0 < e < 1, "e.g. eps=1e-3 (Dream's)"),
    )
    # the sampling filters of every rule (decoding/sampling.py; Dream's semantics): None is off
    top_p: float | None = setting(None, "real", check=_check_top_p)
    top_k: int | None = setting(None, "whole", check=_check_top_k)
    # block diffusion's rule (LLaDA2 models; None for LLaDA and Dream), set by the model name
    # (and LLaDA2.1's model arg `editing`), so not a model arg of its own
    block_decoding: str | None = setting(None, None, check=_check_block_decoding, every_decode=True)
    # LLaDA2.1's editing threshold (default the preset's) and post-fill steps per block
    editing_threshold: float | None = setting(None, "real")
    max_post_steps: int = setting(16, "whole")
    # Not a setting (not stored, compared, fingerprinted or reported): True skips the checks of
    # `gen_length` against the block rules (`length_problem`). The model args' settings are
    # made so, as their `gen_length` is only the length of the requests whose task gives no
    # max_gen_toks; every request's settings are checked with the length it really uses
    # (request_planning.task_length). `replace` makes checked settings unless it is passed.
    defer_length_checks: InitVar[bool] = False

    def __post_init__(self, defer_length_checks: bool = False) -> None:
        for declared in fields(self):
            check = declared.metadata.get("check")
            if check is not None:
                check(self)
            if declared.name == "block_length" and not defer_length_checks:
                problem = self._block_problem()
                if problem is not None:
                    raise ValueError(f"{problem}; choose a block length that divides it")
        problem = combination_problem(self)
        if problem is not None:
            raise ValueError(problem)
        # one spelling from here on, so that equal settings compare (and fingerprint) equal
        if self.prefix_cache:
            object.__setattr__(self, "cache", "prefix")
        object.__setattr__(self, "prefix_cache", self.cache == "prefix")
        if not defer_length_checks and self._hex_problem() is not None:
            raise ValueError(self._hex_problem())

    # ------------------------------------------------------------- the parts chosen

    @property
    def strategy_part(self) -> type[parts.Strategy]:
        return parts.strategy(self.strategy)

    @property
    def rule_part(self) -> type[parts.CommitRule]:
        return parts.commit_rule(self.resolved_decoder)

    def _known_rule(self) -> type[parts.CommitRule] | None:
        """The commit rule, or None while an unknown `decoder` awaits its own check (the
        block length is checked before it, in field order)."""
        known = self.resolved_decoder in parts.names("rule")
        return self.rule_part if known else None

    @property
    def vote_part(self) -> type[parts.Vote]:
        return parts.vote(self.resolved_vote)

    @property
    def cache_part(self) -> type[parts.CachePolicy]:
        return parts.cache_policy(self.cache)

    # ------------------------------------------------------------- lengths

    def length_problem(self) -> str | None:
        """Why `gen_length` cannot be decoded with these settings (None: it can).

        Each family's block rule: LLaDA and Dream decode the answer in blocks of
        `resolved_block_length` that tile it, so the block length must divide the length;
        block diffusion (LLaDA2) aligns its blocks (32 unless `block_length` is given) to the
        first prompt token and cuts the last one at the length, so any length decodes
        (decoding/blocks.py, as upstream: ../shared/design/LLADA2_DECODING.md section 1).
        Hex reads no block_length (its own block sizes L/32..L/2), so only hex's rule
        applies to it: a length divisible by 32, in every family.
        """
        return self._block_problem() or self._hex_problem()

    def length_advice(self) -> str:
        """What would fit, for the `length_problem` these settings have (block length or length)."""
        length, block = self.gen_length, self.resolved_block_length
        if self._block_problem() is None:
            return "give a max_gen_toks divisible by 32"  # hex's (hex has no block problem)
        divisors = ", ".join(str(d) for d in range(1, length + 1) if length % d == 0)
        if self.block_length is not None:
            return (
                f"give block_length a divisor of {length} ({divisors}), or a max_gen_toks that "
                f"is a multiple of {block}"
            )
        # a multiple of 16 always fits the default (L/16 divides it; temporal's 32 where it divides)
        return (
            f"give the model arg block_length, a divisor of {length} ({divisors}), or a "
            "max_gen_toks that is a multiple of 16"
        )

    def _block_problem(self) -> str | None:
        # a strategy that reads no block_length (hex: its own block sizes L/32..L/2) has its
        # own length rule (`_hex_problem`); a given one is warned as unused, not refused
        if (
            "block_length" not in self.strategy_part.reads
            or self.block_decoding is not None
            or self.gen_length % self.resolved_block_length == 0
        ):
            return None
        block = self.resolved_block_length
        if self.block_length is not None:
            which = f"block_length {block}"
        else:
            which = f"the default block length {block} ({self.strategy_part.default_block_doc})"
        return f"{which} does not divide the generation length {self.gen_length}"

    def _hex_problem(self) -> str | None:
        return self.strategy_part.length_problem(self)

    # ------------------------------------------------------------- resolved values

    def dream_settings(self) -> DreamDecoding:
        """Dream's algorithm settings (`decoder=dream`, parts/rules/dream.py)."""
        return DreamDecoding(alg=self.alg, alg_temp=self.alg_temp, eps=self.eps)

    def block_settings(self) -> BlockDecoding:
        """Block diffusion's rule settings (`decoding/blocks.py`)."""
        threshold, editing = block_decodings()[self.block_decoding]
        if self.editing_threshold is not None:
            editing = self.editing_threshold
        return BlockDecoding(
            threshold=self.resolved_threshold,
            steps=self.steps,
            editing_threshold=editing,
            max_post_steps=self.max_post_steps,
        )

    @property
    def resolved_threshold(self) -> float:
        """The threshold in use: given, or the confidence decoder's 0.9, or block diffusion's
        preset."""
        if self.threshold is not None:
            return self.threshold
        if self.block_decoding is None:
            return CONFIDENCE_THRESHOLD
        return block_decodings()[self.block_decoding][0]

    @property
    def passes_per_step(self) -> int:
        """Forward passes per denoising step: 2 for rfg (policy and reference), else 1."""
        return self.strategy_part.passes_per_step

    @property
    def resolved_vote(self) -> str:
        """ "temporal" (the answers of every step of every sample, `temporal.py`) or "plain"."""
        return self.vote if self.vote is not None else self.strategy_part.default_vote

    @property
    def resolved_decoder(self) -> str:
        """ "entropy" (dVoting's threshold rule), "fixed" (LLaDA's schedule of `steps`),
        "confidence" (Fast-dLLM's), or for LLaDA2 its block decoding ("threshold", "quality",
        "speed")."""
        if self.block_decoding is not None:
            return self.block_decoding
        if self.decoder is not None:
            return self.decoder
        return self.strategy_part.default_rule

    def commit_rule(self) -> dict[str, Any]:
        """The decoder's setting as `DecodeRow` takes it: `steps` (fixed schedule, as it
        really runs), `alpha` (entropy threshold) or `threshold` (confidence threshold)."""
        return self.rule_part.row_settings(self)

    @property
    def resolved_block_length(self) -> int:
        if self.block_length is not None:
            return self.block_length
        rule = self._known_rule()
        rule_own = None if rule is None else rule.default_block_length(self.gen_length)
        if rule_own is not None:  # LLaDA2's 32; Dream's whole answer
            return rule_own
        own = self.strategy_part.default_block_length(self.gen_length)
        return own if own is not None else decoder_block_length(self.gen_length)

    @property
    def resolved_temperature(self) -> float:
        if self.temperature is not None:
            return self.temperature
        return self.strategy_part.default_temperature(self)

    @property
    def resolved_steps(self) -> int:
        """Steps per sample (LLaDA, Dream) or per block (LLaDA2.0, before the cap at the answer
        length)."""
        if self.steps is not None:
            return self.steps
        rule = self._known_rule()
        rule_own = None if rule is None else rule.default_steps_for(self.gen_length)
        if rule_own is not None:  # LLaDA2's 32 per block; Dream's answer length
            return rule_own
        return self.gen_length if self.strategy_part.full_steps else self.gen_length // 2

    @property
    def steps_run(self) -> int | list[int] | None:
        """The denoising steps a fixed-schedule sample really takes (`steps` rounded up to a
        multiple of the block count); for hex one value per block size (L/32 .. L/2); None
        for the other rules (dVoting's entropy rule follows no schedule and ignores `steps`)."""
        if not self.rule_part.runs_steps:
            return None
        return self.strategy_part.steps_run(self)


def setting_fields() -> tuple[Any, ...]:
    """The declared settings (dataclass fields), in declaration order."""
    return fields(StrategySettings)


def read_by_every_decode() -> tuple[str, ...]:
    """The settings every decode reads: those that choose its parts, and the length."""
    return tuple(f.name for f in fields(StrategySettings) if f.metadata["every_decode"])


def unused_settings(settings: StrategySettings) -> tuple[str, ...]:
    """The fields of `settings` that its strategy, commit rule and vote do not read (each
    part's `reads`; the settings that choose the parts are read by every decode), in field
    order."""
    read = {
        *read_by_every_decode(),
        *settings.strategy_part.reads,
        *settings.rule_part.reads,
        *settings.vote_part.reads,
    }
    return tuple(f.name for f in fields(settings) if f.name not in read)


def resolved_settings(settings: StrategySettings) -> dict[str, Any]:
    """`settings` as a dict, every field, with the per-strategy defaults filled in: the
    one place the resolved settings are built (the model's `settings` in its results, each
    request's `settings_used` and the result cache's fingerprint are made from it)."""
    return asdict(settings) | {
        "block_length": settings.resolved_block_length,
        "temperature": settings.resolved_temperature,
        "steps": settings.resolved_steps,
        # `steps` as the schedule really runs it (rounded up per block)
        "steps_run": settings.steps_run,
        "decoder": settings.resolved_decoder,
        "vote": settings.resolved_vote,
        "threshold": settings.resolved_threshold,
    }


def used_settings(settings: StrategySettings) -> dict[str, Any]:
    """`resolved_settings` without those that the strategy, its commit rule and its vote do
    not read (`unused_settings`; `steps_run` goes with `steps`): what decided the outputs."""
    unused = set(unused_settings(settings))
    if "steps" in unused:
        unused.add("steps_run")
    return {
        name: value for name, value in resolved_settings(settings).items() if name not in unused
    }
