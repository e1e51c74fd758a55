"""What the plugin does to lm-eval's requests before any model work, and how it numbers them.

Shared by the harness (which answers the requests) and the result cache (which answers
them from `--use_cache` before they reach the model), so that both see the same text and
the same keys: `sanitise_requests` rewrites text no encoder accepts, `repeat_indices` numbers
the repeats of an instance, and `generation_key_args` is what decides a generation besides
the run's settings (its seed and its cache key).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

log = logging.getLogger(__name__)


def encodable(text: str) -> str:
    """`text` with lone surrogates (from broken data; no tokenizer accepts them) as U+FFFD.

    Surrogate pairs become the character they encode; valid text is returned as it is.
    """
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        if not encodable.warned:
            log.warning("text with lone surrogates (invalid unicode): they are replaced by U+FFFD")
            encodable.warned = True
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


encodable.warned = False


def sanitise_requests(requests: list[Any]) -> None:
    """Lone surrogates in a request's text become U+FFFD in the request itself, before any
    model work.

    lm-eval 0.4.13 hashes each request's context for `--log_samples` (`prompt_hash`,
    utf-8 without error handling) and writes it to the samples file only after every
    request has been answered, so text no encoder accepts (a prompt function or template
    that emits a lone surrogate) would lose the whole run there. Rewritten here, the
    request is scored, hashed, cached and logged as the text the model really saw.
    """
    rewritten = []
    for req in requests:
        args = req.args
        clean = tuple(encodable(a) if isinstance(a, str) else a for a in args)
        if clean != args:
            arguments = getattr(req, "arguments", None)
            if arguments is None:  # a stand-in for lm-eval's Instance with a plain `args`
                req.args = clean
            else:  # Instance: `args` is a read-only view of `arguments`
                req.arguments = clean if isinstance(arguments, tuple) else clean[0]
            rewritten.append(f"task {req.task_name}, document {req.doc_id}")
    if rewritten:  # one warning per call, not one per document: a broken template hits them all
        shown = "; ".join(rewritten[:5]) + ("; ..." if len(rewritten) > 5 else "")
        log.warning(
            "%d request(s) hold lone surrogates (invalid unicode), replaced by U+FFFD before the "
            "model runs: %s",
            len(rewritten),
            shown,
        )


def repeat_indices(requests: list[Any]) -> list[int]:
    """The repeat index of each request, as `generate_until` numbers them.

    lm-eval sends an instance with `repeats: N` N times in a row; with several processes it
    pads a rank by sending its last instance `repeats` times more, which repeat the first N.
    """
    seen: Counter[int] = Counter()
    indices = []
    for req in requests:
        repeat = seen[id(req)]
        seen[id(req)] += 1
        if getattr(req, "repeats", None):
            repeat %= req.repeats
        indices.append(repeat)
    return indices


def generation_key_args(request: Any, repeat: int) -> tuple[Any, ...]:
    """What decides a generation besides the run's settings: request, task, document, repeat."""
    context, gen_kwargs = request.args
    return (
        context,
        gen_kwargs,
        getattr(request, "task_name", None),
        getattr(request, "doc_id", None),
        repeat,
    )
