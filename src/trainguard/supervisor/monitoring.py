"""What a supervisor tells the world while its run goes on: the run monitor (samples, alerts, the
notifiers) and, with --metrics-port, the Prometheus exporter."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from trainguard.monitor.exporter import TrainguardCollector, kernel_xid_counter, serve
from trainguard.monitor.notify import Notifier
from trainguard.monitor.runwatch import RunMonitor
from trainguard.store.journal import Journal
from trainguard.supervisor.job import JobOptions


def start_monitoring(
    journal: Journal,
    options: JobOptions,
    *,
    notifiers: Sequence[Notifier],
    checkpoint_bytes: Callable[[], int | None],
    clock: Callable[[], float],
) -> RunMonitor:
    """The run's monitor, its samplers started; the exporter serving from now on when asked for."""
    run = journal.run
    monitor = RunMonitor(
        journal,
        interval_s=options.sample_interval_s,
        disk_paths=list(dict.fromkeys([run.run_dir, options.checkpoint_dir])),
        notifiers=notifiers,
        checkpoint_bytes=checkpoint_bytes,
        clock=clock,
    )
    if options.metrics_port is not None:
        collector = TrainguardCollector(journal.registry, run_id=run.id, xid_counts=kernel_xid_counter())
        serve(options.metrics_port, options.metrics_bind, collector)
    return monitor
