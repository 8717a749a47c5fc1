"""Kernel-log captures in their common formats, as recorded on real machines."""

from __future__ import annotations

from datetime import datetime

from trainguard.diagnosis.evidence import KernelLine, observations_from_kernel
from trainguard.diagnosis.signatures import default_table
from trainguard.probes.kernel_log import in_window, parse_kernel_log, parse_line

NOW = datetime(2026, 11, 29, 23, 59, 0).timestamp()
MSG = "Memory cgroup out of memory: Killed process 2540 (python3) total-vm:82132kB, anon-rss:65152kB"


def test_plain_dmesg_keeps_seconds_since_boot_relative_to_boot_time() -> None:
    line = parse_line(f"[  208.699178] {MSG}", now=NOW, boot_time=1000.0)
    assert line.text == MSG and abs(line.time - 1208.699178) < 1e-6
    assert parse_line(f"[  208.699178] {MSG}", now=NOW).time is None


def test_dmesg_T_ctime_stamps() -> None:
    line = parse_line(f"[Sun Nov 29 23:31:55 2026] {MSG}", now=NOW)
    assert line.text == MSG and line.time == datetime(2026, 11, 29, 23, 31, 55).timestamp()


def test_dmesg_iso_stamps() -> None:
    line = parse_line(f"2026-11-29T23:31:55,123456+00:00 {MSG}", now=NOW)
    assert line.text == MSG and abs(line.time - 1795995115.123456) < 1e-3


def test_journalctl_and_syslog_lines_drop_host_and_kernel_prefix() -> None:
    line = parse_line(f"Nov 29 23:31:55 worker4 kernel: {MSG}", now=NOW)
    assert line.text == MSG and line.time == datetime(2026, 11, 29, 23, 31, 55).timestamp()
    kern_log = parse_line(f"Dec  2 10:43:35 worker4 kernel: [240314.528856] {MSG}", now=NOW)
    assert kern_log.text == MSG
    assert datetime.fromtimestamp(kern_log.time).year == 2025  # no year in syslog: the last December
    iso = parse_line(f"2026-11-29T23:31:55+0000 worker4 kernel: {MSG}", now=NOW)
    assert iso.text == MSG and iso.time is not None


def test_dev_kmsg_records() -> None:
    line = parse_line(f"3,1234,208699178,-;{MSG}", now=NOW, boot_time=0.0)
    assert line.text == MSG and abs(line.time - 208.699178) < 1e-6


def test_window_keeps_records_in_time_and_those_without_a_time() -> None:
    lines = [KernelLine("old", 100.0), KernelLine("in", 500.0), KernelLine("undated", None), KernelLine("late", 900.0)]
    assert [line.text for line in in_window(lines, 400.0, 600.0)] == ["in", "undated"]


def test_xid_lines_from_a_real_capture_carry_their_meaning() -> None:
    capture = [
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
        "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
        "May 18 19:02:39 gpu7 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
        "[6781741.548779] usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    ]
    observations = observations_from_kernel(parse_kernel_log(capture, now=NOW), default_table().signatures)
    xids = [o for o in observations if o.rule == "nvrm_xid"]
    assert [o.line for o in xids] == [1, 2, 3]
    assert xids[0].note.en.startswith("Xid 13: Graphics Engine Exception")
    assert xids[0].cause == "cuda_illegal_access"
    assert xids[2].note.en.startswith("Xid 79: GPU has fallen off the bus")
    assert xids[2].cause == "gpu_hardware"
    assert 4 not in {o.line for o in observations}
