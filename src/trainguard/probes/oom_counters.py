"""How many OOM kills the kernel has counted, read without root: the whole machine's
(``/proc/vmstat`` ``oom_kill``) and that of the memory cgroup a process runs in (cgroup v2
``memory.events``, v1 ``memory.oom_control``; a container's ``--memory`` limit is such a cgroup).
Read at an attempt's start and at its death, they tell an OOM kill from a ``kill -9`` where the
kernel log cannot be read (``kernel.dmesg_restrict=1``, as on most shared servers and in containers)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

VMSTAT = Path("/proc/vmstat")
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class OomCounts:
    system: int | None  # every OOM kill on this machine since boot; None where it cannot be read
    cgroup: int | None  # those of the memory cgroup below; None where there is none to read
    cgroup_path: str | None = None  # the cgroup's folder, to read the same one again at the end


def _counter(path: Path, key: str = "oom_kill") -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return None


def memory_cgroup_file(pid: int | str = "self", root: Path = CGROUP_ROOT) -> Path | None:
    """The OOM counter file of the memory cgroup ``pid`` runs in. The counter is hierarchical (an OOM
    kill counts in the victim's cgroup and every one above it); inside a container, where the path
    /proc shows is not below the mount, the mount's root is the container's own cgroup."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            hierarchy, controllers, path = line.split(":", 2)
            if hierarchy == "0" and controllers == "":
                candidates = [root / path.lstrip("/") / "memory.events", root / "memory.events",
                              root / "unified" / path.lstrip("/") / "memory.events"]  # fmt: skip
            elif "memory" in controllers.split(","):
                candidates = [root / "memory" / path.lstrip("/") / "memory.oom_control",
                              root / "memory" / "memory.oom_control"]  # fmt: skip
            else:
                continue
            for candidate in candidates:
                if candidate.is_file() and _counter(candidate) is not None:
                    return candidate
    return None


def read(pid: int | str = "self", cgroup_file: str | None = None) -> OomCounts:
    """The counters now: the machine's, and those of ``pid``'s memory cgroup (or of the counter file
    read at the start, so that both readings are of one cgroup)."""
    target = Path(cgroup_file) if cgroup_file else memory_cgroup_file(pid)
    return OomCounts(
        system=_counter(VMSTAT),
        cgroup=_counter(target) if target is not None else None,
        cgroup_path=str(target) if target is not None else None,
    )
