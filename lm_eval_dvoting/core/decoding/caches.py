"""The cache policies: what one step's forward pass covers, and what it keeps for later
steps (a row's `cache`, one of `CACHE_POLICIES`).

* `none`: every row runs over its whole sequence (prompt + generation region). Exact.
* `prefix` (Fast-dLLM's prefix cache): a row entering a new block runs over its whole
  sequence and keeps the keys and values of everything before the block; while it stays
  in that block it runs over the block and what follows only, attending to the kept prefix.
* `block` (block diffusion, LLaDA2): a row keeps the keys and values of everything before
  its current block; each pass runs from the end of what it keeps to the end of its
  current block (the first pass of a block also covers the blocks finished since, whose
  keys and values it then keeps). A block never sees a later one, so what is kept is final:
  exact, the same tokens as `none` (tested), and on by default for that family.
* `dual` (Fast-dLLM's dual cache): as `prefix`, and the keys and values after the block
  are kept too; while it stays in the block it runs over the block alone (for Dream also
  the token before the block, whose output predicts the block's first position; Fast-dLLM's
  Dream code reads that prediction from the block's first position itself, which we do
  not copy). Only the block's logits exist then, so the entropy rule's hand-over to the
  next block waits for the next step, which starts that block with a full pass.

What is kept is stale (computed before the block's later commits), so `prefix` and `dual`
are approximations of the exact decoder: opt-in, off by default. Rows of one step may mix
policies: the rows that run over their whole sequence share one pass, the rows that reuse
what they kept share another.

Each policy's arithmetic (what its pass covers and keeps) is its part's, in
`core/parts/caches/` (`CachePolicy.run_pass`); this module groups a step's rows by policy
(`ForwardPass`) and holds the lazy logits they share (`StepLogits`); the layout of the kept
keys and values is `kept.py`'s, the static-shape reuse pass `static_steps.py`'s.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

import torch

from lm_eval_dvoting.core.decoding.full_steps import FullSteps
from lm_eval_dvoting.core.decoding.rules import Window, host_to_device
from lm_eval_dvoting.core.decoding.state import DecodeRow, left_pad
from lm_eval_dvoting.core.decoding.static_steps import (
    CAPTURED,
    StaticSteps,
    resolve_cached_steps,
)


def accepts_cache(model: torch.nn.Module) -> bool:
    """Whether the model's `hidden_states` takes a key/value `cache` (this package's models)."""
    return "cache" in _parameters(getattr(model, "hidden_states", None))


def accepts_position_ids(model: torch.nn.Module) -> bool:
    return "position_ids" in _parameters(getattr(model, "hidden_states", None) or model.forward)


def _parameters(function: Any) -> Sequence[str]:
    try:
        return [] if function is None else list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return []


class StepLogits:
    """The logits of one step, computed lazily at the positions asked for.

    Our own models expose `hidden_states` and `logits_from_hidden`: the head (a
    vocabulary-sized matmul) then runs only at the positions the rules ask for, and for
    all rows in one call (`many`), so the head's weight is read once per round rather
    than once per row. Any other module (e.g. a scripted test model) is run as
    `model(ids, mask)` and its logits are read where asked.
    Each row's outputs sit in one of the step's passes at `column = offset + g` for the
    prediction of generation index g; `window` is the range of g a pass covers.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._where: dict[int, tuple[torch.Tensor, int, int, Window, bool]] = {}
        self._known: dict[
            int, tuple[dict[int, int], torch.Tensor]
        ] = {}  # row -> ({position: k}, logits)

    def add(
        self,
        members: Sequence[int],
        outputs: torch.Tensor,
        offsets: Sequence[int],
        windows: Sequence[Window] | None = None,
        are_logits: bool = False,
    ) -> None:
        """Row `members[k]`'s outputs are `outputs[k]` (hidden states, or logits)."""
        for local, (index, offset) in enumerate(zip(members, offsets)):
            window = None if windows is None else windows[local]
            self._where[index] = (outputs, local, offset, window, are_logits)

    def window(self, index: int) -> Window:
        return self._where[index][3]

    def remember(self, index: int, positions: Sequence[int], logits: torch.Tensor) -> None:
        """Keep row `index`'s logits at `positions` (what `many` gave), so that a later
        request of this step for positions all among them runs no head call again: the
        observer computes every masked position's logits, the rules then ask for the
        block's. (In float32 on the CPU the head gives a position the same logits in any
        batch, so the commits are `single`'s exactly; in bfloat16 or on an accelerator the
        call's shape may move the last bit, as the rows sharing a pass may.)"""
        self._known[index] = ({position: k for k, position in enumerate(positions)}, logits)

    def many(self, wanted: Sequence[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """Float32 logits (len(positions), vocab) for each (row, generation positions) pair,
        with one head call for all (none for the pairs `remember`ed)."""
        known = [
            bool(positions)
            and index in self._known
            and all(p in self._known[index][0] for p in positions)
            for index, positions in wanted
        ]
        computed = iter(self._compute([pair for pair, seen in zip(wanted, known) if not seen]))
        return [
            self._recall(index, positions) if seen else next(computed)
            for (index, positions), seen in zip(wanted, known)
        ]

    def _recall(self, index: int, positions: list[int]) -> torch.Tensor:
        rows, logits = self._known[index]
        return logits[host_to_device([rows[p] for p in positions], torch.long, logits.device)]

    def _compute(self, wanted: Sequence[tuple[int, list[int]]]) -> list[torch.Tensor]:
        if not wanted:
            return []
        picked = [self._gather(run) for run in self._runs(wanted)]
        if self._where[wanted[0][0]][4]:
            return [logits.float() for run in picked for logits in run]
        sizes = [len(positions) for _, positions in wanted]
        hidden = torch.cat([h for run in picked for h in run])
        return list(self.model.logits_from_hidden(hidden).float().split(sizes))

    def _runs(self, wanted: Sequence[tuple[int, list[int]]]) -> list[list[tuple[int, list[int]]]]:
        """`wanted` cut into runs of consecutive pairs whose outputs are one pass's."""
        runs: list[list[tuple[int, list[int]]]] = []
        for pair in wanted:
            if runs and self._where[runs[-1][0][0]][0] is self._where[pair[0]][0]:
                runs[-1].append(pair)
            else:
                runs.append([pair])
        return runs

    def _gather(self, run: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """Each pair's outputs at its positions, with one index tensor for the run (one
        host-to-device copy, rather than one a row: on a GPU each is a sync)."""
        outputs = self._where[run[0][0]][0]
        locals_, columns = [], []
        for index, positions in run:
            _, local, offset, _, _ = self._where[index]
            locals_ += [local] * len(positions)
            columns += [offset + p for p in positions]
        where = host_to_device([locals_, columns], torch.long, outputs.device)
        return list(outputs[where[0], where[1]].split([len(p) for _, p in run]))


def _registry() -> Any:
    """The parts' registry (`core/parts/registry.py`). Imported here, not at the top: the
    first import of the registry runs `core.parts`, whose cache policies import this
    module."""
    from lm_eval_dvoting.core.parts import registry

    return registry


def cache_policy(name: str) -> Any:
    """The registered cache policy `name` (`core/parts/caches/`)."""
    return _registry().REGISTRY["cache"][name]


def _order(policy: Any) -> tuple[int, str]:
    return policy.order, policy.name


class ForwardPass:
    """Runs one step's forward pass for the active rows, each under its cache policy: the
    rows are grouped by the pass their policy runs (`CachePolicy.pass_group`: `dual` rows
    share `prefix`'s), and each group's policy runs one pass for its rows (`run_pass`)."""

    def __init__(self, model: torch.nn.Module, pad_id: int, device: torch.device) -> None:
        self.model, self.pad_id, self.device = model, pad_id, device
        self.shift = int(getattr(model, "logits_shift", 0))
        self.block_causal = bool(getattr(model, "block_causal", False))
        self.can_cache = accepts_cache(model)
        self.pass_positions = accepts_position_ids(model)
        # the reuse passes' buffers (`static_steps.py`; None: the dynamic path), as the
        # model's `cached_steps` asks (set by the harness from the model arg; default auto)
        asked = getattr(model, "cached_steps", "auto")
        mode = resolve_cached_steps(asked, model, device)
        self.static_steps = (
            StaticSteps(model, mode, strict=asked in CAPTURED)
            if self.can_cache and mode != "dynamic"
            else None
        )
        # `cache=none`'s full passes as CUDA graphs too (`full_steps.py`), where they apply
        self.full_steps = (
            FullSteps(model, mode, strict=asked in CAPTURED)
            if mode in CAPTURED and self.can_cache and self.pass_positions and not self.block_causal
            else None
        )

    def check(self, row: DecodeRow) -> None:
        known = _registry().names("cache")
        if row.cache not in known:
            raise ValueError(
                f"cache must be one of {known}, got {row.cache!r}: register the "
                "policy (a file under core/parts/caches/) or name a registered one"
            )
        if cache_policy(row.cache).uses_cache and not self.can_cache:
            raise ValueError(
                f"cache={row.cache} (or prefix_cache) needs one of this package's LLaDA/Dream "
                "models (hidden_states "
                f"with a cache); {type(self.model).__name__} has none: run with cache=none (the "
                "default)"
            )

    def run(
        self, rows: Sequence[DecodeRow], starts: Sequence[int], keeps: Sequence[bool]
    ) -> StepLogits:
        """The step's logits. `starts`: each row's current block start; `keeps`: whether
        a later step in that block could reuse what this pass would keep for the row."""
        logits = StepLogits(self.model)
        groups: dict[Any, list[int]] = {}
        for i, row in enumerate(rows):
            groups.setdefault(cache_policy(row.cache).pass_group(), []).append(i)
        # in the policies' order (`none` first), each group's rows in their batch order
        for policy in sorted(groups, key=_order):
            policy.run_pass(self, rows, groups[policy], starts, keeps, logits)
        return logits

    def padded(
        self, sequences: Sequence[Sequence[torch.Tensor]], begins: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """`state.left_pad` of a cached pass's sequences (no mask where no row is padded),
        each row's positions counted on from `begins` (the columns it keeps before them)."""
        ids, attention, positions = left_pad(
            sequences, self.pad_id, self.device, mask_only_if_padded=True
        )
        return ids, attention, positions + host_to_device(begins, torch.long, self.device)[:, None]

    def block_lengths(
        self, rows: Sequence[DecodeRow], members: Sequence[int]
    ) -> dict[str, torch.Tensor]:
        """The block-causal model's `block_lengths` argument (nothing for the others)."""
        if not self.block_causal:
            return {}
        return {
            "block_lengths": host_to_device(
                [rows[i].block_length for i in members], torch.long, self.device
            )
        }
