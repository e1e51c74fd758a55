"""What the commit rules share: a row's work within a step (`RowWork`), the logits window,
and the block helpers. The rules themselves are parts, one file each under
`core/parts/rules/` (their arithmetic there too: `FixedSchedule` in fixed.py,
`EntropyThreshold` in entropy.py, `ConfidenceThreshold` in confidence.py; block diffusion's
`BlockThreshold` in decoding/blocks.py). This module imports no part.

A rule turns each row into a `RowWork` at the start of a step (`begin`, or `begin_many` for
all its rows at once): the positions it wants logits for, found on the host from the
step's snapshot of the rows' tokens (`token_lists`: the row batch reads every row's tokens
in one copy at the start of a step, and the cache plan and the rules share it). The row
batch fetches the logits of every row's wanted positions in one output-head call and hands
them over (`RowWork.receive`); then each rule commits for all its rows at once (`commit`),
and returns the rows that go on in another round of the same step (only the entropy rule's
block hand-over does). Rows are independent: each draws from its own generator, so no
row's tokens depend on the others in its round. `RowBatch` (the fixed schedule's, the
confidence rule's and Dream's commit; Dream's `origin` and `alg_temp` > 0 rows commit row by
row) stacks the rows' logits into one float64 tensor and reads nothing back to the host.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from lm_eval_dvoting.core.decoding.state import (
    DecodeRow,
    filtered_gumbel,
    masked_block,
    suppress_mask,
)

Window = tuple[int, int] | None  # generation indices [lo, hi) whose logits a step has; None: all


@dataclass(eq=False)
class RowWork:
    """One row's commits within one step: the positions it wants logits for next, and
    the float32 logits it received for them."""

    index: int  # the row's index in the step's batch
    row: DecodeRow
    wanted: list[int] = field(default_factory=list)  # generation indices
    logits: torch.Tensor | None = None

    def receive(self, logits: torch.Tensor) -> None:
        self.logits = logits


@dataclass(eq=False)
class ScheduledWork(RowWork):
    """A row's work on one block: the fixed schedule's, the confidence rule's, block
    diffusion's."""

    start: int = 0  # the block's first generation index


def first_masked_block_start(row: DecodeRow, mask_id: int) -> int:
    """The start of the block holding the row's first mask (an active row has one)."""
    return masked_block(host_tokens(row), mask_id, row.block_length)[0]


class FirstMaskedBlock:
    """What the rules without a per-block schedule of their own share (the entropy and
    confidence thresholds, Dream's): a row works on the block holding its first mask, and
    is done when no mask is left (which the row batch checks)."""

    def __init__(self, mask_id: int) -> None:
        self.mask_id = mask_id

    def block_start(self, row: DecodeRow) -> int:
        return first_masked_block_start(row, self.mask_id)

    def is_done(self, row: DecodeRow) -> bool:
        return False


def inside_window(window: Window, positions: list[int]) -> bool:
    """Whether the step's logits window holds every one of `positions`."""
    return window is None or all(window[0] <= p < window[1] for p in positions)


# ------------------------------------------------------------- rows batched in one commit


def begins(sizes: Sequence[int]) -> list[int]:
    """Where each of consecutive runs of `sizes` begins."""
    return [0, *itertools.accumulate(sizes[:-1])]


def read_tokens(rows: Sequence[DecodeRow]) -> list[list[int]]:
    """Each row's tokens as a host list, read with one device-to-host copy for all the rows."""
    if not rows:
        return []
    flat = torch.cat([row.tokens for row in rows]).tolist()
    sizes = [row.tokens.numel() for row in rows]
    return [flat[b : b + n] for b, n in zip(begins(sizes), sizes)]


def token_lists(rows: Sequence[DecodeRow]) -> list[list[int]]:
    """Each row's tokens on the host: the step's snapshot (`DecodeRow.step_tokens`, which
    the row batch takes of all its rows in one read at the start of a step) where a row has
    one, the others read in one copy. Read-only: everything that plans the step shares it."""
    unread = iter(read_tokens([row for row in rows if row.step_tokens is None]))
    return [next(unread) if row.step_tokens is None else row.step_tokens for row in rows]


def host_tokens(row: DecodeRow) -> list[int]:
    """One row's tokens on the host (`token_lists`)."""
    return token_lists([row])[0]


def host_to_device(values: list[Any], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`values` on `device` without a host sync: on CUDA through pinned memory, copied
    asynchronously (PyTorch's caching host allocator keeps the buffer until the copy has
    run); on the CPU no copy; elsewhere an ordinary copy. (A plain `torch.tensor(values,
    device=...)` on CUDA waits for every kernel queued before it: a sync.)"""
    tensor = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor if device.type == "cpu" else tensor.to(device)


# float64 logits elements one `RowBatch` holds at most, by device type: on the CPU a larger
# batch costs more than the per-row calls it saves (measured, 16 rows x 8 positions x 126,464
# tokens at temperature 0.7: twice as slow in one batch as in runs of one row, the Gumbel
# arithmetic's float64 temporaries far past the caches; at 256 tokens the rows batch); elsewhere
# it bounds each float64 temporary to 1 GiB
BATCH_ELEMENTS = {"cpu": 2**20, "other": 2**27}


def row_batches(works: Sequence[ScheduledWork]) -> list[list[ScheduledWork]]:
    """`works` cut, in their order, into runs whose logits stay within `BATCH_ELEMENTS` (a
    run holds one row at least). A rule commits the runs one after the other, so every
    generator, shared by rows or not, is drawn from in the rows' order."""
    runs: list[list[ScheduledWork]] = []
    held = 0
    for work in works:
        device = work.logits.device.type
        budget = BATCH_ELEMENTS.get(device, BATCH_ELEMENTS["other"])
        size = work.logits.numel()
        if not runs or held + size > budget:
            runs.append([])
            held = 0
        runs[-1].append(work)
        held += size
    return runs


def end_to_end(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """`torch.cat(tensors)` (2-D, one width) as a view, where they lie end to end in one
    storage (the output head's call split row by row: `StepLogits.many`); else None."""
    first = tensors[0]
    storage, offset = first.untyped_storage().data_ptr(), first.storage_offset()
    for tensor in tensors:
        if (
            tensor.dim() != 2
            or not tensor.is_contiguous()
            or tensor.untyped_storage().data_ptr() != storage
            or tensor.storage_offset() != offset
            or tensor.dtype != first.dtype
            or tensor.shape[1:] != first.shape[1:]
        ):
            return None
        offset += tensor.numel()
    rows = sum(tensor.shape[0] for tensor in tensors)
    return first.as_strided((rows, first.shape[1]), (first.shape[1], 1))


def sampling_key(row: DecodeRow) -> tuple[float, float | None, int | None]:
    """The distribution a row's candidates come from: (temperature, top_p, top_k), the
    filters dropped at temperature 0 (the argmax, which no filter removes)."""
    return (0.0, None, None) if row.temperature == 0 else (row.temperature, row.top_p, row.top_k)


def block_size(work: ScheduledWork) -> int:
    """The number of generation positions in the work's block."""
    return min(work.row.block_length, work.row.tokens.numel() - work.start)


class RowBatch:
    """One commit of a rule's rows, batched over the rows: every row's wanted positions (the
    masked positions of its block, in order) laid end to end in one float64 logits tensor,
    the mask token suppressed (`logits64`). Rows drawing from one distribution (`key`:
    `sampling_key`, or the rule's own) sit side by side, so that each distribution's
    arithmetic is one call on a slice. Row r of `works` (that order) owns
    `logits64[bounds[r]:bounds[r + 1]]`, and row r of the (rows, width) layout of whole
    blocks (`padded`).

    The positions' indices travel to the device in one copy; no step reads the device.
    Every operation works along the vocabulary or within a row, so a row's numbers are its
    own alone (to the last bit of a vectorised exp or log, as in the entropy rule's batch).

    A sampled row's noise (`draw_noise`) is a row of uniforms per position of its whole
    block (LLaDA's rules draw over the block), or, with `noise_per_block=False`, per wanted
    position only (block diffusion draws over the positions it asks logits for).
    """

    def __init__(
        self,
        works: Sequence[ScheduledWork],
        mask_id: int,
        key: Callable[[DecodeRow], tuple[Any, ...]] = sampling_key,
        noise_per_block: bool = True,
    ) -> None:
        groups: dict[tuple[Any, ...], list[ScheduledWork]] = {}
        for work in works:
            groups.setdefault(key(work.row), []).append(work)
        self.works = [work for members in groups.values() for work in members]
        counts = [len(members) for members in groups.values()]
        self.groups = list(zip(groups, begins(counts), itertools.accumulate(counts)))
        self.bounds = [0, *itertools.accumulate(len(work.wanted) for work in self.works)]
        self.sizes = [block_size(work) for work in self.works]
        self.width = max(self.sizes)
        self.noise_per_block = noise_per_block
        self.device, vocab = works[0].logits.device, works[0].logits.shape[-1]
        joined = end_to_end([work.logits for work in self.works])
        if joined is not None:  # the head's split of one call, in the batch's order
            stacked = joined.to(torch.float64, copy=True)  # never the head's own storage
        else:
            stacked = torch.empty((self.bounds[-1], vocab), dtype=torch.float64, device=self.device)
            for work, a, b in zip(self.works, self.bounds, self.bounds[1:]):
                stacked[a:b].copy_(work.logits)  # float64 in one pass (torch.cat takes two)
        self.logits64 = suppress_mask(stacked, mask_id)
        self._noise_at = self._lay_out_noise()
        self.noise: torch.Tensor | None = None  # the block noise (`draw_noise`)
        self._send_indices()

    def _sampled_rows(self) -> list[int]:
        return [r for r, work in enumerate(self.works) if work.row.temperature > 0]

    def _noise_size(self, r: int) -> int:
        """Row r's rows of noise: its block's positions, or its wanted positions."""
        return self.sizes[r] if self.noise_per_block else len(self.works[r].wanted)

    def _lay_out_noise(self) -> dict[int, int]:
        """Each sampled row's first row in `noise` (in `works` order)."""
        sampled = self._sampled_rows()
        return dict(zip(sampled, begins([self._noise_size(r) for r in sampled])))

    def _send_indices(self) -> None:
        """Per wanted position: its generation index, its row, its place in `padded`'s
        flat layout, and its row of `noise` (0 for unsampled rows), in one copy."""
        positions, rows, padded, noise = [], [], [], []
        for r, work in enumerate(self.works):
            offsets = [p - work.start for p in work.wanted]
            positions += work.wanted
            rows += [r] * len(offsets)
            padded += [r * self.width + k for k in offsets]
            rows_of_noise = offsets if self.noise_per_block else range(len(offsets))
            noise += [self._noise_at.get(r, 0) + k for k in rows_of_noise]
        self.noise_rows = noise  # host copy: tells a slice from a gather
        sent = host_to_device(positions + rows + padded + noise, torch.long, self.device)
        self.positions, self.row_of, self.padded_at, self.noise_at = sent.view(4, -1)

    def draw_noise(
        self, works: Sequence[ScheduledWork], then: Callable[[ScheduledWork], None] | None = None
    ) -> None:
        """Each sampled row's block noise from its own generator, in the order of `works`
        (the rule's, as the rows came), each draw of the shape a row alone draws, so that
        every generator's stream, shared by rows or not, is what it was row by row; `then`
        draws whatever else a row draws after its block noise."""
        where = {id(work): r for r, work in enumerate(self.works)}
        rows = sum((self._noise_size(r) for r in self._sampled_rows()), 0)
        vocab = self.logits64.shape[-1]
        self.noise = torch.empty((rows, vocab), dtype=torch.float64, device=self.device)
        for work in works:
            r = where[id(work)]
            if r in self._noise_at:
                rows = self.noise[self._noise_at[r] : self._noise_at[r] + self._noise_size(r)]
                rows.uniform_(generator=work.row.generator)  # = torch.rand of that shape
            if then is not None:
                then(work)

    def candidates(self) -> torch.Tensor:
        """Each wanted position's candidate, as `state.candidates` gives it for a row alone:
        the argmax at temperature 0, else LLaDA's float64 Gumbel-max with the row's block
        noise (`draw_noise` first) from the tokens top-p/top-k keep; one call per
        distribution."""
        chosen = torch.empty(self.bounds[-1], dtype=torch.long, device=self.device)
        for (temperature, top_p, top_k), lo, hi in self.groups:
            a, b = self.bounds[lo], self.bounds[hi]
            if temperature == 0:
                chosen[a:b] = self.logits64[a:b].argmax(-1)
            else:
                noise = self.noise_of(a, b)
                chosen[a:b] = filtered_gumbel(self.logits64[a:b], temperature, noise, top_p, top_k)
        return chosen

    def noise_of(self, a: int, b: int) -> torch.Tensor:
        """The noise rows of wanted positions [a, b): a slice where whole blocks are masked."""
        first = self.noise_rows[a]
        if self.noise_rows[a:b] == list(range(first, first + b - a)):
            return self.noise[first : first + b - a]
        return self.noise.index_select(0, self.noise_at[a:b])

    def per_row(self, values: list[float]) -> torch.Tensor:
        """Each row's value (in `works` order) at each of its wanted positions (float64)."""
        return host_to_device(values, torch.float64, self.device)[self.row_of]

    def padded(self, values: torch.Tensor, fill: float) -> torch.Tensor:
        """Wanted-position `values` in the (rows, width) layout of whole blocks, `fill`
        elsewhere (at positions that are not masked and past a shorter block's end)."""
        size = len(self.works) * self.width
        out = torch.full((size,), fill, dtype=values.dtype, device=self.device)
        return out.index_copy_(0, self.padded_at, values).view(len(self.works), self.width)

    def first_max(self, values: torch.Tensor) -> torch.Tensor:
        """True at each row's first (leftmost) maximum of `values` over its wanted positions."""
        best = self.padded(values, float("-inf")).argmax(1)
        return self.padded_at - self.row_of * self.width == best[self.row_of]

    def write(self, values: torch.Tensor) -> None:
        """`values` into each row's tokens at its wanted positions (one copy per row)."""
        for r, work in enumerate(self.works):
            a, b = self.bounds[r], self.bounds[r + 1]
            work.row.tokens[self.positions[a:b]] = values[a:b].to(work.row.tokens.dtype)
