"""The registry of parts (`base.register`, `parts`, `names`) and the model kinds a part
works with. It imports nothing, so the row batch (`decoding/rows.py`) can read the registered
commit rules while this package is still being imported: `core.parts` imports
`decoding.state` (through `samples.py`), which imports the decoding package, whose row batch
imports this module."""

from __future__ import annotations

from typing import Any, Iterator, TypeVar

# the two kinds of model a part may work with: LLaDA/Dream (bidirectional attention over the
# whole sequence) and LLaDA2 (block diffusion: a block attends to itself and earlier blocks)
BIDIRECTIONAL = "bidirectional"
BLOCK_CAUSAL = "block_causal"

P = TypeVar("P", bound=type)
REGISTRY: dict[str, dict[str, Any]] = {
    "strategy": {},
    "rule": {},
    "cache": {},
    "vote": {},
}


def register(part: P) -> P:
    """Class decorator: add `part` to its kind's registry (a second part of a name is a bug)."""
    known = REGISTRY[part.kind]
    if part.name in known and known[part.name] is not part:
        raise ValueError(f"two {part.kind} parts are named {part.name!r}: rename one")
    known[part.name] = part
    return part


def parts(kind: str) -> Iterator[Any]:
    """The registered parts of `kind`, in their `order` (then name)."""
    return iter(sorted(REGISTRY[kind].values(), key=lambda p: (p.order, p.name)))


def names(kind: str) -> tuple[str, ...]:
    """The registered names of `kind`, in order: what messages list as allowed."""
    return tuple(p.name for p in parts(kind))
