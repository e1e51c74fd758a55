"""`tools/structure.py`: the package's structure check, and the checker itself on a planted tree.

The real package is checked by running `python tools/structure.py --check` as CI does; the
checker's functions are tested on a small tree written under tmp_path (a circle, a layer
crossed, a function one line over the limit), so that a checker that stops seeing a problem
fails here rather than passing the real package silently.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "structure.py"


def _load_structure():
    spec = importlib.util.spec_from_file_location("structure_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


structure = _load_structure()


def test_the_package_has_no_circle_no_layer_crossed_and_no_long_function():
    run = subprocess.run(
        [sys.executable, str(TOOL), "--check"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, f"tools/structure.py --check found:\n{run.stdout}{run.stderr}"


def _function(name: str, lines: int) -> str:
    """A function definition `lines` lines long, `def` line included."""
    body = "".join(f"    x{i} = {i}\n" for i in range(lines - 2))
    return f"def {name}():\n{body}    return 0\n"


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A package tree with one of each problem, and the checker pointed at it."""
    package = structure.PACKAGE
    _write(
        tmp_path,
        {
            f"{package}/__init__.py": "",
            f"{package}/core/__init__.py": "",
            # a circle closed by a function-local import (it only delays the circle)
            f"{package}/core/a.py": f"from {package}.core import b\n",
            f"{package}/core/b.py": f"def f():\n    from {package}.core.a import g\n",
            # the algorithm core reaching up into the lm-eval integration
            f"{package}/core/up.py": f"import {package}.integration.harness\n",
            f"{package}/integration/__init__.py": "",
            f"{package}/integration/harness.py": "",
            f"{package}/commands/__init__.py": "",
            f"{package}/commands/cli.py": f"from {package}.integration import harness\n",
            f"{package}/long.py": _function("over", 41) + "\n\n" + _function("at_limit", 40),
        },
    )
    monkeypatch.setattr(structure, "ROOT", tmp_path)
    return package


def test_the_checker_finds_a_circle_through_a_local_import(planted):
    found = structure.circles(structure.import_graph())
    assert [f"{planted}.core.a", f"{planted}.core.b"] in found


def test_the_checker_finds_a_lower_layer_importing_a_higher_one(planted):
    crossed = structure.crossings(structure.import_graph())
    assert crossed == [f"{planted}.core.up imports {planted}.integration.harness"]


def test_the_checker_flags_41_lines_and_not_40(planted):
    rows = structure.long_functions((planted,), structure.MAX_FUNCTION_LINES)
    assert rows == [(41, f"{planted}/long.py::over")]


def test_check_lists_every_problem_and_exits_1(planted, capsys):
    assert structure.main(["--check"]) == 1
    printed = capsys.readouterr().out
    for problem in (
        f"import circle: {planted}.core.a <-> {planted}.core.b",
        f"layer crossed: {planted}.core.up imports {planted}.integration.harness",
        f"function of 41 lines (limit 40): {planted}/long.py::over",
    ):
        assert problem in printed
    assert "at_limit" not in printed
