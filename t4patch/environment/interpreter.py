"""The one way t4patch runs code under another Python interpreter (the serving environment's ``--python``).

Three things need it: asking an interpreter for its paths (:func:`probe`), telling whether it is this very
environment (:func:`is_this_environment`), and running t4patch code there (:func:`t4patch_command`: the
`verify attention` worker, a re-run of `verify marlin`). The last one must not leak this environment into
that one: t4patch is loaded from this tree by file location (``sys.path`` untouched, so that interpreter's own
torch, triton and engines are the ones imported), and only t4patch's own pure-Python dependencies are lent,
through a directory of symlinks appended at the *end* of its path, so its own copies win where it has them.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from t4patch.errors import TargetEnvironmentError

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # .../t4patch
PROBE_TIMEOUT_S = 60
# t4patch's own dependencies (pure Python), lent to the other interpreter only where it lacks them
OWN_DEPENDENCIES = ("packaging", "unidiff", "pynvml", "tomli")

_BOOTSTRAP = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('t4patch', {init!r}, submodule_search_locations=[{pkg!r}])\n"
    "mod = importlib.util.module_from_spec(spec); sys.modules['t4patch'] = mod; spec.loader.exec_module(mod)\n"
    "sys.path.append({lent!r})\n"
    "from {module} import {function} as entry\n"
    "raise SystemExit(entry(sys.argv[1:]))\n"
)


def probe(python: str, code: str, *, timeout: float = PROBE_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code`` and capture its output (OSError when it cannot be started)."""
    return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout, check=False)


def probe_json(python: str, code: str) -> Any:
    """Run ``code`` under ``python``; it prints one JSON document last. Errors are TargetEnvironmentError."""
    try:
        proc = probe(python, code)
    except OSError as exc:
        raise TargetEnvironmentError(f"--python {python}: could not run it ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise TargetEnvironmentError(
            f"--python {python}: expected a Python interpreter printing UTF-8, found undecodable output ({exc})",
            hint="pass e.g. --python /path/to/venv/bin/python",
        ) from None
    except subprocess.TimeoutExpired:
        raise TargetEnvironmentError(
            f"--python {python}: expected a Python interpreter to answer within {PROBE_TIMEOUT_S} s, it did not",
            hint="pass e.g. --python /path/to/venv/bin/python",
        ) from None
    hint = "pass a Python interpreter, e.g. --python /path/to/venv/bin/python"
    try:
        answer = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (ValueError, IndexError):
        answer = None
    if answer is None:
        if _looks_like_python(proc.stderr):
            # a real interpreter that failed to run the probe (a broken install, a too-old Python)
            last = _without_code(proc.stderr, code)
            raise TargetEnvironmentError(
                f"--python {python}: expected a working Python interpreter, it exited {proc.returncode}: {last}",
                hint=hint,
            )
        raise TargetEnvironmentError(
            f"--python {python}: expected a Python interpreter, found a program that is not one "
            f"(it exited {proc.returncode} when asked to run Python code)",
            hint=hint,
        )
    return answer


def _looks_like_python(stderr: str) -> bool:
    """Whether a failed run's stderr is a Python interpreter's (a traceback), not another program's."""
    return "Traceback (most recent call last)" in stderr or stderr.lstrip().startswith(("  File ", "SyntaxError"))


def _without_code(stderr: str, code: str) -> str:
    """The last line of ``stderr`` that does not echo the code that was run (never print a probe script)."""
    lines = [line for line in stderr.strip().splitlines() if line.strip() and line.strip() not in code]
    return (lines or ["no output"])[-1][:200]


def is_this_environment(python: str) -> bool:
    """Whether ``python`` runs in this very environment. Venvs symlink the same base interpreter, so paths are
    not compared after resolving; the environment's ``sys.prefix`` is what tells two venvs apart. An
    interpreter that cannot answer counts as another one (running there reports the problem)."""
    try:
        proc = probe(python, "import sys; print(sys.prefix)")
    except (OSError, subprocess.TimeoutExpired):
        return False
    if proc.returncode != 0:
        return False
    return Path(proc.stdout.strip()).resolve() == Path(sys.prefix).resolve()


def _lend_dependencies(directory: Path) -> None:
    for name in OWN_DEPENDENCIES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin:
            continue
        origin = Path(spec.origin)
        source = origin.parent if origin.name == "__init__.py" else origin
        link = directory / source.name
        if not link.exists():
            link.symlink_to(source)


@contextmanager
def t4patch_command(
    python: str, module: str, function: str = "main", *, flags: Sequence[str] = ()
) -> Iterator[list[str]]:
    """The argv that runs ``module.function(argv)`` from this t4patch tree under ``python``; append the
    arguments and run it inside the ``with`` block (the lent-dependency directory lives that long).
    ``flags`` go to the interpreter itself (e.g. ``-B``)."""
    with tempfile.TemporaryDirectory(prefix="t4patch-interp-") as tmp:
        lent = Path(tmp) / "lent"
        lent.mkdir()
        _lend_dependencies(lent)
        code = _BOOTSTRAP.format(
            init=str(PACKAGE_DIR / "__init__.py"),
            pkg=str(PACKAGE_DIR),
            lent=str(lent),
            module=module,
            function=function,
        )
        yield [python, *flags, "-c", code]
