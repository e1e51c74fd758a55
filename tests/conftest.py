"""Shared test helpers: where ../shared lies, and skipping cleanly without it."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# The design folder, data and fixtures live beside the checkout, not in it; a user's
# clone has no such folder, and the tests that need it skip with this reason.
SHARED = REPO_ROOT.parent / "shared"
FIXTURES = SHARED / "fixtures" / "official-tiny"
DATA = SHARED / "data"
NO_SHARED_REASON = f"needs the project's shared folder at {SHARED} (absent in a plain clone)"


def require_shared(path: Path) -> Path:
    """Return `path` inside ../shared, or skip the calling test if it is absent."""
    if not path.exists():
        pytest.skip(NO_SHARED_REASON)
    return path


@pytest.fixture
def llada_fixture() -> Path:
    return require_shared(FIXTURES / "llada")


@pytest.fixture
def dream_fixture() -> Path:
    return require_shared(FIXTURES / "dream")


@pytest.fixture
def data_dir() -> Path:
    return require_shared(DATA)
