"""The end of a run supervised in the foreground (``run --foreground``, ``restart --foreground``), as a
scheduler runs it: its verdict written for Kubernetes (a regular file only, and never waiting: a
path that cannot take it is one warning), and handed to Slurm for a requeue."""

from __future__ import annotations

import os

import click

from trainguard._i18n import Text, choose_language
from trainguard.cli.output import say
from trainguard.integrations import kubernetes, slurm
from trainguard.store.registry import Registry, RegistryError
from trainguard.store.states import PUBLIC_STATE, RunState


def under_slurm() -> bool:
    """Whether this process is in a Slurm job, where --requeue can act (a warning where it cannot)."""
    if slurm.job_id(os.environ) is not None:
        return True
    click.echo(say("trainguard: not in a Slurm job (no SLURM_JOB_ID): --requeue has no effect",
                   "trainguard：不在 Slurm 作业中（没有 SLURM_JOB_ID）：--requeue 不起作用"), err=True)  # fmt: skip
    return False


class Finish:
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
                click.echo(say(f"trainguard: {why.en}", f"trainguard：{why.zh}"), err=True)
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
        except kubernetes.NotARegularFile as exc:
            why = exc.why
        except OSError as exc:
            why = Text(str(exc.strerror or exc), str(exc.strerror or exc))
        else:
            return
        click.echo(say(f"trainguard: warning: cannot write the termination log {path}: {why.en}",
                       f"trainguard：警告：无法写入终止日志 {path}：{why.zh}"), err=True)  # fmt: skip
