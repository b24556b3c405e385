"""The one error hierarchy of t4patch.

Every failure a user can cause or meet (wrong version installed, a file edited by someone else, a missing
GPU, a missing tool) is a subclass of :class:`T4PatchError` with its own exit code. The CLI prints the
message as one line and exits with ``exit_code``; a traceback is shown only with ``--debug``. Messages say
what was expected, what was found, and the next command to run, so nobody has to read a stack trace.

Exit codes are part of the public interface (documented in the README); never renumber them.
"""

from __future__ import annotations


class T4PatchError(Exception):
    """Base class: a failure with a one-line explanation and a stable exit code."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}; next: {self.hint}"
        return self.message


class UsageError(T4PatchError):
    """The command line itself is wrong (bad spec, conflicting options)."""

    exit_code = 2


class TargetEnvironmentError(T4PatchError):
    """The environment named by --python / --site-packages cannot be used."""

    exit_code = 3


class NotInstalledError(T4PatchError):
    """The engine (distribution) asked for is not installed in the target environment."""

    exit_code = 4


class UnsupportedVersionError(T4PatchError):
    """The installed version has no shipped patch set, or does not match the requested spec."""

    exit_code = 5


class ForeignFileError(T4PatchError):
    """A target file hashes to neither its pristine nor its patched sha256: someone else changed it."""

    exit_code = 6


class PatchSetError(T4PatchError):
    """Shipped or user-supplied patch-set data is invalid (manifest, diff, hashes, paths)."""

    exit_code = 7


class LockBusyError(T4PatchError):
    """Another t4patch run holds the lock on the target environment."""

    exit_code = 8


class NotAppliedError(T4PatchError):
    """`status --check`: a requested patch set is not fully applied."""

    exit_code = 9


class MissingDependencyError(T4PatchError):
    """An optional dependency a command needs (torch, triton, an engine module) is not importable."""

    exit_code = 10


class NoGpuError(T4PatchError):
    """A command needs a CUDA GPU and none is visible."""

    exit_code = 11


class VerificationError(T4PatchError):
    """A verification check ran and failed (accuracy, fit, architecture of an artifact)."""

    exit_code = 12


class DeterminismError(VerificationError):
    """Repeated runs of a kernel that must be deterministic were not bitwise equal."""

    exit_code = 13


class ToolMissingError(T4PatchError):
    """A build tool (git, cmake, cargo, nvcc, ...) is missing or too old."""

    exit_code = 14


class BuildError(T4PatchError):
    """A build step failed; the message names the log file."""

    exit_code = 15


class DataFileError(T4PatchError):
    """A data file shipped with t4patch outside patch sets (build recipe, GPU table, verification table) is
    invalid: a defect of t4patch's data or of a local edit, not of the user's environment."""

    exit_code = 16


class JournalRefusedError(TargetEnvironmentError):
    """An intent journal found in the target fails its checks (it names another site-packages, a path that
    resolves outside it, a file no shipped set pins, bytes of neither pinned hash, a delete of a file t4patch
    did not create), so recovery will not act on it: nothing was changed."""

    exit_code = 18


class IncompletePortError(T4PatchError):
    """`t4patch port` wrote a draft, but not every hunk landed (or a patched file does not compile): the draft
    needs a hand edit before it can ship. The report is printed in full; this is its exit code."""

    exit_code = 17


EXIT_CODES: dict[str, int] = {
    cls.__name__: cls.exit_code
    for cls in (
        T4PatchError,
        UsageError,
        TargetEnvironmentError,
        NotInstalledError,
        UnsupportedVersionError,
        ForeignFileError,
        PatchSetError,
        LockBusyError,
        NotAppliedError,
        MissingDependencyError,
        NoGpuError,
        VerificationError,
        DeterminismError,
        ToolMissingError,
        BuildError,
        DataFileError,
        IncompletePortError,
        JournalRefusedError,
    )
}
