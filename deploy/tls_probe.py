"""Proof that a secure `LocalCluster` speaks TLS only: plain-text clients refused, TLS clients served.

A run that claims to measure or torture kq "with TLS" must fail when TLS is silently off (a flag lost
on the way to the nodes, a client that fell back to plain text). Working TLS clients alone prove
little: they show the nodes speak TLS, not that nothing else gets in. So every node endpoint is
probed both ways:

- gRPC: a plain-text `KqClient` asking for the node's status must fail (mutual TLS refuses it).
- Kafka: a Kafka ApiVersions request in plain text must get no Kafka answer; the same request over
  TLS with the harness's client certificate (`admin`) must get one.

`plain_text_problems` returns what failed, one line per endpoint, so the caller decides how loud
to be (chaos reports an anomaly, the benchmark stops).
"""

from __future__ import annotations

import socket
import ssl
import struct
from pathlib import Path

from kq.client import KqClient, KqClientError
from kq.deploy.cluster import LocalCluster

# A refused plain-text gRPC call fails at once on loopback (the TLS handshake breaks); the client's
# retries are bounded by this, so a probe of one node costs about this much.
GRPC_PROBE_TIMEOUT_S = 1.0
KAFKA_PROBE_TIMEOUT_S = 2.0  # Connect, send, read an answer on loopback: milliseconds when served.
KAFKA_ANSWER_BYTES_MAX = 64 * 1024  # ApiVersions' answer is a few hundred bytes.
API_VERSIONS_KEY = 18
API_VERSIONS_VERSION = 0  # Every Kafka broker answers v0, whatever it supports.
PROBE_CORRELATION_ID = 0x6B710001  # "kq" and 1: recognisable in a packet capture.
PROBE_CLIENT_ID = b"kq-tls-probe"


def plain_text_problems(cluster: LocalCluster) -> list[str]:
    """What shows that the running nodes of `cluster` do not speak TLS only; empty when they do.

    The cluster must have been made with `tls_dir` (its `tls_dir` holds the CA and `admin`'s
    certificate); nodes not running are skipped."""
    assert cluster.tls_dir is not None, "a cluster without tls_dir serves plain text by design"
    problems: list[str] = []
    context = client_ssl_context(cluster.tls_dir)
    for node_id, spec in cluster.nodes.items():
        if not cluster.running(node_id):
            continue
        if grpc_answers_plain_text(spec.grpc_address):
            problems.append(f"node {node_id} answered a plain-text gRPC client at {spec.grpc_address}")
        if not spec.kafka_address:
            continue
        if kafka_answers(spec.kafka_address, None):
            problems.append(f"node {node_id} answered a plain-text Kafka client at {spec.kafka_address}")
        if not kafka_answers(spec.kafka_address, context):
            problems.append(f"node {node_id} did not answer a TLS Kafka client at {spec.kafka_address}")
    return problems


def grpc_answers_plain_text(address: str) -> bool:
    """Whether the node at `address` answers ClusterStatus from a client without TLS."""
    with KqClient(
        [address], retry_timeout_s=GRPC_PROBE_TIMEOUT_S, rpc_timeout_s=GRPC_PROBE_TIMEOUT_S
    ) as client:
        try:
            client.node_status(address)
        except KqClientError:
            return False
    return True


def client_ssl_context(tls_dir: Path) -> ssl.SSLContext:
    """A TLS client context as the harness's Kafka clients use: the cluster's CA, `admin`'s certificate,
    the node's address checked against its certificate's names."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(tls_dir / "ca.pem"))
    context.load_cert_chain(str(tls_dir / "admin.pem"), str(tls_dir / "admin-key.pem"))
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def api_versions_request() -> bytes:
    """A Kafka ApiVersions v0 request (header v1: key, version, correlation id, client id; no body)."""
    body = struct.pack(
        ">hhih", API_VERSIONS_KEY, API_VERSIONS_VERSION, PROBE_CORRELATION_ID, len(PROBE_CLIENT_ID)
    )
    body += PROBE_CLIENT_ID
    return struct.pack(">i", len(body)) + body


def is_api_versions_answer(data: bytes) -> bool:
    """Whether `data` starts a Kafka answer to `api_versions_request` (its size, then our correlation id).
    A TLS listener given plain text sends nothing, or a TLS alert (0x15 ...), never this."""
    if len(data) < 8:
        return False
    size, correlation_id = (int(value) for value in struct.unpack(">ii", data[:8]))
    return 0 < size <= KAFKA_ANSWER_BYTES_MAX and correlation_id == PROBE_CORRELATION_ID


def kafka_answers(address: str, context: ssl.SSLContext | None) -> bool:
    """Whether the Kafka listener at `address` answers ApiVersions: in plain text (`context` None) or
    over TLS with `context`. A refused connection or handshake, or a close, is no answer."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=KAFKA_PROBE_TIMEOUT_S) as raw:
            if context is None:
                return _ask(raw)
            with context.wrap_socket(raw, server_hostname=host) as wrapped:
                return _ask(wrapped)
    except (OSError, ssl.SSLError):  # ssl.SSLError is an OSError; named for the reader.
        return False


def _ask(connection: socket.socket) -> bool:
    """Sends the request and reads until the answer's first 8 bytes, a close, or the timeout."""
    connection.sendall(api_versions_request())
    data = b""
    while len(data) < 8:
        chunk = connection.recv(KAFKA_ANSWER_BYTES_MAX)
        if not chunk:
            break
        data += chunk
    return is_api_versions_answer(data)
