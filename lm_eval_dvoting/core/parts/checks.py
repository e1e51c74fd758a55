"""Which combinations of parts cannot run, decided from the parts' capabilities.

Each check reads what the parts declare (`base.py`): the decoders, votes and caches a
strategy accepts; whether a vote needs every step's whole prediction and whether a cache
computes it; the model kinds (LLaDA/Dream's bidirectional attention, LLaDA2's block
diffusion) each part works with; the settings a rule refuses when given. The messages are
the parts' own. `combination_problem` runs after every setting's own value was checked, so
each name here is a registered part.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Callable

from lm_eval_dvoting.core.parts.base import BIDIRECTIONAL, BLOCK_CAUSAL, StrategySettings

Check = Callable[[StrategySettings], "str | None"]

_NOT_BLOCK_CAUSAL = (
    "editing_threshold and cache=block are LLaDA2's (block diffusion): use --model "
    "dvoting-llada2 or dvoting-llada21 with a LLaDA2 checkpoint"
)


def combination_problem(settings: StrategySettings) -> str | None:
    """The first reason these settings' parts cannot run together (None: they can)."""
    for check in _CHECKS:
        problem = check(settings)
        if problem is not None:
            return problem
    return None


def _rule_for_strategy(s: StrategySettings) -> str | None:
    accepted = s.strategy_part.rules
    if s.decoder is not None and accepted is not None and s.decoder not in accepted:
        return s.strategy_part.rule_refusal.format(rule=s.decoder)
    return None


def _cache_spellings(s: StrategySettings) -> str | None:
    if s.prefix_cache and s.cache == "dual":
        return (
            "prefix_cache=true and cache=dual disagree: give cache alone (prefix_cache=true is "
            "the older spelling of cache=prefix)"
        )
    return None


def _vote_for_strategy(s: StrategySettings) -> str | None:
    accepted = s.strategy_part.votes
    if s.vote is not None and accepted is not None and s.vote not in accepted:
        return s.strategy_part.vote_refusal.format(vote=s.vote, strategy=s.strategy)
    return None


def _whole_prediction(s: StrategySettings) -> str | None:
    """A vote that observes every step's whole prediction needs a cache that computes it
    (a cache that does not suit the model kind is refused by `_model_kind` instead)."""
    cache = s.cache_part
    if _kind(s) not in cache.models or cache.predicts_beyond_block:
        return None
    if not s.vote_part.needs_whole_prediction:
        return None
    own = s.vote is None or s.vote == s.strategy_part.default_vote
    which = f"strategy={s.strategy}" if own else f"vote={s.vote}"
    return cache.whole_prediction_refusal.format(which=which)


def _cache_for_strategy(s: StrategySettings) -> str | None:
    accepted = s.strategy_part.caches
    if accepted is not None and s.cache not in accepted:
        return s.strategy_part.cache_refusal.format(cache=s.cache)
    return None


def _model_kind(s: StrategySettings) -> str | None:
    """Parts of the other model kind: LLaDA2's on LLaDA/Dream, or the others' on LLaDA2."""
    if _kind(s) == BIDIRECTIONAL:
        # LLaDA2.1's editing threshold is the one block-diffusion setting refused elsewhere
        foreign = s.editing_threshold is not None or BIDIRECTIONAL not in s.cache_part.models
        return _NOT_BLOCK_CAUSAL if foreign else None
    if s.remasking != "low_confidence":
        return (
            f"remasking={s.remasking} does not apply to LLaDA2: its threshold rule commits by "
            "confidence; leave remasking out"
        )
    if s.decoder is not None:
        return (
            f"decoder={s.decoder} does not apply to LLaDA2 (block diffusion decodes with its "
            "threshold rule): leave decoder out; threshold= and steps= tune it"
        )
    if BLOCK_CAUSAL not in s.cache_part.models:
        return (
            f"cache={s.cache} does not apply to LLaDA2: use cache=block (exact, the default) or "
            "cache=none"
        )
    if BLOCK_CAUSAL not in s.strategy_part.models:
        return s.strategy_part.block_causal_refusal
    return None


def _refused_by_rule(s: StrategySettings) -> str | None:
    """A setting the rule refuses when given (not merely unused), then the rule's ranges."""
    defaults = {f.name: f.default for f in fields(s)}
    for name, message in s.rule_part.refused_when_given.items():
        if getattr(s, name) != defaults[name]:
            return message.format(settings=s)
    if s.block_decoding is not None:
        s.block_settings()  # range checks of threshold, editing_threshold, max_post_steps
    return None


def _kind(s: StrategySettings) -> str:
    return BIDIRECTIONAL if s.block_decoding is None else BLOCK_CAUSAL


# in this order: a combination with several problems gets the first one's message
_CHECKS: tuple[Check, ...] = (
    _rule_for_strategy,
    _cache_spellings,
    _vote_for_strategy,
    _whole_prediction,
    _cache_for_strategy,
    _model_kind,
    _refused_by_rule,
)
