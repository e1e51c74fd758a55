"""Strategies: which rows to decode next for a question, when to stop, and the vote.

* `single`   one sample, fixed schedule, `steps = L`, temperature 0.
* `majority` `n` fresh samples, fixed schedule, `steps = L/2`, temperature 0.9, vote.
  (`decoder="entropy"` gives either of these dVoting's entropy-threshold decoder
  instead of the fixed schedule: the ablation rows of `dvoting compare`.)
* `hex`      block sizes L/32..L/2 x `hex_samples/5` seeds, `steps = L/2`, vote
             (`hex_samples=25`: temperature 0.9; `hex_samples=5`: the original HEX at 0).
* `temporal` one sample decoded as `single` decodes it (fixed schedule, block 32,
             `steps = L/2`, temperature 0: the TSCV paper's settings), answered by a vote over
             the answers of its steps (`temporal.py`): no extra forward pass.
             (`vote="temporal"` gives majority, hex and dvoting the same vote over the steps
             of all their samples, each sample's weights normalised: not in either paper.)
* `rfg`      one sample decoded as `single` decodes it, from a `guidance.GuidedModel`:
             the policy's logits guided by a reference model's, two passes per step
             (RFG, arXiv 2509.25604).
* `dvoting`  ALGORITHM.md section 2: samples 1..floor(n/2)+1 fresh, later ones keep the
             positions the earlier samples agree on (share >= tau) and regenerate the
             rest (always the last quarter), with the answer-consistency early stop
             before samples 3..n, decoded with the entropy-threshold rule.

A strategy is a small coroutine per question (`question_plan`): it yields *draws* of
samples (samples in one draw do not depend on each other, so they decode side by side)
and receives their tokens back. `run_strategy` drives many questions through one
`RowDecoder`, refilling a row's slot as soon as it finishes, so prompts that stop
early leave the batch at once. Every sample draws from its own generator, seeded
from the question's seed and the sample's index: no draw depends on the batch size
or on which questions run beside it (nor, in float32, do the results; in bfloat16 and
float16 the logits can change in the last bit with the batch's padding, see
the decoding package).
"""

from __future__ import annotations

import hashlib
import logging
import math
import numbers
from dataclasses import InitVar, dataclass, field, fields, replace
from typing import Any, Callable, Generator, Hashable, Sequence

import torch

from lm_eval_dvoting.core.answers import tally
from lm_eval_dvoting.core.decoding import (
    CACHE_POLICIES,
    REMASKING_RULES,
    DecodeRow,
    RowDecoder,
    check_prompt_batch,
    default_block_length,
)
from lm_eval_dvoting.core.decoding.caches import shared_block_prefix
from lm_eval_dvoting.core.decoding.state import LLADA2_STEPS, BlockDecoding
from lm_eval_dvoting.core.temporal import TEMPORAL_WEIGHTS, StepAnswer, StepAnswers, temporal_vote

STRATEGIES = ("single", "majority", "hex", "dvoting", "temporal", "rfg")
# the strategies that decode one sample per request, like HF generate: they follow the
# task's do_sample/temperature (the others sample at their own temperature by design)
ONE_DECODE = ("single", "temporal", "rfg")
VOTES = ("plain", "temporal")
TEMPORAL_BLOCK_LENGTH = 32  # the TSCV paper's block length (its code's default), when it divides L
# How a sample is decoded: LLaDA's fixed schedule (`steps` forward passes, a fixed number
# of tokens committed per step) or dVoting's entropy threshold (every masked position of
# the block whose entropy is below `alpha` per step, at least one). `decoder=entropy` on
# `single`/`majority` is the ablation that tells dVoting's decoder from its voting.
# "confidence" is Fast-dLLM's rule (commit the most confident masked position of the block
# and every other one whose candidate's probability is >= `threshold`), for single, majority
# and, instead of its entropy rule, dvoting.
DECODERS = ("fixed", "entropy", "confidence")
HEX_BLOCK_DIVISORS = (32, 16, 8, 4, 2)  # block sizes L/32 .. L/2
# Block diffusion (LLaDA2, decoding/blocks.py), set by the model class: "threshold" is
# LLaDA2.0's threshold decoding, "quality" and "speed" LLaDA2.1's joint threshold decoding
# with its model card's presets. Value: (threshold, editing_threshold); sources:
# LLaDA2.0's model card and tech report (0.95), LLaDA2.1's model card "Best Practices".
BLOCK_DECODINGS: dict[str, tuple[float, float | None]] = {
    "threshold": (0.95, None),
    "quality": (0.7, 0.5),
    "speed": (0.5, 0.0),
}
LLADA2_BLOCK_LENGTH = 32  # both model cards' block_length (and SGLang's hard-coded value)

# Which `StrategySettings` fields each part of a decode reads, declared per part: the
# strategy, its commit rule (`resolved_decoder`: LLaDA's fixed schedule, dVoting's entropy
# rule, Fast-dLLM's confidence rule, LLaDA2's block rules) and its vote. No cache policy
# reads a setting beyond `cache` itself. A field that no part of the chosen decode reads is
# unused (`unused_settings`): reported when given (`unused_setting_message`), and left out
# of `settings_used` and of the result cache's fingerprint, as it changes no output.
READ_BY_EVERY_DECODE = (
    "strategy",
    "gen_length",
    "temperature",
    "decoder",
    "cache",
    "prefix_cache",
    "vote",
    "block_decoding",
)
READ_BY_STRATEGY: dict[str, tuple[str, ...]] = {
    "single": ("block_length",),
    "majority": ("block_length", "n"),
    "hex": ("hex_samples",),  # its own block lengths, L/32 .. L/2
    "dvoting": ("block_length", "n", "tau"),
    "temporal": ("block_length",),
    "rfg": ("block_length", "guidance"),
}
READ_BY_RULE: dict[str, tuple[str, ...]] = {
    "fixed": ("steps", "remasking"),
    "entropy": ("alpha",),
    "confidence": ("threshold",),
    "threshold": ("threshold", "steps"),  # LLaDA2.0 (steps per block)
    "quality": ("threshold", "editing_threshold", "max_post_steps"),  # LLaDA2.1's presets
    "speed": ("threshold", "editing_threshold", "max_post_steps"),
}
READ_BY_VOTE: dict[str, tuple[str, ...]] = {
    "plain": (),
    "temporal": ("temporal_weight", "temporal_alpha"),
}

log = logging.getLogger(__name__)

Answer = Hashable
Extract = Callable[[torch.Tensor], Answer | None]
SameAnswer = Callable[[Any, Any], bool]


def should_stop_early(
    answers: Sequence[Any | None], n: int, same_answer: SameAnswer | None = None
) -> bool:
    """dVoting's answer-consistency stop, checked before drawing samples 3..n."""
    counts = tally(answers, same_answer).counts
    if not counts:
        return False
    top, valid = counts[0][1], sum(c for _, c in counts)
    return top > n // 2 or (top == valid and top >= n // 2)


def remask_tokens(samples: torch.Tensor, tau: float, mask_id: int) -> torch.Tensor:
    """The start of a remask sample: keep agreed positions, mask the rest.

    For each position, the most frequent token among the earlier `samples`
    (k, L) is kept if its share is >= `tau`; ties between equally frequent tokens go
    to the one the earliest sample holds. The last quarter (floor(L/4)) is always
    masked, so the answer is always regenerated.
    """
    k, length = samples.shape
    agree = (samples[:, None, :] == samples[None, :, :]).sum(
        1
    )  # (k, L) votes for each sample's token
    best = agree.argmax(0)  # first maximum = earliest sample
    token = samples.gather(0, best[None]).squeeze(0)
    share = agree.gather(0, best[None]).squeeze(0).double() / k
    start = torch.where(share >= tau - 1e-12, token, torch.full_like(token, mask_id))
    start[length - length // 4 :] = mask_id
    return start


# ----------------------------------------------------------------------- settings


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


@dataclass(frozen=True)
class StrategySettings:
    """Everything that decides a strategy's samples (each is a model arg in the harness)."""

    strategy: str = "dvoting"
    gen_length: int = 256
    block_length: int | None = None  # default L/16
    n: int = 5
    alpha: float = 0.3
    temperature: float | None = None  # default per strategy
    tau: float = 1.0
    steps: int | None = None  # default per strategy: L (single), L/2 (majority, hex, temporal)
    remasking: str = "low_confidence"
    hex_samples: int = 25
    prefix_cache: bool = False  # the older spelling of cache="prefix"
    decoder: str | None = (
        None  # "fixed" | "entropy"; default: entropy for dvoting, fixed for the others
    )
    # Fast-dLLM's key/value caches (decoding/caches.py): "none" (exact), "prefix" or "dual"
    # (faster at long lengths, slightly different samples)
    cache: str = "none"
    # the confidence decoder's (decoder="confidence"; default 0.9, Fast-dLLM's) or block
    # diffusion's (default from BLOCK_DECODINGS): `resolved_threshold`
    threshold: float | None = None
    # strategy=temporal: the weight of a step's answer, exp(temporal_alpha * s / T),
    # (s + 1) / T or 1 (temporal.py); 5.0 is the TSCV release's README example (its batch
    # script uses 11; which value the paper's tables used we could not read)
    temporal_weight: str = "exp"
    temporal_alpha: float = 5.0
    # how the samples' answers are combined: "plain" (one vote per sample's final answer) or
    # "temporal" (each sample's per-step answers, its weights normalised: our extension of
    # TSCV to the voting strategies); default: temporal for strategy=temporal, else plain
    vote: str | None = None
    # strategy=rfg: the guidance strength w of (1 + w) log p_policy - w log p_ref (guidance.py);
    # RFG_GUIDANCE is our default (see there)
    guidance: float = 1.0
    # block diffusion (LLaDA2 models; None for LLaDA and Dream): a key of BLOCK_DECODINGS,
    # with LLaDA2.1's editing threshold (default the preset's) and post-fill steps per block
    block_decoding: str | None = None
    editing_threshold: float | None = None
    max_post_steps: int = 16
    # Not a setting (not stored, compared, fingerprinted or reported): True skips the checks of
    # `gen_length` against the block rules (`length_problem`). The model args' settings are
    # made so, as their `gen_length` is only the length of the requests whose task gives no
    # max_gen_toks; every request's settings are checked with the length it really uses
    # (request_planning.task_length). `replace` makes checked settings unless it is passed.
    defer_length_checks: InitVar[bool] = False

    def __post_init__(self, defer_length_checks: bool = False) -> None:
        # Every check runs before any model work; each message names the setting, its
        # value, what is allowed and what to do (the model args have the same names).
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        require_whole(
            "gen_length",
            self.gen_length,
            None,
            "set max_gen_toks (model arg or --gen_kwargs) to the answer length in tokens, e.g. 256",
        )
        if self.gen_length <= 0:
            raise ValueError(
                f"gen_length must be positive, got {self.gen_length}: set max_gen_toks (model arg or "
                "--gen_kwargs) to the answer length in tokens, e.g. 256"
            )
        if self.block_length is not None:
            # 0 would divide by zero below; a negative one "divides" the length
            require_whole(
                "block_length",
                self.block_length,
                1,
                f"leave it out (default gen_length/16) or give a divisor of {self.gen_length}",
            )
        if not defer_length_checks and self._block_problem() is not None:
            raise ValueError(f"{self._block_problem()}; choose a block length that divides it")
        require_whole("n (samples per question)", self.n, 1, "e.g. n=5 (the default)")
        if self.steps is not None:
            require_whole(
                "steps",
                self.steps,
                1,
                "leave it out (default: gen_length for single, gen_length/2 "
                "for majority and hex; LLaDA2: 32 per block) or give the forward passes per sample "
                "(LLaDA2: per block)",
            )
        # alpha=inf is allowed: every entropy is finite, so it commits every masked position at once
        require_real(
            "alpha (entropy threshold)",
            self.alpha,
            ">= 0",
            lambda a: a >= 0,
            "e.g. alpha=0.3 (the default)",
            allow_inf=True,
        )
        require_real(
            "tau (position-consistency share)",
            self.tau,
            "in (0, 1]",
            lambda t: 0 < t <= 1,
            "e.g. tau=1.0 (the default: keep a position only when every earlier sample agrees)",
        )
        if self.temperature is not None:
            require_real(
                "temperature",
                self.temperature,
                ">= 0",
                lambda t: t >= 0,
                "use 0 for greedy decoding or e.g. 0.6-1.0 to sample; leave it out for the "
                "strategy's default",
            )
        if self.remasking not in REMASKING_RULES:
            raise ValueError(f"remasking must be one of {REMASKING_RULES}, got {self.remasking!r}")
        if (
            isinstance(self.hex_samples, bool)
            or self.hex_samples not in (5, 25)
            or not isinstance(self.hex_samples, int)
        ):
            raise ValueError(
                f"hex_samples must be 25 (5 block sizes x 5 seeds) or 5 (original HEX), got {self.hex_samples!r}"
            )
        self._check_decoder()
        self._check_cache()
        self._check_temporal()
        self._check_guidance()
        self._check_block_decoding()
        if not defer_length_checks and self._hex_problem() is not None:
            raise ValueError(self._hex_problem())

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
        # hex decodes with its own block sizes (L/32..L/2, `_hex_problem`) and never reads
        # block_length (READ_BY_STRATEGY): a given one is warned as unused, not refused
        if (
            self.strategy == "hex"
            or self.block_decoding is not None
            or self.gen_length % self.resolved_block_length == 0
        ):
            return None
        block = self.resolved_block_length
        if self.block_length is not None:
            which = f"block_length {block}"
        elif self.strategy == "temporal":
            which = (
                f"the default block length {block} (32 where it divides the length, else "
                "max_gen_toks/16)"
            )
        else:
            which = f"the default block length {block} (max_gen_toks/16)"
        return f"{which} does not divide the generation length {self.gen_length}"

    def _hex_problem(self) -> str | None:
        if self.strategy == "hex" and self.gen_length % HEX_BLOCK_DIVISORS[0]:
            return (
                "hex needs a generation length divisible by 32 (block sizes L/32..L/2), "
                f"got {self.gen_length}"
            )
        return None

    def _check_decoder(self) -> None:
        if self.decoder is not None and self.decoder not in DECODERS:
            raise ValueError(
                f"decoder must be one of {DECODERS} (or left out for the strategy's own), "
                f"got {self.decoder!r}"
            )
        if self.strategy == "hex" and self.decoder in ("entropy", "confidence"):
            raise ValueError(
                f"decoder={self.decoder} does not apply to strategy=hex: HEX is defined by its fixed "
                "schedules over block sizes L/32..L/2; leave decoder out for hex"
            )
        if self.threshold is not None and self.block_decoding is None:
            require_real(
                "threshold (confidence decoder)",
                self.threshold,
                "in (0, 1]",
                lambda t: 0 < t <= 1,
                "e.g. threshold=0.9 (Fast-dLLM's default)",
            )
        elif self.threshold is not None:
            require_real(
                "threshold (block diffusion)",
                self.threshold,
                "in (0, 1]",
                lambda t: 0 < t <= 1,
                "e.g. threshold=0.95 (LLaDA2.0's default)",
            )
        if self.strategy == "dvoting" and self.decoder == "fixed":
            raise ValueError(
                "decoder=fixed does not apply to strategy=dvoting: dVoting decodes with its "
                "entropy threshold (alpha) or, with decoder=confidence, Fast-dLLM's rule; leave "
                "decoder out for dvoting, or compare with strategy=majority,decoder=entropy"
            )

    def _check_cache(self) -> None:
        if self.cache not in CACHE_POLICIES:
            raise ValueError(
                f"cache must be one of {CACHE_POLICIES}, got {self.cache!r}: none (exact, the default), "
                "prefix or dual (Fast-dLLM's approximate key/value caches)"
            )
        if not isinstance(self.prefix_cache, bool):
            raise ValueError(f"prefix_cache must be true or false, got {self.prefix_cache!r}")
        if self.prefix_cache and self.cache == "dual":
            raise ValueError(
                "prefix_cache=true and cache=dual disagree: give cache alone (prefix_cache=true is "
                "the older spelling of cache=prefix)"
            )
        # one spelling from here on, so that equal settings compare (and fingerprint) equal
        if self.prefix_cache:
            object.__setattr__(self, "cache", "prefix")
        object.__setattr__(self, "prefix_cache", self.cache == "prefix")

    def _check_temporal(self) -> None:
        if self.temporal_weight not in TEMPORAL_WEIGHTS:
            raise ValueError(
                f"temporal_weight must be one of {TEMPORAL_WEIGHTS}, got {self.temporal_weight!r}: "
                "exp (the default), linear or fixed"
            )
        require_real(
            "temporal_alpha",
            self.temporal_alpha,
            ">= 0",
            lambda a: a >= 0,
            "e.g. temporal_alpha=5.0 (the default)",
        )
        if self.vote is not None and self.vote not in VOTES:
            raise ValueError(
                f"vote must be one of {VOTES}, got {self.vote!r}: plain (one vote per sample) or temporal "
                "(each sample's per-step answers), or leave it out for the strategy's own"
            )
        if self.vote == "temporal" and self.strategy in ("single", "rfg"):
            raise ValueError(
                f"vote=temporal does not apply to strategy={self.strategy}, which has no vote: use "
                "strategy=temporal for the temporal vote over one decode's steps"
            )
        if self.vote == "plain" and self.strategy == "temporal":
            raise ValueError(
                "vote=plain does not apply to strategy=temporal, whose answer is the temporal vote: use "
                "strategy=single for the decode's final answer"
            )
        if self.resolved_vote == "temporal" and self.cache == "dual":
            which = "strategy=temporal" if self.strategy == "temporal" else "vote=temporal"
            raise ValueError(
                f"cache=dual does not apply to {which}: the dual cache computes no prediction "
                "beyond the current block, and the vote needs every step's whole prediction; use "
                "cache=none (the default) or cache=prefix"
            )

    def _check_guidance(self) -> None:
        require_real(
            "guidance (RFG strength w)",
            self.guidance,
            ">= 0",
            lambda w: w >= 0,
            "e.g. guidance=1.0 (the default); 0 decodes the policy alone",
        )
        if self.strategy == "rfg" and self.cache != "none":
            raise ValueError(
                f"cache={self.cache} does not apply to strategy=rfg: its two models would need a "
                "cache each; use cache=none (the default)"
            )

    def _check_block_decoding(self) -> None:
        """Block diffusion's settings; the other families' rules do not apply to it, nor it to them."""
        if self.block_decoding is None:
            if self.editing_threshold is not None or self.cache == "block":
                raise ValueError(
                    "editing_threshold and cache=block are LLaDA2's (block diffusion): use "
                    "--model dvoting-llada2 or dvoting-llada21 with a LLaDA2 checkpoint"
                )
            return
        if self.block_decoding not in BLOCK_DECODINGS:
            raise ValueError(
                f"block_decoding must be one of {tuple(BLOCK_DECODINGS)} (threshold: LLaDA2.0; quality, "
                f"speed: LLaDA2.1's presets), got {self.block_decoding!r}"
            )
        if self.remasking != "low_confidence":
            raise ValueError(
                f"remasking={self.remasking} does not apply to LLaDA2: its threshold rule commits by "
                "confidence; leave remasking out"
            )
        if self.decoder is not None:
            raise ValueError(
                f"decoder={self.decoder} does not apply to LLaDA2 (block diffusion decodes with its "
                "threshold rule): leave decoder out; threshold= and steps= tune it"
            )
        if self.cache not in ("none", "block"):
            raise ValueError(
                f"cache={self.cache} does not apply to LLaDA2: use cache=block (exact, the default) or "
                "cache=none"
            )
        if self.strategy == "rfg":
            raise ValueError(
                "strategy=rfg is not available for LLaDA2 models yet: use single, majority, hex, "
                "dvoting or temporal"
            )
        if self.resolved_vote == "temporal" and self.cache == "block":
            raise ValueError(
                "the temporal vote needs every step's whole prediction, which cache=block does not "
                "compute (a pass covers the current block): use cache=none with it"
            )
        editing = BLOCK_DECODINGS[self.block_decoding][1] is not None
        if self.steps is not None and editing:
            raise ValueError(
                f"steps does not apply to LLaDA2.1's joint threshold decoding (editing="
                f"{self.block_decoding}), which commits at least one token per step as upstream; "
                "leave steps out"
            )
        if self.editing_threshold is not None and not editing:
            raise ValueError(
                "editing_threshold is LLaDA2.1's: use --model dvoting-llada21 (editing=quality|speed)"
            )
        if self.max_post_steps != 16 and not editing:
            raise ValueError(
                f"max_post_steps={self.max_post_steps!r} is LLaDA2.1's (post-fill editing steps): use "
                "--model dvoting-llada21, or leave it out"
            )
        self.block_settings()  # range checks of threshold, editing_threshold, max_post_steps

    def block_settings(self) -> BlockDecoding:
        """Block diffusion's rule settings (`decoding/blocks.py`)."""
        threshold, editing = BLOCK_DECODINGS[self.block_decoding]
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
        """The threshold in use: given, or the confidence decoder's 0.9, or block diffusion's preset."""
        if self.threshold is not None:
            return self.threshold
        return 0.9 if self.block_decoding is None else BLOCK_DECODINGS[self.block_decoding][0]

    @property
    def passes_per_step(self) -> int:
        """Forward passes per denoising step: 2 for rfg (policy and reference), else 1."""
        return 2 if self.strategy == "rfg" else 1

    @property
    def resolved_vote(self) -> str:
        """ "temporal" (the answers of every step of every sample, `temporal.py`) or "plain"."""
        if self.vote is not None:
            return self.vote
        return "temporal" if self.strategy == "temporal" else "plain"

    @property
    def resolved_decoder(self) -> str:
        """ "entropy" (dVoting's threshold rule), "fixed" (LLaDA's schedule of `steps`),
        "confidence" (Fast-dLLM's), or for LLaDA2 its block decoding ("threshold", "quality", "speed")."""
        if self.block_decoding is not None:
            return self.block_decoding
        if self.decoder is not None:
            return self.decoder
        return "entropy" if self.strategy == "dvoting" else "fixed"

    def commit_rule(self) -> dict[str, Any]:
        """The decoder's setting as `DecodeRow` takes it: `steps` (fixed schedule, as it
        really runs), `alpha` (entropy threshold) or `threshold` (confidence threshold)."""
        if self.block_decoding is not None:
            return dict(steps=None, alpha=None, block=self.block_settings())
        decoder = self.resolved_decoder
        return dict(
            steps=self.steps_run if decoder == "fixed" else None,
            alpha=self.alpha if decoder == "entropy" else None,
            threshold=self.resolved_threshold if decoder == "confidence" else None,
        )

    @property
    def resolved_block_length(self) -> int:
        if self.block_length is not None:
            return self.block_length
        if self.block_decoding is not None:
            return LLADA2_BLOCK_LENGTH
        if self.strategy == "temporal":  # the paper's 32 where it fits (else the usual L/16)
            block = min(TEMPORAL_BLOCK_LENGTH, self.gen_length)
            if self.gen_length % block == 0:
                return block
        return default_block_length(self.gen_length)

    @property
    def resolved_temperature(self) -> float:
        if self.temperature is not None:
            return self.temperature
        return {"single": 0.0, "temporal": 0.0, "rfg": 0.0, "majority": 0.9, "dvoting": 0.6}.get(
            self.strategy, 0.9 if self.hex_samples == 25 else 0.0
        )

    @property
    def resolved_steps(self) -> int:
        """Steps per sample (LLaDA, Dream) or per block (LLaDA2.0, before the cap at the answer length)."""
        if self.steps is not None:
            return self.steps
        if self.block_decoding is not None:
            return LLADA2_STEPS
        return self.gen_length if self.strategy in ("single", "rfg") else self.gen_length // 2

    @property
    def steps_run(self) -> int | list[int] | None:
        """The denoising steps a fixed-schedule sample really takes (`steps` rounded up to a
        multiple of the block count); for hex one value per block size (L/32 .. L/2); None
        for the entropy decoder (dVoting's, or `decoder=entropy`), which follows no
        schedule and ignores `steps`."""
        if self.resolved_decoder != "fixed" or self.block_decoding is not None:
            return None
        if self.strategy == "hex":
            return [
                _fixed_steps(self.resolved_steps, self.gen_length, self.gen_length // d)
                for d in HEX_BLOCK_DIVISORS
            ]
        return _fixed_steps(self.resolved_steps, self.gen_length, self.resolved_block_length)


def unused_settings(settings: StrategySettings) -> tuple[str, ...]:
    """The fields of `settings` that its strategy, commit rule and vote do not read
    (`READ_BY_STRATEGY`, `READ_BY_RULE`, `READ_BY_VOTE`), in field order."""
    read = {
        *READ_BY_EVERY_DECODE,
        *READ_BY_STRATEGY[settings.strategy],
        *READ_BY_RULE[settings.resolved_decoder],
        *READ_BY_VOTE[settings.resolved_vote],
    }
    return tuple(f.name for f in fields(settings) if f.name not in read)


def given_unused_settings(settings: StrategySettings) -> tuple[str, ...]:
    """The unused settings that hold a value other than their default, i.e. were given.

    A setting given at its default value counts as not given: it changes nothing either way
    (the harness's model args have the dataclass's defaults)."""
    defaults = {f.name: f.default for f in fields(StrategySettings)}
    return tuple(
        name for name in unused_settings(settings) if getattr(settings, name) != defaults[name]
    )


def _rule_label(rule: str) -> str:
    return f"decoder={rule}" if rule in DECODERS else f"LLaDA2's block decoding {rule}"


def unused_setting_message(settings: StrategySettings, name: str) -> str:
    """Why the given setting `name` does nothing here, who reads it, and what happens to it."""
    readers = (
        [f"strategy={s}" for s, names in READ_BY_STRATEGY.items() if name in names]
        + [_rule_label(r) for r, names in READ_BY_RULE.items() if name in names]
        + [f"vote={v}" for v, names in READ_BY_VOTE.items() if name in names]
    )
    return (
        f"{name}={getattr(settings, name)!r} is not used by strategy={settings.strategy} "
        f"({_rule_label(settings.resolved_decoder)}, vote={settings.resolved_vote}): only "
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


@dataclass(frozen=True)
class SampleSpec:
    """One sample to draw: its starting region and decoding rule."""

    init_tokens: torch.Tensor
    block_length: int
    steps: int | None
    alpha: float | None
    temperature: float
    kept: torch.Tensor | None = None  # positions fixed from earlier samples (remask samples)
    threshold: float | None = None  # the confidence rule's (when neither steps nor alpha is given)
    block: BlockDecoding | None = (
        None  # block diffusion's rule (LLaDA2), instead of the three above
    )


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


# a question's plan: yields the next draw (samples that do not depend on each other, so
# they decode side by side) and receives each sample's (tokens, answer) back
QuestionPlan = Generator[list[SampleSpec], list[tuple[torch.Tensor, Any]], None]


def _fixed_steps(steps: int, gen_length: int, block_length: int) -> int:
    """`steps` rounded up to a multiple of the block count (LLaDA needs equal steps per block)."""
    blocks = gen_length // block_length
    return max(blocks, -(-steps // blocks) * blocks)


def question_plan(
    settings: StrategySettings, mask_id: int, same_answer: SameAnswer | None
) -> QuestionPlan:
    """The coroutine of one question: yields draws of samples, receives (tokens, answer) pairs."""
    length, block = settings.gen_length, settings.resolved_block_length
    temperature = settings.resolved_temperature
    fresh = torch.full((length,), mask_id, dtype=torch.long)
    rule = settings.commit_rule()
    if settings.strategy in ONE_DECODE:
        yield [SampleSpec(fresh, block, temperature=temperature, **rule)]
        return
    if settings.strategy == "majority":
        yield [SampleSpec(fresh, block, temperature=temperature, **rule) for _ in range(settings.n)]
        return
    if settings.strategy == "hex":
        seeds = settings.hex_samples // len(HEX_BLOCK_DIVISORS)
        specs = []
        for divisor, steps in zip(
            HEX_BLOCK_DIVISORS, settings.steps_run or [None] * len(HEX_BLOCK_DIVISORS)
        ):
            # block diffusion: each block size with the family's threshold rule (attention blocks too)
            hex_rule = dict(steps=steps, alpha=None) if settings.block_decoding is None else rule
            specs += [
                SampleSpec(fresh, length // divisor, temperature=temperature, **hex_rule)
                for _ in range(seeds)
            ]
        yield specs
        return
    # dVoting
    n, fresh_count = settings.n, settings.n // 2 + 1
    drawn: list[torch.Tensor] = []
    answers: list[Any] = []
    while len(drawn) < n:
        i = len(drawn) + 1  # the sample about to be drawn, 1-based as in the paper
        if i >= 3 and should_stop_early(answers, n, same_answer):
            return
        if i <= fresh_count:
            # fresh samples before the first early-stop check (samples 1 and 2) decode together
            draw_size = 2 - len(drawn) if i == 1 else 1
            draw_size = min(draw_size, fresh_count - len(drawn), n - len(drawn))
            specs = [
                SampleSpec(fresh, block, temperature=temperature, **rule) for _ in range(draw_size)
            ]
        else:
            start = remask_tokens(torch.stack(drawn), settings.tau, mask_id)
            kept = start != mask_id
            specs = [SampleSpec(start, block, temperature=temperature, kept=kept, **rule)]
        results = yield specs
        drawn += [tokens for tokens, _ in results]
        answers += [answer for _, answer in results]


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from any printable parts, stable across processes and platforms."""
    # surrogatepass: a context with lone surrogates (broken data) still gets a seed
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode("utf-8", "surrogatepass")).digest()
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

    def temporal_result(
        self, settings: StrategySettings, same_answer: SameAnswer | None
    ) -> StrategyResult:
        """The temporal vote over the samples' steps (each sample's weights over its own
        number of steps). The response is the first sample whose final answer is the
        winner, else the latest step's prediction carrying the winner (`TemporalVote.carrier`);
        the plain vote's result when no step of any sample answered."""
        plain = self.result(same_answer)
        vote = temporal_vote(
            [steps.answers for steps in self.steps],
            self.sample_nfe,
            settings.temporal_weight,
            settings.temporal_alpha,
            same_answer,
        )
        logged = replace(
            plain,
            step_answers=[list(steps.answers) for steps in self.steps],
            plain_votes=plain.votes,
        )
        if vote.winner is None:
            return logged
        same = same_answer or (lambda a, b: a == b)
        final = next(
            (
                i
                for i, answer in enumerate(self.answers)
                if answer is not None and same(vote.winner, answer)
            ),
            None,
        )
        if final is not None:
            return replace(logged, votes=vote.weights, chosen=final)
        sample, step = vote.carrier
        return replace(
            logged,
            votes=vote.weights,
            chosen=sample,
            returned=self.steps[sample].predictions[step],
            returned_step=step,
        )


def run_strategy(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    strategy: str = "dvoting",
    extract: Extract,
    gen_length: int,
    block_length: int | None = None,
    n: int = 5,
    alpha: float = 0.3,
    temperature: float | None = None,
    tau: float = 1.0,
    seed: int = 0,
    steps: int | None = None,
    remasking: str = "low_confidence",
    hex_samples: int = 25,
    prefix_cache: bool = False,
    decoder: str | None = None,
    cache: str | None = None,
    threshold: float | None = None,
    temporal_weight: str = "exp",
    temporal_alpha: float = 5.0,
    vote: str | None = None,
    guidance: float = 1.0,
    block_decoding: str | None = None,
    editing_threshold: float | None = None,
    max_post_steps: int = 16,
    same_answer: SameAnswer | None = None,
    row_seeds: Sequence[int] | None = None,
    max_rows: int = 16,
    on_done: Callable[[int, StrategyResult], None] | None = None,
) -> list[StrategyResult]:
    """Run a strategy on every (left-padded) prompt row of `input_ids`; no harness needed.

    `extract` maps one sample's generated ids (1-D) to a hashable answer or None;
    `same_answer` optionally groups answers (default `==`). `temperature=None` takes
    the strategy's default (single 0, majority/hex 0.9, dvoting 0.6). Each row's
    samples are seeded from `row_seeds[i]` (default: derived from `seed` and the row
    index). `max_rows` caps the rows decoded per forward pass; `on_done(i, result)`
    is called as each question finishes. `cache` ("none" | "prefix" | "dual") turns on
    Fast-dLLM's key/value caches (faster, slightly different samples; off by default;
    `prefix_cache=True` is the older spelling of `cache="prefix"`). `decoder`
    ("fixed" | "entropy" | "confidence", with `threshold`) overrides the strategy's decoder.
    `temporal_weight` and `temporal_alpha` set the temporal vote's step weights;
    `vote="temporal"` gives majority, hex and dvoting the temporal vote over their samples'
    steps (default: temporal for strategy="temporal", else one vote per sample).
    `strategy="rfg"` needs `model` to be a `guidance.GuidedModel` and decodes it at
    `guidance` (its NFE counts both models' passes).
    A block-causal model (LLaDA2) decodes by block diffusion: `block_decoding` "threshold"
    (LLaDA2.0, the default there), "quality" or "speed" (LLaDA2.1's presets), with
    `threshold`, `steps` (per block), `editing_threshold` and `max_post_steps`; its
    `cache` is "block" (exact, the default there) or "none".
    A setting given a value other than its default that the strategy, its commit rule and
    its vote do not read (`unused_settings`) is reported in a warning.
    """
    if getattr(model, "block_causal", False) and block_decoding is None:
        block_decoding = "threshold"
    if cache is None:
        cache = (
            "block"
            if block_decoding is not None and strategy != "temporal" and vote != "temporal"
            else "none"
        )
    settings = StrategySettings(
        strategy=strategy,
        gen_length=gen_length,
        block_length=block_length,
        n=n,
        alpha=alpha,
        temperature=temperature,
        tau=tau,
        steps=steps,
        remasking=remasking,
        hex_samples=hex_samples,
        prefix_cache=prefix_cache,
        decoder=decoder,
        cache=cache,
        threshold=threshold,
        temporal_weight=temporal_weight,
        temporal_alpha=temporal_alpha,
        vote=vote,
        guidance=guidance,
        block_decoding=block_decoding,
        editing_threshold=editing_threshold,
        max_post_steps=max_post_steps,
    )
    report_unused_settings(settings, set(), log)  # each call is a run of its own
    attention_mask = check_prompt_batch(input_ids, attention_mask, model)
    batch = input_ids.shape[0]
    if row_seeds is None:
        require_whole("seed", seed, None, "give an integer seed, e.g. seed=0")
        row_seeds = [derive_seed(seed, i) for i in range(batch)]
    prompts = [input_ids[i][attention_mask[i].bool()] for i in range(batch)]
    return decode_questions(
        model,
        prompts,
        settings,
        extract,
        row_seeds,
        same_answer=same_answer,
        max_rows=max_rows,
        on_done=on_done,
    )


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
            f"{len(extract_of)} extractors: give one of each per prompt (or one settings/extract for all)"
        )
    scheduler = _Scheduler(
        RowDecoder(_model_for(model, settings_of)),
        prompts,
        settings_of,
        extract_of,
        seeds,
        same_answer,
        max_rows,
        on_done,
    )
    return scheduler.run()


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
            "strategy=rfg decodes with one guidance strength and no other strategy in the same run; "
            f"got guidance {sorted(guided)} and strategies {sorted({s.strategy for s in settings_of})}"
        )
    if not isinstance(model, GuidedModel):
        raise ValueError(
            "strategy=rfg needs a GuidedModel(policy, reference) (lm_eval_dvoting.core.guidance): the "
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
            observed=self.settings_of[index].resolved_vote == "temporal",
            passes=self.settings_of[index].passes_per_step,
        )
        self.in_flight.append(question)
        self._begin_draw(question, next(plan, None))

    def _start_sample(self, question: _Question) -> None:
        spec = question.to_start.pop(0)
        settings = self.settings_of[question.index]
        generator = torch.Generator(device=self.decoder.device).manual_seed(
            question.next_sample_seed()
        )
        steps = StepAnswers(question.answer_of) if question.observed else None
        if steps is not None:
            question.draw_steps.append(steps)
        sample = len(question.samples) + len(question.decoding) + 1
        label = f"question {question.index}, sample {sample}"  # how an error names the row
        row = DecodeRow(
            prompt=self.prompts[question.index],
            tokens=spec.init_tokens,
            block_length=spec.block_length,
            steps=spec.steps,
            alpha=spec.alpha,
            threshold=spec.threshold,
            block=spec.block,
            temperature=spec.temperature,
            remasking=settings.remasking,
            generator=generator,
            cache=settings.cache,
            owner=spec,
            observe=None if steps is None else steps.observe,
            label=label,
        )
        if (
            spec.kept is not None
            and question.donor is not None
            and question.donor.block_length == row.block_length
        ):
            row.kept = shared_block_prefix(question.donor, row.prompt, row.tokens)
        # dVoting's fresh samples keep their block cache for the remask samples to share
        row.keep_cache = (
            settings.cache == "block" and settings.strategy == "dvoting" and question.donor is None
        )
        question.decoding.append(row)
        self.decoder.add(row)

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
        if question.observed:
            result = question.temporal_result(self.settings_of[question.index], self.same_answer)
        else:
            result = question.result(self.same_answer)
        self.results[question.index] = result
        if self.on_done is not None:
            self.on_done(question.index, result)
