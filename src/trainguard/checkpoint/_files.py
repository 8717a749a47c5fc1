"""Reading what the checkpoint layouts need from inside files, cheaply: a torch archive's central
directory (and a few top-level numbers of its pickle, without running it), a safetensors header, a
small JSON or text file. Each result is plain data for the pure rules in ``layouts``.

A torch archive (``torch.save``) is a zip whose central directory is written last: if it reads, the
writer got to the end. A safetensors file says in its header how long it must be.

The job wrote these files, and the supervisor reads them: each is opened only if it is a regular
file (never a FIFO, which would block the open, nor a device), read within a bound, and whatever does
not parse (JSON nested past the parser's depth too) is a ``problem`` of that file, never an error.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import threading
import zipfile
from typing import Any, BinaryIO

from trainguard import _untrusted as untrusted

ZIP_MAGIC = b"PK\x03\x04"
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".pkl", ".ckpt")
JSON_LIMIT = 8 * 1024 * 1024  # an index of a 400B-parameter model is ~2 MB
PEEK_LIMIT = 32 * 1024 * 1024  # data.pkl of a checkpoint: names and shapes, not the tensors
SAFETENSORS_HEADER_LIMIT = 100 * 1024 * 1024  # the format's own limit
TEXT_FILES = ("latest", "latest_universal")  # DeepSpeed: the tag of the newest checkpoint


def facts(path: str, name: str, size: int, peek: bool) -> dict[str, Any]:
    """What is inside one file: ``format`` (zip, safetensors, json, text, other), ``problem`` (why it
    cannot be whole), ``content`` (parsed JSON or text), ``peek`` (top-level scalars of a torch
    archive's pickle, when ``peek``)."""
    kind = _kind(name)
    if kind == "other" or (kind == "json" and size > JSON_LIMIT):
        return {"format": kind}
    handle = untrusted.open_regular(path)
    if handle is None:
        return {"format": kind, "problem": "not a regular file (or gone)"}
    try:
        with handle:
            if kind == "json":
                try:
                    return {"format": "json", "content": json.loads(handle.read(JSON_LIMIT + 1))}
                except (ValueError, RecursionError) as exc:
                    return {"format": "json", "problem": f"unreadable JSON ({exc.__class__.__name__}: {exc})"[:300]}
            if kind == "text":
                return {"format": "text", "content": handle.read(4096).decode("utf-8", "replace").strip()}
            if kind == "safetensors":
                return {"format": "safetensors", **_safetensors(handle, size)}
            if handle.read(4) != ZIP_MAGIC:
                return {"format": "other"}
            handle.seek(0)
            return {"format": "zip", **_torch_zip(handle, peek)}
    except OSError as exc:
        return {"format": "other", "problem": f"cannot read: {exc.strerror or exc}"}


def _kind(name: str) -> str:
    if name.endswith(".json"):
        return "json"
    if name in TEXT_FILES:
        return "text"
    if name.endswith(".safetensors"):
        return "safetensors"
    return "torch" if name.endswith(TORCH_SUFFIXES) else "other"


def _safetensors(handle: BinaryIO, size: int) -> dict[str, Any]:
    if size < 8:
        return {"problem": f"{size} bytes: shorter than a safetensors header"}
    (header_len,) = struct.unpack("<Q", handle.read(8))
    if header_len == 0 or header_len > SAFETENSORS_HEADER_LIMIT or 8 + header_len > size:
        return {"problem": "cut before the end of its header"}
    try:
        header = json.loads(handle.read(header_len))
    except (ValueError, RecursionError):
        return {"problem": "unreadable header"}
    try:
        data_end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (TypeError, KeyError, ValueError, IndexError, AttributeError):
        return {"problem": "unreadable header"}
    expected = 8 + header_len + data_end
    if size < expected:
        return {"problem": f"{size} bytes of {expected}: cut short"}
    return {}


def _torch_zip(handle: BinaryIO, peek: bool) -> dict[str, Any]:
    try:
        with zipfile.ZipFile(handle) as archive:
            infos = archive.infolist()
            pickles = [info for info in infos if info.filename.endswith("/data.pkl") or info.filename == "data.pkl"]
            found: dict[str, Any] = {}
            if peek and pickles and pickles[0].file_size <= PEEK_LIMIT:
                found = peek_pickle(archive.read(pickles[0]))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, KeyError) as exc:
        return {"problem": f"not a complete archive ({exc})"}
    if not pickles:
        return {"problem": "an archive without data.pkl"}
    return {"peek": found} if peek else {}


class _Stub:
    """Stands for any object in a pickle: built, filled and called without running anything."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Stub:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Stub:
        return _Stub()

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass


class _Peeker(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return _Stub  # never import: nothing in the file runs

    def persistent_load(self, pid: Any) -> Any:
        return None  # tensor storages stay in the archive


def peek_pickle(data: bytes) -> dict[str, Any]:
    """The top-level numbers, strings and Nones of a pickled dict (a checkpoint's ``global_step``,
    DeepSpeed's ``dp_world_size``); any other value is shown as "<object>". Empty when unreadable."""
    import io

    try:
        top = _Peeker(io.BytesIO(data)).load()
    except Exception:  # a damaged or foreign pickle: nothing to tell
        return {}
    if not isinstance(top, dict):
        return {}
    return {
        str(key): value if value is None or isinstance(value, (bool, int, float, str)) else "<object>"
        for key, value in top.items()
    }


class FactsCache:
    """File facts keyed by (path, inode, size, mtime): the supervisor looks at the checkpoint folder
    every second, and a file that has not changed is not read again."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._items: dict[tuple, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def get(self, path: str, name: str, stat: os.stat_result, peek: bool) -> dict[str, Any]:
        key = (path, stat.st_ino, stat.st_size, stat.st_mtime_ns, peek)
        with self._lock:
            found = self._items.get(key)
        if found is not None:
            return found
        found = facts(path, name, stat.st_size, peek)
        with self._lock:
            if len(self._items) >= self.limit:
                self._items.clear()
            self._items[key] = found
        return found
