"""strategy=rfg: reward-free guidance of a policy by a reference model (guidance.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from lora import OFFICIAL, peft_adapter
from safetensors.torch import load_file, save_file

from lm_eval_dvoting.core.guidance import GuidedModel
from lm_eval_dvoting.core.strategies import StrategySettings, run_strategy
from lm_eval_dvoting.models import adapters
from lm_eval_dvoting.models.loading import PACKAGED_CHECKPOINTS, load_model

PROMPTS = torch.randint(4, 40, (3, 12), generator=torch.Generator().manual_seed(0))


def extract(tokens: torch.Tensor) -> int:
    return int(tokens[-1]) % 5


@pytest.fixture(scope="module")
def reference_folder(tmp_path_factory) -> Path:
    """tiny-arith with every weight nudged: another model with the same tokenizer."""
    folder = tmp_path_factory.mktemp("reference")
    shutil.copytree(PACKAGED_CHECKPOINTS["tiny-arith"], folder, dirs_exist_ok=True)
    weights = load_file(str(folder / "model.safetensors"))
    generator = torch.Generator().manual_seed(3)
    save_file(
        {
            k: v + 0.05 * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
            for k, v in weights.items()
        },
        str(folder / "model.safetensors"),
    )
    return folder


def test_the_guided_logits_are_one_plus_w_policy_minus_w_reference(reference_folder):
    policy, reference = load_model("tiny-arith"), load_model(reference_folder)
    ids = PROMPTS[:2]
    with torch.no_grad():
        expected = 1.5 * policy(ids).float() - 0.5 * reference(ids).float()
        assert torch.equal(GuidedModel(policy, reference, 0.5)(ids), expected)
        assert torch.equal(
            GuidedModel(policy, reference, 0.0)(ids), policy(ids).float()
        )  # w = 0: the policy
        mask = torch.ones_like(ids)
        mask[0, :4] = 0  # a left-padded row: both passes must see the mask
        expected = 1.5 * policy(ids, mask).float() - 0.5 * reference(ids, mask).float()
        assert torch.equal(GuidedModel(policy, reference, 0.5)(ids, mask), expected)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_a_policy_with_an_adapter_is_guided_away_from_its_own_base(family, tmp_path):
    """reference=None: one model, the adapter on for the policy's pass and off for the
    reference's (the d1 recipe's KL reference)."""
    folder, _ = peft_adapter(OFFICIAL / family, tmp_path / "a", ["q_proj", "v_proj"])
    model = load_model(OFFICIAL / family, device="cpu", dtype="float32")
    adapters.attach(model, adapters.read_adapter(folder))
    ids = torch.randint(0, 90, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        on = model(ids)
        with adapters.enabled(model, False):
            off = model(ids)
        guided = GuidedModel(model, None, 2.0)(ids)
        assert torch.equal(guided, 3.0 * on.float() - 2.0 * off.float())
        assert torch.equal(model(ids), on)  # the adapter is on again afterwards
    assert not torch.equal(on, off)


def test_guidance_zero_decodes_exactly_as_single_and_counts_both_passes(reference_folder):
    policy, reference = load_model("tiny-arith"), load_model(reference_folder)
    torch.set_num_threads(1)
    common = dict(extract=extract, gen_length=32, seed=1)
    single = run_strategy(policy, PROMPTS, strategy="single", **common)
    unguided = run_strategy(
        GuidedModel(policy, reference), PROMPTS, strategy="rfg", guidance=0.0, **common
    )
    guided = run_strategy(
        GuidedModel(policy, reference), PROMPTS, strategy="rfg", guidance=3.0, **common
    )
    assert [r.samples.tolist() for r in unguided] == [r.samples.tolist() for r in single]
    assert (
        [r.nfe for r in unguided]
        == [r.nfe for r in guided]
        == [2 * r.nfe for r in single]
        == [64] * 3
    )
    assert [r.sample_nfe for r in guided] == [[64]] * 3
    assert any(
        g.samples.tolist() != s.samples.tolist() for g, s in zip(guided, single)
    )  # guidance acts


def test_rfg_takes_singles_settings():
    settings = StrategySettings(strategy="rfg", gen_length=64)
    assert (
        settings.resolved_steps,
        settings.resolved_temperature,
        settings.resolved_block_length,
        settings.resolved_decoder,
        settings.guidance,
        settings.passes_per_step,
    ) == (64, 0.0, 4, "fixed", 1.0, 2)
    assert StrategySettings(strategy="single").passes_per_step == 1


@pytest.mark.parametrize(
    "settings, says",
    [
        ({"guidance": -1.0}, r"guidance \(RFG strength w\) must be >= 0, got -1.0"),
        ({"guidance": float("inf")}, r"guidance \(RFG strength w\) must be finite"),
        ({"strategy": "rfg", "cache": "prefix"}, r"cache=prefix does not apply to strategy=rfg"),
        ({"strategy": "rfg", "vote": "temporal"}, r"vote=temporal does not apply to strategy=rfg"),
    ],
)
def test_bad_rfg_settings_are_refused_by_name(settings, says):
    with pytest.raises(ValueError, match="^" + says):
        StrategySettings(**settings)


def test_a_guided_model_decodes_rfg_only_and_rfg_needs_one(reference_folder):
    policy, reference = load_model("tiny-arith"), load_model(reference_folder)
    with pytest.raises(ValueError, match="a GuidedModel .* decodes strategy=rfg only"):
        run_strategy(
            GuidedModel(policy, reference),
            PROMPTS,
            strategy="single",
            extract=extract,
            gen_length=32,
        )
    with pytest.raises(ValueError, match="strategy=rfg needs a GuidedModel"):
        run_strategy(policy, PROMPTS, strategy="rfg", extract=extract, gen_length=32)
    with pytest.raises(ValueError, match="RFG needs a reference model"):
        GuidedModel(policy)  # no adapter to switch off


def test_a_reference_of_another_family_or_tokenizer_is_refused():
    with pytest.raises(
        ValueError,
        match=r"must share their tokenizer and mask token, but they differ: .*logits_shift",
    ):
        GuidedModel(load_model("tiny-arith"), load_model("tiny-arith-dream"))


def test_the_harness_refuses_rfg_without_a_reference_before_reading_weights(monkeypatch):
    from lm_eval_dvoting.integration import harness

    def no_model(*args, **kwargs):
        raise AssertionError("the weights were read before the bad arguments were refused")

    monkeypatch.setattr(harness, "load_model", no_model)
    with pytest.raises(ValueError) as refused:
        harness.LLaDAEvalModel(pretrained="tiny-arith", strategy="rfg", device="cpu")
    assert str(refused.value) == (
        "strategy=rfg needs a reference: give reference=<hub id | folder> (a second model "
        "of the policy's family) or peft=<adapter> (the reference is then the base model "
        "with the adapter switched off)"
    )
    with pytest.raises(ValueError, match=r"guidance must be a number, got 'strong'"):
        harness.LLaDAEvalModel(
            pretrained="tiny-arith", strategy="rfg", guidance="strong", device="cpu"
        )
    with pytest.raises(ValueError, match=r"no checkpoint folder at '/no/such/reference'"):
        harness.LLaDAEvalModel(
            pretrained="tiny-arith", strategy="rfg", reference="/no/such/reference", device="cpu"
        )
    # another family's checkpoint: refused from its config and tokenizer, before any weights
    with pytest.raises(ValueError) as refused:
        harness.LLaDAEvalModel(
            pretrained="tiny-arith", strategy="rfg", reference="tiny-arith-dream", device="cpu"
        )
    assert str(refused.value) == (
        "reference='tiny-arith-dream' does not read the policy's token ids (family 'llada' vs "
        "'dream'): RFG compares the two models' probabilities of the same tokens; give a reference "
        "of the policy's family and tokenizer"
    )


def test_switching_to_rfg_needs_a_reference_and_an_empty_run_needs_no_model():
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    lm = LLaDAEvalModel(pretrained="tiny-arith", device="cpu")
    with pytest.raises(ValueError) as refused:
        lm.use_strategy("rfg")
    assert str(refused.value) == (
        "strategy=rfg needs a reference: load the model with reference=<hub id | folder> "
        "or peft=<adapter>"
    )
    assert lm.settings.strategy == "dvoting"  # the refused switch changed nothing
    assert (
        run_strategy(
            GuidedModel(lm.model, load_model("tiny-arith")),
            PROMPTS[:0],
            strategy="rfg",
            extract=extract,
            gen_length=32,
        )
        == []
    )


def test_rfg_through_the_harness_with_a_reference_and_its_fingerprint(reference_folder):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from lm_eval_dvoting.integration import result_cache
    from lm_eval_dvoting.integration.harness import LLaDAEvalModel

    torch.set_num_threads(1)
    tasks = TaskManager(
        include_path=str(Path(__file__).resolve().parents[1] / "task_configs"),
        include_defaults=False,
    )

    def responses(lm):
        results = lm_eval.simple_evaluate(
            model=lm, tasks=["dvoting_arith"], limit=16, task_manager=tasks, log_samples=True
        )
        return results, [record["resps"][0][0] for record in results["samples"]["dvoting_arith"]]

    _, single = responses(
        LLaDAEvalModel(pretrained="tiny-arith", device="cpu", strategy="single", batch_size=8)
    )
    _, unguided = responses(
        LLaDAEvalModel(
            pretrained="tiny-arith",
            strategy="rfg",
            reference=str(reference_folder),
            guidance=0.0,
            device="cpu",
            batch_size=8,
        )
    )
    lm = LLaDAEvalModel(
        pretrained="tiny-arith",
        strategy="rfg",
        reference=str(reference_folder),
        guidance=0.5,
        device="cpu",
        batch_size=8,
    )
    results, guided = responses(lm)
    assert (
        unguided == single and guided != single
    )  # w = 0 is the policy; w = 0.5 moves some answers
    assert results["results"]["dvoting_arith"]["nfe,extract"] == 64  # 32 steps, two passes each
    assert results["config"]["dvoting"]["reference"] == str(reference_folder)
    identity = result_cache.fingerprint(lm)
    assert identity["guidance"] == 0.5 and identity["reference"].startswith("sha256:")
    assert (
        identity["reference"]
        != result_cache.fingerprint(
            LLaDAEvalModel(
                pretrained="tiny-arith", strategy="rfg", reference="tiny-arith", device="cpu"
            )
        )["reference"]
    )
    assert (
        result_cache.fingerprint(LLaDAEvalModel(pretrained="tiny-arith", device="cpu"))["reference"]
        is None
    )


def test_the_packaged_adapter_and_the_rfg_row_of_compare(tmp_path):
    """`peft=tiny-arith-lora` resolves to the shipped adapter; the rfg row of `dvoting compare`
    runs on it (two passes per step) and is refused without a reference."""
    import json

    from lm_eval_dvoting.commands import compare
    from lm_eval_dvoting.models.adapters import read_adapter

    adapter = read_adapter("tiny-arith-lora")
    assert adapter.folder.is_relative_to(Path(adapters.__file__).resolve().parents[1] / "demo")
    assert {name.rsplit(".", 1)[-1] for name in adapter.weights} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "up_proj",
    }
    with pytest.raises(SystemExit, match="the rfg row needs a reference: add reference="):
        compare.main(
            ["--strategies", "single,rfg", "--tasks", "dvoting_arith", "--out", str(tmp_path)]
        )
    assert "rfg" not in compare.parse_args([]).strategies.split(",")  # not a default row
    out = tmp_path / "cmp"
    assert (
        compare.main(
            [
                "--model_args",
                "pretrained=tiny-arith,peft=tiny-arith-lora",
                "--strategies",
                "single,rfg",
                "--tasks",
                "dvoting_arith",
                "--limit",
                "4",
                "--out",
                str(out),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    rows = {row["strategy"]: row for row in json.loads((out / "compare.json").read_text())["rows"]}
    assert rows["rfg"]["mean_nfe"] == 2 * rows["single"]["mean_nfe"] == 64


@pytest.mark.parametrize("decoder", ["entropy", "confidence"])
def test_rfg_takes_the_other_commit_rules_and_counts_both_passes(decoder, reference_folder):
    """The guided logits feed any one-sample rule; each step still costs two passes."""
    policy, reference = load_model("tiny-arith"), load_model(reference_folder)
    common = dict(extract=extract, gen_length=32, seed=1, decoder=decoder)
    single = run_strategy(policy, PROMPTS, strategy="single", **common)
    unguided = run_strategy(
        GuidedModel(policy, reference), PROMPTS, strategy="rfg", guidance=0.0, **common
    )
    assert [r.samples.tolist() for r in unguided] == [r.samples.tolist() for r in single]
    assert [r.nfe for r in unguided] == [2 * r.nfe for r in single]


# ------------------------------------------------------------------ kill tests (mutation runs)


def _dream_reference(tmp_path: Path) -> Path:
    folder = tmp_path / "dream-reference"
    shutil.copytree(PACKAGED_CHECKPOINTS["tiny-arith-dream"], folder)
    weights = load_file(str(folder / "model.safetensors"))
    generator = torch.Generator().manual_seed(4)
    save_file(
        {k: v + 0.05 * torch.randn(v.shape, generator=generator) for k, v in weights.items()},
        str(folder / "model.safetensors"),
    )
    return folder


def test_a_guided_model_reads_as_its_policy_does(reference_folder, tmp_path):
    """The decoder reads the guided model's mask and end ids, logits shift, family and maximum
    length: the policy's (the shorter length of the two)."""
    for policy, reference in (
        (load_model("tiny-arith"), load_model(reference_folder)),
        (load_model("tiny-arith-dream"), load_model(_dream_reference(tmp_path))),
    ):
        reference.max_length = policy.max_length - 7
        guided = GuidedModel(policy, reference)
        assert (
            guided.mask_token_id,
            guided.end_token_ids,
            guided.logits_shift,
            guided.family,
            guided.config,
            guided.max_length,
        ) == (
            policy.mask_token_id,
            policy.end_token_ids,
            policy.logits_shift,
            policy.family,
            policy.config,
            policy.max_length - 7,
        )
        assert guided.guidance == StrategySettings().guidance  # the same default as the strategy's


def test_guidance_zero_is_single_on_dream_and_on_a_padded_batch(tmp_path):
    """Dream reads position i from the logits at i - 1, and left-padded prompts of several
    lengths need the attention mask and positions in both passes: w = 0 still equals single."""
    from lm_eval_dvoting.demo import arith
    from lm_eval_dvoting.models.loading import load_tokenizer

    policy, reference = load_model("tiny-arith-dream"), load_model(_dream_reference(tmp_path))
    tokenizer = load_tokenizer("tiny-arith-dream")
    _, problems = arith.held_out_sets(valid_size=8)
    enc = tokenizer(
        [arith.format_prompt(p.question) for p in problems],
        add_special_tokens=False,
        padding=True,
        return_tensors="pt",
    )
    assert (enc.attention_mask == 0).any()  # prompts of several lengths, left-padded
    common = dict(extract=extract, gen_length=32, seed=2)
    single = run_strategy(policy, enc.input_ids, enc.attention_mask, strategy="single", **common)
    unguided = run_strategy(
        GuidedModel(policy, reference),
        enc.input_ids,
        enc.attention_mask,
        strategy="rfg",
        guidance=0.0,
        **common,
    )
    assert [r.samples.tolist() for r in unguided] == [r.samples.tolist() for r in single]
    assert len({tuple(r.samples[0].tolist()) for r in single}) > 1  # real answers, not padding


def test_models_of_two_dtypes_are_guided_in_float32(reference_folder):
    policy, reference = load_model("tiny-arith"), load_model(reference_folder, dtype="bfloat16")
    with torch.no_grad():
        guided = GuidedModel(policy, reference, 0.5)(PROMPTS[:1])
        assert guided.dtype == torch.float32
        assert torch.equal(
            guided, 1.5 * policy(PROMPTS[:1]).float() - 0.5 * reference(PROMPTS[:1]).float()
        )


def test_every_mismatch_of_the_pair_is_named_in_one_message(reference_folder):
    policy, reference = load_model("tiny-arith"), load_model(reference_folder)
    reference.mask_token_id, reference.end_token_ids = 3, (1, 2)
    reference.model.transformer.wte = torch.nn.Embedding(110, 128)
    with pytest.raises(ValueError) as refused:
        GuidedModel(policy, reference)
    assert str(refused.value) == (
        "the RFG policy and reference must share their tokenizer and mask token, but they differ: "
        f"mask_token_id {policy.mask_token_id!r} vs 3; end_token_ids {policy.end_token_ids!r} vs "
        "(1, 2); vocabulary size 104 vs 110. Give a reference of the policy's family and tokenizer"
    )
    with pytest.raises(ValueError) as no_reference:
        GuidedModel(policy)
    assert str(no_reference.value) == (
        "RFG needs a reference model: give reference=<hub id | folder> (a second model), or a "
        "policy with a LoRA adapter (peft=...), whose base with the adapter off is the reference"
    )


def test_a_reference_of_another_family_and_vocabulary_is_refused_with_both_differences(tmp_path):
    """Every difference is named, joined by '; ': here the family and the tokenizers' vocabularies
    (the Dream demo's tokenizer with one token added)."""
    from lm_eval_dvoting.integration import harness

    folder = tmp_path / "other-vocabulary"
    shutil.copytree(PACKAGED_CHECKPOINTS["tiny-arith-dream"], folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer["model"]["vocab"]["<|extra|>"] = len(tokenizer["model"]["vocab"])
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    with pytest.raises(ValueError) as refused:
        harness.LLaDAEvalModel(
            pretrained="tiny-arith", strategy="rfg", reference=str(folder), device="cpu"
        )
    assert str(refused.value) == (
        f"reference={str(folder)!r} does not read the policy's token ids (family 'llada' vs "
        "'dream'; the tokenizers' vocabularies): RFG compares the two models' probabilities of the "
        "same tokens; give a reference of the policy's family and tokenizer"
    )
