"""Helpers the decoder's tests share: the fixture models loaded once, the upstream
reference reading of a row's logits, LLaDA's Gumbel-max sampling, and a recorder of
forward-pass input lengths."""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Iterator

import torch
from torch import nn

from lm_eval_dvoting.models.loading import load_model

if TYPE_CHECKING:  # the annotation's name only; decoding is imported where used
    from lm_eval_dvoting.core.decoding import DecodeRow


@functools.lru_cache(maxsize=None)
def load_float32(folder: str) -> nn.Module:
    """A checkpoint (a folder or a packaged demo name) in float32 on the CPU, loaded once."""
    return load_model(folder, device="cpu", dtype="float32")


def reference_logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(length, vocab) float64 logits of one unpadded row: row p predicts position p
    (Dream's shifted reading undone), the mask token's logit -inf (docs/ALGORITHM.md 1.1)."""
    logits = model(x[None])[0].double()
    if model.logits_shift:  # Dream: the prediction for p sits at p - 1
        logits = torch.cat([logits[:1], logits[:-1]])
    logits[:, model.mask_token_id] = float("-inf")
    return logits


def gumbel_max(logits: torch.Tensor, noise: torch.Tensor, temperature: float) -> torch.Tensor:
    """LLaDA's sampling at temperature > 0, written out: argmax(exp(logits) / (-log u)^T)
    for float64 uniform noise u of the logits' shape."""
    return (logits.exp() / (-torch.log(noise)) ** temperature).argmax(-1)


@contextlib.contextmanager
def recorded_pass_lengths(model: nn.Module) -> Iterator[list[int]]:
    """The input length of every `hidden_states` call made inside the block."""
    lengths: list[int] = []
    original = model.hidden_states

    def spy(input_ids, attention_mask=None, position_ids=None, cache=None):
        lengths.append(input_ids.shape[1])
        return original(input_ids, attention_mask, position_ids, cache=cache)

    model.hidden_states = spy
    try:
        yield lengths
    finally:
        del model.hidden_states


def decoded_after_each_step(model: nn.Module, row: "DecodeRow") -> list[list[int]]:
    """Decode one row step by step; the generation positions decoded after each step."""
    from lm_eval_dvoting.core.decoding import RowDecoder

    decoder = RowDecoder(model)
    decoder.add(row)
    history = []
    while decoder.active:
        decoder.step()
        history.append((row.tokens != model.mask_token_id).nonzero().flatten().tolist())
    return history
