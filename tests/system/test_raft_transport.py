"""The Raft port of real nodes against hostile peers (raft/transport.py, raft/wire.py): a pickle sent
to it, in PySyncObj's old framing (even encrypted with the cluster password) or inside an entry of
kq's own framing after an honest handshake, executes nothing; a certificate that is not a node
certificate of the cluster's CA is refused at the TLS handshake; and the nodes keep serving."""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import socket
import ssl
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.encryptor import getEncryptor

from kq.client import KqClient
from kq.deploy import certs
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for
from kq.proto import raft_pb2
from kq.raft.transport import RAFT_WIRE_VERSION, proof_mac

pytestmark = pytest.mark.system

SOCKET_TIMEOUT_S = 5.0
_LENGTH = struct.Struct(">I")


class Marker:
    """A pickle whose loading runs a shell command that creates a file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def frame(message: raft_pb2.RaftFrame) -> bytes:
    payload = message.SerializeToString()
    return _LENGTH.pack(len(payload)) + payload


def read_frame(sock: socket.socket) -> raft_pb2.RaftFrame:
    header = receive_exactly(sock, _LENGTH.size)
    result = raft_pb2.RaftFrame()
    result.ParseFromString(receive_exactly(sock, _LENGTH.unpack(header)[0]))
    return result


def receive_exactly(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError("closed by the node")
        data += chunk
    return data


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the node closed the connection (EOF or reset) within the socket timeout."""
    try:
        while sock.recv(65536):
            pass
    except (ConnectionError, ssl.SSLError, OSError):
        return True
    return True  # EOF.


def handshake_as(sock: socket.socket, claimed: str, target: str, secret: str) -> None:
    """Completes the handshake as the voter at `claimed`, dialing the node at `target`."""
    nonce = os.urandom(32)
    sock.sendall(
        frame(
            raft_pb2.RaftFrame(hello=raft_pb2.Hello(version=RAFT_WIRE_VERSION, address=claimed, nonce=nonce))
        )
    )
    hello = read_frame(sock).hello
    assert hello.address == target
    mac = proof_mac(secret, b"dialer", nonce, hello.nonce, claimed, target)
    sock.sendall(frame(raft_pb2.RaftFrame(proof=raft_pb2.Proof(mac=mac))))
    expected = proof_mac(secret, b"acceptor", hello.nonce, nonce, target, claimed)
    assert hmac.compare_digest(read_frame(sock).proof.mac, expected)


def still_serves(cluster: LocalCluster, topic: str) -> None:
    """Produce and consume through the cluster."""
    cluster.wait_ready()
    with KqClient(cluster.bootstrap, tls=cluster.tls) as client:
        client.create_topic(topic, partitions=1)
        client.send(topic, b"still here", partition=0)
        records = client.fetch(topic, 0, 0, wait_ms=5_000).records
    assert [record.value for record in records] == [b"still here"]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("raft-plain") / "cluster") as cluster:
        yield cluster


def test_pickles_sent_to_the_raft_port_execute_nothing(plain: LocalCluster, tmp_path: Path) -> None:
    """Old-style PySyncObj frames (zlib + pickle, and Fernet with the right password) and entries of
    kq's framing carrying the pickle, after a handshake with the right password: no marker file, and
    produce and consume work."""
    plain.wait_ready()
    marker = tmp_path / "MARKER"
    payload = pickle.dumps(Marker(marker), protocol=2)
    specs = sorted(plain.nodes.values(), key=lambda spec: spec.raft_address)
    target, dialer = specs[0], specs[-1]  # The node with the larger address dials the smaller one.
    compressed = zlib.compress(payload, 3)
    encrypted = getEncryptor(plain.secret).encrypt_at_time(compressed, int(time.monotonic()))
    for old_frame in (
        struct.pack("i", len(compressed)) + compressed,
        struct.pack("i", len(encrypted)) + encrypted,
    ):
        with socket.create_connection(host_port(target.raft_address), timeout=SOCKET_TIMEOUT_S) as sock:
            sock.sendall(old_frame)
            assert closed_by_peer(sock)

    entry_with_pickle = raft_pb2.Entry(
        index=2, term=0, regular=raft_pb2.RegularCommand(method_id=0, argument=payload)
    )
    hostile = [
        # An append from an old term (PySyncObj ignores it once decoded) whose entry's argument is the pickle.
        raft_pb2.RaftFrame(
            append_entries=raft_pb2.AppendEntries(term=0, prev_log_index=1, entries=[entry_with_pickle])
        ),
        # A forwarded proposal carrying it (kq refuses forwarded proposals).
        raft_pb2.RaftFrame(apply_command=raft_pb2.ApplyCommand(command=entry_with_pickle, request_id=1)),
        # A store-copy chunk carrying it as data: written to a file, never loaded (no header first).
        raft_pb2.RaftFrame(
            append_entries=raft_pb2.AppendEntries(term=0, chunk=raft_pb2.SnapshotChunk(data=payload))
        ),
    ]
    for message in hostile:
        with socket.create_connection(host_port(target.raft_address), timeout=SOCKET_TIMEOUT_S) as sock:
            handshake_as(sock, dialer.raft_address, target.raft_address, plain.secret)
            sock.sendall(frame(message))
            sock.sendall(_LENGTH.pack(len(payload)) + payload)  # And the raw pickle as a frame: dropped.
            assert closed_by_peer(sock)
    still_serves(plain, "after-pickles")
    assert not marker.exists()
    log = plain.log_path(target.node_id).read_text()
    assert "Raft connection with" in log  # One line per reason per RAFT_BAD_PEER_LOG_S.


def test_a_wrong_password_or_an_unknown_peer_is_refused_at_the_handshake(plain: LocalCluster) -> None:
    """Without the password's proof, or claiming an address that is not a voter dialing it, a peer gets
    no further than the Hello: the node closes the connection."""
    specs = sorted(plain.nodes.values(), key=lambda spec: spec.raft_address)
    target, dialer = specs[0], specs[-1]
    with socket.create_connection(host_port(target.raft_address), timeout=SOCKET_TIMEOUT_S) as sock:
        with pytest.raises((AssertionError, ConnectionError, OSError)):
            handshake_as(sock, dialer.raft_address, target.raft_address, "not the secret")
        assert closed_by_peer(sock)
    with socket.create_connection(host_port(target.raft_address), timeout=SOCKET_TIMEOUT_S) as sock:
        hello = raft_pb2.Hello(version=RAFT_WIRE_VERSION, address="127.0.0.1:1", nonce=os.urandom(32))
        sock.sendall(frame(raft_pb2.RaftFrame(hello=hello)))
        read_frame(sock)  # The node's own Hello; then it closes.
        assert closed_by_peer(sock)
    still_serves(plain, "after-strangers")


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    base = tmp_path_factory.mktemp("raft-tls")
    with LocalCluster(base / "cluster", tls_dir=base / "certs") as cluster:
        yield cluster


def tls_attempt(address: str, cert: Path, key: Path, ca: Path) -> bool:
    """Whether the node at `address` completes TLS with this certificate and answers with its Hello."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    with socket.create_connection(host_port(address), timeout=SOCKET_TIMEOUT_S) as raw:
        try:
            with context.wrap_socket(raw) as sock:
                return read_frame(sock).WhichOneof("message") == "hello"
        except (ssl.SSLError, ConnectionError, OSError):
            return False


def test_the_raft_port_refuses_certificates_that_are_not_the_cluster_s_node_certificates(
    secure: LocalCluster, tmp_path: Path
) -> None:
    """Another CA's node certificate, and the cluster CA's client certificate (CN "admin"), fail the
    handshake; the cluster's own node certificate passes it; plain TCP gets nothing; the nodes serve."""
    assert secure.tls_dir is not None
    secure.wait_ready()
    directory = secure.tls_dir
    other = tmp_path / "other"
    certs.init(other, {"1": ["127.0.0.1"]}, ["admin"], days=1)
    address = next(iter(secure.nodes.values())).raft_address
    ca = directory / "ca.pem"
    assert not tls_attempt(address, other / "node-1.pem", other / "node-1-key.pem", ca)
    assert not tls_attempt(address, directory / "admin.pem", directory / "admin-key.pem", ca)
    assert tls_attempt(address, directory / "node-1.pem", directory / "node-1-key.pem", ca)
    with socket.create_connection(host_port(address), timeout=SOCKET_TIMEOUT_S) as sock:
        sock.sendall(frame(raft_pb2.RaftFrame(hello=raft_pb2.Hello(version=RAFT_WIRE_VERSION))))
        assert closed_by_peer(sock)
    still_serves(secure, "after-certificates")
    leader = secure.wait_ready()
    wait_for(
        lambda: (
            "TLS handshake failed" in secure.log_path(next(iter(secure.nodes))).read_text()
            or "is not a kq node" in secure.log_path(next(iter(secure.nodes))).read_text()
        ),
        "the node logged the refusal",
        10.0,
    )
    assert leader in secure.nodes


def test_nodes_speak_no_pickle_and_no_fernet(plain: LocalCluster) -> None:
    """The first bytes a node sends are its Hello frame: a big-endian length and a protobuf, no Fernet
    token (which starts with version byte 0x80 in base64: 'gAAAAA')."""
    specs = sorted(plain.nodes.values(), key=lambda spec: spec.raft_address)
    with socket.create_connection(host_port(specs[0].raft_address), timeout=SOCKET_TIMEOUT_S) as sock:
        sock.sendall(
            frame(
                raft_pb2.RaftFrame(
                    hello=raft_pb2.Hello(
                        version=RAFT_WIRE_VERSION, address=specs[-1].raft_address, nonce=os.urandom(32)
                    )
                )
            )
        )
        hello = read_frame(sock).hello
    assert hello.version == RAFT_WIRE_VERSION and hello.address == specs[0].raft_address
    assert len(hello.nonce) == 32 and hashlib.sha256(hello.nonce).digest() != b""
