"""The static-shape cached step: a reuse pass of `cache=prefix|dual` over key/value buffers
of fixed shape, run eagerly or captured as a CUDA graph and replayed (the model arg
`cached_steps`, `CACHED_STEPS`).

* `dynamic`: at every step, every reusing row's kept keys and values are stacked (padded to
  the longest) and concatenated with the pass's own, in every layer.
* `static`: the buffers of a step's shape (rows, pass length, key width) are filled once,
  when the rows of the pass or what they keep change (a new block, a row joining or leaving
  the pass); each later step writes only the pass's own columns, in place. The layout is
  the dynamic path's (the prefix left-padded, the pass, the suffix right-padded), so the
  attention reads the same tensor and the tokens are the same, bit for bit (tested in
  float32 on the CPU). The default off a GPU.
* `graphs`: as `static`, and the pass over the buffers is captured as a CUDA graph once
  its rows hold still (the second step in a row over the same fill) and replayed from then
  on, also after later fills of the same shape (the next block of one row): one launch for
  the model's body instead of a few hundred kernels, which is what bounds a one-row step.
  Rows that change at every step (threshold rules at many rows) stay eager, and so does a
  pass of more than `CAPTURE_TOKENS` queries (bound by its arithmetic). It needs a
  CUDA device and a model whose pass has no host syncs and no switch the graph would not
  see (`graph_capturable`: this package's LLaDA and Dream on one device, without a LoRA
  adapter, whose switching on and off RFG's reference relies on). At most `GRAPHS_KEPT`
  shapes keep their graph and buffers (the least recently used is dropped).
* `compiled`: as `graphs`, with the pass compiled by `torch.compile` (inductor) before it is
  captured, which fuses each layer's norms, rotary embedding, casts and residual adds into a
  few kernels: a replay still pays each kernel's minimum time, and those small kernels are
  most of a layer's. Asked for by name only: the fused kernels round otherwise than the
  eager ones, so the logits are not the eager pass's bit for bit and a token can differ
  where two are nearly tied. Where `graphs` cannot apply, refused; also without Triton
  (torch.compile's GPU code generator). Each capture of a shape the compilations so far do
  not serve compiles first (seconds to minutes at LLaDA-8B's 32 layers); torch.compile's
  automatic dynamic shapes may let one compilation serve later widths, while a change in the
  rows or the pass length compiles anew. More than `COMPILATIONS_KEPT` compilations of the
  pass is an error that says so.
* `auto` (the default): `graphs` where it applies, else `static`.

What a graph replays is the model's body only: the output head, the commit rules and the
fresh passes (over whole sequences, at a new block) run eagerly. `cache=none`'s full passes
are captured under `graphs` and `compiled` too, by `full_steps.py`.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from lm_eval_dvoting.core.decoding.kept import all_layers, kept_columns, kept_padding
from lm_eval_dvoting.core.decoding.rules import host_to_device
from lm_eval_dvoting.core.decoding.state import KeptKeysValues
from lm_eval_dvoting.models.adapters import lora_layers
from lm_eval_dvoting.models.common import StaticKeyValues

log = logging.getLogger(__name__)

CACHED_STEPS = ("auto", "dynamic", "static", "graphs", "compiled")
CAPTURED = ("graphs", "compiled")  # the modes that capture the pass as a CUDA graph
# torch.compile's backend for `compiled` (the CPU tests trace with `aot_eager`: it needs no
# C compiler and runs the traced graph's own operators)
COMPILE_BACKEND = "inductor"
# inductor rounds where the eager pass casts or computes in bfloat16 (the norms' float32 ->
# bfloat16, and a rotation that runs in bfloat16 as Dream's does), as the upstream models do,
# rather than keeping float32 between its fused operations
INDUCTOR_OPTIONS = {"emulate_precision_casts": True}
# what a refusal of `compiled` suggests instead
INSTEAD_OF_COMPILED = "graphs (the same capture, of the eager kernels)"
# the most tokens (rows x pass length) a captured pass holds; a larger one runs eagerly. Such
# a pass is bound by its arithmetic, its kernels long enough for the launches to hide behind
# them, while a capture costs a few passes. On the H200 (2026-11-28, bf16, LLaDA-8B's shape)
# graphs saved 2.1 ms a step (131 -> 129 ms) on `prefix`'s first-block reuse pass at 16 rows
# (4,096 queries) for a 416 ms capture step, and 7.5 ms a step (28.9 -> 21.4 ms) on `dual`'s
# at 16 rows (512 queries) for 88 ms: where between the two it stops paying is our guess
CAPTURE_TOKENS = 2048
GRAPHS_KEPT = 2  # shapes whose buffers (a copy of the rows' kept keys each) and graph stay
# a shape is captured on the second step in a row that finds its buffers filled as they are:
# the rows of the pass hold still (one row, or the fixed schedule), so replays will follow;
# rows that change at every step (threshold rules at many rows) would capture and replay once
CAPTURE_ON_STEADY_STEP = 2


def graph_capturable(model: torch.nn.Module, device: torch.device) -> str | None:
    """Why the model's reuse pass cannot be captured as a CUDA graph here (None: it can)."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device; the model is on {device.type}"
    if not getattr(model, "captures_cuda_graphs", False):
        return f"{type(model).__name__}'s pass is not known to be capturable"
    if getattr(model, "device_map", None):
        return "the model is spread over devices (parallelize=True)"
    if lora_layers(model):
        return "a LoRA adapter is attached (switching it would not reach a captured graph)"
    return None


def check_cached_steps(asked: Any) -> str:
    """`asked` if it is one of `CACHED_STEPS`, else a ValueError saying what is allowed."""
    if asked not in CACHED_STEPS:
        raise ValueError(
            f"cached_steps must be one of {', '.join(CACHED_STEPS)}, got {asked!r}: leave it "
            "out (auto: CUDA graphs where they apply, else static buffers)"
        )
    return str(asked)


def resolve_cached_steps(asked: str, model: torch.nn.Module, device: torch.device) -> str:
    """The mode that runs: `asked` (`CACHED_STEPS`), with `auto` resolved; `graphs` or
    `compiled` where it cannot apply is refused, naming why and what to use instead."""
    check_cached_steps(asked)
    why_not = graph_capturable(model, device)
    if asked == "auto":
        return "static" if why_not else "graphs"
    if asked == "compiled" and not why_not:
        why_not = compiler_missing()
    if asked in CAPTURED and why_not:
        instead = (
            INSTEAD_OF_COMPILED
            if asked == "compiled" and graph_capturable(model, device) is None
            else "auto (graphs where they apply, else static) or static"
        )
        raise ValueError(
            f"cached_steps={asked} cannot apply: {why_not}; use cached_steps={instead}"
        )
    return asked


def compiler_missing() -> str | None:
    """Why torch.compile's inductor cannot build GPU kernels here (None: it can)."""
    if COMPILE_BACKEND != "inductor":
        return None
    from torch.utils._triton import has_triton

    return None if has_triton() else "Triton (torch.compile's GPU code generator) is missing"


def _hidden_states(
    model: torch.nn.Module,
    ids: torch.Tensor,
    attention: torch.Tensor | None,
    positions: torch.Tensor,
    cache: StaticKeyValues | None,
) -> torch.Tensor:
    return model.hidden_states(ids, attention, positions, cache=cache)


# compilations of the pass torch.compile may make in one process, one per set of shapes its
# earlier ones do not serve (its own default, 8, a long run's shapes can meet; automatic
# dynamic shapes may let one compilation serve several key widths)
COMPILATIONS_KEPT = 64


def _compiled_hidden_states(*inputs: Any) -> torch.Tensor:
    """`_hidden_states(*inputs)` through `compiled_pass`; what torch.compile refuses (a
    graph break, too many compilations, inductor's own errors) is an error that says so."""
    # (fullgraph=True turns the limit into this error; torch before 2.7 had no such class)
    limit_hit = getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", ())
    try:
        with torch._dynamo.config.patch(recompile_limit=COMPILATIONS_KEPT):
            return compiled_pass(COMPILE_BACKEND)(*inputs)
    except limit_hit as error:
        raise RuntimeError(
            f"torch.compile met more than {COMPILATIONS_KEPT} shapes of the pass "
            f"(static_steps.COMPILATIONS_KEPT; {first_line(error)})"
        ) from error
    except torch._dynamo.exc.TorchDynamoException as error:
        raise RuntimeError(
            "torch.compile could not compile the pass as one graph "
            f"({type(error).__name__}: {first_line(error)})"
        ) from error


def first_line(error: BaseException) -> str:
    """The first line of an error's message (empty for an error without one)."""
    return (str(error).strip().splitlines() or [""])[0]


@functools.cache
def compiled_pass(backend: str) -> Callable[..., torch.Tensor]:
    """`_hidden_states` compiled by `torch.compile` as one graph (`fullgraph`: a break would
    leave eager kernels between the compiled pieces), once per process. The model is an
    argument, not a bound `self` kept with the compiled function: torch.compile guards on
    it and reads its weights at every call, so two models (a policy and RFG's reference, or
    a model and its copy) never share weights through a compilation."""
    options = INDUCTOR_OPTIONS if backend == "inductor" else None
    return torch.compile(_hidden_states, backend=backend, fullgraph=True, options=options)


class CudaGraph:
    """`pass_` captured as a CUDA graph; `replay()` runs it again and returns its output.

    Warm-up and capture run on a side stream of the model's device, made current for them
    (a capture on another GPU's stream would record nothing: the kernels would run eagerly
    and every replay would return the capture's output again). The warm-up (as PyTorch's
    CUDA-graph notes ask) writes the pass's own key/value columns with the values the replay
    writes again, so it changes nothing, and its output is what the graph must give: a first
    replay over a poisoned output must equal it bit for bit (the same kernels on the same
    inputs; one host sync per capture), or the capture is refused (`auto` then goes on with
    static buffers)."""

    def __init__(self, pass_: Callable[[], torch.Tensor], device: torch.device) -> None:
        on_device = torch.cuda.device(device) if device.type == "cuda" else nullcontext()
        with on_device:  # (off CUDA: a stand-in's capture, in the tests)
            self._check(self._capture(pass_, device))
        log.debug("cached_steps: captured a pass of %s", tuple(self.output.shape))

    def _capture(self, pass_: Callable[[], torch.Tensor], device: torch.device) -> torch.Tensor:
        """Warm up on a side stream, then capture there (`self.graph`, `self.output`); the
        warm-up's output."""
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            expected = pass_()
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=side):
            self.output = pass_()
        return expected

    def _check(self, expected: torch.Tensor) -> None:
        """Refuse a graph whose replay does not give the eager pass's output, bit for bit
        (compared as integers: -0.0 is not 0.0, and a NaN the pass itself computes is
        equal to itself)."""
        self.output.fill_(float("nan"))
        self.graph.replay()
        if not same_bits(self.output, expected):
            raise RuntimeError(
                "the captured graph's replay does not give the eager pass's output (bit for bit)"
            )

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.output.clone()  # the next replay overwrites the graph's output


BITS_OF_SIZE = {2: torch.int16, 4: torch.int32, 8: torch.int64}  # element size -> int dtype


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` and `b` (of one floating dtype and shape) hold the same bits."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    bits = BITS_OF_SIZE[a.element_size()]
    return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))


@dataclass(eq=False)
class _Shape:
    """The buffers of one step shape, what fills them, and its graph once captured."""

    cache: StaticKeyValues
    layers: tuple[torch.Tensor, torch.Tensor]  # keys, values: every layer's buffer in one
    ids: torch.Tensor
    attention: torch.Tensor | None  # None: no query of this shape is padded
    positions: torch.Tensor
    filled_from: list[weakref.ref[KeptKeysValues]] = field(default_factory=list)
    steady: int = 0  # steps in a row over the same fill
    graph: Any = None

    def filled_from_these(self, kept: Sequence[KeptKeysValues]) -> bool:
        """Whether the buffers hold these rows' kept keys (the query mask is part of the
        fill too: for one set of kept keys a row's queries are always the same)."""
        return len(self.filled_from) == len(kept) and all(
            ref() is k for ref, k in zip(self.filled_from, kept)
        )


def make_room(shapes: OrderedDict[Any, Any], limit: int) -> None:
    """Drop shapes (least recently used first, each with a `graph` attribute) until fewer
    than `limit` are left: those without a graph first (they cost little to rebuild), then
    the least recently used."""
    for key in [k for k, shape in shapes.items() if shape.graph is None]:
        if len(shapes) < limit:
            return
        del shapes[key]
    while len(shapes) >= limit:
        shapes.popitem(last=False)


class Captures:
    """What captures a decoder's passes as CUDA graphs (`StaticSteps`, `full_steps.FullSteps`):
    the model, the mode, and the fall-back when a capture fails."""

    graph_class: Any = CudaGraph  # what captures a pass (tests replay it eagerly)
    what = "the reuse pass"  # the passes captured, as an error names them

    def __init__(self, model: torch.nn.Module, mode: str, strict: bool = False) -> None:
        """`mode`: `static`, `graphs` or `compiled`; `strict`: the mode was asked for by name,
        so a capture that fails is an error rather than a fall-back to `static`."""
        self.model, self.mode, self.strict = model, mode, strict

    def captured(self, pass_: Callable[[], torch.Tensor], device: torch.device) -> Any:
        """`pass_` captured (`graph_class`); if capturing fails, `auto` goes on with static
        buffers (said once in the log), an explicit `graphs` or `compiled` is refused."""
        try:
            return self.graph_class(pass_, device)
        except Exception as error:  # whatever the capture raised, the decode can go on
            if self.strict:
                instead = (
                    INSTEAD_OF_COMPILED
                    if self.mode == "compiled"
                    else "static (the same tokens, without graphs)"
                )
                raise RuntimeError(
                    f"cached_steps={self.mode}: capturing {self.what} failed ({error}); use "
                    f"cached_steps={instead}"
                ) from error
            log.warning(
                "cached_steps=auto: capturing %s failed (%s); no CUDA graphs from now on "
                "(static buffers, eager passes)",
                self.what,
                error,
            )
            self.mode = self.model.cached_steps = "static"  # for the later decoders too
            return None

    def pass_over(
        self, inputs: tuple[torch.Tensor, ...], cache: StaticKeyValues | None, compiled: bool
    ) -> torch.Tensor:
        """The model's pass over `inputs` (ids, attention, positions) and `cache`;
        `compiled`: through `compiled_pass` (only a pass that is captured: one that runs
        once would cost a compilation for nothing)."""
        if compiled:
            return _compiled_hidden_states(self.model, *inputs, cache)
        return _hidden_states(self.model, *inputs, cache)


class StaticSteps(Captures):
    """The reuse passes of one decoder (`ForwardPass`) in `static`, `graphs` or `compiled`
    mode."""

    def __init__(self, model: torch.nn.Module, mode: str, strict: bool = False) -> None:
        super().__init__(model, mode, strict)
        self.shapes: OrderedDict[tuple[Any, ...], _Shape] = OrderedDict()

    def run(
        self,
        kept: Sequence[KeptKeysValues],
        ids: torch.Tensor,
        attention: torch.Tensor | None,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        """The pass's hidden states: `ids`, `attention` and `positions` as for the dynamic
        pass (left-padded queries; `attention` None: none padded), `kept[r]` row r's kept
        keys and values."""
        shape = self._shape(kept, ids, attention)
        # the buffers hold the kept keys of these very objects (weakly referenced: a row's
        # kept keys are not held past its block) for these query lengths; else refill them
        if not shape.filled_from_these(kept):
            _fill(shape, kept, ids, attention)
            shape.filled_from, shape.steady = [weakref.ref(k) for k in kept], 0
        shape.steady += 1
        if self.mode in CAPTURED:
            return self._replayed(shape, ids, attention, positions)
        return self._pass(shape, ids, attention, positions)

    def _shape(
        self, kept: Sequence[KeptKeysValues], ids: torch.Tensor, attention: torch.Tensor | None
    ) -> _Shape:
        """The buffers of this step's shape (allocated on its first step). Whether the
        queries and the kept keys are padded is part of the shape: a pass with nothing
        padded attends without a mask (`common.attended_keys`), and a graph captured so
        must never be replayed over padding."""
        width = _prefix_width(kept) + ids.shape[1] + _suffix_width(kept)
        padded = (attention is not None, kept_padding(kept))
        key = (ids.shape[0], ids.shape[1], width, *padded)
        if key in self.shapes:
            self.shapes.move_to_end(key)
            return self.shapes[key]
        self._evict()
        self.shapes[key] = _allocate(kept, ids, width, *padded)
        return self.shapes[key]

    def _evict(self) -> None:
        """Make room for a new shape before allocating it: shapes without a graph go first
        (they cost only a refill to rebuild), then the least recently used. `static` keeps
        one shape; `graphs` at most `GRAPHS_KEPT`, each a copy of the rows' kept keys."""
        make_room(self.shapes, GRAPHS_KEPT if self.mode in CAPTURED else 1)

    def _pass(
        self,
        shape: _Shape,
        ids: torch.Tensor,
        attention: torch.Tensor | None,
        positions: torch.Tensor,
        compiled: bool = False,
    ) -> torch.Tensor:
        return self.pass_over((ids, attention, positions), shape.cache, compiled)

    def _replayed(
        self,
        shape: _Shape,
        ids: torch.Tensor,
        attention: torch.Tensor | None,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        """The pass through the shape's graph (captured on `CAPTURE_ON_STEADY_STEP`, if it
        holds at most `CAPTURE_TOKENS` queries), its inputs copied into the shape's own
        tensors, which the graph reads."""
        shape.ids.copy_(ids)
        if shape.attention is not None:
            shape.attention.copy_(attention)
        shape.positions.copy_(positions)
        inputs = (shape.ids, shape.attention, shape.positions)
        uncaptured = shape.steady < CAPTURE_ON_STEADY_STEP or ids.numel() > CAPTURE_TOKENS
        if shape.graph is None and uncaptured:
            return self._pass(shape, *inputs)
        if shape.graph is None:
            shape.graph = self._captured(shape, inputs)
        return shape.graph.replay() if shape.graph else self._pass(shape, *inputs)

    def _captured(self, shape: _Shape, inputs: tuple[torch.Tensor, ...]) -> Any:
        """The shape's pass captured (`Captures.captured`)."""
        compiled = self.mode == "compiled"
        return self.captured(
            lambda: self._pass(shape, *inputs, compiled=compiled), shape.ids.device
        )


def _prefix_width(kept: Sequence[KeptKeysValues]) -> int:
    return max(kept_columns(k.prefix_keys) for k in kept)


def _suffix_width(kept: Sequence[KeptKeysValues]) -> int:
    return max(kept_columns(k.suffix_keys) for k in kept)


def _allocate(
    kept: Sequence[KeptKeysValues],
    ids: torch.Tensor,
    width: int,
    queries_padded: bool = True,
    kept_padded: bool = True,
) -> _Shape:
    """Zeroed buffers (finite everywhere: a padded key's score must stay finite), every
    layer's keys in one tensor and every layer's values in another (`_fill` writes a row of
    all the layers at once); the model reads each layer's as a view of them. The query mask
    only where queries are padded; the key mask always (every key real where nothing is
    padded, and then not read: `common.attended_keys`). Padded by default: the masks are
    then read, which is right for any fill."""
    first = kept[0].prefix_keys
    rows, device = ids.shape[0], ids.device
    kv_heads, head_dim = first[0].shape[0], first[0].shape[2]
    size = (len(first), rows, kv_heads, width, head_dim)
    keys, values = (torch.zeros(size, dtype=first[0].dtype, device=device) for _ in range(2))
    cache = StaticKeyValues(
        list(keys.unbind(0)),
        list(values.unbind(0)),
        torch.zeros((rows, width), dtype=torch.long, device=device),
        torch.zeros(ids.shape[1], dtype=torch.long, device=device),
        every_kept_key_real=not kept_padded,
    )
    attention = torch.zeros_like(ids) if queries_padded else None
    return _Shape(cache, (keys, values), torch.zeros_like(ids), attention, torch.zeros_like(ids))


def _fill(
    shape: _Shape,
    kept: Sequence[KeptKeysValues],
    ids: torch.Tensor,
    attention: torch.Tensor | None,
) -> None:
    """Copy the rows' kept keys and values into the buffers around the pass's columns, in
    the dynamic path's layout (`kept.stack_kept`: each prefix left-padded, each suffix
    right-padded, zeros in the padding), and set the key mask. Each copy or zeroing covers a
    row's every layer at once (`kept.all_layers`): on a GPU a refill costs a few kernels a
    row, not a few a row and layer, which matters where the rows of the pass change at every
    step (the threshold rules at many rows)."""
    cache, device = shape.cache, ids.device
    before = _prefix_width(kept)
    after = before + ids.shape[1]
    cache.slot.copy_(torch.arange(before, after, device=device))
    spans = [
        (before - kept_columns(k.prefix_keys), after + kept_columns(k.suffix_keys)) for k in kept
    ]
    cache.mask.copy_(_kept_key_mask(spans, before, after, cache.mask.shape[1], device))
    cache.mask[:, before:after] = 1 if attention is None else attention
    for row, (k, (start, end)) in enumerate(zip(kept, spans)):
        for buffer, prefix, suffix in (
            (shape.layers[0][:, row], k.prefix_keys, k.suffix_keys),
            (shape.layers[1][:, row], k.prefix_values, k.suffix_values),
        ):  # (layers, kv_heads, width, head_dim)
            buffer[:, :, :start].zero_()
            buffer[:, :, start:before].copy_(all_layers(prefix))
            if suffix is not None:
                buffer[:, :, after:end].copy_(all_layers(suffix))
            buffer[:, :, end:].zero_()


def _kept_key_mask(
    spans: list[tuple[int, int]], before: int, after: int, width: int, device: torch.device
) -> torch.Tensor:
    """The (rows, width) 0/1 mask of the kept keys: row r's prefix at [start, before), its
    suffix at [after, end) (`spans[r]` = (start, end)); the pass's columns are 0 here."""
    bounds = host_to_device([[a for a, _ in spans], [b for _, b in spans]], torch.long, device)
    starts, ends = bounds[:, :, None]
    columns = torch.arange(width, device=device)
    prefix = (columns >= starts) & (columns < before)
    suffix = (columns >= after) & (columns < ends)
    return (prefix | suffix).long()
