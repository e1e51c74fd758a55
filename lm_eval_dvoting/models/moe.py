"""Mixture-of-experts feed-forward layers shared by LLaDA-MoE and LLaDA2.

Each expert is a SwiGLU MLP, `down(silu(gate(x)) * up(x))`. A router gives every token `k`
experts and their weights; `Experts.forward` runs them batched:
- the (token, expert) assignments are sorted by expert once (`Experts.route`);
- every expert runs over its tokens (`Experts.run`): with three grouped GEMMs
  (`F.grouped_mm`) where they apply, else by a loop over the experts that received tokens
  (never over tokens or rows);
- each token's k outputs, weighted, are added in a fixed order and in the dtype of the
  router's weights, as the family's code adds them: LLaDA-MoE's code casts its routing
  weights to the activations' dtype and adds each expert's weighted output into a tensor of
  that dtype, experts in ascending order (in bfloat16 each product and sum rounds); LLaDA2's
  sums in float32 over the router's order (descending score), rounded once
  (`Experts(..., ascending=False)`).

The experts' weights lie stacked, one tensor per projection: `gate_proj` and `up_proj`
(experts, hidden, width), `down_proj` (experts, width, hidden). A grouped GEMM reads them as
they are, and the group bounds (`Routing.ends`) stay on the device, so a layer waits for
nothing. The loop needs the counts on the host: one read (a wait on a GPU) per layer and
pass. `grouped_applies` says where the grouped GEMMs run:
- on the CPU;
- on CUDA in bfloat16 on compute capability 9.x/10.x (H100, H200, B200), where PyTorch has
  a grouped kernel that reads the bounds on the device. Elsewhere its `grouped_mm` falls
  back to a loop that copies the bounds to the host: ours does the same.
- Either way, only when the widths are multiples of 16 bytes, as the kernels require.
Both ways give the same values (bit for bit on the CPU, tested). The fixed addition order
does not depend on the device's threads (`index_add_` on CUDA adds with atomics, in no
fixed order: the last bits of a token's sum could change from run to run).

Checkpoints name each expert apart (`experts.N.gate_proj.weight`, upstream's names):
`checkpoint_names` lists them for the load's name check, and `stack_checkpoint` stacks
them into the model's weights.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# (token, expert) pairs one grouped pass takes at most: its temporaries (the gathered inputs,
# the outputs in the weights' dtype, float32 for LLaDA2: pairs x width each) stay within
# 0.5 GB each at LLaDA2.0-mini's width of 2048 (1 GB at -flash's 4096)
ASSIGNMENTS_AT_ONCE = 65536


class SwiGLU(nn.Module):
    """`down(silu(gate(x)) * up(x))`, bias-free (every dense MLP of both families)."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(width, hidden, bias=False)
        self.up_proj = nn.Linear(width, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@dataclass(frozen=True)
class Routing:
    """The assignments sorted by expert: `order[i]` is the i-th one's flat (token * k + j)
    index, `ends[e]` (int32) where expert e's run of them ends."""

    order: torch.Tensor
    ends: torch.Tensor


class Experts(nn.Module):
    """The routed experts of one layer, their weights stacked (see the module docstring)."""

    def __init__(self, count: int, width: int, hidden: int, ascending: bool = True) -> None:
        super().__init__()
        # the order a token's weighted outputs are added in: its experts ascending, else the
        # router's order (module docstring)
        self.ascending = ascending
        self.gate_proj = nn.Parameter(torch.empty(count, hidden, width))
        self.up_proj = nn.Parameter(torch.empty(count, hidden, width))
        self.down_proj = nn.Parameter(torch.empty(count, width, hidden))
        for weight in (self.gate_proj, self.up_proj, self.down_proj):
            # nn.Linear's default, expert by expert (a no-op on the meta device, where a
            # checkpoint's load builds the model)
            bound = weight.shape[-1] ** -0.5
            nn.init.uniform_(weight, -bound, bound)

    def __len__(self) -> int:
        return self.gate_proj.shape[0]

    def forward(self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Σ_j weights[t, j] · expert[chosen[t, j]](x[t]) for tokens `x` (tokens, width).

        `chosen` (tokens, k) long, `weights` (tokens, k); the weighted sum is taken in
        `weights`' dtype (the family's code's: module docstring), over each token's experts
        in ascending order (or the router's, `ascending` False), and returned in x's dtype.
        Passes of more than `ASSIGNMENTS_AT_ONCE` (token, expert) pairs run in consecutive
        parts of the tokens, which bounds the temporaries.
        """
        part = max(1, ASSIGNMENTS_AT_ONCE // chosen.shape[1])
        if len(x) <= part:
            return self._forward(x, chosen, weights)
        pieces = zip(x.split(part), chosen.split(part), weights.split(part))
        return torch.cat([self._forward(*piece) for piece in pieces])

    def _forward(
        self, x: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        tokens, k = chosen.shape
        if not tokens:
            return torch.zeros_like(x)
        if self.ascending:  # a token's experts ascending: the sum's order
            chosen, by_expert = chosen.sort(dim=1)
            weights = weights.gather(1, by_expert)
        routing = self.route(chosen)
        # a fresh tensor (run's output, or its copy in the weights' dtype): written in place
        y = self.run(x[routing.order // k], routing).to(weights.dtype)
        y.mul_(weights.flatten()[routing.order, None])
        # slot[t, j]: the row of y holding token t's j-th expert (in the sum's order)
        slot = torch.empty_like(routing.order)
        slot[routing.order] = torch.arange(len(slot), device=slot.device)
        slot = slot.view(tokens, k)
        out = y[slot[:, 0]]
        for j in range(1, k):
            out += y[slot[:, j]]
        return out.to(x.dtype)

    def route(self, chosen: torch.Tensor) -> Routing:
        """The assignments of `chosen` (tokens, k) sorted by expert, token order kept."""
        flat = chosen.flatten()
        order = flat.argsort(stable=True)
        experts = torch.arange(len(self), device=flat.device, dtype=flat.dtype)
        ends = torch.searchsorted(flat[order], experts, right=True)
        return Routing(order, ends.to(torch.int32))

    def run(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        """Each expert over its run of `x` (the tokens in `routing.order`), in x's dtype."""
        if grouped_applies(x, self.gate_proj):
            gate, up, down = (
                w.transpose(-2, -1) for w in (self.gate_proj, self.up_proj, self.down_proj)
            )
            ends = routing.ends
            hidden = F.silu(F.grouped_mm(x, gate, offs=ends)) * F.grouped_mm(x, up, offs=ends)
            return F.grouped_mm(hidden, down, offs=ends)
        counts = routing.ends.diff(prepend=routing.ends.new_zeros(1)).tolist()
        return torch.cat(
            [self.expert(e, part) for e, part in enumerate(x.split(counts)) if counts[e]]
        )

    def expert(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Expert `index` alone over `x` (tokens, width)."""
        gate = F.linear(x, self.gate_proj[index])
        return F.linear(F.silu(gate) * F.linear(x, self.up_proj[index]), self.down_proj[index])


def grouped_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `Experts.run` runs grouped GEMMs for inputs `x` and stacked `weight` (see the
    module docstring)."""
    if not hasattr(F, "grouped_mm"):  # an older PyTorch than the 2.13 this package installs
        return False
    if any(size * x.element_size() % 16 for size in weight.shape[1:]):  # unaligned widths
        return False
    if x.device.type == "cuda":
        return x.dtype == torch.bfloat16 and _has_grouped_kernel(x.device)
    return x.device.type == "cpu"


@functools.cache
def _has_grouped_kernel(device: torch.device) -> bool:
    # NVIDIA only: ROCm reports gfx numbers as the capability (MI300: 9.4)
    return torch.version.hip is None and torch.cuda.get_device_capability(device)[0] in (9, 10)


def checkpoint_names(model: nn.Module) -> dict[str, list[str]]:
    """Each stacked expert weight of `model` -> the checkpoint's names of its slices, in
    expert order (`...experts.N.gate_proj.weight`)."""
    names: dict[str, list[str]] = {}
    for prefix, module in model.named_modules():
        if isinstance(module, Experts):
            for part in PROJECTIONS:
                slices = [f"{prefix}.{e}.{part}.weight" for e in range(len(module))]
                names[f"{prefix}.{part}"] = slices
    return names


def stack_checkpoint(state: dict[str, torch.Tensor], names: dict[str, list[str]]) -> None:
    """Replace, in `state`, each expert's tensors by their stack (names as `checkpoint_names`
    gives them); a slice whose shape differs from the first expert's is refused with a
    ValueError naming both."""
    for stacked, slices in names.items():
        first = state[slices[0]].shape
        for name in slices:
            if state[name].shape != first:
                raise ValueError(
                    f"{name} has shape {tuple(state[name].shape)}, but {slices[0]} has "
                    f"{tuple(first)}: every expert's weights must have one shape"
                )
        state[stacked] = torch.stack([state.pop(name) for name in slices])
