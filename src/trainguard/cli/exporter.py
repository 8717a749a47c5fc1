"""``trainguard exporter``: serve Prometheus metrics of this machine's runs, GPUs and host."""

from __future__ import annotations

import time

import click

from trainguard.cli.output import say
from trainguard.cli.params import open_registry


@click.command()
@click.option(
    "--port", type=click.IntRange(1, 65535), default=9400, show_default=True, help="The port /metrics is served on."
)
@click.option("--bind", default="127.0.0.1", show_default=True, help="Listen address (0.0.0.0 for every interface).")
def exporter(port: int, bind: str) -> int:
    """Serve Prometheus metrics of this machine's runs, GPUs and host at http://BIND:PORT/metrics."""
    from trainguard.monitor.exporter import TrainguardCollector, kernel_xid_counter, serve

    serve(port, bind, TrainguardCollector(open_registry(), xid_counts=kernel_xid_counter()))
    click.echo(say(f"serving Prometheus metrics at http://{bind}:{port}/metrics (Ctrl+C stops)",
                   f"Prometheus 指标地址 http://{bind}:{port}/metrics（Ctrl+C 停止）"))  # fmt: skip
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
