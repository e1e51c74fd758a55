"""`decoder=dream` (issue 40): Dream's own `diffusion_generate` algorithms as a commit rule.

Against tests/dream_reference.py, written independently of the decoder: at temperature 0
(`alg_temp` 0) our tokens are those of Dream's `_sample` transcribed from its
generation_utils.py, on the official-format Dream fixture and on the packaged demo
`tiny-arith-dream`; the top-p/top-k filters are the file's, bit for bit; with noise
(temperature > 0, `alg_temp` > 0, `alg="origin"`) every draw follows the documented order
from the row's generator; every strategy decodes with the rule.

Ties: where Dream's file picks among equal confidences, which one `torch.topk` returns is
unspecified (CPU and CUDA differ); the decoder documents the leftmost. With top_p < 1 at
temperature 0 many positions keep a single token (confidence exactly 1), so ties are
common there: a case whose commits a tie decided is compared with the documented reference
instead (`_expected`), and the tests assert that most cases are tie-free.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from dream_reference import (
    DocumentedDream,
    DreamSampling,
    block_steps,
    documented_dream,
    dream_generate,
    top_k_logits,
    top_p_logits,
)
from references import load_float32
from torch import nn

from lm_eval_dvoting.core.decoding import DreamDecoding, generate
from lm_eval_dvoting.core.decoding.sampling import top_k_filter, top_p_filter

RANKED = ("maskgit_plus", "topk_margin", "entropy")
DEMO = "tiny-arith-dream"


@functools.lru_cache(maxsize=None)
def _demo_prompts() -> tuple[torch.Tensor, ...]:
    """Three demo questions as the demo formats them, unpadded ids."""
    from lm_eval_dvoting.demo import arith
    from lm_eval_dvoting.models.loading import load_tokenizer

    tokenizer = load_tokenizer(DEMO)
    questions = [arith.format_prompt(p["question"]) for p in arith.read_test_set()[:3]]
    return tuple(torch.tensor(tokenizer(q, add_special_tokens=False).input_ids) for q in questions)


def _fixture_prompts() -> tuple[torch.Tensor, ...]:
    """Ordinary tokens (below the fixture's special ids 240..250), three lengths."""
    return tuple(
        torch.randint(0, 240, (5 + seed,), generator=torch.Generator().manual_seed(seed))
        for seed in range(3)
    )


@pytest.fixture(params=["dream_fixture", "demo"])
def case(request) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """(model, prompts): the official-format Dream fixture, or the packaged demo."""
    if request.param == "demo":
        return load_float32(DEMO), _demo_prompts()
    return load_float32(str(request.getfixturevalue("dream_fixture"))), _fixture_prompts()


def _ours(model, prompt, cfg: DocumentedDream, seed: int | None = None, init=None):
    """Our decoder on one row: (region tokens, forward passes)."""
    result = generate(
        model,
        prompt[None],
        gen_length=cfg.gen_length,
        block_length=cfg.block_length,
        steps=cfg.steps,
        rule="dream",
        dream=DreamDecoding(alg=cfg.alg, alg_temp=cfg.alg_temp, eps=cfg.eps),
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=cfg.top_k,
        init_tokens=None if init is None else init[None],
        generator=None if seed is None else torch.Generator().manual_seed(seed),
    )
    return result.tokens[0], int(result.nfe[0])


def _expected(model, prompt, cfg: DocumentedDream) -> tuple[list[int], bool]:
    """Dream's own tokens for a whole-answer, temperature-0 row, and whether they are the
    file's (False: a tie decided a commit there, and the documented leftmost is expected)."""
    sampling = DreamSampling(
        steps=cfg.steps, eps=cfg.eps, alg=cfg.alg, alg_temp=cfg.alg_temp, top_p=cfg.top_p,
        top_k=cfg.top_k,
    )  # fmt: skip
    ties: list[int] = []
    tokens, _ = dream_generate(model, prompt[None], cfg.gen_length, sampling, ties=ties)
    if not ties:
        return tokens[0].tolist(), True
    return documented_dream(model, prompt, cfg)[0].tolist(), False


def _check_greedy(model, prompts, settings: list[dict]) -> tuple[int, list[list[int]]]:
    """Every prompt x settings at temperature 0, whole answer: ours equals Dream's. Returns
    how many cases Dream's file decided without a tie, and our tokens (prompt by prompt)."""
    tie_free, found = 0, []
    for prompt in prompts:
        for setting in settings:
            cfg = DocumentedDream(block_length=setting["gen_length"], **setting)
            expected, from_file = _expected(model, prompt, cfg)
            tokens, nfe = _ours(model, prompt, cfg)
            assert tokens.tolist() == expected, (setting, from_file)
            assert nfe == cfg.steps, setting  # Dream's masks last until its last step
            tie_free += from_file
            found.append(tokens.tolist())
    return tie_free, found


# (answer length, steps): steps < L, = L, not dividing L, > L, one step
SCHEDULES = [(4, 4), (7, 3), (12, 5), (12, 12), (6, 9), (5, 1)]


@pytest.mark.parametrize("alg", RANKED)
def test_greedy_tokens_are_dreams_own(case, alg):
    """maskgit_plus / topk_margin / entropy at temperature 0, alg_temp 0: the tokens of
    Dream's `_sample` for several prompts, steps and answer lengths, one row per call."""
    model, prompts = case
    settings = [dict(gen_length=L, steps=S, alg=alg) for L, S in SCHEDULES]
    settings.append(dict(gen_length=8, steps=4, alg=alg, eps=0.3))  # eps reaches the schedule
    tie_free, _ = _check_greedy(model, prompts, settings)
    assert tie_free >= len(prompts) * len(settings) - 2  # the file itself decided nearly all


@pytest.mark.parametrize("alg", RANKED)
def test_greedy_top_p_and_top_k_shape_the_confidence_as_dreams(case, alg):
    """top_p=0.95 and top_k at temperature 0 change Dream's confidences (not its argmax):
    still Dream's tokens, and for some case other tokens than without them."""
    model, prompts = case
    filters = [{}, dict(top_p=0.95), dict(top_k=3), dict(top_p=0.9, top_k=2)]
    settings = [
        dict(gen_length=L, steps=S, alg=alg, **f) for L, S in SCHEDULES[1:3] for f in filters
    ]
    tie_free, found = _check_greedy(model, prompts, settings)
    assert tie_free >= 9  # no filter, or top_k alone, leave few ties: the file decided those
    plain, top_p = found[0 :: len(filters)], found[1 :: len(filters)]
    assert plain != top_p  # top_p reaches the confidence at temperature 0


def test_the_documented_reference_is_dreams_file_where_no_tie_decides(case):
    """The references agree: at temperature 0, whole answer, the documented decode (float64,
    ties to the leftmost) gives the tokens of Dream's file (float32, torch.topk) wherever no
    tie decided, with and without the filters (a check of tests/dream_reference.py)."""
    model, prompts = case
    compared = 0
    for prompt in prompts:
        for (L, S), alg, filters in zip(SCHEDULES, RANKED * 2, [{}, dict(top_k=3)] * 3):
            cfg = DocumentedDream(L, L, S, alg=alg, **filters)
            sampling = DreamSampling(steps=S, alg=alg, alg_temp=0, **filters)
            ties: list[int] = []
            tokens, nfe = dream_generate(model, prompt[None], L, sampling, ties=ties)
            if not ties:
                documented = documented_dream(model, prompt, cfg)
                assert (documented[0].tolist(), documented[1]) == (tokens[0].tolist(), nfe)
                compared += 1
    assert compared >= 15


def test_the_mask_token_is_never_committed_where_dreams_file_would(dream_fixture):
    """Deviation (a): Dream's file, which does not suppress the mask token's logit,
    commits the mask id itself on this fixture row; ours suppresses it first (ALGORITHM.md
    1.1) and equals the transcription that does too."""
    model = load_float32(str(dream_fixture))
    prompt = _fixture_prompts()[1]
    sampling = DreamSampling(steps=3, alg="topk_margin", alg_temp=0)
    raw, _ = dream_generate(model, prompt[None], 7, sampling, suppress_mask=False)
    assert model.mask_token_id in raw[0].tolist()  # the case still shows what it guards
    suppressed, _ = dream_generate(model, prompt[None], 7, sampling)
    tokens, _ = _ours(model, prompt, DocumentedDream(7, 7, 3, alg="topk_margin"))
    assert tokens.tolist() == suppressed[0].tolist()
    assert model.mask_token_id not in tokens.tolist()


# ------------------------------------------------------------------------ the filters


def _logit_rows(dtype: torch.dtype) -> torch.Tensor:
    """Rows with ties (at the top, at the top-p/top-k boundary), a -inf, a peaked row."""
    g = torch.Generator().manual_seed(0)
    rows = torch.randn((4, 12), generator=g, dtype=torch.float64) * 2
    rows[1, :4] = 3.0  # four-way tie at the top
    rows[2] = torch.tensor([2.0, 1.0, 1.0, 1.0, 0.0, 0.0, -1.0, -1.0, -1.0, -2.0, -3.0, -3.0])
    rows[3, 5] = float("-inf")  # a suppressed mask token
    rows[3, 0] = 30.0  # nearly all the mass on one token
    return rows.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.8, 0.95, 0.999, 1.0])
def test_top_p_filter_is_the_files(dtype, top_p):
    rows = _logit_rows(dtype)
    found = top_p_filter(rows.clone(), top_p)
    expected = top_p_logits(rows.clone(), top_p)
    assert found.dtype == dtype and torch.equal(found, expected)
    assert torch.equal(top_p_filter(rows[2].clone(), top_p), top_p_logits(rows[2].clone(), top_p))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("top_k", [1, 2, 3, 4, 11, 12, 13, 1000])
def test_top_k_filter_is_the_files(dtype, top_k):
    rows = _logit_rows(dtype)
    found = top_k_filter(rows.clone(), top_k)
    expected = top_k_logits(rows.clone(), top_k)
    assert found.dtype == dtype and torch.equal(found, expected)
    assert torch.equal(top_k_filter(rows[1].clone(), top_k), top_k_logits(rows[1].clone(), top_k))


def test_filters_return_new_logits():
    """The filters return new logits and leave their input as it was."""
    rows = _logit_rows(torch.float64)
    before = rows.clone()
    top_p_filter(rows, 0.5), top_k_filter(rows, 2)
    assert torch.equal(rows, before)


# ------------------------------------------------------- blocks and the noise order


def _check_documented(model, prompts, cfg: DocumentedDream, seeds=(0,), init=None):
    """Ours equals the documented reference (tokens and forward passes) for each prompt and
    generator seed; returns our token lists."""
    found = []
    for prompt in prompts:
        for seed in seeds:
            g = torch.Generator().manual_seed(seed)
            expected, expected_nfe = documented_dream(model, prompt, cfg, g, init)
            tokens, nfe = _ours(model, prompt, cfg, seed, init)
            assert tokens.tolist() == expected.tolist(), (cfg, seed)
            assert nfe == expected_nfe, (cfg, seed)
            found.append(tokens.tolist())
    return found


@pytest.mark.parametrize("alg", RANKED)
@pytest.mark.parametrize("gen_length, block_length, steps", [(8, 4, 6), (12, 4, 3), (8, 2, 8)])
def test_greedy_semi_autoregressive_blocks_follow_the_documented_schedule(
    case, alg, gen_length, block_length, steps
):
    """block_length < answer length: Dream's schedule per block, steps/num_blocks each."""
    model, prompts = case
    cfg = DocumentedDream(gen_length, block_length, steps, alg=alg)
    _check_documented(model, prompts, cfg)


NOISE = [  # alg, temperature, alg_temp, top_p, top_k
    ("entropy", 0.7, 0.0, None, None),
    ("maskgit_plus", 0.0, 0.5, None, None),
    ("topk_margin", 0.7, 0.5, None, None),
    ("maskgit_plus", 1.0, 0.0, 0.9, None),
    ("topk_margin", 0.5, 0.2, None, 5),
    ("entropy", 0.7, 0.3, 0.95, 3),
]


@pytest.mark.parametrize("alg, temperature, alg_temp, top_p, top_k", NOISE)
def test_sampling_follows_the_documented_noise(case, alg, temperature, alg_temp, top_p, top_k):
    """temperature > 0 and/or alg_temp > 0: each draw from the row's generator in the
    documented order, whole answer and blocks; the noise changes the tokens."""
    model, prompts = case
    kwargs = dict(alg=alg, alg_temp=alg_temp, temperature=temperature, top_p=top_p, top_k=top_k)
    changed = []
    for gen_length, block_length, steps in [(8, 8, 5), (8, 4, 4)]:
        cfg = DocumentedDream(gen_length, block_length, steps, **kwargs)
        sampled = _check_documented(model, prompts[:2], cfg, seeds=(1, 2))
        greedy = DocumentedDream(gen_length, block_length, steps, alg=alg)
        changed += [
            tokens != documented_dream(model, prompts[i // 2], greedy)[0].tolist()
            for i, tokens in enumerate(sampled)
        ]
    assert any(changed)


@pytest.mark.parametrize("temperature, top_p, top_k", [(0.0, None, None), (0.8, None, None),
                                                       (0.8, 0.9, 4)])  # fmt: skip
def test_origin_follows_the_documented_noise(case, temperature, top_p, top_k):
    """alg=origin: each masked position commits with probability 1 - s/t (float64 uniforms
    from the row's generator), its token the argmax or a Gumbel-max draw for it alone; a
    block whose masks all commit early hands on to the next (fewer passes than steps)."""
    model, prompts = case
    kwargs = dict(alg="origin", temperature=temperature, top_p=top_p, top_k=top_k)
    nfes = []
    for gen_length, block_length, steps, eps in [(8, 8, 8, 1e-3), (8, 4, 6, 1e-3), (6, 6, 2, 0.5)]:
        cfg = DocumentedDream(gen_length, block_length, steps, eps=eps, **kwargs)
        for prompt in prompts:
            for seed in (3, 4):
                g = torch.Generator().manual_seed(seed)
                expected, expected_nfe = documented_dream(model, prompt, cfg, g)
                tokens, nfe = _ours(model, prompt, cfg, seed)
                assert (tokens.tolist(), nfe) == (expected.tolist(), expected_nfe), (cfg, seed)
                nfes.append((nfe, steps))
    assert any(nfe < steps for nfe, steps in nfes)  # the early hand-on was exercised


def test_partly_given_rows_take_steps_in_proportion_to_their_masks(case):
    """A row that starts partly unmasked (dVoting's remask samples): each block takes
    ceil(steps_per_block * masked / block_length) steps, a block without masks none."""
    model, prompts = case
    cfg = DocumentedDream(12, 4, 12, alg="entropy", temperature=0.6, top_p=0.95)
    init = torch.full((12,), model.mask_token_id)
    init[[0, 2, 4, 5, 6, 7, 9]] = torch.tensor([5, 6, 7, 8, 9, 10, 11])  # blocks: 2, 0, 3 masks
    _check_documented(model, prompts, cfg, seeds=(7,), init=init)
    steps = [block_steps(4, masked, 4) for masked in (2, 0, 3)]
    assert steps == [2, 0, 3]
    _, nfe = _ours(model, prompts[0], cfg, 7, init)
    assert nfe == sum(steps)
    given = init != model.mask_token_id
    tokens, _ = _ours(model, prompts[0], cfg, 7, init)
    assert torch.equal(tokens[given], init[given])


# ------------------------------------------------------------------------ batches


@pytest.mark.parametrize(
    "settings",
    [
        dict(alg="entropy"),
        dict(alg="maskgit_plus", temperature=0.7, alg_temp=0.4, top_p=0.9),
        dict(alg="origin", temperature=0.5),
    ],
)
def test_a_row_in_a_batch_of_three_decodes_as_alone(case, settings):
    """Dream's file averages the masked count over the batch; ours counts each row's own
    masks, so a row's tokens never depend on its batch (left padding included)."""
    from lm_eval_dvoting.core.decoding.state import left_pad

    model, prompts = case
    cfg = DocumentedDream(8, 8, 6, **settings)
    seeds = (11, 12, 13)
    init = torch.full((3, 8), model.mask_token_id)
    init[1, :3] = torch.tensor([5, 6, 7])  # rows with different masked counts
    ids, mask, _ = left_pad(prompts, 0, torch.device("cpu"))
    batch = generate(
        model, ids, mask, gen_length=8, block_length=8, steps=6, rule="dream",
        dream=DreamDecoding(alg=cfg.alg, alg_temp=cfg.alg_temp), temperature=cfg.temperature,
        top_p=cfg.top_p, init_tokens=init,
        generator=[torch.Generator().manual_seed(s) for s in seeds],
    )  # fmt: skip
    for i, prompt in enumerate(prompts):
        alone, nfe = _ours(model, prompt, cfg, seeds[i], init[i])
        assert batch.tokens[i].tolist() == alone.tolist() and int(batch.nfe[i]) == nfe


# ---------------------------------------------------------------------- strategies


@functools.lru_cache(maxsize=None)
def _demo_batch() -> tuple:
    from lm_eval_dvoting.core.decoding.state import left_pad

    ids, mask, _ = left_pad(_demo_prompts(), 0, torch.device("cpu"))
    return ids, mask


def _extract(tokens: torch.Tensor) -> str | None:
    from lm_eval_dvoting.core.answers import extract_answer
    from lm_eval_dvoting.models.loading import load_tokenizer

    text = load_tokenizer(DEMO).decode(tokens.tolist(), skip_special_tokens=True)
    return extract_answer(text, "number")


def _run(strategy: str, model=None, gen_length: int = 16, **settings) -> list:
    from lm_eval_dvoting.core.strategies import run_strategy

    ids, mask = _demo_batch()
    model = load_float32(DEMO) if model is None else model
    return run_strategy(
        model, ids, mask, extract=_extract, gen_length=gen_length, seed=5, strategy=strategy,
        decoder="dream", **settings,
    )  # fmt: skip


def test_single_is_the_rule_and_takes_steps_passes():
    """strategy=single,decoder=dream at the model card's setting takes the steps' passes
    (default: the answer length); at temperature 0 it is `generate` with the rule."""
    model = load_float32(DEMO)
    card = dict(alg="entropy", alg_temp=0.0, temperature=0.2, top_p=0.95)
    for result in _run("single", **card):
        assert result.nfe == 16 and result.sample_nfe == [16]
        assert (result.samples != model.mask_token_id).all()
    greedy = _run("single", alg="topk_margin", temperature=0.0, steps=8)
    for prompt, result in zip(_demo_prompts(), greedy):
        tokens, nfe = _ours(model, prompt, DocumentedDream(16, 16, 8, alg="topk_margin"))
        assert result.samples[0].tolist() == tokens.tolist() and result.nfe == nfe == 8


@pytest.mark.parametrize("strategy", ["majority", "hex", "dvoting", "temporal"])
def test_every_strategy_decodes_with_the_rule(strategy):
    """Each strategy's samples decode with decoder=dream to the end: the total NFE is the
    samples' sum, and a fresh sample (blocks of 8, steps 8) takes exactly the 8 steps."""
    settings = dict(alg="maskgit_plus", top_k=5, steps=8, temperature=0.5)
    # hex has its own block lengths, L/32 .. L/2, and its own sample count
    settings.update(dict(hex_samples=5) if strategy == "hex" else dict(block_length=8))
    if strategy in ("majority", "dvoting"):
        settings["n"] = 3
    results = _run(strategy, gen_length=32, **settings)
    for result in results:
        assert result.nfe == sum(result.sample_nfe) > 0
        assert all(nfe > 0 for nfe in result.sample_nfe), result.sample_nfe
        assert (result.samples != load_float32(DEMO).mask_token_id).all()
        if strategy != "hex":
            assert result.sample_nfe[0] == 8 and max(result.sample_nfe) <= 8


def test_rfg_decodes_with_the_rule():
    """strategy=rfg (a guided pair of Dream models) decodes with decoder=dream; each step
    runs both models, so its NFE is twice the steps."""
    from lm_eval_dvoting.core.guidance import GuidedModel

    model = load_float32(DEMO)
    results = _run("rfg", model=GuidedModel(model, model), steps=8, alg="entropy")
    for result in results:
        assert result.nfe == 16 and (result.samples != model.mask_token_id).all()


def test_schedule_helpers_agree_with_the_brief():
    """The reference's own arithmetic: block steps and the float32 count."""
    from dream_reference import dream_count

    assert block_steps(6, 4, 4) == 6 and block_steps(6, 1, 4) == 2 and block_steps(6, 0, 4) == 0
    times = torch.linspace(1, 1e-3, 4)
    assert dream_count(7, times[0], times[1], False) == int(
        torch.tensor(7.0) * (1 - times[1] / times[0])
    )
    assert dream_count(7, times[2], times[3], True) == 7
    assert math.isclose(float(times[1]), 1 - 0.999 / 3, rel_tol=1e-6)


def test_commit_counts_are_the_files_float32_arithmetic():
    """A step's count, now host arithmetic on the schedule's shares, is the file's
    `int(num_mask_token * (1 - s / t))` on float32 tensors for every step, for answers of up
    to 1,100 masks. (Planted: the product left in float64, unrounded: failed; the share taken
    in float64 from the float32 timesteps: failed.)"""
    from lm_eval_dvoting.core.parts.rules.dream import commit_count, commit_shares

    masked = [*range(0, 1100, 29), 1024, 512, 256, 7, 3]
    for eps in (1e-3, 1e-2, 0.1):
        for steps in [*range(1, 70), 128, 255, 256, 512, 1024]:
            t = torch.linspace(1, eps, steps + 1)
            file_shares = 1 - t[1:] / t[:-1]  # the file's float32 tensors, a step a row
            expected = (torch.tensor(masked, dtype=torch.float32) * file_shares[:, None]).long()
            shares = commit_shares(steps, eps)
            assert list(shares) == file_shares.tolist()
            found = [[commit_count(n, share) for n in masked] for share in shares]
            assert found == expected.tolist()
