"""Reward-free guidance (RFG; Chen, Xu, Leskovec, Ermon, arXiv 2509.25604): one decode of a
policy model guided by its log-likelihood ratio to a reference model, at every step

    log p*(x) = (1 + w) log p_policy(x) - w log p_ref(x)    (per masked position, renormalised)

`GuidedModel` is a model for the decoder: its `hidden_states` runs both models on the same
tokens (the policy and the reference, or one model with its LoRA adapter switched on and
off), and its `logits_from_hidden` combines their logits as `(1 + w) * l_policy - w * l_ref`
in float32. Raw logits and log-softmax give the same p* after the decoder's softmax (the
per-position constants cancel since (1 + w) - w = 1), and raw logits make `w = 0` the
policy's own logits bit for bit. The guided logits then feed the unchanged commit rule
(candidate, confidence, temperature), as LLaDA's classifier-free guidance does. The mask
token is suppressed by the rules after combining, never before (-inf - -inf is NaN).
Each step is two forward passes; the strategy counts both (`StrategySettings.passes_per_step`).
"""

from __future__ import annotations

from typing import Any

import torch

from lm_eval_dvoting.models.adapters import enabled as adapter_enabled
from lm_eval_dvoting.models.adapters import lora_layers


class GuidedModel(torch.nn.Module):
    """`policy` guided away from `reference` with strength `guidance` (module docstring;
    1.0 is `StrategySettings.guidance`'s default; `run_strategy` sets the settings' own).

    `reference=None` takes the policy with its LoRA adapter switched off (RFG's reference
    for a policy that is "base + adapter": one model in memory, two passes per step).
    """

    def __init__(
        self,
        policy: torch.nn.Module,
        reference: torch.nn.Module | None = None,
        guidance: float = 1.0,
    ) -> None:
        super().__init__()
        if reference is None and not lora_layers(policy):
            raise ValueError(
                "RFG needs a reference model: give reference=<hub id | folder> (a second model), "
                "or a policy with a LoRA adapter (peft=...), whose base with the adapter off is "
                "the reference"
            )
        self.policy, self.reference, self.guidance = policy, reference, float(guidance)
        check_pair(policy, reference or policy)
        for name in ("mask_token_id", "end_token_ids", "logits_shift", "family", "config"):
            if hasattr(policy, name):
                setattr(self, name, getattr(policy, name))
        self.max_length = min(
            int(getattr(m, "max_length", 1 << 30)) for m in (policy, reference or policy)
        )
        # the policy's hidden width and both models' dtypes, set by the last `hidden_states`
        self._split, self._dtypes = 0, (torch.float32, torch.float32)

    def with_guidance(self, guidance: float) -> "GuidedModel":
        """The same two models at another guidance strength."""
        return GuidedModel(self.policy, self.reference, guidance)

    def _run(self, reference: bool, method: str, *args: Any) -> torch.Tensor:
        model = self.reference if reference and self.reference is not None else self.policy
        if (
            self.reference is None
        ):  # one model: the adapter on for the policy, off for the reference
            with adapter_enabled(self.policy, not reference):
                return getattr(model, method)(*args)
        return getattr(model, method)(*args)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Both models' hidden states of the same tokens, side by side on the last axis."""
        policy = self._run(False, "hidden_states", input_ids, attention_mask, position_ids)
        reference = self._run(True, "hidden_states", input_ids, attention_mask, position_ids)
        self._split, self._dtypes = policy.shape[-1], (policy.dtype, reference.dtype)
        common = torch.promote_types(
            policy.dtype, reference.dtype
        )  # no precision lost in the stack
        return torch.cat([policy.to(common), reference.to(common)], dim=-1)

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """The guided logits (float32) at the positions `hidden` holds."""
        policy_dtype, reference_dtype = self._dtypes  # each head reads its own model's dtype
        policy = self._run(
            False, "logits_from_hidden", hidden[..., : self._split].to(policy_dtype)
        ).float()
        reference = self._run(
            True, "logits_from_hidden", hidden[..., self._split :].to(reference_dtype)
        ).float()
        w = self.guidance
        return (1 + w) * policy - w * reference

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.logits_from_hidden(self.hidden_states(input_ids, attention_mask, position_ids))


def check_pair(policy: torch.nn.Module, reference: torch.nn.Module) -> None:
    """Policy and reference must read the same token ids: the same mask and end-of-text ids
    and the same vocabulary size (the tokenizers are compared by the harness)."""
    problems = []
    for name in ("mask_token_id", "end_token_ids", "logits_shift"):
        mine, theirs = getattr(policy, name, None), getattr(reference, name, None)
        if mine != theirs:
            problems.append(f"{name} {mine!r} vs {theirs!r}")
    sizes = [_vocabulary(model) for model in (policy, reference)]
    if sizes[0] != sizes[1]:
        problems.append(f"vocabulary size {sizes[0]} vs {sizes[1]}")
    if problems:
        raise ValueError(
            "the RFG policy and reference must share their tokenizer and mask token, but they "
            "differ: "
            + "; ".join(problems)
            + ". Give a reference of the policy's family and tokenizer"
        )


def _vocabulary(model: torch.nn.Module) -> int | None:
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embedding is None:
        embedding = next((m for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)
    return None if embedding is None else int(embedding.num_embeddings)
