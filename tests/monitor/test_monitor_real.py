"""Monitoring for real: a run that dies posts its death to a webhook served on loopback, secrets stay
out of status and logs, samples land in the registry, and the exporter answers real scrapes."""

from __future__ import annotations

import http.server
import json
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.real.runs import free_port
from trainguard.store.registry import Registry

pytestmark = pytest.mark.real


def tg(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainguard", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


class Hook:
    """A webhook receiver on 127.0.0.1 that keeps what it is sent."""

    def __init__(self) -> None:
        received = self.received = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def test_a_death_is_posted_to_the_webhook_and_secrets_stay_hidden(tmp_path: Path, home: Path) -> None:
    hook = Hook()
    try:
        config = tmp_path / "notify.toml"
        config.write_text(f'[[notify]]\nkind = "slack"\nurl = "{hook.url}/services/T0/B0/SECRETTOKEN"\n'
                          f'[[notify]]\nkind = "webhook"\nurl = "{hook.url}/generic"\n')  # fmt: skip
        job = tmp_path / "job.py"
        job.write_text("import ctypes, time\nprint('step 1', flush=True)\ntime.sleep(1.5)\nctypes.string_at(0)\n")
        done = tg("run", "--foreground", "--restart", "never", "--sample-interval", "0.5s", "--config", str(config),
                  "--", sys.executable, "-X", "faulthandler", str(job))  # fmt: skip
        assert done.returncode == 1
        time.sleep(0.2)
        paths = [path for path, _ in hook.received]
        assert "/services/T0/B0/SECRETTOKEN" in paths and "/generic" in paths
        generic = next(body for path, body in hook.received if path == "/generic" and body["rule"] == "death")
        assert "segfault" in generic["text"] and generic["severity"] == "critical"
        slack = next(body for path, body in hook.received if path.startswith("/services") and "death" in body["text"])
        assert set(slack) == {"text"}
        run = json.loads(tg("ps", "--json").stdout)[0]
        shown = tg("status", run["id"], "--json").stdout + tg("status", run["id"]).stdout
        shown += (
            (home / "runs" / run["id"] / "supervisor.log").read_text()
            if (home / "runs" / run["id"] / "supervisor.log").exists()
            else ""
        )
        assert "SECRETTOKEN" not in shown
        # samples were taken while it ran
        samples = Registry(home).samples(run["id"])
        assert samples and samples[0]["mem_total"] > 0 and "/dev/shm" not in samples[0].get("disk_free", {})
    finally:
        hook.close()


def test_notifier_configuration_errors_are_one_line(tmp_path: Path, home: Path) -> None:
    bad_key = tmp_path / "bad.toml"
    bad_key.write_text('[[notify]]\nkind = "slack"\nurl = "https://hooks.slack.com/x"\ncolour = "red"\n')
    broken = tmp_path / "broken.toml"
    broken.write_text("[[notify]\n")
    cases = [(["--config", str(bad_key)], "unknown key 'colour'"), (["--config", str(broken)], "not valid TOML"),
             (["--config", str(tmp_path / "missing.toml")], "cannot read config"),
             (["--notify", "slack=ftp://x"], "invalid slack webhook URL"), (["--notify", "pager=https://x.y"], "unknown notifier kind"),
             (["--notify", "https://x.y"], "KIND=URL")]  # fmt: skip
    for args, message in cases:
        done = tg("run", *args, "--", "true")
        assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, (args, done.stderr)
    assert json.loads(tg("ps", "--json").stdout) == []


def _scrape(port: int) -> str:
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                return response.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _sigkill_cause() -> str:
    from trainguard.probes import kernel_log

    try:
        kernel_log.read_live()
    except kernel_log.KernelLogUnavailable:
        return "host_oom"  # no kernel log to tell an OOM kill from another SIGKILL
    return "killed"


def test_the_exporter_answers_real_scrapes_with_runs_and_host(tmp_path: Path, home: Path) -> None:
    tg("run", "--foreground", "--restart", "never", "--", sys.executable, "-c", "import os; os.kill(os.getpid(), 9)")
    port = free_port()
    exporter = subprocess.Popen([sys.executable, "-m", "trainguard", "exporter", "--port", str(port)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        text = _scrape(port)
        names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
        assert names and all(name.startswith("trainguard_") for name in names), names
        assert "trainguard_host_memory_available_bytes" in names
        assert "trainguard_run_state_info{" in text and 'state="failed"' in text
        # the job SIGKILLed itself: where the kernel log can be read it holds no OOM kill of it (killed)
        assert "trainguard_run_deaths_total{" in text and f'cause="{_sigkill_cause()}"' in text
        # the same port twice: one line, exit 2
        second = tg("exporter", "--port", str(port))
        assert second.returncode == 2 and "in use" in second.stderr and second.stderr.count("\n") == 1
    finally:
        exporter.terminate()
        exporter.wait(10)


def test_run_metrics_port_serves_the_running_job(tmp_path: Path, home: Path) -> None:
    port = free_port()
    job = tmp_path / "job.py"
    job.write_text("import time\nfor i in range(600):\n    print(i, flush=True)\n    time.sleep(0.1)\n")
    started = tg("run", "--metrics-port", str(port), "--", sys.executable, str(job))
    run_id = started.stdout.split("started run ", 1)[1].split()[0]
    try:
        text = _scrape(port)
        assert f'run="{run_id}"' in text and 'state="running"' in text
        busy = tg("run", "--metrics-port", str(port), "--", sys.executable, str(job))
        assert busy.returncode == 2 and "--metrics-port" in busy.stderr
    finally:
        tg("stop", run_id)


def test_samples_thin_out_with_age(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "state")
    run = registry.create_run(["x"], name=None, cwd="/", options={})
    now = 1_000_000.0
    for second in range(0, 3 * 3600, 5):  # three hours of samples every 5 s
        registry.add_sample(run.id, now - second, {"time": now - second})
    registry.downsample(run.id, now)
    with sqlite3.connect(tmp_path / "state" / "runs.sqlite") as db:
        recent = db.execute("SELECT COUNT(*) FROM samples WHERE time >= ?", (now - 900,)).fetchone()[0]
        older = db.execute("SELECT COUNT(*) FROM samples WHERE time < ?", (now - 900,)).fetchone()[0]
    assert recent == 181  # every sample of the last 15 minutes
    assert 160 <= older <= 170  # one a minute for the 2 h 45 min before
