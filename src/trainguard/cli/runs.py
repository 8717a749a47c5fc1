"""``trainguard run | restart | adopt | ps | status | logs | stop | report | exporter``: keep a job
alive and look after it."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click

from trainguard import goodput
from trainguard._i18n import choose_language
from trainguard.checkpoint.layouts import LAYOUTS
from trainguard.errors import UsageError
from trainguard.goodput import Goodput
from trainguard.integrations import kubernetes, slurm
from trainguard.monitor.notify import from_config, from_flag, to_record
from trainguard.paths import open_private, state_dir
from trainguard.store.registry import Registry, RegistryError, Run, RunNotFound, close_runs_lost_to_reboot
from trainguard.store.runlogs import attempt_region, start_marker
from trainguard.store.states import PUBLIC_STATE, TERMINAL_STATES, RunState
from trainguard.supervisor import service
from trainguard.supervisor.lock import AlreadyWatched
from trainguard.units import parse_duration, parse_size


def _say(en: str, zh: str) -> str:
    return zh if choose_language(None, os.environ) == "zh" else en


# The five public states (DESIGN section 5) as a person reads them in Chinese.
_STATE_ZH = {"running": "运行中", "restarting": "等待重启", "succeeded": "已成功", "failed": "已失败", "stopped": "已停止"}


def _duration(_ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise UsageError(
            f"--{param.name.replace('_', '-')}: {exc}", f"--{param.name.replace('_', '-')}：{exc}"
        ) from None


def _size(_ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise UsageError(
            f"--{param.name.replace('_', '-')}: {exc}", f"--{param.name.replace('_', '-')}：{exc}"
        ) from None


def _signal_number(_ctx: click.Context, _param: click.Parameter, value: str) -> int:
    name = value.upper() if value.upper().startswith("SIG") else f"SIG{value.upper()}"
    try:
        return int(signal.Signals[name])
    except KeyError:
        raise UsageError(f"--stop-signal: unknown signal {value!r}", f"--stop-signal：未知信号 {value!r}") from None


def _iso(stamp: float | None) -> str | None:
    return None if stamp is None else datetime.fromtimestamp(stamp, timezone.utc).isoformat(timespec="seconds")


def shell_join(command: list[str]) -> str:
    """A command as a person would type it again: quoted where the shell needs it."""
    return shlex.join(command)


def _supervisor_word(run: Run) -> str:
    if service.watched_by(run) is not None:
        return "alive"
    return "gone" if RunState(run.state) not in TERMINAL_STATES else "exited"


def run_goodput(registry: Registry, run: Run) -> Goodput:
    """What the run's failures cost, from its attempts and the checkpoints its supervisor recorded."""
    return goodput.of_run(run, registry.events(run.id, kinds=("checkpoint",)), now=time.time())


def run_json(run: Run, registry: Registry | None = None) -> dict[str, Any]:
    state = RunState(run.state)
    extra = {"goodput": run_goodput(registry, run).to_dict()} if registry is not None else {}
    return {
        "id": run.id,
        "name": run.name,
        "state": PUBLIC_STATE[state],
        "command": run.command,
        "pid": run.job_pid if state not in TERMINAL_STATES else None,
        "log_path": run.log_path,
        "host": run.host,
        "reason": run.reason,
        "supervisor": _supervisor_word(run),
        "containment": run.containment,
        "checkpoint_dir": run.options.get("checkpoint_dir"),
        "attempts": [
            {
                "n": a.n,
                "started_at": _iso(a.started_at),
                "ended_at": _iso(a.ended_at),
                "exit_code": a.exit_code,
                "signal": a.signal,
                "cause": a.cause,
                "confidence": a.confidence,
                "resumed_from": a.resumed_from,
                "resumed_step": (a.progress or {}).get("resumed_step"),
                "step": (a.progress or {}).get("step"),
                "skipped_checkpoints": a.skipped or [],
                "diagnosis": a.diagnosis,
                "log_path": a.log_path or run.log_path,
            }
            for a in run.attempts
        ],
        **extra,
    }


def _registry() -> Registry:
    registry = Registry(state_dir())
    close_runs_lost_to_reboot(registry)
    return registry


def _cwd() -> str:
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise UsageError(
            "the current folder no longer exists: cd to a folder that does", "当前目录已不存在：请先 cd 到存在的目录"
        ) from None


def _newest_named(name: str) -> tuple[Registry, Run] | None:
    if not (state_dir() / "runs.sqlite").exists():
        return None
    registry = _registry()
    try:
        newest = registry.resolve(name)
    except RunNotFound:
        return None
    return (registry, newest) if newest.name == name else None


def _started_message(record: Run, command: list[str], verb_en: str = "started", verb_zh: str = "已启动") -> None:
    ref = record.name or record.id
    click.echo(
        _say(
            f"{verb_en} run {record.id} (pid {record.job_pid}): {shell_join(command)}\n"
            f"  log:     {record.log_path}\n  follow:  trainguard logs {ref} -f\n  status:  trainguard status {ref}",
            f"{verb_zh}运行 {record.id}（进程 {record.job_pid}）：{shell_join(command)}\n"
            f"  日志：  {record.log_path}\n  跟踪：  trainguard logs {ref} -f\n  状态：  trainguard status {ref}",
        )
    )


# ---------------------------------------------------------------------------------------------- run
@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--name", help="A name that stands for the run; the name of an ended run continues that run.")
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
    callback=_duration,
    metavar="DUR",
    help="No output, no checkpoint and no reported step this long "
    "(e.g. 30m) means hung: stacks are dumped and the job restarted. Off by default.",
)
@click.option("--memory-limit", callback=_size, metavar="SIZE", help="Put the job in its own memory cgroup (e.g. 64G).")
@click.option(
    "--peer-timeout",
    callback=_duration,
    default="10m",
    show_default=True,
    metavar="DUR",
    help="A launcher's job across nodes (torchrun --nnodes 2...): how long an attempt waits for the other "
    "nodes to join its rendezvous before the run ends with peer_failure (exit 75 under --foreground).",
)
@click.option(
    "--grace",
    callback=_duration,
    default="120s",
    show_default=True,
    metavar="DUR",
    help="Time between the stop signal and SIGKILL, for a last checkpoint.",
)
@click.option(
    "--stop-signal",
    callback=_signal_number,
    default="TERM",
    show_default=True,
    help="The signal `trainguard stop` and a hang send first (TERM, INT, USR1, ...), before --grace runs out.",
)
@click.option(
    "--sample-interval",
    callback=_duration,
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
        hang_timeout, memory_limit, peer_timeout, grace, stop_signal, sample_interval, notify, config_file,
        metrics_port, metrics_bind, foreground, follow, requeue, termination_log, command) -> int:  # fmt: skip
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
    for flag, given in (("--requeue", requeue), ("--termination-log", termination_log is not None)):
        if given and not foreground:
            raise UsageError(f"{flag} acts when the run ends: it needs --foreground (as a scheduler runs it)",
                             f"{flag} 在运行结束时生效：需要与 --foreground 同用（调度器就是这样运行的）")  # fmt: skip
    if termination_log == "":
        raise UsageError("--termination-log needs a path", "--termination-log 需要一个路径")
    finish = _Finish(requeue=requeue and _under_slurm(), termination_log=termination_log)
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
        click.echo(_say(f"run {record.id} ({name}) is still running without its supervisor: taking it back under watch",
                        f"运行 {record.id}（{name}）仍在运行但没有监督进程：重新接管"), err=foreground)  # fmt: skip
        if foreground:  # a scheduler waits on this process: watch here, end with the verdict
            return finish(registry, record.id, service.supervise_run(record.id, registry=registry, adopt=True))
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
            click.echo(_say(f"trainguard: run {record.id}, log {record.log_path}",
                            f"trainguard：运行 {record.id}，日志 {record.log_path}"), err=True)  # fmt: skip
            return finish(registry, record.id, service.supervise_run(record.id, registry=registry, lock=lock))
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
        reason = started.reason_in(choose_language(None, os.environ))
        click.echo(_say(f"run {started.id}: {started.state}", f"运行 {started.id}：{_STATE_ZH[started.state]}")
                   + (f" ({reason})" if reason else ""))  # fmt: skip
        return
    if continued:
        _started_message(started, started.command, "continued", "已继续")
    else:
        _started_message(started, started.command)
    if follow:
        _follow(registry, started, started.attempts[-1].n if started.attempts else None)


def _under_slurm() -> bool:
    if slurm.job_id(os.environ) is not None:
        return True
    click.echo(_say("trainguard: not in a Slurm job (no SLURM_JOB_ID): --requeue has no effect",
                    "trainguard：不在 Slurm 作业中（没有 SLURM_JOB_ID）：--requeue 不起作用"), err=True)  # fmt: skip
    return False


class _Finish:
    """What a foreground run does once it has its verdict: the termination message (Kubernetes), the
    requeue (Slurm). Neither can change the verdict, and neither failing is more than a warning."""

    def __init__(self, *, requeue: bool = False, termination_log: str | None = None) -> None:
        self.requeue = requeue
        self.termination_log = termination_log

    def __call__(self, registry: Registry, run_id: str, verdict: int) -> int:
        path = self.termination_log or kubernetes.default_path()
        if path is not None:
            self._write_termination_log(registry, run_id, verdict, path)
        if self.requeue:
            handed = slurm.hand_back(verdict, os.environ)
            if handed is not None:
                _requeued, why = handed
                click.echo(_say(f"trainguard: {why.en}", f"trainguard：{why.zh}"), err=True)
        return verdict

    @staticmethod
    def _write_termination_log(registry: Registry, run_id: str, verdict: int, path: str) -> None:
        from trainguard import causes

        lang = choose_language(None, os.environ)
        try:
            record = registry.get(run_id)
        except RegistryError:
            record = None
        last = record.attempts[-1] if record is not None and record.attempts else None
        message = kubernetes.termination_message(
            run_id=run_id,
            state=PUBLIC_STATE[RunState(record.state)] if record is not None else "unknown",
            exit_code=verdict,
            attempts=len(record.attempts) if record is not None else 0,
            diagnosis=last.diagnosis if last is not None and last.cause else None,
            reason=record.reason_in(lang) if record is not None else None,
            catalogue=causes.catalogue(),
            lang=lang,
        )
        try:
            kubernetes.write_termination_log(path, message)
        except OSError as exc:
            click.echo(_say(f"trainguard: warning: cannot write the termination log {path}: {exc.strerror or exc}",
                            f"trainguard：警告：无法写入终止日志 {path}：{exc.strerror or exc}"), err=True)  # fmt: skip


def _continue(registry: Registry, run_id: str, *, foreground: bool, follow: bool, finish: _Finish | None = None,
              **changes: Any) -> int:  # fmt: skip
    """Continue an ended run in place (with ``changes`` to its command, cwd, options): its lock is
    taken here and handed to its supervisor, so that nothing meets it unheld while it starts."""
    with _stop_signals_wait_for_the_supervisor(swallow=not foreground):
        before = registry.get(run_id)
        lock = service.prepare_continue(registry, run_id, **changes)
        record = registry.get(run_id)
        try:
            if foreground:
                click.echo(_say(f"trainguard: continuing run {run_id}, log {record.log_path}",
                                f"trainguard：继续运行 {run_id}，日志 {record.log_path}"), err=True)  # fmt: skip
                verdict = service.supervise_run(run_id, registry=registry, restart=True, lock=lock)
                return (finish or _Finish())(registry, run_id, verdict)
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
def restart(ref: str, foreground: bool, follow: bool) -> int:
    """Continue an ended run in place: same command and checkpoint folder, the next attempt, resumed
    from its newest checkpoint (as pressing up-arrow in tmux would, without losing the steps)."""
    registry = _registry()
    record = registry.resolve(ref)
    if RunState(record.state) not in TERMINAL_STATES:
        holder = service.watched_by(record)
        if holder is not None:
            raise AlreadyWatched(record.id, holder)
        raise UsageError(
            f"run {record.id} is still active without a supervisor: `trainguard adopt {ref}` watches it again",
            f"运行 {record.id} 仍在进行但没有监督进程：用 `trainguard adopt {ref}` 重新接管",
        )
    return _continue(registry, record.id, foreground=foreground, follow=follow)


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
@click.option(
    "--port", type=click.IntRange(1, 65535), default=9400, show_default=True, help="The port /metrics is served on."
)
@click.option("--bind", default="127.0.0.1", show_default=True, help="Listen address (0.0.0.0 for every interface).")
def exporter(port: int, bind: str) -> int:
    """Serve Prometheus metrics of this machine's runs, GPUs and host at http://BIND:PORT/metrics."""
    from trainguard.monitor.exporter import TrainguardCollector, kernel_xid_counter, serve

    serve(port, bind, TrainguardCollector(_registry(), xid_counts=kernel_xid_counter()))
    click.echo(_say(f"serving Prometheus metrics at http://{bind}:{port}/metrics (Ctrl+C stops)",
                    f"Prometheus 指标地址 http://{bind}:{port}/metrics（Ctrl+C 停止）"))  # fmt: skip
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


@click.command()
@click.argument("ref", metavar="RUN")
def adopt(ref: str) -> int:
    """Take a run whose supervisor is gone back under watch (its job keeps running)."""
    registry = _registry()
    record = registry.resolve(ref)
    if RunState(record.state) in TERMINAL_STATES:
        raise UsageError(f"run {record.id} has ended ({record.state})", f"运行 {record.id} 已结束（{record.state}）")
    holder = service.watched_by(record)
    if holder is not None:
        raise AlreadyWatched(record.id, holder)
    service.start_detached(registry, record, adopt=True)
    click.echo(_say(f"run {record.id} is watched again", f"运行 {record.id} 已重新接管"))
    return 0


# ---------------------------------------------------------------------------------------------- ps / status
def _columns(header: list[str], rows: list[list[str]]) -> list[str]:
    """Aligned columns; the last one is never padded (no trailing spaces) nor cut."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row[:-1], widths)) + "  " + row[-1]
            for row in [header, *rows]]  # fmt: skip


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON array, a run per element.")
def ps(as_json: bool) -> int:
    """List runs, newest first."""
    registry = _registry()
    runs = registry.all()
    if as_json:
        click.echo(json.dumps([run_json(r, registry) for r in runs], ensure_ascii=False, indent=2))
        return 0
    if not runs:
        click.echo(_say("no runs yet: trainguard run -- CMD", "还没有运行：trainguard run -- 命令"))
        return 0
    header = _say("ID|STATE|ATTEMPTS|NAME|LAST DEATH|COMMAND", "ID|状态|尝试|名称|上次终止|命令").split("|")
    width = os.get_terminal_size().columns if sys.stdout.isatty() else None
    rows = []
    zh = choose_language(None, os.environ) == "zh"
    for r in runs:
        last = r.attempts[-1] if r.attempts else None
        state = PUBLIC_STATE[RunState(r.state)]
        rows.append([r.id, _STATE_ZH[state] if zh else state, str(len(r.attempts)), r.name or "-",
                     last.cause if last and last.cause else "-", shell_join(r.command)])  # fmt: skip
    for line in _columns(header, rows):
        click.echo(line[: width - 1] + "…" if width and len(line) > width else line)
    return 0


@click.command()
@click.argument("ref", metavar="RUN")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status(ref: str, as_json: bool) -> int:
    """A run's state, attempts and the cause of each death."""
    registry = _registry()
    run_record = registry.resolve(ref)
    info = run_json(run_record, registry)
    if as_json:
        click.echo(json.dumps(info, ensure_ascii=False, indent=2))
        return 1 if info["state"] == "failed" else 0
    reason = run_record.reason_in(choose_language(None, os.environ))
    reason = f" — {reason}" if reason else ""
    click.echo(_say(f"run {info['id']} ({info['name'] or 'no name'}): {info['state']}{reason}",
                    f"运行 {info['id']}（{info['name'] or '无名称'}）：{_STATE_ZH[info['state']]}{reason}"))  # fmt: skip
    click.echo(_say(f"  command: {shell_join(info['command'])}\n  log:     {info['log_path']}",
                    f"  命令：{shell_join(info['command'])}\n  日志：{info['log_path']}"))  # fmt: skip
    if info["supervisor"] == "gone":
        click.echo(_say("  the supervisor is gone; the job may still be running unwatched (trainguard adopt)",
                        "  监督进程已不在；作业可能仍在无人监督地运行（trainguard adopt）"))  # fmt: skip
    if info["containment"] and info["containment"].startswith("partial") and info["state"] != "succeeded":
        click.echo(_say(f"  containment is partial: {info['containment']}; what the job double-forks may outlive it",
                        f"  进程隔离不完整：{info['containment']}；作业脱离会话的子进程可能残留"))  # fmt: skip
    for a in info["attempts"]:
        if a["exit_code"] is not None:
            end = _say(f"exit {a['exit_code']}", f"退出码 {a['exit_code']}")
        elif a["signal"]:
            end = _say(f"signal {a['signal']}", f"信号 {a['signal']}")
        else:
            end = _say("running", "运行中") if a["ended_at"] is None else _say("ended", "已结束")
        cause = f", {a['cause']} ({a['confidence']:.2f})" if a["cause"] else ""
        resumed = ""
        if a["resumed_from"]:
            at = f" (step {a['resumed_step']})" if a["resumed_step"] is not None else ""
            resumed = _say(f", resumed from {a['resumed_from']}{at}", f"，从 {a['resumed_from']}{at} 恢复")
        step = _say(f", step {a['step']}", f"，第 {a['step']} 步") if a["step"] is not None else ""
        click.echo(_say(f"  attempt {a['n']}: ", f"  第 {a['n']} 次：")
                   + f"{a['started_at']} → {a['ended_at'] or '…'}  {end}{cause}{resumed}{step}")  # fmt: skip
    _print_goodput(run_goodput(registry, run_record))
    return 1 if info["state"] == "failed" else 0


def _print_goodput(result: Goodput) -> None:
    if result.ratio is None:
        return
    lang = choose_language(None, os.environ)
    click.echo(_say("  goodput: ", "  有效训练率（goodput）：") + goodput.describe(result, lang))
    for loss in result.losses:
        if loss.total_s > 0:
            click.echo("    " + goodput.describe_loss(loss, lang))


@click.command()
@click.argument("ref", metavar="RUN")
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), help="Where to write the page (default: the run's folder)."
)
def report(ref: str, output: str | None) -> int:
    """Write one self-contained HTML page of a run: its timeline, attempts, deaths and alerts."""
    from trainguard.checkpoint import layouts
    from trainguard.report.html import Marker, render

    registry = _registry()
    record = registry.resolve(ref)
    # Checkpoints still in the folder that no event recorded (runs from before they were recorded).
    folder = record.options.get("checkpoint_dir")
    layout = record.options.get("checkpoint_layout", "auto")
    in_folder = [Marker(found.time, f"checkpoint step {found.step}", "checkpoint", found.step, found.path)
                 for found in (layouts.scan(folder, layout) if folder and not record.options.get("checkpoint_glob")
                               else []) if found.complete]  # fmt: skip
    page = render(record, registry.samples(record.id), registry.events(record.id),
                  lang=choose_language(None, os.environ), now=time.time(), extra_checkpoints=in_folder)  # fmt: skip
    target = Path(output) if output else Path(record.run_dir) / "report.html"
    try:
        tmp = target.with_name(f".{target.name}.tmp")
        with open_private(tmp) as out:
            out.write(page)
        os.replace(tmp, target)
    except OSError as exc:
        raise UsageError(f"cannot write {target}: {exc.strerror}", f"无法写入 {target}：{exc.strerror}") from exc
    click.echo(str(target))
    return 0


# ---------------------------------------------------------------------------------------------- logs
def _copy(path: str, start: int, end: int | None) -> int:
    """Print a file's bytes from ``start`` to ``end``; the position reached."""
    with open(path, "rb") as log:
        log.seek(start)
        remaining = None if end is None else end - start
        while remaining is None or remaining > 0:
            chunk = log.read(1 << 20 if remaining is None else min(1 << 20, remaining))
            if not chunk:
                break
            sys.stdout.buffer.write(chunk)
            if remaining is not None:
                remaining -= len(chunk)
        position = log.tell()
    sys.stdout.flush()
    return position


def _print_attempts(run_record: Run, only: int | None) -> None:
    """Each attempt's output after its marker line (a note on stderr for a log that is gone)."""
    lang = choose_language(None, os.environ)
    previous = None
    for attempt in run_record.attempts:
        if only is None or attempt.n == only:
            region = attempt_region(run_record, attempt)
            if attempt.log_path:
                sys.stdout.write(start_marker(attempt, previous, lang))
                sys.stdout.flush()
            try:
                _copy(region.path, region.start, region.end)
            except OSError:
                gone = _say(
                    f"trainguard: the log of attempt {attempt.n} ({region.path}) no longer exists",
                    f"trainguard：第 {attempt.n} 次尝试的日志（{region.path}）已不存在",
                )
                click.echo(gone, err=True)
        previous = attempt


class _suppress_missing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, FileNotFoundError)


@click.command()
@click.argument("ref", metavar="RUN")
@click.option("-f", "--follow", "follow", is_flag=True, help="Keep printing new output until the run ends.")
@click.option("--attempt", type=int, help="Only this attempt's output.")
def logs(ref: str, follow: bool, attempt: int | None) -> int:
    """Print a run's log: every attempt's output, each after a marker line."""
    registry = _registry()
    run_record = registry.resolve(ref)
    if attempt is not None and all(a.n != attempt for a in run_record.attempts):
        raise UsageError(f"run {run_record.id} has no attempt {attempt}",
                         f"运行 {run_record.id} 没有第 {attempt} 次尝试")  # fmt: skip
    chosen = [a for a in run_record.attempts if attempt is None or a.n == attempt]
    if chosen and not follow and not any(attempt_region(run_record, a).exists() for a in chosen):
        paths = sorted({attempt_region(run_record, a).path for a in chosen})
        raise UsageError(f"run {run_record.id}: its log no longer exists ({', '.join(paths)})",
                         f"运行 {run_record.id}：日志已不存在（{', '.join(paths)}）")  # fmt: skip
    _print_attempts(run_record, attempt)
    if follow and (attempt is None or attempt == run_record.attempts[-1].n):
        last = run_record.attempts[-1] if run_record.attempts else None
        position = 0
        if last is not None:
            region = attempt_region(run_record, last)
            try:
                position = region.end if region.end is not None else os.path.getsize(region.path)
            except OSError:
                position = region.start
        _follow(registry, run_record, last.n if last else None, position)
    return 0


def _follow(registry: Registry, record: Run, attempt_n: int | None = None, position: int = 0) -> None:
    """Print new output as it comes from ``position`` of attempt ``attempt_n`` (from the first
    attempt when None), moving on to each new attempt's log after its marker, until the run ends."""
    lang = choose_language(None, os.environ)
    current = next((a for a in record.attempts if a.n == attempt_n), None)
    try:
        while True:
            if current is not None:
                region = attempt_region(record, current)
                with _suppress_missing():
                    position = _copy(region.path, max(position, region.start), region.end)
            record = registry.get(record.id) or record
            newer = [a for a in record.attempts if current is None or a.n > current.n]
            if newer:
                if current is not None:  # what the old attempt wrote last, then the new one's marker
                    with _suppress_missing():
                        _copy(region.path, position, region.end)
                previous, current = current, newer[0]
                if current.log_path:
                    sys.stdout.write(start_marker(current, previous, lang))
                position = 0
                continue
            if RunState(record.state) in TERMINAL_STATES:
                if current is not None:
                    with _suppress_missing():
                        _copy(region.path, position, region.end)
                return
            time.sleep(0.2)
    except KeyboardInterrupt:
        click.echo(_say("\n(stopped following; the job goes on)", "\n（已停止跟踪；作业继续运行）"), err=True)


# ---------------------------------------------------------------------------------------------- stop
@click.command()
@click.argument("ref", metavar="RUN")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until the run has stopped.")
@click.option("--grace", callback=_duration, metavar="DUR",
              help="Time between the stop signal and SIGKILL (default: the run's --grace).")  # fmt: skip
def stop(ref: str, wait: bool, grace: float | None) -> int:
    """Stop a run: its stop signal, the grace period for a checkpoint, then SIGKILL."""
    asked = time.time()
    registry = _registry()
    run_record = registry.resolve(ref)
    if RunState(run_record.state) in TERMINAL_STATES:
        raise UsageError(f"run {run_record.id} is not running ({run_record.state})",
                         f"运行 {run_record.id} 没有在运行（{run_record.state}）")  # fmt: skip
    grace_s = float(grace if grace is not None else run_record.options.get("grace_s", 120))
    holder = service.watched_by(run_record)
    if holder is None:
        try:
            what = service.stop_unwatched(registry, run_record, grace_s)
        except AlreadyWatched:  # another `stop` (or an adopt) got there first: wait for its outcome
            return _wait_stopped(registry, run_record, grace_s, wait, asked)
        click.echo(_say(f"run {run_record.id}: stopped ({what.en})", f"运行 {run_record.id}：已停止（{what.zh}）"))
        return 0
    try:
        if not registry.request_stop(run_record.id, grace_s):
            raise UsageError(f"run {run_record.id} is already being stopped", f"运行 {run_record.id} 已在停止中")
    except RegistryError as exc:  # a full state disk: the stop still happens, with the run's own grace
        click.echo(f"trainguard: warning: {exc.message(choose_language(None, os.environ))}", err=True)
    # The holder now, after the request: a supervisor that took the run over from the command that
    # created it (the holder read above) has read the request or gets this signal.
    holder = service.watched_by(run_record) or holder
    if not holder.signal(signal.SIGTERM):
        registry.request_stop(run_record.id, grace_s, replace_stale=True)
        try:
            what = service.stop_unwatched(registry, run_record, grace_s)  # its supervisor died a moment ago
        except AlreadyWatched:  # or a supervisor took the run over a moment ago: the request reaches it
            return _wait_stopped(registry, run_record, grace_s, wait, asked)
        click.echo(_say(f"run {run_record.id}: stopped ({what.en})", f"运行 {run_record.id}：已停止（{what.zh}）"))
        return 0
    return _wait_stopped(registry, run_record, grace_s, wait, asked)


def _ended_since(registry: Registry, run_id: str, since: float) -> str | None:
    """The state the run ended in after ``since``, if it ended then (it may have been continued since)."""
    try:
        events = registry.events(run_id)
    except RegistryError:
        return None
    terminal = {state.value for state in TERMINAL_STATES}
    for event in events:
        state = event["kind"].removeprefix("state:")
        if event["kind"].startswith("state:") and event["time"] >= since and state in terminal:
            return state
    return None


def _wait_stopped(registry: Registry, run_record: Run, grace_s: float, wait: bool, asked: float) -> int:
    if not wait:
        return 0
    deadline = time.monotonic() + grace_s + 30
    while time.monotonic() < deadline:
        current = registry.get(run_record.id)
        if RunState(current.state) in TERMINAL_STATES:
            reason = current.reason_in(choose_language(None, os.environ))
            click.echo(_say(f"run {current.id}: {current.state}", f"运行 {current.id}：{_STATE_ZH[current.state]}")
                       + (f" ({reason})" if reason else ""))  # fmt: skip
            return 0
        ended = _ended_since(registry, current.id, asked)
        if ended is not None:  # and was continued again by a command that came after this one
            click.echo(_say(f"run {current.id}: {ended}, then continued again by a later command (now {current.state})",
                            f"运行 {current.id}：{_STATE_ZH[ended]}，随后又被之后的命令继续（现在 {current.state}）"))  # fmt: skip
            return 0
        time.sleep(0.2)
    click.echo(_say(f"run {run_record.id}: still stopping", f"运行 {run_record.id}：仍在停止中"), err=True)
    return 1
