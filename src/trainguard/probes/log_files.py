"""Opening a log a person points us at, with one clear error for everything that cannot be read."""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Iterator
from typing import BinaryIO

from trainguard.diagnosis.reader import read_blocks
from trainguard.errors import InputError

_SAMPLE = 64 * 1024
_TEXT_CONTROLS = {0x08, 0x09, 0x0A, 0x0C, 0x0D, 0x1B}
# A log is text. A crashed writer leaves runs of NUL bytes in it (a file extended but never written),
# so NULs say nothing either way: it is binary when over one in twenty of its other bytes are control
# characters (random bytes have one in eight: an archive, a tensor file, an executable). Bytes above
# 0x7f say nothing either: a log in GBK is text.
_BINARY_FRACTION = 0.05


def looks_binary(sample: bytes) -> bool:
    rest = sample.replace(b"\x00", b"")
    if not rest:
        return False
    controls = sum(1 for byte in rest if (byte < 0x20 and byte not in _TEXT_CONTROLS) or byte == 0x7F)
    return controls / len(rest) > _BINARY_FRACTION


def open_log(path: str) -> BinaryIO:
    try:
        info = os.stat(path)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}", f"无法读取 {path}：{exc.strerror}") from exc
    if stat.S_ISDIR(info.st_mode):
        raise InputError(f"{path} is a directory, not a log file", f"{path} 是目录，不是日志文件")
    if not stat.S_ISREG(info.st_mode):  # a FIFO's open waits for a writer for good, /dev/zero never ends
        raise InputError(f"{path} is not a regular file (a FIFO or a device): save the log to a file, or pipe it to "
                         "`trainguard diagnose -`",
                         f"{path} 不是普通文件（FIFO 或设备）：请把日志保存到文件，"
                         "或通过管道传给 `trainguard diagnose -`")  # fmt: skip
    try:
        handle = open(path, "rb")  # noqa: SIM115 - the caller closes it
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}", f"无法读取 {path}：{exc.strerror}") from exc
    try:
        sample = handle.read(_SAMPLE)
        if looks_binary(sample):
            raise InputError(f"{path} looks like a binary file, not a log", f"{path} 看起来是二进制文件，不是日志")
        handle.seek(0)
    except OSError as exc:
        handle.close()
        raise InputError(f"cannot read {path}: {exc.strerror}", f"无法读取 {path}：{exc.strerror}") from exc
    except InputError:
        handle.close()
        raise
    return handle


def open_stdin_log(stream: BinaryIO) -> Iterator[bytes]:
    """The blocks of a log piped to standard input, after the checks a file gets: a device there
    (`< /dev/zero`) never ends, and a stream that opens with binary bytes or nothing but NULs is not
    a log (`diagnose` would read it for ever)."""
    mode = os.fstat(stream.fileno()).st_mode
    if (stat.S_ISCHR(mode) and not os.isatty(stream.fileno())) or stat.S_ISBLK(mode):
        raise InputError("standard input is a device, not a log: pipe the job's log, or give its file",
                         "标准输入是设备，不是日志：请通过管道传入作业日志，或给出日志文件")  # fmt: skip
    first = stream.read(_SAMPLE)
    if first and (looks_binary(first) or not first.strip(b"\x00")):
        raise InputError("standard input looks like binary data, not a log", "标准输入看起来是二进制数据，不是日志")
    return itertools.chain([first] if first else [], read_blocks(stream))
