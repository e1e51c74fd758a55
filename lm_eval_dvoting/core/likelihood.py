"""Log-likelihoods of a masked diffusion LM: the Monte-Carlo bound LLaDA evaluates with.

A masked diffusion model has no left-to-right factorisation, so log p(y | x) of a
continuation y (L tokens) after a context x is estimated through the model's
evidence lower bound, as LLaDA's own evaluation does (its `eval_llada.py`):

    log p(y | x)  >=  E_l E_S [ (L / l) * sum_{i in S} log p_model(y_i | x, y with S masked) ]

with l uniform on 1..L and S a uniformly chosen set of l continuation positions. The
context is never masked. `loglikelihood` returns the Monte-Carlo average of the bracket
over `mc_num` draws of (l, S).

Choices (and where they differ from LLaDA's `eval_llada.py`):

- **How l is drawn.** LLaDA stratifies l within each batch of `batch_size` draws: one
  uniform start k, then levels spaced L/batch_size apart, rounded and wrapped. Rounding
  makes each draw's marginal only approximately uniform (a small bias when batch_size
  is not a multiple of L), and the draws depend on the batch size and the global RNG.
  We stratify over all `mc_num` draws of a request by systematic sampling with a random
  offset: t_j = (u + j / mc_num) mod 1 with u ~ U[0, 1), l_j = 1 + floor(L * t_j). Every
  l_j is *exactly* uniform on 1..L (so the estimate is unbiased for the bound), the
  levels are spread evenly (less variance than independent draws), and nothing depends
  on batching. `stratified=False` draws the l's independently instead.
- **Full-vocabulary cross-entropy.** As in LLaDA, the loss is the cross-entropy of the
  raw logits over the whole vocabulary, mask token included; nothing is suppressed. We
  compute it in float32 (LLaDA in the logits' dtype, bfloat16 on GPU).
- **Dream's shift.** Dream predicts token i from the logits at position i-1
  (`model.logits_shift == 1`). A continuation therefore needs at least one context
  token before it: an empty context raises ValueError for Dream (the caller prepends
  BOS, as Dream's own harness does with `add_bos_token`). LLaDA accepts an empty context.
- **Too long.** A request longer than `model.max_length` keeps its whole continuation
  and loses context tokens from the left (lm-eval's convention for causal LMs; LLaDA
  asserts instead). A continuation that cannot fit on its own raises ValueError.
- **Empty continuation.** log p(empty | x) = 0.0, and it is trivially greedy: (0.0, True)
  (the greedy flag is False for every request when greedy checks are turned off).
- **Batching.** `score_requests` packs the draws of several requests into each forward
  pass, right-padded with an attention mask; each request's draws come only from its
  own seed, so results do not depend on batch size or request order (up to float noise).

The greedy check (the second element of each `score_requests` result, lm-eval's
`is_greedy`) follows LLaDA's `suffix_greedy_prediction`: the continuation starts fully
masked and, one position per forward pass, the most confident masked position is
unmasked with its argmax token; the result is whether the final sequence equals the
continuation. Two deliberate differences: the mask token is never the committed argmax
(a real checkpoint never ranks it first; LLaDA would write the mask id back, leaving the
position masked and the answer False), and a row stops as soon as a committed token
differs from the continuation (the answer is already False: same outcome, fewer passes).
Ties go to the first position (LLaDA's unstable sort leaves them unspecified).

`rolling_loglikelihood` scores a whole document (lm-eval's `loglikelihood_rolling`) as a
sum over windows of this bound; see its docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# Spreads window seeds of one document far apart (the 64-bit golden-ratio constant).
_SEED_STRIDE = 0x9E3779B97F4A7C15


@dataclass
class _Request:
    """One (context, continuation) pair after validation and truncation."""

    index: int
    context: torch.Tensor
    continuation: torch.Tensor
    seed: int
    masks: torch.Tensor | None = None  # (mc_num, L) bool: which continuation tokens each draw masks
    draw_values: torch.Tensor | None = None  # (mc_num,) float64: (L/l) * sum of cross-entropies
    # greedy check: the continuation as decoded so far, which of its tokens are still
    # masked, whether the check is decided, and its answer
    decoded: torch.Tensor | None = None
    still_masked: torch.Tensor | None = None
    greedy_decided: bool = False
    greedy: bool = True

    @property
    def length(self) -> int:
        return len(self.context) + len(self.continuation)


def _model_device(model: nn.Module) -> torch.device:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


def _as_ids(ids: torch.Tensor | Sequence[int], name: str) -> torch.Tensor:
    ids = torch.as_tensor(ids, dtype=torch.long).cpu()
    if ids.dim() != 1:
        raise ValueError(
            f"{name} must be a 1-D sequence of token ids, got shape {tuple(ids.shape)}"
        )
    return ids


def _fit_request(
    model: nn.Module, context: torch.Tensor, continuation: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncate the context from the left to fit `model.max_length`; reject what cannot be
    scored."""
    shift = int(model.logits_shift)
    max_length = int(model.max_length)
    if len(continuation) == 0:
        return context, continuation
    if shift and len(context) < shift:
        raise ValueError(
            "this model predicts token i from position i-1 (Dream), so a continuation needs at "
            "least one context token before it; prepend a BOS token to the empty context"
        )
    if len(continuation) + shift > max_length:
        raise ValueError(
            f"the continuation has {len(continuation)} tokens, more than the model's "
            f"max_length {max_length}{' minus one context token' if shift else ''}; "
            "it cannot be scored in one window (split it, or use rolling_loglikelihood)"
        )
    room = max_length - len(continuation)
    if len(context) > room:
        context = context[len(context) - room :]  # keep the tokens nearest the continuation
    return context, continuation


def _draw_masks(length: int, mc_num: int, seed: int, stratified: bool) -> torch.Tensor:
    """(mc_num, length) bool: each row masks a uniform set of l positions, l uniform on 1..length.

    Drawn on the CPU with a local generator so the draws depend only on `seed`
    (not on the device, the global RNG, the batch size or the other requests).
    """
    generator = torch.Generator().manual_seed(seed)
    if stratified:
        offset = torch.rand((), generator=generator, dtype=torch.float64)
        levels = (offset + torch.arange(mc_num, dtype=torch.float64) / mc_num) % 1.0
        n_masked = 1 + (levels * length).floor().long().clamp(max=length - 1)
    else:
        n_masked = torch.randint(1, length + 1, (mc_num,), generator=generator)
    # Ranking i.i.d. uniforms gives a uniformly random permutation per row; masking the
    # n_masked lowest-ranked positions picks a uniformly random subset of that size.
    ranks = torch.rand(mc_num, length, generator=generator).argsort(dim=1).argsort(dim=1)
    return ranks < n_masked[:, None]


def _pad_right(
    rows: Sequence[torch.Tensor], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stack 1-D rows of different lengths, right-padded, with a 1/0 attention mask (None
    when no row is padded, as a request's draws are: attention then runs without a mask,
    `common.attended_keys`).

    Right padding leaves every row's real tokens at positions 0..n-1, so the models'
    default position ids already match an unpadded forward pass, and the attention
    mask keeps the pad keys out of every softmax: a row's logits do not depend on
    what it is batched with (up to float noise).
    """
    width = max(len(row) for row in rows)
    if all(len(row) == width for row in rows):
        return torch.stack(list(rows)).long(), None
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        attention[i, : len(row)] = 1
    return ids, attention


def _logits_at(
    model: nn.Module, rows: Sequence[torch.Tensor], row_index: torch.Tensor, column: torch.Tensor
) -> torch.Tensor:
    """Float32 logits (len(row_index), vocab) of right-padded `rows` at (row_index, column) pairs.

    Our models expose `hidden_states` and `logits_from_hidden`, so the output head (a
    vocabulary-sized matmul, the largest activation of a real checkpoint) runs only at
    the positions that are scored; any other module is run whole as `model(ids, mask)`.
    """
    ids, attention = _pad_right(rows, int(model.mask_token_id))
    device = _model_device(model)
    ids = ids.to(device)
    attention = None if attention is None else attention.to(device)
    row_index, column = row_index.to(device), column.to(device)
    if hasattr(model, "hidden_states") and hasattr(model, "logits_from_hidden"):
        hidden = model.hidden_states(ids, attention_mask=attention)
        return model.logits_from_hidden(hidden[row_index, column]).float()
    attention = torch.ones_like(ids) if attention is None else attention  # HF's 0/1 mask
    return model(ids, attention_mask=attention)[row_index, column].float()


def _draw_batches(
    group: Sequence[_Request], mc_num: int, batch_size: int
) -> Iterator[list[tuple[_Request, int, int]]]:
    """Pack the draws of `group`, request after request, into batches of `batch_size` rows.

    Each batch is a list of segments (request, first draw, end draw); a request's draws
    may be split across consecutive batches and a batch may hold several requests.
    """
    batch: list[tuple[_Request, int, int]] = []
    free = batch_size
    for req in group:
        first = 0
        while first < mc_num:
            end = min(mc_num, first + free)
            batch.append((req, first, end))
            free -= end - first
            first = end
            if free == 0:
                yield batch
                batch, free = [], batch_size
    if batch:
        yield batch


def _score_draws(model: nn.Module, segments: Sequence[tuple[_Request, int, int]]) -> None:
    """One forward pass over the draws in `segments`; stores (L/l) * sum of CE for each draw."""
    mask_id, shift = int(model.mask_token_id), int(model.logits_shift)
    rows: list[torch.Tensor] = []
    row_of, logit_pos, targets, weights = [], [], [], []
    for req, first, end in segments:
        masks = req.masks[first:end]
        noisy = torch.where(masks, mask_id, req.continuation)
        rows.extend(torch.cat([req.context.expand(len(masks), -1), noisy], dim=1).unbind(0))
        draw, where = masks.nonzero(as_tuple=True)
        row_of.append(len(rows) - len(masks) + draw)
        # the prediction for the token at position p is read from the logits at p - shift
        logit_pos.append(len(req.context) + where - shift)
        targets.append(req.continuation[where])
        weights.append(masks.shape[1] / masks.sum(dim=1, dtype=torch.float64)[draw])  # L / l
    row_of_all = torch.cat(row_of)
    logits = _logits_at(model, rows, row_of_all, torch.cat(logit_pos))
    # full-vocabulary cross-entropy, mask token included, as LLaDA's evaluation computes it
    nll = F.cross_entropy(logits, torch.cat(targets).to(logits.device), reduction="none")
    per_draw = torch.zeros(len(rows), dtype=torch.float64)
    per_draw.index_add_(0, row_of_all, nll.double().cpu() * torch.cat(weights))
    offset = 0
    for req, first, end in segments:
        req.draw_values[first:end] = per_draw[offset : offset + end - first]
        offset += end - first


def _greedy_step(model: nn.Module, active: Sequence[_Request]) -> None:
    """One forward pass: each row unmasks its most confident masked position (argmax token).

    A row is decided when a committed token differs from the continuation (False) or
    when nothing is left masked (True).
    """
    mask_id, shift = int(model.mask_token_id), int(model.logits_shift)
    rows = [torch.cat([req.context, req.decoded]) for req in active]
    masked = [req.still_masked.nonzero().squeeze(1) for req in active]
    row_index = torch.cat([torch.full_like(where, b) for b, where in enumerate(masked)])
    column = torch.cat([len(req.context) + where - shift for req, where in zip(active, masked)])
    probs = _logits_at(model, rows, row_index, column).softmax(dim=-1)
    # the mask token is never a committed prediction (a real checkpoint never ranks it first)
    probs[:, mask_id] = -1.0
    confidence, tokens = (t.cpu() for t in probs.max(dim=-1))
    for req, where, row_conf, row_tokens in zip(
        active,
        masked,
        confidence.split([len(w) for w in masked]),
        tokens.split([len(w) for w in masked]),
    ):
        best = int(row_conf.argmax())  # the first of equally confident positions
        position, token = int(where[best]), int(row_tokens[best])
        req.decoded[position] = token
        req.still_masked[position] = False
        if token != int(req.continuation[position]):
            req.greedy_decided, req.greedy = True, False
        elif not req.still_masked.any():
            req.greedy_decided, req.greedy = True, True


def _greedy_checks(
    model: nn.Module,
    reqs: Sequence[_Request],
    on_decided: Callable[[list[_Request]], None],
) -> None:
    """Run the greedy check of every request (non-empty continuations), rows leaving as decided.

    `on_decided(reqs)` is called after each pass with the requests that pass decided.
    """
    for req in reqs:
        req.decoded = torch.full_like(req.continuation, int(model.mask_token_id))
        req.still_masked = torch.ones(len(req.continuation), dtype=torch.bool)
    active = list(reqs)
    while active:
        _greedy_step(model, active)
        on_decided([req for req in active if req.greedy_decided])
        active = [req for req in active if not req.greedy_decided]


def _prepare(
    model: nn.Module,
    requests: Sequence[tuple[torch.Tensor, torch.Tensor]],
    seeds: Sequence[int],
) -> list[_Request]:
    if len(seeds) != len(requests):
        raise ValueError(
            f"got {len(seeds)} seeds for {len(requests)} requests; give one seed per request"
        )
    prepared = []
    for i, ((context, continuation), seed) in enumerate(zip(requests, seeds)):
        context, continuation = _fit_request(
            model, _as_ids(context, "context_ids"), _as_ids(continuation, "continuation_ids")
        )
        prepared.append(_Request(i, context, continuation, int(seed)))
    return prepared


@torch.inference_mode()
def _finisher(
    results: list[tuple[float, bool] | None],
    greedy: bool,
    progress: Callable[[int], None] | None,
) -> Callable[[Sequence[_Request]], None]:
    """What records finished requests: each one's (estimate, is_greedy) into `results` at its
    index, then `progress(n)`."""

    def finish(reqs: Sequence[_Request]) -> None:
        for req in reqs:
            estimate = -float(req.draw_values.mean()) if len(req.continuation) else 0.0
            results[req.index] = (estimate, req.greedy if greedy else False)
        if progress is not None and reqs:
            progress(len(reqs))

    return finish


def _score_group(
    model: nn.Module,
    group: Sequence[_Request],
    mc_num: int,
    batch_size: int,
    stratified: bool,
    greedy: bool,
    finish: Callable[[Sequence[_Request]], None],
) -> None:
    """One group of requests: their Monte-Carlo draws, then (if `greedy`) their greedy
    checks; each request is `finish`ed once decided."""
    for req in group:
        req.masks = _draw_masks(len(req.continuation), mc_num, req.seed, stratified)
        req.draw_values = torch.zeros(mc_num, dtype=torch.float64)
    for segments in _draw_batches(group, mc_num, batch_size):
        _score_draws(model, segments)
        if not greedy:
            finish([req for req, _, end in segments if end == mc_num])
    if not greedy:
        return
    _greedy_checks(model, group, on_decided=finish)
    for req in group:  # free the per-draw state of finished requests
        req.masks = req.decoded = req.still_masked = None


def score_requests(
    model: nn.Module,
    requests: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    mc_num: int = 128,
    batch_size: int = 32,
    seeds: Sequence[int],
    progress: Callable[[int], None] | None = None,
    greedy: bool = True,
    stratified: bool = True,
) -> list[tuple[float, bool]]:
    """(log-likelihood estimate, is_greedy) for each (context_ids, continuation_ids) request.

    `requests[i]` is scored with `mc_num` Monte-Carlo draws generated from `seeds[i]`
    alone; `batch_size` is the number of rows per forward pass, and the draws of
    several requests share a pass. Requests are processed longest first, in groups of
    `batch_size`: first their draws, then (if `greedy`) their greedy checks, at most
    `batch_size` rows at a time. `progress(n)` is called with the number of requests
    that just finished (a tqdm `update`). With `greedy=False` the second element is
    always False (LLaDA's `is_check_greedy=False`), and no greedy passes are run.
    Returns results in the order of `requests`.
    """
    if mc_num < 1 or batch_size < 1:
        raise ValueError(f"mc_num and batch_size must be at least 1, got {mc_num} and {batch_size}")
    prepared = _prepare(model, requests, seeds)
    results: list[tuple[float, bool] | None] = [None] * len(prepared)
    finish = _finisher(results, greedy, progress)
    empty = [req for req in prepared if len(req.continuation) == 0]
    finish(empty)  # log p(empty) = 0, and the empty continuation is trivially greedy
    scored = sorted((req for req in prepared if len(req.continuation)), key=lambda r: -r.length)
    for start in range(0, len(scored), batch_size):
        group = scored[start : start + batch_size]
        _score_group(model, group, mc_num, batch_size, stratified, greedy, finish)
    return results  # type: ignore[return-value]


def loglikelihood(
    model: nn.Module,
    context_ids: torch.Tensor,
    continuation_ids: torch.Tensor,
    *,
    mc_num: int = 128,
    seed: int = 0,
    batch_size: int = 32,
    stratified: bool = True,
) -> float:
    """Monte-Carlo estimate of log p(continuation | context): minus the estimated NLL bound.

    `mc_num` draws of (l, mask set) seeded by `seed` through a local generator (the
    global RNG is untouched); `batch_size` rows per forward pass. See the module
    docstring for the estimator and the conventions (truncation, Dream's shift).
    """
    [(value, _)] = score_requests(
        model,
        [(context_ids, continuation_ids)],
        mc_num=mc_num,
        batch_size=batch_size,
        seeds=[seed],
        greedy=False,
        stratified=stratified,
    )
    return value


def rolling_windows(
    token_ids: torch.Tensor,
    *,
    max_length: int,
    prefix_ids: torch.Tensor | None = None,
    window: int | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Cut a document into (context, continuation) requests whose continuations tile it.

    A document that fits after the prefix is one request (prefix, document). A longer
    one is scored like lm-eval's rolling windows: the first request scores the first
    `max_length - len(prefix)` tokens after the prefix alone; each later one scores the
    next `window` tokens (default: half the room after the prefix, at least 1),
    conditioned on the prefix and on the `room - window` document tokens just before it
    (the last, shorter window too: unlike lm-eval's, it is not given the extra room).
    A `window` outside 1..room is refused, even for a document that fits.
    """
    tokens = _as_ids(token_ids, "token_ids")
    prefix = _as_ids([] if prefix_ids is None else prefix_ids, "prefix_ids")
    room = max_length - len(prefix)
    if room < 1:
        raise ValueError(
            f"the prefix of {len(prefix)} tokens leaves no room in max_length {max_length}"
        )
    # checked whether or not the document needs windows: a bad window is refused, never ignored
    if window is not None and not 1 <= window <= room:
        raise ValueError(
            f"window must lie in 1..{room} (max_length minus the prefix), got {window}"
        )
    if len(tokens) <= room:
        return [(prefix, tokens)]
    window = max(1, room // 2) if window is None else window  # room 1: windows of one token
    windows = [(prefix, tokens[:room])]
    history = room - window  # preceding document tokens that fit beside each later window
    for start in range(room, len(tokens), window):
        # start - history >= window >= 1: the history never reaches before the document
        context = torch.cat([prefix, tokens[start - history : start]])
        windows.append((context, tokens[start : start + window]))
    return windows


def rolling_loglikelihood(
    model: nn.Module,
    token_ids: torch.Tensor,
    *,
    mc_num: int = 128,
    seed: int = 0,
    prefix_ids: torch.Tensor | None = None,
    window: int | None = None,
    batch_size: int = 32,
    stratified: bool = True,
) -> float:
    """Estimate of log p(document | prefix) for lm-eval's `loglikelihood_rolling`.

    The sum, over the windows of `rolling_windows`, of each window's `loglikelihood`
    (the Monte-Carlo ELBO of that window's tokens given the prefix and the preceding
    tokens that fit). For a document that fits in `model.max_length` after the prefix
    this is exactly `loglikelihood(model, prefix, document, seed=seed)`; for longer ones
    it is the chain rule over windows with each window's history truncated, as
    causal-LM rolling evaluation does. Window k is seeded by `seed + k * stride` (mod
    2**63), so windows draw independent masks. Dream needs a non-empty `prefix_ids`
    (e.g. [BOS]) because its first token is predicted from the position before it.
    """
    windows = rolling_windows(
        token_ids, max_length=int(model.max_length), prefix_ids=prefix_ids, window=window
    )
    seeds = [(seed + k * _SEED_STRIDE) % 2**63 for k in range(len(windows))]
    results = score_requests(
        model,
        windows,
        mc_num=mc_num,
        batch_size=batch_size,
        seeds=seeds,
        greedy=False,
        stratified=stratified,
    )
    return sum(value for value, _ in results)
