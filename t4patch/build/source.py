"""Which source was built: the resolved commit, proven to be the one asked for, or a content digest.

"Built llama.cpp 7182ef71e" is only true if HEAD after the checkout *is* that commit: a branch of the same
name, a moved tag or a failed checkout would otherwise go into the record unnoticed. For ``--source DIR``
that is not a git checkout (an sdist's vendored tree) there is no commit, so the record carries a sha256
over every file instead, which identifies the tree just as exactly.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from t4patch.errors import BuildError

_HEX = re.compile(r"^[0-9a-fA-F]{7,40}$")


@dataclass(frozen=True)
class SourceIdentity:
    kind: str  # "git" or "directory"
    path: Path
    commit: str | None  # full sha1 of HEAD (git)
    requested_ref: str | None
    ref_verified: bool  # HEAD equals the commit the requested ref names
    describe: str | None  # `git describe --tags --always` (git)
    dirty: bool | None  # uncommitted changes in the work tree (git)
    tree_sha256: str | None  # digest over all files (directory without git)
    files: int | None

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "path": str(self.path),
            "commit": self.commit,
            "requested_ref": self.requested_ref,
            "ref_verified": self.ref_verified,
            "describe": self.describe,
            "dirty": self.dirty,
            "tree_sha256": self.tree_sha256,
            "files": self.files,
        }


def _git(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=False,
                          env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})


def is_git_worktree(path: Path) -> bool:
    try:
        proc = _git(path, "rev-parse", "--show-toplevel")
    except OSError:
        return False
    return proc.returncode == 0 and Path(proc.stdout.strip()).resolve() == path.resolve()


def resolve_checkout(path: Path, requested_ref: str) -> SourceIdentity:
    """Identify a checkout made for ``requested_ref`` and verify HEAD is that ref; BuildError otherwise."""
    head = _git(path, "rev-parse", "--verify", "HEAD^{commit}")
    if head.returncode != 0:
        raise BuildError(f"{path} has no checked-out commit after `git checkout {requested_ref}` ({head.stderr.strip()})",
                         hint=f"remove {path} and rerun the build")
    commit = head.stdout.strip()
    wanted = _git(path, "rev-parse", "--verify", "--end-of-options", f"{requested_ref}^{{commit}}")
    if wanted.returncode != 0:
        raise BuildError(f"ref {requested_ref!r} does not name a commit in {path}",
                         hint="check the ref (tag, branch or commit) and rerun with --ref REF")
    expected = wanted.stdout.strip()
    if commit != expected:
        raise BuildError(f"checked out {commit[:12]} but {requested_ref!r} is {expected[:12]}",
                         hint=f"remove {path} and rerun the build")
    if _HEX.match(requested_ref) and not commit.startswith(requested_ref.lower()):
        # A branch or tag that happens to look like a hex prefix must not pass as that commit.
        raise BuildError(f"ref {requested_ref!r} looks like a commit but resolved to {commit[:12]}",
                         hint="pass the full 40-character commit with --ref")
    return _git_identity(path, requested_ref, commit, verified=True)


def identify_directory(path: Path) -> SourceIdentity:
    """Identify a --source tree: its git HEAD when it is a checkout, else a digest over its files."""
    if is_git_worktree(path):
        head = _git(path, "rev-parse", "--verify", "HEAD^{commit}")
        if head.returncode == 0:
            return _git_identity(path, None, head.stdout.strip(), verified=False)
    digest, count = tree_sha256(path)
    return SourceIdentity("directory", path, None, None, False, None, None, digest, count)


def _git_identity(path: Path, ref: str | None, commit: str, *, verified: bool) -> SourceIdentity:
    describe = _git(path, "describe", "--tags", "--always")
    status = _git(path, "status", "--porcelain", "--untracked-files=no")
    return SourceIdentity(
        kind="git",
        path=path,
        commit=commit,
        requested_ref=ref,
        ref_verified=verified,
        describe=describe.stdout.strip() if describe.returncode == 0 else None,
        dirty=bool(status.stdout.strip()) if status.returncode == 0 else None,
        tree_sha256=None,
        files=None,
    )


def tree_sha256(root: Path, *, skip: tuple[str, ...] = (".git", "build", "target", "t4patch-build")) -> tuple[str, int]:
    """sha256 over (relative path, file sha256) of every regular file, sorted; build outputs are skipped."""
    entries: list[tuple[str, str]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        if rel_dir == Path("."):
            dirnames[:] = [d for d in dirnames if d not in skip]
        dirnames.sort()
        for name in filenames:
            full = Path(dirpath) / name
            if full.is_symlink() or not full.is_file():
                continue
            h = hashlib.sha256()
            with full.open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            entries.append(((rel_dir / name).as_posix(), h.hexdigest()))
    entries.sort()
    outer = hashlib.sha256()
    for rel, digest in entries:
        outer.update(f"{digest}  {rel}\n".encode())
    return outer.hexdigest(), len(entries)
