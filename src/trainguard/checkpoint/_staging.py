"""The staging buffer of asynchronous saves: a growable shared memory buffer (a memfd) that the writer
process maps too. A save's tensors, and the pickled rest of the state after them, are copied into it
(``stage``), and training goes on while the writer writes them out (``_writer``)."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
from typing import Any

from trainguard.checkpoint import _tree
from trainguard.probes.memory import available_bytes

log = logging.getLogger("trainguard.checkpoint")

# Leave this much memory free after staging: the copy must never be what wakes the OOM killer.
MEMORY_MARGIN = 512 * 1024 * 1024
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class StagingBuffer:
    """A growable shared buffer (memfd) that the writer process maps too; reused across saves, so
    its pages stay resident and the copy into it is a plain memcpy."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("trainguard-checkpoint", os.MFD_CLOEXEC)
        self.size = 0
        self.map: mmap.mmap | None = None
        self.bytes_view: Any = None  # a torch uint8 tensor over the map, made when tensors are staged

    def ensure(self, size: int) -> bool:
        if size <= self.size:
            return True
        grow = size - self.size
        available = available_bytes()
        if available is not None and available - grow < MEMORY_MARGIN:
            return False
        new_size = int(size * 1.1) + mmap.PAGESIZE  # room for a state that grows a little
        try:
            os.ftruncate(self.fd, new_size)
            # Allocate the pages and map them now, in bulk: faulting 1 GB of shared memory in page by
            # page during the first copy took 2.9 s here, fallocate + MAP_POPULATE 1.5 s.
            with contextlib.suppress(OSError):
                os.posix_fallocate(self.fd, 0, new_size)
            # The new map is made before the old one goes: when it is refused (ENOMEM under ulimit -v),
            # the buffer stays as it was, whole and usable by the next save that fits in it.
            new_map = mmap.mmap(self.fd, new_size, _MAP_FLAGS, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.size)  # give back the pages fallocate took
            raise
        if self.map is not None:
            self._unpin()
            self.bytes_view = None
            self.map.close()
        self.map = new_map
        self.size = new_size
        return True

    def copy_in(self, tensors: list[Any], specs: list[_tree.TensorSpec]) -> None:
        import torch

        if self.bytes_view is None:
            self.bytes_view = torch.frombuffer(self.map, dtype=torch.uint8)
        on_gpu = any(t.is_cuda for t in tensors)
        if on_gpu:
            self._pin(torch)
        for tensor, spec in zip(tensors, specs):
            if spec.nbytes:
                target = self.bytes_view[spec.offset : spec.offset + spec.nbytes].view(tensor.dtype)
                # Into pinned memory the device-to-host copies run as DMA, all queued before one sync.
                target.view(tensor.shape).copy_(tensor.detach(), non_blocking=self.pinned)
        if on_gpu and self.pinned:
            torch.cuda.synchronize()

    pinned = False

    def _pin(self, torch: Any) -> None:
        """Page-lock the buffer for the GPU's DMA engine (cudaHostRegister); unpinned copies still
        work when that is refused (no CUDA runtime, locked-memory limits)."""
        if self.pinned:
            return
        address = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        try:
            status = torch.cuda.cudart().cudaHostRegister(address, self.size, 0)
        except (RuntimeError, AttributeError) as exc:
            log.info("staging buffer not pinned (%s): GPU tensors are copied unpinned", exc)
            return
        self.pinned = int(status) == 0
        self._address = address

    def _unpin(self) -> None:
        if self.pinned:
            import torch

            with contextlib.suppress(RuntimeError, AttributeError):
                torch.cuda.cudart().cudaHostUnregister(self._address)
            self.pinned = False

    def close(self) -> None:
        self._unpin()
        self.bytes_view = None
        if self.map is not None:
            self.map.close()
            self.map = None
        os.close(self.fd)

    def hold(self, tensors: list[Any], specs: list[_tree.TensorSpec], data_size: int, tree: bytes) -> None:
        """Copy the tensors, and the pickled rest of the state after them, into the buffer (which
        ``ensure`` made large enough for both)."""
        if tensors:
            self.copy_in(tensors, specs)
        if tree:
            offset = tree_offset(data_size)
            self.map[offset : offset + len(tree)] = tree


def tree_offset(data_size: int) -> int:
    """Where the pickled tree starts in the staging buffer: after the tensors, page-aligned."""
    return (data_size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE


def stage(staging: StagingBuffer | None, tensors: list[Any], specs: list[_tree.TensorSpec], data_size: int,
          tree: bytes, *, asynchronous: bool) -> tuple[StagingBuffer | None, bool]:  # fmt: skip
    """Copy the tensors, and the pickled rest of the state after them, into the shared buffer (made
    here the first time): the buffer, and whether the save is staged (else it is written synchronously).

    Everything a save holds goes through shared memory and the message to the writer stays a few
    hundred bytes: a megabyte sent down the socket blocks the trainer as soon as the writer stops
    reading (SIGSTOPped, hung on a dead mount), and then not even SIGTERM's save can run."""
    if not asynchronous and not tensors:
        return staging, False
    if data_size == 0 and not tree:
        return staging, True
    try:
        if staging is None:
            staging = StagingBuffer()
        if not staging.ensure(tree_offset(data_size) + len(tree)):
            log.warning(
                "not enough free memory to stage %.1f MB for an asynchronous save: saving synchronously",
                (data_size + len(tree)) / 1e6,
            )
            return staging, False
    except OSError as exc:
        log.warning("cannot stage the checkpoint in memory (%s): saving synchronously", exc)
        return staging, False
    staging.hold(tensors, specs, data_size, tree)
    return staging, True
