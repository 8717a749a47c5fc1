"""The checkpoint writer: a persistent process that turns staged bytes into a durable checkpoint.

The training process copies its tensors, and the pickled rest of the state after them, into a shared
memory buffer (a memfd, so a small /dev/shm does not matter) and sends this process a short note of
where they lie; checksumming, writing and fsyncing happen here, off the training process's GIL and
CPU. It ignores SIGINT and SIGTERM (a stop signal to the job must not cut a save short) and exits
when the training process closes the connection.

    python -m trainguard.checkpoint._writer CONNECTION_FD MEMFD
"""

from __future__ import annotations

import contextlib
import mmap
import os
import signal
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

from trainguard.checkpoint._atomic_write import write_checkpoint
from trainguard.checkpoint._format import CheckpointError
from trainguard.checkpoint._retention import prune
from trainguard.checkpoint._shards import prune_jobs, write_shard


def serve(connection: Connection, memfd: int) -> int:
    mapped: mmap.mmap | None = None
    while True:
        try:
            job = connection.recv()
        except (EOFError, OSError):
            return 0
        if job.get("exit"):
            return 0
        started = time.monotonic()
        data: list[memoryview] = []
        try:
            if job["buffer_size"] and (mapped is None or len(mapped) != job["buffer_size"]):
                if mapped is not None:
                    with contextlib.suppress(BufferError):  # a view still out: the map goes with it
                        mapped.close()
                # Populated at once: mapping the pages one fault at a time costs seconds per GB.
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                mapped = mmap.mmap(memfd, job["buffer_size"], flags, mmap.PROT_READ)
            data = [memoryview(mapped)[: job["data_size"]]] if job["data_size"] else []
            start = job["tree_offset"]
            tree = bytes(mapped[start : start + job["tree_size"]]) if job["tree_size"] else b""
            directory = Path(job["directory"])
            rank = job.get("rank")
            if rank is None:
                prune(directory, job["keep"])  # what a kill between an earlier save and its pruning left
                path = write_checkpoint(directory, job["step"], tree, data, wall_time=job["time"])
            else:
                path = write_shard(directory, job["step"], rank, job["world_size"], tree, data,
                                   wall_time=job["time"])  # fmt: skip
            # How long the save itself took, not how long the trainer took to ask: it sizes the
            # trainer's patience with a save in flight (and with SIGTERM's save waiting behind it).
            reply = {"ok": True, "path": str(path), "seconds": time.monotonic() - started}
        except CheckpointError as exc:
            reply = {"ok": False, "error": str(exc)}
        except Exception as exc:
            reply = {"ok": False, "error": f"checkpoint writer failed: {type(exc).__name__}: {exc}"}
        finally:
            # A view kept into the next job makes closing the map fail once the buffer grows
            # (BufferError: exported pointers exist), and then every later save failed with it.
            for view in data:
                with contextlib.suppress(BufferError):
                    view.release()
            data = []
        try:
            connection.send(reply)
        except (BrokenPipeError, OSError):
            return 0
        if reply["ok"]:
            # The new checkpoint is durable and the trainer knows it: old ones go now, off its clock.
            if job.get("rank") is None:
                prune(directory, job["keep"], protect=path)
            else:
                prune_jobs(directory, job["keep"], protect=path, rank=job["rank"])


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # The training loop comes first: a batch-scheduled, niced writer takes the CPU the loop leaves.
    with contextlib.suppress(OSError, AttributeError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    with contextlib.suppress(OSError):
        os.nice(10)
    return serve(Connection(int(argv[1])), int(argv[2]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
