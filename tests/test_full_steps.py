"""`cache=none`'s full passes as CUDA graphs (lm_eval_dvoting/core/decoding/full_steps.py),
replayed on the CPU by tests/test_static_steps.py's stand-ins: a replay that read anything
but the shape's own input tensors would replay stale inputs, so the tokens must be the
eager path's, in as many passes."""

from __future__ import annotations

import collections

import pytest
import torch
from references import load_float32
from test_static_steps import (
    MASK,
    RULES,
    CpuCapture,
    EagerReplay,
    FailingCapture,
    StaticSteps,
    WatchedCapture,
    _rows,
    decode_rows,
    same_decodes,
)
from torch import nn

from lm_eval_dvoting.core.decoding import DecodeRow
from lm_eval_dvoting.core.decoding import static_steps as static_module
from lm_eval_dvoting.core.decoding.full_steps import FullSteps
from lm_eval_dvoting.core.decoding.rows import RowDecoder


def _decode(
    model: nn.Module, graph_class: type | None, caches: list[str], rule: dict, strict=True
) -> tuple[list[DecodeRow], RowDecoder]:
    """The rows decoded eagerly (`graph_class` None) or with their passes captured by
    `graph_class` (the full passes and, for cached rows, the reuse passes); the rows and
    the decoder."""
    model.cached_steps = "dynamic" if graph_class is None else "static"
    decoder = RowDecoder(model, pad_token_id=MASK)
    assert decoder.forward.full_steps is None  # off CUDA `auto` and `static` capture nothing
    if graph_class is not None:
        decoder.forward.full_steps = FullSteps(model, "graphs", strict=strict)
        decoder.forward.full_steps.graph_class = graph_class
        decoder.forward.static_steps = StaticSteps(model, "graphs", strict=strict)
        decoder.forward.static_steps.graph_class = graph_class
    return decode_rows(decoder, _rows(caches, rule)), decoder


@pytest.mark.parametrize("rule", RULES, ids=list(RULES))
@pytest.mark.parametrize("caches", [["none"] * 4, ["dual", "prefix", "none", "none"]])
def test_captured_full_passes_give_the_eager_tokens(model, caches, rule):
    """Four rows of different prompts, answers and blocks, which finish at different steps
    (so the pass's shape changes): the eager path's tokens, in as many passes, the rows'
    full passes captured and replayed. (Planted: the graph's pass over the first step's
    tensors instead of the shape's own: failed.)"""
    EagerReplay.captured = 0
    eager, _ = _decode(model, None, caches, RULES[rule])
    replayed, _ = _decode(model, EagerReplay, caches, RULES[rule])
    assert same_decodes(eager, replayed)
    assert EagerReplay.captured >= 1


def test_one_row_captures_once_and_replays_every_later_pass(model, monkeypatch):
    """One `none` row, 16 steps of the fixed schedule: its first pass runs eagerly, its
    second is captured, and every pass from there on is a replay of that one graph."""
    replays = []
    replay = EagerReplay.replay
    monkeypatch.setattr(EagerReplay, "replay", lambda g: replays.append(1) or replay(g))
    EagerReplay.captured = 0
    eager, _ = _decode(model, None, ["none"], dict(steps=16))
    (row,), decoder = _decode(model, EagerReplay, ["none"], dict(steps=16))
    assert torch.equal(row.tokens, eager[0].tokens) and row.nfe == 16
    assert EagerReplay.captured == 1 and len(replays) == 15
    assert list(decoder.forward.full_steps.shapes) == [(1, row.prompt.numel() + 16, False)]


@pytest.mark.parametrize("fault", [None, "one step off"])
@pytest.mark.parametrize("strict", [False, True], ids=["auto", "graphs"])
def test_a_failed_capture_falls_back_under_auto_and_is_refused_when_asked(
    model, fault, strict, monkeypatch, caplog
):
    """A capture that raises, or whose first replay drifts by one float step: under `auto`
    the decode goes on eagerly (the same tokens) and says so; under `graphs` it stops,
    naming the full pass."""
    monkeypatch.setattr(CpuCapture, "fault", fault)
    capture = FailingCapture if fault is None else CpuCapture
    eager, _ = _decode(model, None, ["none"], dict(steps=16))
    if strict:
        with pytest.raises(
            RuntimeError,
            match=r"cached_steps=graphs: capturing the full pass "
            r"\(cache=none\) failed .*use cached_steps=static",
        ):
            _decode(model, capture, ["none"], dict(steps=16), strict=True)
        return
    (row,), decoder = _decode(model, capture, ["none"], dict(steps=16), strict=False)
    assert torch.equal(row.tokens, eager[0].tokens)
    assert decoder.forward.full_steps.mode == "static" == model.cached_steps
    assert "no CUDA graphs" in caplog.text


def test_at_most_two_shapes_are_kept_those_without_a_graph_dropped_first(model):
    steps = FullSteps(model, "graphs")
    for length in (5, 6, 5, 7):
        ids = torch.zeros((1, length), dtype=torch.long)
        steps._shape(ids, torch.ones_like(ids), ids)
    assert list(steps.shapes) == [(1, 5, True), (1, 7, True)]  # the least recently used went
    steps.shapes[(1, 5, True)].graph = "captured"
    for length in (8, 9):  # shapes seen once make room among themselves
        ids = torch.zeros((1, length), dtype=torch.long)
        steps._shape(ids, torch.ones_like(ids), ids)
    assert list(steps.shapes) == [(1, 5, True), (1, 9, True)]


def _joining_rows(seed: int) -> list[DecodeRow]:
    """Three `none` rows of different prompt and answer lengths (their seeds from `seed`)."""
    rows = []
    for k, (prompt, gen) in enumerate([(5, 16), (9, 4), (3, 8)]):
        g = torch.Generator().manual_seed(seed + k)
        rows.append(
            DecodeRow(
                prompt=torch.randint(0, 240, (prompt,), generator=g),
                tokens=torch.full((gen,), MASK),
                block_length=4,
                cache="none",
                generator=torch.Generator().manual_seed(100 + seed + k),
                steps=gen,
            )
        )
    return rows


def _decode_joining(model: nn.Module, captured: bool, seed: int) -> list[DecodeRow]:
    """Rows 1 and 2 decode together; when row 2 finishes, row 3 joins row 1: the pass's
    shape (2 rows, 21 columns) comes back with other padding and other positions."""
    model.cached_steps = "dynamic"
    decoder = RowDecoder(model, pad_token_id=MASK)
    if captured:
        decoder.forward.full_steps = FullSteps(model, "graphs", strict=True)
        decoder.forward.full_steps.graph_class = EagerReplay
    first, second, third = rows = _joining_rows(seed)
    decoder.add(first)
    decoder.add(second)
    while decoder.active:
        if second in decoder.step() and third not in decoder.active:
            decoder.add(third)
    return rows


@pytest.mark.parametrize("seed", [0, 7])
def test_a_shape_that_comes_back_with_other_padding_replays_the_new_inputs(model, seed):
    """A captured shape replayed for other rows (a row joining as another leaves, as the
    harness's batches do): its attention mask and positions are the new rows' at every
    replay. (Planted: the mask and positions copied in at capture only, or the graph's
    pass over the step's own mask and positions: both failed.)"""
    eager = _decode_joining(model, captured=False, seed=seed)
    replayed = _decode_joining(model, captured=True, seed=seed)
    assert same_decodes(eager, replayed)


def test_the_decoder_captures_full_passes_only_where_they_apply(model, monkeypatch, request):
    """With graphs resolved (as on CUDA), LLaDA's and Dream's decoders capture their full
    passes; LLaDA2's block-causal passes (and any model whose passes take no positions or
    no cache) do not; `static` and `dynamic` capture nothing."""
    monkeypatch.setattr(static_module, "graph_capturable", lambda *a: None)
    for mode, made in (("auto", True), ("graphs", True), ("static", False), ("dynamic", False)):
        model.cached_steps = mode
        assert (RowDecoder(model, pad_token_id=MASK).forward.full_steps is not None) is made
    llada2 = load_float32(str(request.getfixturevalue("llada2_fixture")))
    monkeypatch.setattr(llada2, "cached_steps", "graphs", raising=False)
    assert RowDecoder(llada2, pad_token_id=MASK).forward.full_steps is None


def test_a_pass_over_more_tokens_than_the_limit_runs_eagerly(model, monkeypatch):
    """Above `CAPTURE_TOKENS` (rows x padded length) a full pass is bound by its
    arithmetic and is never captured; a shape captured only after two passes in a row."""
    monkeypatch.setattr(static_module, "CAPTURE_TOKENS", 20)
    steps = FullSteps(model, "graphs", strict=True)
    steps.graph_class = EagerReplay
    EagerReplay.captured = 0
    long_ids, short_ids = torch.full((1, 21), 3), torch.full((1, 20), 3)
    two_rows = torch.full((2, 12), 3)  # each row under the limit, the pass over it
    for ids in (long_ids, long_ids, long_ids, short_ids, long_ids, short_ids, short_ids):
        steps.run(ids, torch.ones_like(ids), torch.arange(ids.shape[1])[None])
    for _ in range(3):
        steps.run(two_rows, torch.ones_like(two_rows), torch.arange(12).expand(2, 12))
    assert EagerReplay.captured == 1 and list(steps.shapes) == [(1, 20, True)]


def test_a_full_pass_holds_nothing_a_capture_refuses(model):
    """Every full pass replayed (on a GPU the capture runs that same pass) reads no value on
    the host, copies nothing to the device with a wait, and makes every tensor on a named
    device: LLaDA's and Dream's passes without a cache can be captured."""
    WatchedCapture.hazards, WatchedCapture.runs = collections.Counter(), 0
    _decode(model, WatchedCapture, ["none", "none"], RULES["fixed"])
    assert WatchedCapture.runs >= 8
    assert WatchedCapture.hazards == collections.Counter()


def test_compiled_full_passes_give_the_eager_tokens(model, monkeypatch):
    """Under `compiled` the captured full pass is compiled first (here by the `aot_eager`
    backend, which runs PyTorch's own operators: the eager tokens exactly), and only the
    captured passes are compiled."""
    from test_compiled_steps import WarmedReplay

    monkeypatch.setattr(static_module, "COMPILE_BACKEND", "aot_eager")
    compiled = []
    compile_ = static_module._compiled_hidden_states
    monkeypatch.setattr(
        static_module, "_compiled_hidden_states", lambda *a: compiled.append(1) or compile_(*a)
    )
    eager, _ = _decode(model, None, ["none"], dict(steps=16))
    model.cached_steps = "static"
    decoder = RowDecoder(model, pad_token_id=MASK)
    decoder.forward.full_steps = FullSteps(model, "compiled", strict=True)
    decoder.forward.full_steps.graph_class = WarmedReplay
    rows = decode_rows(decoder, _rows(["none"], dict(steps=16)))
    assert same_decodes(eager, rows)
    # 16 passes: the first eager; the second captured (its warm-up and its replay compiled);
    # 14 more replays
    assert len(compiled) == 16
