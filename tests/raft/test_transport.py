"""PeerConnection (raft/transport.py) over a socket pair in one thread, driven by PySyncObj's poller:
the password handshake opens both ends and messages flow; a wrong password, a wrong address or a
frame too big for the handshake closes them; a peer reset while sending closes the connection and
tells the transport once (it used to escape as BufferError and leave the connection half closed)."""

from __future__ import annotations

import errno
import logging
import os
import pickle
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.node import TCPNode
from pysyncobj.poller import createPoller

from kq.deploy import certs
from kq.raft.pysyncobj_adapter import entry_command
from kq.raft.transport import (
    PeerConnection,
    RaftTls,
    RaftTransport,
    RateLimitedLog,
    TransportSettings,
    tls_contexts,
)
from kq.raft.wire import encode_message, encode_message_parts

ROUNDS_MAX = 200  # Poller rounds a handshake may take (each returns at once once there is work).


class FakeTransport:
    """What a PeerConnection asks of its transport, recording what it is told."""

    def __init__(self, address: str, password: str, peers: tuple[str, ...], tls: Any = None) -> None:
        self.poller = createPoller("poll")
        self.self_address = address
        self.password = password
        self.bad_peer_log = RateLimitedLog()
        self.peers = peers
        self.tls = tls
        self.opened: list[str] = []
        self.messages: list[dict[str, Any]] = []
        self.closed: list[bool] = []

    def tls_context(self, server_side: bool) -> ssl.SSLContext | None:
        return None if self.tls is None else self.tls[0 if server_side else 1]

    def accepts_from(self, address: str) -> bool:
        return address in self.peers

    def node_of(self, address: str) -> TCPNode:
        return TCPNode(address)

    def on_open(self, connection: PeerConnection, address: str) -> None:
        self.opened.append(address)

    def on_message(self, connection: PeerConnection, message: dict[str, Any]) -> None:
        self.messages.append(message)

    def on_closed(self, connection: PeerConnection, was_open: bool) -> None:
        self.closed.append(was_open)


def pair(
    dialer_password: str = "secret", acceptor_peers: tuple[str, ...] = ("127.0.0.1:2002",), tls: Any = None
) -> tuple[FakeTransport, PeerConnection, FakeTransport, PeerConnection]:
    """A dialer (127.0.0.1:2002) connected to an acceptor (127.0.0.1:2001) over a socket pair."""
    left, right = socket.socketpair()
    for sock in (left, right):
        sock.setblocking(False)
    acceptor = FakeTransport("127.0.0.1:2001", "secret", acceptor_peers, tls)
    dialer = FakeTransport("127.0.0.1:2002", dialer_password, (), tls)
    accepted = PeerConnection(acceptor, left, None, "accepted")  # type: ignore[arg-type]
    dialed = PeerConnection(dialer, right, TCPNode("127.0.0.1:2001"), "127.0.0.1:2001")  # type: ignore[arg-type]
    return acceptor, accepted, dialer, dialed


def pump(transports: tuple[FakeTransport, ...], until: Callable[[], bool]) -> None:
    for _ in range(ROUNDS_MAX):
        if until():
            return
        for transport in transports:
            transport.poller.poll(0.01)
    assert until(), "the connections did not reach the expected state"


def test_the_password_handshake_opens_both_ends_and_messages_flow() -> None:
    """Hello and Proof each way, then a keepalive and a vote reach the other side decoded."""
    acceptor, accepted, dialer, dialed = pair()
    pump((acceptor, dialer), lambda: accepted.is_open and dialed.is_open)
    assert acceptor.opened == ["127.0.0.1:2002"] and dialer.opened == ["127.0.0.1:2001"]
    dialed.send_frame(encode_message({"type": "kq_keepalive"}))
    accepted.send_frame(encode_message({"type": "response_vote", "term": 3}))
    pump((acceptor, dialer), lambda: bool(acceptor.messages and dialer.messages))
    assert acceptor.messages == [{"type": "kq_keepalive"}]
    assert dialer.messages == [{"type": "response_vote", "term": 3}]


def test_a_wrong_password_or_an_unknown_address_closes_the_connection() -> None:
    """The acceptor refuses a proof made with another password, and a dialer it does not know."""
    for password, peers in (("not the secret", ("127.0.0.1:2002",)), ("secret", ("127.0.0.1:9999",))):
        acceptor, accepted, dialer, _dialed = pair(password, peers)
        pump((acceptor, dialer), lambda: bool(acceptor.closed))  # noqa: B023
        assert acceptor.opened == [] and acceptor.closed == [False] and not accepted.is_open


def test_a_big_frame_before_the_handshake_closes_the_connection() -> None:
    """An unauthenticated peer cannot make the node buffer more than a handshake frame."""
    left, right = socket.socketpair()
    left.setblocking(False)
    acceptor = FakeTransport("127.0.0.1:2001", "secret", ("127.0.0.1:2002",))
    accepted = PeerConnection(acceptor, left, None, "accepted")  # type: ignore[arg-type]
    right.sendall((1 << 20).to_bytes(4, "big") + b"x" * 4096)
    pump((acceptor,), lambda: bool(acceptor.closed))
    assert not accepted.is_open
    right.close()


class ResettingSocket:
    """A socket whose send fails as a peer's reset does."""

    def __init__(self, real: socket.socket) -> None:
        self.real = real

    def send(self, data: Any) -> int:
        raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")

    def close(self) -> None:
        self.real.close()


def test_a_reset_while_sending_closes_the_connection_and_tells_the_transport_once() -> None:
    """The send fails with ECONNRESET: the connection closes cleanly and the transport hears it once."""
    acceptor, accepted, dialer, dialed = pair()
    pump((acceptor, dialer), lambda: accepted.is_open and dialed.is_open)
    dialed._sock = ResettingSocket(dialed._sock)  # type: ignore[assignment]
    dialed.send_frame(encode_message({"type": "response_vote", "term": 1}))
    assert not dialed.is_open and dialer.closed == [True]


@pytest.fixture(scope="module")
def cluster_tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    directory: Path = tmp_path_factory.mktemp("certs")
    certs.init(directory, {"1": ["127.0.0.1"]}, ["admin"], days=1)
    return tls_contexts(RaftTls(directory / "node-1.pem", directory / "node-1-key.pem", directory / "ca.pem"))


def test_tls_then_the_handshake_open_both_ends(cluster_tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    """Non-blocking TLS 1.3 on the poller (want-read and want-write handled), then Hello and Proof."""
    acceptor, accepted, dialer, dialed = pair(tls=cluster_tls)
    dialed.on_event(dialed._fileno, 2)  # The dialer's connect completed (writable): it starts TLS.
    pump((acceptor, dialer), lambda: accepted.is_open and dialed.is_open)
    dialed.send_frame(encode_message({"type": "timeout_now", "term": 9}))
    pump((acceptor, dialer), lambda: bool(acceptor.messages))
    assert acceptor.messages == [{"type": "timeout_now", "term": 9}]
    assert isinstance(dialed._sock, ssl.SSLSocket) and dialed._sock.version() == "TLSv1.3"


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_frames_in_pieces_arrive_whole_and_in_order(
    tls: bool, cluster_tls: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    """AppendEntries frames queued as pieces (batches sent from where they are, `sendmsg` on a plain
    socket, piece by piece over TLS), more than the socket takes at once: every frame arrives decoded,
    in order, and nothing stays queued."""
    acceptor, accepted, dialer, dialed = pair(tls=cluster_tls if tls else None)
    if tls:
        dialed.on_event(dialed._fileno, 2)
    pump((acceptor, dialer), lambda: accepted.is_open and dialed.is_open)
    sent = []
    for number in range(12):
        sizes = (9_000, 10, 70_000)
        entries = [(entry_command(0, os.urandom(size)), number * 3 + i, 1) for i, size in enumerate(sizes)]
        message = {"type": "append_entries", "term": 1, "commit_index": number, "entries": entries}
        message |= {"prevLogIdx": number, "prevLogTerm": 1}
        sent.append(message)
        dialed.send_frame(encode_message_parts(message))
    assert dialed.queued_bytes > 0  # The socket pair's buffer took only part of ~950 KB at once.
    pump((acceptor, dialer), lambda: len(acceptor.messages) == len(sent))
    assert [m["entries"] for m in acceptor.messages] == [m["entries"] for m in sent]
    assert dialed.queued_bytes == 0 and dialed.is_open


def open_transport() -> tuple[FakeTransport, FakeTransport, RaftTransport, TCPNode]:
    """The dialer's side of an open pair as a RaftTransport with the acceptor as its one peer."""
    acceptor, accepted, dialer, dialed = pair()
    pump((acceptor, dialer), lambda: accepted.is_open and dialed.is_open)
    settings = TransportSettings("127.0.0.1:2002", "secret", None, 1.5, 0.3, 0.1, 1, 1 << 20)
    peer = TCPNode("127.0.0.1:2001")
    transport = RaftTransport(
        TCPNode("127.0.0.1:2002"), [peer], dialer.poller, lambda callback: None, settings, TCPNode
    )
    transport._connections[peer] = dialed
    return acceptor, dialer, transport, peer


def test_a_message_without_a_wire_form_is_not_sent_and_logged_as_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """RaftTransport.send refuses an entry it cannot encode exactly: False, one ERROR line, nothing sent."""
    acceptor, dialer, transport, peer = open_transport()
    foreign = b"\x00" + pickle.dumps((0, (b"x",)), protocol=2)  # Not kq's canonical call.
    message = {"type": "append_entries", "term": 1, "commit_index": 0, "entries": [(foreign, 2, 1)]}
    with caplog.at_level(logging.ERROR, logger="kq.raft.transport"):
        assert not transport.send(peer, {**message, "prevLogIdx": 1, "prevLogTerm": 1})
        assert transport.send(peer, {"type": "kq_keepalive"})
    assert [record.levelno for record in caplog.records] == [logging.ERROR]
    pump((acceptor, dialer), lambda: bool(acceptor.messages))
    assert acceptor.messages == [{"type": "kq_keepalive"}]
    transport.destroy()


def test_followers_sent_the_same_append_entries_share_one_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """PySyncObj sends each follower an equal AppendEntries in turn: the frame is encoded once, and a
    message that differs in anything (here the commit index) is encoded anew."""
    acceptor, dialer, transport, peer = open_transport()
    encoded: list[dict[str, Any]] = []

    def counting(message: dict[str, Any]) -> list[bytes | memoryview]:
        encoded.append(message)
        return encode_message_parts(message)

    monkeypatch.setattr("kq.raft.transport.encode_message_parts", counting)
    entries = [(entry_command(0, b"x" * 1000), 2, 1)]
    message = {"type": "append_entries", "term": 1, "commit_index": 1, "prevLogIdx": 1, "prevLogTerm": 1}
    sent = [{**message, "entries": list(entries)}, {**message, "entries": list(entries)}]
    sent.append({**sent[0], "commit_index": 2})
    for each in sent:
        assert transport.send(peer, each)
    assert len(encoded) == 2
    pump((acceptor, dialer), lambda: len(acceptor.messages) == 3)
    assert [m["commit_index"] for m in acceptor.messages] == [1, 1, 2]
    assert all(m["entries"] == entries for m in acceptor.messages)
    transport.destroy()


class CountingSocket:
    """A plain socket that counts its recv calls (everything else is the socket's own)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.recvs = 0

    def recv(self, size: int) -> bytes:
        self.recvs += 1
        return self.sock.recv(size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def test_a_short_read_leaves_the_empty_socket_to_the_poll() -> None:
    """A plain socket that gave less than asked for is not read again until the poll says so: one
    recv a frame that arrives whole (the next one would only find nothing); the frame after it still
    arrives, when the poll reports it."""
    acceptor, accepted, dialer, dialed = pair()
    pump((acceptor, dialer), lambda: accepted.is_open and dialed.is_open)
    counting = CountingSocket(accepted._sock)
    accepted._sock = counting  # type: ignore[assignment]
    dialed.send_frame(encode_message({"type": "response_vote", "term": 3}))
    accepted._read()
    assert acceptor.messages == [{"type": "response_vote", "term": 3}] and counting.recvs == 1
    dialed.send_frame(encode_message({"type": "response_vote", "term": 4}))
    pump((acceptor, dialer), lambda: len(acceptor.messages) == 2)
    assert acceptor.messages[-1] == {"type": "response_vote", "term": 4} and counting.recvs == 2
