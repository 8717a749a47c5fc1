"""Clients that never finish their request cannot grow the exporter: 600 half-open connections to a
real `trainguard exporter` on loopback leave its thread count and memory where they were, a scrape
among them is answered at once, and the server closes every one of them within its header timeout.
A client that trickles its header is dropped on time too, and a stopped server leaves no thread."""

from __future__ import annotations

import selectors
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.real.runs import free_port
from trainguard.monitor.exporter import TrainguardCollector, serve
from trainguard.monitor.metrics_server import HEADER_TIMEOUT_S

pytestmark = pytest.mark.real

HALF_OPEN = 600


def _status(pid: int) -> tuple[int, int]:
    """(threads, resident kB) of a process, from /proc/PID/status."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0])


def _scrape_seconds(port: int, timeout: float = 5.0) -> float:
    started = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as response:
        assert response.status == 200 and b"trainguard_host_memory_total_bytes" in response.read()
    return time.monotonic() - started


def _wait_until_serving(port: int, exporter: subprocess.Popen, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        assert exporter.poll() is None, exporter.communicate()[1]
        try:
            _scrape_seconds(port)
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"the exporter did not serve on port {port} within {within_s} s")


def _closed_by_server(connections: list[socket.socket], within_s: float) -> int:
    """How many of the connections the server has closed (end of file or reset) within the time."""
    closed = 0
    with selectors.DefaultSelector() as selector:
        for connection in connections:
            connection.setblocking(False)
            selector.register(connection, selectors.EVENT_READ)
        deadline = time.monotonic() + within_s
        while closed < len(connections) and time.monotonic() < deadline:
            for key, _ in selector.select(0.2):
                try:
                    data = key.fileobj.recv(4096)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    selector.unregister(key.fileobj)
                    closed += 1
    return closed


def test_half_open_connections_neither_grow_the_exporter_nor_delay_a_scrape(home: Path) -> None:
    port = free_port()
    exporter = subprocess.Popen([sys.executable, "-m", "trainguard", "exporter", "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    connections: list[socket.socket] = []
    try:
        _wait_until_serving(port, exporter)
        threads_before, rss_before_kb = _status(exporter.pid)
        most_threads = threads_before
        opening_deadline = time.monotonic() + 60
        for index in range(HALF_OPEN):
            assert time.monotonic() < opening_deadline, f"only {index} connections opened in 60 s"
            connection = socket.create_connection(("127.0.0.1", port), timeout=5)
            connections.append(connection)
            if index % 2:
                connection.sendall(b"GET /metr")  # half a request line; the even ones send nothing
            if index % 50 == 0:
                most_threads = max(most_threads, _status(exporter.pid)[0])
        last_connected = time.monotonic()

        assert _scrape_seconds(port) < 3.0
        threads_among_them, rss_among_them_kb = _status(exporter.pid)
        most_threads = max(most_threads, threads_among_them)
        # Before the fix: one thread per connection (602 threads), and connects queued behind a backlog of 5.
        assert most_threads <= threads_before + 2, (threads_before, most_threads)
        assert rss_among_them_kb - rss_before_kb < 10 * 1024, (rss_before_kb, rss_among_them_kb)

        closed = _closed_by_server(connections, within_s=HEADER_TIMEOUT_S + 5 - (time.monotonic() - last_connected))
        assert closed == HALF_OPEN, f"the server closed {closed} of {HALF_OPEN} half-open connections"
        assert _scrape_seconds(port) < 3.0
        assert _status(exporter.pid)[0] <= threads_before + 2
    finally:
        for connection in connections:
            connection.close()
        exporter.terminate()
        exporter.wait(20)


def test_a_trickled_header_is_dropped_on_time_and_shutdown_leaves_no_thread() -> None:
    threads_before = set(threading.enumerate())
    server = serve(0, "127.0.0.1", TrainguardCollector(None))
    try:
        port = server.server_port
        assert _scrape_seconds(port) < 3.0
        with socket.create_connection(("127.0.0.1", port), timeout=5) as slow:
            connected = time.monotonic()
            slow.sendall(b"GET /metrics HTTP/1.1\r\nX-Padding: ")
            slow.settimeout(0.25)
            ended = None
            while ended is None and time.monotonic() - connected < HEADER_TIMEOUT_S + 5:
                try:
                    slow.sendall(b"a")  # a byte at a time, the header never ends
                    if slow.recv(4096) == b"":
                        ended = time.monotonic() - connected
                except TimeoutError:
                    continue
                except OSError:
                    ended = time.monotonic() - connected
            assert ended is not None, "a client trickling its header was never dropped"
            assert HEADER_TIMEOUT_S - 0.5 <= ended <= HEADER_TIMEOUT_S + 3, ended
        assert _scrape_seconds(port) < 3.0
    finally:
        server.shutdown()
        server.server_close()
    assert set(threading.enumerate()) <= threads_before
