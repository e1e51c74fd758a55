"""`cached_steps=graphs` on a CUDA device, against the eager paths (issue 43): run with
`python -m pytest -m gpu -n 0 tests/test_static_steps_gpu.py` (bench/gpu_session.sh runs it
first); skipped where no CUDA device is present, as on the CPU machines and in CI.

The official-tiny LLaDA and Dream fixtures on the GPU, the rows of tests/test_static_steps.py
(prompts, answers and blocks unlike each other) with generators on the GPU:

* every mode (`dynamic`, `static`, `graphs`) decodes the same tokens, float32 and bfloat16,
  for `prefix`, `dual` and mixed batches under the fixed, entropy and confidence rules;
* one row under the fixed schedule: real CUDA graphs are captured and kept (the mode stays
  `graphs`: no capture was refused), and every reuse pass, replayed, is the dynamic path's
  pass over the same inputs, bit for bit, over the four blocks' fills;
* `compiled` (inductor's kernels) captures its graphs, and in float32 gives the dynamic
  path's tokens under the fixed schedule;
* `cache=none`'s full passes, captured and replayed under `graphs`, give the dynamic tokens;
* a row with nothing padded attends without a mask in every mode, so in bfloat16 PyTorch's
  flash kernel runs it (the kernel upstream's code runs; a mask rules it out), while a
  ragged batch still passes its mask.
"""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import fixture_folder
from test_static_steps import (
    CACHE_MIX_IDS,
    CACHE_MIXES,
    MASK,
    RULES,
    CheckedSteps,
    _rows,
    assert_modes_decode_alike,
    decode_rows,
)
from torch import nn

from lm_eval_dvoting.core.decoding import DecodeRow
from lm_eval_dvoting.core.decoding.rows import RowDecoder
from lm_eval_dvoting.core.decoding.static_steps import CudaGraph
from lm_eval_dvoting.models.loading import load_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda")


@pytest.fixture(scope="module", params=["llada", "dream"])
def family(request) -> str:
    return request.param


def _model(family: str, dtype: str) -> nn.Module:
    return load_model(str(fixture_folder(family)), device="cuda", dtype=dtype)


def _rows_on_gpu(caches: list[str], rule: dict) -> list[DecodeRow]:
    rows = _rows(caches, rule)
    for k, row in enumerate(rows):  # the CPU rows' seeds, on the device's generator
        row.generator = torch.Generator(device=CUDA).manual_seed(100 + k)
    return rows


def _decode(model: nn.Module, mode: str, caches: list[str], rule: dict) -> list[DecodeRow]:
    model.cached_steps = mode
    decoder = RowDecoder(model, pad_token_id=MASK)
    rows = _rows_on_gpu(caches, rule)
    for row in rows:
        decoder.add(row)
    while decoder.active:
        decoder.step()
    assert model.cached_steps == mode  # a refused capture would have fallen back to static
    return rows


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rule", RULES, ids=list(RULES))
@pytest.mark.parametrize("caches", CACHE_MIXES, ids=CACHE_MIX_IDS)
def test_every_mode_gives_the_dynamic_tokens_on_the_gpu(family, dtype, caches, rule):
    model = _model(family, dtype)
    assert_modes_decode_alike(functools.partial(_decode, model), caches, RULES[rule])


@pytest.mark.parametrize("cache, replays, held", [("dual", 11, 1), ("prefix", 8, 2)])
def test_real_graphs_are_captured_and_each_replay_is_the_eager_pass(
    family, cache, replays, held, monkeypatch
):
    """One row, 4 blocks of 4 positions, one commit a step: 12 reuse passes, each checked
    against the dynamic pass over its inputs. `dual` captures once (its shape holds over the
    blocks) at the first block's second reuse pass and replays from there on: 11 replays,
    1 graph; `prefix` captures one a block (its pass shrinks): 8 replays, 2 graphs kept."""
    model = _model(family, "float32")
    model.cached_steps = "graphs"
    replayed = []
    replay = CudaGraph.replay
    monkeypatch.setattr(CudaGraph, "replay", lambda graph: replayed.append(1) or replay(graph))
    decoder = RowDecoder(model, pad_token_id=MASK)
    CheckedSteps.checked = 0
    decoder.forward.static_steps = CheckedSteps(model, "graphs", strict=True)
    row = _rows_on_gpu([cache], dict(steps=16))[0]
    decoder.add(row)
    while decoder.active:
        decoder.step()
    shapes = decoder.forward.static_steps.shapes.values()
    assert row.nfe == 16 and CheckedSteps.checked == 12
    assert (len(replayed), sum(shape.graph is not None for shape in shapes)) == (replays, held)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("caches", [["dual", "prefix", "none", "dual"]], ids=["mixed"])
def test_compiled_steps_on_the_gpu(family, dtype, caches, monkeypatch):
    """`cached_steps=compiled` (inductor's kernels, captured): graphs are captured and kept
    (a refused capture would raise: the mode is asked for by name), and in float32 the
    tokens are the dynamic path's under the fixed schedule. Inductor's fused norms sum in
    another order, so the bits are not asserted, nor the bfloat16 tokens (a near-tie may
    go the other way): those the bench compares (`python -m bench static-steps`)."""
    captures = []
    capture = CudaGraph.__init__
    monkeypatch.setattr(
        CudaGraph, "__init__", lambda graph, *args: captures.append(1) or capture(graph, *args)
    )
    model = _model(family, dtype)
    dynamic = _decode(model, "dynamic", caches, RULES["fixed"])
    compiled = _decode(model, "compiled", caches, RULES["fixed"])
    assert captures
    if dtype == "float32":
        for expected, row in zip(dynamic, compiled):
            assert torch.equal(row.tokens, expected.tokens)
            assert row.nfe == expected.nfe


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rule", RULES, ids=list(RULES))
def test_full_passes_replayed_give_the_dynamic_tokens(family, dtype, rule, monkeypatch):
    """`cache=none` rows under `graphs` (core/decoding/full_steps.py): the full passes are
    captured once their shape comes back and replayed (a replay runs the eager kernels, and
    each capture's first replay is checked against the eager pass bit for bit), so every
    rule decodes `dynamic`'s tokens, in both dtypes."""
    captures = []
    capture = CudaGraph.__init__
    monkeypatch.setattr(
        CudaGraph, "__init__", lambda graph, *args: captures.append(1) or capture(graph, *args)
    )
    model = _model(family, dtype)
    assert_modes_decode_alike(functools.partial(_decode, model), ["none"] * 4, RULES[rule])
    assert captures


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_replayed_full_pass_reads_the_rows_that_joined(family, dtype):
    """A row joins as another leaves, so a captured full-pass shape comes back with other
    padding and positions: the real graphs replay the new inputs (the eager tokens)."""
    from test_full_steps import _joining_rows

    model = _model(family, dtype)
    decoded = {}
    for mode in ("dynamic", "graphs"):
        model.cached_steps = mode
        decoder = RowDecoder(model, pad_token_id=MASK)
        first, second, third = rows = _joining_rows(7)
        for row in rows:
            row.generator = torch.Generator(device=CUDA).manual_seed(row.generator.initial_seed())
        decoder.add(first)
        decoder.add(second)
        while decoder.active:
            if second in decoder.step() and third not in decoder.active:
                decoder.add(third)
        assert model.cached_steps == mode
        decoded[mode] = [row.tokens for row in rows]
    assert all(torch.equal(a, b) for a, b in zip(decoded["dynamic"], decoded["graphs"]))


@pytest.mark.parametrize("mode", ["dynamic", "static", "graphs"])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_an_unpadded_row_runs_on_the_flash_kernel(family, cache, mode):
    """Under `sdpa_kernel(FLASH_ATTENTION)` (no other kernel allowed), one row decodes in
    bfloat16, so none of its passes gave a mask (flash takes none), to the tokens it decodes
    under PyTorch's own choice of kernel; Dream's grouped keys and values go to it as they
    are (`enable_gqa`), which flash must take too. Two rows of different prompt lengths need
    their mask, which flash refuses: the restriction is real."""
    from test_unmasked_attention import _rows as rows_in_step
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = _model(family, "bfloat16")

    def decoded(prompts: list[int]) -> list[DecodeRow]:
        model.cached_steps = mode
        return decode_rows(RowDecoder(model, pad_token_id=MASK), rows_in_step(prompts, cache))

    chosen = decoded([6])
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        flash = decoded([6])
        with pytest.raises(RuntimeError, match="No available kernel"):
            decoded([6, 9])
    assert model.cached_steps == mode  # (graphs: no capture was refused)
    assert torch.equal(flash[0].tokens, chosen[0].tokens) and flash[0].nfe == chosen[0].nfe


@pytest.mark.parametrize("queries", [1, 32, 300])
def test_grouped_heads_read_in_place_are_the_repeat_bit_for_bit(queries):
    """Where `grouped_heads_in_place` holds (flash, bfloat16), attention over Dream-7B's 4
    key/value heads for 28 query heads, read in place, is the repeated heads' bit for bit:
    the premise of reading them in place."""
    from lm_eval_dvoting.models.common import bidirectional_attention, grouped_heads_in_place

    generator = torch.Generator(device=CUDA).manual_seed(queries)
    q = torch.randn(2, 28, queries, 128, device=CUDA, generator=generator).bfloat16()
    k, v = (torch.randn(2, 4, 300, 128, device=CUDA, generator=generator).bfloat16() for _ in "kv")
    assert grouped_heads_in_place(q, None)
    repeated = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(7, 1), v.repeat_interleave(7, 1)
    )
    assert torch.equal(bidirectional_attention(q, k, v, None), repeated)
