"""Fault injection: a multi-file patch set is whole after any kill, signal or I/O error during its commit.

Every trial starts from a copy of one site (pristine for apply, patched for revert), runs the real CLI, and
breaks it at one point:

- **kill**: a forked child runs ``t4patch apply|revert`` and SIGKILLs itself right before the k-th call of
  one of the primitives a commit is made of (``os.write``, ``os.fsync``, ``os.link``, ``os.replace``,
  ``os.unlink``), for every k the run makes, then the next command (``t4patch status``) must find the set
  wholly pristine or wholly patched, say that it recovered, and leave no journal or temp file behind;
- **random kill**: ``python -m t4patch`` in a subprocess SIGKILLed after a random delay inside its run;
- **signal**: SIGTERM or SIGINT at the k-th call: the commit finishes (or is undone) before the process
  stops, so the set is whole with no next command at all, and the process says what is on disk;
- **error**: ENOSPC or EIO raised by the k-th call (once, or from then on: a persistent fault): the command
  exits 0 or 3 with one line that tells the truth, and after the next command the set is whole.

The synthetic engine has four targets in two directories plus the state record; the SGLang 0.5.23 runs use
the real wheel's ten files (integration). ``--fault-trials N`` adds N random-kill trials per case (default 8).
"""

from __future__ import annotations

import collections
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from t4patch.cli import main
from t4patch.fileio.hashing import sha256_file
from t4patch.patching.manifest import PatchSet, load_patch_set
from t4patch.patching.registry import find_patch_set
from tests.helpers import make_dist, make_patch_set, wheel_path

REPO = Path(__file__).resolve().parents[2]
PRIMITIVES = ("write", "fsync", "link", "replace", "unlink")
LEFTOVER_MARKERS = (".t4patch-new", ".t4patch-old", ".t4patch-tmp", ".t4patch-journal", "t4patch.json.tmp")


# ------------------------------------------------------------------------------------------ the engines


def _module(name: str, n: int) -> str:
    return "".join(f"def f{i}(capability):\n    tile = {32 + i}\n    return tile\n\n\n" for i in range(n)) + \
        f"NAME = {name!r}\n"


def _patched(text: str) -> str:
    return text.replace("    tile = 32\n", "    tile = 32\n    if capability < (8, 0):\n        tile = 16\n", 1)


SYNTHETIC_FILES = {
    "multiengine/__init__.py": "",
    "multiengine/kernel_a.py": _module("a", 3),
    "multiengine/kernel_b.py": _module("b", 4),
    "multiengine/ops/attention.py": _module("attention", 5),
    "multiengine/ops/decode.py": _module("decode", 2),
}
SYNTHETIC_TARGETS = [p for p in SYNTHETIC_FILES if p != "multiengine/__init__.py"]


@dataclass
class Engine:
    """A site template with one engine installed, its patch set, and how to name it on the command line."""

    spec: str
    name: str
    pristine_site: Path
    patched_site: Path
    patch_set: PatchSet
    env: dict[str, str] = field(default_factory=dict)

    def state(self, site: Path) -> str:
        """'pristine' / 'patched' when every target is, else 'mixed: ...' (hashed directly, no t4patch code)."""
        states = []
        for target in self.patch_set.targets:
            path = site / target.path
            digest = sha256_file(path) if path.is_file() else None
            states.append("pristine" if digest == target.pristine_sha256 else
                          "patched" if digest == target.patched_sha256 else f"foreign:{target.path}")
        return states[0] if len(set(states)) == 1 else "mixed: " + ",".join(states)


def leftovers(site: Path) -> list[str]:
    return sorted(str(p.relative_to(site)) for p in site.rglob("*") if any(m in p.name for m in LEFTOVER_MARKERS))


def record_present(engine: Engine, site: Path) -> bool:
    return any(site.glob("*.dist-info/t4patch.json"))


def _apply_into(template: Path, target: Path, env: dict[str, str], spec: str) -> None:
    shutil.copytree(template, target, symlinks=True)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        assert main(["apply", spec, "--site-packages", str(target)]) == 0
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    base = tmp_path_factory.mktemp("synthetic")
    site = make_dist(base / "pristine", name="multiengine", version="2.0.0", files=SYNTHETIC_FILES)
    patches = base / "patches"
    make_patch_set(patches, name="multiengine", version="2.0.0",
                   changes=[(p, SYNTHETIC_FILES[p], _patched(SYNTHETIC_FILES[p])) for p in SYNTHETIC_TARGETS])
    env = {"T4PATCH_PATCHES": str(patches)}
    _apply_into(site, base / "patched", env, "multiengine")
    return Engine("multiengine==2.0.0", "multiengine", site, base / "patched",
                  load_patch_set(patches / "multiengine" / "2.0.0"), env)


def sglang_site(site: Path, wheel: Path, patch_set: PatchSet) -> Path:
    """The real wheel's dist-info and the patch set's ten target files, extracted (no pip, no bytecode)."""
    wanted = {t.path for t in patch_set.targets}
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name in wanted or name.split("/", 1)[0].endswith(".dist-info"):
                zf.extract(name, site)
    return site


@pytest.fixture(scope="module")
def sglang(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    os.environ.pop("T4PATCH_PATCHES", None)
    patch_set = find_patch_set("sglang", "0.5.23")
    base = tmp_path_factory.mktemp("sglang")
    site = sglang_site(base / "pristine", wheel_path("sglang", "0.5.23"), patch_set)
    _apply_into(site, base / "patched", {}, patch_set.spec)
    return Engine(patch_set.spec, "sglang", site, base / "patched", patch_set, {})


# ------------------------------------------------------------------------------------------ injection


class Injector:
    """Wraps the os primitives a commit uses; at the ``at``-th call of ``kind`` it kills, signals or fails."""

    def __init__(self, kind: str | None = None, at: int = 0, action: str = "count", *, err: int = errno.ENOSPC,
                 persistent: bool = False, sig: int = signal.SIGTERM) -> None:
        self.kind, self.at, self.action, self.err, self.persistent, self.sig = kind, at, action, err, persistent, sig
        self.counts: collections.Counter[str] = collections.Counter()
        self.fired = 0
        self.delay = 0.0  # for action "timer"
        self.started = time.perf_counter()
        self.first_call: float | None = None  # seconds after start of the first and the last primitive call
        self.last_call = 0.0
        self._real: dict[str, Callable[..., object]] = {}

    def _wrap(self, name: str, real: Callable[..., object]) -> Callable[..., object]:
        def wrapper(*args: object, **kwargs: object) -> object:
            self.last_call = time.perf_counter() - self.started
            if self.first_call is None:
                self.first_call = self.last_call
            self.counts[name] += 1
            n = self.counts[name]
            if self.action == "timer" and self.fired == 0:
                self.fired = 1  # a random moment after the commit's first call: SIGALRM kills the process
                signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGKILL))
                signal.setitimer(signal.ITIMER_REAL, max(self.delay, 1e-6))
            if name == self.kind and (n == self.at or (self.persistent and n > self.at)):
                self.fired += 1
                if self.action == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                elif self.action == "pause" and n == self.at:
                    time.sleep(self.delay)
                elif self.action == "signal" and n == self.at:
                    os.kill(os.getpid(), self.sig)
                elif self.action == "error":
                    target = args[0] if args and isinstance(args[0], (str, Path)) else None
                    raise OSError(self.err, os.strerror(self.err), target)
            return real(*args, **kwargs)
        return wrapper

    def __enter__(self) -> Injector:
        for name in PRIMITIVES:
            self._real[name] = getattr(os, name)
            setattr(os, name, self._wrap(name, self._real[name]))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, real in self._real.items():
            setattr(os, name, real)


def run_quiet(argv: list[str]) -> tuple[int, str]:
    """Run the CLI in this process with stderr captured to a string (stdout discarded)."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue()


def count_calls(engine: Engine, operation: str, tmp: Path) -> collections.Counter[str]:
    site = fresh(engine, operation, tmp / "count")
    with Injector() as injector:
        code, err = run_quiet([operation, engine.spec, "--site-packages", str(site)])
    assert code == 0, err
    shutil.rmtree(site)
    return injector.counts


def fresh(engine: Engine, operation: str, where: Path) -> Path:
    if where.exists():
        shutil.rmtree(where)
    shutil.copytree(engine.pristine_site if operation == "apply" else engine.patched_site, where, symlinks=True)
    return where


@dataclass
class ChildResult:
    killed_by: int | None
    code: int | None
    stderr: str


def in_child(body: Callable[[], int], stderr_path: Path, timeout_s: float = 60.0) -> ChildResult:
    """Run ``body`` in a forked child (its stderr to a file); return how it ended."""
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 99
        try:
            fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 2)
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 - the child's whole life
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
            code = body()
        except KeyboardInterrupt:
            code = 130
        except BaseException:  # noqa: BLE001 - report, never run pytest's code in the child
            import traceback

            traceback.print_exc()
            code = 98
        finally:
            try:
                sys.stderr.flush()
            finally:
                os._exit(code)
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"child {pid} hung for {timeout_s} s")
        time.sleep(0.002)
    text = stderr_path.read_text(errors="replace")
    if os.WIFSIGNALED(status):
        return ChildResult(os.WTERMSIG(status), None, text)
    return ChildResult(None, os.WEXITSTATUS(status), text)



# ------------------------------------------------------------------------------------------ checks


@dataclass
class Figures:
    """What a batch of trials did; written to $T4PATCH_FAULT_REPORT (JSON lines) for docs/reliability.md."""

    case: str
    trials: int = 0
    mixed_before_next_command: int = 0  # trials whose kill left the set mixed on disk (the hazard exists)
    recovered: int = 0  # trials where the next command said it finished or undid an interrupted set
    failures: list[str] = field(default_factory=list)

    def report(self) -> None:
        path = os.environ.get("T4PATCH_FAULT_REPORT")
        if path:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"case": self.case, "trials": self.trials,
                                     "mixed_before_next_command": self.mixed_before_next_command,
                                     "recovered": self.recovered, "failures": len(self.failures)}) + "\n")
        assert not self.failures, f"{self.case}: {len(self.failures)} of {self.trials} trials failed: " + \
            "; ".join(self.failures[:5])


def check_whole(engine: Engine, site: Path, label: str, figures: Figures) -> str:
    state = engine.state(site)
    if state not in ("pristine", "patched"):
        figures.failures.append(f"{label}: the set is {state}")
    left = leftovers(site)
    if left:
        figures.failures.append(f"{label}: left {left}")
    if state in ("pristine", "patched") and record_present(engine, site) != (state == "patched"):
        figures.failures.append(f"{label}: state record {'present' if record_present(engine, site) else 'absent'} "
                                f"with the set {state}")
    return state


def next_command(engine: Engine, site: Path, label: str, figures: Figures) -> None:
    """The next t4patch command (status) must succeed, say when it recovered, and leave the set whole."""
    code, err = run_quiet(["status", engine.name, "--json", "--site-packages", str(site)])
    if code != 0:
        figures.failures.append(f"{label}: the next command exited {code}: {err.strip()[-300:]}")
    if "found an interrupted" in err:
        figures.recovered += 1
    check_whole(engine, site, label, figures)


def kill_trials(engine: Engine, operation: str, tmp: Path) -> Figures:
    counts = count_calls(engine, operation, tmp)
    figures = Figures(f"{engine.spec} {operation}: SIGKILL before each primitive call")
    site = tmp / "site"
    for kind in PRIMITIVES:
        for k in range(1, counts[kind] + 1):
            fresh(engine, operation, site)
            argv = [operation, engine.spec, "--site-packages", str(site)]

            def body(kind: str = kind, k: int = k, argv: list[str] = argv) -> int:
                with Injector(kind, k, "kill"):
                    return main(argv)

            label = f"kill before {kind} #{k}"
            result = in_child(body, tmp / "child.err")
            figures.trials += 1
            if result.killed_by != signal.SIGKILL:
                figures.failures.append(f"{label}: the child was not killed ({result})")
            if engine.state(site).startswith("mixed"):
                figures.mixed_before_next_command += 1
            next_command(engine, site, label, figures)
    return figures


def timer_kill_trials(engine: Engine, operation: str, tmp: Path, trials: int, seed: int) -> Figures:
    """SIGKILL at a random moment: three in four trials start an interval timer at the commit's first
    primitive call, firing within 1.2 times the measured commit (first to last call); the rest time it from
    the start of main() over 1.2 times the whole run. Python runs the SIGALRM handler between bytecodes, so
    the kill lands between any two steps of the commit's own code, not only at the primitives."""
    site = fresh(engine, operation, tmp / "timed")
    assert run_quiet([operation, engine.spec, "--site-packages", str(site)])[0] == 0  # warm: imports, caches
    fresh(engine, operation, site)
    with Injector() as injector:
        assert run_quiet([operation, engine.spec, "--site-packages", str(site)])[0] == 0
    duration = time.perf_counter() - injector.started
    first, last = injector.first_call or 0.0, injector.last_call
    rng = random.Random(seed)
    figures = Figures(f"{engine.spec} {operation}: SIGKILL at a random time (seed {seed})")
    for trial in range(trials):
        fresh(engine, operation, site)
        in_commit = bool(trial % 4)
        delay = rng.uniform(0.0, (last - first) * 1.2) if in_commit else rng.uniform(0.0, duration * 1.2)
        argv = [operation, engine.spec, "--site-packages", str(site)]

        def body(delay: float = delay, argv: list[str] = argv, in_commit: bool = in_commit) -> int:
            if in_commit:
                injector = Injector(action="timer")
                injector.delay = delay
                with injector:
                    code = main(argv)
            else:
                signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGKILL))
                signal.setitimer(signal.ITIMER_REAL, max(delay, 1e-5))
                code = main(argv)
            signal.setitimer(signal.ITIMER_REAL, 0)
            return code

        result = in_child(body, tmp / "child.err")
        figures.trials += 1
        if result.killed_by is None and result.code != 0:
            figures.failures.append(f"trial {trial}: exited {result.code}: {result.stderr.strip()[-200:]}")
        if engine.state(site).startswith("mixed"):
            figures.mixed_before_next_command += 1
        next_command(engine, site, f"timer trial {trial} ({delay * 1000:.2f} ms)", figures)
    return figures


def signal_trials(engine: Engine, operation: str, tmp: Path, sig: int) -> Figures:
    """SIGTERM / SIGINT at each primitive call: held until the commit ends, so the set is whole right away."""
    counts = count_calls(engine, operation, tmp)
    figures = Figures(f"{engine.spec} {operation}: {signal.Signals(sig).name} before each primitive call")
    site = tmp / "site"
    done_state = "patched" if operation == "apply" else "pristine"
    for kind in PRIMITIVES:
        for k in range(1, counts[kind] + 1):
            fresh(engine, operation, site)
            argv = [operation, engine.spec, "--site-packages", str(site)]

            def body(kind: str = kind, k: int = k, argv: list[str] = argv) -> int:
                with Injector(kind, k, "signal", sig=sig):
                    return main(argv)

            label = f"{signal.Signals(sig).name} before {kind} #{k}"
            result = in_child(body, tmp / "child.err")
            figures.trials += 1
            stopped = result.killed_by == sig or (sig == signal.SIGINT and result.code == 130)
            if not stopped:
                figures.failures.append(f"{label}: the process did not stop as asked ({result})")
            if "held until it ended: the commit completed" not in result.stderr:
                figures.failures.append(f"{label}: no line saying the commit completed: {result.stderr[-300:]!r}")
            state = check_whole(engine, site, label, figures)  # no next command: the set is whole by itself
            if state != done_state:
                figures.failures.append(f"{label}: the set is {state}, expected {done_state}")
    return figures


def error_trials(engine: Engine, operation: str, tmp: Path) -> Figures:
    """ENOSPC and EIO from the k-th call of each primitive, once or from then on."""
    counts = count_calls(engine, operation, tmp)
    figures = Figures(f"{engine.spec} {operation}: ENOSPC/EIO at each write, fsync, link, replace, unlink")
    site = tmp / "site"
    before_state = "pristine" if operation == "apply" else "patched"
    done_state = "patched" if operation == "apply" else "pristine"
    for kind in PRIMITIVES:
        for k in range(1, counts[kind] + 1):
            for err in (errno.ENOSPC, errno.EIO):
                for persistent in (False, True):
                    fresh(engine, operation, site)
                    label = f"{errno.errorcode[err]} {'from' if persistent else 'at'} {kind} #{k}"
                    with Injector(kind, k, "error", err=err, persistent=persistent):
                        code, text = run_quiet([operation, engine.spec, "--site-packages", str(site)])
                    figures.trials += 1
                    errors = [line for line in text.splitlines() if ": error: " in line]
                    state = engine.state(site)
                    if code not in (0, 3):
                        figures.failures.append(f"{label}: exit {code}: {text.strip()[-300:]}")
                    elif code == 3:
                        if len(errors) != 1:
                            figures.failures.append(f"{label}: expected one error line, found {text!r}")
                        claims_unchanged = "nothing changed" in text or "nothing was changed" in text
                        if claims_unchanged and state != before_state:
                            figures.failures.append(f"{label}: says nothing changed, but the set is {state}")
                        if not claims_unchanged and "journal" not in text:
                            figures.failures.append(f"{label}: neither unchanged nor a kept journal: {text!r}")
                    elif state != done_state:
                        figures.failures.append(f"{label}: exit 0 with the set {state}")
                    next_command(engine, site, label, figures)
    return figures


def real_enospc_trials(engine: Engine, operation: str, mount: Path) -> Figures:
    """A real full disk: the site on a small tmpfs filled up to leave 0, 1, 2, ... pages free, until the
    operation succeeds three levels in a row. Then the filler goes and the next command runs."""
    figures = Figures(f"{engine.spec} {operation}: real ENOSPC on a tmpfs, each free-space level in 4 KiB pages")
    before_state = "pristine" if operation == "apply" else "patched"
    done_state = "patched" if operation == "apply" else "pristine"
    site, filler = mount / "site", mount / "filler"
    successes, pages = 0, 0
    while successes < 3 and pages < 400:
        filler.unlink(missing_ok=True)
        fresh(engine, operation, site)
        info = os.statvfs(mount)
        with open(filler, "wb") as fh:
            fh.write(b"\0" * max(0, info.f_bavail * info.f_frsize - pages * 4096))
        code, text = run_quiet([operation, engine.spec, "--site-packages", str(site)])
        figures.trials += 1
        state = engine.state(site)
        label = f"{pages} page(s) free"
        if code == 0:
            successes += 1
            if state != done_state:
                figures.failures.append(f"{label}: exit 0 with the set {state}")
        elif code == 3:
            successes = 0
            unchanged = "nothing changed" in text or "nothing was changed" in text
            if unchanged and state != before_state:
                figures.failures.append(f"{label}: says nothing changed, but the set is {state}")
            if "No space left on device" not in text:
                figures.failures.append(f"{label}: the error does not name the cause: {text!r}")
        else:
            figures.failures.append(f"{label}: exit {code}: {text.strip()[-300:]}")
        filler.unlink()
        next_command(engine, site, label, figures)
        pages += 1
    return figures


def fault_trials(request: pytest.FixtureRequest) -> int:
    return int(request.config.getoption("--fault-trials"))


# ------------------------------------------------------------------------------------------ the tests


@pytest.fixture
def trial_tmp(tmp_path: Path) -> Iterator[Path]:
    """Where trial sites live: a tmpfs when there is one (a trial's dozens of fsyncs are then cheap; faults are
    injected at the calls, not left to the disk), else pytest's tmp_path."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="t4patch-fault-", dir=shm))
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def synthetic_env(synthetic: Engine, monkeypatch: pytest.MonkeyPatch) -> Engine:
    for key, value in synthetic.env.items():
        monkeypatch.setenv(key, value)
    return synthetic


@pytest.mark.parametrize("operation", ["apply", "revert"])
def test_kill_at_every_commit_step_synthetic(synthetic_env: Engine, operation: str, trial_tmp: Path) -> None:
    figures = kill_trials(synthetic_env, operation, trial_tmp)
    figures.report()
    assert figures.trials > 30 and figures.mixed_before_next_command > 0, figures
    assert figures.recovered >= figures.mixed_before_next_command


@pytest.mark.parametrize("operation", ["apply", "revert"])
def test_kill_at_random_times_synthetic(synthetic_env: Engine, operation: str, trial_tmp: Path,
                                        request: pytest.FixtureRequest) -> None:
    figures = timer_kill_trials(synthetic_env, operation, trial_tmp, 5 * fault_trials(request), seed=12)
    figures.report()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signals_are_held_through_the_commit(synthetic_env: Engine, sig: int, trial_tmp: Path) -> None:
    signal_trials(synthetic_env, "apply", trial_tmp, sig).report()


@pytest.mark.parametrize("operation", ["apply", "revert"])
def test_io_errors_at_every_step_synthetic(synthetic_env: Engine, operation: str, trial_tmp: Path) -> None:
    error_trials(synthetic_env, operation, trial_tmp).report()


def test_killed_subprocesses(synthetic_env: Engine, trial_tmp: Path, request: pytest.FixtureRequest) -> None:
    """Real processes (python -m t4patch) SIGKILLed at random times, then the next command; like a user's."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    site = fresh(synthetic_env, "apply", trial_tmp / "site")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "t4patch", "apply", synthetic_env.spec, "--site-packages", str(site)],
                   env=env, check=True, capture_output=True)
    duration = time.perf_counter() - start
    rng = random.Random(7)
    figures = Figures(f"{synthetic_env.spec} apply: python -m t4patch SIGKILLed at a random time")
    for trial in range(fault_trials(request)):
        fresh(synthetic_env, "apply", site)
        proc = subprocess.Popen([sys.executable, "-m", "t4patch", "apply", synthetic_env.spec, "--site-packages",
                                 str(site)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(duration * 0.5, duration * 1.1))
        proc.kill()
        proc.wait()
        figures.trials += 1
        next_command(synthetic_env, site, f"subprocess trial {trial}", figures)
    figures.report()


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted for the test (root only; skipped where mounting is not allowed)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.parametrize("operation", ["apply", "revert"])
def test_real_enospc_at_every_free_space_level_synthetic(synthetic_env: Engine, operation: str,
                                                         small_tmpfs: Path) -> None:
    figures = real_enospc_trials(synthetic_env, operation, small_tmpfs)
    figures.report()
    assert figures.trials > 3, figures


@pytest.mark.integration
def test_real_enospc_at_every_free_space_level_sglang(sglang_env: Engine, small_tmpfs: Path) -> None:
    figures = real_enospc_trials(sglang_env, "apply", small_tmpfs)
    figures.report()
    assert figures.trials > 10, figures


@pytest.fixture
def sglang_env(sglang: Engine, monkeypatch: pytest.MonkeyPatch) -> Engine:
    monkeypatch.delenv("T4PATCH_PATCHES", raising=False)
    return sglang


@pytest.mark.integration
@pytest.mark.parametrize("operation", ["apply", "revert"])
def test_kill_at_every_commit_step_sglang(sglang_env: Engine, operation: str, trial_tmp: Path) -> None:
    """The real SGLang 0.5.23 set: ten files in six directories, killed before every primitive of the commit."""
    figures = kill_trials(sglang_env, operation, trial_tmp)
    figures.report()
    assert figures.trials > 70 and figures.mixed_before_next_command > 0, figures


@pytest.mark.integration
def test_kill_at_random_times_sglang(sglang_env: Engine, trial_tmp: Path, request: pytest.FixtureRequest) -> None:
    timer_kill_trials(sglang_env, "apply", trial_tmp, 5 * fault_trials(request), seed=23).report()


@pytest.mark.integration
def test_io_errors_at_every_step_sglang(sglang_env: Engine, trial_tmp: Path) -> None:
    error_trials(sglang_env, "apply", trial_tmp).report()


@pytest.mark.integration
def test_signals_are_held_sglang(sglang_env: Engine, trial_tmp: Path) -> None:
    signal_trials(sglang_env, "revert", trial_tmp, signal.SIGTERM).report()


def test_injector_sees_the_commit(synthetic_env: Engine, trial_tmp: Path) -> None:
    """The harness itself: a commit of four files plus the record makes the calls the trials break."""
    counts = count_calls(synthetic_env, "apply", trial_tmp)
    assert counts["replace"] >= 5 and counts["link"] >= 4 and counts["fsync"] >= 6 and counts["write"] >= 6, counts


def _killed_mid_renames(engine: Engine, site: Path, tmp: Path) -> None:
    """Leave ``site`` as a run killed before its third rename leaves it: mixed, with its journal."""
    fresh(engine, "apply", site)
    argv = ["apply", engine.spec, "--site-packages", str(site)]

    def body() -> int:
        with Injector("replace", 4, "kill"):  # replace #1 is the journal's own, then the set's renames
            return main(argv)

    assert in_child(body, tmp / "child.err").killed_by == signal.SIGKILL
    assert engine.state(site).startswith("mixed") and (site / ".t4patch-journal.json").exists()


@pytest.mark.parametrize("argv", [["doctor"], ["apply", "--dry-run"], ["revert"], ["list"]],
                         ids=["doctor", "apply --dry-run", "revert", "list (no target)"])
def test_every_command_aimed_at_the_environment_recovers_first(synthetic_env: Engine, trial_tmp: Path,
                                                               argv: list[str]) -> None:
    site = trial_tmp / "site"
    _killed_mid_renames(synthetic_env, site, trial_tmp)
    command = [*argv, synthetic_env.name] if argv[0] in ("apply", "revert") else argv
    targeted = argv[0] != "list"
    code, err = run_quiet([*command, *(["--site-packages", str(site)] if targeted else [])])
    assert code == 0, err
    if not targeted:  # a command that names no environment touches none
        assert synthetic_env.state(site).startswith("mixed")
        return
    assert "found an interrupted apply of multiengine==2.0.0" in err and "finished it" in err, err
    expected = "pristine" if argv[0] == "revert" else "patched"
    assert synthetic_env.state(site) == expected and leftovers(site) == []


def test_recovery_needing_rights_this_user_lacks_is_one_line(synthetic_env: Engine, trial_tmp: Path) -> None:
    """A journal in a site this user may not write: exit 3 naming the journal; nothing is changed."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a child as another user")
    trial_tmp.chmod(0o755)
    site = trial_tmp / "site"
    _killed_mid_renames(synthetic_env, site, trial_tmp)
    for path in [site, *site.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    patches = trial_tmp / "patches"  # a copy the child may read (pytest's tmp dirs are root's alone)
    shutil.copytree(synthetic_env.env["T4PATCH_PATCHES"], patches)
    for path in [patches, *patches.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    before = synthetic_env.state(site)

    def body() -> int:
        os.environ["T4PATCH_PATCHES"] = str(patches)
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        return main(["status", "--site-packages", str(site)])

    run_quiet(["status", "--site-packages", str(patches)])  # import everything first: the child cannot read /root
    result = in_child(body, trial_tmp / "child.err")
    assert result.code == 3, result.stderr
    assert result.stderr.count("\n") == 1 and "interrupted apply" in result.stderr and "journal" in result.stderr
    assert synthetic_env.state(site) == before and (site / ".t4patch-journal.json").exists()


def test_concurrent_apply_revert_race_with_kills(synthetic_env: Engine, trial_tmp: Path) -> None:
    """Twelve processes apply and revert at once while some are SIGKILLed mid-run: every run that finishes
    succeeds, and after the next command the set is whole with nothing left behind."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    site = fresh(synthetic_env, "apply", trial_tmp / "site")
    rng = random.Random(5)
    figures = Figures(f"{synthetic_env.spec}: 12 concurrent apply/revert runs, 4 SIGKILLed, x3 rounds")
    for round_ in range(3):
        procs = [subprocess.Popen([sys.executable, "-m", "t4patch", "apply" if i % 2 else "revert",
                                   synthetic_env.name, "--site-packages", str(site)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for i in range(12)]
        victims = rng.sample(procs, 4)
        time.sleep(rng.uniform(0.2, 0.6))
        for proc in victims:
            proc.kill()
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            figures.trials += 1
            if proc not in victims and proc.returncode != 0:
                figures.failures.append(f"round {round_}: a run exited {proc.returncode}: {err.strip()[-200:]}")
        next_command(synthetic_env, site, f"round {round_}", figures)
    figures.report()


def test_a_live_commit_is_waited_for_not_recovered(synthetic_env: Engine, trial_tmp: Path) -> None:
    """A command that sees the journal of a run still committing (paused between two renames) waits for that
    run's lock, then finds the set whole: no recovery, no error (the race the concurrent test once hit)."""
    site = fresh(synthetic_env, "apply", trial_tmp / "site")
    argv = ["apply", synthetic_env.spec, "--site-packages", str(site)]
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            injector = Injector("replace", 3, "pause")
            injector.delay = 1.0
            with injector:
                code = run_quiet(argv)[0]
        finally:
            os._exit(code)
    deadline = time.monotonic() + 10
    while not (site / ".t4patch-journal.json").exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert synthetic_env.state(site).startswith("mixed") or (site / ".t4patch-journal.json").exists()
    for command in (["status", synthetic_env.name], ["revert", synthetic_env.name]):
        code, err = run_quiet([*command, "--site-packages", str(site)])
        assert code == 0 and "found an interrupted" not in err, err
        if command[0] == "status":
            assert synthetic_env.state(site) == "patched"
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert synthetic_env.state(site) == "pristine" and leftovers(site) == []
