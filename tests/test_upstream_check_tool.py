"""tools/upstream_check.py, the parts that run without the upstream code: what it compares
and how it judges, how it reads the files out of the mirrors, and its refusals. (The upstream
side needs transformers 4.57 and fetched mirrors; docs/MODELS.md gives the command and what
it printed.)"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lm_eval_dvoting.models.loading import load_model

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "official-tiny"


def _load_tool():
    spec = importlib.util.spec_from_file_location(
        "upstream_check", ROOT / "tools" / "upstream_check.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["upstream_check"] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


tool = _load_tool()


def _our_logits() -> dict[str, torch.Tensor]:
    """Every case's logits from our own models, keyed as the upstream side keys them."""
    found = {}
    for up in tool.UPSTREAM:
        expected = load_file(str(FIXTURES / up.folder / "expected.safetensors"))
        for dtype in tool.DTYPES:
            model = load_model(str(FIXTURES / up.folder), device="cpu", dtype=dtype)
            with torch.no_grad():
                for case in up.cases:
                    found[f"{up.family}/{dtype}/{case}"] = tool.our_case(model, expected, case)
    return found


def test_compare_flags_one_float32_ulp_in_one_case_and_nothing_else():
    """One float32 ulp, which a tolerance such as allclose's lets through: the claim is bits."""
    theirs = _our_logits()
    rows = tool.compare(FIXTURES, theirs)
    assert len(rows) == 22 and all(row["bit_for_bit"] and row["max_abs"] == 0 for row in rows)
    bent = theirs["dream/float32/padded"].clone()
    bent[1, 5, 7] = torch.nextafter(bent[1, 5, 7], torch.tensor(1e9, dtype=bent.dtype))
    rows = tool.compare(FIXTURES, {**theirs, "dream/float32/padded": bent})
    differing = [(r["family"], r["dtype"], r["case"]) for r in rows if not r["bit_for_bit"]]
    assert differing == [("dream", "float32", "padded")]
    assert "DIFFERS" in tool.verdict_line(next(r for r in rows if not r["bit_for_bit"]))


def test_the_cases_differ_from_each_other():
    """Each masked case really changes the logits: a case that gave `plain`'s would pass while
    testing nothing of the mask."""
    logits = _our_logits()
    for key, value in logits.items():
        family, dtype, case = key.split("/")
        if case != "plain":
            assert not torch.equal(value, logits[f"{family}/{dtype}/plain"]), key


def test_the_model_sources_are_those_the_fixtures_name():
    """The four fixture families' modeling files are at the commits the fixtures' README
    names; LLaDA2.1's file (dllm's cleaned copy) runs on the LLaDA2 fixture."""
    readme = (FIXTURES / "README.md").read_text()
    by_family = {up.family: up for up in tool.UPSTREAM}
    for family in ("llada", "dream", "llada_moe", "llada2"):
        up = by_family[family]
        assert up.folder == family and up.modeling.startswith("modeling_")
        assert all(commit in readme for _, path, commit in up.files if "modeling_" in path)
    llada = [path for repo, path, _ in by_family["llada"].files if repo == "ML-GSAI/LLaDA"]
    assert llada == ["generate.py"]
    assert by_family["llada21"].folder == "llada2"
    assert {commit for _, _, commit in by_family["llada21"].files} == {tool.DLLM_21}


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=True)
    return done.stdout.decode().strip()


def test_export_copies_each_file_as_at_its_commit(tmp_path: Path, monkeypatch):
    repo = tmp_path / "mirrors" / "someone+models" / "repo"
    (repo / "models").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "models" / "modeling_x.py").write_text("FIRST = 1\n")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "models" / "modeling_x.py").write_text("SECOND = 2\n")  # later: not what is asked
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two")
    up = tool.Upstream("fam", (("someone/models", "models/modeling_x.py", first),), "X", ("plain",))
    monkeypatch.setattr(tool, "UPSTREAM", (up,))
    record = tool.export(tmp_path / "mirrors", tmp_path / "packages")
    assert (tmp_path / "packages" / "fam" / "modeling_x.py").read_text() == "FIRST = 1\n"
    assert (tmp_path / "packages" / "fam" / "__init__.py").exists()
    blob = _git(repo, "rev-parse", f"{first}:models/modeling_x.py")
    assert record == {
        "fam": [
            {
                "repo": "someone/models",
                "commit": first,
                "path": "models/modeling_x.py",
                "blob": blob,
            }
        ]
    }


def test_a_missing_mirror_is_refused_with_what_to_fetch(tmp_path: Path):
    with pytest.raises(SystemExit) as refused:
        tool.export(tmp_path, tmp_path / "packages")
    assert "github:" in str(refused.value) and str(tmp_path) in str(refused.value)


def test_an_upstream_path_without_transformers_is_refused(tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as refused:
        tool.arguments(["--upstream-path", str(tmp_path)])
    assert refused.value.code == 2
    message = capsys.readouterr().err
    assert "--upstream-path" in message and str(tmp_path) in message and "4.57.6" in message
    (tmp_path / "transformers").mkdir()
    assert tool.arguments(["--upstream-path", str(tmp_path)]).upstream_path == tmp_path


# ------------------------------------------------------------------ the decodes


def _case(tokens: list[int], leftmost: list[int], passes: int = 3) -> dict:
    """A decode case as the upstream side returns it (both runs with `passes` passes)."""
    case = tool._case("llada", "low_confidence", 3, 3, 3, 0)
    runs = {"tokens": tokens, "passes": passes, "tokens_leftmost": leftmost}
    return {**case, **runs, "passes_leftmost": passes}


def test_decode_verdicts_excuse_a_difference_only_where_the_leftmost_run_agrees():
    theirs = [
        _case([1, 2, 3], [1, 2, 3]),
        _case([1, 2, 3], [3, 2, 1]),  # a tie decided, but ours happens to be upstream's own
        _case([1, 2, 3], [3, 2, 1]),
        _case([1, 2, 3], [1, 2, 3]),  # no tie decided: any difference fails
        _case([1, 2, 3], [3, 2, 1]),  # neither run
        _case([1, 2, 3], [1, 2, 3], passes=4),  # the tokens, but not the forward passes
    ]
    ours = [[1, 2, 3], [1, 2, 3], [3, 2, 1], [3, 2, 1], [2, 2, 2], [1, 2, 3]]
    rows = tool.decode_verdicts(theirs, [(tokens, 3) for tokens in ours])
    assert [row["verdict"] for row in rows] == [
        "same", "same", "same, ties leftmost", "differs", "differs", "differs",
    ]  # fmt: skip
    lines = tool.decode_lines(rows)
    assert lines[0].endswith("6 cases, 2 same, 1 same with ties leftmost, 3 differ")
    assert sum(line.startswith("  DIFFERS") for line in lines) == 3


def test_sampler_torch_changes_only_what_it_is_asked_to():
    values = torch.tensor([[0.5, 0.9, 0.5, 0.9, 0.1, 0.5]])
    leftmost = tool.SamplerTorch(torch, leftmost=True)
    top, index = leftmost.topk(values, 4)
    assert index.tolist() == [[1, 3, 0, 2]] and index.is_contiguous()
    assert torch.equal(top, torch.topk(values, 4).values)
    assert leftmost.topk(values[0], k=torch.tensor(3))[1].tolist() == [1, 3, 0]  # LLaDA's call
    plain = tool.SamplerTorch(torch)
    assert torch.equal(plain.topk(values, 4).indices, torch.topk(values, 4).indices)
    assert plain.zeros is torch.zeros and plain.bfloat16 is torch.bfloat16
    argmax = tool.SamplerTorch(torch, changes=("argmax_draws",))
    probs = torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]])
    assert argmax.multinomial(probs, num_samples=1).tolist() == [[1], [0]]
    assert argmax.bfloat16 is torch.bfloat16  # only what is asked for
    masks = tool.SamplerTorch(torch, changes=("float32_masks",))
    assert masks.bfloat16 is torch.float32 and masks.multinomial is torch.multinomial


def test_the_first_run_is_upstreams_own_and_the_second_breaks_ties_leftmost():
    """`LoadedSampler.runs`: the first run sees the module's own torch (with the sampler's
    changes only), the second the leftmost topk too; each run's passes counted from 0;
    torch put back."""
    module, passes, seen = types.SimpleNamespace(torch=torch), [7], []

    def run(model, module, case, mask):
        seen.append(module.torch)
        passes[0] += len(seen)
        return [len(seen)]

    plain = tool.LoadedSampler("model", module, tool.Sampler("m", run), passes, 250)
    found = plain.runs(tool._case("dream", "entropy", 3, 3, 3, 0))
    assert seen[0] is torch and isinstance(seen[1], tool.SamplerTorch)
    assert seen[1].topk(torch.tensor([1.0, 1.0]), 1)[1].tolist() == [0]  # leftmost
    assert found == {"tokens": [1], "passes": 1, "tokens_leftmost": [2], "passes_leftmost": 2}
    seen.clear()
    changed = tool.Sampler("m", run, ("argmax_draws", "float32_masks"))
    tool.LoadedSampler("model", module, changed, passes, 250).runs(tool._case("x", "y", 3, 3, 3, 0))
    own, leftmost = seen
    assert own.bfloat16 is torch.float32 and leftmost.bfloat16 is torch.float32
    tied = torch.tensor([[0.5, 0.9, 0.9]])
    assert torch.equal(own.topk(tied, 1)[1], torch.topk(tied, 1)[1])  # torch's own there
    assert leftmost.topk(tied, 1)[1].tolist() == [[1]]
    assert module.torch is torch


def test_each_family_runs_with_the_changes_the_docs_name():
    """The table the docs describe: which family's module gets which change."""
    assert tool.SAMPLERS["llada2"].changes == ("argmax_draws", "float32_masks")
    assert tool.SAMPLERS["llada21"].changes == ("float32_masks",)  # its T=0 is the argmax
    assert all(not tool.SAMPLERS[f].changes for f in ("llada", "llada_moe", "dream"))
    assert set(tool.SAMPLERS) == {up.family for up in tool.UPSTREAM}


class _Recorder:
    """A stand-in for an upstream model and sampler module: records each call's arguments
    and answers the prompt followed by the answer length's tokens."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []
        self.config = types.SimpleNamespace(eos_token_id=249)

    def _answer(self, prompt: torch.Tensor, length: int) -> torch.Tensor:
        return torch.cat([prompt, torch.arange(length)[None]], dim=1)

    def generate(self, *args, **kwargs):  # LLaDA's generate.py (model first) or LLaDA2's
        self.calls.append((args, kwargs))
        prompt = args[1] if len(args) > 1 else args[0]
        answer = self._answer(prompt, kwargs["gen_length"])
        return answer if len(args) > 1 else answer[:, prompt.shape[1] :]

    def diffusion_generate(self, prompt, generation_config):
        self.calls.append(((prompt,), {"generation_config": generation_config}))
        sequences = self._answer(prompt, generation_config.max_new_tokens)
        return types.SimpleNamespace(sequences=sequences)

    def DreamGenerationConfig(self, **kwargs):  # noqa: N802 (the module's class name)
        return types.SimpleNamespace(**kwargs)


def test_the_upstream_samplers_get_each_cases_settings():
    """What each family's own sampler is called with: the case's settings, the mask id,
    temperature 0, LLaDA2.1's early stop; planted swaps of two settings would fail here."""
    up = _Recorder()
    llada = tool._case("llada", "low_confidence", 10, 5, 4, 1)
    assert tool.llada_run("model", up, llada, 250) == list(range(10))
    _, kwargs = up.calls[-1]
    assert kwargs == {"steps": 4, "gen_length": 10, "block_length": 5, "temperature": 0.0,
                      "mask_id": 250}  # fmt: skip
    dream = tool._case("dream", "topk_margin", 6, 6, 3, 0, top_p=0.9, top_k=2)
    assert tool.dream_run(up, up, dream, 250) == list(range(6))
    config = vars(up.calls[-1][1]["generation_config"])
    assert {k: config[k] for k in ("steps", "alg", "top_p", "top_k", "alg_temp", "temperature",
            "mask_token_id", "eps")} == {"steps": 3, "alg": "topk_margin", "top_p": 0.9,
            "top_k": 2, "alg_temp": 0.0, "temperature": 0.0, "mask_token_id": 250,
            "eps": tool.EPS}  # fmt: skip
    two = tool._case("llada2", "threshold", 8, 4, None, 0, threshold=0.3, cache="none")
    assert tool.llada2_run(up, up, two, 250) == list(range(8))
    _, kwargs = up.calls[-1]
    assert (kwargs["threshold"], kwargs["steps"], kwargs["block_length"]) == (0.3, 32, 4)
    assert (kwargs["temperature"], kwargs["eos_id"], kwargs["mask_id"]) == (0.0, 249, 250)
    joint = tool._case("llada21", "joint", 8, 4, None, 0, threshold=0.7, cache="none",
                       editing_threshold=0.5, max_post_steps=2)  # fmt: skip
    tool.llada21_run(up, up, joint, 250)
    _, kwargs = up.calls[-1]
    assert (kwargs["threshold"], kwargs["editing_threshold"], kwargs["max_post_steps"]) == (
        0.7, 0.5, 2,
    )  # fmt: skip
    assert kwargs["eos_early_stop"] is True and (kwargs["eos_id"], kwargs["mask_id"]) == (249, 250)


def test_llada21_settings_hold_the_plugins_presets():
    """The card's Quality and Speed modes as the plugin's `quality`/`speed` rules define them:
    a swap of two numbers on both sides would pass the comparison, not this."""
    from lm_eval_dvoting.core.settings import block_decodings

    presets = block_decodings()
    settings = {(t, edit) for t, edit, _ in tool.LLADA21_SETTINGS}
    assert {presets["quality"], presets["speed"]} <= settings
    assert (presets["threshold"][0], None) in {(t, None) for t, _ in tool.LLADA2_SETTINGS}


def test_our_settings_carry_each_cases_settings():
    dream = tool._case("dream", "topk_margin", 6, 6, 4, 1, top_p=0.9, top_k=2)
    settings = tool.our_settings(dream)
    assert (settings["rule"], settings["dream"].alg, settings["top_p"], settings["top_k"]) == (
        "dream", "topk_margin", 0.9, 2,
    )  # fmt: skip
    assert (settings["gen_length"], settings["block_length"], settings["steps"]) == (6, 6, 4)
    for cache in ("none", "block"):
        case = tool._case("llada2", "threshold", 8, 4, 3, 0, threshold=0.3, cache=cache)
        settings = tool.our_settings(case)
        assert settings["cache"] == cache and settings["block"].threshold == 0.3
        assert settings["block"].steps == 3 and "steps" not in settings
        assert settings["block"].editing_threshold is None  # LLaDA2.0: no editing
    joint = tool._case("llada21", "joint", 8, 4, None, 0, threshold=0.5, cache="block",
                       editing_threshold=0.0, max_post_steps=2)  # fmt: skip
    block = tool.our_settings(joint)["block"]
    assert (block.threshold, block.editing_threshold, block.max_post_steps) == (0.5, 0.0, 2)


def test_main_exits_1_when_one_decode_differs(tmp_path: Path, monkeypatch, capsys):
    """The whole flow with both sides stood in for: 0 when everything agrees, 1 when one
    decode does not (or one logits case)."""
    (tmp_path / "transformers").mkdir()
    case = _case([1, 2], [1, 2])

    def child(args, packages, out):
        (out / "decodes.json").write_text(json.dumps([case]))
        (out / "versions.json").write_text(json.dumps({"transformers": "4.57.6", "torch": "x"}))
        save_file({"a": torch.zeros(1)}, str(out / "logits.safetensors"))

    logits = [{"family": "f", "dtype": "d", "case": "c", "bit_for_bit": True, "max_abs": 0.0}]
    monkeypatch.setattr(tool, "export", lambda mirrors, dest: {})
    monkeypatch.setattr(tool, "run_child", child)
    monkeypatch.setattr(tool, "compare", lambda fixtures, theirs: logits)
    argv = ["--upstream-path", str(tmp_path)]
    monkeypatch.setattr(tool, "our_decodes", lambda fixtures: [([1, 2], 3)])
    assert tool.main(argv) == 0 and "transformers 4.57.6" in capsys.readouterr().out
    monkeypatch.setattr(tool, "our_decodes", lambda fixtures: [([2, 1], 3)])
    assert tool.main(argv) == 1
    monkeypatch.setattr(tool, "our_decodes", lambda fixtures: [([1, 2], 3)])
    logits[0]["bit_for_bit"] = False
    assert tool.main(argv) == 1


def test_the_logits_verdict_is_on_bits():
    """-0.0 and 0.0 are equal values but other bits; the dtypes are recorded."""
    zero, negative = torch.zeros(2), torch.tensor([0.0, -0.0])
    assert tool._row("f", "d", "c", zero, {"f/d/c": zero.bfloat16()})["bit_for_bit"]
    row = tool._row("f", "d", "c", zero, {"f/d/c": negative})
    assert not row["bit_for_bit"] and row["max_abs"] == 0.0
    assert tool._row("f", "d", "c", zero, {"f/d/c": zero.bfloat16()})["dtypes"] == [
        "torch.float32", "torch.bfloat16",
    ]  # fmt: skip


def test_sampler_torch_is_swapped_in_and_put_back():
    module = types.SimpleNamespace(torch=torch)
    with pytest.raises(RuntimeError):
        with tool.sampler_torch(module, True, ()):
            assert isinstance(module.torch, tool.SamplerTorch)
            raise RuntimeError
    assert module.torch is torch


def test_the_wrapped_forward_suppresses_the_mask_and_counts():
    class Out:
        def __init__(self, logits):
            self.logits = logits

    class Model:
        def forward(self, x):
            return Out(torch.zeros(1, len(x), 5))

    model = Model()
    passes = tool.suppressed_and_counted(model, 4)
    first, _ = model.forward([1, 2]), model.forward([3])
    assert passes == [2] and torch.isinf(first.logits[..., 4]).all()
    assert not torch.isinf(first.logits[..., :4]).any()


def test_our_decodes_follow_the_cases_in_order(monkeypatch):
    monkeypatch.setattr(tool, "DREAM_SCHEDULES", ((4, 4),))
    monkeypatch.setattr(tool, "LLADA_SCHEDULES", ((8, 4, 4), (9, 9, 2)))
    monkeypatch.setattr(tool, "LLADA2_SETTINGS", ((0.95, None),))
    monkeypatch.setattr(tool, "LLADA21_SETTINGS", ((0.5, 0.0, 16),))
    monkeypatch.setattr(tool, "LLADA2_SHAPES", ((5, 4), (16, 4)))
    monkeypatch.setattr(tool, "DECODE_PROMPTS", 2)
    cases, ours = tool.decode_cases(), tool.our_decodes(FIXTURES)
    assert len(cases) == len(ours) == 3 * 3 * 2 + 2 * 2 * 2 + 2 * (2 * 2 * 3)
    cut = 0
    for case, (tokens, passes) in zip(cases, ours):
        assert 250 not in tokens  # the fixtures' mask id is never committed
        if case["family"] in ("llada2", "llada21"):  # cut after the first end token, as upstream
            assert 249 not in tokens[:-1] and len(tokens) <= case["length"]
            cut += len(tokens) < case["length"]
        else:
            assert len(tokens) == case["length"] and passes == case["steps"]
    assert len({tuple(tokens) for tokens, _ in ours}) > 2  # not one answer for every case
    assert cut == 4  # END_PROMPTS' 16-token answers (2.0, 2.1), both caches: the stop is tested
