"""``trainguard run | restart | adopt``: put a job under a supervisor that keeps it alive: a new run,
an ended run continued in place from its newest checkpoint, a run whose supervisor died watched again.
With --foreground the supervisor runs in this process and the command ends with the run's verdict."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterator, Mapping
from typing import Any

import click

from trainguard.checkpoint.layouts import LAYOUTS
from trainguard.cli.echo import echoing_output
from trainguard.cli.finish import Finish, under_slurm
from trainguard.cli.logs import follow_run
from trainguard.cli.output import say
from trainguard.cli.params import as_duration, as_run_name, as_signal_number, as_size, open_registry
from trainguard.cli.render import ended_line, shell_join
from trainguard.errors import UsageError
from trainguard.integrations import slurm
from trainguard.monitor.notify import from_config, from_flag, to_record
from trainguard.paths import state_dir
from trainguard.store.registry import Registry, Run, RunNotFound
from trainguard.store.states import TERMINAL_STATES, RunState
from trainguard.supervisor import service
from trainguard.supervisor.lock import AlreadyWatched
from trainguard.supervisor.log_policy import DEFAULT_BACKUPS, DEFAULT_MAX_SIZE, MIN_MAX_SIZE, MiB
from trainguard.units import format_size


def _cwd() -> str:
    try:
        cwd = os.getcwd()
    except FileNotFoundError:
        raise UsageError(
            "the current folder no longer exists: cd to a folder that does", "当前目录已不存在：请先 cd 到存在的目录"
        ) from None
    try:
        cwd.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(cwd).decode("utf-8", "backslashreplace")
        raise UsageError(f"the current folder's path is not valid UTF-8 ({shown}): run from a folder whose path is",
                         f"当前目录的路径不是有效的 UTF-8（{shown}）：请在路径有效的目录中运行") from None  # fmt: skip
    return cwd


def _refuse_detaching_from_slurm(foreground: bool) -> None:
    """A detached supervisor leaves the Slurm job it was started in: Slurm marks the job done within
    seconds while its training goes on outside the allocation, unaccounted and unkillable by scancel."""
    job = slurm.job_id(os.environ)
    if job is not None and not foreground:
        raise UsageError(
            f"inside Slurm job {job} a detached run would leave the allocation: add --foreground "
            "(e.g. srun trainguard run --foreground -- python train.py)",
            f"在 Slurm 作业 {job} 中，脱离终端的运行会离开资源分配：请加 --foreground"
            "（例如 srun trainguard run --foreground -- python train.py）",
        )


def _newest_named(name: str) -> tuple[Registry, Run] | None:
    if not (state_dir() / "runs.sqlite").exists():
        return None
    registry = open_registry()
    try:
        newest = registry.resolve(name)
    except RunNotFound:
        return None
    return (registry, newest) if newest.name == name else None


def _started_message(record: Run, command: list[str], verb_en: str = "started", verb_zh: str = "已启动") -> None:
    ref = record.ref
    click.echo(
        say(
            f"{verb_en} run {record.id} (pid {record.job_pid}): {shell_join(command)}\n"
            f"  log:     {record.log_path}\n  follow:  trainguard logs {ref} -f\n  status:  trainguard status {ref}",
            f"{verb_zh}运行 {record.id}（进程 {record.job_pid}）：{shell_join(command)}\n"
            f"  日志：  {record.log_path}\n  跟踪：  trainguard logs {ref} -f\n  状态：  trainguard status {ref}",
        )
    )


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--name", callback=as_run_name,
              help="A name that stands for the run; the name of an ended run continues that run.")
@click.option(
    "--restart",
    type=click.Choice(["never", "on-failure", "always"]),
    default="on-failure",
    show_default=True,
    help="When a dead job is started again: on-failure restarts the causes worth a retry (see --retry), "
    "always also restarts a job that exited 0, never leaves every death for you.",
)
@click.option(
    "--max-restarts",
    type=click.IntRange(0, 10_000),
    default=10,
    show_default=True,
    help="Restarts the run may use in all; then it ends failed.",
)
@click.option(
    "--retry",
    "retry",
    multiple=True,
    metavar="CAUSE=yes|no|once",
    help="Override the restart policy for one cause, e.g. --retry nccl_failure=no.",
)
@click.option(
    "--checkpoint-dir",
    type=click.Path(file_okay=False),
    help="Where the job's checkpoints go (TRAINGUARD_CHECKPOINT_DIR); default: the run's folder.",
)
@click.option(
    "--checkpoint-glob",
    metavar="PATTERN",
    help="For scripts that save their own files: the newest "
    "matching file (relative to --checkpoint-dir) is the checkpoint to resume from.",
)
@click.option(
    "--checkpoint-layout",
    type=click.Choice(LAYOUTS),
    default="auto",
    show_default=True,
    help="Whose checkpoints --checkpoint-dir holds (hf: Trainer's checkpoint-N, lightning: *.ckpt, deepspeed: "
    "tag folders, accelerate: checkpoints/checkpoint_N); the newest COMPLETE one is resumed from.",
)
@click.option(
    "--resume-arg",
    metavar="TEMPLATE",
    help='Appended when resuming; {checkpoint} is replaced by its path, e.g. "--resume {checkpoint}".',
)
@click.option(
    "--hang-timeout",
    callback=as_duration,
    metavar="DUR",
    help="No output, no checkpoint and no reported step this long "
    "(e.g. 30m) means hung: stacks are dumped and the job restarted. Off by default.",
)
@click.option(
    "--memory-limit", callback=as_size, metavar="SIZE", help="Put the job in its own memory cgroup (e.g. 64G)."
)
@click.option(
    "--log-max-size",
    callback=as_size,
    default=f"{DEFAULT_MAX_SIZE // MiB}M",
    show_default=True,
    metavar="SIZE",
    help="An attempt's log is rotated at this size: it keeps its first 1 MiB and its newest part (the live "
    "log and --log-backups earlier pieces), which is what a diagnosis reads; `logs` stitches them.",
)
@click.option(
    "--log-backups",
    type=click.IntRange(0, 100),
    default=DEFAULT_BACKUPS,
    show_default=True,
    help="Earlier pieces of an attempt's newest output kept beside its live log (each up to --log-max-size).",
)
@click.option(
    "--peer-timeout",
    callback=as_duration,
    default="10m",
    show_default=True,
    metavar="DUR",
    help="A launcher's job across nodes (torchrun --nnodes 2...): how long an attempt waits for the other "
    "nodes to join its rendezvous before the run ends with peer_failure (exit 75 under --foreground).",
)
@click.option(
    "--grace",
    callback=as_duration,
    default="120s",
    show_default=True,
    metavar="DUR",
    help="Time between the stop signal and SIGKILL, for a last checkpoint.",
)
@click.option(
    "--stop-signal",
    callback=as_signal_number,
    default="TERM",
    show_default=True,
    help="The signal `trainguard stop` and a hang send first (TERM, INT, USR1, ...), before --grace runs out.",
)
@click.option(
    "--sample-interval",
    callback=as_duration,
    default="5s",
    show_default=True,
    metavar="DUR",
    help="How often GPU, RAM, /dev/shm and disk are sampled while the job runs.",
)
@click.option(
    "--notify",
    "notify",
    multiple=True,
    metavar="KIND=URL",
    help="Send alerts and deaths to a webhook: webhook, slack, dingtalk, feishu or wecom (repeatable).",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="A TOML file with [[notify]] tables (kind, url, secret, lang).",
)
@click.option(
    "--metrics-port", type=click.IntRange(1, 65535), metavar="PORT", help="Serve Prometheus metrics of this run."
)
@click.option("--metrics-bind", default="127.0.0.1", show_default=True, help="Address for --metrics-port.")
@click.option("--foreground", is_flag=True, help="Supervise here (containers, Slurm, systemd) instead of detaching.")
@click.option("--follow", is_flag=True, help="Detach, then follow the log (Ctrl+C stops following, not the job).")
@click.option(
    "--requeue",
    is_flag=True,
    help="In a Slurm batch job (with --foreground): when the verdict is 75, ask Slurm to requeue the job "
    "(scontrol requeue $SLURM_JOB_ID); a preemption is handed to Slurm at once instead of restarting here.",
)
@click.option(
    "--termination-log",
    metavar="PATH",
    help="With --foreground: write the verdict there as JSON of at most 4 KB (cause, confidence, title, the "
    "deciding evidence line, the first fix). Default: /dev/termination-log where it exists (Kubernetes).",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD [ARGS]...")
def run(name, restart, max_restarts, retry, checkpoint_dir, checkpoint_glob, checkpoint_layout, resume_arg,
        hang_timeout, memory_limit, log_max_size, log_backups, peer_timeout, grace, stop_signal, sample_interval,
        notify, config_file, metrics_port, metrics_bind, foreground, follow, requeue, termination_log,
        command) -> int:  # fmt: skip
    """Run a training job that survives disconnects and restarts from its checkpoint when it dies.

    \b
    Examples:
      trainguard run -- python train.py --epochs 100
      trainguard run --name vit --hang-timeout 30m --resume-arg "--resume {checkpoint}" -- python train.py
      srun trainguard run --foreground --requeue -- python train.py
    """
    if foreground and follow:
        raise UsageError(
            "--follow detaches; it cannot go with --foreground", "--follow 会脱离终端，不能与 --foreground 同用"
        )
    _refuse_detaching_from_slurm(foreground)
    for flag, given in (("--requeue", requeue), ("--termination-log", termination_log is not None)):
        if given and not foreground:
            raise UsageError(f"{flag} acts when the run ends: it needs --foreground (as a scheduler runs it)",
                             f"{flag} 在运行结束时生效：需要与 --foreground 同用（调度器就是这样运行的）")  # fmt: skip
    if termination_log == "":
        raise UsageError("--termination-log needs a path", "--termination-log 需要一个路径")
    finish = Finish(requeue=requeue and under_slurm(), termination_log=termination_log)
    if resume_arg is not None and "{checkpoint}" not in resume_arg:
        raise UsageError(
            f"--resume-arg {resume_arg!r} has no {{checkpoint}}: it is where the checkpoint's path goes, "
            'e.g. --resume-arg "--resume {checkpoint}"',
            f"--resume-arg {resume_arg!r} 中没有 {{checkpoint}}：它会被替换为检查点路径，"
            '例如 --resume-arg "--resume {checkpoint}"',
        )
    cwd = _cwd()
    earlier = _newest_named(name) if name else None
    if earlier is not None and earlier[1].active:
        registry, record = earlier
        holder = service.watched_by(record)
        if holder is not None:
            raise AlreadyWatched(record.id, holder)
        click.echo(say(f"run {record.id} ({name}) is still running without its supervisor: taking it back under watch",
                       f"运行 {record.id}（{name}）仍在运行但没有监督进程：重新接管"), err=foreground)  # fmt: skip
        if foreground:  # a scheduler waits on this process: watch here, end with the verdict
            with echoing_output(record.id):
                verdict = service.supervise_run(record.id, registry=registry, adopt=True)
            return finish(registry, record.id, verdict)
        service.start_detached(registry, record, adopt=True)
        return 0
    service.check_cwd(cwd)
    service.check_command(list(command), cwd)
    if checkpoint_glob and checkpoint_layout != "auto":
        raise UsageError(
            "--checkpoint-glob and --checkpoint-layout both say which checkpoint to resume from: give one",
            "--checkpoint-glob 与 --checkpoint-layout 都指定从哪个检查点恢复：只能给一个",
        )
    if checkpoint_dir:
        service.check_checkpoint_dir(os.path.abspath(checkpoint_dir))
    if memory_limit is not None:
        service.check_memory_limit(memory_limit)
    if log_max_size < MIN_MAX_SIZE:
        given, least = format_size(log_max_size), format_size(MIN_MAX_SIZE)
        raise UsageError(f"--log-max-size {given} is below the least, {least}",
                         f"--log-max-size {given} 小于下限 {least}")  # fmt: skip
    notifiers = [from_flag(item) for item in notify] + (from_config(config_file) if config_file else [])
    if metrics_port is not None:
        _check_port_free(metrics_bind, metrics_port)
    options = service.options_record(
        restart=restart,
        max_restarts=max_restarts,
        retry=service.parse_retry_overrides(retry) or None,
        checkpoint_dir=os.path.abspath(checkpoint_dir) if checkpoint_dir else None,
        checkpoint_glob=checkpoint_glob,
        checkpoint_layout=checkpoint_layout,
        resume_arg=resume_arg,
        hang_timeout_s=hang_timeout,
        peer_timeout_s=peer_timeout,
        grace_s=grace,
        stop_signal=stop_signal,
        memory_limit=memory_limit,
        log_max_size=log_max_size,
        log_backups=log_backups,
        sample_interval_s=sample_interval,
        notify=to_record(notifiers) or None,
        metrics_port=metrics_port,
        metrics_bind=metrics_bind,
        requeue=finish.requeue or None,
    )
    if earlier is not None:  # an ended run of this name: continue it in place, with this command
        registry, record = earlier
        options.setdefault("checkpoint_dir", record.options["checkpoint_dir"])
        return _continue(registry, record.id, foreground=foreground, follow=follow, finish=finish,
                         command=list(command), cwd=cwd, options=options)  # fmt: skip
    with _stop_signals_wait_for_the_supervisor(swallow=not foreground):
        registry, record, lock = service.create_run(list(command), name=name, options=options)
        if foreground:
            click.echo(say(f"trainguard: run {record.id}, log {record.log_path}",
                           f"trainguard：运行 {record.id}，日志 {record.log_path}"), err=True)  # fmt: skip
            with echoing_output(record.id):
                verdict = service.supervise_run(record.id, registry=registry, lock=lock)
            return finish(registry, record.id, verdict)
        try:
            started = service.start_detached(registry, record, lock=lock)
        except BaseException:
            service.forget_if_never_started(registry, record.id)
            raise
    _report_start(registry, started, follow=follow)
    return 0


STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


@contextlib.contextmanager
def _stop_signals_wait_for_the_supervisor(*, swallow: bool) -> Iterator[None]:
    """While this command holds a run's lock for its supervisor, `trainguard stop` finds this process
    as the holder and signals it, and Ctrl+C may come: the stop is recorded in the registry, where the
    supervisor reads it as it starts, so neither may end this process half-way (a run left starting
    with nobody holding it). They wait, blocked, for the supervisor's handlers (``swallow=False``: the
    supervisor runs here and unblocks them itself) or are dropped once it has started."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        if swallow:
            previous = {signum: signal.signal(signum, lambda *_: None) for signum in STOP_SIGNALS}
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        else:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _report_start(registry: Registry, started: Run, *, follow: bool, continued: bool = False) -> None:
    if RunState(started.state) in TERMINAL_STATES:  # `trainguard stop` came while it was starting
        click.echo(ended_line(started))
        return
    if continued:
        _started_message(started, started.command, "continued", "已继续")
    else:
        _started_message(started, started.command)
    if follow:
        follow_run(registry, started, started.attempts[-1].n if started.attempts else None)


def _continue(registry: Registry, run_id: str, *, foreground: bool, follow: bool, finish: Finish | None = None,
              environment: Mapping[str, str] | None = None, **changes: Any) -> int:  # fmt: skip
    """Continue an ended run in place (with ``changes`` to its command, cwd, options), its job with
    ``environment`` from now on (by default this command's, as a `run` records it): its lock is
    taken here and handed to its supervisor, so that nothing meets it unheld while it starts."""
    with _stop_signals_wait_for_the_supervisor(swallow=not foreground):
        before = registry.get(run_id)
        if gone := service.check_continued_checkpoint_dir(before, changes.get("options")):
            click.echo(say(gone.en, gone.zh), err=True)
        environment = dict(os.environ) if environment is None else environment
        lock = service.prepare_continue(registry, run_id, environment=environment, **changes)
        record = registry.get(run_id)
        try:
            if foreground:
                click.echo(say(f"trainguard: continuing run {run_id}, log {record.log_path}",
                               f"trainguard：继续运行 {run_id}，日志 {record.log_path}"), err=True)  # fmt: skip
                with echoing_output(run_id):
                    verdict = service.supervise_run(run_id, registry=registry, restart=True, lock=lock)
                return (finish or Finish())(registry, run_id, verdict)
            started = service.start_detached(registry, record, restart=True, lock=lock)
        except BaseException:
            service.undo_continue_if_never_started(registry, before)
            raise
    _report_start(registry, started, follow=follow, continued=True)
    return 0


@click.command()
@click.argument("ref", metavar="RUN")
@click.option("--foreground", is_flag=True, help="Supervise here instead of detaching.")
@click.option("--follow", is_flag=True, help="Detach, then follow the log.")
@click.option(
    "--env",
    "assignments",
    multiple=True,
    metavar="KEY=VALUE",
    help="Change one variable of the run's environment, for this attempt and the later ones (repeatable); "
    "KEY= sets it empty.",
)
@click.option(
    "--unset-env",
    "removals",
    multiple=True,
    metavar="KEY",
    help="Remove one variable from the run's environment (repeatable).",
)
def restart(ref: str, foreground: bool, follow: bool, assignments: tuple[str, ...], removals: tuple[str, ...]) -> int:
    """Continue an ended run in place: same command, checkpoint folder, working folder and
    environment (those of its `run`, not this shell's), the next attempt, resumed from its newest
    checkpoint (as pressing up-arrow in tmux would, without losing the steps)."""
    _refuse_detaching_from_slurm(foreground)
    changes = service.parse_env_changes(assignments, removals)
    registry = open_registry()
    record = registry.resolve(ref)
    if RunState(record.state) not in TERMINAL_STATES:
        holder = service.watched_by(record)
        if holder is not None:
            raise AlreadyWatched(record.id, holder)
        raise UsageError(
            f"run {record.id} is still active without a supervisor: `trainguard adopt {ref}` watches it again",
            f"运行 {record.id} 仍在进行但没有监督进程：用 `trainguard adopt {ref}` 重新接管",
        )
    if not os.path.isdir(record.cwd):
        raise UsageError(
            f"run {record.id} works in {record.cwd}, which is no longer a folder: make it again, or start the "
            "command anew from another folder with `trainguard run --name NAME -- CMD`",
            f"运行 {record.id} 的工作目录 {record.cwd} 已不是目录：请重新创建它，或在另一个目录中用 "
            "`trainguard run --name NAME -- CMD` 重新开始该命令",
        )
    environment, was_recorded = service.continued_environment(record, os.environ, changes)
    if not was_recorded:
        click.echo(say(f"note: run {record.id} was started by an older trainguard, which kept no record of its "
                       "environment: it continues with this shell's, recorded for it from now on",
                       f"注意：运行 {record.id} 由旧版 trainguard 启动，没有记录其环境变量："
                       "将使用当前 shell 的环境继续，并从此记录下来"), err=True)  # fmt: skip
    return _continue(registry, record.id, foreground=foreground, follow=follow, environment=environment)


def _check_port_free(bind: str, port: int) -> None:
    probe = socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((bind, port))
    except OSError as exc:
        raise UsageError(f"--metrics-port: cannot listen on {bind}:{port} ({exc.strerror})",
                         f"--metrics-port：无法监听 {bind}:{port}（{exc.strerror}）") from None  # fmt: skip
    finally:
        probe.close()


@click.command()
@click.argument("ref", metavar="RUN")
def adopt(ref: str) -> int:
    """Take a run whose supervisor is gone back under watch (its job keeps running)."""
    registry = open_registry()
    record = registry.resolve(ref)
    if RunState(record.state) in TERMINAL_STATES:
        raise UsageError(f"run {record.id} has ended ({record.state})", f"运行 {record.id} 已结束（{record.state}）")
    holder = service.watched_by(record)
    if holder is not None:
        raise AlreadyWatched(record.id, holder)
    service.start_detached(registry, record, adopt=True)
    click.echo(say(f"run {record.id} is watched again", f"运行 {record.id} 已重新接管"))
    return 0
