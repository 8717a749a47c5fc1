"""Hugging Face ``Trainer``: save on SIGTERM/SIGUSR1 and resume from the newest COMPLETE checkpoint.

    from trainguard.integrations.huggingface import TrainguardCallback, resume_from_checkpoint

    args = TrainingArguments(output_dir=os.environ.get("TRAINGUARD_CHECKPOINT_DIR", "out"), save_steps=500, ...)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[TrainguardCallback()])
    trainer.train(resume_from_checkpoint=resume_from_checkpoint(args.output_dir))

On a stop signal the callback makes the Trainer save a ``checkpoint-N`` at the end of the current
step (``control.should_save``) and stop (``control.should_training_stop``); the process then exits
with status 0 at the end of ``train()`` (``exit_after_save=False`` returns instead, with
``callback.stopped`` set), and trainguard restarts it as ``preempted``. The global step is reported
to the supervisor, and an uncaught exception reaches the error file. A save request of the supervisor
(``TRAINGUARD_SAVE_REQUEST_FILE``, see ``trainguard.checkpoint.saverequest``) makes the Trainer save at
the end of the current step and train on (or stop, when the request says so), every rank together.

``resume_from_checkpoint=True`` would let transformers take the highest ``checkpoint-N`` even when a
kill cut it short; ``resume_from_checkpoint()`` gives the one trainguard chose
(``TRAINGUARD_RESUME_FROM``), else the newest complete one in ``output_dir``, else None.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from transformers import TrainerCallback

from trainguard import progress
from trainguard.checkpoint import layouts
from trainguard.checkpoint.saverequest import SaveRequests
from trainguard.checkpoint.stopsignal import STOP_SIGNALS, StopSignal
from trainguard.errorfile import install_excepthook
from trainguard.integrations._ranks import agreed_asks
from trainguard.integrations.loop import resume_path

__all__ = ["TrainguardCallback", "resume_from_checkpoint"]


def resume_from_checkpoint(output_dir: str | None = None) -> str | None:
    """What to pass as ``trainer.train(resume_from_checkpoint=...)``: a complete checkpoint or None."""
    path = resume_path()
    if path is None and output_dir is not None:
        newest = layouts.newest_complete(output_dir, "hf")
        path = newest.path if newest else None
    return path


class TrainguardCallback(TrainerCallback):
    def __init__(self, *, exit_after_save: bool = True, signals: Iterable[int] = STOP_SIGNALS) -> None:
        self.exit_after_save = exit_after_save
        self._signal = StopSignal(signals, install=False)
        self._requests = SaveRequests()
        self.stop_signal: int | None = None
        self.stopped = False  # a stop signal made the Trainer save and stop
        self.resumed_step: int | None = None
        self._reported = False
        install_excepthook()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._signal.install()
        if state.global_step > 0:  # the Trainer loaded trainer_state.json of a checkpoint
            self.resumed_step = state.global_step
            progress.report_resumed(state.global_step)
            print(f"trainguard: resumed at step {state.global_step}", file=sys.stderr, flush=True)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        progress.report_step(state.global_step)
        if self.stopped:
            return
        signum, asked = agreed_asks(self._signal, self._requests)
        if signum or asked:
            self._requests.taken()  # answered once on_save says the checkpoint is written
            control.should_save = True
        if signum:
            self.stop_signal, self.stopped = signum, True
            control.should_training_stop = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._requests.saved(state.global_step)
        if self.stopped and not self._reported:
            self._reported = True
            progress.report_stop(self.stop_signal or 0, state.global_step)
            print(f"trainguard: signal {self.stop_signal}: saved checkpoint-{state.global_step}, stopping",
                  file=sys.stderr, flush=True)  # fmt: skip

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._signal.close()
        if self.stopped and self.exit_after_save:
            raise SystemExit(0)
