"""``trainguard top``: the live view of this machine's runs, GPUs and host."""

from __future__ import annotations

import os
import shutil
import sys

import click

from trainguard._i18n import choose_language
from trainguard.errors import UsageError
from trainguard.paths import state_dir
from trainguard.store.registry import Registry, close_runs_lost_to_reboot


@click.command()
@click.option("--interval", type=click.FloatRange(0.5, 60), default=2.0, show_default=True, metavar="SECONDS",
              help="How often the view is refreshed.")  # fmt: skip
@click.option(
    "--once", is_flag=True, help="Print the view once and exit (also what happens when stdout is not a terminal)."
)
def top(interval: float, once: bool) -> int:
    """A live view of this machine's runs (state, attempt, step, checkpoint age, RSS against the limit,
    goodput, the latest alert), its GPUs (memory, utilisation, temperature, power, throttling, the
    processes on each and their run) and the host (RAM, swap, /dev/shm, disks).

    \b
    Keys: ↑/↓ select a run · enter or l its log · d its diagnosis · s stop it (asks first) · q quit
    """
    from trainguard.top.collect import Collector

    lang = choose_language(None, os.environ)
    registry = Registry(state_dir())
    close_runs_lost_to_reboot(registry)
    collector = Collector(registry, lang=lang)
    if once or not sys.stdout.isatty():
        from rich.console import Console

        from trainguard.top.render import whole_view

        width = shutil.get_terminal_size((120, 40)).columns if sys.stdout.isatty() else 160
        console = Console(width=width, highlight=False, soft_wrap=False)
        with console.capture() as captured:
            console.print(whole_view(collector.snapshot(), width, lang))
        for line in captured.get().splitlines():  # no padding after the last column
            click.echo(line.rstrip())
        return 0
    if not sys.stdin.isatty():
        raise UsageError("trainguard top needs a terminal to read keys from (or use --once)",
                         "trainguard top 需要终端来读取按键（或使用 --once）")  # fmt: skip
    from trainguard.top.app import TopApp

    TopApp(collector, interval=interval, lang=lang).run()
    return 0
