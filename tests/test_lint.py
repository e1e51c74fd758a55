"""ruff, configured in pyproject.toml, passes over the package, tests, bench and tools.

The linter runs as a test so that the README's one test command is the whole of CI: a long
line, an unused import or an unformatted file fails here with ruff's own report.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    # the environment's own ruff (the version pinned in the test extra) before any on PATH
    beside_python = Path(sys.executable).parent / "ruff"
    ruff = str(beside_python) if beside_python.exists() else shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: `pip install -e '.[test]'` installs the pinned version")
    return subprocess.run([ruff, *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_check_is_clean():
    result = _ruff("check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_leaves_every_file_as_it_is():
    result = _ruff("format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr
