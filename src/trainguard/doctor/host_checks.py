"""The doctor's checks of the host the job runs on, each a pure function of a Facts snapshot: the
container and the limits it sets (/dev/shm, memory, swap, open files), room on the disks (for
checkpoints above all), and the login session that holds the job."""

from __future__ import annotations

from trainguard.doctor.facts import Facts
from trainguard.doctor.results import GIB, MIB, CheckResult, Status, T, check_result, could_not_look, size_text


# ------------------------------------------------------------------------------------------ limits
def check_container(facts: Facts) -> CheckResult:
    cid = "container"
    if facts.container is None:
        return could_not_look(cid, facts, "container")
    if facts.container:
        return check_result(cid, Status.OK, T(f"inside a {facts.container} container: limits below are the container's",
                                              f"运行在 {facts.container} 容器中：下面的限制来自容器"))  # fmt: skip
    return check_result(cid, Status.OK, T("not in a container", "不在容器中"))


def check_shm_size(facts: Facts) -> CheckResult:
    cid = "shm_size"
    if facts.shm_total is None:
        return could_not_look(cid, facts, "shm_total")
    size = size_text(facts.shm_total)
    free = size_text(facts.shm_free or 0)
    detail = T(f"/dev/shm: {size}, {free} free", f"/dev/shm：{size}，可用 {free}")
    if facts.shm_total < 256 * MIB:
        return check_result(cid, Status.FAIL, T(f"/dev/shm is only {size}: DataLoader workers will die of SIGBUS",
                                                f"/dev/shm 只有 {size}：DataLoader worker 会因 SIGBUS 崩溃"), detail)  # fmt: skip
    if facts.shm_total < GIB:
        return check_result(
            cid,
            Status.WARN,
            T(f"/dev/shm is {size}: small for DataLoader workers", f"/dev/shm 为 {size}：对 DataLoader worker 偏小"),
            detail,
        )
    return check_result(cid, Status.OK, T(f"/dev/shm {size}", f"/dev/shm {size}"), detail)


def check_cgroup_memory_limit(facts: Facts) -> CheckResult:
    cid = "cgroup_memory_limit"
    if facts.host_memory is None:
        return could_not_look(cid, facts, "host_memory")
    host = size_text(facts.host_memory)
    if facts.cgroup_memory_limit is None:
        return check_result(
            cid, Status.OK, T(f"no memory cgroup limit; host RAM {host}", f"无 cgroup 内存上限；主机内存 {host}")
        )
    limit = size_text(facts.cgroup_memory_limit)
    detail = T(f"limit {limit} of {host} host RAM: the OOM killer acts at the limit",
               f"上限 {limit}（主机内存 {host}）：到达上限时 OOM killer 会杀进程")  # fmt: skip
    if facts.cgroup_memory_limit < min(8 * GIB, facts.host_memory // 2):
        return check_result(cid, Status.WARN, T(f"memory limited to {limit} by a cgroup (host has {host})",
                                                f"cgroup 把内存限制为 {limit}（主机有 {host}）"), detail)  # fmt: skip
    return check_result(cid, Status.OK, T(f"memory limited to {limit} by a cgroup (host has {host})",
                                          f"cgroup 把内存限制为 {limit}（主机有 {host}）"), detail)  # fmt: skip


def check_swap(facts: Facts) -> CheckResult:
    cid = "swap"
    if facts.swap_total is None:
        return could_not_look(cid, facts, "swap_total")
    if facts.swap_total == 0:
        return check_result(cid, Status.OK, T("no swap: when RAM is full the OOM killer acts at once",
                                              "无 swap：内存占满时 OOM killer 会立即动作"))  # fmt: skip
    return check_result(cid, Status.OK, T(f"swap {size_text(facts.swap_total)}", f"swap {size_text(facts.swap_total)}"))


def check_open_files(facts: Facts) -> CheckResult:
    cid = "open_files_limit"
    if facts.nofile_soft is None:
        return could_not_look(cid, facts, "nofile_soft")
    summary = T(
        f"ulimit -n {facts.nofile_soft} (hard {facts.nofile_hard})",
        f"ulimit -n {facts.nofile_soft}（硬上限 {facts.nofile_hard}）",
    )
    if facts.nofile_soft < 1024:
        return check_result(cid, Status.FAIL, summary)
    if facts.nofile_soft < 4096:
        return check_result(cid, Status.WARN, summary)
    return check_result(cid, Status.OK, summary)


def check_disk_space(facts: Facts) -> CheckResult:
    cid = "disk_space"
    if not facts.disks:
        return could_not_look(cid, facts, "disks")
    needed = max(GIB, 2 * (facts.last_checkpoint_bytes or 0))
    comfortable = max(10 * GIB, 5 * (facts.last_checkpoint_bytes or 0))
    worst = min(facts.disks, key=lambda d: d.free)
    lines = "; ".join(f"{d.path}: {size_text(d.free)} free of {size_text(d.total)}" for d in facts.disks)
    detail = T(lines, lines)
    if worst.free < needed:
        return check_result(cid, Status.FAIL, T(f"{worst.path} has {size_text(worst.free)} free: the next checkpoint may not fit",
                                                f"{worst.path} 只剩 {size_text(worst.free)}：下一个检查点可能放不下"), detail)  # fmt: skip
    if worst.free < comfortable:
        return check_result(
            cid,
            Status.WARN,
            T(f"{worst.path} has {size_text(worst.free)} free", f"{worst.path} 剩余 {size_text(worst.free)}"),
            detail,
        )
    return check_result(
        cid,
        Status.OK,
        T(f"enough free disk ({size_text(worst.free)} at least)", f"磁盘空间充足（至少 {size_text(worst.free)}）"),
        detail,
    )


# A run's checkpoints go to the state folder (under the home directory by default) unless
# --checkpoint-dir: room for keep + 1 of them (Checkpointer's keep=3, the next written before the oldest
# goes), and never less than 20 GiB, which holds one checkpoint of a 7B model's bf16 weights (13 GiB)
# and little else; home quotas of 5-50 GB are common on shared clusters.
CHECKPOINTS_ON_DISK = 4
CHECKPOINT_ROOM_FLOOR = 20 * GIB


def check_checkpoint_disk_room(facts: Facts) -> CheckResult:
    cid = "checkpoint_disk_room"
    disk = facts.state_disk
    if facts.checkpoint_dir_chosen:
        return check_result(cid, Status.OK, T(f"checkpoints go to {facts.checkpoint_dir_chosen}, not the state folder (see disk_space)",
                                              f"检查点写到 {facts.checkpoint_dir_chosen}，不在状态目录（见 disk_space）"))  # fmt: skip
    if disk is None:
        return could_not_look(cid, facts, "state_disk")
    room, quota_en, quota_zh = disk.free, "", ""
    if disk.quota_limit is not None:
        used = disk.quota_used or 0
        room = min(room, max(0, disk.quota_limit - used))
        quota_en, quota_zh = (f"; your quota: {size_text(used)} of {size_text(disk.quota_limit)} used",
                              f"；你的配额：已用 {size_text(used)}，共 {size_text(disk.quota_limit)}")  # fmt: skip
    size = max(facts.state_checkpoint_bytes or 0, facts.last_checkpoint_bytes or 0)
    needed = max(CHECKPOINT_ROOM_FLOOR, CHECKPOINTS_ON_DISK * size)
    why_en = f"{CHECKPOINTS_ON_DISK} checkpoints of {size_text(size)}" if needed > CHECKPOINT_ROOM_FLOOR else "at least"
    why_zh = f"{CHECKPOINTS_ON_DISK} 个 {size_text(size)} 的检查点" if needed > CHECKPOINT_ROOM_FLOOR else "至少"
    detail = T(f"{disk.path}: {size_text(disk.free)} free of {size_text(disk.total)}{quota_en}; wanted: {why_en} {size_text(needed)}",
               f"{disk.path}：剩余 {size_text(disk.free)}，共 {size_text(disk.total)}{quota_zh}；需要：{why_zh} {size_text(needed)}")  # fmt: skip
    where_en, where_zh = (("the state folder in your home folder", "你的主目录中的状态目录") if disk.in_home
                          else (f"the state folder {disk.path}", f"状态目录 {disk.path}"))  # fmt: skip
    if room < needed:
        return check_result(cid, Status.WARN, T(f"checkpoints go to {where_en} by default: only {size_text(room)} left for them there",
                                                f"检查点默认写到{where_zh}：那里只剩 {size_text(room)}"), detail)  # fmt: skip
    return check_result(cid, Status.OK, T(f"{size_text(room)} free for checkpoints in the state folder",
                                          f"状态目录中有 {size_text(room)} 可用于检查点"), detail)  # fmt: skip


# ------------------------------------------------------------------------------------------ session
def check_ssh_session(facts: Facts) -> CheckResult:
    cid = "ssh_session"
    if facts.kill_user_processes and not facts.lingering:
        return check_result(cid, Status.WARN, T("systemd kills all your processes at logout (KillUserProcesses=yes, no linger): even tmux dies",
                                                "systemd 会在退出登录时杀死你的所有进程（KillUserProcesses=yes 且未开启 linger）：连 tmux 也会被杀"))  # fmt: skip
    if facts.ssh and not facts.multiplexer and not facts.under_trainguard:
        return check_result(cid, Status.WARN, T("this shell is an SSH session without tmux/screen: a job started here dies when the connection drops",
                                                "当前是未使用 tmux/screen 的 SSH 会话：在这里启动的作业会随连接断开而终止"))  # fmt: skip
    if facts.multiplexer or facts.under_trainguard:
        where = facts.multiplexer or "trainguard"
        return check_result(cid, Status.OK, T(f"session: {where}", f"会话：{where}"))
    if facts.ssh:
        return check_result(cid, Status.OK, T("session: SSH", "会话：SSH"))
    return check_result(cid, Status.OK, T("session: a local session", "会话：本地会话"))


# ------------------------------------------------------------------------------------------ kernel log
def check_kernel_log_access(facts: Facts) -> CheckResult:
    """What a user without the kernel log cannot see (kernel.dmesg_restrict=1, as on most shared
    servers and in containers), and what trainguard reads instead."""
    cid = "kernel_log_access"
    if facts.kernel_log_readable is None:
        return could_not_look(cid, facts, "xids")
    if facts.kernel_log_readable:
        return check_result(cid, Status.OK, T("the kernel log is readable: OOM kills and GPU Xid errors are read from it",
                                              "内核日志可读：OOM 杀进程与 GPU Xid 错误从中读取"))  # fmt: skip
    if facts.oom_counter:
        return check_result(
            cid, Status.WARN,
            T("the kernel log is closed to you: GPU Xid errors cannot be seen; OOM kills are told from a kill -9 "
              f"by the OOM counter ({facts.oom_counter})",
              f"你无法读取内核日志：看不到 GPU Xid 错误；OOM 杀进程与 kill -9 由 OOM 计数区分（{facts.oom_counter}）"),
        )  # fmt: skip
    return check_result(cid, Status.WARN, T("the kernel log and the OOM counters are closed to you: an OOM kill "
                                            "cannot be told from a kill -9, GPU Xid errors cannot be seen",
                                            "你无法读取内核日志和 OOM 计数：无法区分 OOM 杀进程与 kill -9，也看不到 GPU Xid 错误"))  # fmt: skip
