"""The directories t4patch writes its products into (``wheel -o``, ``port -o``), checked before anything is made.

An output directory is the user's: it may hold their own files, a symlink they did not mean, or be inside a
patch-set tree that ``t4patch list`` reads (a draft written into the shipped ``patches/`` tree, or into the
``--patches`` / ``T4PATCH_PATCHES`` tree, would change what every later command sees). So, before any work:

- ``-o`` must be a directory or not exist yet (then it is created when there is something to write, ``0777``
  minus the umask); a symlink, even to a directory, a file, a dangling link or a path through a file is refused
  with one line (exit 2);
- it (or, when it does not exist yet, the directory it would be made in) must be writable by this user
  (checked, not found out half-way);
- it must not be inside, or be, a patch-set tree t4patch reads;
- each name t4patch will write there (:func:`check_entry`) must be absent or a plain file t4patch may replace
  (the caller decides which it wrote); a directory or a symlink of that name is refused.

Files come out ``0666`` minus the umask (``0644`` under umask 022, as pip leaves them), directories ``0777``
minus the umask.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from t4patch.data.locations import data_dir, shipped_dirs
from t4patch.errors import T4PatchError, UsageError


def _patch_trees() -> list[Path]:
    """Every patch-set tree ``t4patch list`` may read: the active one (``--patches`` / ``T4PATCH_PATCHES`` or the
    shipped one) and the shipped one of this install or checkout, resolved."""
    trees = list(shipped_dirs("patches"))
    try:
        trees.append(data_dir("patches"))
    except T4PatchError:  # no usable active tree: nothing to protect there
        pass
    return [t.resolve() for t in trees if t.is_dir()]


def _inside(path: Path, tree: Path) -> bool:
    return path == tree or tree in path.parents


def _refuse(option: str, path: Path, found: str, retry: str) -> UsageError:
    return UsageError(f"{option} {path}: expected a directory t4patch may write into, found {found}; nothing was "
                      "written", hint=retry)


def output_dir(path: Path, *, option: str, retry: str) -> Path:
    """Check ``path`` as an output directory (see the module docstring) without creating it; return it.

    ``retry`` is the command line to paste with another directory (e.g. ``t4patch wheel vllm==0.33.0 -o DIR``).
    A directory that does not exist yet is made by :func:`make_output_dir` when there is something to write,
    so a refused run leaves not even an empty directory behind.
    """
    if path.is_symlink():
        target = os.readlink(path)
        raise _refuse(option, path, f"a symlink (to {target}{'' if path.exists() else ', which does not exist'})",
                      retry)
    if path.exists() and not path.is_dir():
        raise _refuse(option, path, "a file" if path.is_file() else "something that is not a directory", retry)
    resolved = path.resolve()
    for tree in _patch_trees():
        if _inside(resolved, tree):
            raise _refuse(option, path, f"a place inside the patch-set tree {tree}, which t4patch list reads (a "
                          "set written there changes what every command sees)", retry)
    existing = path.absolute()
    while not existing.exists() and not existing.is_symlink():
        existing = existing.parent
    if not existing.is_dir():
        raise _refuse(option, path, f"a path through {existing}, which is not a directory", retry)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise _refuse(option, path, f"{'a directory' if existing == path.absolute() else f'a path below {existing}'}"
                      " this user may not write to", retry)
    return path


def make_output_dir(path: Path) -> None:
    """Create the checked output directory (and its parents), ``0777`` minus the umask."""
    path.mkdir(parents=True, exist_ok=True)


def check_entry(path: Path, *, option: str, retry: str) -> os.stat_result | None:
    """``path`` (a name t4patch will write in an output directory) is absent (None) or a plain file (its stat);
    a directory, a symlink or anything else of that name is refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(option, path.parent, f"{path.name} there as a symlink (to {os.readlink(path)})", retry)
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a special file"
        raise _refuse(option, path.parent, f"{kind} named {path.name}, where t4patch writes a file", retry)
    return st


def make_dir(path: Path) -> None:
    """``mkdir`` with the umask's mode (``mkdtemp`` would make it ``0700``)."""
    os.mkdir(path, 0o777)
