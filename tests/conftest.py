"""Shared fixtures: a synthetic installed engine and a synthetic patch set built in temp dirs.

The synthetic engine ("fakeengine" 1.2.0) is a real distribution as pip leaves it: a package plus a
.dist-info with METADATA and a RECORD holding sha256 of every file. The patch set is made the way a
maintainer makes one: edit a copy, `diff -u`, pin both hashes.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import json
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from t4patch.cli import main  # noqa: E402

KERNEL = textwrap.dedent(
    '''\
    """A stand-in engine kernel module."""


    def tile_size(head_size, capability):
        tile = 32
        return tile


    def other():
        return "unchanged"
    '''
)
KERNEL_PATCHED = KERNEL.replace(
    "    tile = 32\n",
    "    tile = 32\n    # t4patch: cc < 8.0 gets a smaller tile\n"
    "    if capability < (8, 0):\n        tile = 16\n",
)
assert KERNEL_PATCHED != KERNEL
CONFIG = "MIN_CAPABILITY = 80\nNAME = 'fake'\n"
CONFIG_PATCHED = "MIN_CAPABILITY = 75\nNAME = 'fake'\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_dist(site: Path, name: str = "fakeengine", version: str = "1.2.0", files: dict[str, str] | None = None) -> Path:
    files = files if files is not None else {
        f"{name}/__init__.py": "",
        f"{name}/kernel.py": KERNEL,
        f"{name}/config.py": CONFIG,
    }
    site.mkdir(parents=True, exist_ok=True)
    dist_info = site / f"{name}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    rows = []
    for rel, text in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        rows.append(f"{rel},{record_hash(text.encode())},{len(text.encode())}")
    rows.append(f"{dist_info.name}/METADATA,,")
    rows.append(f"{dist_info.name}/RECORD,,")
    (dist_info / "RECORD").write_text("\n".join(rows) + "\n")
    return site


def unified(path: str, old: str, new: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=f"a/{path}", tofile=f"b/{path}"
        )
    )


def make_patch_set(
    root: Path,
    name: str = "fakeengine",
    version: str = "1.2.0",
    changes: list[tuple[str, str, str]] | None = None,
    packages: str | None = None,
) -> Path:
    """Write patches/<name>/<version>/ with one diff per (path, old, new) change."""
    changes = changes if changes is not None else [
        (f"{name}/kernel.py", KERNEL, KERNEL_PATCHED),
        (f"{name}/config.py", CONFIG, CONFIG_PATCHED),
    ]
    directory = root / name / version
    directory.mkdir(parents=True)
    lines = [
        "schema = 1",
        f'distribution = "{name}"',
        f'version = "{version}"',
        f'packages = {packages or repr([name]).replace(chr(39), chr(34))}',
        'summary = "synthetic patch set for tests"',
    ]
    for number, (path, old, new) in enumerate(changes, start=1):
        file = f"{number:04d}-change-{number}.diff"
        (directory / file).write_text(unified(path, old, new))
        lines += [
            "", "[[patch]]", f'file = "{file}"', f'title = "change {number}"',
            'fixes = "a failure"', 'gpus = "cc < 8.0"', 'references = ["https://example.invalid/1"]',
        ]
    for path, old, new in changes:
        lines += [
            "", "[[target]]", f'path = {json.dumps(path)}',
            f'pristine_sha256 = "{sha(old.encode())}"', f'patched_sha256 = "{sha(new.encode())}"',
        ]
    (directory / "manifest.toml").write_text("\n".join(lines) + "\n")
    return directory


@dataclass
class Env:
    site: Path
    patches: Path

    def file(self, rel: str) -> Path:
        return self.site / rel

    def snapshot(self) -> dict[str, bytes]:
        return {str(p.relative_to(self.site)): p.read_bytes() for p in sorted(self.site.rglob("*")) if p.is_file()}


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    site = make_dist(tmp_path / "site")
    patches = tmp_path / "patches"
    make_patch_set(patches)
    monkeypatch.setenv("T4PATCH_PATCHES", str(patches))
    return Env(site, patches)


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    def run(*argv: str) -> Result:
        code = main(list(argv))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run
