"""The user's disk quota on a filesystem, as the kernel's quota subsystem keeps it: the block limit and
what the user has used. Read with ``quotactl_fd`` (Linux 5.14 and later), else ``quotactl`` on the
filesystem's block device (from /proc/self/mountinfo). None where no limit is set, quotas are off, the
kernel has none (no CONFIG_QUOTA) or the filesystem keeps its own: NFS (rquota) and Lustre (``lfs
quota``) are not read here; ZFS, btrfs and XFS project quotas show in statvfs, as the free space."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import struct
from dataclasses import dataclass
from pathlib import Path

_Q_GETQUOTA = 0x800007
_USRQUOTA = 0
_QUOTACTL_FD = 443  # one number on every Linux architecture (the unified syscall table)
# struct if_dqblk: block limits (hard, soft) in 1 KiB units, the space used in bytes, inode limits and
# use, grace times, and the bits saying which fields hold values. 72 bytes with its padding.
_DQBLK = struct.Struct("=QQQQQQQQI")
_DQBLK_SIZE = 72
_QIF_BLIMITS = 1
_QIF_SPACE = 4


@dataclass(frozen=True)
class Quota:
    limit: int  # bytes: the hard block limit, else the soft one
    used: int  # bytes

    @property
    def left(self) -> int:
        return max(0, self.limit - self.used)


def parse_dqblk(raw: bytes) -> Quota | None:
    """The quota a ``struct if_dqblk`` holds; None when it sets no block limit."""
    hard, soft, used, *_others, valid = _DQBLK.unpack_from(raw)
    limit = hard or soft
    if not valid & _QIF_BLIMITS or not limit:
        return None
    return Quota(limit * 1024, used if valid & _QIF_SPACE else 0)


def _unescape(field: str) -> str:
    """A mountinfo path, whose spaces, tabs, newlines and backslashes are octal escapes."""
    for escaped, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, char)
    return field


def mount_source(path: str, mountinfo: str) -> str | None:
    """The source (a block device for a local disk) of the mount that holds ``path``."""
    best, source = "", None
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        point = _unescape(fields[4])
        after = line.split(" - ", 1)[1].split()
        holds = path == point or path.startswith(point.rstrip("/") + "/")
        if len(after) >= 2 and holds and len(point) >= len(best):  # the last mount over a point wins
            best, source = point, _unescape(after[1])
    return source


def user_quota(path: str | os.PathLike[str], uid: int | None = None) -> Quota | None:
    """The block quota of ``uid`` (this user) on the filesystem holding ``path``, or None."""
    uid = os.geteuid() if uid is None else uid
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    buffer = ctypes.create_string_buffer(_DQBLK_SIZE)
    command = (_Q_GETQUOTA << 8) | _USRQUOTA
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        done = libc.syscall(_QUOTACTL_FD, fd, command, uid, buffer)
    finally:
        os.close(fd)
    if done == 0:
        return parse_dqblk(buffer.raw)
    if ctypes.get_errno() != errno.ENOSYS:  # else a kernel older than quotactl_fd: ask by the device
        return None
    with contextlib.suppress(OSError, AttributeError):
        device = mount_source(os.path.realpath(path), Path("/proc/self/mountinfo").read_text())
        if device and device.startswith("/dev/") and libc.quotactl(command, device.encode(), uid, buffer) == 0:
            return parse_dqblk(buffer.raw)
    return None
