"""The "put t4patch's own files back" advice follows how t4patch was installed (it is not on PyPI)."""

from __future__ import annotations

import json
import shlex
import sys
from importlib import metadata
from pathlib import Path

import pytest

from t4patch.data import locations


class _Dist:
    def __init__(self, direct_url: dict | None) -> None:
        self.direct_url = direct_url

    def read_text(self, name: str) -> str | None:
        assert name == "direct_url.json"
        return None if self.direct_url is None else json.dumps(self.direct_url)


def _hint(monkeypatch: pytest.MonkeyPatch, direct_url: dict | None, package_dir: Path) -> str:
    locations.reinstall_hint.cache_clear()
    monkeypatch.setattr(metadata, "distribution", lambda name: _Dist(direct_url))
    monkeypatch.setattr(locations, "_PACKAGE_DIR", package_dir)
    try:
        return locations.reinstall_hint()
    finally:
        locations.reinstall_hint.cache_clear()


def test_editable_checkout_restores_the_data_from_git(monkeypatch, tmp_path):
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    url = {"url": (tmp_path / "repo").as_uri(), "dir_info": {"editable": True}}
    hint = _hint(monkeypatch, url, tmp_path / "elsewhere" / "t4patch")
    assert hint.endswith(f"git -C {tmp_path / 'repo'} checkout -- patches recipes hardware engine-data cases")


def test_wheel_install_is_reinstalled_from_the_same_wheel(monkeypatch, tmp_path):
    wheel = tmp_path / "dist dir" / "t4patch-0.1.0-py3-none-any.whl"
    hint = _hint(monkeypatch, {"url": wheel.as_uri(), "archive_info": {}}, tmp_path / "site" / "t4patch")
    assert hint.endswith(f"{shlex.quote(sys.executable)} -m pip install --force-reinstall --no-deps "
                         f"{shlex.quote(str(wheel))}")
    assert "pip install --force-reinstall t4patch" not in hint


def test_unknown_origin_says_so_without_inventing_a_command(monkeypatch, tmp_path):
    hint = _hint(monkeypatch, None, tmp_path / "site" / "t4patch")
    assert "pip install" not in hint and "checkout or a built wheel" in hint


def test_shipped_data_errors_carry_it():
    from t4patch.data.reader import DataKind
    from t4patch.errors import DataFileError

    err = DataKind(label="verification data", error=DataFileError).fail("x.toml", "bad")
    assert err.hint is not None and err.hint.startswith("this shipped data file is broken; ")
    assert "pip install --force-reinstall t4patch" not in str(err)
