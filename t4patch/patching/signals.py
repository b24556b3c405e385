"""Hold SIGINT, SIGTERM, SIGHUP and SIGQUIT while a patch set is being committed.

Ctrl-C or a ``kill`` in the middle of ten renames would otherwise stop the process with the set half
applied. During the commit these signals are only recorded; when it is over (done or rolled back) the caller
says what is on disk, and the first signal is delivered again with its previous handler in place, so the
process still stops the way the sender asked (exit 130 for Ctrl-C, killed by SIGTERM). SIGKILL and power loss
cannot be held: the intent journal (:mod:`t4patch.patching.journal`) covers those.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@dataclass
class Held:
    """Signals that arrived while held, and what the commit left on disk (set by the committer)."""

    received: list[int] = field(default_factory=list)
    outcome: str = "the commit did not finish"


@contextlib.contextmanager
def held_signals(report: Callable[[str], None] | None = None) -> Iterator[Held]:
    """Record the :data:`HELD` signals instead of acting on them; re-deliver the first one on exit.

    ``report`` is called with a sentence (which signal, and ``Held.outcome``) before the signal is
    re-delivered. Outside the main thread (where Python cannot install handlers) nothing is held.
    """
    held = Held()
    if threading.current_thread() is not threading.main_thread():
        yield held
        return

    def record(signum: int, _frame: object) -> None:
        held.received.append(signum)

    previous: dict[signal.Signals, Any] = {}
    for signum in HELD:
        previous[signum] = signal.signal(signum, record)
    try:
        yield held
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if held.received:
            first = held.received[0]
            if report is not None:
                report(f"{signal.Signals(first).name} arrived during the commit and was held until it ended: "
                       f"{held.outcome}")
            signal.raise_signal(first)
