"""The row batch: rows enter and leave between steps; each step is one forward pass for
all active rows (under their cache policies), then each row's commit rule.

    decoder = RowDecoder(model)
    decoder.add(row)            # any number of times, also between steps
    while decoder.active:
        finished = decoder.step()

`generate()` decodes a batch of prompts in one call: `init_tokens` (batch, gen_length)
pre-fills the region (mask-id positions are decoded, the others stay fixed); `generator` is
one `torch.Generator` shared by the rows in order, or one per row (then a row's tokens do not
depend on the batch); `cache` is "none" (exact, the default), "prefix" or "dual" (Fast-dLLM's
approximate caches; `prefix_cache=True` is the older spelling of `cache="prefix"`). A
block-causal model (LLaDA2) decodes by block diffusion (decoding/blocks.py) with `block`
(default `BlockDecoding()`: LLaDA2.0's threshold 0.95, one token per step at least) and
`cache` "block" (exact, the default) or "none"; `gen_length` need not be a multiple of
`block_length` there (the last block is decoded whole, then cut).
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import torch

from lm_eval_dvoting.core.decoding.blocks import align
from lm_eval_dvoting.core.decoding.caches import ForwardPass, StepLogits, cache_policy
from lm_eval_dvoting.core.decoding.rules import (
    RowWork,
    Window,
    begins,
    host_to_device,
    host_tokens,
    inside_window,
    read_tokens,
)
from lm_eval_dvoting.core.decoding.state import (
    BlockDecoding,
    DecodeResult,
    DecodeRow,
    DreamDecoding,
    argmaxes_without,
    check_prompt_batch,
    validate_row,
    validate_row_settings,
)

# the registry alone: `core.parts` imports this package (module docstring of registry.py)
from lm_eval_dvoting.core.parts.registry import BIDIRECTIONAL, BLOCK_CAUSAL, names, parts

# a commit rule's arithmetic (`CommitRule.worker`): block_start, is_done, begin, commit
Rule = Any


class RowDecoder:
    """Decodes rows in shared forward passes; rows may be added between steps.

    `step()` reads as the algorithm: ask each row's rule where its block starts, run the
    pass the cache policies ask for, let the rules say which positions they need, fetch
    those logits with one head call per round, let the rules commit, retire finished rows.
    """

    def __init__(self, model: torch.nn.Module, pad_token_id: int | None = None) -> None:
        self.model = model
        self.mask_id = int(model.mask_token_id)
        self.max_length = getattr(model, "max_length", None)
        first_parameter = next(iter(model.parameters()), None)
        self.device = first_parameter.device if first_parameter is not None else torch.device("cpu")
        self.forward = ForwardPass(
            model, self.mask_id if pad_token_id is None else pad_token_id, self.device
        )
        self.block_causal = bool(getattr(model, "block_causal", False))
        self.end_ids = tuple(getattr(model, "end_token_ids", ()))
        self.rules: dict[str, Rule] = {}  # each registered rule's worker, built on first use
        self.rule_of: dict[DecodeRow, str] = {}  # each active row's rule, by name
        self.active: list[DecodeRow] = []

    def rule(self, row: DecodeRow) -> Rule:
        """The worker of the row's commit rule (chosen when the row was added)."""
        return self.rules[self.rule_of[row]]

    def _choose_rule(self, row: DecodeRow) -> None:
        """The first registered rule, in order, that decodes the row (`CommitRule.decodes`:
        `block` -> block diffusion, `steps` -> fixed schedule, `alpha` -> entropy threshold,
        `threshold` -> confidence threshold, or the rule the row names)."""
        part = next((p for p in parts("rule") if p.decodes(row)), None)
        if part is None:
            raise ValueError(
                f"no commit rule decodes this row (rule={row.rule!r}): name one of "
                f"{names('rule')} with the settings it reads, or give steps, alpha or threshold"
            )
        kind = BLOCK_CAUSAL if self.block_causal else BIDIRECTIONAL
        if kind not in part.models:
            raise ValueError(
                f"commit rule {part.name} does not decode {kind} models "
                f"({type(self.model).__name__}): it decodes {part.models}"
            )
        if part.name not in self.rules:
            self.rules[part.name] = part.worker(self.mask_id, self.end_ids)
        self.rule_of[row] = part.name

    def add(self, row: DecodeRow) -> None:
        """Check the row, move it to the model's device, and queue it if it has masks."""
        validate_row(row)
        self._check_family(row)
        self.forward.check(row)
        if self.forward.shift and row.prompt.numel() == 0:
            raise ValueError(
                "this model reads predictions one position to the left: the prompt must not be "
                "empty"
            )
        total = row.prompt.numel() + row.gen_length
        if row.block is not None:
            total += -total % row.block_length  # the last block is decoded whole
        if self.max_length is not None and total > self.max_length:
            raise ValueError(
                f"prompt ({row.prompt.numel()} tokens) + generation ({row.gen_length}) = {total} "
                "tokens "
                f"exceeds the model's maximum length {self.max_length}"
            )
        row.prompt = row.prompt.to(self.device)
        row.tokens = row.tokens.to(self.device).clone()
        row.progress.block, row.progress.step_in_block, row.progress.counts = 0, 0, []
        row.progress.block_steps = 0
        if row.block is not None:
            align(row, self.mask_id)
        self._choose_rule(row)
        if self._has_masks(row):
            self.active.append(row)
        else:
            del self.rule_of[row]

    def _check_family(self, row: DecodeRow) -> None:
        """Block diffusion rows for a block-causal model (LLaDA2), the other rules for the
        others."""
        if self.block_causal and row.block is None:
            raise ValueError(
                "this model is block diffusion (LLaDA2): decode it with block=BlockDecoding(...) "
                "(threshold decoding), not with steps/alpha/threshold"
            )
        if row.block is not None and not self.block_causal:
            raise ValueError(
                f"block=BlockDecoding(...) is block diffusion's, for LLaDA2 models; "
                f"{type(self.model).__name__} is not one: give steps, alpha or threshold"
            )

    @torch.no_grad()
    def step(self) -> list[DecodeRow]:
        """One forward pass for every active row, then each row's commits; returns the
        rows that finished."""
        if not self.active:
            return []
        self._take_snapshot()
        try:  # the step is planned on the snapshot, which holds until the commits
            logits = self.forward.run(self.active, *self._cache_plan())
            self._show_predictions(logits)
            before = self._progress_marks()
            works = self._begin(logits)
        finally:
            for row in self.active:
                row.step_tokens = None
        for row in self.active:
            row.nfe += 1
        while works:  # rounds: the entropy rule's rows whose block completed go on to the next
            asking = [work for work in works if work.wanted]
            for work, found in zip(asking, logits.many([(w.index, w.wanted) for w in asking])):
                work.receive(found)
            works = self._commit(works)
        return self._retire(self._check_progress(before))

    def _take_snapshot(self) -> None:
        """Every active row's tokens on the host, in one read (`DecodeRow.step_tokens`): the
        cache plan, the temporal vote's prediction and the rules' `begin` plan the step on
        it instead of reading the device row by row."""
        for row, tokens in zip(self.active, read_tokens(self.active)):
            row.step_tokens = tokens

    def _begin(self, logits: StepLogits) -> list[RowWork]:
        """Each active row's work for the step, in row order: a rule with `begin_many`
        begins all its rows at once, the others row by row in row order (both plan on the
        step's snapshot: no host read of their own)."""
        items = [(i, row, logits.window(i)) for i, row in enumerate(self.active)]
        works: dict[int, RowWork] = {}
        for name, rule in self.rules.items():
            if hasattr(rule, "begin_many"):
                mine = [item for item in items if self.rule_of[item[1]] == name]
                works.update(zip([i for i, _, _ in mine], rule.begin_many(mine) if mine else []))
        for item in items:
            if item[0] not in works:
                works[item[0]] = self.rule(item[1]).begin(*item)
        return [works[i] for i in range(len(items))]

    def _progress_marks(self) -> tuple[list[int], list[tuple[int, int, int]]]:
        """Each active row's masks left before the commits, counted on the step's snapshot
        (no device work), and its schedule position."""
        masks = [host_tokens(row).count(self.mask_id) for row in self.active]
        return masks, self._positions()

    def _positions(self) -> list[tuple[int, int, int]]:
        return [
            (row.progress.block, row.progress.step_in_block, row.progress.post)
            for row in self.active
        ]

    def _masks_left(self) -> torch.Tensor:
        """Each active row's masks left, on the device (no sync): a few kernels whatever the
        number of rows (rows of one length stacked, else counted end to end)."""
        tokens = [row.tokens for row in self.active]
        if len({t.numel() for t in tokens}) == 1:
            return (torch.stack(tokens) == self.mask_id).sum(1)
        is_mask = torch.cat(tokens) == self.mask_id
        counted = torch.cat([is_mask.new_zeros(1, dtype=torch.long), is_mask.cumsum(0)])
        ends = [0, *itertools.accumulate(t.numel() for t in tokens)]
        at_ends = counted[host_to_device(ends, torch.long, counted.device)]
        return at_ends[1:] - at_ends[:-1]

    def _check_progress(self, before: tuple[list[int], list[tuple[int, int, int]]]) -> list[int]:
        """Raise if a row's step committed nothing and moved no schedule on: its rule would
        then decode it the same way forever (the entropy and confidence rules commit at least
        one token per step; the fixed schedule and block diffusion move their schedule on at
        every step, through steps that commit nothing by design). One sync for all rows;
        returns each row's masks left."""
        then, positions = before
        positions_now = self._positions()
        now = self._read_and_settle(self._masks_left())
        for i, row in enumerate(self.active):
            if then[i] == now[i] and positions[i] == positions_now[i]:
                rule, named = type(self.rule(row)).__name__, f" ({row.label})" if row.label else ""
                raise RuntimeError(
                    f"commit rule {rule} ({_rule_setting(row)}) committed nothing in step "
                    f"{row.nfe} of row {i}{named}: {then[i]} of its {row.gen_length} "
                    "generated positions are still masked, and a step that changes nothing "
                    "would decode it forever; this is a bug in the rule, please report it with "
                    "the settings"
                )
        return now

    def _read_and_settle(self, masks_now: torch.Tensor) -> list[int]:
        """Each row's masks left after the commits, and what the rules left to read
        (`facts_to_read`: block diffusion's block outcome), in one read; the rules then
        settle their rows on what was read (`settle`)."""
        pending = [
            (rule, row, facts)
            for rule in self.rules.values()
            if hasattr(rule, "facts_to_read")
            for row, facts in rule.facts_to_read()
        ]
        for rule, _, facts in pending:  # torch.cat would promote the masks' counts with them
            if facts.dtype != torch.long or facts.dim() != 1:
                raise TypeError(
                    f"{type(rule).__name__}.facts_to_read must give 1-D long tensors, got "
                    f"{facts.dtype} of shape {tuple(facts.shape)}: this is a bug in the rule"
                )
        sizes = [masks_now.numel(), *[facts.numel() for _, _, facts in pending]]
        flat = torch.cat([masks_now, *[facts for _, _, facts in pending]]).tolist()
        now, *read = [flat[b : b + n] for b, n in zip(begins(sizes), sizes)]
        for (rule, row, _), facts in zip(pending, read):
            rule.settle(row, facts)
        return now

    def _show_predictions(self, logits: StepLogits) -> None:
        """Hand each observed row (`DecodeRow.observe`) this step's full prediction, on the
        host, before the commits: its fixed tokens, and the most likely token (mask token
        excluded) at every still-masked position of the whole generation region, future
        blocks included. One head call for all observed rows, whose logits the rules then
        reuse (no extra forward pass), and one copy of all their predictions to the host.
        (The prediction is the argmax at any temperature: the rules' Gumbel noise is drawn
        for the positions they commit only, and is not spent here.)"""
        watched = [(i, row) for i, row in enumerate(self.active) if row.observe is not None]
        if not watched:
            return
        masked = [
            [p for p, token in enumerate(host_tokens(row)) if token == self.mask_id]
            for _, row in watched
        ]
        for (i, row), positions in zip(watched, masked):
            _check_whole_prediction(row, logits.window(i), positions)
        found = logits.many([(i, positions) for (i, _), positions in zip(watched, masked)])
        best = argmaxes_without(found, self.mask_id)
        predictions = []
        for (i, row), positions, row_logits, row_best in zip(watched, masked, found, best):
            # the rules' request for the block is served from these
            logits.remember(i, positions, row_logits)
            prediction = row.tokens.clone()
            prediction[host_to_device(positions, torch.long, prediction.device)] = row_best
            predictions.append(prediction[row.lead : prediction.numel() - row.trail])
        on_host = torch.cat(predictions).cpu().split([p.numel() for p in predictions])
        for (_, row), prediction in zip(watched, on_host):
            row.observe(row.nfe, prediction.clone())  # its own: an observer may keep it

    def _cache_plan(self) -> tuple[list[int], list[bool]]:
        """Each row's current block start, and whether a later step in that block could
        reuse what this step's pass keeps (only asked for when some row caches)."""
        if not any(cache_policy(row.cache).uses_cache for row in self.active):
            return [], []
        starts = [self.rule(row).block_start(row) for row in self.active]
        return starts, [self._keeps(row) for row in self.active]

    def _keeps(self, row: DecodeRow) -> bool:
        """Whether a later step in the row's current block could reuse this step's pass:
        the rule's say (`more_steps_in_block`) where it has one; else, a fixed schedule
        knows its steps, and the threshold rules may always go on."""
        rule = self.rule(row)
        if hasattr(rule, "more_steps_in_block"):
            return bool(rule.more_steps_in_block(row))
        return row.steps is None or row.progress.step_in_block + 1 < row.steps_per_block

    def _commit(self, works: list[RowWork]) -> list[RowWork]:
        """Each rule commits for all its rows at once; returns the rows that go on."""
        by_rule: dict[str, list[RowWork]] = {}
        for work in works:
            by_rule.setdefault(self.rule_of[work.row], []).append(work)
        going_on: list[RowWork] = []
        # in the registry's fixed order (fixed schedule, entropy, confidence, block
        # diffusion, then any other): rows sharing one generator draw in the same order
        for name in names("rule"):
            if name in by_rule:
                going_on += self.rules[name].commit(by_rule[name])
        return going_on

    def _retire(self, masks_left: list[int]) -> list[DecodeRow]:
        """Drop the rows that need no other step (`_has_masks`, told the masks each row
        has left: no host read of its own)."""
        active = zip(self.active, masks_left)
        finished = [row for row, left in active if not self._has_masks(row, left)]
        for row in finished:
            if (
                not row.keep_cache
            ):  # block diffusion's are final: a dVoting remask sample may start from them
                row.kept = None  # free the kept keys and values
            del self.rule_of[row]
        self.active = [row for row in self.active if row not in finished]
        return finished

    def _has_masks(self, row: DecodeRow, masks_left: int | None = None) -> bool:
        """Whether the row needs another step (block diffusion: its rule says, as a block
        with editing goes on after its last mask is filled); `masks_left`, when known,
        spares a host read."""
        if self.rule(row).is_done(row):
            return False
        if row.block is not None:
            return True
        if masks_left is None:
            return bool((row.tokens == self.mask_id).any())
        return masks_left > 0


def _check_whole_prediction(row: DecodeRow, window: Window, positions: list[int]) -> None:
    """Refuse an observed row whose cache computes no logits at some of its masks."""
    if not inside_window(window, positions):
        fix = "cache=none" if row.block is not None else "cache=none or cache=prefix"
        raise ValueError(
            f"cache={row.cache} computes no prediction beyond the current block, which an "
            f"observed row (strategy=temporal or vote=temporal) needs: use {fix}"
        )


def _rule_setting(row: DecodeRow) -> str:
    """The setting that selects the row's rule, as `name=value` (`RowDecoder.rule`)."""
    for name in ("rule", "block", "steps", "alpha", "threshold"):
        if getattr(row, name) is not None:
            return f"{name}={getattr(row, name)}"
    return "no rule setting"


def _as_generators(
    generator: torch.Generator | Sequence[torch.Generator] | None, batch: int
) -> list[torch.Generator | None]:
    if generator is None or isinstance(generator, torch.Generator):
        return [generator] * batch
    generators = list(generator)
    if len(generators) != batch:
        raise ValueError(
            f"got {len(generators)} generators for {batch} rows: give one, or one per row"
        )
    return generators


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    gen_length: int,
    block_length: int,
    steps: int | None = None,
    alpha: float | None = None,
    threshold: float | None = None,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    init_tokens: torch.Tensor | None = None,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    cache: str | None = None,
    prefix_cache: bool = False,
    block: BlockDecoding | None = None,
    rule: str | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    dream: DreamDecoding | None = None,
) -> DecodeResult:
    """Decode `gen_length` tokens after each (left-padded) prompt row of `input_ids`, with
    `steps` (LLaDA's fixed schedule; with `dream`, Dream's own algorithms), `alpha`
    (dVoting's entropy threshold), `threshold` (Fast-dLLM's confidence threshold), `block`
    (a block-causal model, LLaDA2; default `BlockDecoding()`) or the registered rule `rule`
    names (`core/parts/rules/`); `top_p`/`top_k` filter every rule's sampling
    (decoding/sampling.py); the other arguments as the module docstring says."""
    no_rule = all(setting is None for setting in (block, steps, alpha, threshold, rule))
    if getattr(model, "block_causal", False) and no_rule:
        block = BlockDecoding()
    default = "block" if block is not None else "none"  # the exact cache of the row's kind
    cache = _cache_setting(default if cache is None else cache, prefix_cache)
    rule = "dream" if dream is not None and rule is None else rule  # parts/rules/dream.py
    chosen = dict(steps=steps, alpha=alpha, threshold=threshold, block=block, rule=rule)
    settings = dict(block_length=block_length, temperature=temperature, remasking=remasking)
    settings.update(chosen, cache=cache, top_p=top_p, top_k=top_k, dream=dream)
    validate_row_settings(gen_length, **settings)
    rows = _prompt_rows(model, input_ids, attention_mask, init_tokens, generator, gen_length)
    return _decode_all(RowDecoder(model), [DecodeRow(**row, **settings) for row in rows])


def _prompt_rows(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    init_tokens: torch.Tensor | None,
    generator: torch.Generator | Sequence[torch.Generator] | None,
    gen_length: int,
) -> list[dict[str, Any]]:
    """`generate`'s rows, checked: each prompt without its padding, its starting region (all
    masks unless `init_tokens` gives it) and its generator."""
    attention_mask = check_prompt_batch(input_ids, attention_mask, model)
    batch = input_ids.shape[0]
    if init_tokens is None:
        init_tokens = torch.full((batch, gen_length), int(model.mask_token_id), dtype=torch.long)
    if tuple(init_tokens.shape) != (batch, gen_length):
        raise ValueError(
            f"init_tokens must have shape {(batch, gen_length)}, got {tuple(init_tokens.shape)}"
        )
    generators = _as_generators(generator, batch)
    return [
        dict(prompt=input_ids[i][attention_mask[i].bool()], tokens=init_tokens[i], generator=g)
        for i, g in enumerate(generators)
    ]


def _decode_all(decoder: RowDecoder, rows: list[DecodeRow]) -> DecodeResult:
    """Decode `rows` side by side to the end; their answers and forward passes."""
    for row in rows:
        decoder.add(row)
    while decoder.active:
        decoder.step()
    return DecodeResult(
        tokens=torch.stack([r.answer_tokens for r in rows]).cpu(),
        nfe=torch.tensor([r.nfe for r in rows], dtype=torch.long),
    )


def _cache_setting(cache: str, prefix_cache: bool) -> str:
    if prefix_cache and cache not in ("none", "prefix"):
        raise ValueError(f"prefix_cache=True and cache={cache!r} disagree: give cache alone")
    return "prefix" if prefix_cache else cache
