"""``PreemptionGuard``: save-and-stop on SIGTERM/SIGUSR1 for a hand-written training loop (Accelerate,
DeepSpeed, plain PyTorch), in three lines::

    guard = PreemptionGuard()
    for step in range(start, total_steps):
        ...                                                   # one training step
        if guard.step_end(step, save=lambda: accelerator.save_state()):
            break                                             # saved; exit 0 and trainguard resumes

``step_end`` reports the step to the supervisor (``trainguard.progress``); once a stop signal has
arrived (on any rank: the ranks agree, so all save at the same step) it calls ``save``, tells the
supervisor that the job stopped on a signal (an exit 0 after this is ``preempted``, and restarted),
and returns True. A save request of the supervisor (``TRAINGUARD_SAVE_REQUEST_FILE``, see
``trainguard.checkpoint.saverequest``) calls ``save`` at the next step end too, and training goes on
(returns False), or stops as on SIGUSR1 when the request says so. The signal machinery is
``Checkpointer``'s (``StopSignal``); an uncaught exception is written to the error file
(``TRAINGUARD_ERROR_FILE``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

from trainguard import progress
from trainguard.checkpoint.saverequest import SaveRequests
from trainguard.checkpoint.stopsignal import STOP_SIGNALS, StopSignal
from trainguard.errorfile import install_excepthook
from trainguard.integrations._ranks import agreed_asks

RESUME_ENV = "TRAINGUARD_RESUME_FROM"


def resume_path() -> str | None:
    """The checkpoint trainguard chose to resume from (the newest complete one), or None."""
    return os.environ.get(RESUME_ENV) or None


class PreemptionGuard:
    def __init__(self, signals: Iterable[int] = STOP_SIGNALS) -> None:
        self._signal = StopSignal(signals)
        self._requests = SaveRequests()
        self.stop_signal: int | None = None  # the signal the ranks agreed to stop on
        self.stopped = False  # saved and stopping
        self.resumed_step: int | None = None
        install_excepthook()

    @property
    def stop_requested(self) -> bool:
        """A stop signal reached this process (``step_end`` acts on it)."""
        return self._signal.received is not None

    def resumed(self, step: int) -> None:
        """Tell the supervisor the job loaded the checkpoint of ``step``."""
        self.resumed_step = step
        progress.report_resumed(step)
        print(f"trainguard: resumed at step {step}", file=sys.stderr, flush=True)

    def step_end(self, step: int, save: Callable[[], Any]) -> bool:
        """Call after each step: True when a stop signal arrived and ``save()`` has run: leave the loop.
        A save request calls ``save()`` too, and returns False unless it asked to stop."""
        progress.report_step(step)
        if self.stopped:
            return True
        signum, asked = agreed_asks(self._signal, self._requests)
        if not (signum or asked):
            return False
        self._requests.taken()
        save()
        self._requests.saved(step)
        if not signum:
            print(f"trainguard: a save request: saved at step {step}, going on", file=sys.stderr, flush=True)
            return False
        self.stop_signal, self.stopped = signum, True
        progress.report_stop(signum, step)
        print(f"trainguard: signal {signum}: saved at step {step}, stopping", file=sys.stderr, flush=True)
        return True

    def close(self) -> None:
        """Put back the signal handlers there were before."""
        self._signal.close()

    def __enter__(self) -> PreemptionGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
