"""kq's Raft transport: PySyncObj's peer messages over TCP (mutual TLS when the node has TLS), as
length-prefixed protobuf frames (raft/wire.py), after a handshake that authenticates both sides.

It replaces PySyncObj's TCPTransport, which sent every message as a pickle (zlib-compressed and
encrypted with the cluster password through Fernet) and unpickled whatever a peer sent: anyone with
the password, or a bug in that path, ran code on every node. Here no network byte is unpickled.

Connection life (one `PeerConnection`, on PySyncObj's poller, so on the `kq-raft-tick` thread):

1. TCP. The node with the greater Raft address dials (as PySyncObj's transport did); the other
   accepts. At most RAFT_PENDING_CONNECTIONS_MAX accepted connections may be unauthenticated at once.
2. TLS, when configured (`RaftTls`): TLS 1.3 both ways; each side presents its node certificate and
   requires the peer's to chain to the cluster CA and to have a subject CN starting "kq node ".
   Host names are not checked: the CA and the CN prefix say "a node of this cluster".
3. Hello: each side sends its version, its Raft address and RAFT_NONCE_BYTES random bytes. The
   dialer checks that the address is the one it dialed; the acceptor that it is a voter or a guest
   (below) that dials it.
4. Proof: each side sends HMAC-SHA256(cluster password, role, both nonces, both addresses) and checks
   the other's: both know the password, and a proof cannot be replayed (fresh nonces) or reflected
   (the role). With TLS this is a second factor; without it, it is what keeps a random local process
   from injecting messages. A connection not through these steps in RAFT_HANDSHAKE_TIMEOUT_S closes.
5. Open: frames carry PySyncObj messages until either side closes, a frame fails to decode (the
   connection is dropped, with one rate-limited line), or nothing was read for `connection_timeout_s`.

Guests. A node's voters are what its own log says. A node restarted after it missed the entry that
added node X (it was down meanwhile) does not know X; if X leads now, neither side would connect (X's
dial refused, or no dial at all), and the node would never hear the leader whose entries name X.
So the nodes of `--peers` that are not voters in this node's log are guests: dialed and accepted by
the same rule as voters, their messages handed to PySyncObj (which takes AppendEntries from any
node: Raft's rule is the term, not the sender's membership), at most PEERS_MAX of them. Once the log
makes one a voter its connection carries on as a voter's (nodes compare by address).

PySyncObj's utility messages (`syncobj_admin`: status, add, remove, ...) have no form on this wire: a
utility connection fails its handshake and is closed. kq changes membership through its own RPCs.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import logging
import os
import socket
import ssl
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.transport import Transport, TransportNotReadyError

from kq.proto import raft_pb2
from kq.proto.limits import (
    RAFT_BAD_PEER_LOG_S,
    RAFT_FRAME_BYTES_MAX,
    RAFT_HANDSHAKE_FRAME_BYTES_MAX,
    RAFT_HANDSHAKE_TIMEOUT_S,
    RAFT_NONCE_BYTES,
    RAFT_PENDING_CONNECTIONS_MAX,
    RAFT_RECEIVE_BYTES,
    RAFT_RECEIVE_LARGE_BYTES_MIN,
    RAFT_SEND_BUFFER_BYTES_MAX,
    RAFT_SEND_BYTES,
    RAFT_SEND_PIECE_BYTES_MIN,
    RAFT_SEND_PIECES_MAX,
)
from kq.raft.validation import address_problem
from kq.raft.wire import (
    EntryNotRepresentableError,
    Message,
    WireError,
    decode_message,
    encode_message,
    encode_message_parts,
    parse_frame,
)

logger = logging.getLogger(__name__)

RAFT_WIRE_VERSION = 1
NODE_CN_PREFIX = "kq node "  # kq/deploy/certs.py names node certificates "kq node <id>".
_LENGTH = struct.Struct(">I")
_DIALER, _ACCEPTOR = b"dialer", b"acceptor"
_READ, _WRITE, _ERROR = POLL_EVENT_TYPE.READ, POLL_EVENT_TYPE.WRITE, POLL_EVENT_TYPE.ERROR


@dataclass(frozen=True, slots=True)
class RaftTls:
    """The node's certificate and key and the cluster CA (PEM files): mutual TLS between nodes."""

    cert: Path
    key: Path
    ca: Path


@dataclass(frozen=True, slots=True)
class TransportSettings:
    """What the transport needs of the node's configuration (PySyncObj's conf, read by the adapter)."""

    bind_address: str  # host:port
    password: str = field(repr=False)  # The cluster secret: the handshake's HMAC key.
    tls: RaftTls | None
    connection_timeout_s: float
    connection_retry_s: float
    bind_retry_s: float
    bind_attempts_max: int
    socket_buffer_bytes: int
    # The nodes of `--peers`: while one is not a voter in this node's log it is a guest (module
    # docstring), connected as a voter would be, so that a node restarted behind a membership change
    # hears a leader it does not know yet.
    guests: tuple[str, ...] = ()
    # A peer that may stay silent past the connection timeout: a follower restoring the store copy
    # it was just sent (raft/snapshot.py `restoring`) sends nothing until the restore ends (a second
    # for 300 MB), and closing its connection then cost it the copy and a second one.
    may_be_silent: Callable[[Any], bool] = field(default=lambda node: False)


def tls_contexts(tls: RaftTls) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(acceptor's, dialer's) TLS 1.3 contexts: the node certificate, the cluster CA, peer certs required."""
    contexts = []
    for protocol in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
        context = ssl.SSLContext(protocol)
        context.minimum_version = ssl.TLSVersion.TLSv1_3  # Every peer is a kq node: no older protocol.
        context.check_hostname = False  # Identity is the cluster CA plus the CN prefix (module docstring).
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_cert_chain(str(tls.cert), str(tls.key))
        context.load_verify_locations(cafile=str(tls.ca))
        contexts.append(context)
    return contexts[0], contexts[1]


def peer_common_name(certificate: dict[str, Any] | None) -> str | None:
    """The subject CN of a verified peer certificate (`SSLSocket.getpeercert()`), if it has one."""
    for attributes in (certificate or {}).get("subject", ()):
        for key, value in attributes:
            if key == "commonName":
                return str(value)
    return None


def proof_mac(password: str, role: bytes, own_nonce: bytes, peer_nonce: bytes, own: str, peer: str) -> bytes:
    """The handshake proof one side sends: an HMAC of everything the handshake exchanged, and its role."""
    transcript = b"kq raft proof v1\0" + role + b"\0" + own_nonce + peer_nonce
    for address in (own, peer):
        encoded = address.encode()
        transcript += _LENGTH.pack(len(encoded)) + encoded
    return hmac.new(password.encode(), transcript, hashlib.sha256).digest()


class RateLimitedLog:
    """One line per reason per RAFT_BAD_PEER_LOG_S (reasons are a fixed set of strings)."""

    def __init__(self) -> None:
        self._last_s: dict[str, float] = {}

    def warning(self, reason: str, message: str, *args: object) -> None:
        self._log(logging.WARNING, reason, message, *args)

    def error(self, reason: str, message: str, *args: object) -> None:
        self._log(logging.ERROR, reason, message, *args)

    def _log(self, level: int, reason: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last_s.get(reason, -RAFT_BAD_PEER_LOG_S) >= RAFT_BAD_PEER_LOG_S:
            self._last_s[reason] = now
            logger.log(level, message, *args)


class _State:
    CONNECTING, TLS, HELLO, PROOF, OPEN, CLOSED = range(6)


class PeerConnection:
    """One connection to a peer, through the handshake, then framed messages. Tick thread only."""

    def __init__(
        self,
        transport: RaftTransport,
        sock: socket.socket,
        dialed: Any | None,
        peer_name: str,
    ) -> None:
        """`dialed`: the node this side dialed (None: an accepted connection); `sock` is non-blocking
        (connecting when dialed)."""
        self._transport = transport
        self._sock: socket.socket | ssl.SSLSocket = sock
        self._fileno = sock.fileno()
        self.node: Any | None = dialed  # Known at once when dialed; after the Hello when accepted.
        self._dialed = dialed is not None
        self.peer_name = peer_name  # For log lines: the dialed address, or the accepted socket's peer.
        self.state = _State.CONNECTING if self._dialed else _State.TLS
        self.started_s = time.monotonic()
        self.last_read_s = self.started_s
        self._in = bytearray()
        self._large: memoryview | None = None  # A large frame being received straight into its buffer.
        self._large_filled = 0
        self._large_buffer = bytearray()  # Where large frames are received (`_large_frame`).
        self._out: deque[memoryview] = deque()  # Frames' pieces the socket has not taken yet, in order.
        self._out_bytes = 0
        self._nonce = os.urandom(RAFT_NONCE_BYTES)
        self._peer_nonce = b""
        self._peer_address = ""
        self._tls_wants_write = False
        self._mask = 0
        self._subscribe(_READ | _WRITE | _ERROR)
        if not self._dialed:
            self._secure()

    @property
    def is_open(self) -> bool:
        return self.state == _State.OPEN

    # Poller events ------------------------------------------------------------------------------

    def on_event(self, descriptor: int, event: int) -> None:
        """PySyncObj's poller callback for this socket."""
        if descriptor != self._fileno or self.state == _State.CLOSED:
            return
        if event & _ERROR:
            self.close("socket error", quiet=True)
            return
        if self.state == _State.CONNECTING:
            if self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.close("connection refused", quiet=True)
                return
            self._secure()
        if self.state == _State.TLS:
            self._tls_handshake()
            if self.state in (_State.TLS, _State.CLOSED):
                return
        self._flush()
        if self.state != _State.CLOSED:
            self._read()
        self._resubscribe()

    def _secure(self) -> None:
        """After TCP: TLS if configured, else the Hello at once."""
        context = self._transport.tls_context(server_side=not self._dialed)
        if context is None:
            self._send_hello()
            return
        self.state = _State.TLS
        assert not isinstance(self._sock, ssl.SSLSocket)
        self._sock = context.wrap_socket(
            self._sock, server_side=not self._dialed, do_handshake_on_connect=False
        )
        self._tls_handshake()

    def _tls_handshake(self) -> None:
        try:
            self._sock.do_handshake()  # type: ignore[union-attr]  # An SSLSocket in this state.
        except ssl.SSLWantReadError:
            self._subscribe(_READ | _ERROR)
            return
        except ssl.SSLWantWriteError:
            self._subscribe(_READ | _WRITE | _ERROR)
            return
        except (ssl.SSLError, OSError) as error:
            self.close(f"TLS handshake failed: {error}", reason="tls")
            return
        common_name = peer_common_name(self._sock.getpeercert())  # type: ignore[union-attr]
        if common_name is None or not common_name.startswith(NODE_CN_PREFIX):
            self.close(f"peer certificate CN {common_name!r} is not a kq node's", reason="tls")
            return
        self._send_hello()

    # Handshake -----------------------------------------------------------------------------------

    def _send_hello(self) -> None:
        self.state = _State.HELLO
        frame = raft_pb2.RaftFrame()
        frame.hello.version = RAFT_WIRE_VERSION
        frame.hello.address = self._transport.self_address
        frame.hello.nonce = self._nonce
        self.send_frame(frame.SerializeToString())

    def _on_hello(self, data: bytes) -> None:
        frame = parse_frame(data)
        if frame.WhichOneof("message") != "hello":
            raise WireError("the first frame is not a Hello")
        hello = frame.hello
        if hello.version != RAFT_WIRE_VERSION:
            raise WireError(f"wire version {hello.version}, this node speaks {RAFT_WIRE_VERSION}")
        if len(hello.nonce) != RAFT_NONCE_BYTES:
            raise WireError("a Hello without a proper nonce")
        problem = address_problem(hello.address, "a peer's Raft address")
        if problem is not None:
            raise WireError(problem)
        if self._dialed:
            if hello.address != self.node.address:  # type: ignore[union-attr]
                raise WireError(f"dialed {self.peer_name} but the peer says it is {hello.address}")
        elif not self._transport.accepts_from(hello.address):
            raise WireError(f"{hello.address} is not a voter that dials this node")
        self._peer_nonce, self._peer_address = bytes(hello.nonce), hello.address
        proof = raft_pb2.RaftFrame()
        proof.proof.mac = self._mac(own=True)
        self.state = _State.PROOF
        self.send_frame(proof.SerializeToString())

    def _mac(self, own: bool) -> bytes:
        """This side's proof (`own`), or the one expected from the peer."""
        own_role, peer_role = (_DIALER, _ACCEPTOR) if self._dialed else (_ACCEPTOR, _DIALER)
        self_address = self._transport.self_address
        if own:
            return proof_mac(
                self._transport.password,
                own_role,
                self._nonce,
                self._peer_nonce,
                self_address,
                self._peer_address,
            )
        return proof_mac(
            self._transport.password,
            peer_role,
            self._peer_nonce,
            self._nonce,
            self._peer_address,
            self_address,
        )

    def _on_proof(self, data: bytes) -> None:
        frame = parse_frame(data)
        if frame.WhichOneof("message") != "proof":
            raise WireError("the second frame is not a Proof")
        if not hmac.compare_digest(frame.proof.mac, self._mac(own=False)):
            raise WireError("wrong password proof (another cluster's secret?)")
        self.state = _State.OPEN
        self._transport.on_open(self, self._peer_address)

    # Bytes -----------------------------------------------------------------------------------------

    @property
    def queued_bytes(self) -> int:
        """Bytes queued that the socket has not taken yet."""
        return self._out_bytes

    def send_frame(self, payload: bytes | Sequence[bytes | memoryview]) -> None:
        """Queues one frame, whole or in pieces (raft/wire.py `encode_message_parts`), and sends what
        the socket takes now. A piece of RAFT_SEND_PIECE_BYTES_MIN or more is queued as it is (the
        socket copies it from there: an entry's batches are not copied here); smaller ones are joined
        with the length prefix, so a frame goes out in as few pieces as it has large ones."""
        if self.state == _State.CLOSED:
            return
        parts = (payload,) if isinstance(payload, bytes) else payload
        small: list[bytes | memoryview] = [_LENGTH.pack(sum(len(part) for part in parts))]
        for part in parts:
            if len(part) < RAFT_SEND_PIECE_BYTES_MIN:
                small.append(part)
                continue
            self._queue(b"".join(small))
            small = []
            self._queue(part)
        self._queue(b"".join(small))
        if self._out_bytes > RAFT_SEND_BUFFER_BYTES_MAX:
            self.close(f"more than {RAFT_SEND_BUFFER_BYTES_MAX} bytes queued for it", reason="backlog")
            return
        self._flush()
        self._resubscribe()

    def _queue(self, piece: bytes | memoryview) -> None:
        if piece:
            self._out.append(memoryview(piece))
            self._out_bytes += len(piece)

    def _flush(self) -> None:
        if self.state in (_State.CONNECTING, _State.TLS):
            return
        self._tls_wants_write = False
        while self._out:
            failure: BaseException | None = None
            sent = 0
            try:
                sent = self._send_some()
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                pass  # The socket is full (or TLS needs to read first): the next event resumes.
            except (ssl.SSLError, OSError) as error:
                failure = error
            if failure is not None:
                self.close(f"send failed: {failure}", quiet=_is_reset(failure))
                return
            if sent <= 0:
                return
            self._out_bytes -= sent
            while sent:
                first = self._out[0]
                if sent < len(first):
                    self._out[0] = first[sent:]
                    break
                sent -= len(first)
                self._out.popleft()

    def _send_some(self) -> int:
        """One send of at most RAFT_SEND_BYTES from the queue's front: plain sockets take up to
        RAFT_SEND_PIECES_MAX pieces in one `sendmsg` (no join), TLS sockets one piece at a time."""
        if len(self._out) == 1 or isinstance(self._sock, ssl.SSLSocket):
            return self._sock.send(self._out[0][:RAFT_SEND_BYTES])
        pieces: list[memoryview] = []
        room = RAFT_SEND_BYTES
        for piece in self._out:
            pieces.append(piece[:room])
            room -= len(pieces[-1])
            if room <= 0 or len(pieces) >= RAFT_SEND_PIECES_MAX:
                break
        return self._sock.sendmsg(pieces)

    def _read(self) -> None:
        # A plain socket that gave less than asked for is empty: the next recv would only say so (a
        # system call a wake-up, ~2 µs here); the loop's poll, level-triggered, calls again when more
        # comes. A TLS socket may hold decrypted bytes the poll does not see: read until it says none.
        plain = not isinstance(self._sock, ssl.SSLSocket)
        while self.state not in (_State.CLOSED, _State.CONNECTING, _State.TLS):
            large = self._large
            try:
                if large is None:
                    requested = RAFT_RECEIVE_BYTES
                    data = self._sock.recv(requested)
                    received = len(data)
                else:
                    end = min(len(large), self._large_filled + RAFT_RECEIVE_BYTES)
                    requested = end - self._large_filled
                    received = self._sock.recv_into(large[self._large_filled : end])
            except (BlockingIOError, ssl.SSLWantReadError):
                return
            except ssl.SSLWantWriteError:
                self._tls_wants_write = True
                return
            except (ssl.SSLError, OSError) as error:
                self.close(f"receive failed: {error}", quiet=_is_reset(error))
                return
            if not received:
                self.close("the peer closed the connection", quiet=True)
                return
            self.last_read_s = time.monotonic()
            if large is None:
                self._deliver(data)
            else:
                self._large_filled += received
                if self._large_filled == len(large):
                    self._large = None
                    self._on_frame(large)  # Decoding copies out what it keeps: the buffer is free again.
            if plain and received < requested:
                return

    def _deliver(self, data: bytes) -> None:
        """Hands every whole frame in what was buffered and `data` to the handshake or to PySyncObj, in
        order, and keeps the rest. Frames are copied out of `data` itself when nothing was buffered
        before it (no gathering copy). A frame of RAFT_RECEIVE_LARGE_BYTES_MIN or more that has not
        all arrived is read on straight into this connection's large-frame buffer (`_large`, reused:
        no fresh pages to zero and fault in for every frame)."""
        if self._in:
            self._in += data
        source = self._in if self._in else data
        position = 0
        with memoryview(source) as view:
            while self.state != _State.CLOSED and len(view) - position >= _LENGTH.size:
                (length,) = _LENGTH.unpack_from(view, position)
                is_open = self.state == _State.OPEN
                length_max = RAFT_FRAME_BYTES_MAX if is_open else RAFT_HANDSHAKE_FRAME_BYTES_MAX
                if length > length_max:
                    self.close(f"a frame of {length} bytes exceeds {length_max}", reason="frame")
                    return
                start = position + _LENGTH.size
                if len(view) - start < length:
                    if is_open and length >= RAFT_RECEIVE_LARGE_BYTES_MIN:
                        self._large = self._large_frame(length)
                        self._large_filled = len(view) - start
                        self._large[: self._large_filled] = view[start:]
                        position = len(view)
                    break
                frame = bytes(view[start : start + length])  # One copy.
                position = start + length
                self._on_frame(frame)
        if self.state == _State.CLOSED:
            return
        if source is self._in:
            del self._in[:position]
        elif position < len(data):
            self._in += memoryview(data)[position:]

    def _large_frame(self, length: int) -> memoryview:
        """A writable view of `length` bytes of this connection's large-frame buffer (grown as needed,
        at most RAFT_FRAME_BYTES_MAX: the frame limit, checked before)."""
        if len(self._large_buffer) < length:
            self._large_buffer = bytearray(length)
        return memoryview(self._large_buffer)[:length]

    def _on_frame(self, data: bytes | memoryview) -> None:
        """One whole frame: to the handshake, or decoded to PySyncObj; a bad one closes the connection."""
        try:
            if self.state == _State.HELLO:
                self._on_hello(bytes(data))
            elif self.state == _State.PROOF:
                self._on_proof(bytes(data))
            else:
                message = decode_message(data, self._transport.node_of)
                self._transport.on_message(self, message)
        except WireError as error:
            self.close(f"refused: {error}", reason="frame")

    # Poller subscription and closing ------------------------------------------------------------

    def _subscribe(self, mask: int) -> None:
        if mask != self._mask and self.state != _State.CLOSED:
            self._mask = mask
            self._transport.poller.subscribe(self._fileno, self.on_event, mask)

    def _resubscribe(self) -> None:
        if self.state in (_State.CLOSED, _State.TLS):
            return
        wants_write = self._out_bytes > 0 or self._tls_wants_write or self.state == _State.CONNECTING
        self._subscribe(_READ | _ERROR | (_WRITE if wants_write else 0))

    def close(self, why: str, reason: str = "", quiet: bool = False) -> None:
        """Closes the socket (once) and tells the transport; `reason` rate-limits a WARNING line."""
        if self.state == _State.CLOSED:
            return
        was_open = self.state == _State.OPEN
        self.state = _State.CLOSED
        if not quiet:
            self._transport.bad_peer_log.warning(
                reason or "closed", "Raft connection with %s closed: %s", self.peer_name, why
            )
        self._transport.poller.unsubscribe(self._fileno)
        with contextlib.suppress(OSError):
            self._sock.close()
        self._in = bytearray()
        self._large = None
        self._large_buffer = bytearray()
        self._out.clear()
        self._out_bytes = 0
        self._transport.on_closed(self, was_open)


def _is_reset(error: BaseException) -> bool:
    """A peer going away (restart, kill): not worth a warning."""
    return isinstance(error, OSError) and error.errno in (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED)


class RaftTransport(Transport):  # type: ignore[misc]  # PySyncObj ships no type hints.
    """PySyncObj's `Transport` interface over `PeerConnection`s; built by the adapter (transportClass).

    PySyncObj calls `addNode`, `dropNode`, `send`, `destroy`, `tryGetReady`, `ready` and `waitReady`,
    and sets the callbacks (the base class stores them; `_onMessageReceived`, `_onNodeConnected` and
    `_onNodeDisconnected` are its helpers for subclasses). Everything runs on the tick thread."""

    def __init__(
        self,
        self_node: Any,
        other_nodes: Any,
        poller: Any,
        add_tick_callback: Callable[[Callable[[], None]], None],
        settings: TransportSettings,
        node_class: Callable[[str], Any],
    ) -> None:
        super().__init__(None, self_node, other_nodes)
        self.poller = poller
        self.password = settings.password
        self.self_address: str = self_node.address
        self.bad_peer_log = RateLimitedLog()
        self._settings = settings
        self._node_class = node_class
        self._tls = tls_contexts(settings.tls) if settings.tls is not None else None
        self._nodes: dict[str, Any] = {}  # Raft address -> PySyncObj node.
        self._guest_addresses = frozenset(settings.guests) - {self_node.address}  # --peers: guests.
        self._guests: dict[str, Any] = {}  # Raft address -> node object of a guest (not a voter).
        self._connections: dict[Any, PeerConnection] = {}  # By node: dialing, or authenticated.
        self._pending: set[PeerConnection] = set()  # Accepted, not yet authenticated.
        self._last_dial_s: dict[Any, float] = {}
        # The last AppendEntries with entries encoded, and its frame: PySyncObj sends each follower
        # the same message in turn, and an entry's encoding copies its bytes about ten times.
        self._last_append: tuple[Message, list[bytes | memoryview]] | None = None
        self._server: socket.socket | None = None
        self._bind_attempts = 0
        self._ready = False
        for node in other_nodes:
            self.addNode(node)
        add_tick_callback(self._on_tick)

    # PySyncObj's Transport interface ----------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready

    def tryGetReady(self) -> None:  # noqa: N802 - PySyncObj's name.
        """Binds the Raft port; after `bind_attempts_max` failures TransportNotReadyError (PySyncObj's
        constructor loops on this until ready, so the wait between attempts is here)."""
        if self._ready:
            return
        try:
            self._bind()
        except OSError as error:
            self._bind_attempts += 1
            if self._bind_attempts >= self._settings.bind_attempts_max:
                raise TransportNotReadyError from error
            time.sleep(self._settings.bind_retry_s)
            return
        self._ready = True

    def waitReady(self) -> None:  # noqa: N802 - PySyncObj's name.
        if not self._ready:
            raise TransportNotReadyError

    def addNode(self, node: Any) -> None:  # noqa: N802 - PySyncObj's name.
        self._nodes[node.address] = node
        self._guests.pop(node.address, None)  # Its connection, if any, is keyed by an equal node.

    def dropNode(self, node: Any) -> None:  # noqa: N802 - PySyncObj's name.
        self._nodes.pop(node.address, None)
        self._last_dial_s.pop(node, None)
        connection = self._connections.pop(node, None)
        if connection is not None:
            connection.close("the node left the cluster", quiet=True)

    def queued_bytes(self, node: Any) -> int:
        """Bytes queued for `node` that its socket has not taken yet (0 without an open connection)."""
        connection = self._connections.get(node)
        return 0 if connection is None else connection.queued_bytes

    def send(self, node: Any, message: Any) -> bool:
        connection = self._connections.get(node)
        if connection is None or not connection.is_open:
            return False
        try:
            payload = self._encoded(message)
        except EntryNotRepresentableError as error:  # A bug: loud (ERROR), and the message is not sent.
            self.bad_peer_log.error(
                "unrepresentable", "cannot send a %s message to %s: %s", message.get("type"), node, error
            )
            return False
        connection.send_frame(payload)
        return connection.is_open

    def _encoded(self, message: Message) -> bytes | list[bytes | memoryview]:
        """`encode_message(message)`, an AppendEntries with entries in pieces (`encode_message_parts`:
        its batches not copied), from the last AppendEntries when `message` equals it (a pure function
        of the message; comparing finds the very entry tuples of PySyncObj's log at once)."""
        if message.get("type") != "append_entries" or not message.get("entries"):
            return encode_message(message)
        last = self._last_append
        if last is not None and last[0] == message:
            return last[1]
        parts = encode_message_parts(message)
        self._last_append = (message, parts)
        return parts

    def destroy(self) -> None:
        self._last_append = None
        self.setOnMessageReceivedCallback(None)
        self.setOnNodeConnectedCallback(None)
        self.setOnNodeDisconnectedCallback(None)
        for connection in [*self._connections.values(), *self._pending]:
            connection.close("the node is stopping", quiet=True)
        self._connections.clear()
        self._pending.clear()
        if self._server is not None:
            self.poller.unsubscribe(self._server.fileno())
            self._server.close()
            self._server = None

    # For PeerConnection -----------------------------------------------------------------------------

    def tls_context(self, server_side: bool) -> ssl.SSLContext | None:
        if self._tls is None:
            return None
        return self._tls[0] if server_side else self._tls[1]

    def accepts_from(self, address: str) -> bool:
        """Whether a voter or guest at `address` may connect to this node (it dials nodes of smaller
        address)."""
        return (address in self._nodes or address in self._guest_addresses) and address > self.self_address

    def _guest(self, address: str) -> Any:
        """The node object of a guest (created on first use), or None: `address` is no guest."""
        if address not in self._guest_addresses or address in self._nodes:
            return None
        node = self._guests.get(address)
        if node is None:
            node = self._guests[address] = self._node_class(address)
        return node

    def node_of(self, address: str) -> Any:
        """PySyncObj's node object for a Raft address (a snapshot header's voters)."""
        return self._node_class(address)

    def on_open(self, connection: PeerConnection, address: str) -> None:
        if connection.node is None:  # Accepted: now it is known who it is.
            self._pending.discard(connection)
            node = self._nodes.get(address) or self._guest(address)
            if node is None:  # Dropped from the cluster during the handshake.
                connection.close("not a voter any more", quiet=True)
                return
            previous = self._connections.get(node)
            connection.node = node
            self._connections[node] = connection
            if previous is not None:  # The peer restarted: its new connection replaces the old.
                previous.close("replaced by a new connection", quiet=True)
        self._onNodeConnected(connection.node)

    def on_message(self, connection: PeerConnection, message: dict[str, Any]) -> None:
        self._onMessageReceived(connection.node, message)

    def on_closed(self, connection: PeerConnection, was_open: bool) -> None:
        self._pending.discard(connection)
        node = connection.node
        if node is not None and self._connections.get(node) is connection:
            del self._connections[node]  # A node this side dials is dialed again after the retry time.
            if was_open:
                self._onNodeDisconnected(node)

    # The tick: bind, accept, dial, time out -----------------------------------------------------------

    def _bind(self) -> None:
        host, port = self._settings.bind_address.rsplit(":", 1)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        server = socket.socket(family, socket.SOCK_STREAM)
        try:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._settings.socket_buffer_bytes)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._settings.socket_buffer_bytes)
            server.bind((host.strip("[]"), int(port)))
            server.listen(RAFT_PENDING_CONNECTIONS_MAX)
            server.setblocking(False)
        except OSError:
            server.close()
            raise
        self._server = server
        self.poller.subscribe(server.fileno(), self._on_acceptable, _READ | _ERROR)

    def _on_acceptable(self, descriptor: int, event: int) -> None:
        assert self._server is not None
        while True:
            try:
                sock, peer = self._server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # EMFILE and the like: the next readable event retries.
                self.bad_peer_log.warning("accept", "accepting a Raft connection failed: %s", error)
                return
            if len(self._pending) >= RAFT_PENDING_CONNECTIONS_MAX:
                sock.close()
                self.bad_peer_log.warning(
                    "pending", "refused a Raft connection from %s: too many in handshake", peer
                )
                continue
            self._configure(sock)
            connection = PeerConnection(self, sock, None, f"{peer[0]}:{peer[1]}")
            if connection.state != _State.CLOSED:
                self._pending.add(connection)

    def _configure(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._settings.socket_buffer_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._settings.socket_buffer_bytes)

    def _should_dial(self, node: Any) -> bool:
        return bool(self.self_address > node.address)

    def _dial(self, node: Any, now: float) -> None:
        if (
            now - self._last_dial_s.get(node, -self._settings.connection_retry_s)
            < self._settings.connection_retry_s
        ):
            return
        self._last_dial_s[node] = now
        try:
            family = socket.AF_INET6 if ":" in node.ip else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
        except (OSError, TypeError):  # An unresolvable host (node.ip is None): retried later.
            return
        self._configure(sock)
        result = sock.connect_ex((node.ip, node.port))
        if result not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            sock.close()
            return
        self._connections[node] = PeerConnection(self, sock, node, node.address)

    def _on_tick(self) -> None:
        now = time.monotonic()
        guests = [self._guest(address) for address in self._guest_addresses if address not in self._nodes]
        for node in [*self._nodes.values(), *guests]:
            if node not in self._connections and self._should_dial(node):
                self._dial(node, now)
        for connection in [*self._connections.values(), *self._pending]:
            if connection.is_open:
                silent_s = now - connection.last_read_s
                if silent_s > self._settings.connection_timeout_s and not self._settings.may_be_silent(
                    connection.node
                ):
                    connection.close("nothing received within the connection timeout", quiet=True)
            elif now - connection.started_s > RAFT_HANDSHAKE_TIMEOUT_S:
                connection.close(
                    "no handshake within the timeout", reason="handshake", quiet=connection.node is not None
                )
