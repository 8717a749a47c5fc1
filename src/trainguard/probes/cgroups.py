"""The cgroup adapter: a group of the job's own for each attempt, so that everything the job starts
(workers, double-forked daemons, a launcher's ranks) can be found and killed, and a memory limit
(``--memory-limit``) whose OOM kills are the job's for certain.

cgroup v2 where a unified hierarchy is mounted and writable (``cgroup.kill`` ends every process at
once), else v1: a freezer group to stop every process before killing it (no fork can escape) and a
memory group for the limit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainguard.errors import UsageError

KILL_TIMEOUT_S = 10.0
PAUSE_TIMEOUT_S = 0.2  # a job that does not freeze in this long runs on
THAW_TIMEOUT_S = 2.0


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, filesystem type, super options) from /proc/self/mountinfo."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields = left.split()
            kind, _source, options = [*right.split(), "", "", ""][:3]
            found.append((fields[4].replace("\\040", " "), kind, options))
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


def _v2_root(need_memory: bool) -> Path | None:
    for point, kind, _ in _mounts():
        if kind != "cgroup2":
            continue
        root = Path(point) / _own_path(None).lstrip("/")
        try:
            controllers = (root / "cgroup.controllers").read_text().split()
        except OSError:
            continue
        if not need_memory or "memory" in controllers:
            return root
    return None


def _v1_root(controller: str) -> Path | None:
    for point, kind, options in _mounts():
        if kind == "cgroup" and controller in options.split(","):
            return Path(point) / _own_path(controller).lstrip("/")
    return None


def _read_pids(path: Path) -> set[int]:
    try:
        return {int(line) for line in (path / "cgroup.procs").read_text().split()}
    except (OSError, ValueError):
        return set()


@dataclass(frozen=True)
class Cgroup:
    """One cgroup folder: ``version`` 2, or 1 with the controller of its hierarchy."""

    path: Path
    version: int
    controller: str | None = None

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def pids(self) -> set[int]:
        return _read_pids(self.path)

    def exists(self) -> bool:
        return self.path.is_dir()

    def to_record(self) -> dict[str, object]:
        return {"path": str(self.path), "version": self.version, "controller": self.controller}

    @classmethod
    def from_record(cls, record: dict[str, object]) -> Cgroup:
        return cls(Path(str(record["path"])), int(record["version"]), record.get("controller"))  # type: ignore[arg-type]

    def remove(self) -> None:
        for _ in range(50):  # the last processes take a moment to leave after a kill
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.05)


@dataclass(frozen=True)
class JobCgroups:
    """The cgroups one attempt runs in: one (v2), or a freezer and possibly a memory group (v1)."""

    groups: tuple[Cgroup, ...]
    limit: int | None = None

    @property
    def description(self) -> str:
        if self.groups and self.groups[0].version == 2:
            return "cgroup v2"
        return "cgroup v1 (" + ", ".join(g.controller or "?" for g in self.groups) + ")"

    def pids(self) -> set[int]:
        found: set[int] = set()
        for group in self.groups:
            found |= group.pids()
        return found

    def oom_kills(self) -> int:
        for group in self.groups:
            name = "memory.events" if group.version == 2 else "memory.oom_control"
            if group.version == 1 and group.controller != "memory":
                continue
            with contextlib.suppress(OSError, ValueError):
                for line in (group.path / name).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        return 0

    def memory_held(self) -> int | None:
        """Bytes the job's memory group holds that reclaim cannot give back (anonymous memory and
        shared memory: what the OOM killer counts, not the page cache), or None without a memory
        group. One small file read: cheap enough to do several times a second."""
        for group in self.groups:
            if group.version == 1 and group.controller != "memory":
                continue
            keys = ("anon", "shmem") if group.version == 2 else ("total_rss", "total_shmem")
            with contextlib.suppress(OSError, ValueError):
                stat = dict(line.split(" ", 1) for line in (group.path / "memory.stat").read_text().splitlines())
                return sum(int(stat.get(key, 0)) for key in keys)
        return None

    def kill_all(self, timeout_s: float = KILL_TIMEOUT_S) -> int:
        """SIGKILL every process in the groups and wait until they are empty; how many were killed."""
        victims = self.pids()
        if not victims:
            return 0
        deadline = time.monotonic() + timeout_s
        v2 = [g for g in self.groups if g.version == 2]
        freezer = next((g for g in self.groups if g.controller == "freezer"), None)
        for group in v2:
            with contextlib.suppress(OSError):
                (group.path / "cgroup.kill").write_text("1")
        while time.monotonic() < deadline:
            if freezer is not None:
                _freeze(freezer, True, deadline)
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if freezer is not None:
                _freeze(freezer, False, deadline)
            if not self.pids():
                break
            time.sleep(0.02)
        return len(victims)

    @contextlib.contextmanager
    def paused(self, timeout_s: float = PAUSE_TIMEOUT_S) -> Iterator[bool]:
        """The job frozen for the moment of the ``with`` (a v1 freezer or v2 ``cgroup.freeze``),
        thawed after it whatever happens; yields whether it froze within ``timeout_s`` (a process
        stuck in the kernel, on NFS say, may keep it from freezing: then it runs on)."""
        group = next((g for g in self.groups if g.version == 2 or g.controller == "freezer"), None)
        if group is None:
            yield False
            return
        try:
            yield _freeze(group, True, time.monotonic() + timeout_s)
        finally:
            _freeze(group, False, time.monotonic() + THAW_TIMEOUT_S)

    def thaw(self) -> None:
        """Thawed, should a supervisor have died while its job was paused."""
        for group in self.groups:
            if group.version == 2 or group.controller == "freezer":
                _freeze(group, False, time.monotonic() + THAW_TIMEOUT_S)

    def remove(self) -> None:
        for group in self.groups:
            group.remove()

    def to_record(self) -> list[dict[str, object]]:
        return [g.to_record() for g in self.groups]

    @classmethod
    def from_record(cls, records: list[dict[str, object]]) -> JobCgroups:
        return cls(tuple(Cgroup.from_record(r) for r in records))


def _freeze(group: Cgroup, frozen: bool, deadline: float) -> bool:
    """Freeze (or thaw) the group and wait until the kernel says it is done: a frozen group cannot
    fork, so one pass of SIGKILL reaches every process. Whether it was done by ``deadline``."""
    with contextlib.suppress(OSError):
        if group.version == 2:
            (group.path / "cgroup.freeze").write_text("1" if frozen else "0")
            want = f"frozen {int(frozen)}"
            while time.monotonic() < deadline:
                if want in (group.path / "cgroup.events").read_text().splitlines():
                    return True
                time.sleep(0.001)
            return False
        want = "FROZEN" if frozen else "THAWED"
        (group.path / "freezer.state").write_text(want)
        while time.monotonic() < deadline:
            if (group.path / "freezer.state").read_text().strip() == want:
                return True
            time.sleep(0.001)
    return False


def _make(root: Path, name: str) -> Path:
    path = root / name
    path.mkdir(exist_ok=True)
    return path


def create(name: str, limit: int | None) -> JobCgroups:
    """Cgroups named ``name`` below this process's own, limited to ``limit`` bytes when given (no
    swap beyond it). Raises CgroupUnavailable when this user cannot create them."""
    errors: list[str] = []
    root = _v2_root(need_memory=limit is not None)
    if root is not None:
        try:
            path = _make(root, name)
            if limit is not None:
                (path / "memory.max").write_text(str(limit))
                with contextlib.suppress(OSError):
                    (path / "memory.swap.max").write_text("0")
            return JobCgroups((Cgroup(path, 2),), limit)
        except OSError as exc:
            errors.append(f"cgroup v2 at {root}: {exc.strerror}")
            with contextlib.suppress(OSError):
                (root / name).rmdir()
    made: list[Cgroup] = []
    try:
        wanted = ["freezer", *(["memory"] if limit is not None else [])]
        for controller in wanted:
            v1 = _v1_root(controller)
            if v1 is None:
                if controller == "memory":
                    raise OSError(0, f"no v1 {controller} hierarchy is mounted")
                continue
            made.append(Cgroup(_make(v1, name), 1, controller))
            if controller == "memory":
                (made[-1].path / "memory.limit_in_bytes").write_text(str(limit))
                with contextlib.suppress(OSError):
                    (made[-1].path / "memory.memsw.limit_in_bytes").write_text(str(limit))
        if made:
            return JobCgroups(tuple(made), limit)
        errors.append("no cgroup hierarchy is mounted")
    except OSError as exc:
        errors.append(f"cgroup v1: {exc.strerror}")
        for group in made:
            group.remove()
    raise CgroupUnavailable("; ".join(errors))


class CgroupUnavailable(UsageError):
    def __init__(self, reason: str) -> None:
        super().__init__(
            f"--memory-limit needs a memory cgroup this user may create ({reason}); run as root, or without it",
            f"--memory-limit 需要可创建的内存 cgroup（{reason}）；请以 root 运行，或不使用该选项",
        )
        self.reason = reason
