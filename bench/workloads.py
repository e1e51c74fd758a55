"""The models and questions the benchmarks run on.

* the demo model (`pretrained=tiny-arith`, or a folder given with `--demo`), with the
  demo tokenizer and the first questions of `demo/arith_test.jsonl`; when the folder
  has no weights yet, a random-weight LLaDA of the demo's shape (`demo/train.py`
  defaults) stands in;
* a random-weight LLaDA with LLaDA-8B's real vocabulary (126,464 rows in the output
  head, mask id 126336, EOS 126081) at a reduced depth and width, with random prompts;
  and one at LLaDA-8B's real width (4096, 32 heads, MLP 12,288) and a reduced depth.
  Its "answer" is the first generated token: random weights give no arithmetic, but
  the answers still agree or disagree, which is all the strategies' control flow needs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from lm_eval_dvoting.core.answers import extract_answer
from lm_eval_dvoting.demo import arith
from lm_eval_dvoting.models.llada import LLaDAConfig, LLaDAModel

LLADA_VOCAB = 126_464
LLADA_MASK_ID = 126_336
LLADA_EOS_ID = 126_081


@dataclass
class Workload:
    name: str
    model: torch.nn.Module
    prompts: list[torch.Tensor]
    extract: Callable[[torch.Tensor], Any]
    gen_length: int
    description: str
    targets: list[Any] | None = None  # the right answer per prompt, when there is one


def _finish(model: LLaDAModel, config: dict[str, Any]) -> LLaDAModel:
    model.eval().requires_grad_(False)
    model.mask_token_id = int(config["mask_token_id"])
    model.end_token_ids = (int(config["eos_token_id"]),)
    model.max_length = int(config["max_sequence_length"])
    model.family = "llada"
    return model


def demo_config() -> dict[str, Any]:
    """The config `demo/train.py` writes with its default arguments."""
    from lm_eval_dvoting.demo import train
    from lm_eval_dvoting.demo.tokenizer import build_tokenizer

    return train.model_config(train.parse_args([]), build_tokenizer())


def random_llada(
    config: dict[str, Any],
    seed: int = 0,
    std: float = 0.02,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> LLaDAModel:
    """A LLaDA of `config` with N(0, std) weights, built on `device` in `dtype` (no float32 copy
    first)."""
    torch.manual_seed(seed)
    with torch.device("meta"):  # no default initialisation: at LLaDA-8B's width it costs seconds
        model = LLaDAModel(LLaDAConfig.from_dict(config))
    model = model.to(dtype).to_empty(device=device)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, std)
            else:  # the norms' weights
                p.fill_(1.0)
    return _finish(model, config)


def demo_model(path: str) -> tuple[torch.nn.Module, str]:
    """The demo checkpoint at `path` (a name or a folder) and its description; a random-weight
    LLaDA of the demo's shape where no weights are found."""
    from lm_eval_dvoting.models.loading import load_model, resolve_checkpoint

    try:
        folder = resolve_checkpoint(path)
        has_weights = any(folder.glob("*.safetensors"))
    except Exception:  # noqa: BLE001 - any unreadable folder means: no trained demo yet
        folder, has_weights = Path(path), False
    if not has_weights:
        description = f"random-weight LLaDA of the demo's shape (no weights found at `{path}`)"
        return random_llada(demo_config()), description
    model = load_model(str(folder), device="cpu", dtype="float32")
    notes = folder / "TRAINING.md"
    trained = notes.exists() and "placeholder" not in notes.read_text()
    description = (
        f"demo checkpoint `{path}` "
        f"({folder}){'' if trained else ', TRAINING.md still a placeholder'}"
    )
    return model, description


def demo_workload(path: str, questions: int, gen_length: int = 32) -> Workload:
    """The demo model and the first `questions` test problems, answers read as the
    `dvoting_arith` task reads them (text up to the end token, then the number)."""
    from lm_eval_dvoting.demo.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    model, description = demo_model(path)
    cfg = model.config
    description += (
        f"; LLaDA d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads, "
        f"MLP {cfg.mlp_hidden_size}, vocabulary {cfg.padded_vocab}"
    )
    rows = [json.loads(line) for line in arith.TEST_FILE.read_text().splitlines()[:questions]]
    prompts = [
        torch.tensor(
            tokenizer(arith.format_prompt(r["question"]), add_special_tokens=False).input_ids
        )
        for r in rows
    ]
    eos = tokenizer.eos_token_id

    def extract(tokens: torch.Tensor) -> Any:
        ids = tokens.tolist()
        if eos in ids:
            ids = ids[: ids.index(eos)]
        return extract_answer(tokenizer.decode(ids), "number")

    targets = [str(r["answer"]) for r in rows]
    return Workload("demo", model, prompts, extract, gen_length, description, targets)


def real_vocab_config(
    d_model: int = 256, n_layers: int = 2, n_heads: int = 4, mlp: int = 768
) -> dict[str, Any]:
    return {
        "model_type": "llada",
        "d_model": d_model,
        "n_heads": n_heads,
        "n_kv_heads": n_heads,
        "n_layers": n_layers,
        "mlp_hidden_size": mlp,
        "vocab_size": LLADA_VOCAB,
        "embedding_size": LLADA_VOCAB,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "weight_tying": False,
        "max_sequence_length": 4096,
        "mask_token_id": LLADA_MASK_ID,
        "eos_token_id": LLADA_EOS_ID,
    }


def real_vocab_workload(
    questions: int,
    gen_length: int = 64,
    prompt_length: int = 48,
    d_model: int = 256,
    n_layers: int = 2,
    n_heads: int = 4,
    name: str = "real-vocab",
    std: float = 0.05,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Workload:
    config = real_vocab_config(d_model=d_model, n_layers=n_layers, n_heads=n_heads, mlp=3 * d_model)
    model = random_llada(config, seed=1, std=std, device=device, dtype=dtype)
    generator = torch.Generator().manual_seed(2)
    prompts = [
        torch.randint(0, 126_000, (prompt_length,), generator=generator) for _ in range(questions)
    ]

    def extract(tokens: torch.Tensor) -> Any:
        return int(tokens[0])

    description = (
        f"random-weight LLaDA, real vocabulary {LLADA_VOCAB:,}, d_model {d_model}, {n_layers} "
        f"layers, {n_heads} heads, MLP {3 * d_model}; random prompts of {prompt_length} tokens; "
        "answer = first generated token"
    )
    return Workload(name, model, prompts, extract, gen_length, description)


def real_shape_workload(
    args: Any, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> Workload:
    """The real-shape proxy of the suites' `add_real_shape_arguments` flags: one random prompt
    of `--prompt-length`, LLaDA-8B's vocabulary, `--width`, `--layers` and `--heads`."""
    return real_vocab_workload(
        1,
        args.gen_length,
        args.prompt_length,
        d_model=args.width,
        n_layers=args.layers,
        n_heads=args.heads,
        name="real-shape",
        std=0.02,
        device=device,
        dtype=dtype,
    )
