"""doctor's checkpoint_disk_room: a run's checkpoints go to the state folder (under the home directory)
unless --checkpoint-dir, and a small home or a small quota there is warned of before a save fills it.
As a pure function of recorded snapshots, then for real: the state folder (and a home) on a small
tmpfs, and a user quota on a loop-mounted ext4 where the kernel has quotas."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.real import faults
from trainguard.doctor.checks import GIB, Status, run_checks
from trainguard.doctor.facts import Facts, StateDisk
from trainguard.probes.disk_quota import Quota, mount_source, parse_dqblk, user_quota

HOME_STATE = "/home/u/.local/state/trainguard"
ROOMY = Facts(state_disk=StateDisk(HOME_STATE, True, 500 * GIB, 1000 * GIB))


def room(facts: Facts):
    return run_checks(facts, ["checkpoint_disk_room"])[0]


# ---------------------------------------------------------------------------------------------- pure
def test_a_roomy_state_disk_is_ok() -> None:
    result = room(ROOMY)
    assert result.status is Status.OK and "500.0 GiB" in result.summary["en"]


def test_a_small_home_warns_and_says_to_pass_checkpoint_dir() -> None:
    result = room(Facts(state_disk=StateDisk(HOME_STATE, True, 8 * GIB, 50 * GIB)))
    assert result.status is Status.WARN
    assert "your home folder" in result.summary["en"] and "8.0 GiB" in result.summary["en"]
    assert "主目录" in result.summary["zh"] and "20.0 GiB" in result.detail["en"]
    assert "--checkpoint-dir" in result.fix["en"] and "--checkpoint-dir" in result.fix["zh"]


def test_a_small_quota_on_a_big_disk_warns() -> None:
    quota = StateDisk(HOME_STATE, True, 2000 * GIB, 4000 * GIB, quota_limit=10 * GIB, quota_used=4 * GIB)
    result = room(Facts(state_disk=quota))
    assert result.status is Status.WARN and "6.0 GiB" in result.summary["en"]
    assert "quota: 4.0 GiB of 10.0 GiB used" in result.detail["en"] and "配额" in result.detail["zh"]


def test_room_for_four_checkpoints_of_the_size_the_runs_save() -> None:
    disk = StateDisk("/scratch/tg", False, 100 * GIB, 1000 * GIB)
    result = room(Facts(state_disk=disk, state_checkpoint_bytes=30 * GIB))
    assert result.status is Status.WARN and "/scratch/tg" in result.summary["en"]
    assert "4 checkpoints of 30.0 GiB" in result.detail["en"] and "120.0 GiB" in result.detail["en"]
    assert room(Facts(state_disk=disk, state_checkpoint_bytes=20 * GIB)).status is Status.OK
    assert room(replace(ROOMY, last_checkpoint_bytes=200 * GIB)).status is Status.WARN  # the job's own, seen in cwd


def test_a_chosen_checkpoint_dir_is_not_the_state_folder() -> None:
    result = room(Facts(state_disk=StateDisk(HOME_STATE, True, GIB, 5 * GIB), checkpoint_dir_chosen="/data/ckpt"))
    assert result.status is Status.OK and "/data/ckpt" in result.summary["en"]


def test_could_not_look_is_unknown_with_the_reason() -> None:
    result = room(Facts(unknown={"state_disk": {"en": "cannot read /x: Permission denied", "zh": "无法读取 /x"}}))
    assert result.status is Status.UNKNOWN and "Permission denied" in result.summary["en"]


def test_the_kernels_quota_record_is_read() -> None:
    record = struct.pack("=QQQQQQQQI", 10 * 1024 * 1024, 8 * 1024 * 1024, 3 * GIB, 0, 0, 0, 0, 0, 0b1111)
    assert parse_dqblk(record + bytes(4)) == Quota(10 * GIB, 3 * GIB)
    soft_only = struct.pack("=QQQQQQQQI", 0, 8 * 1024 * 1024, GIB, 0, 0, 0, 0, 0, 0b0101)
    assert parse_dqblk(soft_only + bytes(4)) == Quota(8 * GIB, GIB)
    assert parse_dqblk(struct.pack("=QQQQQQQQI", 0, 0, GIB, 0, 0, 0, 0, 0, 0b0101) + bytes(4)) is None  # no limit


def test_the_mount_holding_a_path_and_its_device() -> None:
    mountinfo = (
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "40 22 8:17 / /home rw,relatime shared:2 - xfs /dev/sdb1 rw,usrquota\n"
        "41 22 0:45 / /home/with\\040space rw - ext4 /dev/sdc1 rw\n"
    )
    assert mount_source("/home/u/.local/state/trainguard", mountinfo) == "/dev/sdb1"
    assert mount_source("/home/with space/x", mountinfo) == "/dev/sdc1"
    assert mount_source("/homework", mountinfo) == "/dev/sda1"


# ---------------------------------------------------------------------------------------------- real
def doctor(env: dict[str, str], *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "trainguard", "doctor", "--json", "--only", "checkpoint_disk_room",
                           *args], capture_output=True, text=True, timeout=180, check=False, env=env)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)["checks"][0]


@pytest.mark.real
def test_a_state_folder_on_a_small_disk_warns(tmp_path: Path) -> None:
    if reason := faults.why_no_root():
        pytest.skip(f"mounting a small tmpfs {reason}")
    with faults.small_tmpfs(tmp_path / "disk", "64m") as disk:
        env = {**os.environ, "TRAINGUARD_HOME": str(disk / "state")}
        env.pop("TRAINGUARD_CHECKPOINT_DIR", None)
        found = doctor(env)
        elsewhere = doctor(env, "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert found["status"] == "warn" and str(disk / "state") in found["summary"], found
    assert "64 MiB" in found["detail"] and "--checkpoint-dir" in found["fix"]
    assert elsewhere["status"] == "ok" and str(tmp_path / "ckpt") in elsewhere["summary"]


@pytest.mark.real
def test_a_small_home_is_named_as_the_home_folder(tmp_path: Path) -> None:
    if reason := faults.why_no_root():
        pytest.skip(f"mounting a small tmpfs {reason}")
    with faults.small_tmpfs(tmp_path / "home", "64m") as home:
        env = {k: v for k, v in os.environ.items() if k not in ("TRAINGUARD_HOME", "XDG_STATE_HOME",
                                                               "TRAINGUARD_CHECKPOINT_DIR")}  # fmt: skip
        env.update(HOME=str(home), LANG="zh_CN.UTF-8")
        found = doctor(env)
    assert found["status"] == "warn" and "主目录" in found["summary"], found
    assert str(home / ".local" / "state" / "trainguard") in found["detail"]


def _set_quota(folder: Path, limit_kib: int) -> int:
    """Give this user a block limit on ``folder``'s filesystem (Q_SETQUOTA through quotactl_fd)."""
    libc = ctypes.CDLL(None, use_errno=True)
    record = ctypes.create_string_buffer(struct.pack("=QQQQQQQQI", limit_kib, limit_kib, 0, 0, 0, 0, 0, 0, 1), 72)
    fd = os.open(folder, os.O_RDONLY)
    try:
        done = libc.syscall(443, fd, (0x800008 << 8) | 0, os.geteuid(), record)
    finally:
        os.close(fd)
    return 0 if done == 0 else ctypes.get_errno()


@pytest.mark.real
def test_a_user_quota_on_a_big_disk_warns(tmp_path: Path) -> None:
    if reason := faults.why_no_root():
        pytest.skip(f"a loop-mounted ext4 with quotas {reason}")
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("mkfs.ext4 is not installed")
    image, folder = tmp_path / "disk.img", tmp_path / "quota"
    folder.mkdir()
    with image.open("wb") as out:
        out.truncate(64 * 1024 * 1024)
    subprocess.run(["mkfs.ext4", "-q", "-O", "quota", "-E", "quotatype=usrquota", str(image)], check=True)
    mounted = subprocess.run(["mount", "-o", "loop,usrquota", str(image), str(folder)], capture_output=True, text=True,
                             check=False)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"this kernel mounts no ext4 with quotas (CONFIG_QUOTA): {mounted.stderr.strip().splitlines()[0]}")
    try:
        if error := _set_quota(folder, 16 * 1024):
            pytest.skip(f"setting a quota failed: {os.strerror(error)}")
        assert user_quota(folder) == Quota(16 * 1024 * 1024, user_quota(folder).used)
        env = {**os.environ, "TRAINGUARD_HOME": str(folder / "state")}
        env.pop("TRAINGUARD_CHECKPOINT_DIR", None)
        found = doctor(env)
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)
    assert found["status"] == "warn" and "quota" in found["detail"] and "16 MiB" in found["detail"], found
