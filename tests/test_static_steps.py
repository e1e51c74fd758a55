"""The static-shape cached step (lm_eval_dvoting/core/decoding/static_steps.py): a reuse pass of
`cache=prefix|dual` over buffers filled once per block must give the dynamic path's tokens,
bit for bit, in float32 on the CPU; a graph's replay (here replayed eagerly) reads only its
own input tensors; `cached_steps` resolves and refuses as documented."""

from __future__ import annotations

import collections
import functools
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import torch
from torch import nn

from bench.host_reads_bench import HostReads
from lm_eval_dvoting.core.decoding import DecodeRow
from lm_eval_dvoting.core.decoding import static_steps as static_module
from lm_eval_dvoting.core.decoding.caches import ForwardPass
from lm_eval_dvoting.core.decoding.kept import stack_kept
from lm_eval_dvoting.core.decoding.rows import RowDecoder
from lm_eval_dvoting.core.decoding.static_steps import (
    CudaGraph,
    StaticSteps,
    graph_capturable,
    resolve_cached_steps,
)

MASK = 250  # the official-tiny fixtures' mask id
CPU = torch.device("cpu")


class EagerReplay:
    """A stand-in for `CudaGraph` on the CPU: `replay()` calls the captured pass again, so
    a pass that read anything but the shape's own input tensors would replay stale inputs."""

    captured = 0

    def __init__(self, pass_: Callable[[], torch.Tensor], device: torch.device) -> None:
        self.pass_ = pass_
        EagerReplay.captured += 1

    def replay(self) -> torch.Tensor:
        return self.pass_()


RULES = {
    "fixed": dict(steps=16),
    "entropy": dict(alpha=0.3, temperature=0.6),
    "confidence": dict(threshold=0.5, temperature=0.7, top_k=20),
}
# prompts, generation lengths and block lengths differ between rows, so rows move between
# blocks at different steps and the reuse pass's rows, widths and paddings change
SHAPES = [(5, 16, 4), (9, 12, 4), (3, 16, 8), (7, 8, 2)]


def _rows(caches: list[str], rule: dict) -> list[DecodeRow]:
    rows = []
    for k, ((prompt, gen, block), cache) in enumerate(zip(SHAPES, caches)):
        g = torch.Generator().manual_seed(k)
        settings = dict(rule, steps=gen) if "steps" in rule else rule
        rows.append(
            DecodeRow(
                prompt=torch.randint(0, 240, (prompt,), generator=g),
                tokens=torch.full((gen,), MASK),
                block_length=block,
                cache=cache,
                generator=torch.Generator().manual_seed(100 + k),
                **settings,
            )
        )
    return rows


def decode_rows(decoder: RowDecoder, rows: list[DecodeRow]) -> list[DecodeRow]:
    """`rows` added to `decoder` and decoded to the end."""
    for row in rows:
        decoder.add(row)
    while decoder.active:
        decoder.step()
    return rows


def same_decodes(expected: list[DecodeRow], found: list[DecodeRow]) -> bool:
    """Whether two decodes of the same rows gave the same tokens in as many passes."""
    return all(torch.equal(a.tokens, b.tokens) and a.nfe == b.nfe for a, b in zip(expected, found))


def decode_in_mode(model: nn.Module, mode: str, rows: list[DecodeRow]) -> list[DecodeRow]:
    """`rows` decoded under `cached_steps=mode` (`graphs` replayed eagerly: no CUDA here)."""
    model.cached_steps = "static" if mode == "graphs" else mode
    decoder = RowDecoder(model, pad_token_id=MASK)
    if mode == "graphs":
        decoder.forward.static_steps = StaticSteps(model, "graphs")
        decoder.forward.static_steps.graph_class = EagerReplay
    return decode_rows(decoder, rows)


def _decode(model: nn.Module, mode: str, caches: list[str], rule: dict) -> list[DecodeRow]:
    return decode_in_mode(model, mode, _rows(caches, rule))


CACHE_MIXES = [["prefix"] * 4, ["dual"] * 4, ["dual", "prefix", "none", "dual"]]
CACHE_MIX_IDS = ["prefix", "dual", "mixed"]


def assert_modes_decode_alike(decode: Callable[..., list[DecodeRow]], caches, rule) -> None:
    """`static` and `graphs` decode the rows to `dynamic`'s tokens, in as many steps."""
    dynamic = decode("dynamic", caches, rule)
    for mode in ("static", "graphs"):
        for expected, row in zip(dynamic, decode(mode, caches, rule)):
            assert torch.equal(row.tokens, expected.tokens), mode
            assert row.nfe == expected.nfe, mode


@pytest.mark.parametrize("rule", RULES, ids=list(RULES))
@pytest.mark.parametrize("caches", CACHE_MIXES, ids=CACHE_MIX_IDS)
def test_static_steps_give_the_dynamic_paths_tokens(model, caches, rule):
    assert_modes_decode_alike(functools.partial(_decode, model), caches, RULES[rule])


def _block(row: DecodeRow) -> list[int]:
    start = int((row.tokens == MASK).nonzero()[0]) // row.block_length * row.block_length
    return list(range(start, start + row.block_length))


def test_a_static_reuse_pass_is_the_dynamic_one_bit_for_bit(model):
    """The buffers hold the dynamic path's keys in its layout: the same attention input, so
    the same logits exactly (not merely close), whatever the rows' paddings."""
    logits = {}
    for mode in ("dynamic", "static"):
        model.cached_steps = mode
        rows = _rows(["dual", "prefix", "dual", "prefix"], RULES["fixed"])
        for row, committed in zip(rows, (4, 3, 8, 0)):
            row.tokens[:committed] = torch.arange(committed) + 7
        forward = ForwardPass(model, pad_id=MASK, device=CPU)
        starts = [_block(row)[0] for row in rows]
        forward.run(rows, starts, [True] * 4)  # keeps
        for _ in range(2):  # the second reuse step runs over buffers filled by the first
            step = forward.run(rows, starts, [True] * 4)
        logits[mode] = step.many([(i, _block(row)) for i, row in enumerate(rows)])
    for dynamic, static in zip(logits["dynamic"], logits["static"]):
        assert torch.equal(dynamic, static)


class CheckedSteps(StaticSteps):
    """Each reuse pass's hidden states checked, bit for bit, against the dynamic path's pass
    over the same inputs (a replay that read stale inputs would differ)."""

    checked = 0

    def run(self, kept, ids, attention, positions):
        found = super().run(kept, ids, attention, positions)
        cache = stack_kept(kept, ids.device)
        assert torch.equal(found, self.model.hidden_states(ids, attention, positions, cache=cache))
        CheckedSteps.checked += 1
        return found


@pytest.mark.parametrize("cache", ["dual", "prefix"])
def test_the_buffers_are_filled_once_per_block_and_replays_are_exact(model, monkeypatch, cache):
    """One row, 4 blocks of 4 positions, one commit a step: 3 reuse steps a block, the
    buffers filled at the first of them only; for `dual` one graph for all blocks (its key
    width stays the prompt plus the answer), for `prefix` one a block (its pass shrinks);
    every replay is the dynamic pass over the step's inputs, bit for bit."""
    fills = []
    fill = static_module._fill
    monkeypatch.setattr(static_module, "_fill", lambda *a: fills.append(1) or fill(*a))
    EagerReplay.captured, CheckedSteps.checked = 0, 0
    model.cached_steps = "static"
    decoder = RowDecoder(model, pad_token_id=MASK)
    decoder.forward.static_steps = CheckedSteps(model, "graphs")
    decoder.forward.static_steps.graph_class = EagerReplay
    row = _rows([cache], dict(steps=16))[0]
    decoder.add(row)
    while decoder.active:
        decoder.step()
    assert row.nfe == 16 and CheckedSteps.checked == 12
    assert len(fills) == 4
    assert EagerReplay.captured == (1 if cache == "dual" else 4)


class CaptureHazards(HostReads):
    """What stops a CUDA graph from capturing a pass, seen on the CPU: a read of a tensor's
    values on the host or a blocking copy to the device (`HostReads`: a sync, which a
    capturing stream refuses), and a tensor made without naming its device (on a GPU it
    would be made on the host, beside the graph's device tensors)."""

    FACTORIES = {
        *("arange", "zeros", "ones", "full", "empty", "eye", "linspace"),
        *("tensor", "as_tensor", "rand", "randn", "randint"),
    }

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.FACTORIES and (kwargs or {}).get("device") is None:
            self.calls[f"{name} without a device"] += 1
        return super().__torch_function__(func, types, args, kwargs)


class WatchedCapture(EagerReplay):
    """`EagerReplay` whose every replay of the captured pass (on a GPU the capture runs that
    same pass) is watched for `CaptureHazards`."""

    hazards: collections.Counter[str] = collections.Counter()
    runs = 0

    def __init__(self, pass_: Callable[[], torch.Tensor], device: torch.device) -> None:
        def watched() -> torch.Tensor:
            with CaptureHazards() as hazards:
                output = pass_()
            WatchedCapture.hazards.update(hazards.calls)
            WatchedCapture.runs += 1
            return output

        super().__init__(watched, device)


def _watched_decode(model: nn.Module, caches: list[str]) -> None:
    """Decode `_rows(caches)` under the fixed schedule with graphs replayed by
    `WatchedCapture` (its counts reset first)."""
    WatchedCapture.hazards, WatchedCapture.runs = collections.Counter(), 0
    model.cached_steps = "static"
    decoder = RowDecoder(model, pad_token_id=MASK)
    decoder.forward.static_steps = StaticSteps(model, "graphs")
    decoder.forward.static_steps.graph_class = WatchedCapture
    for row in _rows(caches, RULES["fixed"]):
        decoder.add(row)
    while decoder.active:
        decoder.step()


@pytest.mark.parametrize(
    "caches",
    [["dual"], ["prefix"], *CACHE_MIXES],
    ids=["one dual row", "one prefix row", *CACHE_MIX_IDS],
)
def test_the_pass_a_graph_captures_holds_nothing_a_capture_refuses(model, caches):
    """`graph_capturable` says this package's LLaDA and Dream passes can be captured: every
    pass the graph path captures and replays (here eagerly; one row under the fixed schedule
    replays at each step) reads no value on the host, copies nothing to the device with a
    wait, and makes every tensor on a named device. On a GPU the first two would fail the
    capture (`auto` falling back to static buffers, `graphs` refusing)."""
    _watched_decode(model, caches)
    assert WatchedCapture.runs >= (8 if len(caches) == 1 else 1)
    assert WatchedCapture.hazards == collections.Counter()


def test_the_capture_hazards_are_seen_where_a_pass_has_them(model, monkeypatch):
    """The check above is not blind: a pass that reads a value on the host and makes a tensor
    without a device is caught, in every replay."""
    pass_ = model.hidden_states

    @functools.wraps(pass_)  # its signature: the decoder asks whether it takes a cache
    def hazardous(*args, **kwargs):
        torch.arange(3).sum().item()
        return pass_(*args, **kwargs)

    monkeypatch.setattr(model, "hidden_states", hazardous)
    _watched_decode(model, ["dual"])
    runs = WatchedCapture.runs
    assert runs >= 8
    assert WatchedCapture.hazards == {"arange without a device": runs, "item": runs}


class LayoutCheckedSteps(StaticSteps):
    """After each step, the buffers of the step's shape must hold the dynamic path's layout
    (`stack_kept`) exactly: each prefix left-padded and each suffix right-padded, zeros in
    every padding, the same key mask."""

    def run(self, kept, ids, attention, positions):
        found = super().run(kept, ids, attention, positions)
        shape = next(reversed(self.shapes.values()))  # the step's (the last one used)
        dynamic = stack_kept(kept, ids.device)
        before = dynamic.keys[0].shape[2]
        after = before + ids.shape[1]
        mask = dynamic.key_mask(attention, ids)
        width = shape.cache.mask.shape[1]
        assert torch.equal(shape.cache.mask[:, : mask.shape[1]], mask)
        assert not shape.cache.mask[:, mask.shape[1] :].any()
        kept_suffix_width = dynamic.suffix_keys[0].shape[2] if dynamic.suffix_keys else 0
        assert width == after + kept_suffix_width
        for buffers, prefixes, suffixes in (
            (shape.cache.keys, dynamic.keys, dynamic.suffix_keys),
            (shape.cache.values, dynamic.values, dynamic.suffix_values),
        ):
            for layer, buffer in enumerate(buffers):
                assert torch.equal(buffer[:, :, :before], prefixes[layer])
                if suffixes:
                    assert torch.equal(
                        buffer[:, :, after : after + kept_suffix_width], suffixes[layer]
                    )
                assert not buffer[:, :, after + kept_suffix_width :].any()
        return found


def test_a_refill_writes_the_dynamic_layout(model, monkeypatch):
    """Rows that move between blocks at different steps (the confidence rule, four rows of
    different prompts and blocks, so the pass's rows, widths and paddings change): after
    every step the buffers hold exactly what the dynamic path stacks, zeros in the
    padding, and the same key mask. (Planted: each row's suffix written one column to the
    right: failed. A padding left stale by an earlier fill of the same shape: the test
    below.)"""
    fills = []
    fill = static_module._fill
    monkeypatch.setattr(static_module, "_fill", lambda *a: fills.append(len(a[1])) or fill(*a))
    model.cached_steps = "static"
    for caches in (["dual"] * 4, ["prefix"] * 4, ["dual", "prefix", "dual", "dual"]):
        decoder = RowDecoder(model, pad_token_id=MASK)
        decoder.forward.static_steps = LayoutCheckedSteps(model, "static")
        for row in _rows(caches, RULES["confidence"]):
            decoder.add(row)
        while decoder.active:
            decoder.step()
    assert len(fills) > 10 and max(fills) >= 3  # refills of many rows, checked


def _kept(prefix: int, suffix: int, seed: int) -> Any:
    """Random kept keys and values of 2 layers (2 key/value heads, head size 4)."""
    from lm_eval_dvoting.core.decoding.state import KeptKeysValues

    g = torch.Generator().manual_seed(seed)

    def layers(length: int) -> list[torch.Tensor]:
        return [torch.randn(2, length, 4, generator=g) + 1 for _ in range(2)]

    return KeptKeysValues(0, layers(prefix), layers(prefix), layers(suffix), layers(suffix))


def test_a_refill_of_the_same_shape_clears_what_the_last_fill_left():
    """Two steps of one shape (2 rows, pass 3, width 15) whose first row's padding moves
    (prefix 5 + suffix 5, then 3 + 7, beside a row of 5 + 7): the second fill must leave
    zeros where the first wrote keys. (Planted: the zeroing dropped: failed.)"""

    class Stub(nn.Module):
        def hidden_states(self, ids, attention, positions, cache):
            return torch.zeros(ids.shape)

    steps = LayoutCheckedSteps(Stub(), "static")
    ids = torch.zeros((2, 3), dtype=torch.long)
    ones = torch.ones_like(ids)
    other = _kept(5, 7, seed=0)
    for first in (_kept(5, 5, seed=1), _kept(3, 7, seed=2)):
        steps.run([first, other], ids, ones, ones)
    assert len(steps.shapes) == 1


def test_cached_steps_resolves_and_refuses(model):
    assert resolve_cached_steps("auto", model, CPU) == "static"
    assert resolve_cached_steps("dynamic", model, CPU) == "dynamic"
    with pytest.raises(ValueError, match=r"cached_steps=graphs cannot apply: CUDA graphs need"):
        resolve_cached_steps("graphs", model, CPU)
    with pytest.raises(ValueError, match=r"cached_steps must be one of .*got 'fast'"):
        resolve_cached_steps("fast", model, CPU)
    cuda = torch.device("cuda")
    assert graph_capturable(model, cuda) is None  # LLaDA and Dream are flagged capturable
    assert "not known to be capturable" in graph_capturable(nn.Linear(2, 2), cuda)


def test_the_model_arg_is_checked_before_loading_and_recorded():
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    def load(**args):
        return LLaDAEvalModel(**{"pretrained": "tiny-arith", "device": "cpu", **args})

    with pytest.raises(ValueError, match=r"cached_steps must be one of .*got 'fast'.*leave it"):
        load(pretrained="/no/such/folder", cached_steps="fast")  # before the folder is read
    with pytest.raises(ValueError, match=r"cached_steps=graphs needs a CUDA device.*device=cpu"):
        load(pretrained="/no/such/folder", cached_steps="graphs")
    lm = load(cache="dual")
    assert lm.model.cached_steps == "auto"
    assert lm.get_model_info()["dvoting"]["cached_steps"] == "static"  # auto, off a GPU
    lm = load(cache="dual", cached_steps="dynamic")
    assert lm.get_model_info()["dvoting"]["cached_steps"] == "dynamic"


def _one_dual_row(
    model: nn.Module, graph_class: Any, strict: bool, refusal: str | None
) -> tuple[RowDecoder, DecodeRow, DecodeRow]:
    """One `dual` row decoded under `graphs` captured by `graph_class` (strict: asked by
    name), to the end or, with `refusal`, until that error is raised; the decoder, the row,
    and the row as the dynamic path decodes it."""
    dynamic = _decode(model, "dynamic", ["dual"], dict(steps=16))[0]
    model.cached_steps = "static"
    decoder = RowDecoder(model, pad_token_id=MASK)
    decoder.forward.static_steps = StaticSteps(model, "graphs", strict=strict)
    decoder.forward.static_steps.graph_class = graph_class
    row = _rows(["dual"], dict(steps=16))[0]
    decoder.add(row)
    with pytest.raises(RuntimeError, match=refusal) if refusal else nullcontext():
        while decoder.active:
            decoder.step()
    return decoder, row, dynamic


class FailingCapture:
    def __init__(self, pass_: Callable[[], torch.Tensor], device: torch.device) -> None:
        raise RuntimeError("operation not permitted when stream is capturing")


@pytest.mark.parametrize("strict", [False, True], ids=["auto", "graphs"])
def test_a_capture_that_fails_falls_back_under_auto_and_is_refused_when_asked(
    model, strict, caplog
):
    refusal = r"cached_steps=graphs: capturing .* failed" if strict else None
    decoder, row, dynamic = _one_dual_row(model, FailingCapture, strict, refusal)
    if strict:
        return
    assert torch.equal(row.tokens, dynamic.tokens)
    assert decoder.forward.static_steps.mode == "static" == model.cached_steps
    assert "capturing the reuse pass failed (operation not permitted" in caplog.text
    assert "no CUDA graphs from now on" in caplog.text


def test_buffers_hold_no_row_past_its_block_and_uncaptured_shapes_go_first(model):
    """The buffers refer to the kept keys weakly (a finished block's keys are freed with
    the row's next block), and making room drops a shape without a graph before one with."""
    import gc
    import weakref

    EagerReplay.captured = 0
    model.cached_steps = "static"
    decoder = RowDecoder(model, pad_token_id=MASK)
    steps = decoder.forward.static_steps = StaticSteps(model, "graphs")
    steps.graph_class = EagerReplay
    row = _rows(["dual"], dict(steps=16))[0]
    decoder.add(row)
    for _ in range(4):  # block 1: a full pass, then 3 reuse steps (captured on the 2nd)
        decoder.step()
    first_block = weakref.ref(row.kept)
    decoder.step()  # block 2's full pass keeps new keys
    gc.collect()
    assert first_block() is None
    (captured,) = steps.shapes.values()
    assert captured.graph is not None
    for width in (1, 2):  # two more shapes, never captured: the first one's room is reused
        steps._shape(
            [row.kept], torch.zeros((1, width), dtype=torch.long), None
        )  # a pass of another length
    assert len(steps.shapes) == 2 and captured in steps.shapes.values()


class CpuCapture(CudaGraph):
    """`CudaGraph` with its CUDA capture done on the CPU: the "graph" recomputes the pass
    into the captured output at each replay, as a real graph does, or (`fault`) writes
    nothing (a capture that recorded nothing) or the output one float step off."""

    fault: str | None = None
    captured = 0

    def _capture(self, pass_: Callable[[], torch.Tensor], device: torch.device) -> torch.Tensor:
        expected, self.output = pass_(), pass_()
        self.graph = SimpleNamespace(replay=lambda: self._recompute(pass_))
        CpuCapture.captured += 1
        return expected

    def _recompute(self, pass_: Callable[[], torch.Tensor]) -> None:
        if self.fault == "records nothing":
            return
        found = pass_()
        if self.fault == "one step off":
            found = torch.nextafter(found, torch.full_like(found, float("inf")))
        self.output.copy_(found)


@pytest.mark.parametrize("fault", [None, "records nothing", "one step off"])
@pytest.mark.parametrize("strict", [False, True], ids=["auto", "graphs"])
def test_a_capture_whose_replay_is_not_the_eager_pass_is_refused(
    model, fault, strict, monkeypatch, caplog
):
    """Each capture's first replay must give the eager warm-up's output bit for bit: a
    faithful graph is kept and replayed; one that records nothing or drifts by one float
    step falls back to static buffers under `auto` (same tokens) and is refused under
    `graphs`. (Planted: the comparison dropped: the drifting graph was kept, and replayed.)"""
    monkeypatch.setattr(CpuCapture, "fault", fault)
    CpuCapture.captured = 0
    refusal = r"replay does not give the eager pass's output" if strict and fault else None
    decoder, row, dynamic = _one_dual_row(model, CpuCapture, strict, refusal)
    if refusal:
        return
    assert torch.equal(row.tokens, dynamic.tokens)
    assert CpuCapture.captured == 1  # one graph for the row's 4 blocks, or one refusal
    mode = decoder.forward.static_steps.mode
    assert mode == ("graphs" if fault is None else "static")
    assert ("replay does not give the eager pass's output" in caplog.text) == bool(fault)


def test_same_bits_compares_the_bits_not_the_values():
    """The graph check's comparison: -0.0 is not 0.0, a NaN equals the same NaN, for every
    floating dtype a pass runs in; another dtype or shape is not the same."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        values = torch.tensor([1.5, 0.0, float("nan")], dtype=dtype)
        assert static_module.same_bits(values, values.clone())
        signed = values.clone()
        signed[1] = -0.0
        assert not static_module.same_bits(values, signed)
    assert not static_module.same_bits(torch.zeros(2), torch.zeros(2, dtype=torch.float64))
    assert not static_module.same_bits(torch.zeros(2), torch.zeros(1, 2))


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_kept_keys_lie_in_one_tensor_per_kind_so_a_refill_copies_all_layers_at_once(model, cache):
    """A block's first pass keeps each row's keys (and values, and the dual cache's suffix)
    of every layer in one tensor (`layers_in_one`), which `all_layers` hands to a refill
    without a copy; per-layer tensors made otherwise are stacked, with the same values.
    (Planted: the prefix kept with a clone per layer, as before: failed.)"""
    from lm_eval_dvoting.core.decoding.kept import all_layers

    rows = _rows([cache] * 2, RULES["fixed"])
    ForwardPass(model, pad_id=MASK, device=CPU).run(rows, [0, 0], [True, True])
    for row in rows:
        kept = row.kept
        lists = [kept.prefix_keys, kept.prefix_values]
        lists += [kept.suffix_keys, kept.suffix_values] if cache == "dual" else []
        for layers in lists:
            whole = all_layers(layers)
            assert all(torch.equal(whole[i], t) for i, t in enumerate(layers))
            assert whole.data_ptr() == layers[0].data_ptr()  # a view: no copy
            copied = all_layers([t.clone() for t in layers])
            assert torch.equal(copied, whole) and copied.data_ptr() != whole.data_ptr()


def test_a_reuse_pass_over_more_queries_than_the_limit_is_not_captured(model, monkeypatch):
    """Above `CAPTURE_TOKENS` (rows x pass length) a reuse pass is bound by its arithmetic
    and runs with static buffers, never captured: `prefix`'s early blocks (whose pass covers
    the rest of the answer) stay eager, its last blocks are captured; the tokens are the
    dynamic path's either way."""
    # the row's 4 blocks: passes of 16, 12, 8 and 4 queries (Dream's one more, its shifted
    # reading): the first two eager, the last two captured
    monkeypatch.setattr(static_module, "CAPTURE_TOKENS", 9)
    dynamic = _decode(model, "dynamic", ["prefix"], dict(steps=16))[0]
    EagerReplay.captured = 0
    model.cached_steps = "static"
    decoder = RowDecoder(model, pad_token_id=MASK)
    steps = decoder.forward.static_steps = StaticSteps(model, "graphs", strict=True)
    steps.graph_class = EagerReplay
    (row,) = decode_rows(decoder, _rows(["prefix"], dict(steps=16)))
    assert torch.equal(row.tokens, dynamic.tokens)
    assert EagerReplay.captured == 2
