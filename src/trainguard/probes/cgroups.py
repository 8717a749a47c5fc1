"""A memory cgroup of the job's own (``trainguard run --memory-limit``): one job cannot take the whole
host down, and when the kernel kills inside it, the kill is the job's for certain. cgroup v2 where
its memory controller is enabled, else v1."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from trainguard.errors import UsageError


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, filesystem type, super options) from /proc/self/mountinfo."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields = left.split()
            kind, _source, options = [*right.split(), "", "", ""][:3]
            found.append((fields[4], kind, options))
    return found


def _own_path(controller: str | None) -> str:
    """This process's cgroup path in the v1 hierarchy of ``controller``, or the v2 one (None)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hierarchy, controllers, path = line.split(":", 2)
            if controller is None and hierarchy == "0" and controllers == "":
                return path
            if controller is not None and controller in controllers.split(","):
                return path
    return "/"


@dataclass(frozen=True)
class MemoryCgroup:
    path: Path
    version: int
    limit: int

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def oom_kills(self) -> int:
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def remove(self) -> None:
        for _ in range(50):  # the last processes may take a moment to leave after a kill
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)


def _v2_root() -> Path | None:
    for point, kind, _ in _mounts():
        if kind == "cgroup2":
            root = Path(point) / _own_path(None).lstrip("/")
            with contextlib.suppress(OSError):
                if "memory" in (root / "cgroup.controllers").read_text().split():
                    return root
    return None


def _v1_root() -> Path | None:
    for point, kind, options in _mounts():
        if kind == "cgroup" and "memory" in options.split(","):
            return Path(point) / _own_path("memory").lstrip("/")
    return None


def create(name: str, limit: int) -> MemoryCgroup:
    """A new memory cgroup below this process's own, limited to ``limit`` bytes (no swap beyond it)."""
    errors = []
    for version, root in ((2, _v2_root()), (1, _v1_root())):
        if root is None:
            continue
        group = root / name
        try:
            group.mkdir(exist_ok=True)
            if version == 2:
                (group / "memory.max").write_text(str(limit))
                with contextlib.suppress(OSError):
                    (group / "memory.swap.max").write_text("0")
            else:
                (group / "memory.limit_in_bytes").write_text(str(limit))
                with contextlib.suppress(OSError):
                    (group / "memory.memsw.limit_in_bytes").write_text(str(limit))
            return MemoryCgroup(group, version, limit)
        except OSError as exc:
            errors.append(f"cgroup v{version} at {root}: {exc.strerror}")
            with contextlib.suppress(OSError):
                group.rmdir()
    reason = "; ".join(errors) or "no memory cgroup controller is mounted"
    raise UsageError(
        f"--memory-limit needs a memory cgroup this user may create ({reason}); run as root, or without it",
        f"--memory-limit 需要可创建的内存 cgroup（{reason}）；请以 root 运行，或不使用该选项",
    )
