"""How much memory this process may still take: the machine's MemAvailable, or less when a memory
cgroup (a container's limit, a Slurm job, ``trainguard run --memory-limit``) caps it. Linux only."""

from __future__ import annotations

from pathlib import Path

_UNLIMITED = 1 << 60


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return _UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def meminfo_available(meminfo: str) -> int | None:
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def cgroup_headroom(proc_self_cgroup: str, root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes left before this process's memory cgroup limit (v2, else v1); None when unlimited."""
    for line in proc_self_cgroup.splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "":
            group = root / path.lstrip("/")
            limit, usage = _read_int(group / "memory.max"), _read_int(group / "memory.current")
        elif "memory" in controllers.split(","):
            group = root / "memory" / path.lstrip("/")
            limit, usage = _read_int(group / "memory.limit_in_bytes"), _read_int(group / "memory.usage_in_bytes")
        else:
            continue
        if limit is not None and usage is not None and limit < _UNLIMITED // 2:
            return max(0, limit - usage)
    return None


def cgroup_limit(proc_self_cgroup: str, root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """This process's memory cgroup limit in bytes (v2, else v1); None when there is none."""
    for line in proc_self_cgroup.splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "":
            limit = _read_int(root / path.lstrip("/") / "memory.max")
        elif "memory" in controllers.split(","):
            limit = _read_int(root / "memory" / path.lstrip("/") / "memory.limit_in_bytes")
        else:
            continue
        if limit is not None and limit < _UNLIMITED // 2:
            return limit
    return None


def available_bytes() -> int | None:
    """What this process can still allocate before the OOM killer acts; None when unknown."""
    try:
        machine = meminfo_available(Path("/proc/meminfo").read_text())
    except OSError:
        machine = None
    try:
        headroom = cgroup_headroom(Path("/proc/self/cgroup").read_text())
    except OSError:
        headroom = None
    known = [value for value in (machine, headroom) if value is not None]
    return min(known) if known else None
