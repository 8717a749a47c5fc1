"""``trainguard doctor``: what will kill the job, before it does."""

from __future__ import annotations

import json
import os

import click

from trainguard._i18n import LANGUAGES, choose_language
from trainguard.cli import output
from trainguard.doctor.checks import CHECKS, CheckResult, Status, run_checks
from trainguard.errors import UsageError
from trainguard.paths import state_dir

_MARK = {
    Status.OK: "[green]ok[/]",
    Status.WARN: "[yellow]warn[/]",
    Status.FAIL: "[bold red]FAIL[/]",
    Status.UNKNOWN: "[dim]?[/]",
}


def _only(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[str] | None:
    if not value:
        return None
    wanted = [item.strip() for item in value.split(",") if item.strip()]
    unknown = [item for item in wanted if item not in CHECKS]
    if unknown:
        raise UsageError(f"--only: no check named {', '.join(unknown)} (checks: {', '.join(CHECKS)})",
                         f"--only：没有名为 {', '.join(unknown)} 的检查（可用：{', '.join(CHECKS)}）")  # fmt: skip
    return wanted


def _as_json(result: CheckResult, lang: str) -> dict:
    return {"id": result.id, "status": result.status.value, "summary": result.summary[lang],
            "detail": result.detail[lang], "fix": result.fix[lang]}  # fmt: skip


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--lang", type=click.Choice(LANGUAGES), help="Language of the output (default: from LANG).")
@click.option("--only", callback=_only, metavar="ID,...", help="Run only these checks.")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False), help="Where checkpoints will go (default: "
              "TRAINGUARD_CHECKPOINT_DIR or the current folder).")  # fmt: skip
@click.option(
    "--kernel-log",
    "kernel_log_file",
    type=click.Path(dir_okay=False),
    help="Read Xid errors from a saved kernel log instead of this machine's.",
)
def doctor(as_json: bool, lang: str | None, only: list[str] | None, checkpoint_dir: str | None,
           kernel_log_file: str | None) -> int:  # fmt: skip
    """Find what kills training jobs before it does: driver/CUDA/PyTorch versions, GPU health, /dev/shm,
    memory limits, open-file limits, disk space, the SSH session, Xid errors. Exit 1 when a check fails."""
    from trainguard.doctor.gather import gather

    lang = choose_language(lang, os.environ)
    if kernel_log_file and not os.access(kernel_log_file, os.R_OK):
        raise UsageError(f"cannot read kernel log {kernel_log_file}", f"无法读取内核日志 {kernel_log_file}")
    facts = gather(checkpoint_dir=checkpoint_dir, state_dir=state_dir(), kernel_log_file=kernel_log_file)
    results = run_checks(facts, only)
    if as_json:
        click.echo(json.dumps({"checks": [_as_json(r, lang) for r in results]}, ensure_ascii=False, indent=2))
    else:
        _print(results, lang)
    return 1 if any(r.status is Status.FAIL for r in results) else 0


def _print(results: list[CheckResult], lang: str) -> None:
    console = output.console()
    try:
        _render(console, results, lang)
    finally:
        console.file.flush()


def _render(console, results: list[CheckResult], lang: str) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True)
    table.add_column(style="cyan", no_wrap=True)
    table.add_column(overflow="fold")
    for result in results:
        table.add_row(_MARK[result.status], result.id, escape(result.summary[lang]))
    console.print(table)
    trouble = [r for r in results if r.status in (Status.WARN, Status.FAIL)]
    for result in trouble:
        console.print(f"\n[bold]{result.id}[/]: {escape(result.summary[lang])}")
        if result.detail[lang]:
            console.print(f"  [dim]{escape(result.detail[lang])}[/]")
        if result.fix[lang]:
            console.print(f"  {'→ 怎么办' if lang == 'zh' else '→ fix'}: {escape(result.fix[lang])}")
