"""`trainguard doctor` on this machine, in the conditions that kill jobs, made for real: a 1 MB
/dev/shm in a private mount namespace, a memory cgroup, a full tmpfs as the checkpoint folder, a
kernel-log capture with Xid lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.real import faults

pytestmark = pytest.mark.real


def doctor(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "trainguard", "doctor", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)


def checks(done: subprocess.CompletedProcess) -> dict[str, dict]:
    return {c["id"]: c for c in json.loads(done.stdout)["checks"]}


def test_the_json_lists_every_check_with_status_summary_detail_fix() -> None:
    done = doctor("--json")
    assert done.returncode in (0, 1), done.stderr
    found = checks(done)
    assert {"shm_size", "cgroup_memory_limit", "driver_cuda_compat", "gpu_temperature", "gpu_xid_history"} <= set(found)
    for check in found.values():
        assert set(check) == {"id", "status", "summary", "detail", "fix"}
        assert check["status"] in {"ok", "warn", "fail", "unknown"}
        if check["status"] == "unknown":
            assert check["summary"].startswith("could not look: ")


def test_without_a_gpu_the_gpu_checks_say_so_and_the_rest_runs() -> None:
    found = checks(doctor("--json"))
    if found["gpu_temperature"]["status"] != "unknown":
        pytest.skip("this machine has an NVIDIA GPU")
    assert "NVIDIA" in found["gpu_temperature"]["summary"]
    assert found["open_files_limit"]["status"] != "unknown"


def test_a_1mb_dev_shm_fails_the_shm_check(tmp_path: Path) -> None:
    if reason := faults.why_no_mount_namespace():
        pytest.skip(reason)
    command = faults.with_tiny_dev_shm([sys.executable, "-m", "trainguard", "doctor", "--json", "--only", "shm_size"])
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 1, done.stderr
    shm = checks(done)["shm_size"]
    assert shm["status"] == "fail" and "1 MiB" in shm["summary"] and "--shm-size" in shm["fix"]


def test_inside_a_memory_cgroup_the_limit_is_reported(tmp_path: Path) -> None:
    if reason := faults.why_no_memory_cgroup():
        pytest.skip(reason)
    with faults.memory_cgroup(768 * 1024 * 1024) as procs:
        done = subprocess.run(
            ["bash", "-c", f'echo $$ > {procs}; exec "{sys.executable}" -m trainguard doctor --json --only cgroup_memory_limit'],
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
    limit = checks(done)["cgroup_memory_limit"]
    assert limit["status"] == "warn" and "768 MiB" in limit["summary"]


def test_a_full_tmpfs_as_checkpoint_folder_fails_the_disk_check(tmp_path: Path) -> None:
    if reason := faults.why_no_root():
        pytest.skip(f"mounting a small tmpfs {reason}")
    with faults.small_tmpfs(tmp_path / "ckpt", "2m") as folder:
        (folder / "filler").write_bytes(bytes(2 * 1024 * 1024 - 8192))
        done = doctor("--json", "--only", "disk_space", "--checkpoint-dir", str(folder))
    assert done.returncode == 1
    disk = checks(done)["disk_space"]
    assert disk["status"] == "fail" and str(folder) in disk["summary"]


def test_xid_lines_in_a_kernel_log_capture_are_named(tmp_path: Path) -> None:
    capture = tmp_path / "dmesg.txt"
    capture.write_text(
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception\n"
        "[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
    )
    done = doctor("--json", "--only", "gpu_xid_history", "--kernel-log", str(capture))
    assert done.returncode == 1
    xid = checks(done)["gpu_xid_history"]
    assert xid["status"] == "fail" and "13, 79" in xid["summary"]
    assert "GPU has fallen off the bus" in xid["detail"] and "Graphics Engine Exception" in xid["detail"]
    zh = checks(doctor("--json", "--lang", "zh", "--only", "gpu_xid_history", "--kernel-log", str(capture)))
    assert "内核日志中有 Xid 错误" in zh["gpu_xid_history"]["summary"]


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for args, message in ((["--only", "shm_size,no_such_check"], "no check named no_such_check"),
                          (["--kernel-log", str(tmp_path / "missing")], "kernel log")):  # fmt: skip
        done = doctor(*args)
        assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1


def test_human_output_lists_checks_then_what_to_do(tmp_path: Path) -> None:
    capture = tmp_path / "dmesg.txt"
    capture.write_text("[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, GPU has fallen off the bus.\n")
    out = doctor("--kernel-log", str(capture), "--only", "gpu_xid_history,open_files_limit").stdout
    assert out.index("open_files_limit") < out.index("→ fix")
