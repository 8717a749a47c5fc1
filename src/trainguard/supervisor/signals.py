"""The signals a supervisor is sent: a stop (SIGTERM, SIGINT), a save request (SIGUSR1, a scheduler's
pre-timeout signal) and a closed terminal (SIGHUP, no reason to stop). The handlers only record what
came; the supervisor's loops act on it, woken at once through the wakeup pipe."""

from __future__ import annotations

import contextlib
import os
import select
import signal


class SignalInbox:
    """What the signals asked for and has not been acted on yet."""

    def __init__(self) -> None:
        self.stop_requested: int | None = None
        self.stop_signals = 0  # how many came, the one that ended the run included
        self.save_requested: int | None = None  # a save request not yet passed on to the job
        self.save_request_new = False
        self._wakeup_read: int | None = None

    def install(self) -> None:
        # A closed terminal is no reason to stop. Not SIG_IGN: the job would inherit it through exec
        # and could not be told anything with SIGHUP (a handler is reset to the default there).
        signal.signal(signal.SIGHUP, lambda *_: None)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_stop_signal)
        # A pre-timeout signal (`sbatch --signal=B:USR1@120`) asks the job to save, not the run to stop.
        signal.signal(signal.SIGUSR1, self._on_save_signal)
        # A stop signal wakes the wait below at once (the handler itself only records it).
        self._wakeup_read, wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wakeup_write)
        # One that came while the supervisor was starting (blocked until now) is delivered here.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})

    def _on_stop_signal(self, signum: int, _frame: object) -> None:
        self.stop_requested = signum
        self.stop_signals += 1

    def _on_save_signal(self, signum: int, _frame: object) -> None:
        self.save_requested = signum
        self.save_request_new = True

    def wait(self, fd: int, timeout_s: float) -> None:
        """Sleep until ``fd`` can be read (a pidfd: the job exited), a signal comes, or the timeout
        passes."""
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        if self._wakeup_read is not None:
            poller.register(self._wakeup_read, select.POLLIN)
        poller.poll(max(0, int(timeout_s * 1000)))
        if self._wakeup_read is not None:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wakeup_read, 512)
