"""A pass in which no key is padded attends without a mask (`common.attended_keys`), as the
upstream code runs a batch with no padding: on a GPU that lets SDPA run flash attention in
bfloat16 (a mask, even of zeros, rules it out), Fast-dLLM's and Dream's kernel. On the CPU
the numbers are the same with or without the mask, so the tokens must be those of a decode
that always passes one; a pass with padding must still pass its mask; and a captured shape
never serves both."""

from __future__ import annotations

import pytest
import torch
from references import load_float32
from test_static_steps import MASK, decode_in_mode

from lm_eval_dvoting.core.decoding import DecodeRow
from lm_eval_dvoting.core.decoding.full_steps import FullSteps
from lm_eval_dvoting.core.decoding.kept import stack_kept
from lm_eval_dvoting.core.decoding.state import KeptKeysValues, left_pad
from lm_eval_dvoting.core.decoding.static_steps import StaticSteps
from lm_eval_dvoting.models import common, dream, llada
from lm_eval_dvoting.models.common import attended_keys

CPU = torch.device("cpu")


def _rows(
    prompt_lengths: list[int], cache: str, answers: list[int] | None = None
) -> list[DecodeRow]:
    """Rows of `answers` (12 each by default) answer tokens in blocks of 4, the fixed
    schedule, one commit a step (they move in step)."""
    rows = []
    answers = answers or [12] * len(prompt_lengths)
    for k, (length, answer) in enumerate(zip(prompt_lengths, answers)):
        g = torch.Generator().manual_seed(k)
        rows.append(
            DecodeRow(
                prompt=torch.randint(0, 240, (length,), generator=g),
                tokens=torch.full((answer,), MASK),
                block_length=4,
                cache=cache,
                steps=answer,
            )
        )
    return rows


def _always_masked(attention_mask, input_ids, cache=None):
    """What the models attended with before: a mask over every key, padded or not."""
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    return attention_mask if cache is None else cache.key_mask(attention_mask, input_ids)


@pytest.fixture
def sdpa_calls(monkeypatch) -> list[tuple[bool, int, int, bool]]:
    """Each attention call of the test: (no mask, query heads, key heads, `enable_gqa`)."""
    calls: list[tuple[bool, int, int, bool]] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def watched(q, k, v, attn_mask=None, **kwargs):
        calls.append((attn_mask is None, q.shape[1], k.shape[1], kwargs.get("enable_gqa", False)))
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", watched)
    return calls


def _masks(calls: list[tuple[bool, int, int, bool]]) -> list[bool]:
    """Whether each attention call got a mask."""
    return [not unmasked for unmasked, *_ in calls]


@pytest.mark.parametrize("mode", ["dynamic", "static", "graphs"])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize(
    "prompts, answers, masked_passes",
    [([6], [12], 0), ([6, 6], [12, 12], 0), ([6, 9], [12, 12], 12), ([6, 6], [12, 8], 8)],
    ids=["one", "even", "ragged", "ragged-answers"],
)
def test_only_a_pass_with_padding_attends_with_a_mask(
    model, mode, cache, prompts, answers, masked_passes, sdpa_calls, monkeypatch
):
    """The rows move in step, one pass a step (12 in all). One row, or rows of one length: no
    attention call gets a mask. Rows of two prompt lengths: every call does (each full pass
    pads the shorter sequence, each reuse pass the shorter kept prefix). One prompt length
    and answers of 12 and 8: the first 8 passes do (the full passes pad the shorter
    sequence, the reuse passes the shorter rest of the answer under `prefix`, the shorter
    kept suffix under `dual`), the last 4, of one row, do not. The tokens and passes are
    those of a decode that always passes a mask. (Planted: `left_pad` always returning the
    mask: `one` and `even` failed; the kept keys never called padded: `ragged` failed, in
    the reuse passes; their suffixes' lengths ignored: `ragged-answers` failed under
    `dual`.)"""
    found = decode_in_mode(model, mode, _rows(prompts, cache, answers))
    masks_seen = _masks(sdpa_calls)
    per_pass, rest = divmod(len(masks_seen), 12)
    assert per_pass and not rest
    assert (
        masks_seen == [True] * masked_passes * per_pass + [False] * (12 - masked_passes) * per_pass
    )
    for family in (llada, dream):
        monkeypatch.setattr(family, "attended_keys", _always_masked)
    masked = decode_in_mode(model, mode, _rows(prompts, cache, answers))
    for row, expected in zip(found, masked):
        assert torch.equal(row.tokens, expected.tokens) and row.nfe == expected.nfe


def _kept(prefixes: list[int], suffix: int | None = None) -> list[KeptKeysValues]:
    """Rows' kept keys and values: 2 layers, 2 heads of 4, prefixes of the lengths given."""

    def layers(length: int) -> list[torch.Tensor]:
        return [torch.randn(2, length, 4) for _ in range(2)]

    made = []
    for length in prefixes:
        tail = None if suffix is None else layers(suffix)
        made.append(KeptKeysValues(0, layers(length), layers(length), tail, tail))
    return made


def test_the_kept_keys_say_whether_they_are_padded():
    """`stack_kept` tells the model whether any row's kept keys are padded: prefixes (and
    suffixes) of one length are not, so an unpadded pass attends without a mask; prefixes
    of two lengths are, and the mask covers every key."""
    ids = torch.zeros((2, 3), dtype=torch.long)
    even = stack_kept(_kept([5, 5], suffix=2), CPU)
    assert even.every_kept_key_real and attended_keys(None, ids, even) is None
    ragged = stack_kept(_kept([5, 4], suffix=2), CPU)
    assert not ragged.every_kept_key_real
    assert attended_keys(None, ids, ragged).tolist() == [[1] * 10, [0] + [1] * 9]
    queries = torch.tensor([[0, 1, 1], [1, 1, 1]])  # a padded query: a mask, kept even or not
    assert attended_keys(queries, ids, even)[0].tolist() == [1] * 5 + [0, 1, 1] + [1] * 2


def test_a_captured_shape_never_serves_both_a_padded_and_an_unpadded_pass(model):
    """A graph captured without a mask must never replay over padding: whether the queries
    and the kept keys are padded is part of a shape's key, for the reuse passes and the full
    passes alike. (Planted: the kept keys' padding left out of the key: the ragged rows
    got the even rows' shape, which attends without a mask.)"""
    steps = StaticSteps(model, "graphs")
    ids = torch.zeros((2, 3), dtype=torch.long)
    even = steps._shape(_kept([5, 5]), ids, None)
    assert steps._shape(_kept([5, 5]), ids, None) is even
    ragged = steps._shape(_kept([5, 4]), ids, None)  # the same rows, length and width
    padded_queries = steps._shape(_kept([5, 5]), ids, torch.ones_like(ids))
    assert len({id(even), id(ragged), id(padded_queries)}) == 3
    assert even.cache.every_kept_key_real and not ragged.cache.every_kept_key_real
    assert padded_queries.cache.every_kept_key_real  # (a mask all the same: its queries')
    assert even.attention is None and padded_queries.attention is not None
    full = FullSteps(model, "graphs")
    unpadded = full._shape(ids, None, ids)
    assert full._shape(ids, torch.ones_like(ids), ids) is not unpadded
    assert full._shape(ids, None, ids) is unpadded and unpadded.attention is None


def test_left_pad_gives_no_mask_only_where_no_row_is_padded():
    """`mask_only_if_padded`: rows of one length (whole or in pieces) get no mask and the
    ids and positions they get with one; rows of two lengths get the mask as before."""
    even = [torch.tensor([4, 5, 6]), [torch.tensor([7]), torch.tensor([8, 9])]]
    ids, attention, positions = left_pad(even, 0, CPU, mask_only_if_padded=True)
    with_mask = left_pad(even, 0, CPU)
    assert attention is None and with_mask[1].all()
    assert torch.equal(ids, with_mask[0]) and torch.equal(positions, with_mask[2])
    ragged = [torch.tensor([4, 5, 6]), torch.tensor([8, 9])]
    found, expected = left_pad(ragged, 0, CPU, mask_only_if_padded=True), left_pad(ragged, 0, CPU)
    assert all(torch.equal(a, b) for a, b in zip(found, expected))


def test_a_likelihood_batch_of_one_length_is_scored_without_a_mask(model, sdpa_calls, monkeypatch):
    """A request's Monte-Carlo draws share one length: their pass attends without a mask and
    scores as with one; draws of two lengths keep theirs. (Planted: `_pad_right` always
    giving the mask: failed.)"""
    from lm_eval_dvoting.core import likelihood

    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 240, (7,), generator=g) for _ in range(3)]
    where = torch.tensor([0, 1, 2]), torch.tensor([6, 3, 0])
    found = likelihood._logits_at(model, rows, *where)
    assert sdpa_calls and not any(_masks(sdpa_calls))
    for family in (llada, dream):
        monkeypatch.setattr(family, "attended_keys", _always_masked)
    assert torch.equal(found, likelihood._logits_at(model, rows, *where))
    sdpa_calls.clear()
    likelihood._logits_at(model, [rows[0], rows[1][:5], rows[2]], *where)
    assert sdpa_calls and all(_masks(sdpa_calls))


def test_grouped_keys_are_read_in_place_only_where_flash_runs(
    dream_fixture, sdpa_calls, monkeypatch
):
    """Dream's 2 key/value heads for 4 query heads go to SDPA as they are (`enable_gqa`) only
    where `grouped_heads_in_place` says its flash kernel runs the pass (no mask, a CUDA GPU,
    bfloat16 or float16); there the decode is bit for bit the repeated heads' (forced here on
    the CPU, whose flash kernel takes grouped heads in torch 2.13); a padded pass, or the CPU,
    repeats them. (Planted: the repeat kept where flash runs; `enable_gqa` with a mask:
    failed.)"""
    calls = sdpa_calls
    model = load_float32(str(dream_fixture))
    repeated = decode_in_mode(model, "dynamic", _rows([6], "dual"))
    assert calls and set(calls) == {(True, 4, 4, False)}  # the CPU: repeated
    calls.clear()
    flash_here = lambda q, bias: bias is None  # noqa: E731  (as on a GPU where flash runs)
    monkeypatch.setattr(common, "grouped_heads_in_place", flash_here)
    in_place = decode_in_mode(model, "dynamic", _rows([6], "dual"))
    assert calls and set(calls) == {(True, 4, 2, True)}
    assert torch.equal(in_place[0].tokens, repeated[0].tokens)
    calls.clear()
    decode_in_mode(model, "dynamic", _rows([6, 9], "dual"))
    assert calls and set(calls) == {(False, 4, 4, False)}


class _Query:
    """What `grouped_heads_in_place` reads of a query tensor, on a device it cannot have here."""

    def __init__(self, is_cuda: bool, dtype: torch.dtype, head_dim: int = 128) -> None:
        self.is_cuda, self.dtype, self.shape, self.device = is_cuda, dtype, (1, 28, 32, head_dim), 0


def test_flash_is_expected_only_on_a_capable_gpu_in_half_precision(monkeypatch):
    """No mask, CUDA, bfloat16 or float16, a head width flash takes, compute capability 8.0 or
    more, torch 2.5 or more: all needed (each one missing: the repeat)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    decide = common.grouped_heads_in_place
    assert decide(_Query(True, torch.bfloat16), None) and decide(_Query(True, torch.float16), None)
    assert not decide(_Query(True, torch.bfloat16), torch.zeros(1))
    assert not decide(_Query(False, torch.bfloat16), None)
    assert not decide(_Query(True, torch.float32), None)
    assert not decide(_Query(True, torch.bfloat16, head_dim=100), None)
    monkeypatch.setattr(common, "GQA_IN_PLACE", False)
    assert not decide(_Query(True, torch.bfloat16), None)
    monkeypatch.setattr(common, "GQA_IN_PLACE", True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (7, 5))
    assert not decide(_Query(True, torch.bfloat16), None)


def test_what_a_pass_records_holds_no_larger_tensor(model):
    """The keys and values a recording pass keeps own their storage: keys rotated together
    with the queries (`rotate_pair`) would otherwise keep every layer's queries alive until
    the pass ends. (Planted: `own_copy` returning its input: failed.)"""
    from lm_eval_dvoting.models.common import PrefixCache

    record = PrefixCache()
    ids = torch.randint(0, 240, (2, 9))
    model.hidden_states(ids, None, None, cache=record)
    for tensor in record.new_keys + record.new_values:
        assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
