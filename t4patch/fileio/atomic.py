"""The one way t4patch replaces a file: a reader sees the old bytes or the new ones, never half of either.

Patched engine files, the state record, the build record and the benchmark's state are all read back later
(by Python importing the engine, by `status`, by a resumed run), so a crash mid-write must leave the previous
file or the new one. Every writer goes through :func:`write_bytes_atomic`: the new bytes go to a temp file in
the same directory (same filesystem, so the rename is atomic), created with ``O_EXCL | O_NOFOLLOW`` under an
unpredictable name (a leftover or planted symlink is never followed), given the old file's mode, owner and
group, fsynced, renamed over the target with ``os.replace``, and the directory is fsynced so the rename itself
survives a power cut. Temp names end in :data:`TEMP_SUFFIX`, so a killed run's leftovers can be found.

The patching core also uses the lower-level steps (:func:`create_temp`, :func:`fsync_dir`) to stage a whole
patch set before renaming any of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

TEMP_SUFFIX = ".t4patch-tmp"
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def temp_path(path: Path, token: str | None = None, suffix: str = TEMP_SUFFIX) -> Path:
    """A hidden sibling of ``path`` that nobody can guess: ``.<name>.<token><suffix>``."""
    return path.with_name(f".{path.name}.{token or secrets.token_hex(8)}{suffix}")


def _apply_ownership(fd: int, like: os.stat_result | None, directory: Path) -> None:
    """Give the file behind ``fd`` the mode, owner and group of ``like`` (the file it will replace); a new file
    keeps the mode os.open gave it (0o666 minus the umask) and gets the owner and group of its directory, so
    root writing into another user's tree leaves nothing that user cannot change."""
    if like is not None:
        os.fchmod(fd, stat.S_IMODE(like.st_mode))
    owner = like if like is not None else os.stat(directory)
    current = os.fstat(fd)
    if (current.st_uid, current.st_gid) == (owner.st_uid, owner.st_gid):
        return
    try:
        os.fchown(fd, owner.st_uid, owner.st_gid)
    except PermissionError:
        # Only root may give a file away; an unprivileged writer keeps its own uid but still tries the group
        # (one it belongs to).
        with contextlib.suppress(PermissionError):
            os.fchown(fd, -1, owner.st_gid)


def existing_stat(path: Path) -> os.stat_result | None:
    """The stat of the file ``path`` names (following a file symlink, as a reader would), or None if absent."""
    try:
        return path.stat()
    except FileNotFoundError:
        return None


def create_temp(path: Path, data: bytes, *, like: os.stat_result | None, token: str | None = None,
                suffix: str = TEMP_SUFFIX) -> Path:
    """Write ``data`` to a new temp sibling of ``path`` with ``like``'s mode and owner, fsynced; return it.

    The temp is removed again if anything fails, so an error leaves nothing behind.
    """
    tmp = temp_path(path, token, suffix)
    fd = os.open(tmp, _CREATE_FLAGS, 0o666)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            _apply_ownership(fd, like, path.parent)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def fsync_dir(directory: Path) -> None:
    """Make the renames and unlinks done in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` (or create it) with ``data``, atomically and durably, keeping mode, owner and group."""
    tmp = create_temp(path, data, like=existing_stat(path))
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: Path, doc: Any) -> None:
    """Replace ``path`` with ``doc`` as indented JSON plus a final newline (see :func:`write_bytes_atomic`)."""
    write_bytes_atomic(path, (json.dumps(doc, indent=2) + "\n").encode("utf-8"))
