"""`trainguard top`'s pure parts: a run's row from its records, which run a GPU process belongs to,
throttle reasons, and the GPU panel drawn from what NVML reports on a busy 8-GPU machine (no GPU on
the test machine: the values are those of an H100 node under training, per-process memory included)."""

from __future__ import annotations

import os

from rich.console import Console

from trainguard.store.registry import Attempt, Run
from trainguard.top import render
from trainguard.top.model import GpuProcessView, GpuView, HostView, Snapshot, owner_of, run_view, throttle_names

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
