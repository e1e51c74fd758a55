"""lm-eval-dvoting: dVoting and its baselines for diffusion LLMs, as an lm-eval plugin.

Import-light on purpose: importing the package pulls in neither torch nor lm_eval, so
the start-up hook and the console scripts stay cheap. The public API is resolved lazily.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_PUBLIC_API = {
    "load_model": "lm_eval_dvoting.models.loading",
    "load_tokenizer": "lm_eval_dvoting.models.loading",
    "generate": "lm_eval_dvoting.core.decoding",
    "run_strategy": "lm_eval_dvoting.core.strategies",
    "loglikelihood": "lm_eval_dvoting.core.likelihood",
    "GuidedModel": "lm_eval_dvoting.core.guidance",
}

__all__ = sorted(_PUBLIC_API) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _PUBLIC_API.get(name)
    if module is None:
        raise AttributeError(f"module 'lm_eval_dvoting' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
