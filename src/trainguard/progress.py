"""What a training process tells its supervisor: how far it got, where it resumed from, and that it
stopped because a signal asked it to. The training side of this (``report_*``) is stdlib only and
never raises; the supervisor side (``read``) merges what every rank wrote.

Under ``trainguard run`` the supervisor sets ``TRAINGUARD_PROGRESS_FILE`` for each attempt. Each
process writes one small JSON object there, replaced atomically (temporary file, rename), so a reader
never sees half of one. Rank 0 (or a process without ``RANK``) writes the file itself, other ranks
``<file>.rank<N>``. Progress is written at most once per ``PROGRESS_INTERVAL_S``; a resume and a
stop are written at once.

Fields (all optional): ``step`` and ``step_time`` (the newest step reached, wall time), ``first_step``
and ``first_step_time`` (the first step of this attempt: when it was training again),
``resumed_step``, ``stop_signal`` and ``stop_time`` (a SIGTERM/SIGUSR1 made the job save and stop),
``checkpoint_dir`` (the folder the job's checkpoints really go to), ``saves`` (the newest
checkpoints the job completed, ``[step, time, path]`` each: the supervisor records them even when
pruning removes them before it looks at the folder), ``save_request_done``, ``save_request_step`` and
``save_request_time`` (the id of the newest save request answered, the step of the checkpoint that
answers it, when that checkpoint was on disk: see ``checkpoint.saverequest``),
``checkpoint_interval_s``, ``checkpoint_interval_why`` and ``checkpoint_interval_why_zh``
(``every="auto"``: the period chosen and why), ``pid``, ``rank``. The supervisor adds
``last_active_time`` when the attempt ends: when it last saw the job active (output, a checkpoint, a
step), which a hang's silence or a kill between two reports leaves behind ``step_time``.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import json
import os
import tempfile
import time
from typing import Any

from trainguard import _untrusted as untrusted

PROGRESS_FILE_ENV = "TRAINGUARD_PROGRESS_FILE"
PROGRESS_INTERVAL_S = 2.0
SAVES_KEPT = 32  # saves listed in the record: more than a job completes between two of its writes

_record: dict[str, Any] = {}
_last_write = 0.0
_unwritten = False  # the record changed since it was last written
_flush_registered = False


def _target() -> str | None:
    path = os.environ.get(PROGRESS_FILE_ENV)
    if not path:
        return None
    rank = os.environ.get("RANK", "0")
    return path if rank in ("", "0") else f"{path}.rank{rank}"


def _write(now: float) -> None:
    global _last_write, _unwritten, _flush_registered
    target = _target()
    if target is None:
        return
    if not _flush_registered:  # the steps since the last write reach the supervisor at a normal exit
        _flush_registered = True
        atexit.register(_flush)
    _last_write = now
    _unwritten = False
    _record.update(pid=os.getpid(), rank=int(os.environ.get("RANK") or 0))
    try:
        folder = os.path.dirname(os.path.abspath(target))
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, prefix=".tmp-progress-") as out:
            json.dump(_record, out)
        os.replace(out.name, target)
    except OSError:
        with contextlib.suppress(OSError, NameError):
            os.unlink(out.name)  # a full disk must not stop the training: the report is lost, not the job


def _flush() -> None:
    if _unwritten:
        _write(time.time())


def report_step(step: int, *, force: bool = False) -> None:
    """The job reached ``step``. Cheap enough to call every step: written at most every 2 s (and at
    exit)."""
    global _unwritten
    _unwritten = True
    now = time.time()
    if "first_step" not in _record:
        _record.update(first_step=step, first_step_time=now)
        force = True
    _record.update(step=step, step_time=now)
    if force or now - _last_write >= PROGRESS_INTERVAL_S:
        _write(now)


def report_resumed(step: int) -> None:
    """The job loaded the checkpoint of ``step`` and continues after it."""
    _record["resumed_step"] = step
    _write(time.time())


def report_checkpoint_dir(path: str) -> None:
    """Where the job really keeps its checkpoints (a folder given to ``Checkpointer`` wins over
    TRAINGUARD_CHECKPOINT_DIR): the supervisor resumes and reports from there."""
    if _record.get("checkpoint_dir") != path:
        _record["checkpoint_dir"] = path
        _write(time.time())


def report_saved(step: int, path: str, saved_at: float | None = None) -> None:
    """A checkpoint of ``step`` is complete on disk at ``path`` (``saved_at``: the time its manifest
    holds). Written with the next report: frequent saves cost no extra write."""
    global _unwritten
    _unwritten = True
    saves = _record.setdefault("saves", [])
    saves.append([int(step), time.time() if saved_at is None else float(saved_at), os.path.abspath(path)])
    del saves[:-SAVES_KEPT]


def report_stop(signal_number: int, step: int | None = None) -> None:
    """A stop signal arrived and the job is leaving its loop on purpose (its state saved): the
    supervisor reads an exit 0 after this as a preemption, not as the end of the training."""
    now = time.time()
    if step is not None:
        _record.update(step=step, step_time=now)
    _record.update(stop_signal=int(signal_number), stop_time=now)
    _write(now)


def report_save_request_done(request_id: int, step: int, saved_at: float | None = None) -> None:
    """A checkpoint of ``step`` taken after save request ``request_id`` arrived is on disk: the
    supervisor that asked can stop waiting. Written at once."""
    now = time.time()
    _record.update(save_request_done=int(request_id), save_request_step=int(step),
                   save_request_time=now if saved_at is None else float(saved_at))  # fmt: skip
    _write(now)


def report_checkpoint_interval(seconds: float, why: str, why_zh: str) -> None:
    """``every="auto"`` chose to save every ``seconds``, for the reason ``why`` (English, Chinese).
    Written at once when it changed: it changes after a save, a minute apart at the most often."""
    if (_record.get("checkpoint_interval_s"), _record.get("checkpoint_interval_why")) == (seconds, why):
        return
    _record.update(checkpoint_interval_s=float(seconds), checkpoint_interval_why=why, checkpoint_interval_why_zh=why_zh)
    _write(time.time())


def _is_save(entry: Any) -> bool:
    return (isinstance(entry, list) and len(entry) == 3 and untrusted.is_int(entry[0])
            and untrusted.is_number(entry[1]) and untrusted.is_text(entry[2]))  # fmt: skip


# What a record may hold, each field with the kind of value the supervisor relies on.
FIELDS = {
    "step": untrusted.is_int,
    "step_time": untrusted.is_number,
    "first_step": untrusted.is_int,
    "first_step_time": untrusted.is_number,
    "resumed_step": untrusted.is_int,
    "stop_signal": untrusted.is_int,
    "stop_time": untrusted.is_number,
    "checkpoint_dir": untrusted.is_text,
    "save_request_done": untrusted.is_int,
    "save_request_step": untrusted.is_int,
    "save_request_time": untrusted.is_number,
    "checkpoint_interval_s": untrusted.is_number,
    "checkpoint_interval_why": untrusted.is_text,
    "checkpoint_interval_why_zh": untrusted.is_text,
    "saves": lambda saves: isinstance(saves, list) and all(_is_save(entry) for entry in saves),
    "pid": untrusted.is_int,
    "rank": untrusted.is_int,
    "last_active_time": untrusted.is_number,
}


def read(path: str) -> dict[str, Any]:
    """What the job's processes reported for one attempt: rank 0's record, with the earliest stop
    signal and the earliest first step of any rank. Empty when nothing was written. The job is the
    writer: a file that is not a bounded JSON object, or a field of the wrong kind, is ignored with a
    warning."""
    records = {}
    for name in glob.glob(glob.escape(path)) + glob.glob(glob.escape(path) + ".rank*"):
        record = untrusted.load_object(name)
        if record is not None:
            records[name] = untrusted.typed_fields(name, record, FIELDS)
    if not records:
        return {}
    merged = dict(records.get(path) or next(iter(records.values())))
    for key, time_key in (("stop_signal", "stop_time"), ("first_step", "first_step_time")):
        timed = [r for r in records.values() if time_key in r]
        if timed:
            earliest = min(timed, key=lambda r: r[time_key])
            merged.update({key: earliest.get(key), time_key: earliest[time_key]})
    return merged
