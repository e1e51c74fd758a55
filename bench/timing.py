"""Measuring tools for the benchmarks: a timed model wrapper and peak memory (the machine
facts are in `bench/common.py`).

`TimedModel` wraps one of our models (`hidden_states` + `logits_from_hidden`) and
adds up the seconds spent inside those two calls: the forward pass, output head
included. Everything else the decoder does in a step (batching the rows, float64
softmax / entropy / Gumbel noise, the commit rules, host syncs) is the decoder's own
time = wall time - forward time. Wrapping the model keeps the library untouched:
with no wrapper there is nothing to switch off, so the timing costs nothing when not
measuring. On CUDA each timed call ends with `torch.cuda.synchronize()`, so that the
asynchronous kernels are charged to the call that queued them.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import torch


class TimedModel(torch.nn.Module):
    """`model` with its forward pass (hidden states and head) timed.

    `seconds`: time inside `hidden_states` + `logits_from_hidden`;
    `passes`: number of `hidden_states` calls (one per decoder step; two in a step where
    the prefix cache runs some rows over their whole sequence and others over a suffix);
    `head_seconds`, `head_calls`: the part spent in the output head, and its calls.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.inner = model
        for name in (
            "mask_token_id",
            "end_token_ids",
            "logits_shift",
            "max_length",
            "family",
            "config",
        ):
            if hasattr(model, name):
                setattr(self, name, getattr(model, name))
        first = next(iter(model.parameters()), None)
        self._cuda = first is not None and first.is_cuda
        self.reset()

    def reset(self) -> None:
        self.seconds = 0.0
        self.head_seconds = 0.0
        self.head_calls = 0
        self.passes = 0

    def _sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize()

    # the signature names position_ids and cache so that the decoder passes them on
    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
    ) -> torch.Tensor:
        self._sync()
        start = time.perf_counter()
        if (
            cache is None
        ):  # a model without a prefix cache (bench/step_bench.py's FixedHidden) takes no `cache`
            hidden = self.inner.hidden_states(input_ids, attention_mask, position_ids)
        else:
            hidden = self.inner.hidden_states(input_ids, attention_mask, position_ids, cache=cache)
        self._sync()
        self.seconds += time.perf_counter() - start
        self.passes += 1
        return hidden

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        self._sync()
        start = time.perf_counter()
        logits = self.inner.logits_from_hidden(hidden)
        self._sync()
        elapsed = time.perf_counter() - start
        self.seconds += elapsed
        self.head_seconds += elapsed
        self.head_calls += 1
        return logits

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.logits_from_hidden(self.hidden_states(input_ids, attention_mask, position_ids))


# ----------------------------------------------------------------------- memory


class PeakMemory:
    """Peak memory of one measured region.

    CUDA: `torch.cuda.max_memory_allocated` (reset at the start). CPU: the process's
    peak resident set (VmHWM), reset at the start by writing 5 to
    /proc/self/clear_refs (Linux >= 4.0); `None` where that is not possible.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.peak_mib: float | None = None
        self.base_mib: float | None = None

    def __enter__(self) -> "PeakMemory":
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base_mib = torch.cuda.memory_allocated() / 2**20
        else:
            self._reset_hwm()
            self.base_mib = _status_mib("VmRSS")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.peak_mib = torch.cuda.max_memory_allocated() / 2**20
        else:
            self.peak_mib = _status_mib("VmHWM") if self._resettable else None

    def _reset_hwm(self) -> None:
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self._resettable = True
        except OSError:
            self._resettable = False


def _status_mib(field: str) -> float | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return int(match.group(1)) / 1024 if match else None
