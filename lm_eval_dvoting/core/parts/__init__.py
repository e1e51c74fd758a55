"""The parts a decode is composed of, each declared once in a file of its own:

| folder | kind | selected by |
|---|---|---|
| `strategies/` | which samples a question draws, how they combine (`Strategy`) | `strategy=` |
| `rules/` | which masked positions a step commits (`CommitRule`) | `decoder=`, model name |
| `caches/` | what a pass covers and keeps (`CachePolicy`) | `cache=` |
| `votes/` | how the answers are combined (`Vote`) | `vote=` |

Each folder's modules are imported here (`discover`), and each registers its part
(`base.register`): a new strategy, commit rule, cache policy or vote is one new file in its
folder. A commit rule brings its arithmetic (`CommitRule.worker`) and says which rows it
decodes (`CommitRule.decodes`): the row batch (`decoding/rows.py`) asks the registry
(`registry.py`), so a new rule needs no edit elsewhere. A cache policy likewise brings its
pass (`CachePolicy.run_pass`): the forward pass (`decoding/caches.py`) groups a step's rows
by policy (`CachePolicy.pass_group`) and runs each group's. The settings they read are
`core/settings.py`'s `StrategySettings` fields; which combinations cannot run is decided
from the parts' capabilities (`checks.py`).
"""

from __future__ import annotations

import importlib
import pkgutil

from lm_eval_dvoting.core.parts.base import (
    BIDIRECTIONAL,
    BLOCK_CAUSAL,
    REGISTRY,
    CachePolicy,
    CommitRule,
    Part,
    Strategy,
    Vote,
    names,
    parts,
    register,
)

__all__ = [
    "BIDIRECTIONAL",
    "BLOCK_CAUSAL",
    "CachePolicy",
    "CommitRule",
    "Part",
    "Strategy",
    "Vote",
    "cache_policy",
    "commit_rule",
    "default_cache",
    "discover",
    "names",
    "parts",
    "register",
    "strategy",
    "vote",
]

FOLDERS = ("strategies", "rules", "caches", "votes")


def discover(package: str) -> None:
    """Import every module of `package` (a folder of parts), so that each registers its part."""
    folder = importlib.import_module(package)
    for module in pkgutil.iter_modules(folder.__path__):
        importlib.import_module(f"{package}.{module.name}")


for _folder in FOLDERS:
    discover(f"{__name__}.{_folder}")


def strategy(name: str) -> type[Strategy]:
    """The registered strategy `name` (a KeyError for an unknown one: check names first)."""
    return REGISTRY["strategy"][name]  # type: ignore[return-value]


def commit_rule(name: str) -> type[CommitRule]:
    """The registered commit rule `name` (`decoder=` values and block diffusion's presets)."""
    return REGISTRY["rule"][name]  # type: ignore[return-value]


def cache_policy(name: str) -> type[CachePolicy]:
    """The registered cache policy `name`."""
    return REGISTRY["cache"][name]  # type: ignore[return-value]


def vote(name: str) -> type[Vote]:
    """The registered vote `name`."""
    return REGISTRY["vote"][name]  # type: ignore[return-value]


def default_cache(strategy_name: str, vote_name: str | None, block_causal: bool) -> str:
    """The cache policy when `cache` is left out: the model kind's own (`none`, exact, for
    LLaDA and Dream; `block`, exact too, for LLaDA2), unless the vote needs every step's whole
    prediction, which that cache does not compute: then the first policy that does (`none`).
    The one place this default is decided (the harness, `run_strategy`)."""
    kind = BLOCK_CAUSAL if block_causal else BIDIRECTIONAL
    if vote_name is None and strategy_name in REGISTRY["strategy"]:
        vote_name = strategy(strategy_name).default_vote
    needs_whole = vote_name in REGISTRY["vote"] and vote(vote_name).needs_whole_prediction
    preferred = sorted(parts("cache"), key=lambda c: kind not in c.default_for)
    for policy in preferred:
        if kind in policy.models and (policy.predicts_beyond_block or not needs_whole):
            return policy.name
    return "none"
