"""`cached_steps=compiled` (lm_eval_dvoting/core/decoding/static_steps.py): the reuse pass
compiled by `torch.compile` as one graph, then captured as `graphs` captures it.

On the CPU there is no C compiler for inductor, so the pass is compiled with the `aot_eager`
backend: TorchDynamo traces it as inductor would see it (one graph, or an error), and the
traced graph runs PyTorch's own operators, so the tokens must be the dynamic path's exactly.
What inductor's fused kernels do to the bits is the GPU test's (tests/test_static_steps_gpu.py).
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from references import load_float32
from test_static_steps import (
    CACHE_MIX_IDS,
    CACHE_MIXES,
    CPU,
    MASK,
    RULES,
    EagerReplay,
    _rows,
    decode_rows,
    same_decodes,
)
from torch import nn

from lm_eval_dvoting.core.decoding import DecodeRow
from lm_eval_dvoting.core.decoding import static_steps as static_module
from lm_eval_dvoting.core.decoding.rows import RowDecoder
from lm_eval_dvoting.core.decoding.static_steps import StaticSteps, resolve_cached_steps

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def traced_without_a_compiler(monkeypatch):
    monkeypatch.setattr(static_module, "COMPILE_BACKEND", "aot_eager")


class WarmedReplay(EagerReplay):
    """`EagerReplay` that runs the pass once when it captures it, as `CudaGraph`'s warm-up
    does (where a compilation, or its failure, happens)."""

    def __init__(self, pass_, device: torch.device) -> None:
        pass_()
        super().__init__(pass_, device)


def _decode(
    model: nn.Module, mode: str, caches: list[str], rule: dict
) -> tuple[list[DecodeRow], RowDecoder]:
    """The rows of tests/test_static_steps.py decoded under `mode` (`compiled` replayed
    eagerly: no CUDA here); the rows and the decoder."""
    model.cached_steps = "dynamic" if mode == "dynamic" else "static"
    decoder = RowDecoder(model, pad_token_id=MASK)
    if mode == "compiled":
        decoder.forward.static_steps = StaticSteps(model, "compiled", strict=True)
        decoder.forward.static_steps.graph_class = WarmedReplay
    return decode_rows(decoder, _rows(caches, rule)), decoder


# every mix on LLaDA; Dream (whose pass differs in its query mask) on the mixed batch, which
# holds prefix and dual rows: each case compiles anew, the suite's slowest part here
CASES = [("llada_fixture", caches) for caches in CACHE_MIXES] + [("dream_fixture", CACHE_MIXES[2])]
CASE_IDS = [f"llada-{name}" for name in CACHE_MIX_IDS] + ["dream-mixed"]


@pytest.mark.parametrize("family, caches", CASES, ids=CASE_IDS)
def test_compiled_steps_give_the_dynamic_paths_tokens(family, caches, request, monkeypatch):
    """Four rows of different prompts, answers and blocks under the fixed schedule (whose
    rows hold still, so their passes are captured), moving between blocks at different
    steps: the compiled pass meets several shapes and gives the dynamic path's tokens, in
    as many passes. (The threshold rules' rows change at every step, so their passes are
    not captured, nor compiled.)"""
    model = load_float32(str(request.getfixturevalue(family)))
    monkeypatch.setattr(model, "cached_steps", "auto", raising=False)  # restored afterwards
    captured = EagerReplay.captured
    dynamic, _ = _decode(model, "dynamic", caches, RULES["fixed"])
    compiled, _ = _decode(model, "compiled", caches, RULES["fixed"])
    assert same_decodes(dynamic, compiled)
    assert EagerReplay.captured >= captured + 2


def test_one_row_replays_the_compiled_pass(model, monkeypatch):
    """One `dual` row under the fixed schedule: the pass is compiled, captured and replayed
    (here eagerly), and every reuse step runs the compiled pass."""
    calls = []
    compiled = static_module.compiled_pass

    def counted(backend):
        inner = compiled(backend)
        return lambda *args: calls.append(1) or inner(*args)

    monkeypatch.setattr(static_module, "compiled_pass", counted)
    captured = EagerReplay.captured
    dynamic, _ = _decode(model, "dynamic", ["dual"], RULES["fixed"])
    rows, decoder = _decode(model, "compiled", ["dual"], RULES["fixed"])
    assert same_decodes(dynamic, rows)
    assert EagerReplay.captured > captured
    assert decoder.forward.static_steps.mode == "compiled"
    assert len(calls) >= 8


def test_two_models_share_a_compilation_but_each_reads_its_own_weights(llada_fixture):
    """The compiled function is one per process and takes the model as an argument: a copy
    of the model with other weights (as a policy and RFG's reference are two models of one
    class) decodes with its own weights, not with those the compilation first saw. (Planted:
    the compiled `hidden_states` bound to the first model and kept on it, which a copy of
    the model carries: failed.)"""
    first = load_float32(str(llada_fixture))
    second = copy.deepcopy(first)
    with torch.no_grad():
        for weight in second.parameters():
            weight.add_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)))
    decoded = {}
    for name, model in (("first", first), ("second", second), ("first again", first)):
        dynamic, _ = _decode(model, "dynamic", ["dual"], RULES["fixed"])
        compiled, _ = _decode(model, "compiled", ["dual"], RULES["fixed"])
        assert same_decodes(dynamic, compiled), name
        decoded[name] = dynamic[0].tokens
    assert not torch.equal(decoded["first"], decoded["second"])  # the check has teeth


def test_a_pass_that_breaks_the_graph_is_refused_not_run_in_pieces(model, monkeypatch):
    """A pass torch.compile cannot trace as one graph (here it reads a value on the host)
    stops the decode with an error that names the mode and what to use instead."""
    pass_ = model.hidden_states

    @functools.wraps(pass_)  # its signature: the decoder asks whether it takes a cache
    def reads_the_host(*args, **kwargs):
        if torch.ones(1).sum().item() < 0:
            raise AssertionError("never")
        return pass_(*args, **kwargs)

    monkeypatch.setattr(model, "hidden_states", reads_the_host)
    torch._dynamo.reset()  # the tests above compiled the pass without the host read
    with pytest.raises(
        RuntimeError,
        match=r"cached_steps=compiled: capturing the reuse pass failed \(torch.compile could "
        r"not compile the pass as one graph .*\); use cached_steps=graphs",
    ):
        _decode(model, "compiled", ["dual"], RULES["fixed"])
    torch._dynamo.reset()


def test_compiled_resolves_where_graphs_would_and_needs_triton(model, monkeypatch):
    with pytest.raises(ValueError, match=r"cached_steps=compiled cannot apply: CUDA graphs"):
        resolve_cached_steps("compiled", model, CPU)
    monkeypatch.setattr(static_module, "COMPILE_BACKEND", "inductor")
    monkeypatch.setattr("torch.utils._triton.has_triton", lambda: False)
    with pytest.raises(
        ValueError,
        match=r"cached_steps=compiled cannot apply: Triton .* "
        r"missing; use cached_steps=graphs \(the same capture",
    ):
        resolve_cached_steps("compiled", model, CUDA)
    assert resolve_cached_steps("graphs", model, CUDA) == "graphs"  # graphs needs no Triton
    monkeypatch.setattr("torch.utils._triton.has_triton", lambda: True)
    assert resolve_cached_steps("compiled", model, CUDA) == "compiled"
    assert resolve_cached_steps("auto", model, CUDA) == "graphs"  # never chosen by auto


def test_the_model_arg_is_refused_off_cuda_before_loading():
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    with pytest.raises(ValueError, match=r"cached_steps=compiled needs a CUDA device.*cpu"):
        LLaDAEvalModel(pretrained="/no/such/folder", device="cpu", cached_steps="compiled")


def test_compiled_results_are_cached_apart_from_the_other_modes(monkeypatch):
    """`--use_cache`: entries of `compiled` (other rounding) are not served to a run in
    another mode, while `static`, `graphs` and `dynamic` share theirs (the same tokens)."""
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel
    from lm_eval_dvoting.integration.result_cache import fingerprint

    lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu", cache="dual")
    shared = fingerprint(lm)
    lm.model.cached_steps = "dynamic"
    assert fingerprint(lm) == shared
    monkeypatch.setattr(type(lm), "cached_steps", property(lambda self: "compiled"))  # a GPU's
    assert fingerprint(lm) == {**shared, "cached_steps": "compiled"}


def test_compiled_asked_by_name_through_the_decoder_is_refused_not_turned_into_static(
    model, monkeypatch
):
    """A decoder made for `cached_steps=compiled` (as on a GPU: the checks that need CUDA
    and Triton made to pass here) refuses a capture that fails, rather than going on with
    static buffers as `auto` would. (Planted: `strict=asked == "graphs"`: failed.)"""
    monkeypatch.setattr(static_module, "graph_capturable", lambda *a: None)
    monkeypatch.setattr(static_module, "compiler_missing", lambda: None)
    pass_ = model.hidden_states

    @functools.wraps(pass_)
    def reads_the_host(*args, **kwargs):
        if torch.ones(1).sum().item() < 0:
            raise AssertionError("never")
        return pass_(*args, **kwargs)

    monkeypatch.setattr(model, "hidden_states", reads_the_host)
    monkeypatch.setattr(StaticSteps, "graph_class", WarmedReplay)
    torch._dynamo.reset()
    model.cached_steps = "compiled"
    decoder = RowDecoder(model, pad_token_id=MASK)
    with pytest.raises(RuntimeError, match=r"cached_steps=compiled: capturing the reuse pass"):
        decode_rows(decoder, _rows(["dual"], RULES["fixed"]))
    assert decoder.forward.static_steps.mode == "compiled" == model.cached_steps
    torch._dynamo.reset()


def test_inductors_options_are_ones_it_knows():
    """torch.compile checks the option names when it wraps the function (no compiler
    needed): a misspelt `emulate_precision_casts` is refused here, not on the GPU."""
    static_module.compiled_pass.__wrapped__("inductor")
    with pytest.raises(RuntimeError, match="emulate_precision_cast"):
        torch.compile(lambda x: x, options={"emulate_precision_cast": True})


def test_too_many_compilations_are_an_error_that_names_the_limit(model, monkeypatch):
    monkeypatch.setattr(static_module, "COMPILATIONS_KEPT", 1)
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match=r"torch.compile met more than 1 shapes of the pass"):
        _decode(model, "compiled", ["dual", "prefix", "dual", "dual"], RULES["fixed"])
    torch._dynamo.reset()
