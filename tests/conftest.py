"""Shared test helpers: the project's test fixtures, where ../shared lies, and skipping
cleanly without it.

The official-format checkpoints and their expected logits (tests/fixtures/official-tiny,
about 2 MB) ship with the project, so every fidelity test runs in a plain clone. Only
tests that need the real benchmark files (../shared/data) skip without ../shared.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# Tiny random checkpoints in the official LLaDA, Dream, LLaDA-MoE and LLaDA2 formats with
# the logits the upstream code computed for them (see its README.md): part of the project.
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "official-tiny"
# The benchmark data live beside the checkout, not in it; a user's clone has no such
# folder, and the tests that need it skip with this reason. DVOTING_SHARED_DIR names it
# when the tests run from a copy elsewhere (tools/mutation.py runs them in mutants/).
SHARED = Path(os.environ.get("DVOTING_SHARED_DIR") or REPO_ROOT.parent / "shared")
DATA = SHARED / "data"
NO_SHARED_REASON = (
    f"needs the real benchmark data files in {DATA} (the project's shared folder, "
    "absent in a plain clone)"
)


def require_shared(path: Path) -> Path:
    """Return `path` inside ../shared, or skip the calling test if it is absent."""
    if not path.exists():
        pytest.skip(NO_SHARED_REASON)
    return path


def fixture_folder(family: str) -> Path:
    """The project's official-format checkpoint folder of `family`; missing is an error."""
    folder = FIXTURES / family
    if not (folder / "model.safetensors").exists():
        # never a skip: these ship with the project, so a missing one is a broken checkout
        raise FileNotFoundError(
            f"test fixture {folder} is missing; it is part of the project "
            "(git checkout tests/fixtures)"
        )
    return folder


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under a mutant of tools/mutation.py (mutmut), run the quickest tests first.

    mutmut runs a mutant's covering tests with `-x` in the order of a Python set, so a
    mutant that a 50 ms test kills could first wait for a 40 s CLI test; fastest first, a
    killed mutant costs about its cheapest failing test. mutmut's recorded durations are in
    mutmut-stats.json in its working folder (mutants/). The suite's own order is untouched.
    """
    if "__mutmut_" not in os.environ.get("MUTANT_UNDER_TEST", ""):
        return
    try:
        durations = json.loads(Path("mutmut-stats.json").read_text())["duration_by_test"]
    except (OSError, ValueError, KeyError):
        return  # no stats: keep mutmut's order
    items.sort(key=lambda item: durations.get(item.nodeid, float("inf")))


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """Tiny models gain nothing from threads, and on a shared 2-core machine
    oversubscribed threads make their matmuls many times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def llada_fixture() -> Path:
    return fixture_folder("llada")


@pytest.fixture
def dream_fixture() -> Path:
    return fixture_folder("dream")


@pytest.fixture
def llada_moe_fixture() -> Path:
    return fixture_folder("llada_moe")


@pytest.fixture
def llada2_fixture() -> Path:
    return fixture_folder("llada2")


@pytest.fixture(params=["llada_fixture", "dream_fixture"], ids=["llada", "dream"])
def model(request, monkeypatch):
    """The tiny official-format LLaDA, then Dream, in float32, its `cached_steps` restored
    after the test (a module with another `model` fixture uses its own)."""
    from references import load_float32

    loaded = load_float32(str(request.getfixturevalue(request.param)))
    monkeypatch.setattr(loaded, "cached_steps", "auto", raising=False)
    return loaded


@pytest.fixture
def data_dir() -> Path:
    return require_shared(DATA)


def _write_random_llada(folder: Path, seed: int = 0) -> Path:
    """A tiny random-weight LLaDA checkpoint with the demo's character tokenizer."""
    import json

    import torch
    from safetensors.torch import save_file

    from lm_eval_dvoting.demo.tokenizer import EOS, MASK, build_tokenizer
    from lm_eval_dvoting.models.llada import LLaDAConfig, LLaDAModel

    tokenizer = build_tokenizer()
    vocab = len(tokenizer)
    config = {
        "model_type": "llada",
        "d_model": 32,
        "n_heads": 4,
        "n_kv_heads": 4,
        "n_layers": 2,
        "mlp_hidden_size": 64,
        "vocab_size": vocab,
        "embedding_size": vocab,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "weight_tying": False,
        "max_sequence_length": 256,
        "mask_token_id": tokenizer.convert_tokens_to_ids(MASK),
        "eos_token_id": tokenizer.convert_tokens_to_ids(EOS),
    }
    torch.manual_seed(seed)
    model = LLaDAModel(LLaDAConfig.from_dict(config))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(folder / "model.safetensors"),
    )
    (folder / "config.json").write_text(json.dumps(config))
    tokenizer.save_pretrained(str(folder))
    return folder


def _write_random_llada2(folder: Path, seed: int = 0) -> Path:
    """A tiny random-weight LLaDA2 checkpoint (the official-format fixture's config, the
    demo's character tokenizer and its ids) for end-to-end runs through lm-eval."""
    import json

    import torch
    from safetensors.torch import save_file

    from lm_eval_dvoting.demo.tokenizer import EOS, MASK, build_tokenizer
    from lm_eval_dvoting.models.llada2 import LLaDA2Config, LLaDA2Model

    tokenizer = build_tokenizer()
    config = json.loads((fixture_folder("llada2") / "config.json").read_text())
    config.update(
        vocab_size=len(tokenizer),
        mask_token_id=tokenizer.convert_tokens_to_ids(MASK),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        pad_token_id=tokenizer.convert_tokens_to_ids(EOS),
        max_position_embeddings=512,
    )
    torch.manual_seed(seed)
    model = LLaDA2Model(LLaDA2Config.from_dict(config))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 0.3) if "norm" not in name else p.fill_(1.0)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    tokenizer.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def tiny_llada2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny LLaDA2-format checkpoint folder with a tokenizer."""
    return _write_random_llada2(tmp_path_factory.mktemp("tiny-llada2"))


@pytest.fixture(scope="session")
def tiny_llada_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny LLaDA-format checkpoint folder with a tokenizer (needs no ../shared)."""
    return _write_random_llada(tmp_path_factory.mktemp("tiny-llada"))
