"""``trainguard diagnose``: why did a job die, with the evidence lines and the fix."""

from __future__ import annotations

import os
import sys
import time
from contextlib import ExitStack

import click

from trainguard._i18n import LANGUAGES, choose_language
from trainguard._resources import EXAMPLE_LOG_PATH
from trainguard.diagnosis.evidence import ExitStatus, KernelLine, Observation
from trainguard.diagnosis.oom_evidence import OomDeltas
from trainguard.diagnosis.scan import LogFile
from trainguard.diagnosis.signatures import Role
from trainguard.errors import InputError, UsageError
from trainguard.postmortem import LogSource, Report, investigate
from trainguard.probes.log_files import open_log, open_stdin_log

# A job's death and the kernel's record of it happen within moments of the log's last write; the
# window is wide enough for a slow OOM kill and narrow enough to leave other days' records out.
WINDOW_BEFORE_S = 15 * 60
WINDOW_AFTER_S = 2 * 60


def _parse_exit_code(_ctx: click.Context, _param: click.Parameter, value: str | None) -> ExitStatus | None:
    if value is None:
        return None
    try:
        return ExitStatus.from_number(int(value.strip()))
    except ValueError:
        raise UsageError(
            f"--exit-code {value!r} is not an exit status: give 0..255, or -N / 128+N for death by signal N",
            f"--exit-code {value!r} 不是有效的退出状态：应为 0..255，或用 -N / 128+N 表示被信号 N 杀死",
        ) from None


def _kernel_lines(
    spec: str | None, mtimes: list[float], now: float, warn: list[str]
) -> tuple[list[KernelLine], bool]:
    """The kernel log's lines around the death, and whether a kernel log could be read at all."""
    if spec is None:
        return [], False
    from trainguard.probes import kernel_log

    if spec != "auto":
        try:
            return kernel_log.read_saved(spec, now=now), True
        except kernel_log.KernelLogUnavailable as exc:
            raise InputError(exc.message_en, exc.message_zh) from exc
        except OSError as exc:
            raise InputError(
                f"cannot read kernel log {spec}: {exc.strerror}", f"无法读取内核日志 {spec}：{exc.strerror}"
            ) from exc
    try:
        lines, _source = kernel_log.read_live(now=now)
    except kernel_log.KernelLogUnavailable as exc:
        warn.append(exc.message_en)
        return [], False
    start = (min(mtimes) if mtimes else now) - WINDOW_BEFORE_S
    end = (max(mtimes) if mtimes else now) + WINDOW_AFTER_S
    return kernel_log.in_window(lines, start, end), True


@click.command()
@click.argument("targets", nargs=-1, metavar="[RUN | FILE... | -]")
@click.option(
    "--exit-code",
    "exit_status",
    callback=_parse_exit_code,
    metavar="N",
    help="The job's exit status: 137 or -9 mean killed by SIGKILL, 135/-7 SIGBUS, 139/-11 SIGSEGV.",
)
@click.option(
    "--kernel-log",
    "kernel_spec",
    metavar="FILE|auto",
    help="A saved kernel log (dmesg, dmesg -T, journalctl -k), or 'auto' to read this machine's "
    "around the time the log was last written.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--example", is_flag=True, help="Diagnose the example log shipped with trainguard (a 4-GPU torchrun job)."
)
@click.option("--lang", type=click.Choice(LANGUAGES), help="Language of the output (default: from LANG).")
def diagnose(
    targets: tuple[str, ...],
    exit_status: ExitStatus | None,
    kernel_spec: str | None,
    as_json: bool,
    example: bool,
    lang: str | None,
) -> int:
    """Name why a training job died: the cause, the lines that prove it, and the fix.

    \b
    Examples:
      trainguard diagnose train.log
      trainguard diagnose rank0.log rank1.log --kernel-log auto
      kubectl logs pod/trainer | trainguard diagnose - --exit-code 137
    """
    lang = choose_language(lang, os.environ)
    if example:
        if targets:
            raise UsageError("--example takes no log of its own", "--example 不需要再给出日志")
        targets = (str(EXAMPLE_LOG_PATH),)
    if not targets:
        if sys.stdin.isatty():
            raise UsageError(
                "give a log file, '-' for standard input, or a run id (see trainguard diagnose --help)",
                "请给出日志文件、'-'（标准输入）或运行 id（见 trainguard diagnose --help）",
            )
        targets = ("-",)
    now = time.time()
    if len(targets) == 1 and targets[0] != "-" and not os.path.exists(targets[0]):
        report = _diagnose_run(targets[0], exit_status)
        if report is not None:
            return _print(report, as_json, lang)
    warnings: list[str] = []
    with ExitStack() as stack:
        sources = []
        mtimes = []
        for target in targets:
            if target == "-":
                sources.append(LogSource("<stdin>" if len(targets) > 1 else None, open_stdin_log(sys.stdin.buffer)))
                mtimes.append(now)
                continue
            if not os.path.lexists(target):
                raise InputError(f"{target}: no such file, and no run has that name or id",
                                 f"{target}：文件不存在，也没有这个名称或 id 的运行")  # fmt: skip
            handle = stack.enter_context(open_log(target))
            mtimes.append(os.fstat(handle.fileno()).st_mtime)
            sources.append(LogSource(target if len(targets) > 1 else None, LogFile(handle)))
        kernel_lines, kernel_readable = _kernel_lines(kernel_spec, mtimes, now, warnings)
        try:
            report = investigate(sources, exit_status=exit_status, kernel_lines=kernel_lines,
                                 kernel_readable=kernel_readable, logs_are_all=True)  # fmt: skip
        except OSError as exc:
            raise InputError(f"cannot read the log: {exc.strerror}", f"无法读取日志：{exc.strerror}") from exc
    if targets == ("-",) and report.bytes_scanned == 0 and exit_status is None and not kernel_lines:
        # An empty pipe is a command that printed nothing (`kubectl logs` of the wrong pod), not a log.
        raise InputError("standard input is empty: nothing to judge (pipe the job's log, or give --exit-code)",
                         "标准输入为空：没有可判断的内容（请通过管道传入作业日志，或给出 --exit-code）")  # fmt: skip
    for warning in warnings:
        click.echo(f"trainguard: warning: {warning}", err=True)
    return _print(report, as_json, lang)


def _print(report: Report, as_json: bool, lang: str) -> int:
    from trainguard.cli import render

    if as_json:
        click.echo(render.diagnosis_json(report, lang))
    else:
        render.print_diagnosis(report, lang)
    return 0


def _diagnose_run(ref: str, exit_status: ExitStatus | None) -> Report | None:
    """The last death of a run: its attempt's log, its exit status, the kernel log of that time."""
    from trainguard.paths import state_dir
    from trainguard.store.registry import Registry, RunNotFound
    from trainguard.store.runlogs import attempt_region
    from trainguard.supervisor.autopsy import attempt_report

    if not (state_dir() / "runs.sqlite").exists():
        return None
    try:
        run = Registry(state_dir()).resolve(ref)
    except RunNotFound:
        raise InputError(
            f"{ref}: no such file, and no run has that name or id (see trainguard ps)",
            f"{ref}：文件不存在，也没有这个名称或 id 的运行（见 trainguard ps）",
        ) from None
    ended = [a for a in run.attempts if a.ended_at is not None]
    if not ended:
        raise UsageError(f"run {run.id} has not ended an attempt yet", f"运行 {run.id} 还没有结束过任何一次尝试")
    failed = [a for a in ended if a.cause is not None or a.exit_code not in (0, None) or a.signal] or ended
    attempt = failed[-1]
    region = attempt_region(run, attempt)
    if not region.exists():
        raise InputError(
            f"run {run.id}: the log of attempt {attempt.n} ({region.path}) no longer exists",
            f"运行 {run.id}：第 {attempt.n} 次尝试的日志（{region.path}）已不存在",
        )
    if exit_status is None and attempt.signal is not None:
        exit_status = ExitStatus(signal=attempt.signal)
    elif exit_status is None and attempt.exit_code is not None:
        exit_status = ExitStatus(code=attempt.exit_code)
    return attempt_report(
        region.path,
        log_start=region.start,
        log_end=region.end,
        exit_status=exit_status,
        started=attempt.started_at,
        ended=attempt.ended_at,
        pids={attempt.pid} if attempt.pid else set(),
        error_file=os.path.join(run.run_dir, f"attempt-{attempt.n}.error.json"),
        hang_timeout_s=run.options.get("hang_timeout_s") if attempt.cause == "hang" else None,
        oom_deltas=_recorded_oom_deltas(attempt.containment),
        extra=_seen_by_the_supervisor(attempt.diagnosis),
        bounded_log=attempt.log_path,
    )


def _seen_by_the_supervisor(diagnosis: dict | None) -> list[Observation]:
    """What only the run's supervisor saw at the death (the leak it met, other nodes that never
    came, the job stopping on a signal, its samples): kept in the recorded diagnosis, not in any log,
    and read back as the evidence of the cause that was recorded with it."""
    if not isinstance(diagnosis, dict) or not isinstance(diagnosis.get("cause"), str) or diagnosis["cause"] == "hang":
        return []  # a hang's evidence is made again from the run's --hang-timeout
    confidence = diagnosis.get("confidence")
    weight = float(confidence) if isinstance(confidence, (int, float)) else 0.5
    return [Observation(source="telemetry", cause=diagnosis["cause"], weight=weight, role=Role.ROOT,
                        rule="supervisor:recorded", text=item["text"])
            for item in diagnosis.get("evidence") or []
            if isinstance(item, dict) and item.get("source") == "telemetry"
            and isinstance(item.get("text"), str)]  # fmt: skip


def _recorded_oom_deltas(containment: dict | None) -> OomDeltas | None:
    """The OOM kills the supervisor counted during the attempt, as recorded at its death."""
    record = (containment or {}).get("oom_deltas")
    try:
        return OomDeltas(**record) if isinstance(record, dict) else None
    except TypeError:
        return None
