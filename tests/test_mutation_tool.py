"""tools/mutation.py's tracked results (tools/mutation_state/): what a new clone resumes from."""

from __future__ import annotations

import importlib.util
import json
import sys
import types

import pytest
from conftest import REPO_ROOT


def _load_tool() -> types.ModuleType:
    """tools/mutation.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location(
        "mutation_tool", REPO_ROOT / "tools" / "mutation.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tool(monkeypatch, tmp_path):
    module = _load_tool()
    monkeypatch.setattr(module, "STATE", tmp_path / "state")
    return module


def _meta(codes: dict[str, int | None]) -> dict:
    return {
        "exit_code_by_key": codes,
        "hash_by_function_name": {"f": "abc"},
        "durations_by_key": {},
        "estimated_durations_by_key": {},
        "type_check_error_by_key": {},
    }


def test_results_saved_from_a_run_seed_the_next_clones_first_run(tool, tmp_path, monkeypatch):
    # mutmut is an optional extra (not installed by CI): its exit-code table, as far as used here
    statuses = {1: "killed", 0: "survived", 36: "timeout", None: "not checked"}
    monkeypatch.setitem(sys.modules, "mutmut", types.ModuleType("mutmut"))
    monkeypatch.setitem(
        sys.modules, "mutmut.stats", types.SimpleNamespace(status_by_exit_code=statuses)
    )
    run = tmp_path / "mutants"
    meta = run / "lm_eval_dvoting" / "core" / "decoding" / "rules.py.meta"
    meta.parent.mkdir(parents=True)
    codes = {
        "lm_eval_dvoting.core.decoding.rules.x_f__mutmut_1": 1,
        "lm_eval_dvoting.core.decoding.rules.x_f__mutmut_2": 0,
        "lm_eval_dvoting.core.decoding.rules.x_f__mutmut_3": None,
        "lm_eval_dvoting.core.decoding.rules.x_f__mutmut_4": 36,
    }
    meta.write_text(json.dumps(_meta(codes)))
    assert not tool.save_state("answers", run)  # no results of that module there: nothing saved
    assert tool.save_state("decoding.rules", run)
    fresh = tmp_path / "fresh"
    tool._seed_from_state("decoding.rules", fresh)
    seeded = json.loads((fresh / "lm_eval_dvoting/core/decoding/rules.py.meta").read_text())
    assert seeded == _meta(codes)
    # the survivors to test again: recorded and not killed (untested ones are not survivors)
    assert tool._survivors(fresh, "decoding.rules") == [
        "lm_eval_dvoting.core.decoding.rules.x_f__mutmut_2"
    ]


def test_the_tracked_results_are_mutmuts_meta_files_of_known_modules():
    module = _load_tool()
    tracked = sorted(module.STATE.glob("*.meta.json"))
    assert tracked, f"no tracked mutation results in {module.STATE}"
    for path in tracked:
        name = path.name.removesuffix(".meta.json")
        assert name in module.MODULES, path
        meta = json.loads(path.read_text())
        # mutmut names a mutant after the mutated file's module: lm_eval_dvoting.core.answers.
        prefix = module._source(name).removesuffix(".py").replace("/", ".") + "."
        assert meta["exit_code_by_key"] and all(
            key.startswith(prefix) for key in meta["exit_code_by_key"]
        ), path


def test_every_module_names_one_file_of_the_package():
    """The modules are named as before the package's folders (core/, integration/): each
    must still resolve to its file, or mutmut is pointed at a file that does not exist."""
    tool = _load_tool()
    for module in tool.MODULES:
        source = tool._source(module)
        assert (REPO_ROOT / source).is_file(), (module, source)
        assert source.endswith("/" + module.replace(".", "/") + ".py"), (module, source)
    assert tool._source("harness") == "lm_eval_dvoting/integration/harness.py"
    assert tool._source("decoding.rules") == "lm_eval_dvoting/core/decoding/rules.py"
    with pytest.raises(SystemExit, match="'no_such_module': 0 files of lm_eval_dvoting"):
        tool._source("no_such_module")


_DIFF = """--- lm_eval_dvoting/core/strategies.py
+++ lm_eval_dvoting/core/strategies.py
@@ -6,7 +6,7 @@
     seeds: Sequence[int],
-    max_rows: int = 16,
+    max_rows: int = 17,
 ) -> list[StrategyResult]:
"""
_NAME = "lm_eval_dvoting.core.strategies.x_decode_questions__mutmut_1"


def _summary(diff: str) -> dict:
    return {
        "module": "strategies",
        "status": {_NAME: "survived", _NAME[:-1] + "2": "killed"},
        "diffs": {_NAME: diff},
    }


def test_a_diff_pin_ignores_where_the_mutation_is_but_not_what_it_does():
    tool = _load_tool()
    moved = _DIFF.replace("@@ -6,7 +6,7 @@", "@@ -60,7 +60,7 @@")
    other = _DIFF.replace("max_rows: int = 17", "max_rows: int = 15")
    assert tool.diff_pin(moved) == tool.diff_pin(_DIFF) != tool.diff_pin(other)


def test_a_pinned_equivalent_stops_excusing_its_survivor_once_the_mutation_changes(
    tool, tmp_path, monkeypatch
):
    listed = tmp_path / "equivalent.md"
    listed.write_text(f"# Equivalents\n\n- `{_NAME}`: the row cap only orders the work.\n")
    monkeypatch.setattr(tool, "EQUIVALENT_FILE", listed)
    renumbered = _DIFF.replace("max_rows: int = 17", "max_rows: int = 15")
    # unpinned (an entry from before pins): it excuses whatever the name now denotes
    assert tool.report([_summary(renumbered)]) == 0
    assert tool.pin_equivalents([_summary(_DIFF)]) == 1
    assert tool.equivalent_mutants()[_NAME] == (
        "the row cap only orders the work.",
        tool.diff_pin(_DIFF),
    )
    assert tool.pin_equivalents([_summary(_DIFF)]) == 0  # already pinned: left alone
    assert tool.report([_summary(_DIFF)]) == 0
    assert tool.report([_summary(renumbered)]) == 1
    assert tool.report([{**_summary(_DIFF), "status": {_NAME: "killed"}}]) == 0


def test_survivors_only_skips_the_pinned_equivalents_at_their_diff_and_nothing_else(tool):
    """A pinned entry whose pin still matches is judged: not retested. A changed mutation, an
    unpinned entry and an unlisted survivor are all tested again."""
    diffs = {
        "m_1": "-    x = 1\n+    x = 2",
        "m_2": "-    y = a\n+    y = None",
        "m_3": "-    z\n+    None",
        "m_4": "-    w = 3\n+    w = 4",
    }
    equivalents = {
        "m_1": tool.Equivalent("same", tool.diff_pin(diffs["m_1"])),
        "m_2": tool.Equivalent("was another mutation", tool.diff_pin("-    y = a\n+    y = b")),
        "m_3": tool.Equivalent("never pinned", None),
    }
    asked = []

    def diff_of(name: str) -> str:
        asked.append(name)
        return diffs[name]

    assert tool.unjudged(["m_1", "m_2", "m_3", "m_4"], equivalents, diff_of) == [
        "m_2",
        "m_3",
        "m_4",
    ]
    assert sorted(asked) == ["m_1", "m_2"]  # only pinned entries need a diff
    assert tool.unjudged([], equivalents, diff_of) == []
