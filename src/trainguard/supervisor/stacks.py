"""A hung job's Python stacks, dumped with py-spy into the run's folder before it is stopped: for a
launcher's job each worker's rank is named, and the ranks the others wait for are recorded for the
diagnosis."""

from __future__ import annotations

import shutil
import subprocess
from typing import TYPE_CHECKING

from trainguard._i18n import Text
from trainguard.diagnosis import launch
from trainguard.paths import open_private
from trainguard.supervisor import launchers
from trainguard.supervisor.attempt_files import append_marker, hang_stacks_file

if TYPE_CHECKING:
    from trainguard.supervisor.watch import AttemptWatch


def dump_stacks(watch: AttemptWatch, run_dir: str, hang_timeout_s: float | None) -> None:
    """Every process's Python stack into the run's folder (py-spy); for a launcher's job each
    worker's rank is named, and the ranks that are not waiting in a collective while the others
    are (the ones the job waits for) are recorded for the diagnosis."""
    target = hang_stacks_file(run_dir, watch.attempt.n)
    py_spy = shutil.which("py-spy")
    try:
        if py_spy is None:
            with open_private(target) as out:
                out.write("py-spy is not installed (pip install py-spy): no stacks could be dumped\n")
            append_marker(watch.attempt.log_path, Text("no progress; py-spy not installed, no stacks",
                                                       "没有进展；未安装 py-spy，无法导出调用栈"))  # fmt: skip
            return
        watch.learn_workers()
        worker_stacks: dict[int, str] = {}
        with open_private(target) as out:
            for pid in sorted(watch.containment.pids() or watch.pids):
                rank, local = watch.workers.get(pid) or launchers.worker_identity(pid) or (-1, -1)
                named = f" (rank {rank}, local rank {local})" if rank >= 0 else ""
                out.write(f"--- process {pid}{named} ---\n")
                out.flush()
                stack = _py_spy(py_spy, pid, watch)
                out.write(stack)
                if rank >= 0 and stack.strip():
                    worker_stacks[rank] = worker_stacks.get(rank, "") + stack
        if watch.launch_record is not None:
            watch.launch_record["hung_ranks"] = list(launch.hung_ranks(worker_stacks))
    except OSError:
        return  # a full state disk loses the stacks, not the restart
    timeout = f"{hang_timeout_s:g}"
    append_marker(watch.attempt.log_path, Text(f"no progress for {timeout} s; stacks in {target}",
                                               f"{timeout} 秒没有进展；调用栈见 {target}"))  # fmt: skip


def _py_spy(py_spy: str, pid: int, watch: AttemptWatch) -> str:
    dump = subprocess.Popen([py_spy, "dump", "--pid", str(pid)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    watch.containment.helpers.add(dump.pid)  # a helper of the supervisor's, not a leftover of the job's
    try:
        output, _ = dump.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        dump.kill()
        output, _ = dump.communicate()
    finally:
        watch.containment.helpers.discard(dump.pid)
    return output.decode("utf-8", "replace")
