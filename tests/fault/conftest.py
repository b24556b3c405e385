"""Fixtures the fault suites share (test modules never import each other)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Env


@pytest.fixture
def shared_env(env: Env, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    """``env`` copied to a directory every user may traverse (pytest's tmp dirs are root's alone)."""
    import shutil
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="t4patch-shared-"))
    where.chmod(0o755)
    try:
        shutil.copytree(env.site, where / "site", symlinks=True)
        shutil.copytree(env.patches, where / "patches", symlinks=True)
        monkeypatch.setenv("T4PATCH_PATCHES", str(where / "patches"))
        yield Env(where / "site", where / "patches")
    finally:
        shutil.rmtree(where, ignore_errors=True)
