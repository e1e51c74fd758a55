"""What every decoder unit shares: the row to decode, the result, the settings' checks,
and the float64 numerics every commit rule takes its decisions from.

This is the bottom floor of the decoder (see `lm_eval_dvoting/core/decoding/__init__.py`): it
imports nothing from the rules, the caches or the row batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from lm_eval_dvoting.core.decoding.sampling import DREAM_ALGS, removed_by_filters

REMASKING_RULES = ("low_confidence", "random")
# What the forward pass of a step covers (caches.py): the whole sequence; the current
# block and everything after it, with the prefix's keys and values kept (Fast-dLLM's
# prefix cache); or the current block only, with prefix and suffix kept (its dual cache).
# `block` is block diffusion's (LLaDA2): the keys and values of finished blocks, which are
# final (a block never sees a later one), so it changes no output.
CACHE_POLICIES = ("none", "prefix", "dual", "block")


def default_block_length(gen_length: int) -> int:
    """The block length when none is given: L/16 (16 blocks), at least 1."""
    return max(1, gen_length // 16)


@dataclass(frozen=True)
class DecodeResult:
    """What `generate` returns: the generation region and the forward passes per row."""

    tokens: torch.Tensor  # (batch, gen_length)
    nfe: torch.Tensor  # (batch,) forward passes during which the row still had masks


@dataclass(eq=False)
class ScheduleProgress:
    """Where a fixed-schedule row stands: its block, the step within the block, and how
    many tokens each of the block's steps commits (set on the block's first step)."""

    block: int = 0
    step_in_block: int = 0
    counts: list[int] = field(default_factory=list)
    post: int = 0  # block diffusion with editing: post-fill steps taken in the block
    block_steps: int = 0  # Dream's rule: the current block's steps (0: not started)


LLADA2_STEPS = (
    32  # upstream LLaDA2.0 generate()'s default steps (per block), capped at the answer length
)


@dataclass(frozen=True)
class BlockDecoding:
    """Block diffusion's settings (LLaDA2, decoding/blocks.py): the confidence `threshold`
    (strict `>`), `steps` per block for LLaDA2.0's fallback quota (the block length spread
    over them; None: upstream's default `LLADA2_STEPS`; either is capped at the answer's
    length, as upstream caps it), and LLaDA2.1's editing: `editing_threshold` (None: no
    editing, i.e. LLaDA2.0) and `max_post_steps` (post-fill steps per block at most)."""

    threshold: float = 0.95
    steps: int | None = None
    editing_threshold: float | None = None
    max_post_steps: int = 16

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not (
            isinstance(self.threshold, (int, float)) and 0 <= self.threshold <= 1
        ):
            raise ValueError(
                f"threshold must be in [0, 1], got {self.threshold!r}: e.g. 0.95 (LLaDA2.0's "
                "default)"
            )
        if self.steps is not None and (
            isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1
        ):
            raise ValueError(
                f"steps (per block) must be a whole number >= 1, got {self.steps!r}: leave it out "
                "for "
                f"LLaDA2.0's default ({LLADA2_STEPS})"
            )
        if self.editing_threshold is not None and (
            isinstance(self.editing_threshold, bool)
            or not (
                isinstance(self.editing_threshold, (int, float))
                and 0 <= self.editing_threshold <= 1
            )
        ):
            raise ValueError(
                f"editing_threshold must be in [0, 1], got {self.editing_threshold!r}: e.g. 0.5 "
                "(LLaDA2.1's quality mode) or 0.0 (speed mode)"
            )
        if (
            isinstance(self.max_post_steps, bool)
            or not isinstance(self.max_post_steps, int)
            or self.max_post_steps < 0
        ):
            raise ValueError(
                f"max_post_steps must be a whole number >= 0, got {self.max_post_steps!r}: e.g. 16 "
                "(LLaDA2.1's default)"
            )


@dataclass(frozen=True)
class DreamDecoding:
    """Dream's `diffusion_generate` settings for `decoder=dream` (core/parts/rules/dream.py):
    `alg` (origin, maskgit_plus, topk_margin or entropy: what orders the masked positions),
    `alg_temp` (0 or None: the most confident commit; > 0: positions drawn from
    softmax(confidence / alg_temp)) and `eps` (the timesteps run from 1 to eps). The
    defaults are Dream-v0-Instruct-7B's model card's (alg="entropy", alg_temp=0) and its
    generation config's eps."""

    alg: str = "entropy"
    alg_temp: float | None = 0.0
    eps: float = 1e-3

    def __post_init__(self) -> None:
        if self.alg not in DREAM_ALGS:
            raise ValueError(
                f"alg must be one of {DREAM_ALGS}, got {self.alg!r}: e.g. alg=entropy (Dream's "
                "model card)"
            )
        if self.alg_temp is not None and not _real_at_least(self.alg_temp, 0):
            raise ValueError(
                f"alg_temp must be a finite number >= 0, got {self.alg_temp!r}: 0 commits the "
                "most confident positions (Dream's model card)"
            )
        if not (_real_at_least(self.eps, 0) and 0 < self.eps < 1):
            raise ValueError(f"eps must be in (0, 1), got {self.eps!r}: e.g. 1e-3 (Dream's)")


def _real_at_least(value: Any, lowest: float) -> bool:
    """A finite real number (not a bool) >= `lowest`."""
    real = isinstance(value, (int, float)) and not isinstance(value, bool)
    return real and math.isfinite(value) and value >= lowest


@dataclass(eq=False)
class KeptKeysValues:
    """A row's cached keys and values (per layer: (kv_heads, length, head_dim)) and the
    block start they were made for: before the block (prefix) and, for the dual cache,
    after it (suffix)."""

    block_start: int
    prefix_keys: list[torch.Tensor]
    prefix_values: list[torch.Tensor]
    suffix_keys: list[torch.Tensor] | None = None
    suffix_values: list[torch.Tensor] | None = None


@dataclass(eq=False)  # rows are compared by identity; their tensors have no truth value
class DecodeRow:
    """One row to decode: a prompt and a (partly) masked generation region.

    `tokens` holds the generation region and is updated in place; positions holding
    the mask id are decoded, the others stay fixed. `steps` selects the fixed schedule,
    `alpha` the entropy threshold, `threshold` the confidence threshold (exactly one, unless
    `rule` names the registered commit rule that decodes the row). `cache`
    is the row's cache policy (`CACHE_POLICIES`). `owner` is free for the caller (the
    strategies keep the sample's spec there). `observe`, when set, is called at every step
    with the step's 0-based index and the row's full prediction, a CPU tensor
    (`RowDecoder.step`, one copy for all observed rows; temporal voting).
    """

    prompt: torch.Tensor  # (prompt_length,) token ids, no padding
    tokens: torch.Tensor  # (gen_length,)
    block_length: int
    steps: int | None = None
    alpha: float | None = None
    temperature: float = 0.0
    remasking: str = "low_confidence"
    generator: torch.Generator | None = None
    owner: Any = None
    threshold: float | None = None  # Fast-dLLM's confidence threshold (instead of steps or alpha)
    cache: str = "none"
    nfe: int = 0
    progress: ScheduleProgress = field(default_factory=ScheduleProgress, repr=False)
    kept: KeptKeysValues | None = field(default=None, repr=False)
    observe: Callable[[int, torch.Tensor], None] | None = field(default=None, repr=False)
    block: BlockDecoding | None = (
        None  # block diffusion (a block-causal model), instead of steps/alpha/threshold
    )
    # block diffusion: prompt tokens at the front of `tokens` (blocks align at the prompt's start)
    lead: int = 0
    trail: int = 0  # block diffusion: masks appended to fill the last block (decoded, then cut off)
    # block diffusion: whether each position of `tokens` may be edited (LLaDA2.1), on the host
    editable: list[bool] | None = field(default=None, repr=False)
    keep_cache: bool = (
        False  # block cache: keep `kept` after the row finishes (a dVoting sample may share it)
    )
    label: str = ""  # how error messages name the row (the strategies: its question and sample)
    # the registered commit rule (`core/parts/rules/`) that decodes the row, by name; None:
    # the one its setting selects (block, steps, alpha or threshold)
    rule: str | None = None
    # the sampling filters (decoding/sampling.py), for every rule: None is off
    top_p: float | None = None
    top_k: int | None = None
    dream: DreamDecoding | None = None  # Dream's algorithms (`rule="dream"`)
    # `tokens` as the row batch read them on the host at the start of the current step, for
    # all its rows in one copy; set from then until every rule's `begin` has returned
    # (`RowDecoder.step`), None otherwise (decoding/rules.py's `token_lists` reads `tokens`
    # then). A rule may keep the list past that (block diffusion's `BlockWork.tokens`): it
    # is the step's start, never updated.
    step_tokens: list[int] | None = field(default=None, init=False, repr=False)

    @property
    def gen_length(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def answer_tokens(self) -> torch.Tensor:
        """The generation region the caller asked for (`tokens` without `lead` and `trail`)."""
        return self.tokens[self.lead : self.tokens.shape[0] - self.trail]

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    def sequence(self, begin: int = 0, end: int | None = None) -> list[torch.Tensor]:
        """The prompt and the tokens end to end, cut to [begin, end), as two views (no
        copy: `left_pad` lays them out)."""
        length = self.prompt.numel()
        end = length + self.tokens.numel() if end is None else end
        return [
            self.prompt[min(begin, length) : min(end, length)],
            self.tokens[max(begin - length, 0) : max(end - length, 0)],
        ]

    @property
    def steps_per_block(self) -> int:
        return self.steps // self.num_blocks


def validate_row_settings(
    gen_length: int,
    block_length: int,
    steps: int | None,
    alpha: float | None,
    temperature: float,
    remasking: str,
    cache: str = "none",
    threshold: float | None = None,
    block: BlockDecoding | None = None,
    rule: str | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    dream: DreamDecoding | None = None,
) -> None:
    """Raise a ValueError naming the setting that cannot work, and what would. A row that
    names its commit rule (`rule`) need not give steps, alpha or threshold: whether the
    rule exists and decodes it is the row batch's to check (`RowDecoder.add`)."""
    if gen_length <= 0:
        raise ValueError(f"gen_length must be positive, got {gen_length}")
    _validate_sampling(top_p, top_k, dream, steps, block)
    if block is not None:
        _validate_block_row(block_length, steps, alpha, threshold, temperature, cache)
        return
    _validate_rule(gen_length, block_length, steps, alpha, threshold, cache, rule)
    _validate_temperature(temperature)
    if remasking not in REMASKING_RULES:
        raise ValueError(f"remasking must be one of {REMASKING_RULES}, got {remasking!r}")
    # here, not at import: importing the registry runs `core.parts`, which imports this module
    from lm_eval_dvoting.core.parts.registry import names

    if cache not in names("cache"):  # the registered policies (`core/parts/caches/`)
        raise ValueError(
            f"cache must be one of {names('cache')}, got {cache!r}: none (exact, the default), "
            "prefix or dual (Fast-dLLM's approximate key/value caches)"
        )


def _validate_rule(
    gen_length: int,
    block_length: int,
    steps: int | None,
    alpha: float | None,
    threshold: float | None,
    cache: str,
    rule: str | None = None,
) -> None:
    """A bidirectional row's blocks and its one commit rule's setting."""
    if cache == "block":
        raise ValueError(
            "cache=block is block diffusion's (LLaDA2 models); use none, prefix or dual here"
        )
    if block_length <= 0 or gen_length % block_length:
        raise ValueError(
            f"block_length {block_length} must be positive and divide gen_length {gen_length}"
        )
    given = sum(setting is not None for setting in (steps, alpha, threshold))
    if given != 1 and not (rule is not None and given == 0):
        raise ValueError(
            "give exactly one of steps (fixed schedule), alpha (entropy threshold) or threshold "
            "(confidence threshold)"
        )
    if threshold is not None and not (math.isfinite(threshold) and 0 < threshold <= 1):
        raise ValueError(
            f"threshold must be in (0, 1], got {threshold}: e.g. 0.9 (Fast-dLLM's default)"
        )
    if steps is not None:
        num_blocks = gen_length // block_length
        if steps <= 0 or steps % num_blocks:
            raise ValueError(
                f"steps {steps} must be a positive multiple of the number of blocks "
                f"({gen_length} / {block_length} = {num_blocks})"
            )
    # `not ... >= 0` also refuses NaN
    if alpha is not None and not alpha >= 0:
        raise ValueError(
            f"alpha must be >= 0, got {alpha}: e.g. 0.3 (inf commits every masked position at once)"
        )


def validate_row(row: DecodeRow) -> None:
    """`validate_row_settings` of a row's own settings."""
    validate_row_settings(
        row.gen_length,
        row.block_length,
        row.steps,
        row.alpha,
        row.temperature,
        row.remasking,
        row.cache,
        row.threshold,
        row.block,
        row.rule,
        top_p=row.top_p,
        top_k=row.top_k,
        dream=row.dream,
    )


def _validate_sampling(
    top_p: float | None,
    top_k: int | None,
    dream: DreamDecoding | None,
    steps: int | None,
    block: BlockDecoding | None,
) -> None:
    """The filters' ranges, and Dream's algorithms with the `steps` they run."""
    if dream is not None and (steps is None or block is not None):
        raise ValueError(
            "Dream's algorithms (dream=DreamDecoding(...)) run a schedule of `steps`: give "
            "steps (e.g. the answer length, Dream's model card), not block, alpha or threshold"
        )
    _validate_filters(top_p, top_k)


def _validate_filters(top_p: float | None, top_k: int | None) -> None:
    """Top-p in (0, 1] and top-k a whole number >= 1, or None (off)."""
    if top_p is not None and not (_real_at_least(top_p, 0) and 0 < top_p <= 1):
        raise ValueError(
            f"top_p must be in (0, 1] or left out, got {top_p!r}: e.g. 0.95 (Dream's model card)"
        )
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a whole number >= 1 or left out, got {top_k!r}")


def _validate_temperature(temperature: float) -> None:
    # temperature=inf would turn the Gumbel noise into inf/0 (garbage samples)
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(
            f"temperature must be a finite number >= 0, got {temperature}: 0 for greedy, "
            "e.g. 0.6 to sample"
        )


def _validate_block_row(
    block_length: int,
    steps: int | None,
    alpha: float | None,
    threshold: float | None,
    temperature: float,
    cache: str,
) -> None:
    """A block-diffusion row: its rule's settings live in `block`; its cache is none or block."""
    if block_length <= 0:
        raise ValueError(f"block_length must be positive, got {block_length}: e.g. 32 (LLaDA2's)")
    if any(rule is not None for rule in (steps, alpha, threshold)):
        raise ValueError(
            "a block-diffusion row takes its rule's settings from `block` (BlockDecoding), not "
            "from "
            "steps/alpha/threshold"
        )
    _validate_temperature(temperature)
    if cache not in ("none", "block"):
        raise ValueError(
            f"cache={cache} does not apply to block diffusion (LLaDA2): use cache=block (exact, "
            "the "
            "default) or cache=none"
        )


def masked_block(
    tokens: list[int], mask_id: int, length: int, after: int = 0
) -> tuple[int, list[int]] | None:
    """The start of the block holding the first mask at or after `after`, and that
    block's masked positions; None when no mask is left there."""
    try:
        first_mask = tokens.index(mask_id, after)
    except ValueError:
        return None
    start = first_mask // length * length
    return start, [
        start + k for k, token in enumerate(tokens[start : start + length]) if token == mask_id
    ]


def left_pad(
    sequences: Sequence[torch.Tensor | Sequence[torch.Tensor]],
    pad_id: int,
    device: torch.device,
    mask_only_if_padded: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Left-padded ids, 0/1 attention mask and positions (0.. over the real tokens). A
    sequence may come in pieces laid end to end (`DecodeRow.sequence`). The ids and the mask
    are each one concatenation of views, padding included: a few kernels on a GPU whatever
    the number of rows, not a few a row. `mask_only_if_padded`: no mask (None) where no row
    is padded, so that the model's attention runs without one (`common.attended_keys`:
    SDPA's fastest kernel on a GPU), as the decoder's passes do."""
    rows = [[s] if isinstance(s, torch.Tensor) else list(s) for s in sequences]
    lengths = [sum(piece.numel() for piece in pieces) for pieces in rows]
    width = max(lengths)
    if mask_only_if_padded and min(lengths) == width:
        return (
            _unpadded(rows, device),
            None,
            torch.arange(width, device=device).expand(len(rows), -1),
        )
    pad = torch.full((width,), pad_id, dtype=torch.long, device=device)
    ones, zeros = (torch.full((width,), bit, dtype=torch.long, device=device) for bit in (1, 0))
    laid = [(pad[: width - n], *pieces) for pieces, n in zip(rows, lengths)]
    pieces = [p if p.device == device else p.to(device) for row in laid for p in row]
    ids = torch.cat(pieces).long()
    masks = [piece for n in lengths for piece in (zeros[: width - n], ones[:n])]
    attention = torch.cat(masks).view(len(rows), width)
    return ids.view(len(rows), width), attention, (attention.cumsum(-1) - 1).clamp(min=0)


def _unpadded(rows: list[list[torch.Tensor]], device: torch.device) -> torch.Tensor:
    """Rows of one length, each given in pieces, as one (rows, length) tensor of ids."""
    pieces = [p if p.device == device else p.to(device) for row in rows for p in row]
    return torch.cat(pieces).long().view(len(rows), -1)


# ----------------------------------------------------------------- float64 numerics


def suppress_mask(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """Float64 logits with the mask token's set to -inf: it is never committed."""
    logits64 = logits.double()
    if mask_id < logits64.shape[-1]:
        logits64[:, mask_id] = float("-inf")
    return logits64


def argmaxes_without(logits: Sequence[torch.Tensor], token: int) -> list[torch.Tensor]:
    """Each tensor's row-wise argmax with `token` (the mask) excluded, as
    `suppress_mask(logits).argmax(-1)` gives it, without copying every row to float64: only
    the tensors where some argmax is `token` are redone (a float32 copy with `token` at
    -inf), found with one host read for all of them."""
    best = [rows.argmax(-1) for rows in logits]
    hit = [b == token for b in best]
    redo = torch.stack([h.any() for h in hit]).tolist() if best else []
    for k, rows in enumerate(logits):
        if redo[k]:
            without = rows.clone()
            without[:, token] = float("-inf")
            best[k] = torch.where(hit[k], without.argmax(-1), best[k])
    return best


def candidates(
    logits64: torch.Tensor,
    temperature: float,
    generator: torch.Generator | None,
    block_masked: torch.Tensor | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
) -> torch.Tensor:
    """Argmax at temperature 0; LLaDA's float64 Gumbel-max sampling otherwise, from the
    tokens top-p/top-k keep at that temperature (decoding/sampling.py; None: all).

    `logits64` may hold only the masked positions of a block (`block_masked`, a
    boolean over the whole block): the noise is still drawn for the whole block, so
    the random stream is the same, and is then used at the masked positions only.
    """
    if temperature == 0:
        return logits64.argmax(-1)
    shape = logits64.shape if block_masked is None else (block_masked.numel(), logits64.shape[-1])
    noise = torch.rand(shape, dtype=torch.float64, device=logits64.device, generator=generator)
    if shape[0] != logits64.shape[0]:  # some block positions are not masked
        noise = noise[block_masked]
    return filtered_gumbel(logits64, temperature, noise, top_p, top_k)


def filtered_gumbel(
    logits64: torch.Tensor,
    temperature: float,
    noise: torch.Tensor,
    top_p: float | None = None,
    top_k: int | None = None,
) -> torch.Tensor:
    """`gumbel_noised` over the tokens top-p/top-k keep at `temperature` (> 0)."""
    removed = removed_by_filters(logits64, temperature, top_p, top_k)
    if removed is not None:
        logits64 = logits64.masked_fill(removed, float("-inf"))
    return gumbel_noised(logits64, temperature, noise)


def gumbel_noised(logits64: torch.Tensor, temperature: float, noise: torch.Tensor) -> torch.Tensor:
    """LLaDA's Gumbel-max: argmax(exp(logits) / (-log u)^T)."""
    gumbel = (-torch.log(noise)) ** temperature
    return (logits64.exp() / gumbel).argmax(-1)


def entropy(logits64: torch.Tensor) -> torch.Tensor:
    """Float64 entropy of the softmax along the vocabulary."""
    log_p = torch.log_softmax(logits64, dim=-1)
    p = log_p.exp()
    # xlogy-style: entries with p = 0 (the suppressed mask token: 0 * -inf = NaN) contribute
    # 0, not NaN; the same sums as torch.where(p > 0, p * log_p, 0) without its two extra
    # vocabulary-sized temporaries
    return -(p * log_p).nan_to_num_(nan=0.0).sum(-1)


# ------------------------------------------------------------------ input checks


def check_prompt_batch(
    input_ids: Any, attention_mask: Any = None, model: nn.Module | None = None
) -> torch.Tensor:
    """Refuse prompts that would be misread; return the attention mask (all ones if None).

    `input_ids` must be a 2-D integer tensor of token ids >= 0 (a float tensor would be
    cast to ids silently, a 1-D one read as a batch of one-token prompts), below the
    `model`'s embedding size when a model is given, and `attention_mask` a 0/1 tensor of
    the same shape.
    """
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(
            f"input_ids must be a torch.Tensor of token ids, got {type(input_ids).__name__}: "
            "use torch.tensor(ids, dtype=torch.long)"
        )
    if input_ids.dim() != 2:
        raise ValueError(
            f"input_ids must be 2-D (batch, length), got shape {tuple(input_ids.shape)}: "
            "for one prompt pass input_ids[None]"
        )
    if input_ids.dtype == torch.bool or input_ids.is_floating_point() or input_ids.is_complex():
        raise ValueError(
            f"input_ids must hold integer token ids, got dtype {input_ids.dtype}: "
            "tokenize the text and pass the ids as torch.long"
        )
    if input_ids.numel() and int(input_ids.min()) < 0:
        raise ValueError(
            f"input_ids must be token ids >= 0, got {int(input_ids.min())}: "
            "mark padding with attention_mask, not with negative ids"
        )
    _check_vocabulary(input_ids, model)
    if attention_mask is None:
        return torch.ones_like(input_ids)
    _check_attention_mask(input_ids, attention_mask)
    return attention_mask


def _check_vocabulary(input_ids: torch.Tensor, model: nn.Module | None) -> None:
    """Token ids the model's embedding holds (any ids without a model)."""
    rows = _embedding_rows(model)
    if rows is not None and input_ids.numel() and int(input_ids.max()) >= rows:
        raise ValueError(
            f"input_ids must be token ids < {rows} (the model's embedding size), got "
            f"{int(input_ids.max())}: encode the prompt with this checkpoint's tokenizer"
        )


def _check_attention_mask(input_ids: torch.Tensor, attention_mask: Any) -> None:
    """A 0/1 tensor of `input_ids`' shape."""
    if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != tuple(
        input_ids.shape
    ):
        shape = (
            tuple(attention_mask.shape)
            if isinstance(attention_mask, torch.Tensor)
            else type(attention_mask).__name__
        )
        raise ValueError(
            f"attention_mask must be a tensor of input_ids' shape {tuple(input_ids.shape)}, got "
            f"{shape}"
        )
    if attention_mask.numel() and not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (prompt token)")


def _embedding_rows(model: nn.Module | None) -> int | None:
    """How many token ids the model's input embedding holds (None without a model)."""
    if model is None:
        return None
    embedding = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    return None if embedding is None else embedding.num_embeddings
