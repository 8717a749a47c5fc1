"""A hung job's Python stacks, dumped into the run's folder before it is stopped. py-spy where it works
(installed, and allowed to attach: ptrace rights); else each Python process's own faulthandler, armed
by the job's start-up hook (``trainguard/_jobsite``) on trainguard's signal, which needs neither. For a
launcher's job each worker's rank is named, and the ranks the others wait for are recorded for the
diagnosis. The log's marker says which way the stacks came, or why none could be dumped."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainguard._i18n import Text
from trainguard._proc import ProcessRef, catches_signal
from trainguard._untrusted import open_regular
from trainguard.diagnosis import launch
from trainguard.paths import open_private
from trainguard.supervisor import launchers
from trainguard.supervisor.attempt_files import append_marker, hang_stacks_file, stacks_dir
from trainguard.supervisor.job import STACKS_SIGNAL

if TYPE_CHECKING:
    from trainguard.supervisor.watch import AttemptWatch

FAULTHANDLER_WAIT_S = 2.0  # how long the signalled processes have to write their stacks
_SETTLED_S = 0.05  # a file that grew and then stayed this long unchanged holds the whole dump
MAX_DUMP_BYTES = 4 * 1024 * 1024  # per process: faulthandler writes at most 100 threads of 100 frames

PY_SPY = "py-spy"
FAULTHANDLER = "faulthandler"
_NO_PY_SPY = "py-spy is not installed: pip install py-spy"
_NOT_ARMED = "not armed for faulthandler (not a Python process, or one started with -I, -E or -S)"
_SILENT = f"faulthandler wrote nothing within {FAULTHANDLER_WAIT_S:g} s (the signal blocked, or the process stopped)"


@dataclass
class ProcessStacks:
    """One process's stacks, the way they were had (None: not had), and what was learnt on the way."""

    text: str = ""
    way: str | None = None
    notes: tuple[str, ...] = ()

    def noted(self, note: str) -> None:
        self.notes = (*self.notes, note)


def dump_stacks(watch: AttemptWatch, run_dir: str, hang_timeout_s: float | None) -> None:
    """Every process's Python stacks into the run's folder; for a launcher's job each worker's rank
    is named, and the ranks that are not waiting in a collective while the others are (the ones the
    job waits for) are recorded for the diagnosis."""
    n = watch.attempt.n
    target = hang_stacks_file(run_dir, n)
    watch.learn_workers()
    pids = sorted(watch.containment.pids() or watch.pids)
    py_spy = shutil.which("py-spy")
    stacks = {pid: _py_spy(py_spy, pid, watch) if py_spy else ProcessStacks(notes=(_NO_PY_SPY,)) for pid in pids}
    folder = stacks_dir(run_dir, n)
    faulthandler_dumps({pid: found for pid, found in stacks.items() if found.way is None}, folder)
    shutil.rmtree(folder, ignore_errors=True)  # read: the hang stacks file holds them now
    worker_stacks: dict[int, str] = {}
    try:
        with open_private(target) as out:
            for pid, found in stacks.items():
                rank, local = watch.workers.get(pid) or launchers.worker_identity(pid) or (-1, -1)
                named = f" (rank {rank}, local rank {local})" if rank >= 0 else ""
                out.write(f"--- process {pid}{named} ---\n{_section(found)}")
                if rank >= 0 and found.text.strip():
                    worker_stacks[rank] = worker_stacks.get(rank, "") + found.text
    except OSError:
        return  # a full state disk loses the stacks, not the restart
    if watch.launch_record is not None:
        watch.launch_record["hung_ranks"] = list(launch.hung_ranks(worker_stacks))
    append_marker(watch.attempt.log_path, hang_marker(stacks, py_spy is not None, f"{hang_timeout_s:g}", str(target)))


def faulthandler_dumps(wanting: dict[int, ProcessStacks], folder: str) -> None:
    """The stacks of the processes in ``wanting`` that the start-up hook armed, each from its own
    file in ``folder``: trainguard's signal goes only to a process that catches it (a real-time
    signal kills one that does not), then each gets FAULTHANDLER_WAIT_S in all to write."""
    sent: dict[int, tuple[str, int]] = {}
    for pid, found in wanting.items():
        own = os.path.join(folder, f"{pid}.txt")
        before = _size(own)
        if before is None or not catches_signal(pid, STACKS_SIGNAL) or not ProcessRef.of(pid).signal(STACKS_SIGNAL):
            found.noted(_NOT_ARMED)
        else:
            sent[pid] = (own, before)
    _wait_until_written(sent)
    for pid, (own, before) in sent.items():
        text = _read_from(own, before)
        if text.strip():
            wanting[pid].text, wanting[pid].way = text, FAULTHANDLER
        else:
            wanting[pid].noted(_SILENT)


def _wait_until_written(sent: dict[int, tuple[str, int]]) -> None:
    """Until every file has grown and then stayed unchanged for a moment, FAULTHANDLER_WAIT_S at most."""
    deadline = time.monotonic() + FAULTHANDLER_WAIT_S
    last = {pid: before for pid, (_own, before) in sent.items()}
    pending = set(sent)
    while pending and time.monotonic() < deadline:
        time.sleep(_SETTLED_S)
        for pid in sorted(pending):
            size = _size(sent[pid][0])
            if size is not None and size > sent[pid][1] and size == last[pid]:
                pending.discard(pid)
            last[pid] = size if size is not None else last[pid]


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _read_from(path: str, offset: int) -> str:
    """What the job's process wrote into its file after ``offset`` (a file of the job's: bounded,
    never a FIFO or device)."""
    handle = open_regular(path)
    if handle is None:
        return ""
    with handle:
        try:
            handle.seek(offset)
            return handle.read(MAX_DUMP_BYTES).decode("utf-8", "replace")
        except OSError:
            return ""


def _section(found: ProcessStacks) -> str:
    """A process's part of the hang stacks file, after its header."""
    if found.way == PY_SPY:
        return found.text
    if found.way == FAULTHANDLER:
        return f"Python stacks by faulthandler ({'; '.join(found.notes)}):\n{found.text}"
    return f"no Python stacks: {'; '.join(found.notes)}\n"


def hang_marker(stacks: dict[int, ProcessStacks], py_spy_installed: bool, timeout: str, target: str) -> Text:
    """The attempt log's line on the dump: which way the stacks came, or why none could be had."""
    dumped = [found.way for found in stacks.values() if found.way]
    if dumped:
        ways = sorted(set(dumped), key=[PY_SPY, FAULTHANDLER].index)
        return Text(
            f"no progress for {timeout} s; stacks of {len(dumped)} of {len(stacks)} processes "
            f"({' and '.join(ways)}) in {target}",
            f"{timeout} 秒没有进展；{len(stacks)} 个进程中 {len(dumped)} 个的调用栈（{'、'.join(ways)}）见 {target}",
        )
    if not stacks:
        return Text(f"no progress for {timeout} s; no stacks could be dumped: no process of the job was left",
                    f"{timeout} 秒没有进展；无法导出调用栈：作业已没有进程")  # fmt: skip
    if py_spy_installed:
        py_spy = Text("py-spy failed (no ptrace rights?)", "py-spy 失败（没有 ptrace 权限？）")
    else:
        py_spy = Text("py-spy is not installed (pip install py-spy)", "未安装 py-spy（pip install py-spy）")
    if any(_SILENT in found.notes for found in stacks.values()):
        armed = Text(f"the processes armed for faulthandler wrote nothing in {FAULTHANDLER_WAIT_S:g} s",
                     f"已启用 faulthandler 的进程 {FAULTHANDLER_WAIT_S:g} 秒内没有写出调用栈")  # fmt: skip
    else:
        armed = Text("no process has trainguard's faulthandler armed (not Python, or started with -I, -E or -S)",
                     "没有进程启用了 trainguard 的 faulthandler（不是 Python，或以 -I、-E、-S 启动）")  # fmt: skip
    return Text(f"no progress for {timeout} s; no stacks could be dumped: {py_spy.en}, and {armed.en} (see {target})",
                f"{timeout} 秒没有进展；无法导出调用栈：{py_spy.zh}，且{armed.zh}（见 {target}）")  # fmt: skip


def _py_spy(py_spy: str, pid: int, watch: AttemptWatch) -> ProcessStacks:
    dump = subprocess.Popen([py_spy, "dump", "--pid", str(pid)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    watch.containment.helpers.add(dump.pid)  # a helper of the supervisor's, not a leftover of the job's
    try:
        output, _ = dump.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        dump.kill()
        output, _ = dump.communicate()
    finally:
        watch.containment.helpers.discard(dump.pid)
    text = output.decode("utf-8", "replace")
    if dump.returncode == 0 and text.strip():
        return ProcessStacks(text=text, way=PY_SPY)
    said = [line.strip() for line in text.splitlines() if line.strip()]
    return ProcessStacks(notes=(f"py-spy failed: {said[-1][:200] if said else f'exit status {dump.returncode}'}",))
