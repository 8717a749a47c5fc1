"""Under ``run --foreground`` the job's output is also copied to this process's standard output as it
comes, so that ``kubectl logs``, ``docker logs``, Slurm's ``slurm-%j.out`` and journald show the
training. The log file stays the record, written by the job itself; the copy only reads it, in a
thread of its own, so a slow reader of standard output never slows the job and a closed one only
ends the copy (said once on standard error)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import click

from trainguard.cli.logs import follow_run
from trainguard.cli.output import say
from trainguard.paths import state_dir
from trainguard.store.registry import Registry

FINISH_S = 5.0  # how long the end of the run waits for the copy to catch up
STDOUT = 1


def _write_all(data: bytes) -> None:
    """Straight to the descriptor, unbuffered: a reader that stopped reading holds only this thread,
    never a buffer the interpreter must flush at exit."""
    view = memoryview(data)
    while view:
        view = view[os.write(STDOUT, view):]


def _copy_output(run_id: str, done: threading.Event) -> None:
    try:
        registry = Registry(state_dir())  # its own connection: the supervisor writes through the other
        record = registry.get(run_id)
        if record is not None:
            follow_run(registry, record, None, 0, until=done.is_set, write=_write_all)
    except (BrokenPipeError, ValueError):  # the reader went away, or stdout was closed under us
        click.echo(say("trainguard: standard output is closed: the job's output goes on to its log only",
                       "trainguard：标准输出已关闭：作业输出仅写入其日志"), err=True)  # fmt: skip
    except Exception as exc:  # the copy is a convenience: it never ends the supervision
        click.echo(say(f"trainguard: the job's output is no longer copied here ({exc})",
                       f"trainguard：不再在此复制作业输出（{exc}）"), err=True)  # fmt: skip


@contextlib.contextmanager
def echoing_output(run_id: str) -> Iterator[None]:
    """Copy the run's output to standard output while the block supervises it."""
    done = threading.Event()
    copier = threading.Thread(target=_copy_output, args=(run_id, done), name="trainguard-echo", daemon=True)
    copier.start()
    try:
        yield
    finally:
        done.set()
        copier.join(FINISH_S)
