"""The full passes of `cache=none` as CUDA graphs (the model arg `cached_steps`, `graphs`
or `compiled`; `static_steps.py` does the same for the reuse passes of `prefix` and `dual`).

Without a cache every step is a pass over each row's whole sequence, and its shape (rows,
padded length) holds for as long as the rows of the step do: for one row, the whole decode.
So the pass is captured on the second pass in a row of one shape and replayed whenever that
shape comes again, its inputs copied into the shape's own tensors, which the graph reads;
passes of more than `static_steps.CAPTURE_TOKENS` tokens run eagerly (bound by their
arithmetic). On a GPU a one-row pass over a few hundred tokens launches some 1,500 kernels,
most of them small, and a replay is one launch. The same kernels run, so the tokens are the
eager pass's: each capture is checked against its warm-up pass bit for bit
(`static_steps.CudaGraph`), and a capture that fails falls back to eager passes under `auto`
and is an error when the mode was asked for by name. Under `compiled` the captured pass is
compiled by torch.compile first (other rounding: `static_steps.py`). What a graph replays is
the model's body only: the output head at the masked positions and the commit rule run
eagerly.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from lm_eval_dvoting.core.decoding import static_steps
from lm_eval_dvoting.core.decoding.static_steps import (
    CAPTURE_ON_STEADY_STEP,
    CAPTURED,
    GRAPHS_KEPT,
    Captures,
    make_room,
)


@dataclass(eq=False)
class _FullShape:
    """The input tensors a full pass of one shape is captured over, and its graph."""

    ids: torch.Tensor
    attention: torch.Tensor | None  # None: no row of this shape is padded
    positions: torch.Tensor
    steady: int = 0  # passes in a row of this shape
    graph: Any = None


class FullSteps(Captures):
    """The full passes of one decoder (`ForwardPass`) under `graphs` or `compiled`."""

    what = "the full pass (cache=none)"

    def __init__(self, model: torch.nn.Module, mode: str, strict: bool = False) -> None:
        super().__init__(model, mode, strict)
        self.shapes: OrderedDict[tuple[Any, ...], _FullShape] = OrderedDict()
        self.last: _FullShape | None = None  # the shape of the last pass

    def run(
        self, ids: torch.Tensor, attention: torch.Tensor | None, positions: torch.Tensor
    ) -> torch.Tensor:
        """The pass's hidden states over left-padded `ids`, `attention` (None: no row
        padded) and `positions`:
        eager until a shape comes twice in a row (and always above `CAPTURE_TOKENS`, or after
        a capture failed under `auto`), then captured, and replayed whenever that
        shape comes again."""
        # (above `CAPTURE_TOKENS`, rows x padded length: bound by its arithmetic; a one-row
        # pass over a GSM8K prompt and answer, about 600 tokens, is captured, 16 rows not)
        if self.mode not in CAPTURED or ids.numel() > static_steps.CAPTURE_TOKENS:
            self.last = None  # (a pass in between: the next is not "in a row")
            return self.pass_over((ids, attention, positions), None, compiled=False)
        shape = self._shape(ids, attention, positions)
        shape.steady = shape.steady + 1 if self.last is shape else 1
        self.last = shape
        if shape.graph is None and shape.steady < CAPTURE_ON_STEADY_STEP:
            return self.pass_over((ids, attention, positions), None, compiled=False)
        shape.ids.copy_(ids)
        if shape.attention is not None:
            shape.attention.copy_(attention)
        shape.positions.copy_(positions)
        if shape.graph is None:
            inputs = (shape.ids, shape.attention, shape.positions)
            compiled = self.mode == "compiled"
            shape.graph = self.captured(lambda: self.pass_over(inputs, None, compiled), ids.device)
        if shape.graph is None:  # the capture failed under `auto`: eager from now on
            return self.pass_over((ids, attention, positions), None, compiled=False)
        return shape.graph.replay()

    def _shape(self, *inputs: torch.Tensor | None) -> _FullShape:
        """The tensors of this pass's shape (made on its first pass); at most `GRAPHS_KEPT`
        shapes are kept (`make_room`: those without a graph dropped first, then the least
        recently used; each graph holds its pass's activations in its own memory pool).
        Whether rows are padded is part of the shape: a pass with none padded attends
        without a mask (`common.attended_keys`), and its graph must never meet padding."""
        key = (*inputs[0].shape, inputs[1] is not None)
        if key in self.shapes:
            self.shapes.move_to_end(key)
            return self.shapes[key]
        make_room(self.shapes, GRAPHS_KEPT)
        made = (None if tensor is None else torch.zeros_like(tensor) for tensor in inputs)
        self.shapes[key] = _FullShape(*made)
        return self.shapes[key]
