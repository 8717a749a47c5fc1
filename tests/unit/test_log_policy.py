"""What of a job's output is kept: when a log rotates, what survives, what a full disk gives up,
and how `trainguard logs` finds the pieces again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.store import runlogs
from trainguard.supervisor.log_policy import (
    HEAD_BYTES,
    MIN_NEWEST,
    MIN_POLL_S,
    POLL_S,
    Disk,
    EndedLog,
    LiveLog,
    LogBound,
    MiB,
    low_water,
    plan_old_attempts,
    plan_rotation,
    poll_in,
)

ROOMY = Disk(total=100 << 30, free=50 << 30)
BOUND = LogBound(max_size=50 * MiB, backups=3)


def test_a_log_below_its_size_on_a_roomy_disk_is_left_alone() -> None:
    assert plan_rotation(LiveLog(size=49 * MiB), BOUND, ROOMY) is None


def test_the_first_rotation_saves_the_head_and_keeps_the_rest_as_the_newest_backup() -> None:
    plan = plan_rotation(LiveLog(size=50 * MiB), BOUND, ROOMY)
    assert plan is not None and not plan.pressure
    assert plan.save_head == HEAD_BYTES and plan.to_backup is None and plan.keep_backups == 2


def test_later_rotations_keep_the_head_once_and_drop_the_oldest_backup() -> None:
    plan = plan_rotation(LiveLog(size=50 * MiB, backups=(50 * MiB,) * 3, head_saved=True), BOUND, ROOMY)
    assert plan is not None and plan.save_head == 0 and plan.keep_backups == 2


def test_no_backups_keeps_only_the_head_and_the_live_log() -> None:
    plan = plan_rotation(LiveLog(size=50 * MiB, head_saved=True), LogBound(50 * MiB, 0), ROOMY)
    assert plan is not None and plan.to_backup == 0 and plan.keep_backups == 0


def test_a_writer_faster_than_the_polling_keeps_only_its_newest_size_and_no_older_pieces() -> None:
    plan = plan_rotation(LiveLog(size=900 * MiB, backups=(50 * MiB,) * 2, head_saved=True), BOUND, ROOMY)
    assert plan is not None and not plan.pressure
    assert plan.to_backup == BOUND.max_size and plan.keep_backups == 0
    a_little_over = plan_rotation(LiveLog(size=60 * MiB, backups=(50 * MiB,), head_saved=True), BOUND, ROOMY)
    assert a_little_over is not None and a_little_over.to_backup is None and a_little_over.keep_backups == 2


def test_a_fast_writer_is_polled_sooner_a_slow_one_once_a_tick() -> None:
    assert poll_in(MiB, 0.0, BOUND) == POLL_S
    assert poll_in(MiB, 1 * MiB, BOUND) == POLL_S  # 49 MiB to go at 1 MiB/s
    assert poll_in(40 * MiB, 20 * MiB, BOUND) == pytest.approx(0.5)
    assert poll_in(49 * MiB, 1 << 30, BOUND) == MIN_POLL_S  # `yes`: as often as is allowed, no more


def test_a_nearly_full_disk_rotates_early_dropping_old_backups_before_the_newest() -> None:
    disk = Disk(total=64 * MiB, free=2 * MiB)  # under the low water of a 64 MiB disk
    log = LiveLog(size=20 * MiB, backups=(10 * MiB, 10 * MiB), head_saved=True, growth=1 * MiB)
    plan = plan_rotation(log, BOUND, disk)
    assert plan is not None and plan.pressure
    freed = log.size + sum(log.backups) - ((plan.to_backup if plan.to_backup is not None else log.size)
                                           + sum(log.backups[: plan.keep_backups]))  # fmt: skip
    assert disk.free + freed >= low_water(disk.total) + 2 * log.growth
    assert plan.keep_backups < len(log.backups)


def test_under_the_most_pressure_the_newest_part_shrinks_but_never_to_nothing() -> None:
    disk = Disk(total=64 * MiB, free=0)
    log = LiveLog(size=40 * MiB, backups=(10 * MiB,), head_saved=True, growth=20 * MiB)
    plan = plan_rotation(log, BOUND, disk)
    assert plan is not None and plan.pressure and plan.to_backup == MIN_NEWEST and plan.keep_backups == 0


def test_pressure_from_something_else_is_not_answered_by_rotating_a_small_log() -> None:
    assert plan_rotation(LiveLog(size=10_000, head_saved=True), BOUND, Disk(64 * MiB, 0)) is None


def test_ended_attempts_are_trimmed_oldest_first_then_removed_only_where_allowed() -> None:
    logs = [EndedLog(n, head=MiB, backups=100 * MiB, live=50 * MiB) for n in (1, 2, 3)]
    budget = 200 * MiB
    trimmed = plan_old_attempts(logs, budget, may_remove=False)
    assert trimmed == [(1, "trim"), (2, "trim")]  # the newest ended attempt stays whole
    assert plan_old_attempts(logs, 0, may_remove=False) == [(1, "trim"), (2, "trim"), (3, "trim")]
    assert plan_old_attempts(logs, 0) == [(1, "remove"), (2, "remove"), (3, "remove")]


def test_the_default_bound_keeps_a_weeks_long_restart_loop_finite() -> None:
    bound = LogBound()  # the head, 4 x 50 MiB of the running attempt's output, 200 MiB of ended ones
    assert bound.attempt_bytes + bound.old_attempts_bytes == 1 * MiB + 200 * MiB + 200 * MiB


def test_the_pieces_are_found_in_order_with_what_was_dropped_between(tmp_path: Path) -> None:
    log = tmp_path / "attempt-1.log"
    log.write_bytes(b"live\n")
    Path(runlogs.head_path(str(log))).write_bytes(b"head\n")
    Path(runlogs.backup_path(str(log), 1)).write_bytes(b"b1\n")
    Path(runlogs.backup_path(str(log), 2)).write_bytes(b"b2\n")
    kept = runlogs.Kept(head_bytes=5, live_start=120, backups=((117, 3), (114, 3)), dropped_bytes=109, rotations=3)
    runlogs.write_kept(str(log), kept)
    pieces = runlogs.attempt_pieces(str(log))
    assert [(Path(p.path).name if p.path else None, p.start, p.size) for p in pieces] == [
        ("attempt-1.head.log", 0, 5), (None, 5, 109), ("attempt-1.log.2", 114, 3), ("attempt-1.log.1", 117, 3),
        ("attempt-1.log", 120, None),
    ]  # fmt: skip
    assert [Path(p).name for p in runlogs.kept_files(str(log))] == [
        "attempt-1.head.log", "attempt-1.log.2", "attempt-1.log.1", "attempt-1.log"]  # fmt: skip


def test_a_record_of_pieces_that_is_not_one_is_ignored(tmp_path: Path) -> None:
    log = tmp_path / "attempt-1.log"
    log.write_bytes(b"all of it\n")
    Path(runlogs.kept_record_path(str(log))).write_text(json.dumps({"head_bytes": -1, "backups": "x"}))
    assert runlogs.attempt_pieces(str(log)) == [runlogs.LogPiece(str(log), 0, None)]


def test_logs_shows_whole_lines_around_a_drop(tmp_path: Path) -> None:
    """A piece after a drop was cut at a byte: its broken first line goes with the drop (and is
    counted in it), and the marker starts a line even after a head with no newline at its end."""
    from trainguard.cli.logs import copy_kept

    log = tmp_path / "attempt-1.log"
    Path(runlogs.head_path(str(log))).write_bytes(b"line 0\nno newline yet")  # 21 bytes
    Path(runlogs.backup_path(str(log), 1)).write_bytes(b"ne 41\nline 42\n")  # starts mid-line
    log.write_bytes(b"line 43\n")
    kept = runlogs.Kept(head_bytes=21, live_start=135, backups=((121, 14),), dropped_bytes=100, rotations=2)
    runlogs.write_kept(str(log), kept)
    shown: list[bytes] = []
    end = copy_kept(str(log), 0, 1, "en", shown.append)
    lines = b"".join(shown).decode().splitlines()
    assert lines[:2] == ["line 0", "no newline yet"]
    assert lines[2].startswith("==== trainguard · 106 B of attempt 1's output dropped here"), lines[2]
    assert lines[3:] == ["line 42", "line 43"]
    assert end == 135 + len(b"line 43\n")
