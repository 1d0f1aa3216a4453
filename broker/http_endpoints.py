"""The node's HTTP port (`--http-address`): `/metrics` (Prometheus), `/healthz` and `/readyz`.

- `GET /healthz`: 200 while the process serves HTTP at all (liveness).
- `GET /readyz`: 200 when this node is a cluster member (not one a leader told it was removed)
  connected to a majority of the cluster (itself included) and to a leader it knows (or is that
  leader), and has applied all but at most READY_APPLY_LAG_MAX committed entries; 503 otherwise.
  (PySyncObj keeps a follower's last leader after it went away, so a known leader alone proves
  nothing.) Both answer a JSON object saying why.
  The gRPC health service reports the same readiness (broker/main.py `BrokerNode.update_health`).
- `GET /metrics`: the text exposition of broker/metrics.py `REGISTRY`.

Threads: `kq-http` accepts connections; each request runs on its own short-lived thread
(`kq-http-request`), at most HTTP_THREADS_MAX at once (one more waits in `kq-http` for a slot).
`stop()` shuts the accept loop down, closes the socket and joins `kq-http`.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kq.broker.consensus import REMOVED_ROLE, ConsensusStatus
from kq.broker.metrics import REGISTRY
from kq.proto.limits import HTTP_REQUEST_TIMEOUT_S, HTTP_STOP_POLL_S, HTTP_THREADS_MAX, READY_APPLY_LAG_MAX


@dataclass(frozen=True, slots=True)
class Readiness:
    """Whether the node is ready to serve, and why (what /readyz answers)."""

    ready: bool
    reason: str
    role: str
    leader: str
    commit_index: int
    applied_index: int


def readiness(status: ConsensusStatus, apply_lag_max: int = READY_APPLY_LAG_MAX) -> Readiness:
    """Ready: Raft is up, a leader is known, and the store is within `apply_lag_max` of the commit."""
    lag = status.commit_index - status.applied_index
    if status.role == REMOVED_ROLE:
        reason = "this node was removed from the cluster (a leader said so): stop it"
    elif not status.ready:
        reason = "Raft has not started or has not caught up with its own log"
    elif not status.leader_id:
        reason = "no known leader (an election, or this node is cut off from a majority)"
    elif 1 + sum(status.connected.values()) <= (len(status.connected) + 1) // 2:
        reason = "no known leader reachable: this node is connected to no majority of the cluster"
    elif status.role != "leader" and not status.connected.get(status.leader_id, False):
        reason = f"no known leader reachable: not connected to the leader it last knew ({status.leader_id})"
    elif lag > apply_lag_max:
        reason = f"applied index {status.applied_index} is {lag} entries behind the commit index"
    else:
        reason = "ready"
    return Readiness(
        reason == "ready", reason, status.role, status.leader_id, status.commit_index, status.applied_index
    )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = HTTP_THREADS_MAX

    def __init__(self, address: tuple[str, int], status: Callable[[], ConsensusStatus]) -> None:
        self.status = status
        self._slots = threading.BoundedSemaphore(HTTP_THREADS_MAX)
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        self._slots.acquire()  # On kq-http: at most HTTP_THREADS_MAX requests run at once.
        try:
            thread = threading.Thread(
                target=self._answer, args=(request, client_address), name="kq-http-request", daemon=True
            )
            thread.start()
        except BaseException:
            self._slots.release()
            raise

    def _answer(self, request: Any, client_address: Any) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = HTTP_REQUEST_TIMEOUT_S
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(HTTPStatus.OK, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            self._json(HTTPStatus.OK, {"alive": True})
        elif path == "/readyz":
            state = readiness(self.server.status())
            self._json(HTTPStatus.OK if state.ready else HTTPStatus.SERVICE_UNAVAILABLE, asdict(state))
        else:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no such path {path!r}: /metrics, /healthz, /readyz"})

    def _json(self, code: HTTPStatus, body: dict[str, Any]) -> None:
        self._send(code, json.dumps(body).encode() + b"\n", "application/json")

    def _send(self, code: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and probes come every few seconds: not logged."""


class HttpEndpoints:
    """The HTTP port of a node; built without a thread, `start()` binds and serves."""

    def __init__(self, address: tuple[str, int], status: Callable[[], ConsensusStatus]) -> None:
        self._address = address
        self._status = status
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        """Binds (OSError if it cannot) and starts `kq-http`; returns the bound port."""
        self._server = _Server(self._address, self._status)
        self._server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(HTTP_STOP_POLL_S,), name="kq-http", daemon=True
        )
        self._thread.start()
        return int(self._server.server_address[1])

    def stop(self) -> None:
        """Stops accepting, closes the socket and joins `kq-http` (requests in flight end on their own)."""
        if self._server is None or self._thread is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
