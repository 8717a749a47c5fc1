"""Lightning: save on SIGTERM/SIGUSR1 (outside Slurm mode too) and resume from the newest COMPLETE
``.ckpt``.

    from trainguard.integrations.lightning import TrainguardCallback, ckpt_path

    folder = os.environ.get("TRAINGUARD_CHECKPOINT_DIR", "ckpt")
    trainer = L.Trainer(callbacks=[ModelCheckpoint(dirpath=folder, every_n_train_steps=500),
                                   TrainguardCallback()], ...)
    trainer.fit(model, data, ckpt_path=ckpt_path(folder))

On a stop signal the callback saves ``epoch=E-step=S.ckpt`` (in the ``ModelCheckpoint`` folder, else
``TRAINGUARD_CHECKPOINT_DIR``, else ``default_root_dir``) at the end of the current batch, on every
rank at the same step, and stops the Trainer; the process then exits with status 0
(``exit_after_save=False``: ``fit`` returns, with ``callback.stopped`` set) and trainguard restarts it
as ``preempted``. Without it, Lightning saves on SIGUSR1 only in its Slurm mode and on SIGTERM only
stops at the end of the epoch. The global step is reported to the supervisor, and an exception
reaches the error file. A save request of the supervisor (``TRAINGUARD_SAVE_REQUEST_FILE``, see
``trainguard.checkpoint.saverequest``) saves the same ``.ckpt`` at the end of the current batch, every
rank together, and training goes on (or stops, when the request says so). A mid-epoch resume is
exact only with a dataloader that has ``state_dict``/``load_state_dict`` (Lightning restores it);
otherwise the epoch's data restarts.

Works with ``lightning`` and with ``pytorch_lightning`` (the one already imported wins).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

if "pytorch_lightning" in sys.modules and "lightning.pytorch" not in sys.modules:
    from pytorch_lightning.callbacks import Callback, ModelCheckpoint
else:
    try:
        from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    except ImportError:
        from pytorch_lightning.callbacks import Callback, ModelCheckpoint

from trainguard import progress
from trainguard.checkpoint import layouts
from trainguard.checkpoint.saverequest import SaveRequests
from trainguard.checkpoint.stopsignal import STOP_SIGNALS, StopSignal
from trainguard.errorfile import install_excepthook, write_error_file
from trainguard.integrations._ranks import own_asks
from trainguard.integrations.loop import resume_path

__all__ = ["TrainguardCallback", "ckpt_path"]


def ckpt_path(dirpath: str | None = None) -> str | None:
    """What to pass as ``trainer.fit(..., ckpt_path=...)``: a complete ``.ckpt`` or None."""
    path = resume_path()
    if path is None and dirpath is not None:
        newest = layouts.newest_complete(dirpath, "lightning")
        path = newest.path if newest else None
    return path


class TrainguardCallback(Callback):
    def __init__(self, *, exit_after_save: bool = True, signals: Iterable[int] = STOP_SIGNALS) -> None:
        self.exit_after_save = exit_after_save
        self._signal = StopSignal(signals, install=False)
        self._requests = SaveRequests()
        self.stop_signal: int | None = None
        self.stopped = False  # a stop signal made it save and stop the Trainer
        self.saved_path: str | None = None
        self.resumed_step: int | None = None
        install_excepthook()

    # Installed before the Trainer registers its own handlers (after on_fit_start), which then call
    # this one too: Lightning's SIGTERM bookkeeping keeps working.
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._signal.install()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.global_step > 0:  # restored from ckpt_path
            self.resumed_step = trainer.global_step
            progress.report_resumed(trainer.global_step)
            print(f"trainguard: resumed at step {trainer.global_step}", file=sys.stderr, flush=True)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        progress.report_step(trainer.global_step)
        if self.stopped:
            return
        signum, save = own_asks(self._signal, self._requests)
        decide = trainer.strategy.reduce_boolean_decision  # any rank: all save at this step
        if not decide(bool(signum) or save, all=False):  # the one collective of an ordinary batch
            return
        if decide(bool(signum), all=False):
            self._save_and_stop(trainer, signum)
        else:
            self._save(trainer)
            print(f"trainguard: a save request: saved {self.saved_path}, going on", file=sys.stderr, flush=True)

    def _save(self, trainer: Any) -> None:
        self._requests.taken()
        path = os.path.join(self._folder(trainer), f"epoch={trainer.current_epoch}-step={trainer.global_step}.ckpt")
        trainer.save_checkpoint(path)
        self.saved_path = path
        self._requests.saved(trainer.global_step)

    def _save_and_stop(self, trainer: Any, signum: int) -> None:
        self.stopped = True
        self.stop_signal = signum or 15  # another rank's signal
        self._save(trainer)
        path = self.saved_path
        progress.report_stop(self.stop_signal, trainer.global_step)
        trainer.should_stop = True
        print(f"trainguard: signal {self.stop_signal}: saved {path}, stopping", file=sys.stderr, flush=True)

    @staticmethod
    def _folder(trainer: Any) -> str:
        saver = next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint) and c.dirpath), None)
        return str(saver.dirpath) if saver else os.environ.get("TRAINGUARD_CHECKPOINT_DIR") or trainer.default_root_dir

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.stopped and self.exit_after_save:
            raise SystemExit(0)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if type(exception).__name__ == "SIGTERMException" and not self.stopped:
            # Lightning's own SIGTERM check (every batch when distributed) got there first: the
            # batch is finished and every rank is here, so the state can still be saved.
            self._save_and_stop(trainer, 15)
        elif not isinstance(exception, (SystemExit, KeyboardInterrupt)):
            write_error_file(exception)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._signal.close()
