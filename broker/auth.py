"""Who is calling, and may they: authentication and authorization at the gRPC edge (DESIGN.md, "Security").

A call's principal comes from, in this order:
- the cluster secret (`--secret`): another node's calls (Kafka requests forwarded to the leader, the
  leader's probe of a joining node) carry `kq-node: <id>:<HMAC-SHA256(secret, "kq-node:" + id)>` and
  are the principal "Node:<id>", a super-user;
- a verified client certificate (mutual TLS): its common name, "User:<CN>"; a node certificate
  ("kq node <id>", kq/deploy/certs.py) is "Node:<id>";
- a bearer token (`authorization: Bearer kq_<id>_<secret>`): "User:<the token's user>", while the
  token exists, is unexpired, and its secret's SHA-256 matches the stored one.

With `--auth` a call without any of these is answered UNAUTHENTICATED, and every call is then
checked against the ACLs (raft/auth.py `SecurityState.allowed`) by the requirement its method states
(`REQUIREMENTS`); super-users (`--super-user`, and every node) pass every check. Without `--auth`
nothing is read or checked (no cost on the hot path): every call is User:ANONYMOUS, a super-user.

The users, tokens and ACLs are replicated through Raft (raft/auth.py); `Security` keeps this node's
view of them, rebuilt on the tick thread when a security entry or a store copy is applied, and read
(one reference) by the loop and the workers.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kq.client.security import NODE_METADATA_KEY, SCRAM_SALT_BYTES, node_proof
from kq.proto import kq_pb2
from kq.proto.limits import AUTH_DENIAL_KEYS_MAX, AUTH_DENIAL_LOG_INTERVAL_S, SCRAM_ITERATIONS_MIN
from kq.raft.auth import (
    ANONYMOUS,
    CLUSTER_RESOURCE,
    NODE_PREFIX,
    SCRAM_MECHANISMS,
    TOKEN_ID_PATTERN,
    USER_PREFIX,
    AuthResult,
    SecurityState,
)
from kq.raft.results import ApplyResult
from kq.raft.transport import NODE_CN_PREFIX
from kq.storage import Store

logger = logging.getLogger(__name__)

AUTHORIZATION_METADATA_KEY = "authorization"
TOKEN_PREFIX = "kq_"

TOPIC = kq_pb2.ACL_RESOURCE_TOPIC
GROUP = kq_pb2.ACL_RESOURCE_GROUP
CLUSTER = kq_pb2.ACL_RESOURCE_CLUSTER
TRANSACTIONAL_ID = kq_pb2.ACL_RESOURCE_TRANSACTIONAL_ID
READ = kq_pb2.ACL_OPERATION_READ
WRITE = kq_pb2.ACL_OPERATION_WRITE
CREATE = kq_pb2.ACL_OPERATION_CREATE
DELETE = kq_pb2.ACL_OPERATION_DELETE
ALTER = kq_pb2.ACL_OPERATION_ALTER
DESCRIBE = kq_pb2.ACL_OPERATION_DESCRIBE


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a call is from: "User:<name>", "Node:<id>" or User:ANONYMOUS, and whether it is a super-user."""

    name: str
    super_user: bool

    @property
    def user(self) -> str:
        """The user name of a "User:" principal ("" for a node)."""
        return self.name[len(USER_PREFIX) :] if self.name.startswith(USER_PREFIX) else ""


# The principal of the call in progress: set by the edge (broker/edge.py) on the loop, and carried into
# the worker that runs a blocking handler (the edge runs it in a copy of the loop's context).
CURRENT_PRINCIPAL: contextvars.ContextVar[Principal] = contextvars.ContextVar("kq_principal")


def current_principal() -> Principal:
    """The principal of the call this code runs for (a super-user when no edge set one: tests, tools)."""
    return CURRENT_PRINCIPAL.get(Principal(ANONYMOUS, True))


@dataclass(frozen=True, slots=True)
class Access:
    """One thing a call needs: `operation` on a resource. `alternatives` also satisfy it (CreateTopic:
    CREATE on the topic, or on the cluster)."""

    operation: int
    resource_type: int
    name: str
    alternatives: tuple[Access, ...] = ()

    def describe(self) -> str:
        """The denial's words: "WRITE on topic orders"."""
        operation = kq_pb2.AclOperation.Name(self.operation).removeprefix("ACL_OPERATION_")  # type: ignore[arg-type]
        resource_type = kq_pb2.AclResourceType.Name(self.resource_type)  # type: ignore[arg-type]
        resource = resource_type.removeprefix("ACL_RESOURCE_").lower()
        return f"{operation} on {resource} {self.name}"


def node_metadata(secret: str, node_id: str) -> tuple[tuple[str, str], ...]:
    """Metadata a node's own calls to other nodes carry."""
    return ((NODE_METADATA_KEY, node_proof(secret, node_id)),)


def token_secret_hash(secret: str) -> bytes:
    """What is stored of a token's secret."""
    return hashlib.sha256(secret.encode()).digest()


def parse_token(token: str) -> tuple[str, str] | None:
    """(token id, secret) of "kq_<id>_<secret>", or None when it is not shaped so."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    token_id, _, secret = token[len(TOKEN_PREFIX) :].partition("_")
    if not TOKEN_ID_PATTERN.fullmatch(token_id) or not 0 < len(secret) <= 128:
        return None
    return token_id, secret


class DenialLog:
    """One log line per (principal, resource) denied per interval, remembering a bounded number."""

    def __init__(self, interval_s: float = AUTH_DENIAL_LOG_INTERVAL_S, keys_max: int = AUTH_DENIAL_KEYS_MAX):
        self._interval_s = interval_s
        self._keys_max = keys_max
        self._lock = threading.Lock()
        self._next_s: dict[tuple[str, str], float] = {}

    def report(self, principal: str, access: Access, now_s: float | None = None) -> bool:
        """Logs the denial unless this pair was logged within the interval; whether it logged."""
        now = time.monotonic() if now_s is None else now_s
        key = (principal, f"{access.resource_type}:{access.name}")
        with self._lock:
            if now < self._next_s.get(key, 0.0):
                return False
            if len(self._next_s) >= self._keys_max:
                self._next_s = {k: t for k, t in self._next_s.items() if t > now}
                if len(self._next_s) >= self._keys_max:
                    return False  # Every remembered pair is within its minute: too many to log.
            self._next_s[key] = now + self._interval_s
        logger.warning("denied %s: %s", principal, access.describe())
        return True


class Security:
    """One node's authentication and authorization: its settings and its view of users, tokens and ACLs."""

    def __init__(
        self,
        store: Store,
        enabled: bool,
        super_users: Iterable[str],
        secret: str,
        clock_ms: Callable[[], int],
    ) -> None:
        self.enabled = enabled
        self.super_users = frozenset(super_users)
        self._secret = secret
        self._store = store
        self._clock_ms = clock_ms
        self._denials = DenialLog()
        self.state = SecurityState.empty()  # Replaced whole by refresh() (tick thread, or at start).
        self.refresh()

    def refresh(self) -> None:
        """Rebuilds the view from the store."""
        with self._store.read() as reader:
            self.state = SecurityState.load(reader)

    def on_applied(self, result: ApplyResult | None) -> None:
        """Called with each applied entry's result (tick thread): a security command changes the view,
        and so may a store restored from a copy (None)."""
        if result is None or isinstance(result, AuthResult):
            self.refresh()

    # -- authentication ------------------------------------------------------------------------------

    def authenticate(
        self, metadata: Sequence[Any] | None, auth_context: Mapping[str, Iterable[bytes]] | None
    ) -> Principal | None:
        """The principal a call's metadata and TLS peer name, or None: none presented, or a bad one
        (a wrong node proof or token is never quietly anonymous)."""
        node = _metadata(metadata, NODE_METADATA_KEY)
        if node is not None:
            node_id = node.partition(":")[0]
            if hmac.compare_digest(node.encode(), node_proof(self._secret, node_id).encode()):
                return Principal(NODE_PREFIX + node_id, True)
            return None
        authorization = _metadata(metadata, AUTHORIZATION_METADATA_KEY)
        if authorization is not None:
            scheme, _, token = authorization.partition(" ")
            return self.token_principal(token.strip()) if scheme.lower() == "bearer" else None
        names = list(auth_context.get("x509_common_name", ())) if auth_context else []
        if names:
            return self.principal_of(bytes(names[0]).decode("utf-8", "replace"))
        return None if self.enabled else Principal(ANONYMOUS, True)

    def principal_of(self, common_name: str) -> Principal:
        """The principal of a verified certificate's common name."""
        if common_name.startswith(NODE_CN_PREFIX):
            return Principal(NODE_PREFIX + common_name[len(NODE_CN_PREFIX) :], True)
        return self.user_principal(common_name)

    def user_principal(self, user: str) -> Principal:
        """The principal of a user authenticated by its certificate, token or password."""
        name = USER_PREFIX + user
        return Principal(name, name in self.super_users or not self.enabled)

    def scram_credential(self, user: str, mechanism: str) -> tuple[kq_pb2.ScramCredential, bool]:
        """The user's SCRAM credential for `mechanism` and True; for a user without one (unknown, or
        with the other mechanism only) a stand-in and False, so that SASL answers that user as it
        answers a known one with a wrong password ("mock authentication", RFC 5802 section 9): the
        same server-first message, the same key derivation for PLAIN, and the same failure at the
        end, so user names cannot be probed. The stand-in's salt and keys are HMACs of the name under
        the cluster secret: every node shows the same salt for the same name every time, as it would
        for a real user, and nobody can find a password whose keys match. Its iteration count is the
        one kq's clients give new users (SCRAM_ITERATIONS_MIN)."""
        credential = self.state.credential(user, mechanism)
        if credential is not None:
            return credential, True
        size = SCRAM_MECHANISMS[mechanism]

        def derived(purpose: str, length: int) -> bytes:
            message = f"kq-scram-mock\0{purpose}\0{mechanism}\0{user}".encode()
            return hmac.new(self._secret.encode(), message, hashlib.sha512).digest()[:length]

        stand_in = kq_pb2.ScramCredential(
            mechanism=mechanism,
            salt=derived("salt", SCRAM_SALT_BYTES),
            stored_key=derived("stored key", size),
            server_key=derived("server key", size),
            iterations=SCRAM_ITERATIONS_MIN,
        )
        return stand_in, False

    def token_principal(self, token: str) -> Principal | None:
        """The principal a bearer token stands for, or None (malformed, unknown, expired, wrong)."""
        parsed = parse_token(token)
        if parsed is None:
            return None
        token_id, secret = parsed
        state = self.state
        stored = state.tokens.get(token_id)
        if stored is None or stored.user not in state.users:
            return None
        if stored.expires_ms and stored.expires_ms <= self._clock_ms():
            return None
        if not hmac.compare_digest(token_secret_hash(secret), stored.secret_sha256):
            return None
        return self.user_principal(stored.user)

    # -- authorization -------------------------------------------------------------------------------

    def allowed(self, principal: Principal, access: Access) -> bool:
        """Whether `principal` may do what `access` says (or one of its alternatives)."""
        if principal.super_user:
            return True
        state = self.state
        return any(
            state.allowed(principal.name, each.operation, each.resource_type, each.name)
            for each in (access, *access.alternatives)
        )

    def denied(self, principal: Principal, accesses: Iterable[Access]) -> Access | None:
        """The first of `accesses` the principal lacks (logged, once a minute per pair), or None."""
        for access in accesses:
            if not self.allowed(principal, access):
                self._denials.report(principal.name, access)
                return access
        return None

    def visible(self, principal: Principal, resource_type: int, names: Iterable[str]) -> list[str]:
        """The names the principal may DESCRIBE (ListTopics, ListGroups)."""
        return [name for name in names if self.allowed(principal, Access(DESCRIBE, resource_type, name))]

    def lists_every_group(self, principal: Principal) -> bool:
        """Whether a ListGroups answer shows the principal every group: with DESCRIBE on the cluster,
        as Kafka's does; otherwise it shows the groups the principal may DESCRIBE."""
        return self.allowed(principal, Access(DESCRIBE, CLUSTER, CLUSTER_RESOURCE))


def _metadata(metadata: Sequence[Any] | None, key: str) -> str | None:
    for item in metadata or ():
        if item[0] == key:
            value = item[1]
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return None


# ---------------------------------------------------------------------------------------------------
# What each RPC needs. A method absent here needs only an authenticated principal (ListTopics and
# ListGroups filter what they answer; ClusterStatus, RegisterProducer and WhoAmI are open to every
# principal: clients need them to find the leader and to produce idempotently). ProduceMany needs WRITE
# on each request's topic, checked per request by its handler (broker/service.py), so a topic the
# principal may not write fails its own requests only, as Kafka's Produce answers per partition.


def _topic(operation: int, field: str = "topic") -> Callable[[Any], list[Access]]:
    return lambda request: [Access(operation, TOPIC, getattr(request, field))]


def _group(operation: int) -> Callable[[Any], list[Access]]:
    return lambda request: [Access(operation, GROUP, request.group)]


def _cluster(operation: int) -> Callable[[Any], list[Access]]:
    return lambda _request: [Access(operation, CLUSTER, CLUSTER_RESOURCE)]


def _commit(request: Any) -> list[Access]:
    topics = sorted({entry.topic for entry in request.offsets})
    return [Access(READ, GROUP, request.group), *(Access(READ, TOPIC, topic) for topic in topics)]


def _own_user(operation: int, empty_is_own: bool) -> Callable[[Any], list[Access]]:
    """A user's own tokens need no ACL; another user's (or everyone's) need `operation` on the cluster.
    `empty_is_own`: a request naming no user means the caller's own (CreateToken), else everyone's."""

    def needs(request: Any) -> list[Access]:
        own = current_principal().user
        user = request.user or (own if empty_is_own else "")
        if user and user == own:
            return []
        return [Access(operation, CLUSTER, CLUSTER_RESOURCE)]

    return needs


REQUIREMENTS: dict[str, Callable[[Any], list[Access]]] = {
    "CreateTopic": lambda request: [
        Access(CREATE, TOPIC, request.name, (Access(CREATE, CLUSTER, CLUSTER_RESOURCE),))
    ],
    "DeleteTopic": _topic(DELETE, "name"),
    "DescribeTopic": _topic(DESCRIBE, "name"),
    "AlterTopicConfig": _topic(ALTER, "name"),
    "CreatePartitions": _topic(ALTER, "name"),
    "Produce": _topic(WRITE),
    "Fetch": _topic(READ),
    "FetchStream": _topic(READ),
    "ListOffsets": _topic(DESCRIBE),
    "DeleteRecords": _topic(DELETE),
    "JoinGroup": _group(READ),
    "Heartbeat": _group(READ),
    "LeaveGroup": _group(READ),
    "CommitOffsets": _commit,
    "FetchOffsets": _group(DESCRIBE),
    "DescribeGroup": _group(DESCRIBE),
    "ResetOffsets": _group(READ),
    "DeleteGroup": _group(DELETE),
    "AddNode": _cluster(ALTER),
    "RemoveNode": _cluster(ALTER),
    "PutUser": _cluster(ALTER),
    "DeleteUser": _cluster(ALTER),
    "AlterScramCredentials": _cluster(ALTER),
    "ListUsers": _cluster(DESCRIBE),
    "CreateToken": _own_user(ALTER, empty_is_own=True),
    "RevokeToken": _cluster(ALTER),  # A user's own token too: revoking needs no secret, so it is guarded.
    "ListTokens": _own_user(DESCRIBE, empty_is_own=False),
    "AddAcls": _cluster(ALTER),
    "RemoveAcls": _cluster(ALTER),
    "ListAcls": _cluster(DESCRIBE),
    # Transactions: the Kafka edge authorizes its clients' requests itself and calls these as the node;
    # kq's own clients need WRITE on the cluster (kq's ACLs have no transactional-id resource yet).
    "InitTransaction": _cluster(WRITE),
    "AddToTransaction": _cluster(WRITE),
    "EndTransaction": _cluster(WRITE),
    "TxnCommitOffsets": _cluster(WRITE),
    "WriteTxnMarkers": _cluster(ALTER),
    "ListTransactions": _cluster(DESCRIBE),
}
