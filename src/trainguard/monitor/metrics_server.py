"""The HTTP server behind ``/metrics``, whose threads, open connections and memory stay bounded
whatever clients do. One thread accepts connections and gathers each request's header without
blocking: a client that sends nothing, or half a request, or one byte at a time, is dropped a few
seconds after it connected, and the oldest waiting client first when too many wait. A fixed pool of
threads answers complete requests through the WSGI app, each send within a time limit."""

from __future__ import annotations

import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from io import BytesIO
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

# A scrape sends its whole request at once: a client still sending after this is stuck or hostile.
HEADER_TIMEOUT_S = 5.0
# A client that does not read its answer frees its thread after this.
SEND_TIMEOUT_S = 10.0
HEADER_MAX_BYTES = 16 * 1024
# Clients whose header is still coming. One more drops the oldest: a scrape's header comes at once,
# so the clients that waited longest are the stuck ones.
WAITING_MAX = 128
# Complete requests no answering thread has taken yet; one more is closed unanswered.
QUEUED_MAX = 32
ANSWER_THREADS = 4
LISTEN_BACKLOG = 128
_END_OF_HEADER = (b"\n\r\n", b"\n\n")


@dataclass(slots=True)
class _Waiting:
    address: Any
    deadline: float
    header: bytearray = field(default_factory=bytearray)


class _AnswerHandler(WSGIRequestHandler):
    """Answers the one request whose header the server has already read, then the connection ends."""

    timeout = SEND_TIMEOUT_S

    def __init__(self, connection: socket.socket, address: Any, server: MetricsServer, header: bytes) -> None:
        self.header = header
        super().__init__(connection, address, server)

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        self.rfile = BytesIO(self.header)

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged, as prometheus_client's own server does not."""


class MetricsServer(WSGIServer):
    """Serves ``app`` on ``bind``:``port`` while ``serve_forever`` runs (in a thread of its own);
    ``shutdown`` ends it and its answering threads. Each connection answers one request."""

    request_queue_size = LISTEN_BACKLOG

    def __init__(self, bind: str, port: int, app: Callable) -> None:
        # The family the address names ("::" serves IPv6), as prometheus_client's server picks it.
        family, _, _, _, address = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self.address_family = family
        super().__init__((address[0], port), _AnswerHandler)
        self.set_app(app)
        self._waiting: dict[socket.socket, _Waiting] = {}  # in the order they connected
        self._requests: queue.Queue[tuple[socket.socket, Any, bytes] | None] = queue.Queue(QUEUED_MAX)
        self._stop = threading.Event()
        self._stopped = threading.Event()

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        answering = [threading.Thread(target=self._answer_requests, name="trainguard-metrics-answer", daemon=True)
                     for _ in range(ANSWER_THREADS)]  # fmt: skip
        for thread in answering:
            thread.start()
        self.socket.setblocking(False)
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self.socket, selectors.EVENT_READ)
                while not self._stop.is_set():
                    for key, _ in selector.select(poll_interval):
                        if key.fileobj is self.socket:
                            self._accept(selector)
                        else:
                            self._read_header(selector, key.fileobj)  # type: ignore[arg-type]
                    self._drop_late(selector, time.monotonic())
                self._drop_late(selector, float("inf"))
        finally:
            self._close_unanswered()
            for _ in answering:
                self._requests.put(None)
            for thread in answering:
                thread.join(SEND_TIMEOUT_S)
            self._stopped.set()

    def shutdown(self) -> None:
        self._stop.set()
        self._stopped.wait()

    def _accept(self, selector: selectors.BaseSelector) -> None:
        for _ in range(WAITING_MAX):  # then the clients already waiting get their turn
            try:
                connection, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of file descriptors: the client waits in the backlog meanwhile
                time.sleep(0.1)
                return
            if len(self._waiting) >= WAITING_MAX:
                self._drop(selector, next(iter(self._waiting)))
            connection.setblocking(False)
            self._waiting[connection] = _Waiting(address, time.monotonic() + HEADER_TIMEOUT_S)
            selector.register(connection, selectors.EVENT_READ)

    def _read_header(self, selector: selectors.BaseSelector, connection: socket.socket) -> None:
        waiting = self._waiting.get(connection)
        if waiting is None:  # dropped for a newer client since the selector reported it
            return
        try:
            chunk = connection.recv(HEADER_MAX_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        waiting.header += chunk
        if not chunk or len(waiting.header) > HEADER_MAX_BYTES:
            self._drop(selector, connection)
        elif any(end in waiting.header for end in _END_OF_HEADER):
            selector.unregister(connection)
            del self._waiting[connection]
            try:
                self._requests.put_nowait((connection, waiting.address, bytes(waiting.header)))
            except queue.Full:
                self.shutdown_request(connection)

    def _drop_late(self, selector: selectors.BaseSelector, now: float) -> None:
        while self._waiting:
            oldest = next(iter(self._waiting))
            if self._waiting[oldest].deadline > now:
                return
            self._drop(selector, oldest)

    def _drop(self, selector: selectors.BaseSelector, connection: socket.socket) -> None:
        selector.unregister(connection)
        del self._waiting[connection]
        self.shutdown_request(connection)

    def _close_unanswered(self) -> None:
        while True:
            try:
                request = self._requests.get_nowait()
            except queue.Empty:
                return
            if request is not None:
                self.shutdown_request(request[0])

    def _answer_requests(self) -> None:
        while (request := self._requests.get()) is not None:
            connection, address, header = request
            try:
                _AnswerHandler(connection, address, self, header)
            except OSError:
                pass  # the client went away or stopped reading: there is nobody to answer
            except Exception:
                self.handle_error(connection, address)
            finally:
                self.shutdown_request(connection)
