"""The native LLaDA / Dream modules and their loader (issue 2).

The reference numbers are `expected.safetensors` in the official-tiny fixtures, computed
by the upstream modeling code; everything else here is checked against our own
float32 forward pass of the unpadded sequence.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from lm_eval_dvoting.models.loading import CheckpointError, load_model, load_tokenizer

FAMILIES = ["llada_fixture", "dream_fixture"]


@functools.lru_cache(maxsize=None)
def _load(folder: str, dtype: str = "float32") -> nn.Module:
    return load_model(folder, device="cpu", dtype=dtype)


@pytest.fixture(params=FAMILIES, ids=["llada", "dream"])
def folder(request) -> Path:
    return request.getfixturevalue(request.param)


def _copy(folder: Path, tmp_path: Path, skip: tuple[str, ...] = ()) -> Path:
    target = tmp_path / folder.name
    target.mkdir()
    for file in folder.iterdir():
        if file.name not in skip and file.name != "expected.safetensors":
            shutil.copy(file, target / file.name)
    return target


# ------------------------------------------------------------------ upstream logits


def test_reproduces_upstream_logits(folder: Path):
    model = _load(str(folder))
    expected = load_file(str(folder / "expected.safetensors"))
    with torch.no_grad():
        plain = model(expected["input_ids"])
        masked = model(expected["input_ids"], attention_mask=expected["attention_mask"])
    assert plain.dtype == torch.float32 and plain.shape == expected["logits"].shape
    assert (plain - expected["logits"]).abs().max().item() < 1e-4
    assert (masked - expected["logits_masked"]).abs().max().item() < 1e-4
    # the mask does change row 1 (the padded one): the comparison above is not vacuous
    assert (expected["logits"][1] - expected["logits_masked"][1]).abs().max().item() > 1e-2


def test_attention_mask_really_masks(folder: Path):
    model = _load(str(folder))
    generator = torch.Generator().manual_seed(3)
    row = torch.randint(0, 240, (10,), generator=generator)
    pad = 4
    # pad with real-looking tokens: if the mask leaked, they would change the logits
    padded = torch.cat([torch.randint(0, 240, (pad,), generator=generator), row])[None]
    mask = torch.cat([torch.zeros(pad, dtype=torch.long), torch.ones(10, dtype=torch.long)])[None]
    with torch.no_grad():
        alone = model(row[None])[0]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with_positions = model(padded, attention_mask=mask, position_ids=positions)[0, pad:]
        default_positions = model(padded, attention_mask=mask)[0, pad:]
        unmasked = model(padded)[0, pad:]
    assert (with_positions - alone).abs().max().item() < 1e-4
    # rotary attention depends on relative positions only: a uniform shift changes nothing
    assert (default_positions - alone).abs().max().item() < 1e-4
    # without the mask the padding tokens are attended to and the logits move
    assert (unmasked - alone).abs().max().item() > 1e-2


def test_bfloat16_load_on_cpu(folder: Path):
    reference = _load(str(folder))
    model = _load(str(folder), "bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    ids = load_file(str(folder / "expected.safetensors"))["input_ids"]
    with torch.no_grad():
        low = model(ids).float()
        high = reference(ids)
    assert torch.isfinite(low).all()
    scale = high.abs().max().item()
    assert (low - high).abs().max().item() < 0.1 * scale
    # the predictions mostly agree
    agree = (low.argmax(-1) == high.argmax(-1)).float().mean().item()
    assert agree > 0.8


@pytest.mark.parametrize(
    "fixture, shift, end_ids, max_length",
    [("llada_fixture", 0, (241,), 128), ("dream_fixture", 1, (240,), 256)],
    ids=["llada", "dream"],
)
def test_exposed_attributes(request, fixture, shift, end_ids, max_length):
    folder = request.getfixturevalue(fixture)
    model = _load(str(folder))
    assert model.mask_token_id == 250
    assert model.end_token_ids == end_ids
    assert model.logits_shift == shift
    assert model.max_length == max_length
    assert model.family == ("llada" if shift == 0 else "dream")
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())


def test_official_ids_default_for_an_official_size_vocabulary(tiny_llada_dir: Path, tmp_path: Path):
    """Without mask_token_id, a checkpoint with the official vocabulary gets the official ids."""
    folder = tmp_path / "big-vocab"
    folder.mkdir()
    config = json.loads((tiny_llada_dir / "config.json").read_text())
    config.pop("mask_token_id")
    config.pop("eos_token_id")
    config["vocab_size"] = config["embedding_size"] = 126464
    config["d_model"], config["n_heads"], config["n_kv_heads"], config["n_layers"] = 8, 2, 2, 1
    config["mlp_hidden_size"] = 8
    (folder / "config.json").write_text(json.dumps(config))
    from lm_eval_dvoting.models.llada import LLaDAConfig, LLaDAModel

    model = LLaDAModel(LLaDAConfig.from_dict(config))
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(folder / "model.safetensors"),
    )
    loaded = load_model(folder, device="cpu")
    assert loaded.mask_token_id == 126336
    assert set(loaded.end_token_ids) == {126081, 126348}


# ------------------------------------------------------------------ sharded weights


def test_sharded_loading(llada_fixture: Path, tmp_path: Path):
    folder = _copy(llada_fixture, tmp_path, skip=("model.safetensors",))
    tensors = load_file(str(llada_fixture / "model.safetensors"))
    names = sorted(tensors)
    halves = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    weight_map = {}
    for shard, shard_names in halves.items():
        save_file({n: tensors[n] for n in shard_names}, str(folder / shard))
        weight_map.update({n: shard for n in shard_names})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
    )
    model = load_model(folder, device="cpu", dtype="float32")
    expected = load_file(str(llada_fixture / "expected.safetensors"))
    with torch.no_grad():
        logits = model(expected["input_ids"])
    assert (logits - expected["logits"]).abs().max().item() < 1e-4

    # one shard gone: the error names it
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
        load_model(folder, device="cpu")


# ------------------------------------------------------------------ bad input


def test_missing_folder(tmp_path: Path):
    missing = tmp_path / "no-such-checkpoint"
    with pytest.raises(CheckpointError, match="no-such-checkpoint"):
        load_model(missing)


def test_missing_weights(llada_fixture: Path, tmp_path: Path):
    folder = _copy(llada_fixture, tmp_path, skip=("model.safetensors",))
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model(folder, device="cpu")


def test_missing_config(llada_fixture: Path, tmp_path: Path):
    folder = _copy(llada_fixture, tmp_path, skip=("config.json",))
    with pytest.raises(CheckpointError, match="config.json"):
        load_model(folder, device="cpu")


def test_unknown_model_type(dream_fixture: Path, tmp_path: Path):
    folder = _copy(dream_fixture, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "gpt2"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"(?s)config\.json.*model_type 'gpt2'"):
        load_model(folder, device="cpu")


def test_missing_mask_token_id_for_a_small_vocabulary(llada_fixture: Path, tmp_path: Path):
    folder = _copy(llada_fixture, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config["mask_token_id"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"(?s)config\.json.*mask_token_id"):
        load_model(folder, device="cpu")


@pytest.mark.parametrize("keep", [0.5, 0.0], ids=["truncated", "empty"])
def test_corrupt_weights_name_the_file(dream_fixture: Path, tmp_path: Path, keep: float):
    folder = _copy(dream_fixture, tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*(corrupt|truncated)"):
        load_model(folder, device="cpu")


def test_weights_of_the_wrong_shape_or_names(llada_fixture: Path, tmp_path: Path):
    folder = _copy(llada_fixture, tmp_path, skip=("model.safetensors",))
    tensors = load_file(str(llada_fixture / "model.safetensors"))
    tensors["model.transformer.extra.weight"] = tensors.pop("model.transformer.ff_out.weight")
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"(?s)missing.*ff_out.*unexpected.*extra"):
        load_model(folder, device="cpu")


def test_unknown_dtype(llada_fixture: Path):
    with pytest.raises(ValueError, match=r"(?s)'float8'.*float32"):
        load_model(llada_fixture, device="cpu", dtype="float8")


# ------------------------------------------------------------------ tokenizer


def _write_dream_style_tokenizer(folder: Path) -> dict[str, int]:
    """A tiny byte-level BPE in Qwen2's file format, named as Dream names its tokenizer."""
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text(
        "#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n"
    )
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "DreamTokenizer",
                "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
                "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "added_tokens_decoder": {
                    str(vocab["<|endoftext|>"]): {
                        "content": "<|endoftext|>",
                        "special": True,
                        "lstrip": False,
                        "rstrip": False,
                        "normalized": False,
                        "single_word": False,
                    }
                },
            }
        )
    )
    (folder / "config.json").write_text(json.dumps({"model_type": "Dream"}))
    return vocab


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_load_tokenizer_falls_back_to_qwen2_for_dream(tmp_path: Path):
    from transformers import AutoTokenizer

    folder = tmp_path / "dream-tokenizer"
    vocab = _write_dream_style_tokenizer(folder)
    # transformers alone refuses: the config names remote code
    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    tokenizer = load_tokenizer(folder)
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    ids = tokenizer("cat the<|endoftext|>")["input_ids"]
    assert ids == [
        vocab["c"],
        vocab["a"],
        vocab["t"],
        vocab["Ġthe"],
        vocab["<|endoftext|>"],
    ]  # merges applied
    assert tokenizer.eos_token_id == vocab["<|endoftext|>"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "cat the"


@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers reading Dream's config.json
def test_load_tokenizer_without_tokenizer_files_says_so(folder: Path):
    # the fixtures hold no tokenizer files: an error, not an empty Qwen2 tokenizer
    with pytest.raises(CheckpointError, match="tokenizer"):
        load_tokenizer(folder)


def test_load_tokenizer_plain(tiny_llada_dir: Path):
    tokenizer = load_tokenizer(tiny_llada_dir)
    text = "12+3=15"
    assert (
        tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True).replace(" ", "")
        == text
    )


def test_prefix_cache_reproduces_the_full_pass(folder: Path):
    """Keys/values of a prefix, kept from a full pass over left-padded rows, give the
    suffix exactly the hidden states of that full pass (positions continued)."""
    from lm_eval_dvoting.models.common import PrefixCache

    model = _load(str(folder))
    ids = torch.randint(0, 240, (3, 14), generator=torch.Generator().manual_seed(3))
    attention = torch.ones_like(ids)
    attention[1, :4] = 0
    attention[2, :9] = 0  # this row's prefix is padding plus one real token
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    record = PrefixCache()
    with torch.no_grad():
        full = model.hidden_states(ids, attention, positions, cache=record)
        assert torch.equal(
            full, model.hidden_states(ids, attention, positions)
        )  # recording changes nothing
        cut = 10
        prefix = PrefixCache(
            keys=[k[:, :, :cut] for k in record.new_keys],
            values=[v[:, :, :cut] for v in record.new_values],
            mask=attention[:, :cut],
        )
        suffix = model.hidden_states(
            ids[:, cut:], attention[:, cut:], positions[:, cut:], cache=prefix
        )
        torch.testing.assert_close(suffix, full[:, cut:], rtol=0, atol=1e-5)
        # a stale prefix (other tokens) really changes the suffix: the cache is used
        other = PrefixCache(
            keys=[k.flip(2)[:, :, :cut] for k in record.new_keys],
            values=[v.flip(2)[:, :, :cut] for v in record.new_values],
            mask=attention[:, :cut],
        )
        assert not torch.allclose(
            model.hidden_states(ids[:, cut:], attention[:, cut:], positions[:, cut:], cache=other),
            full[:, cut:],
            atol=1e-4,
        )
