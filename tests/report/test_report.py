"""`trainguard report`: a self-contained page of a real run, rendered in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.real

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def tg(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINGUARD_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "trainguard", *args], env=env, capture_output=True, text=True,
                          timeout=180, check=False)  # fmt: skip


MEMORY_LIMIT = 256 * 1024**2


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """A real run preempted at step 15 and resumed; its Checkpointer keeps 2 checkpoints (prunes the rest)."""
    home = tmp_path_factory.mktemp("state")
    limit = ["--memory-limit", str(MEMORY_LIMIT)] if os.geteuid() == 0 else []
    tg(home, "run", "--foreground", "--sample-interval", "0.2s", *limit, "--", sys.executable, "-m",
       "trainguard.demo.toyjob", "--steps", "30", "--fault", "preempted", "--fault-step", "15",
       "--step-seconds", "0.05")  # fmt: skip
    return home


@pytest.fixture(scope="module")
def page(home: Path) -> tuple[Path, str]:
    run_id = json.loads(tg(home, "ps", "--json").stdout)[0]["id"]
    done = tg(home, "report", run_id)
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip()), run_id


def test_each_row_on_its_own_scale_every_checkpoint_and_each_attempt_labelled(home: Path, page) -> None:
    from trainguard.report.html import checkpoint_markers, timeline_figure
    from trainguard.store.registry import Registry

    registry = Registry(home)
    _, run_id = page
    run = registry.get(run_id)
    checkpoints = checkpoint_markers(registry.events(run_id))
    figure = timeline_figure(run, registry.samples(run_id), checkpoints, [], lang="en", now=time.time())
    # Every checkpoint the job saved is drawn (every 5 steps, 15 on the stop signal, then every 5 after
    # resuming), though its Checkpointer pruned all but the newest 2 from the disk.
    on_disk = [p for p in (Path(run.run_dir) / "checkpoints").iterdir() if p.name.startswith("step-")]
    assert len(on_disk) == 2
    drawn = next(trace for trace in figure.data if trace.mode == "markers" and trace.marker.symbol == "diamond")
    assert list(drawn.y) == [4, 9, 14, 15, 20, 25]
    titles = [a.text for a in figure.layout.annotations]
    assert any("#1 preempted" in text for text in titles) and any("#2 finished" in text for text in titles)
    layout = figure.to_plotly_json()["layout"]
    rss_row = next(i for i, text in enumerate(titles, start=1) if text.startswith("Job memory (RSS"))
    rss_axis = layout["yaxis" if rss_row == 1 else f"yaxis{rss_row}"]
    if os.geteuid() == 0:  # the run had --memory-limit: RSS is drawn against it, the limit as a line
        assert "256 MiB" in titles[rss_row - 1]
        assert rss_axis["range"] == pytest.approx([0, MEMORY_LIMIT / 1024**3 * 1.08])
        limit_lines = [shape for shape in layout["shapes"] if shape.get("y0") == pytest.approx(0.25)]
        assert limit_lines, "the memory limit is not drawn"
    else:  # no limit: the axis follows the job's own RSS, not the host's RAM (a flat line at 0)
        peak = max(s["job_rss"] for s in registry.samples(run_id) if s.get("job_rss")) / 1024**3
        assert rss_axis["range"][1] == pytest.approx(max(peak * 1.3, 0.05))
    disk_row = next(i for i, text in enumerate(titles, start=1) if text.startswith("Free disk"))
    disk_axis = layout[f"yaxis{disk_row}"]
    assert disk_axis["range"][0] == 0  # free disk from 0, not a zoom into its fifth decimal
    disk_traces = [trace for trace in figure.data if trace.hovertemplate and "GiB" in trace.hovertemplate
                   and ("run folder" in trace.name or "checkpoints" in trace.name)]  # fmt: skip
    assert disk_traces and all(":.2f" in trace.hovertemplate for trace in disk_traces)


def test_the_page_shows_goodput_and_reads_in_chinese(home: Path, page) -> None:
    path, run_id = page
    text = path.read_text()
    assert "Goodput: what the failures cost" in text and re.search(r"<b>\d+%</b> of the wall time", text)
    done = subprocess.run([sys.executable, "-m", "trainguard", "report", run_id, "-o", str(path.with_name("zh.html"))],
                          env={**os.environ, "TRAINGUARD_HOME": str(home), "LANG": "zh_CN.UTF-8"},
                          capture_output=True, text=True, timeout=180, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    zh = path.with_name("zh.html").read_text()
    assert '<html lang="zh">' in zh and "时间线" in zh and "有效训练率" in zh and "成功" in zh
    assert "Timeline" not in zh and "What to do" not in zh


def test_the_page_is_self_contained_and_tells_the_story(page) -> None:
    path, run_id = page
    text = path.read_text()
    assert not re.search(r"<script[^>]+src=", text) and not re.search(r"<link[^>]+href=\"http", text)
    assert f"run {run_id}" in text and "Attempts" in text
    assert "preempted" in text and "Received SIGTERM: state saved at step 15" in text  # the death's evidence
    assert "checkpoint step" in text  # checkpoints marked on the timeline
    assert "Plotly.newPlot" in text


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_the_page_renders_in_headless_chromium_without_errors(page, tmp_path: Path) -> None:
    path, _ = page
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
             "--v=0", "--virtual-time-budget=5000"]  # fmt: skip
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120,
                         check=False)  # fmt: skip
    assert "main-svg" in dom.stdout, "plotly drew no chart: its script failed to run"
    console_errors = [
        line for line in dom.stderr.splitlines() if "Uncaught" in line or ("CONSOLE(" in line and "rror" in line)
    ]
    assert console_errors == []
    shot = tmp_path / "report.png"
    subprocess.run([CHROMIUM, *flags, "--window-size=1200,1400", f"--screenshot={shot}", path.as_uri()],
                   capture_output=True, timeout=120, check=False)  # fmt: skip
    assert shot.exists() and shot.stat().st_size > 20_000


def test_only_a_file_is_replaced_by_the_page(home: Path, page, tmp_path: Path) -> None:
    """`-o /dev/null` as root turned the machine's /dev/null into the page: renamed over it."""
    _, run_id = page
    fifo, link, victim = tmp_path / "fifo", tmp_path / "link", tmp_path / "victim.txt"
    os.mkfifo(fifo)
    victim.write_text("keep me")
    link.symlink_to(victim)
    for target in (fifo, link):
        done = tg(home, "report", run_id, "-o", str(target))
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not a regular file" in done.stderr, done.stderr
    assert fifo.is_fifo() and link.is_symlink() and victim.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link", "victim.txt"]  # no temporary file left
    made = tg(home, "report", run_id, "-o", str(tmp_path / "page.html"))
    assert made.returncode == 0 and (tmp_path / "page.html").read_text().startswith("<!DOCTYPE html>")


def test_an_unknown_run_is_one_line(tmp_path: Path) -> None:
    done = tg(tmp_path, "report", "nosuchrun")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no run" in done.stderr


def test_names_commands_and_quoted_log_lines_show_their_control_characters() -> None:
    """A name with ESC, BEL and a right-to-left override, a command, an alert and a line quoted from the
    log as a death's evidence: the page holds none of those characters raw, each is written out."""
    from trainguard.report.html import render
    from trainguard.store.registry import Attempt, Run

    line = "step 7 \x1b]0;x\x07 loss \u202e0.25"
    diagnosis = {"cause": "python_error", "title": "Python exception", "confidence": 0.9,
                 "evidence": [{"source": "attempt-1.log", "line": 2, "text": line}], "fixes": ["fix it"]}  # fmt: skip
    run = Run(id="a1b2c3d4", name="evil\x1b]0;pwned\x07\u202egpj.exe", host="node1",
              command=["python", "train.py", "--tag", "\u202ex"], cwd="/", created_at=100.0, state="failed",
              run_dir="/tmp/x", log_path="/tmp/x/output.log", options={},
              attempts=[Attempt(1, 100.0, 160.0, exit_code=1, cause="python_error", confidence=0.9,
                                diagnosis=diagnosis)])  # fmt: skip
    events = [{"time": 150.0, "kind": "alert", "rule": "new_xid", "message": "Xid 79 \x1b[2J"},
              {"time": 140.0, "kind": "checkpoint", "attempt": 1, "path": "/ck/\u202estep-5", "step": 5}]  # fmt: skip
    page = render(run, [], events, now=200.0)
    assert not any(raw in page for raw in ("\x1b", "\x07", "\u202e"))
    assert "evil\\x1b]0;pwned\\x07\\u202egpj.exe" in page and "\\u202ex" in page
    assert "step 7 \\x1b]0;x\\x07 loss \\u202e0.25" in page and "Xid 79 \\x1b[2J" in page
