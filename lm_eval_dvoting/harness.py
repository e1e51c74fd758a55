"""The lm-eval LM classes `dvoting-llada` and `dvoting-dream` (work in progress).

This is the only module that imports lm_eval. Registration is done by the plugin
hook (by "module:Class" string), not by decorators here.
"""
from __future__ import annotations

from lm_eval.api.model import LM


class DVotingEvalModel(LM):
    """Base class: a diffusion LM evaluated with a voting strategy."""

    model_family = ""


class LLaDAEvalModel(DVotingEvalModel):
    model_family = "llada"


class DreamEvalModel(DVotingEvalModel):
    model_family = "dream"
