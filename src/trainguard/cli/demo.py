"""``trainguard demo``: the whole story on a toy training job, with real faults."""

from __future__ import annotations

import json
import os

import click

from trainguard._i18n import LANGUAGES, choose_language
from trainguard.cli import output
from trainguard.errors import UsageError


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--scenario", "only", metavar="NAME", help="Run one scenario.")
@click.option("--lang", type=click.Choice(LANGUAGES), help="Language of the output (default: from LANG).")
def demo(as_json: bool, only: str | None, lang: str | None) -> int:
    """Train a toy model under trainguard and hit it with the faults that kill real jobs: a closed
    terminal, host OOM, a tiny /dev/shm, preemption, a hang, a full disk, a bug, CUDA OOM. Exit 0
    when every scenario that ran was named correctly and recovered as the policy says."""
    from trainguard.demo.scenarios import SCENARIOS, run_scenario

    lang = choose_language(lang, os.environ)
    chosen = [s for s in SCENARIOS if only in (None, s.name)]
    if not chosen:
        names = ", ".join(s.name for s in SCENARIOS)
        raise UsageError(f"no scenario {only!r} (scenarios: {names})", f"没有场景 {only!r}（可用：{names}）")
    outcomes = []
    if as_json:
        outcomes = [run_scenario(s) for s in chosen]
        click.echo(json.dumps({"scenarios": [o.to_dict() for o in outcomes]}, ensure_ascii=False, indent=2))
    else:
        console = output.console()
        for scenario in chosen:
            with console.status(f"[bold]{scenario.name}[/]: {scenario.title.pick(lang)} …"):
                outcome = run_scenario(scenario)
            outcomes.append(outcome)
            zh = lang == "zh"
            if outcome.skipped:
                mark = "[dim]跳过[/]" if zh else "[dim]skipped[/]"
            elif outcome.passed:
                mark = "[green]通过[/]" if zh else "[green]ok[/]"
            else:
                mark = "[bold red]失败[/]" if zh else "[bold red]FAILED[/]"
            console.print(f"{mark}  {scenario.name}: {scenario.title.pick(lang)}")
        _table(console, outcomes, lang)
        console.file.flush()
    ran = [o for o in outcomes if not o.skipped]
    return 0 if ran and all(o.passed for o in ran) else 1


def _table(console, outcomes, lang: str) -> None:
    from rich.table import Table

    zh = lang == "zh"
    headers = ["场景", "真实/回放", "判定原因", "置信度", "是否重启", "恢复自步", "损失步数", "耗时"]
    if not zh:
        headers = ["scenario", "real", "cause named", "confidence", "restarted", "resumed from", "steps lost", "time"]
    table = Table(*headers, title="trainguard demo")
    for o in outcomes:
        if o.skipped:
            why = (o.skipped_zh or o.skipped) if zh else o.skipped
            table.add_row(o.name, "-", f"[dim]{'跳过' if zh else 'skipped'}: {why}[/]", "", "", "", "", "")
            continue
        real = ("真实" if o.real else "回放") if zh else ("real" if o.real else "replayed")
        cause = o.cause or ("未中断" if zh else "survived")
        style = "green" if o.passed else "red"
        table.add_row(o.name, real, f"[{style}]{cause}[/]", f"{o.confidence:.2f}" if o.confidence else "",
                      ("是" if o.restarted else "否") if zh else ("yes" if o.restarted else "no"),
                      "" if o.resumed_from_step is None else str(o.resumed_from_step),
                      "" if o.steps_lost is None else str(o.steps_lost), f"{o.seconds:.1f} s")  # fmt: skip
    console.print(table)
