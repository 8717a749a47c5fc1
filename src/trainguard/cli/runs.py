"""``trainguard run | ps | status | logs | stop``: keep a job alive and look after it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click

from trainguard._i18n import choose_language
from trainguard._proc import pid_alive
from trainguard.checkpoint.layouts import LAYOUTS
from trainguard.errors import UsageError
from trainguard.monitor.notify import from_config, from_flag, to_record
from trainguard.paths import state_dir
from trainguard.store.registry import Registry, Run, close_runs_lost_to_reboot
from trainguard.supervisor import service
from trainguard.supervisor.states import PUBLIC_STATE, TERMINAL_STATES, RunState
from trainguard.units import parse_duration, parse_size


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


def _supervisor_alive(run: Run) -> bool:
    return pid_alive(run.supervisor_pid)


def run_json(run: Run) -> dict[str, Any]:
    state = RunState(run.state)
    return {
        "id": run.id,
        "name": run.name,
        "state": PUBLIC_STATE[state],
        "command": run.command,
        "pid": run.job_pid if state not in TERMINAL_STATES else None,
        "log_path": run.log_path,
        "host": run.host,
        "reason": run.reason,
        "supervisor": "alive" if _supervisor_alive(run) else ("gone" if state not in TERMINAL_STATES else "exited"),
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
            }
            for a in run.attempts
        ],
    }


def _registry() -> Registry:
    registry = Registry(state_dir())
    close_runs_lost_to_reboot(registry)
    return registry


# ---------------------------------------------------------------------------------------------- run
@click.command(context_settings={"ignore_unknown_options": False})
@click.option("--name", help="A name; it can stand for the newest run of that name.")
@click.option(
    "--restart", type=click.Choice(["never", "on-failure", "always"]), default="on-failure", show_default=True
)
@click.option("--max-restarts", type=click.IntRange(0, 10_000), default=10, show_default=True)
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
@click.option("--resume-arg", metavar="TEMPLATE", help='Appended when resuming, e.g. "--resume {checkpoint}".')
@click.option(
    "--hang-timeout",
    callback=_duration,
    metavar="DUR",
    help="No output and no checkpoint this long "
    "(e.g. 30m) means hung: stacks are dumped and the job restarted. Off by default.",
)
@click.option("--memory-limit", callback=_size, metavar="SIZE", help="Put the job in its own memory cgroup (e.g. 64G).")
@click.option(
    "--grace",
    callback=_duration,
    default="120s",
    show_default=True,
    metavar="DUR",
    help="Time between the stop signal and SIGKILL, for a last checkpoint.",
)
@click.option("--stop-signal", callback=_signal_number, default="TERM", show_default=True)
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
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD [ARGS]...")
def run(name, restart, max_restarts, retry, checkpoint_dir, checkpoint_glob, checkpoint_layout, resume_arg,
        hang_timeout, memory_limit, grace, stop_signal, sample_interval, notify, config_file, metrics_port,
        metrics_bind, foreground, follow, command) -> int:  # fmt: skip
    """Run a training job that survives disconnects and restarts from its checkpoint when it dies.

    \b
    Examples:
      trainguard run -- python train.py --epochs 100
      trainguard run --name vit --hang-timeout 30m --resume-arg "--resume {checkpoint}" -- python train.py
      srun trainguard run --foreground -- python train.py
    """
    if memory_limit is not None:
        from trainguard.probes import cgroups

        cgroups.create(f"trainguard-check-{os.getpid()}", memory_limit).remove()  # refuse now, not in the supervisor
    if foreground and follow:
        raise UsageError(
            "--follow detaches; it cannot go with --foreground", "--follow 会脱离终端，不能与 --foreground 同用"
        )
    cwd = os.getcwd()
    if name and (earlier := _unwatched_run_named(name)) is not None:
        click.echo(f"run {earlier.id} ({name}) is still running without its supervisor: taking it back under watch")
        service.start_detached(_registry(), earlier, adopt=True)
        return 0
    service.check_command(list(command), cwd)
    if checkpoint_glob and checkpoint_layout != "auto":
        raise UsageError(
            "--checkpoint-glob and --checkpoint-layout both say which checkpoint to resume from: give one",
            "--checkpoint-glob 与 --checkpoint-layout 都指定从哪个检查点恢复：只能给一个",
        )
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
        grace_s=grace,
        stop_signal=stop_signal,
        memory_limit=memory_limit,
        sample_interval_s=sample_interval,
        notify=to_record(notifiers) or None,
        metrics_port=metrics_port,
        metrics_bind=metrics_bind,
    )
    registry, record = service.create_run(list(command), name=name, options=options)
    if foreground:
        click.echo(f"trainguard: run {record.id}, log {record.log_path}", err=True)
        return service.supervise_run(record.id, registry=registry)
    started = service.start_detached(registry, record)
    lang = choose_language(None, os.environ)
    ref = record.name or record.id
    if lang == "zh":
        click.echo(f"已启动运行 {record.id}（进程 {started.job_pid}）：{' '.join(command)}")
        click.echo(
            f"  日志：  {record.log_path}\n  跟踪：  trainguard logs {ref} -f\n  状态：  trainguard status {ref}"
        )
    else:
        click.echo(f"started run {record.id} (pid {started.job_pid}): {' '.join(command)}")
        click.echo(
            f"  log:     {record.log_path}\n  follow:  trainguard logs {ref} -f\n  status:  trainguard status {ref}"
        )
    if follow:
        _follow(registry, started, 0)
    return 0


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
@click.option("--port", type=click.IntRange(1, 65535), default=9400, show_default=True)
@click.option("--bind", default="127.0.0.1", show_default=True, help="Listen address (0.0.0.0 for every interface).")
def exporter(port: int, bind: str) -> int:
    """Serve Prometheus metrics of this machine's runs, GPUs and host at http://BIND:PORT/metrics."""
    from trainguard.monitor.exporter import TrainguardCollector, kernel_xid_counter, serve

    serve(port, bind, TrainguardCollector(_registry(), xid_counts=kernel_xid_counter()))
    click.echo(f"serving Prometheus metrics at http://{bind}:{port}/metrics (Ctrl+C stops)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


def _unwatched_run_named(name: str) -> Run | None:
    if not (state_dir() / "runs.sqlite").exists():
        return None
    try:
        newest = _registry().resolve(name)
    except UsageError:
        return None
    return newest if newest.name == name and service.unwatched(newest) else None


@click.command()
@click.argument("ref", metavar="RUN")
def adopt(ref: str) -> int:
    """Take a run whose supervisor is gone back under watch (its job keeps running)."""
    registry = _registry()
    record = registry.resolve(ref)
    if RunState(record.state) in TERMINAL_STATES:
        raise UsageError(f"run {record.id} has ended ({record.state})", f"运行 {record.id} 已结束（{record.state}）")
    if _supervisor_alive(record):
        raise UsageError(f"run {record.id} is already watched by supervisor {record.supervisor_pid}",
                         f"运行 {record.id} 已由监督进程 {record.supervisor_pid} 管理")  # fmt: skip
    service.start_detached(registry, record, adopt=True)
    click.echo(f"run {record.id} is watched again")
    return 0


# ---------------------------------------------------------------------------------------------- ps / status
@click.command()
@click.option("--json", "as_json", is_flag=True)
def ps(as_json: bool) -> int:
    """List runs, newest first."""
    runs = _registry().all()
    if as_json:
        click.echo(json.dumps([run_json(r) for r in runs], ensure_ascii=False, indent=2))
        return 0
    if not runs:
        click.echo("no runs yet: trainguard run -- CMD")
        return 0
    for r in runs:
        info = run_json(r)
        last = r.attempts[-1] if r.attempts else None
        cause = f" last death: {last.cause}" if last and last.cause else ""
        click.echo(f"{r.id}  {info['state']:<10} attempts {len(r.attempts):<3} {(r.name or '-'):<12} "
                   f"{' '.join(r.command)[:60]}{cause}")  # fmt: skip
    return 0


@click.command()
@click.argument("ref", metavar="RUN")
@click.option("--json", "as_json", is_flag=True)
def status(ref: str, as_json: bool) -> int:
    """A run's state, attempts and the cause of each death."""
    run_record = _registry().resolve(ref)
    info = run_json(run_record)
    if as_json:
        click.echo(json.dumps(info, ensure_ascii=False, indent=2))
    else:
        click.echo(f"run {info['id']} ({info['name'] or 'no name'}): {info['state']}"
                   + (f" — {info['reason']}" if info["reason"] else ""))  # fmt: skip
        click.echo(f"  command: {' '.join(info['command'])}\n  log:     {info['log_path']}")
        if info["supervisor"] == "gone":
            click.echo("  the supervisor is gone; the job may still be running unwatched")
        for a in info["attempts"]:
            end = (
                f"exit {a['exit_code']}"
                if a["exit_code"] is not None
                else (f"signal {a['signal']}" if a["signal"] else "running")
            )
            cause = f", {a['cause']} ({a['confidence']:.2f})" if a["cause"] else ""
            resumed = f", resumed from {a['resumed_from']}" if a["resumed_from"] else ""
            click.echo(f"  attempt {a['n']}: {a['started_at']} → {a['ended_at'] or '…'}  {end}{cause}{resumed}")
    public = info["state"]
    return 1 if public == "failed" else 0


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
    markers = [Marker(e["time"], e.get("message", e.get("rule", "alert")), "alert")
               for e in registry.events(record.id) if e["kind"] == "alert"]  # fmt: skip
    folder = record.options.get("checkpoint_dir")
    layout = record.options.get("checkpoint_layout", "auto")
    for found in layouts.scan(folder, layout) if folder and not record.options.get("checkpoint_glob") else []:
        if found.complete:
            markers.append(Marker(found.time, f"checkpoint step {found.step}", "checkpoint"))
    page = render(record, registry.samples(record.id), sorted(markers, key=lambda m: m.time),
                  lang=choose_language(None, os.environ))  # fmt: skip
    target = Path(output) if output else Path(record.run_dir) / "report.html"
    try:
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, target)
    except OSError as exc:
        raise UsageError(f"cannot write {target}: {exc.strerror}", f"无法写入 {target}：{exc.strerror}") from exc
    click.echo(str(target))
    return 0


# ---------------------------------------------------------------------------------------------- logs
def _attempt_range(run_record: Run, attempt: int | None) -> tuple[int, int | None]:
    if attempt is None:
        return 0, None
    for index, a in enumerate(run_record.attempts):
        if a.n == attempt:
            following = run_record.attempts[index + 1] if index + 1 < len(run_record.attempts) else None
            return a.log_offset, following.log_offset if following else None
    raise UsageError(f"run {run_record.id} has no attempt {attempt}", f"运行 {run_record.id} 没有第 {attempt} 次尝试")


def _follow(registry: Registry, run_record: Run, offset: int) -> None:
    try:
        with open(run_record.log_path, "rb") as log:
            log.seek(offset)
            while True:
                chunk = log.read(1 << 16)
                if chunk:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.flush()
                    continue
                if RunState(registry.get(run_record.id).state) in TERMINAL_STATES:
                    return
                time.sleep(0.2)
    except KeyboardInterrupt:
        click.echo("\n(stopped following; the job goes on)", err=True)


@click.command()
@click.argument("ref", metavar="RUN")
@click.option("-f", "--follow", "follow", is_flag=True, help="Keep printing new output until the run ends.")
@click.option("--attempt", type=int, help="Only this attempt's output.")
def logs(ref: str, follow: bool, attempt: int | None) -> int:
    """Print a run's log."""
    registry = _registry()
    run_record = registry.resolve(ref)
    start, end = _attempt_range(run_record, attempt)
    if not Path(run_record.log_path).exists():
        return 0
    with open(run_record.log_path, "rb") as log:
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
    if follow and end is None:
        _follow(registry, run_record, position)
    return 0


# ---------------------------------------------------------------------------------------------- stop
@click.command()
@click.argument("ref", metavar="RUN")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until the run has stopped.")
def stop(ref: str, wait: bool) -> int:
    """Stop a run: its stop signal, the grace period for a checkpoint, then SIGKILL."""
    registry = _registry()
    run_record = registry.resolve(ref)
    if RunState(run_record.state) in TERMINAL_STATES:
        raise UsageError(f"run {run_record.id} is not running ({run_record.state})",
                         f"运行 {run_record.id} 没有在运行（{run_record.state}）")  # fmt: skip
    marker = Path(run_record.run_dir) / "stop-requested"
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
    except FileExistsError:
        raise UsageError(f"run {run_record.id} is already being stopped", f"运行 {run_record.id} 已在停止中") from None
    if _supervisor_alive(run_record):
        os.kill(run_record.supervisor_pid, signal.SIGTERM)
    elif pid_alive(run_record.job_pid):
        # No supervisor to do it: signal the job's process group directly (it may end meanwhile).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run_record.job_pid, run_record.options.get("stop_signal", signal.SIGTERM))
        registry.set_state(run_record.id, "stopped", reason="stopped on request (no supervisor)")
    else:
        registry.set_state(run_record.id, "stopped", reason="nothing was running")
    if wait:
        deadline = time.monotonic() + float(run_record.options.get("grace_s", 120)) + 30
        while time.monotonic() < deadline:
            current = registry.get(run_record.id)
            if RunState(current.state) in TERMINAL_STATES:
                click.echo(f"run {current.id}: {current.state}")
                return 0
            time.sleep(0.2)
        click.echo(f"run {run_record.id}: still stopping", err=True)
        return 1
    return 0
