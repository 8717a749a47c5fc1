"""Opening a log a person points us at, with one clear error for everything that cannot be read."""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

from trainguard.errors import InputError

_SAMPLE = 64 * 1024
_TEXT_CONTROLS = {0x08, 0x09, 0x0A, 0x0C, 0x0D, 0x1B}
# A log is text. Crashed writers can leave runs of NUL bytes, so it takes more than one to say
# "binary": a sample where over a tenth of the bytes are control characters.
_BINARY_FRACTION = 0.10


def looks_binary(sample: bytes) -> bool:
    if not sample or b"\x00" not in sample:
        return False
    controls = sum(1 for byte in sample if byte < 0x20 and byte not in _TEXT_CONTROLS)
    return controls / len(sample) > _BINARY_FRACTION


def open_log(path: str) -> BinaryIO:
    try:
        info = os.stat(path)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}", f"无法读取 {path}：{exc.strerror}") from exc
    if stat.S_ISDIR(info.st_mode):
        raise InputError(f"{path} is a directory, not a log file", f"{path} 是目录，不是日志文件")
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
