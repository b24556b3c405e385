"""Which source was built: the resolved commit, proven to be the one asked for, or a content digest.

(A torch extension's source is its pinned archive: ``kind = "sdist"``, every file checked against its pin.)

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

from t4patch.errors import BuildError, UsageError

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
    files: int | None  # files digested (directory), or pinned files read (sdist)
    archive_sha256: str | None = None  # sdist: the archive's sha256 (None for an unpacked tree)

    def to_dict(self) -> dict[str, object]:
        if self.kind == "sdist":
            return {"kind": self.kind, "path": str(self.path), "archive_sha256": self.archive_sha256,
                    "pinned_files": self.files}
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


def ref_lookup_commands(path: Path, requested_ref: str) -> tuple[tuple[str, ...], ...]:
    """The git commands that find the commit ``requested_ref`` names in the clone at ``path``, in order.

    refs/tags/REF, then refs/remotes/origin/REF (what the last clone/fetch brought, never a local branch that
    an earlier build left behind), then, only for a hex-looking ref, a commit hash. The build plan runs exactly
    these (its ``resolve-ref`` step); the first whose answer :func:`accept_commit` takes is the commit.
    """
    candidates = [f"refs/tags/{requested_ref}", f"refs/remotes/origin/{requested_ref}"]
    if _HEX.match(requested_ref):
        candidates.append(requested_ref)
    return tuple(("git", "-C", str(path), "rev-parse", "--verify", "--quiet", "--end-of-options",
                  f"{candidate}^{{commit}}") for candidate in candidates)


def accept_commit(requested_ref: str, command: tuple[str, ...], returncode: int | None, output: str) -> str | None:
    """The commit one lookup command answered, or None when it found nothing acceptable.

    A bare hash lookup must name a commit that starts with the requested abbreviation, not something
    ``rev-parse`` found by another rule.
    """
    commit = output.strip()
    if returncode != 0 or not commit:
        return None
    if command[-1] == f"{requested_ref}^{{commit}}" and not commit.startswith(requested_ref.lower()):
        return None
    return commit


def unresolved_ref(path: Path, requested_ref: str) -> BuildError:
    """The error when no lookup command named a commit."""
    return BuildError(f"ref {requested_ref!r} does not name a commit in {path} (looked for tag, origin branch"
                      f"{', commit' if _HEX.match(requested_ref) else ''})",
                      hint="check the ref (tag, branch or commit) and rerun with --ref REF")


def origin_url(path: Path) -> str | None:
    proc = _git(path, "remote", "get-url", "origin")
    return proc.stdout.strip() if proc.returncode == 0 else None


def _same_repository(a: str, b: str) -> bool:
    def norm(url: str) -> str:
        url = url.strip().rstrip("/")
        return url[:-4] if url.endswith(".git") else url
    return norm(a) == norm(b)


def check_reused_clone(path: Path, repository: str, out: Path) -> None:
    """A reused clone must come from the requested repository; UsageError otherwise.

    The origin is never silently re-pointed: a clone of another repository holds other refs and objects, and
    the record must name what was really fetched.
    """
    found = origin_url(path)
    if found is None or not _same_repository(found, repository):
        raise UsageError(
            f"{path} is a clone of {found or 'no origin remote'}, not of the requested {repository}",
            hint=f"remove {out / 'src'}, or pass the same --repo {found}" if found else f"remove {out / 'src'}",
        )


def resolve_checkout(path: Path, requested_ref: str, expected: str) -> SourceIdentity:
    """Identify a checkout made for ``requested_ref`` (resolved to ``expected``) and verify HEAD is that commit."""
    head = _git(path, "rev-parse", "--verify", "HEAD^{commit}")
    if head.returncode != 0:
        raise BuildError(f"{path} has no checked-out commit after `git checkout {expected}` ({head.stderr.strip()})",
                         hint=f"remove {path} and rerun the build")
    commit = head.stdout.strip()
    if commit != expected:
        raise BuildError(f"checked out {commit[:12]} but {requested_ref!r} is {expected[:12]}",
                         hint=f"remove {path} and rerun the build")
    return _git_identity(path, requested_ref, commit, verified=True)


def identify_directory(path: Path, *, exclude: Path | None = None) -> SourceIdentity:
    """Identify a --source tree: its git HEAD when it is a checkout, else a digest over its files.

    ``exclude`` (the build's output directory when it lies inside the tree) is left out of the digest.
    """
    if is_git_worktree(path):
        head = _git(path, "rev-parse", "--verify", "HEAD^{commit}")
        if head.returncode == 0:
            return _git_identity(path, None, head.stdout.strip(), verified=False)
    digest, count = tree_sha256(path, exclude=exclude)
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


def tree_sha256(root: Path, *, skip: tuple[str, ...] = (".git", "build", "target", "t4patch-build"),
                exclude: Path | None = None) -> tuple[str, int]:
    """sha256 over (relative path, file sha256) of every regular file, sorted; build outputs are skipped
    (top-level ``skip`` names, and the directory ``exclude`` wherever it lies inside ``root``)."""
    entries: list[tuple[str, str]] = []
    excluded = exclude.resolve() if exclude is not None else None
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        if rel_dir == Path("."):
            dirnames[:] = [d for d in dirnames if d not in skip]
        if excluded is not None:
            dirnames[:] = [d for d in dirnames if (Path(dirpath) / d).resolve() != excluded]
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
