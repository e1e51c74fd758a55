"""Block diffusion (LLaDA2.0 threshold decoding, LLaDA2.1 joint threshold decoding) on the
official-format LLaDA2 fixture, against a transcription of upstream `generate()`
(tests/llada2_reference.py), and the block cache's exactness."""

from __future__ import annotations

import pytest
import torch
from llada2_reference import upstream_generate
from references import load_float32

from lm_eval_dvoting.core.decoding import generate
from lm_eval_dvoting.core.decoding.blocks import block_schedule
from lm_eval_dvoting.core.decoding.state import BlockDecoding, left_pad

QUALITY = BlockDecoding(threshold=0.7, editing_threshold=0.5)
SPEED = BlockDecoding(threshold=0.5, editing_threshold=0.0)
SETTINGS = {
    "2.0": BlockDecoding(),
    "2.0-steps2": BlockDecoding(steps=2),
    "2.0-low": BlockDecoding(threshold=0.3),
    "2.1-quality": QUALITY,
    "2.1-speed": SPEED,
    "2.1-post2": BlockDecoding(0.5, None, 0.0, 2),
}


@pytest.fixture
def model(llada2_fixture):
    return load_float32(str(llada2_fixture))


def _prompts() -> list[list[int]]:
    """Random prompts of 3, 4, 6 and 9 tokens (at block 4: no prompt tail in the first block,
    and tails of 1-3 tokens), and one that speed mode answers with an end token at once."""
    generator = torch.Generator().manual_seed(7)
    drawn = [torch.randint(0, 240, (n,), generator=generator).tolist() for n in (3, 4, 6, 9)]
    return drawn + [[56, 216, 108, 74, 33, 86]]


def _cut(tokens: list[int], ends: set[int]) -> list[int]:
    cut = next((k for k, t in enumerate(tokens) if t in ends), None)
    return tokens if cut is None else tokens[: cut + 1]


@pytest.mark.parametrize("cache", ["none", "block"])
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_greedy_decoding_matches_upstream_generate(model, name: str, cache: str):
    settings, ends = SETTINGS[name], set(model.end_token_ids)
    for prompt in _prompts():
        for gen_length in (5, 8):
            expected, passes = upstream_generate(
                model,
                prompt,
                gen_length,
                4,
                settings.threshold,
                settings.steps,
                settings.editing_threshold,
                settings.max_post_steps,
            )
            result = generate(
                model,
                torch.tensor([prompt]),
                gen_length=gen_length,
                block_length=4,
                block=settings,
                cache=cache,
            )
            assert _cut(result.tokens[0].tolist(), ends) == expected, (name, prompt, gen_length)
            assert int(result.nfe[0]) == passes


@pytest.mark.parametrize("gen_length", [3, 12])
def test_default_steps_are_upstreams_32_capped_at_the_answer_length(model, gen_length: int):
    """At block 8 with steps left out: 32 steps (one token per step at least) for a long answer,
    `min(32, gen_length)` = 3 for a 3-token one (3 tokens per step at least, the block over 3)."""
    for prompt in _prompts():
        expected, passes = upstream_generate(model, prompt, gen_length, 8, threshold=1.0)
        result = generate(
            model,
            torch.tensor([prompt]),
            gen_length=gen_length,
            block_length=8,
            block=BlockDecoding(threshold=1.0),
        )
        assert _cut(result.tokens[0].tolist(), set(model.end_token_ids)) == expected
        assert int(result.nfe[0]) == passes
    if (
        gen_length == 3
    ):  # 8 - (9 % 8) = 7 masks at the last prompt's first block: 3 + 3 + 1 over 3 passes
        assert upstream_generate(model, _prompts()[3], 3, 8, threshold=1.0)[1] == 3


def test_the_cases_are_not_vacuous(model):
    """Editing changes answers, the threshold changes answers, and some decodes stop at an end
    token."""
    prompts, ends = _prompts(), set(model.end_token_ids)
    outputs = {
        name: [
            tuple(
                upstream_generate(
                    model, p, 8, 4, s.threshold, s.steps, s.editing_threshold, s.max_post_steps
                )[0]
            )
            for p in prompts
        ]
        for name, s in SETTINGS.items()
    }
    assert outputs["2.0"] != outputs["2.1-speed"] and outputs["2.0"] != outputs["2.0-low"]
    assert outputs["2.1-speed"] != outputs["2.1-post2"]
    assert any(
        answer and answer[-1] in ends and len(answer) < 8
        for answers in outputs.values()
        for answer in answers
    )


@pytest.mark.parametrize("settings", [BlockDecoding(), QUALITY], ids=["2.0", "2.1"])
def test_block_cache_gives_the_same_tokens_when_sampling_and_batched(model, settings):
    prompts = _prompts()[:4]
    ids, attention, _ = left_pad([torch.tensor(p) for p in prompts], 0, torch.device("cpu"))
    results = {}
    for cache in ("none", "block"):
        generators = [torch.Generator().manual_seed(row) for row in range(len(prompts))]
        results[cache] = generate(
            model,
            ids,
            attention,
            gen_length=11,
            block_length=4,
            block=settings,
            cache=cache,
            temperature=0.8,
            generator=generators,
        )
    assert torch.equal(results["none"].tokens, results["block"].tokens)
    assert torch.equal(results["none"].nfe, results["block"].nfe)
    alone = generate(
        model,
        torch.tensor([prompts[0]]),
        gen_length=11,
        block_length=4,
        block=settings,
        temperature=0.8,
        generator=[torch.Generator().manual_seed(0)],
    )
    assert torch.equal(alone.tokens[0], results["block"].tokens[0])


def test_block_cache_passes_cover_the_current_block_only(model):
    """The first pass runs over prompt + first block; later passes of a block over that
    block; the first pass of the next block over the finished block and the new one."""
    lengths: list[int] = []
    original = model.hidden_states

    def spy(input_ids, attention_mask=None, position_ids=None, cache=None, block_lengths=None):
        lengths.append(input_ids.shape[1])
        return original(
            input_ids, attention_mask, position_ids, cache=cache, block_lengths=block_lengths
        )

    model.hidden_states = spy
    try:
        result = generate(
            model,
            torch.tensor([_prompts()[3]]),
            gen_length=12,
            block_length=4,
            block=BlockDecoding(threshold=1.0),
            cache="block",
        )  # one token per pass
    finally:
        del model.hidden_states
    # prompt 9 tokens: blocks [0,4) [4,8) prompt, [8,12) holds the prompt's last token and 3 masks
    assert lengths[:3] == [12, 4, 4]
    assert (
        lengths[3] == 8
    )  # the finished block [8,12) again, with its final tokens, and block [12,16)
    assert int(result.nfe[0]) == len(lengths)


def test_kept_tokens_and_the_prompt_are_never_edited(model):
    """LLaDA2.1 rewrites only positions that were masks when the decode began: never the
    prompt's tail in the first block, nor tokens a dVoting sample keeps (editing_threshold 0:
    any other argmax would be written)."""
    from lm_eval_dvoting.core.decoding import DecodeRow, RowDecoder

    prompt = torch.tensor(_prompts()[2])  # 6 tokens: the first decoded block starts with 2 of them
    init = torch.full((10,), model.mask_token_id)
    init[3], init[7] = 17, 18
    row = DecodeRow(prompt=prompt, tokens=init, block_length=4, cache="block", block=SPEED)
    decoder = RowDecoder(model)
    decoder.add(row)
    edits_elsewhere = 0
    while decoder.active:
        before = row.tokens.clone()
        decoder.step()
        changed = (before != row.tokens) & (before != model.mask_token_id)
        edits_elsewhere += int(changed.sum())
        assert row.tokens[:2].tolist() == prompt[4:].tolist()  # the prompt's tail
    tokens = row.answer_tokens.tolist()
    assert (tokens[3], tokens[7]) == (17, 18) and not set(tokens[:8]) & set(model.end_token_ids)
    assert edits_elsewhere > 0  # editing did rewrite the generated tokens: the check is not vacuous


def test_an_end_token_stops_the_decode_and_fills_the_rest(model):
    for prompt in _prompts():
        result = generate(model, torch.tensor([prompt]), gen_length=16, block_length=4, block=SPEED)
        tokens = result.tokens[0].tolist()
        ends = [k for k, t in enumerate(tokens) if t in model.end_token_ids]
        if ends:
            assert all(t == tokens[ends[0]] for t in tokens[ends[0] :])
            longer = generate(
                model, torch.tensor([prompt]), gen_length=32, block_length=4, block=SPEED
            )
            assert torch.equal(
                longer.nfe, result.nfe
            )  # 16 more tokens after the end: no more passes
            return
    pytest.fail("no prompt decoded an end token: the test checks nothing")


def test_block_schedule_spreads_the_block_over_the_steps():
    assert block_schedule(32, 32) == [1] * 32
    assert block_schedule(10, 4) == [3, 3, 2, 2]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(block=BlockDecoding(), cache="prefix"),
            "cache=prefix does not apply to block diffusion",
        ),
        (dict(steps=8), "block diffusion"),
    ],
)
def test_refusals(model, kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate(model, torch.tensor([[1, 2, 3]]), gen_length=8, block_length=4, **kwargs)


def test_block_decoding_is_refused_for_a_bidirectional_model(llada_fixture):
    with pytest.raises(ValueError, match="block diffusion's, for LLaDA2"):
        generate(
            load_float32(str(llada_fixture)),
            torch.tensor([[1, 2, 3]]),
            gen_length=8,
            block_length=4,
            block=BlockDecoding(),
        )


@pytest.mark.parametrize(
    "field, value",
    [("threshold", 1.5), ("steps", 0), ("editing_threshold", -0.1), ("max_post_steps", -1)],
)
def test_bad_block_settings_are_named(field, value):
    with pytest.raises(ValueError, match=field):
        BlockDecoding(**{field: value})


def test_the_threshold_is_strict_and_the_quota_falls_back_to_the_most_confident():
    from lm_eval_dvoting.core.decoding.blocks import unmasked

    masked = torch.tensor([[True, True, True, False]] * 3)
    confidence = torch.tensor([[0.95, 0.5, 0.96, 0.99]] * 3, dtype=torch.float64)
    # row 0: threshold 0.95, quota 1; rows 1 and 2: threshold 0.97, quotas 2 and 0
    threshold = torch.tensor([0.95, 0.97, 0.97], dtype=torch.float64)
    quota = torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64)
    assert unmasked(masked, confidence, threshold, quota).tolist() == [
        [False, False, True, False],  # 0.95 is not above 0.95; 0.99 is no mask
        [True, False, True, False],  # none above: the quota's two most confident masks
        [False, False, False, False],  # quota 0 (a block without masks): nothing
    ]


def test_the_quota_fall_back_breaks_ties_to_the_leftmost_mask_row_by_row():
    from lm_eval_dvoting.core.decoding.blocks import unmasked

    masked = torch.tensor([[False, True, True, True, True], [True, True, True, True, False]])
    confidence = torch.tensor(
        [[0.9, 0.2, 0.4, 0.4, 0.4], [0.3, 0.3, 0.1, 0.3, 0.3]], dtype=torch.float64
    )
    commit = unmasked(
        masked, confidence, torch.full((2,), 0.95, dtype=torch.float64), torch.tensor([2.0, 3.0])
    )
    assert commit.tolist() == [
        [False, False, True, True, False],
        [True, True, False, True, False],
    ]


def test_block_diffusion_commits_every_row_of_a_step_in_one_batch(model, monkeypatch):
    """The rows of a step commit together: one `unmasked` call for 4 rows (the batch), and
    the same tokens as each row decoded alone."""
    from lm_eval_dvoting.core.decoding import blocks

    calls = []
    real = blocks.unmasked
    monkeypatch.setattr(blocks, "unmasked", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    prompts = _prompts()[:4]
    ids, attention, _ = left_pad([torch.tensor(p) for p in prompts], 0, torch.device("cpu"))
    kwargs = dict(gen_length=11, block_length=4, block=QUALITY, temperature=0.8)
    seeds = [torch.Generator().manual_seed(row) for row in range(4)]
    together = generate(model, ids, attention, generator=seeds, **kwargs)
    assert calls and max(calls) == 4
    for row, prompt in enumerate(prompts):
        alone = generate(
            model, torch.tensor([prompt]), generator=[torch.Generator().manual_seed(row)], **kwargs
        )
        assert torch.equal(alone.tokens[0], together.tokens[row])


def _row_by_row_commit(self, works) -> None:
    """The commit as it was, row by row (commit 0fe4e7f), for `BlockThreshold._commit_run`:
    each row draws `torch.rand((wanted, V))` from its generator, in the rows' order, and
    takes the quota's fall-back with `topk`."""
    from lm_eval_dvoting.core.decoding.blocks import block_schedule
    from lm_eval_dvoting.core.decoding.sampling import filtered
    from lm_eval_dvoting.core.decoding.state import LLADA2_STEPS, suppress_mask

    for work in works:
        row, settings = work.row, work.row.block
        positions, masked = torch.tensor(work.wanted), torch.tensor(work.masked)
        logits64 = suppress_mask(work.logits, self.mask_id)
        if row.temperature == 0:
            chosen, probs = logits64.argmax(-1), torch.softmax(logits64, dim=-1)
        else:
            noise = torch.rand(logits64.shape, dtype=torch.float64, generator=row.generator)
            scaled = filtered(logits64 / row.temperature, row.top_p, row.top_k, top_k_first=True)
            chosen = (scaled - torch.log(-torch.log(noise))).argmax(-1)
            probs = torch.softmax(scaled, dim=-1)
        confidence = probs.gather(-1, chosen[:, None]).squeeze(-1)
        steps = min(settings.steps or LLADA2_STEPS, row.gen_length - row.lead - row.trail)
        schedule = block_schedule(row.block_length, steps)
        step = row.progress.step_in_block
        quota = (
            1
            if settings.editing_threshold is not None
            else (schedule[step] if step < len(schedule) else 1)
        )
        quota = min(quota, sum(work.masked))
        hot = masked & (confidence > settings.threshold)
        ranked = confidence.masked_fill(~masked, -float("inf")).topk(quota).indices
        top = torch.zeros_like(masked).index_fill_(0, ranked, True)
        commit = torch.where(hot.sum() >= quota, hot, top)
        current = row.tokens[positions]
        edit = torch.zeros_like(masked)
        if settings.editing_threshold is not None:
            edit = ~masked & (confidence > settings.editing_threshold) & (chosen != current)
        row.tokens[positions] = torch.where(commit | edit, chosen, current)
        block = row.tokens[work.start : work.start + row.block_length]
        self.unsettled[row] = (work, torch.cat([block, edit.any().long()[None]]))


def test_the_batched_commit_gives_the_row_by_row_commits_tokens(model, monkeypatch):
    """Every setting, temperatures 0 and 0.8 with and without filters, partly kept answers,
    both caches, a generator for each row or one for all (every other case): the rows
    committed in one batch give the tokens and passes of the rows committed one by one
    (`_row_by_row_commit`), each generator drawn from as before."""
    from lm_eval_dvoting.core.decoding.blocks import BlockThreshold

    prompts = _prompts()
    ids, attention, _ = left_pad([torch.tensor(p) for p in prompts], 0, torch.device("cpu"))
    kept = torch.full((len(prompts), 11), model.mask_token_id)
    kept[:, 1], kept[::2, 10] = 17, 5
    cases = [
        (settings, temperature, filters, init, cache)
        for settings in SETTINGS.values()
        for temperature, filters in ((0.0, (None, None)), (0.8, (None, None)), (0.8, (0.9, 20)))
        for init, cache in ((None, "none"), (kept, "block"))
    ]
    compared, batched = 0, BlockThreshold._commit_run
    for case, (settings, temperature, (top_p, top_k), init, cache) in enumerate(cases):
        shared = case % 2 == 1
        kwargs = dict(block=settings, cache=cache, temperature=temperature, init_tokens=init)
        kwargs.update(gen_length=11, block_length=4, top_p=top_p, top_k=top_k)
        results = []
        for commit in (batched, _row_by_row_commit):
            monkeypatch.setattr(BlockThreshold, "_commit_run", commit)
            seeds = [3] if shared else range(len(prompts))
            generators = [torch.Generator().manual_seed(seed) for seed in seeds]
            generators = generators[0] if shared else generators
            results.append(generate(model, ids, attention, generator=generators, **kwargs))
        assert torch.equal(results[0].tokens, results[1].tokens)
        assert torch.equal(results[0].nfe, results[1].nfe)
        compared += int(results[0].nfe.sum())
    assert compared > 1000  # many steps, not a few


MIXED_ROWS = [  # (settings, temperature, top_p, top_k, cache) of each row
    (BlockDecoding(), 0.0, None, None, "none"),
    (QUALITY, 0.8, 0.9, 20, "block"),
    (SPEED, 0.8, None, None, "none"),
    (BlockDecoding(steps=2), 0.8, None, 5, "block"),
    (QUALITY, 0.0, None, None, "block"),
    (BlockDecoding(threshold=0.3), 0.8, 0.8, None, "none"),
]


@pytest.mark.parametrize("budget", [2**30, 1024], ids=["one-run", "runs-of-a-row"])
def test_rows_of_mixed_settings_commit_as_they_did_row_by_row(model, monkeypatch, budget):
    """LLaDA2.0 and 2.1 rows, greedy and sampled, with and without filters and the block
    cache, rows 1 and 2 sharing a generator, in one run (the batch regroups them by
    distribution) or in runs of one row: the tokens of the row-by-row commit."""
    from lm_eval_dvoting.core.decoding import RowDecoder, rules
    from lm_eval_dvoting.core.decoding.blocks import BlockThreshold

    monkeypatch.setitem(rules.BATCH_ELEMENTS, "cpu", budget)
    batched, decoded = BlockThreshold._commit_run, []
    for commit in (batched, _row_by_row_commit):
        monkeypatch.setattr(BlockThreshold, "_commit_run", commit)
        shared = torch.Generator().manual_seed(9)
        decoder, rows = RowDecoder(model), []
        for i, (prompt, (block, temperature, top_p, top_k, cache)) in enumerate(
            zip(_prompts() + _prompts()[:1], MIXED_ROWS)
        ):
            more = dict(top_p=top_p, top_k=top_k, **({"generator": shared} if i in (1, 2) else {}))
            rows.append(_block_row(model, prompt, i, block, cache, temperature, **more))
            decoder.add(rows[-1])
        while decoder.active:
            decoder.step()
        decoded.append([(row.answer_tokens.tolist(), row.nfe) for row in rows])
    assert decoded[0] == decoded[1]
    assert len({tuple(tokens) for tokens, _ in decoded[0]}) == len(MIXED_ROWS)


@pytest.mark.parametrize("settings", ["threshold", "speed"])
def test_every_strategy_gives_the_same_samples_with_and_without_the_block_cache(model, settings):
    """dVoting's remask samples start from the kept keys and values of an earlier sample's
    agreed blocks (recomputing only from the first remasked block on): same samples, same NFE.
    Hex runs one row per pass here: with its rows of five block lengths batched, the passes
    of the two policies pad differently, the float32 sums move by ~1e-6, and on this random
    fixture that once flipped a near-tie of the MoE router (a discontinuity), changing one
    sample; exact arithmetic gives equal samples (README, "Model families"). (Hex with
    editing, one row per pass, takes over a minute here: threshold decoding only.)"""
    from lm_eval_dvoting.core.strategies import run_strategy

    prompts = _prompts()[:4]
    ids, attention, _ = left_pad([torch.tensor(p) for p in prompts], 0, torch.device("cpu"))
    for strategy in (
        ("majority", "dvoting", "hex") if settings == "threshold" else ("majority", "dvoting")
    ):
        runs = {
            cache: run_strategy(
                model,
                ids,
                attention,
                strategy=strategy,
                extract=lambda t: int(t[0]) % 2,
                gen_length=32,
                block_length=4,
                n=5,
                tau=0.6,
                cache=cache,
                block_decoding=settings,
                temperature=0.8,
                max_rows=1 if strategy == "hex" else 16,
            )
            for cache in ("none", "block")
        }
        for plain, cached in zip(runs["none"], runs["block"]):
            assert torch.equal(plain.samples, cached.samples), strategy
            assert plain.sample_nfe == cached.sample_nfe


def test_a_remask_sample_recomputes_only_from_its_first_remasked_block(model):
    from lm_eval_dvoting.core.strategies import run_strategy

    lengths: list[int] = []
    original = model.hidden_states

    def spy(input_ids, attention_mask=None, position_ids=None, cache=None, block_lengths=None):
        lengths.append(
            (input_ids.shape[1], 0 if cache is None or not cache.keys else cache.keys[0].shape[2])
        )
        return original(
            input_ids, attention_mask, position_ids, cache=cache, block_lengths=block_lengths
        )

    model.hidden_states = spy
    try:
        [result] = run_strategy(
            model,
            torch.tensor([_prompts()[3]]),
            strategy="dvoting",
            extract=lambda t: None,
            gen_length=32,
            block_length=4,
            n=5,
            tau=0.6,
            temperature=0.8,
            max_rows=1,
        )
    finally:
        del model.hidden_states
    remasked = [i for i, kept in enumerate(result.kept) if kept]
    assert remasked, "no remask sample was drawn: the test checks nothing"
    # a remask sample's first pass attends to the kept keys of every whole block before its
    # first remasked position (prompt 9 tokens, block 4), and runs from there to that block's end
    for i in remasked:
        first_masked = 9 + min(set(range(32)) - set(result.kept[i]))
        shared = first_masked // 4 * 4
        assert lengths[sum(result.sample_nfe[:i])] == (4, shared)


@pytest.mark.parametrize(
    "preset, overrides, expected",
    [
        ("threshold", {}, BlockDecoding(threshold=0.95)),
        ("threshold", dict(threshold=0.3, steps=2), BlockDecoding(threshold=0.3, steps=2)),
        ("quality", {}, QUALITY),
        (
            "speed",
            dict(max_post_steps=2),
            BlockDecoding(threshold=0.5, editing_threshold=0.0, max_post_steps=2),
        ),
        (
            "quality",
            dict(editing_threshold=0.2, threshold=0.6),
            BlockDecoding(threshold=0.6, editing_threshold=0.2),
        ),
    ],
)
def test_run_strategy_hands_every_block_setting_to_the_decoder(model, preset, overrides, expected):
    """`strategy=single` through `run_strategy` decodes as `generate` with the `BlockDecoding`
    its settings name (the preset's threshold and editing threshold, each override, `steps`
    per block, `max_post_steps`): same tokens and passes per prompt, and the settings object
    is that one."""
    from lm_eval_dvoting.core.strategies import StrategySettings, run_strategy

    settings = StrategySettings(
        strategy="single", gen_length=8, block_length=4, block_decoding=preset, **overrides
    )
    assert settings.block_settings() == expected
    for prompt in _prompts():
        [result] = run_strategy(
            model,
            torch.tensor([prompt]),
            strategy="single",
            extract=lambda t: None,
            gen_length=8,
            block_length=4,
            block_decoding=preset,
            **overrides,
        )
        reference = generate(
            model,
            torch.tensor([prompt]),
            gen_length=8,
            block_length=4,
            block=expected,
            cache="block",
        )
        assert result.samples[0].tolist() == reference.tokens[0].tolist(), (
            preset,
            overrides,
            prompt,
        )
        assert result.sample_nfe == [int(reference.nfe[0])]


def test_the_block_settings_cases_are_not_vacuous(model):
    """Each override of the test above changes what the fixture decodes or how many passes it
    takes, so a setting dropped on the way to the decoder would be seen."""

    def decode(settings: BlockDecoding) -> list[tuple[list[int], int]]:
        out = []
        for prompt in _prompts():
            result = generate(
                model, torch.tensor([prompt]), gen_length=8, block_length=4, block=settings
            )
            out.append((result.tokens[0].tolist(), int(result.nfe[0])))
        return out

    pairs = [
        (BlockDecoding(threshold=0.95), BlockDecoding(threshold=0.3)),
        (BlockDecoding(threshold=0.95), BlockDecoding(threshold=0.95, steps=2)),
        (BlockDecoding(threshold=0.6), BlockDecoding(threshold=0.6, editing_threshold=0.2)),
        (QUALITY, BlockDecoding(threshold=0.7, editing_threshold=0.2)),
        (SPEED, BlockDecoding(threshold=0.5, editing_threshold=0.0, max_post_steps=2)),
    ]
    for left, right in pairs:
        assert decode(left) != decode(right), (left, right)


@pytest.mark.parametrize(
    "strategy, vote, cache",
    [
        ("single", None, "block"),
        ("majority", None, "block"),
        ("temporal", None, "none"),
        ("majority", "temporal", "none"),
        ("dvoting", "plain", "block"),
    ],
)
def test_run_strategy_picks_the_block_cache_unless_a_temporal_vote_needs_every_steps_prediction(
    model, monkeypatch, strategy, vote, cache
):
    """On a block-causal model with `cache` left out, `run_strategy` decodes by threshold
    decoding with the exact block cache, except under a temporal vote (which reads each
    step's whole prediction and so refuses that cache): there it takes no cache, rather
    than refusing a default the caller never chose."""
    from lm_eval_dvoting.core import strategies

    seen = []
    monkeypatch.setattr(
        strategies,
        "decode_questions",
        lambda model, prompts, settings, *a, **k: seen.append(settings),
    )
    strategies.run_strategy(
        model,
        torch.tensor([_prompts()[0]]),
        strategy=strategy,
        vote=vote,
        extract=lambda t: None,
        gen_length=8,
        block_length=4,
        n=3,
    )
    [settings] = seen
    assert (settings.cache, settings.block_decoding) == (cache, "threshold")


@pytest.mark.parametrize("cache", ["none", "block"])
@pytest.mark.parametrize("settings", [BlockDecoding(), QUALITY], ids=["2.0", "2.1"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_block_diffusion_step_reads_the_host_twice_for_all_rows(
    model, cache, settings, temperature
):
    """LLaDA2's rows plan on the step's snapshot of every row's tokens and commit on the
    device; what a block's outcome depends on (its tokens after the commit, whether it
    edited) is read with the progress read: two reads per step, however many rows, blocks
    finishing and rows stopping at an end token included. (Planted: each row's block read
    on its own after its commit: failed with 8 reads for 6 rows; the quota's fallback chosen
    on the host, as before: failed.) The model's MoE layers read nothing: on the CPU their
    grouped GEMMs apply (models/moe.py), so the two reads are the whole step's."""
    from bench.host_reads_bench import HostReads
    from lm_eval_dvoting.core.decoding import RowDecoder

    decoder = RowDecoder(model)
    for i, prompt in enumerate(_prompts()):
        decoder.add(_block_row(model, prompt, i, settings, cache, temperature))
    steps = 0
    while decoder.active:
        with HostReads() as reads:
            decoder.step()
        assert dict(reads.calls) == {"tolist": 2}
        steps += 1
    assert steps > 3


def _block_row(
    model,
    prompt: list[int],
    seed: int,
    settings: BlockDecoding = QUALITY,
    cache: str = "none",
    temperature: float = 0.8,
    **more,
):
    """A row of 11 positions, block 4, with its own generator (unless `more` gives one)."""
    from lm_eval_dvoting.core.decoding import DecodeRow

    more.setdefault("generator", torch.Generator().manual_seed(seed))
    return DecodeRow(
        prompt=torch.tensor(prompt),
        tokens=torch.full((11,), model.mask_token_id),
        block_length=4,
        block=settings,
        cache=cache,
        temperature=temperature,
        **more,
    )


def test_what_a_raising_step_left_unsettled_is_dropped_at_the_next_commit(model, monkeypatch):
    """A step that raised between the commits and the read leaves its rows unsettled; a
    decoder used again (its broken rows dropped) must not settle them on a later step's
    read, with a stale snapshot. (Planted: the rule's pending rows not cleared at commit:
    failed, the dropped row settled.)"""
    from lm_eval_dvoting.core.decoding import RowDecoder
    from lm_eval_dvoting.core.decoding.blocks import BlockThreshold

    decoder = RowDecoder(model)
    dropped = _block_row(model, _prompts()[0], 0)
    decoder.add(dropped)

    def broken(*args):
        raise RuntimeError("out of memory")

    with monkeypatch.context() as patched:
        patched.setattr(RowDecoder, "_read_and_settle", broken)
        with pytest.raises(RuntimeError, match="out of memory"):
            decoder.step()
    decoder.active, settled = [], []
    settle = BlockThreshold.settle
    monkeypatch.setattr(
        BlockThreshold, "settle", lambda r, row, f: settled.append(row) or settle(r, row, f)
    )
    decoder.add(_block_row(model, _prompts()[1], 1))
    decoder.step()
    assert settled and dropped not in settled


def test_a_rule_whose_facts_are_not_long_integers_is_refused(model, monkeypatch):
    """`facts_to_read` must give 1-D long tensors: others would promote every row's masks
    count in the shared read (to floats), so they are refused, naming the rule. (Planted:
    the check dropped: nothing raised.)"""
    from lm_eval_dvoting.core.decoding import RowDecoder
    from lm_eval_dvoting.core.decoding.blocks import BlockThreshold

    facts = BlockThreshold.facts_to_read
    monkeypatch.setattr(
        BlockThreshold, "facts_to_read", lambda rule: [(r, f.double()) for r, f in facts(rule)]
    )
    decoder = RowDecoder(model)
    decoder.add(_block_row(model, _prompts()[0], 0))
    with pytest.raises(TypeError, match=r"BlockThreshold.facts_to_read must give 1-D long"):
        decoder.step()


def test_end_ids_given_as_a_tensor_still_stop_the_row():
    """A model whose `end_token_ids` is a tensor: its ids are compared as ints with the host
    tokens. (Planted: the ids kept as 0-dim tensors: failed, no token matched.)"""
    from lm_eval_dvoting.core.decoding.blocks import BlockThreshold

    rule = BlockThreshold(250, torch.tensor([249, 7]))
    assert rule._first_end([1, 7, 249], 0, 3) == 1
