"""What is checked before a run exists: its command, its working folder, its checkpoint folder (no
other live run's of this machine) and its memory limit can be used, and its --retry overrides name
real causes; a run that would fail at once is refused with one line, before any record of it is
written. Before an ended run goes on in place, its checkpoint folder. And the run's options as its
record keeps them."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from trainguard._i18n import Text
from trainguard.causes import CAUSE_IDS, Retry
from trainguard.errors import UsageError
from trainguard.paths import state_dir
from trainguard.store.registry import Registry, Run
from trainguard.supervisor import checkpoint_folders

MIN_MEMORY_LIMIT = 64 * 1024**2


def check_command(command: list[str], cwd: str) -> None:
    """A command that cannot start is refused before any run record exists."""
    program = command[0]
    if os.sep in program:
        path = program if os.path.isabs(program) else os.path.join(cwd, program)
        if not os.path.exists(path):
            raise UsageError(f"no such command: {program}", f"命令不存在：{program}")
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise UsageError(f"not an executable file: {program}", f"不是可执行文件：{program}")
    elif shutil.which(program) is None:
        raise UsageError(f"command not found: {program}", f"找不到命令：{program}")


def check_cwd(cwd: str) -> None:
    try:
        os.listdir(cwd)
    except OSError as exc:
        raise UsageError(f"cannot use the working folder {cwd}: {exc.strerror}",
                         f"无法使用工作目录 {cwd}：{exc.strerror}") from None  # fmt: skip


def check_checkpoint_dir(path: str, *, except_run: str | None = None) -> None:
    """The job's checkpoint folder is no other active run's of this machine (nor inside or around
    one), and can be created and written; or the run is refused now. ``except_run``: the run that
    goes on in it (its own folder is never in its way)."""
    if (state_dir() / "runs.sqlite").exists():
        checkpoint_folders.refuse_if_held(Registry(state_dir()), path, except_run=except_run)
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".trainguard-probe-"):
            pass
    except OSError as exc:
        raise UsageError(
            f"--checkpoint-dir {path}: cannot write there ({exc.strerror or exc})",
            f"--checkpoint-dir {path}：无法写入（{exc.strerror or exc}）",
        ) from None


def check_continued_checkpoint_dir(run: Run, options: Mapping[str, Any] | None = None) -> Text | None:
    """Before an ended run goes on in place (with ``options``, else its own): its checkpoint folder
    is refused when another active run of this machine uses it now; and when the folder is gone, the
    line that says the run starts fresh (the person may have moved it, or meant another)."""
    folder = (options or run.options)["checkpoint_dir"]
    if (state_dir() / "runs.sqlite").exists():
        checkpoint_folders.refuse_if_held(Registry(state_dir()), folder, except_run=run.id)
    if os.path.isdir(folder):
        return None
    return Text(
        f"note: the checkpoint folder of run {run.id}, {folder}, is gone: it starts fresh, from no checkpoint",
        f"注意：运行 {run.id} 的检查点目录 {folder} 已不存在：将从头开始，不从任何检查点恢复",
    )


def check_memory_limit(limit: int) -> None:
    """Between 64 MiB and what the machine has (RAM + swap), and enforceable by a memory cgroup."""
    from trainguard.probes import cgroups

    ceiling = psutil.virtual_memory().total + psutil.swap_memory().total
    if not MIN_MEMORY_LIMIT <= limit <= ceiling:
        raise UsageError(
            f"--memory-limit must be between 64M and {ceiling / 1024**3:.1f}G (this machine's RAM + swap), "
            f"not {limit} bytes",
            f"--memory-limit 必须在 64M 与 {ceiling / 1024**3:.1f}G（本机内存 + swap）之间，而不是 {limit} 字节",
        )
    cgroups.create(f"trainguard-check-{os.getpid()}", limit).remove()


def parse_retry_overrides(items: tuple[str, ...]) -> dict[str, str]:
    overrides = {}
    for item in items:
        cause, _, value = item.partition("=")
        if cause not in CAUSE_IDS or value not in {r.value for r in Retry}:
            raise UsageError(
                f"--retry {item!r}: use CAUSE=yes|no|once with a cause id such as cuda_oom",
                f"--retry {item!r}：格式为 CAUSE=yes|no|once，CAUSE 为原因 id，例如 cuda_oom",
            )
        overrides[cause] = value
    return overrides


def options_record(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}
