"""`trainguard top`'s pure parts: a run's row from its records, which run a GPU process belongs to,
throttle reasons, and the GPU panel drawn from what NVML reports on a busy 8-GPU machine (no GPU on
the test machine: the values are those of an H100 node under training, per-process memory included)."""

from __future__ import annotations

import os

from rich.console import Console

from trainguard.store.registry import Attempt, Run
from trainguard.top import render
from trainguard.top.model import (
    GpuProcessView,
    GpuView,
    HostView,
    RunView,
    Snapshot,
    owner_of,
    run_view,
    throttle_names,
)

GIB = 1024**3
# /proc/PID/cgroup of a job under trainguard on a cgroup v1 machine; the memory path is the one this
# project's host kernel logged for such a job in an OOM-kill record (task_memcg=...).
CGROUP_V1 = """12:freezer:/trainguard-5000f2f2-2
11:memory:/process_api/c7f2971f52b33e5a144ebdaf95e310ad/trainguard-5000f2f2-2
1:name=systemd:/user.slice/user-0.slice/session-3.scope
"""


def text_of(renderable, width: int = 140) -> str:
    console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def test_a_process_belongs_to_the_run_whose_attempt_cgroup_holds_it() -> None:
    assert owner_of(CGROUP_V1, [4242], {}) == ("5000f2f2", 2)
    assert owner_of("0::/trainguard-deadbeef-11\n", [1], {}) == ("deadbeef", 11)
    # Without cgroups (a container without them): an ancestor that is a run's job.
    assert owner_of("0::/\n", [777, 700, 1], {700: "abcd1234"}) == ("abcd1234", None)
    assert owner_of("0::/docker/3f2a\n", [777, 1], {700: "abcd1234"}) is None


def test_throttle_reasons_are_named_and_idle_is_not_a_throttle() -> None:
    assert throttle_names(0x1) == ()
    assert throttle_names(0x4 | 0x40) == ("sw_power_cap", "hw_thermal")
    assert throttle_names(None) == ()


def make_run(state: str, attempts: list[Attempt], **options) -> Run:
    return Run(id="a1b2c3d4", name="vit", host="node1", command=["python", "train.py"], cwd="/", created_at=0.0,
               state=state, run_dir="/tmp/x", log_path="/tmp/x/output.log", options=options,
               attempts=attempts)  # fmt: skip


def test_a_running_run_shows_the_reported_step_its_rate_and_rss_against_its_limit() -> None:
    run = make_run("running", [Attempt(1, 0.0, 50.0, cause="host_oom"), Attempt(2, 60.0)], memory_limit=8 * GIB)
    reported = {"first_step": 100, "first_step_time": 70.0, "step": 400, "step_time": 130.0}
    view = run_view(run, now=160.0, reported=reported, newest_checkpoint={"time": 120.0, "step": 350}, rss=3 * GIB,
                    machine_memory=64 * GIB, alert={"time": 150.0, "message": "RAM falling", "message_zh": "内存下降"},
                    goodput=0.8, lang="zh")  # fmt: skip
    assert (view.state, view.attempt, view.since_s) == ("running", 2, 100.0)
    assert (view.step, view.step_from, view.steps_per_s) == (400, "job", 5.0)
    assert view.checkpoint_age_s == 40.0 and view.limit == 8 * GIB and view.limit_is_own
    assert view.alert == "内存下降" and view.alert_age_s == 10.0 and view.last_cause == "host_oom"
    # A job without the library: the newest checkpoint's step, marked as such.
    quiet = run_view(run, now=160.0, reported={}, newest_checkpoint={"time": 120.0, "step": 350}, rss=None,
                     machine_memory=64 * GIB, alert=None, goodput=None)  # fmt: skip
    assert (quiet.step, quiet.step_from) == (350, "checkpoint")
    assert "350◆" in text_of(render.runs_table(Snapshot(0.0, (quiet,), (), HostView()), 0, 140, "en"))


def test_the_gpu_panel_names_each_process_and_its_run() -> None:
    procs = (
        GpuProcessView(4242, 71 * GIB, "python", "a1b2c3d4", "vit"),
        GpuProcessView(5151, 2 * GIB, "Xorg", None, None),
    )
    gpus = tuple(GpuView(i, "NVIDIA H100 80GB HBM3", 73 * GIB, 80 * GIB, 98, 71 + i, 512.4, 700.0,
                         ("sw_power_cap",) if i == 3 else (), procs if i == 0 else ())
                 for i in range(8))  # fmt: skip
    snapshot = Snapshot(0.0, (), gpus, HostView())
    wide = text_of(render.gpu_panel(snapshot, 140, "en"))
    assert "GPU 0 NVIDIA H100 80GB HBM3" in wide and "73 GiB/80 GiB" in wide and "98%" in wide and "71°C" in wide
    assert "512/700 W" in wide and "throttled: sw_power_cap" in wide
    assert (
        "pid 4242 python  71 GiB  → vit (a1b2c3d4)" in wide and "pid 5151 Xorg  2.0 GiB  → not a trainguard run" in wide
    )
    narrow = text_of(render.gpu_panel(snapshot, 60, "zh"), 60)
    assert "H100" not in narrow and "降频" in narrow and "5151" not in narrow  # one process a GPU when narrow
    assert all(len(line) <= 60 for line in narrow.splitlines())


# ---------------------------------------------------------------------------------- the live view
# Driven headless through textual's pilot; what it shows is read back from the screen it exports.
EVIL_NAME = "evil\x1b]0;pwned\x07\u202egpj.exe"
EVIL_LINE = "step 7 \x1b]0;x\x07 loss \u202e0.25"
RAW_CONTROLS = ("\x1b", "\x07", "\u202e")


def screen_lines(svg: str) -> list[str]:
    """The text of a screen textual exported as SVG, one string per terminal line (cells placed by
    their x position: the SVG leaves out the blank cells between two texts)."""
    import html
    import re

    from rich.cells import cell_len

    found = re.findall(r'<text [^>]*x="([\d.]+)" y="([\d.]+)" textLength="([\d.]+)"[^>]*>([^<]*)</text>', svg)
    texts = [
        (float(x), float(y), float(length), html.unescape(body).replace("\xa0", " ")) for x, y, length, body in found
    ]
    cell = min(length / cell_len(text) for _, _, length, text in texts if cell_len(text))
    lines: dict[float, list[str]] = {}
    for x, y, _, text in sorted(texts):
        line = lines.setdefault(y, [])
        column = round(x / cell)
        line += [" "] * (column - cell_len("".join(line)))
        line.append(text)
    return ["".join(lines[y]).rstrip() for y in sorted(lines)]


def view(name: str, **fields) -> RunView:
    values = dict(id="a1b2c3d4", name=name, state="running", active=True, attempt=2, since_s=3700.0, step=123456,
                  step_from="job", steps_per_s=12.3, checkpoint_age_s=620.0, rss=3 * GIB, limit=125 * GIB,
                  limit_is_own=False, alert=None, alert_age_s=None, last_cause=None, goodput=0.93)  # fmt: skip
    return RunView(**{**values, **fields})


class FakeCollector:
    """What `top` reads, fixed: the snapshot's runs, and one run's record (with a log and a diagnosis)."""

    def __init__(self, views, record: Run | None = None, gpus=()) -> None:
        self.views, self.record, self.gpus = tuple(views), record, tuple(gpus)

    def snapshot(self) -> Snapshot:
        return Snapshot(0.0, self.views, self.gpus, HostView(), hostname="node1", state_dir="/tmp/state")

    def run(self, run_id: str) -> Run | None:
        return self.record


def drive(collector, size: tuple[int, int], keys: list[str]) -> list[str]:
    """The screens of the live view: at start, then after each key."""
    import asyncio

    from trainguard.top.app import TopApp

    app = TopApp(collector, interval=60.0)
    screens: list[str] = []

    async def run() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.pause(0.2)
            screens.append(app.export_screenshot())
            for key in keys:
                await pilot.press(key)
                await pilot.pause(0.2)
                screens.append(app.export_screenshot())

    asyncio.run(run())
    return screens


LONG_NAME = "llama-13b-sft-warmup-cosine-lr3e-5"
RUNS = (
    view(LONG_NAME, alert="RAM falling: at this rate it runs out in 4 min", alert_age_s=30.0, last_cause="killed"),
    view("resnet50-imagenet-baseline", id="bbbb2222", state="failed", active=False, rss=None, steps_per_s=None,
         last_cause="python_error", goodput=0.4),
    view("vit", id="cccc3333", state="succeeded", active=False, rss=None, steps_per_s=None, attempt=3),
)  # fmt: skip


def test_at_80_columns_names_stay_readable_and_the_alert_column_stays() -> None:
    lines = screen_lines(drive(FakeCollector(RUNS), (80, 30), [])[0])
    header = next(line for line in lines if line.startswith("RUN"))
    assert "STATE" in header and "ALERT" in header and "STEP" in header and "GOODPUT" not in header
    rows = {name: next(line for line in lines if line.startswith(name[:10])) for name in (LONG_NAME, "resnet50")}
    assert rows[LONG_NAME].startswith(LONG_NAME[:16]) and "…" in rows[LONG_NAME]  # cut, still readable
    assert "RAM falling" in rows[LONG_NAME] and "python_error" in rows["resnet50"]
    assert any(line.startswith("vit (cccc3333)") for line in lines)  # a short name whole, with its id
    assert all(len(line) <= 80 for line in lines)


def test_at_120_columns_more_columns_come_back_first() -> None:
    lines = screen_lines(drive(FakeCollector(RUNS), (120, 30), [])[0])
    header = next(line for line in lines if line.startswith("RUN"))
    for column in ("ATT", "UP / ENDED", "CKPT AGE", "RSS / LIMIT", "ALERT"):
        assert column in header
    row = next(line for line in lines if line.startswith(LONG_NAME[:10]))
    assert row.startswith(LONG_NAME[:16]) and "/125 GiB host" in row and "RAM falling" in row


def test_the_runs_table_fits_every_width_and_keeps_name_state_and_alert() -> None:
    snapshot = Snapshot(0.0, RUNS, (), HostView())
    for width in (50, 60, 70, 80, 100, 120, 160):
        text = text_of(render.runs_table(snapshot, 0, width, "en"), width)
        assert all(len(line) <= width for line in text.splitlines()), width
        assert "ALERT" in text.splitlines()[0] and "python_error" in text, width
        assert LONG_NAME[: min(16, width // 3)] in text, width
    assert "GOODPUT" in text_of(render.runs_table(snapshot, 0, 160, "en"), 160)
    assert "告警" in text_of(render.runs_table(snapshot, 0, 80, "zh"), 80)


def test_the_stop_dialog_shows_its_keys() -> None:
    record = make_run("running", [Attempt(1, 0.0)], grace_s=30)
    lines = screen_lines(drive(FakeCollector(RUNS, record), (100, 30), ["s"])[1])
    assert any("Stop run vit?" in line for line in lines)
    assert any("[y] stop it    [n] / esc keep it running" in line for line in lines)


def test_control_characters_in_names_and_log_lines_never_reach_the_terminal(tmp_path) -> None:
    log = tmp_path / "attempt-1.log"
    log.write_text(f"starting\n{EVIL_LINE}\n", encoding="utf-8")
    diagnosis = {"cause": "python_error", "title": "Python exception", "confidence": 0.9,
                 "evidence": [{"source": "attempt-1.log", "line": 2, "text": EVIL_LINE}],
                 "fixes": ["fix the bug"], "alternatives": []}  # fmt: skip
    record = make_run("failed", [Attempt(1, 0.0, 10.0, cause="python_error", diagnosis=diagnosis,
                                         log_path=str(log))])  # fmt: skip
    record.name = EVIL_NAME
    evil_process = GpuProcessView(4242, GIB, "python\x1b[2J", "a1b2c3d4", EVIL_NAME)
    gpu = GpuView(0, "NVIDIA H100", 2 * GIB, 80 * GIB, 50, 60, 300.0, 700.0, (), (evil_process,))
    views = (view(EVIL_NAME, alert="Xid 79: \x1b]0;x\x07", alert_age_s=5.0),)
    start, log_view, _, diagnosis_view = drive(FakeCollector(views, record, [gpu]), (160, 40), ["l", "escape", "d"])
    for svg in (start, log_view, diagnosis_view):
        assert not any(raw in svg for raw in RAW_CONTROLS)
    shown = "\n".join(screen_lines(start))
    assert "evil\\x1b]0;pwned\\x07\\u202egpj.exe" in shown and "Xid 79: \\x1b]0;x\\x07" in shown
    assert "python\\x1b[2J" in shown
    assert "step 7 \\x1b]0;x\\x07 loss \\u202e0.25" in "\n".join(screen_lines(log_view))
    assert "step 7 \\x1b]0;x\\x07 loss \\u202e0.25" in "\n".join(screen_lines(diagnosis_view))
