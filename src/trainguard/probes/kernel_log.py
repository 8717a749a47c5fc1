"""The kernel log: parsing saved captures in their common text formats, and reading the live one.

Formats read (one record a line):
  [  202.608893] msg                                   dmesg (seconds since boot)
  [Sun Nov 29 23:31:55 2026] msg                        dmesg -T
  2026-11-29T23:31:55,123456+00:00 msg                  dmesg --time-format iso
  Nov 29 23:31:55 host kernel: msg                      journalctl -k, /var/log/kern.log, syslog
  2026-11-29T23:31:55+0000 host kernel: msg             journalctl -k -o short-iso
  6,1234,240314528856,-;msg                             /dev/kmsg
Parsing is pure (``now`` and ``boot_time`` are parameters); reading the live log is the adapter.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Iterable
from datetime import datetime

from trainguard.diagnosis.evidence import KernelLine
from trainguard.errors import TrainguardError

_DMESG_RAW = re.compile(r"^\[ *(?P<mono>[0-9]+\.[0-9]+)\] ?(?P<msg>.*)$")
_DMESG_CTIME = re.compile(r"^\[(?P<ctime>[A-Z][a-z]{2} [A-Z][a-z]{2} [ 0-9][0-9] [0-9:]{8} [0-9]{4})\] ?(?P<msg>.*)$")
_ISO = re.compile(
    r"^(?P<iso>[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}(?:[.,][0-9]+)?(?:Z|[+-][0-9]{2}:?[0-9]{2})?) (?P<msg>.*)$"
)
_SYSLOG = re.compile(r"^(?P<stamp>[A-Z][a-z]{2} +[0-9]{1,2} [0-9:]{8}) (?P<msg>.*)$")
_KMSG = re.compile(r"^[0-9]+,[0-9]+,(?P<usec>[0-9]+),[^;]*;(?P<msg>.*)$")
_HOST_KERNEL = re.compile(r"^[^ ]+ kernel: ?(?P<msg>.*)$")


def _iso_time(text: str) -> float | None:
    text = text.replace(",", ".")
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    elif re.search(r"[+-][0-9]{4}$", text):
        text = text[:-2] + ":" + text[-2:]
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        return None
    if stamp.tzinfo is None:
        return stamp.timestamp()  # local time, as the machine printed it
    return stamp.timestamp()


def _syslog_time(text: str, now: float) -> float | None:
    """'Nov 29 23:31:55' has no year: take the year that puts it closest before ``now``."""
    year = datetime.fromtimestamp(now).year
    for candidate_year in (year, year - 1):
        try:
            stamp = datetime.strptime(f"{candidate_year} {' '.join(text.split())}", "%Y %b %d %H:%M:%S").timestamp()
        except ValueError:
            return None
        if stamp <= now + 86400:
            return stamp
    return None


def parse_line(line: str, *, now: float, boot_time: float | None = None) -> KernelLine:
    line = line.rstrip("\r\n")
    if m := _KMSG.match(line):
        usec = int(m["usec"])
        return KernelLine(m["msg"], None if boot_time is None else boot_time + usec / 1e6)
    if m := _DMESG_RAW.match(line):
        mono = float(m["mono"])
        return KernelLine(m["msg"], None if boot_time is None else boot_time + mono)
    if m := _DMESG_CTIME.match(line):
        try:
            stamp = datetime.strptime(" ".join(m["ctime"].split()), "%a %b %d %H:%M:%S %Y").timestamp()
        except ValueError:
            stamp = None
        return KernelLine(m["msg"], stamp)
    if m := _ISO.match(line):
        return KernelLine(_strip_host(m["msg"]), _iso_time(m["iso"]))
    if m := _SYSLOG.match(line):
        return KernelLine(_strip_host(m["msg"]), _syslog_time(m["stamp"], now))
    return KernelLine(line, None)


def _strip_host(message: str) -> str:
    if m := _HOST_KERNEL.match(message):
        inner = m["msg"]
        if raw := _DMESG_RAW.match(inner):  # kern.log keeps the boot-relative stamp after "kernel:"
            return raw["msg"]
        return inner
    return message


def parse_kernel_log(lines: Iterable[str], *, now: float, boot_time: float | None = None) -> list[KernelLine]:
    return [parse_line(line, now=now, boot_time=boot_time) for line in lines if line.strip()]


def in_window(lines: Iterable[KernelLine], start: float, end: float) -> list[KernelLine]:
    """Records between ``start`` and ``end``; records without a time cannot be placed and are kept."""
    return [line for line in lines if line.time is None or start <= line.time <= end]


# ----------------------------------------------------------------------------- the live log
class KernelLogUnavailable(TrainguardError):
    exit_code = 2


def boot_time() -> float:
    """Wall-clock time of boot, for kernel stamps in seconds since boot."""
    return time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)


def _read_kmsg(path: str = "/dev/kmsg") -> list[str]:
    records: list[str] = []
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)  # one record per read
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    break
                if exc.errno == errno.EPIPE:  # the ring buffer overwrote what we were about to read
                    continue
                raise
            if not chunk:
                break
            # Continuation lines (" KEY=value") carry device metadata, not the message.
            records.append(chunk.decode("utf-8", "replace").split("\n", 1)[0])
    finally:
        os.close(fd)
    return records


class KernelTail:
    """The kernel log from now on: /dev/kmsg opened and moved to its end when an attempt starts,
    so reading what a death left costs microseconds, not a read of the whole ring buffer.
    Where /dev/kmsg is closed to us it falls back to reading the whole log."""

    def __init__(self) -> None:
        self._fd: int | None = None
        try:
            self._fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self._fd, 0, os.SEEK_END)
        except OSError:
            self.close()

    def read_new(self) -> list[KernelLine]:
        if self._fd is None:
            lines, _ = read_live()
            return lines
        records: list[str] = []
        while True:
            try:
                chunk = os.read(self._fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    break
                if exc.errno == errno.EPIPE:
                    continue
                raise KernelLogUnavailable(f"/dev/kmsg: {exc.strerror}", f"/dev/kmsg：{exc.strerror}") from exc
            if not chunk:
                break
            records.append(chunk.decode("utf-8", "replace").split("\n", 1)[0])
        return parse_kernel_log(records, now=time.time(), boot_time=boot_time())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_live(*, now: float | None = None) -> tuple[list[KernelLine], str]:
    """The machine's kernel log, from whichever source it allows: /dev/kmsg, dmesg, the journal."""
    now = time.time() if now is None else now
    reasons = []
    try:
        return parse_kernel_log(_read_kmsg(), now=now, boot_time=boot_time()), "/dev/kmsg"
    except OSError as exc:
        reasons.append(f"/dev/kmsg: {exc.strerror}")
    for command, label in (
        (["dmesg", "--time-format", "iso"], "dmesg"),
        (["journalctl", "-k", "-o", "short-iso", "--no-pager", "-q", "-b"], "journalctl -k"),
    ):
        if shutil.which(command[0]) is None:
            reasons.append(f"{command[0]}: not installed")
            continue
        try:
            done = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            reasons.append(f"{label}: {exc}")
            continue
        if done.returncode == 0 and done.stdout.strip():
            return parse_kernel_log(done.stdout.splitlines(), now=now, boot_time=boot_time()), label
        reasons.append(f"{label}: {done.stderr.strip().splitlines()[0] if done.stderr.strip() else 'no output'}")
    raise KernelLogUnavailable(
        "cannot read the kernel log (" + "; ".join(reasons) + "); run as root or set kernel.dmesg_restrict=0",
        "无法读取内核日志（" + "；".join(reasons) + "）；请以 root 运行或设置 kernel.dmesg_restrict=0",
    )


_KERNEL_SHAPES = (_KMSG, _DMESG_RAW, _DMESG_CTIME, _ISO, _SYSLOG)


def read_saved(path: str, *, now: float | None = None) -> list[KernelLine]:
    """A kernel log saved to a file (dmesg, dmesg -T, journalctl -k, kern.log). A file in which no
    line has a kernel log's shape is not one: as a user without root `dmesg > FILE` writes nothing,
    and an empty kernel log read as "no OOM kill" would turn every SIGKILL into someone's kill -9.
    Only a regular file is opened, never waiting (a FIFO without a writer, a device). Raises
    KernelLogUnavailable or OSError."""
    now = time.time() if now is None else now
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    with open(fd, encoding="utf-8", errors="replace") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise KernelLogUnavailable(f"{path} is not a regular file (a FIFO or a device): save the kernel log",
                                       f"{path} 不是普通文件（FIFO 或设备）：请把内核日志保存到文件")  # fmt: skip
        raw = handle.read().splitlines()
    if not any(any(shape.match(line) for shape in _KERNEL_SHAPES) for line in raw):
        raise KernelLogUnavailable(
            f"{path} holds no kernel log line (empty, or not the output of dmesg or journalctl -k): as a user "
            "without root `dmesg` prints nothing; save it with `sudo dmesg -T > FILE`, or use --kernel-log auto",
            f"{path} 中没有内核日志行（为空，或不是 dmesg / journalctl -k 的输出）：非 root 用户运行 `dmesg` 没有输出；"
            "请用 `sudo dmesg -T > FILE` 保存，或使用 --kernel-log auto",
        )
    return parse_kernel_log(raw, now=now)
