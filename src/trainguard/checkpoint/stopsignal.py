"""``StopSignal``: SIGTERM/SIGUSR1 become a request to save and stop, acted on by the training loop.

A scheduler's SIGTERM (Slurm, Kubernetes, a spot reclaim, ``docker stop``) or a pre-timeout SIGUSR1
(``sbatch --signal=B:USR1@120``) must not kill the job where it stands: the handler only records the
signal, and the loop saves at its next step end and leaves. Handlers that were installed before are
still called. Used by ``Checkpointer`` and by the framework integrations (``trainguard.integrations``).

While a handler is installed, processes forked from this one (DataLoader workers, a multiprocessing
pool) start with the stop signals blocked: a signal sent to every process at once (``scancel``, a
launcher's ``killpg``, ``kill -TERM -PGID``) would kill the workers first, and the training loop,
waiting in ``next(it)``, would die of their death before it could save. Blocked, the signal waits
unseen; the workers end as they always do, when their parent shuts them down or exits (a stop
signal from the parent itself still ends a worker).

A signal is kept for the loop only once the loop has asked for one (read ``received``): a job that
never asks (it calls ``Checkpointer.save()`` itself and never ``maybe_save``) would otherwise ignore
every SIGTERM until the scheduler's SIGKILL. Until then a stop signal takes its usual course: the
handler that was there before, or the default action (the process ends by that signal).

    stop = StopSignal()            # installs the handlers (main thread only)
    ...
    if stop.received is not None:  # the signal number; from now on the loop acts on stop signals
        save(); break
    stop.close()                   # puts the previous handlers back
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import weakref
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("trainguard.checkpoint")

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1)

_installed_here = 0  # StopSignals installed in this process now; a forked child inherits the count
_fork_hook = False
_installed: weakref.WeakSet[StopSignal] = weakref.WeakSet()


def _block_in_forked_worker() -> None:
    global _installed_here
    if _installed_here:
        _installed_here = 0  # the worker itself saves nothing: its own children are not shielded again
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        threading.Thread(target=_end_when_the_parent_asks, args=(os.getppid(),), daemon=True,
                         name="trainguard-worker-stop").start()  # fmt: skip


def _end_when_the_parent_asks(parent: int) -> None:
    """The stop signals a shielded worker receives: one from its parent (a DataLoader shutting its
    workers down, multiprocessing's terminate at exit) ends it, as torch's own worker handler does;
    one sent to every process (scancel, killpg) is dropped, and the worker ends when its parent
    shuts it down or exits."""
    while True:
        info = signal.sigwaitinfo(STOP_SIGNALS)
        if info.si_pid == parent or os.getppid() != parent:
            os._exit(0)


class StopSignal:
    """Records the first stop signal; ``received`` is its number, or None."""

    def __init__(self, signals: Iterable[int] = STOP_SIGNALS, *, install: bool = True) -> None:
        self.signals = tuple(signals)
        self.polled = False  # the loop asked for a stop signal: from then on one is kept for it
        self._received: int | None = None
        self._previous: dict[int, Any] = {}
        if install:
            self.install()

    @property
    def received(self) -> int | None:
        """The first stop signal's number, or None. Reading it is the loop asking: from then on a stop
        signal waits for the loop instead of taking its usual course."""
        self.polled = True
        return self._received

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def install(self) -> bool:
        """Install the handlers (again after ``close``). Python only lets the main thread do this:
        elsewhere it logs a warning and returns False."""
        global _installed_here, _fork_hook
        if self._previous:
            return True
        if threading.current_thread() is not threading.main_thread():
            log.warning("stop signals set up outside the main thread: SIGTERM/SIGUSR1 will not trigger a save")
            return False
        for signum in self.signals:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)
        if not _fork_hook:
            os.register_at_fork(after_in_child=_block_in_forked_worker)
            _fork_hook = True
        _installed_here += 1
        _installed.add(self)
        return True

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only record: the save happens in the training loop's own time, never inside a handler.
        if self._received is None:
            self._received = signum
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)  # another StopSignal among them: the oldest one decides below
        elif previous != signal.SIG_IGN and not any(s.polled for s in _installed if signum in s.signals):
            self._take_its_course(signum)

    def _take_its_course(self, signum: int) -> None:
        """Nothing in this process ever asked for a stop signal: end by it, as if no handler were there."""
        name = signal.Signals(signum).name
        # os.write, not logging or print: a handler may run in the middle of a write to stderr
        os.write(
            2,
            f"trainguard: {name} arrived before the training loop ever asked for one (no maybe_save, no "
            f"stop_requested): nothing here can save at a step end, so {name} ends the process\n".encode(),
        )
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    def close(self) -> None:
        """Put back the handlers that were there before, where ours is still the one installed."""
        global _installed_here
        if self._previous:
            _installed_here = max(_installed_here - 1, 0)
        _installed.discard(self)
        if threading.current_thread() is threading.main_thread():
            for signum, previous in self._previous.items():
                if signal.getsignal(signum) == self._on_signal:
                    signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
