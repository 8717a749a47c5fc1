"""Goodput: of a run's wall time, how much trained and was kept, and what each death or stop cost.
PURE: a function of the run's attempts (their times, how they ended, what the job reported through
``trainguard.progress``) and of its checkpoints' times and steps; no I/O, no clock.

Kept means saved for good: in a checkpoint that a later attempt resumed from, or in the finished
result (the attempt that ended the run by succeeding keeps all its training). The work after the
newest checkpoint of an attempt that did not finish is lost, whatever ended it (a death, a stop asked
for, a signal the job obeyed); an attempt that saved at its last step (on SIGTERM) lost nothing.

The wall time is every attempt's span plus the gaps after deaths (backoff, start-up); the gap after a
stop, before the run was continued, is a pause, not part of it. It splits exactly into:

- training: from an attempt's first reported step to its last (the whole attempt when the job
  reports no steps: measured by its checkpoints' times). Of that, *kept* is what is saved for good,
  the rest is recomputed, or unsaved in a run still going.
- recomputed: steps redone after resuming from an older checkpoint: the steps past the checkpoint
  the next attempt resumed from, at the rate the ending attempt trained; where steps are unknown, the
  time since the checkpoint it resumed from (all of it when it started fresh). When the run ended
  unfinished (a death, a stop), the work since its newest checkpoint counts the same way, as never
  saved (``Loss.redone`` False): continuing the run redoes it.
- unsaved: in a run that may still continue by itself (running, backing off, stopping), the training
  since its newest checkpoint, neither kept nor lost yet. The ratio counts what is kept so far (it
  rises at each checkpoint); ``describe`` says so: "58% so far (4.9 s of training kept in 8.5 s wall
  time; 3.1 s (31 steps) of training not in a checkpoint yet)".
- restart: from a death to the job training again (the next attempt's first reported step; its
  start where the job reports no steps): backoff, process start, loading the checkpoint.
- stalled: from the last sign of activity of an attempt (its last reported step, or later output the
  supervisor saw) to its death: a hang's silence, a step cut short.
- overhead: start-up before the first step and shut-down after the last of attempts that did not
  follow or end in a death.
- unknown: a job that reports no steps, in a run that recorded no checkpoint, tells nothing of its
  training: its attempts' time is unknown, the ratio None and ``measured_by`` "unknown" (never
  "100 %"); only the gaps after deaths are still known, as restart.

goodput = kept / wall; training = kept + recomputed + unsaved.

Where it lives: ``_records`` the input and output types and how the registry's records become
inputs, ``_split`` the computation, ``_texts`` the lines a person reads. Import from here.
"""

from trainguard.goodput._records import (
    AttemptRecord,
    CheckpointMark,
    Goodput,
    Loss,
    attempt_records,
    checkpoint_marks,
)
from trainguard.goodput._split import compute, of_run
from trainguard.goodput._texts import describe, describe_loss, steps_text

__all__ = [
    "AttemptRecord",
    "CheckpointMark",
    "Goodput",
    "Loss",
    "attempt_records",
    "checkpoint_marks",
    "compute",
    "describe",
    "describe_loss",
    "of_run",
    "steps_text",
]
