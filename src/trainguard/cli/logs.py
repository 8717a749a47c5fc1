"""``trainguard logs``: a run's output, every attempt's after its marker line, and following it live
(also what ``trainguard run --follow`` shows)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import click

from trainguard._i18n import choose_language
from trainguard.cli.output import say
from trainguard.cli.params import open_registry
from trainguard.errors import UsageError
from trainguard.store.registry import Attempt, Registry, Run
from trainguard.store.runlogs import (
    LogPiece,
    LogRegion,
    attempt_pieces,
    attempt_region,
    dropped_marker,
    logs_removed_through,
    read_kept,
    start_marker,
)
from trainguard.store.states import TERMINAL_STATES, RunState

BROKEN_LINE_MAX = 64 * 1024  # a piece's first line longer than this is shown as it is, not dropped


def _to_stdout(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


def _copy(path: str, start: int, end: int | None, write: Callable[[bytes], None] = _to_stdout) -> int:
    """Print a file's bytes from ``start`` to ``end``; the position reached."""
    with open(path, "rb") as log:
        log.seek(start)
        remaining = None if end is None else end - start
        while remaining is None or remaining > 0:
            chunk = log.read(1 << 20 if remaining is None else min(1 << 20, remaining))
            if not chunk:
                break
            write(chunk)
            if remaining is not None:
                remaining -= len(chunk)
        return log.tell()


def copy_kept(log_path: str, position: int, attempt_n: int, lang: str,
              write: Callable[[bytes], None] = _to_stdout) -> int:
    """Print an attempt's output from ``position`` (an offset in all it wrote): the pieces its bounded
    log keeps (``store.runlogs``), with a line where a part was dropped. The position reached."""
    pieces = attempt_pieces(log_path)
    for i, piece in enumerate(pieces):
        end = None if piece.size is None else piece.start + piece.size
        if end is not None and end <= position:
            continue
        if piece.path is None:
            assert end is not None
            # The piece after a drop was cut at a byte, not a line: its broken first line goes with
            # the drop, so the marker stands between whole lines.
            broken = _broken_first_line(pieces[i + 1]) if i + 1 < len(pieces) else 0
            opens_a_line = i == 0 or _ends_a_line(pieces[i - 1])
            marker = dropped_marker(attempt_n, end + broken - position, lang)
            write((marker if opens_a_line else "\n" + marker).encode())
            position = end + broken
            continue
        offset = max(0, position - piece.start)
        if piece.size is None and os.path.getsize(piece.path) < offset:
            return position  # the live log is being cut right now: its record follows
        position = piece.start + _copy(piece.path, offset, None if piece.size is None else piece.size, write)
    return position


def _ends_a_line(piece: LogPiece) -> bool:
    if piece.path is None or not piece.size:
        return True
    try:
        with open(piece.path, "rb") as log:
            log.seek(piece.size - 1)
            return log.read(1) in (b"\n", b"")
    except OSError:
        return True


def _broken_first_line(piece: LogPiece) -> int:
    """Bytes up to and with the first newline of a piece (0 where there is none in its first
    BROKEN_LINE_MAX bytes)."""
    if piece.path is None:
        return 0
    try:
        with open(piece.path, "rb") as log:
            start = log.read(min(BROKEN_LINE_MAX, piece.size if piece.size is not None else BROKEN_LINE_MAX))
    except OSError:
        return 0
    newline = start.find(b"\n")
    return newline + 1 if newline >= 0 else 0


def _print_attempts(run_record: Run, only: int | None) -> None:
    """Each attempt's output after its marker line (a note on stderr for a log that is gone)."""
    lang = choose_language(None, os.environ)
    previous = None
    removed = logs_removed_through(run_record.run_dir)
    for attempt in run_record.attempts:
        if only is None or attempt.n == only:
            region = attempt_region(run_record, attempt)
            if attempt.log_path:
                sys.stdout.write(start_marker(attempt, previous, lang))
                sys.stdout.flush()
            try:
                if attempt.log_path:
                    copy_kept(attempt.log_path, 0, attempt.n, lang)
                else:
                    _copy(region.path, region.start, region.end)
            except BrokenPipeError:
                raise  # the reader left (| head): not a log that is gone
            except OSError:
                if attempt.n <= removed:
                    gone = say(f"trainguard: the log of attempt {attempt.n} was removed to keep the run's logs within "
                               "their bound (--log-max-size, --log-backups)",
                               f"trainguard：第 {attempt.n} 次尝试的日志已被删除，以使运行的日志不超过上限"
                               "（--log-max-size、--log-backups）")  # fmt: skip
                else:
                    gone = say(
                        f"trainguard: the log of attempt {attempt.n} ({region.path}) no longer exists",
                        f"trainguard：第 {attempt.n} 次尝试的日志（{region.path}）已不存在",
                    )
                click.echo(gone, err=True)
        previous = attempt


class _suppress_missing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, FileNotFoundError)


@click.command()
@click.argument("ref", metavar="RUN")
@click.option("-f", "--follow", "follow", is_flag=True, help="Keep printing new output until the run ends.")
@click.option("--attempt", type=int, help="Only this attempt's output.")
def logs(ref: str, follow: bool, attempt: int | None) -> int:
    """Print a run's log: every attempt's output, each after a marker line."""
    registry = open_registry()
    run_record = registry.resolve(ref)
    if attempt is not None and all(a.n != attempt for a in run_record.attempts):
        raise UsageError(f"run {run_record.id} has no attempt {attempt}",
                         f"运行 {run_record.id} 没有第 {attempt} 次尝试")  # fmt: skip
    chosen = [a for a in run_record.attempts if attempt is None or a.n == attempt]
    if chosen and not follow and not any(attempt_region(run_record, a).exists() for a in chosen):
        paths = sorted({attempt_region(run_record, a).path for a in chosen})
        raise UsageError(f"run {run_record.id}: its log no longer exists ({', '.join(paths)})",
                         f"运行 {run_record.id}：日志已不存在（{', '.join(paths)}）")  # fmt: skip
    _print_attempts(run_record, attempt)
    if follow and (attempt is None or attempt == run_record.attempts[-1].n):
        last = run_record.attempts[-1] if run_record.attempts else None
        position = 0
        if last is not None:
            region = attempt_region(run_record, last)
            try:
                position = region.end if region.end is not None else _written(last.log_path or region.path)
            except OSError:
                position = region.start
        follow_run(registry, run_record, last.n if last else None, position)
    return 0


def follow_run(registry: Registry, record: Run, attempt_n: int | None = None, position: int = 0, *,
               until: Callable[[], bool] = lambda: False, write: Callable[[bytes], None] = _to_stdout) -> None:
    """Print new output as it comes from ``position`` of attempt ``attempt_n`` (from the first
    attempt when None), moving on to each new attempt's log after its marker, until the run ends
    (or ``until`` says so: then what is written so far is printed first)."""
    lang = choose_language(None, os.environ)
    current = next((a for a in record.attempts if a.n == attempt_n), None)
    try:
        while True:
            if current is not None:
                region = attempt_region(record, current)
                with _suppress_missing():
                    position = _copy_from(current, region, position, lang, write)
            record = registry.get(record.id) or record
            newer = [a for a in record.attempts if current is None or a.n > current.n]
            if newer:
                if current is not None:  # what the old attempt wrote last, then the new one's marker
                    with _suppress_missing():
                        _copy_from(current, region, position, lang, write)
                previous, current = current, newer[0]
                if current.log_path:
                    write(start_marker(current, previous, lang).encode())
                position = 0
                continue
            if RunState(record.state) in TERMINAL_STATES or until():
                if current is not None:
                    with _suppress_missing():
                        _copy_from(current, region, position, lang, write)
                return
            time.sleep(0.2)
    except KeyboardInterrupt:
        click.echo(say("\n(stopped following; the job goes on)", "\n（已停止跟踪；作业继续运行）"), err=True)


def _written(log_path: str) -> int:
    """How much an attempt has written so far (what its bounded log dropped included)."""
    return read_kept(log_path).live_start + os.path.getsize(log_path)


def _copy_from(attempt: Attempt, region: LogRegion, position: int, lang: str, write: Callable[[bytes], None]) -> int:
    if attempt.log_path:
        return copy_kept(attempt.log_path, position, attempt.n, lang, write)
    return _copy(region.path, max(position, region.start), region.end, write)
