"""The live view of `trainguard top` (textual): the runs, this machine's GPUs and host, refreshed
every ``interval`` seconds; keys to select a run and open its log tail or its diagnosis, or stop it
after a confirmation (through `trainguard stop`, the command's own code path)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from trainguard._terminal import visible
from trainguard.top import render
from trainguard.top.collect import Collector, log_tail
from trainguard.top.model import Snapshot
from trainguard.units import format_duration

LOG_LINES = 200


class TextScreen(ModalScreen[None]):
    """A full-screen text (a log tail, a diagnosis) over the live view; esc or q closes it. The title is
    one line, shown with its control characters visible; the body comes as a renderable made so."""

    BINDINGS: ClassVar = [Binding("escape,q", "close", "close")]
    DEFAULT_CSS = """
    TextScreen { align: center middle; }
    TextScreen > VerticalScroll { width: 100%; height: 100%; border: round $accent; padding: 0 1; }
    """

    def __init__(self, title: str, body: Any, refresh_body: Any = None, interval: float = 2.0) -> None:
        super().__init__()
        self.title_text = title
        self.body = body
        self.refresh_body = refresh_body  # called every interval for a body that changes (a log tail)
        self.interval = interval

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="text-scroll"):
            yield Static(Text(visible(self.title_text), style="bold"), id="text-title")
            yield Static(self.body, id="text-body")

    def on_mount(self) -> None:
        self.query_one("#text-scroll", VerticalScroll).scroll_end(animate=False)
        if self.refresh_body is not None:
            self.set_interval(self.interval, self._refresh_body)

    def _refresh_body(self) -> None:
        self.body = self.refresh_body()
        self.query_one("#text-body", Static).update(self.body)

    def action_close(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question. Shown as plain text, never as markup: its "[y]" and "[n]" are keys to read."""

    BINDINGS: ClassVar = [Binding("y", "answer(True)", "yes"), Binding("n,escape", "answer(False)", "no")]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Static { width: auto; max-width: 90%; border: thick $error; padding: 1 2; background: $surface; }
    """

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        yield Static(Text(self.question), id="question")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class TopApp(App[None]):
    TITLE = "trainguard top"
    BINDINGS: ClassVar = [
        Binding("q", "quit", "quit"),
        Binding("up,k", "move(-1)", "up", show=False),
        Binding("down,j", "move(1)", "down", show=False),
        Binding("enter,l", "log", "log"),
        Binding("d", "diagnosis", "diagnosis"),
        Binding("s", "stop", "stop"),
        Binding("r", "refresh_now", "refresh", show=False),
    ]
    CSS = """
    #runs { height: auto; max-height: 60%; }
    .section { text-style: bold underline; margin-top: 1; }
    #status { dock: bottom; height: 1; background: $boost; }
    """

    def __init__(self, collector: Collector, *, interval: float = 2.0, lang: str = "en") -> None:
        super().__init__()
        self.collector = collector
        self.interval = interval
        self.lang = lang
        self.snapshot: Snapshot | None = None
        self.selected = 0
        self.message = ""  # the outcome of the last action, on the status line

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(id="title")
            yield Static(Text(render.t("runs", self.lang)), classes="section")
            yield Static(id="runs")
            yield Static(Text(render.t("gpus", self.lang)), classes="section")
            yield Static(id="gpus")
            yield Static(Text(render.t("host", self.lang)), classes="section")
            yield Static(id="host")
        yield Static(id="status")

    def on_mount(self) -> None:
        self.refresh_view()
        self.set_interval(self.interval, self.refresh_view)

    def on_resize(self) -> None:
        self.draw()

    # ------------------------------------------------------------------ drawing
    def refresh_view(self) -> None:
        self.snapshot = self.collector.snapshot()
        if self.snapshot.runs:
            self.selected = min(self.selected, len(self.snapshot.runs) - 1)
        self.draw()

    def draw(self) -> None:
        if self.snapshot is None:
            return
        width, height = self.size.width, self.size.height
        snap = self.snapshot
        self.query_one("#title", Static).update(
            Text(visible(f"trainguard top · {snap.hostname} · {snap.state_dir}"), style="bold")
        )
        max_rows = max(3, height // 2 - 2)
        self.query_one("#runs", Static).update(render.runs_table(snap, self.selected, width, self.lang, max_rows))
        self.query_one("#gpus", Static).update(render.gpu_panel(snap, width, self.lang))
        self.query_one("#host", Static).update(render.host_panel(snap.host, width, self.lang))
        keys = render.t("keys" if width >= render.NARROW else "keys_short", self.lang)
        errors = "  " + "; ".join(snap.errors) if snap.errors else ""
        status = visible(f"{self.message or keys}{errors}")  # a message may quote a run's name or a command's output
        self.query_one("#status", Static).update(Text(status, overflow="ellipsis"))

    # ------------------------------------------------------------------ keys
    def selected_run(self) -> Any:
        if self.snapshot is None or not self.snapshot.runs:
            return None
        return self.collector.run(self.snapshot.runs[self.selected].id)

    def action_move(self, delta: int) -> None:
        if self.snapshot and self.snapshot.runs:
            self.selected = min(max(0, self.selected + delta), len(self.snapshot.runs) - 1)
            self.message = ""
            self.draw()

    def action_refresh_now(self) -> None:
        self.refresh_view()

    def action_log(self) -> None:
        run = self.selected_run()
        if run is None:
            return

        def body() -> Text:
            fresh = self.collector.run(run.id) or run
            _, lines = log_tail(fresh, LOG_LINES)
            if not lines:
                return Text(render.t("log_empty", self.lang), style="dim")
            return Text("\n".join(visible(line) for line in lines))

        path, _ = log_tail(run, 1)
        n = run.attempts[-1].n if run.attempts else "-"
        title = render.t("log_title", self.lang, run=run.name or run.id, n=n, path=path or "-", lines=LOG_LINES)
        self.push_screen(TextScreen(title, body(), body, self.interval))

    def action_diagnosis(self) -> None:
        run = self.selected_run()
        if run is not None:
            self.push_screen(
                TextScreen(f"trainguard diagnose {run.name or run.id}", render.diagnosis_view(run, self.lang))
            )

    def action_stop(self) -> None:
        run = self.selected_run()
        if run is None:
            return
        if not run.active:
            view = self.snapshot.runs[self.selected] if self.snapshot else None
            state = render.t(f"state_{view.state}", self.lang) if view else run.state
            self.message = render.t("not_active", self.lang, run=run.name or run.id, state=state)
            self.draw()
            return
        grace = format_duration(float(run.options.get("grace_s", 120)))
        question = render.t("confirm_stop", self.lang, run=visible(run.name or run.id), grace=grace)

        def answered(yes: bool | None) -> None:
            if yes:
                self.message = render.t("stopping", self.lang, run=run.name or run.id)
                self.draw()
                self.run_worker(lambda: self._stop(run.id), thread=True, exclusive=True, group="stop")

        self.push_screen(ConfirmScreen(question), answered)

    def _stop(self, run_id: str) -> None:
        """`trainguard stop RUN --no-wait`, the command itself: its checks, its request, its signal."""
        done = subprocess.run([sys.executable, "-m", "trainguard", "stop", run_id, "--no-wait"], capture_output=True,
                              text=True, env=os.environ.copy(), check=False, timeout=600)  # fmt: skip
        said = (done.stdout.strip() or done.stderr.strip()).splitlines()
        self.call_from_thread(self._stopped, said[-1] if said else f"trainguard stop {run_id}: exit {done.returncode}")

    def _stopped(self, message: str) -> None:
        self.message = message
        self.refresh_view()
