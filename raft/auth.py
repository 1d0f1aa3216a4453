"""Users, tokens and ACLs: their shared validation, their apply, and the authorization rule (pure).

The edge (broker/auth.py) checks every security request with `auth_command_problem` before it
proposes it, and apply checks the committed command again with the same function, so a crafted
entry is refused alike on every replica. What only the stored state can decide (an unknown user, a
full table) apply decides, deterministically, and answers in an `AuthResult`.

Rows (storage/store.py SECURITY_TABLES): `users` maps a user name to its encoded PutUserCommand,
`tokens` a token id to its encoded Token, and `acls` an ACL's deterministic encoding to b"" (a set).

Authorization follows Kafka's AclAuthorizer: a super-user may do anything; otherwise a DENY ACL that
matches wins over any ALLOW, and without a matching ALLOW the answer is no. An ACL matches a
principal when it names that principal or "User:*"; a resource when its type is the resource's and
its name is the resource's name (LITERAL), "*" (LITERAL: every name), or a prefix of the name
(PREFIXED); an operation when it is that operation or ALL, and READ, WRITE, DELETE and ALTER each
allow DESCRIBE too.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from kq.proto import kq_pb2
from kq.proto.errors import ErrorCode
from kq.proto.limits import (
    ACLS_MAX,
    ACLS_PER_REQUEST_MAX,
    SCRAM_ALTERATIONS_MAX,
    SCRAM_ITERATIONS_MAX,
    SCRAM_ITERATIONS_MIN,
    SCRAM_SALT_BYTES_MAX,
    SCRAM_SALT_BYTES_MIN,
    TOKEN_DESCRIPTION_LENGTH_MAX,
    TOKENS_MAX,
    TRANSACTIONAL_ID_BYTES_MAX,
    USER_NAME_LENGTH_MAX,
    USERS_MAX,
)
from kq.storage.store import StoreReader, StoreWriter

# SCRAM mechanisms kq keeps credentials for, and their hash's digest size (stored and server keys).
SCRAM_MECHANISMS = {"SCRAM-SHA-256": 32, "SCRAM-SHA-512": 64}
CLUSTER_RESOURCE = "kq-cluster"  # The cluster resource's one name (Kafka's "kafka-cluster").
USER_PREFIX = "User:"
NODE_PREFIX = "Node:"  # A cluster node's principal (its certificate, or the cluster secret): a super-user.
ANONYMOUS = "User:ANONYMOUS"  # The principal of every call while authentication is off.
EVERYONE = "User:*"
TOKEN_ID_PATTERN = re.compile(r"[0-9a-f]{16}")
_USER_NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]+")  # Fixed and linear, like every name kq checks.
_RESOURCE_NAME_PATTERN = _USER_NAME_PATTERN  # Topic and group names' alphabet (raft/validation.py).
_RESOURCE_NAME_LENGTH_MAX = 249

Operation = int  # kq_pb2.AclOperation
ResourceType = int  # kq_pb2.AclResourceType
_OPERATIONS = frozenset(kq_pb2.AclOperation.values()) - {kq_pb2.ACL_OPERATION_UNKNOWN}
_RESOURCE_TYPES = frozenset(kq_pb2.AclResourceType.values()) - {kq_pb2.ACL_RESOURCE_UNKNOWN}
_PATTERNS = frozenset(kq_pb2.AclPatternType.values()) - {kq_pb2.ACL_PATTERN_UNKNOWN}
_PERMISSIONS = frozenset(kq_pb2.AclPermission.values()) - {kq_pb2.ACL_PERMISSION_UNKNOWN}
_IMPLIES_DESCRIBE = frozenset(
    {
        kq_pb2.ACL_OPERATION_READ,
        kq_pb2.ACL_OPERATION_WRITE,
        kq_pb2.ACL_OPERATION_DELETE,
        kq_pb2.ACL_OPERATION_ALTER,
    }
)


@dataclass(frozen=True, slots=True)
class AuthResult:
    """Result of a security command: an ErrorCode decided in apply, and what it changed."""

    error: ErrorCode
    created: bool = False  # PutUser: a new user (False: an existing one's credentials replaced).
    removed: int = 0  # RemoveAcls: how many were there.
    users: tuple[tuple[str, ErrorCode], ...] = ()  # AlterScram: each user's outcome, by name.


# ---------------------------------------------------------------------------------------------------
# Validation, shared by the edge and apply.


def user_name_problem(name: str) -> str | None:
    """Why `name` cannot name a user (its principal is "User:<name>")."""
    if not 0 < len(name) <= USER_NAME_LENGTH_MAX or not _USER_NAME_PATTERN.fullmatch(name):
        return f"a user name is 1 to {USER_NAME_LENGTH_MAX} letters, digits, '.', '_' or '-', got {name!r}"
    if name == "ANONYMOUS":
        return "ANONYMOUS is the principal of unauthenticated calls; choose another name"
    return None


def principal_problem(principal: str) -> str | None:
    """Why `principal` cannot be named by an ACL: "User:<user name>" or "User:*"."""
    if principal == EVERYONE:
        return None
    if not principal.startswith(USER_PREFIX):
        return f"a principal is User:<name> or User:*, got {principal[:80]!r}"
    return user_name_problem(principal[len(USER_PREFIX) :])


def credentials_problem(credentials: Iterable[kq_pb2.ScramCredential]) -> str | None:
    """Why a user's SCRAM credentials are unusable: none, a mechanism twice or unknown, bad sizes."""
    seen: set[str] = set()
    for credential in credentials:
        size = SCRAM_MECHANISMS.get(credential.mechanism)
        if size is None:
            return f"a mechanism is one of {', '.join(SCRAM_MECHANISMS)}, got {credential.mechanism[:40]!r}"
        if credential.mechanism in seen:
            return f"{credential.mechanism} is given twice"
        seen.add(credential.mechanism)
        if not SCRAM_SALT_BYTES_MIN <= len(credential.salt) <= SCRAM_SALT_BYTES_MAX:
            return f"a salt is {SCRAM_SALT_BYTES_MIN} to {SCRAM_SALT_BYTES_MAX} bytes"
        if len(credential.stored_key) != size or len(credential.server_key) != size:
            return f"{credential.mechanism}'s stored and server keys are {size} bytes each"
        if not SCRAM_ITERATIONS_MIN <= credential.iterations <= SCRAM_ITERATIONS_MAX:
            return f"iterations must be {SCRAM_ITERATIONS_MIN} to {SCRAM_ITERATIONS_MAX}"
    if not seen:
        return "a user has credentials for at least one mechanism"
    return None


def keys_of_salted_password(mechanism: str, salted_password: bytes) -> tuple[bytes, bytes]:
    """(StoredKey, ServerKey) from SaltedPassword (RFC 5802): what Kafka's AlterUserScramCredentials
    sends, so the password itself never travels."""
    digest = getattr(hashlib, mechanism.removeprefix("SCRAM-").replace("-", "").lower())
    client_key = hmac.new(salted_password, b"Client Key", digest).digest()
    return digest(client_key).digest(), hmac.new(salted_password, b"Server Key", digest).digest()


def token_problem(token: kq_pb2.Token) -> str | None:
    """Why a token record cannot be stored."""
    if not TOKEN_ID_PATTERN.fullmatch(token.token_id):
        return "a token id is 16 lowercase hex digits"
    if len(token.secret_sha256) != 32:
        return "a token's secret hash is 32 bytes (SHA-256)"
    if token.created_ms < 0 or token.expires_ms < 0:
        return "a token's times are not negative"
    if token.expires_ms and token.expires_ms <= token.created_ms:
        return "a token expires after it is created"
    if len(token.description) > TOKEN_DESCRIPTION_LENGTH_MAX:
        return f"a token's description is at most {TOKEN_DESCRIPTION_LENGTH_MAX} characters"
    return user_name_problem(token.user)


def acl_problem(acl: kq_pb2.Acl) -> str | None:
    """Why `acl` is not a rule kq can keep: its principal, enums, and resource name."""
    problem = principal_problem(acl.principal)
    if problem is not None:
        return problem
    if acl.resource_type not in _RESOURCE_TYPES:
        return "an ACL names a resource type: topic, group, cluster or transactional-id"
    if acl.pattern_type not in _PATTERNS:
        return "an ACL's pattern is literal or prefixed"
    if acl.operation not in _OPERATIONS:
        return "an ACL names an operation: all, read, write, create, delete, alter or describe"
    if acl.permission not in _PERMISSIONS:
        return "an ACL allows or denies"
    name = acl.resource_name
    if acl.resource_type == kq_pb2.ACL_RESOURCE_CLUSTER:
        if name != CLUSTER_RESOURCE or acl.pattern_type != kq_pb2.ACL_PATTERN_LITERAL:
            return f"the cluster resource is named {CLUSTER_RESOURCE!r}, literally"
        return None
    if name == "*" and acl.pattern_type == kq_pb2.ACL_PATTERN_LITERAL:
        return None
    if acl.resource_type == kq_pb2.ACL_RESOURCE_TRANSACTIONAL_ID:  # Any string, as Kafka's ids are.
        if not 0 < len(name.encode(errors="surrogatepass")) <= TRANSACTIONAL_ID_BYTES_MAX:
            return f"a transactional id (or prefix) is 1 to {TRANSACTIONAL_ID_BYTES_MAX} bytes"
        return None
    if not 0 < len(name) <= _RESOURCE_NAME_LENGTH_MAX or not _RESOURCE_NAME_PATTERN.fullmatch(name):
        return (
            f"a topic or group name (or prefix) is 1 to {_RESOURCE_NAME_LENGTH_MAX} letters, digits, '.', "
            "'_' or '-' (or '*', literal, for every name)"
        )
    return None


def acls_problem(acls: Iterable[kq_pb2.Acl]) -> str | None:
    """Why a list of ACLs (AddAcls, RemoveAcls) is refused: empty, too long, or a bad one."""
    listed = list(acls)
    if not 0 < len(listed) <= ACLS_PER_REQUEST_MAX:
        return f"a request names 1 to {ACLS_PER_REQUEST_MAX} ACLs"
    for acl in listed:
        problem = acl_problem(acl)
        if problem is not None:
            return problem
    return None


def alter_scram_problem(alter: kq_pb2.AlterScramCommand) -> str | None:
    """Why an AlterScram command is refused: no user or too many, a user twice, a bad name, credential
    or mechanism."""
    users = [upsertion.user for upsertion in alter.upsertions] + [
        deletion.user for deletion in alter.deletions
    ]
    if not 0 < len(users) <= SCRAM_ALTERATIONS_MAX:
        return f"a request changes 1 to {SCRAM_ALTERATIONS_MAX} users' credentials"
    if len(set(users)) != len(users):
        return "a user's credentials are changed once per request"
    for user in users:
        problem = user_name_problem(user)
        if problem is not None:
            return problem
    for upsertion in alter.upsertions:
        problem = credentials_problem([upsertion.credential])
        if problem is not None:
            return problem
    for deletion in alter.deletions:
        if deletion.mechanism not in SCRAM_MECHANISMS:
            return f"a mechanism is one of {', '.join(SCRAM_MECHANISMS)}, got {deletion.mechanism[:40]!r}"
    return None


def auth_command_problem(command: kq_pb2.Command) -> str | None:
    """Why a security command must not be applied (raft/validation.py `command_problem` calls it)."""
    kind = command.WhichOneof("kind")
    if kind == "put_user":
        put = command.put_user
        return user_name_problem(put.name) or credentials_problem(put.credentials)
    if kind == "delete_user":
        return user_name_problem(command.delete_user.name)
    if kind == "put_token":
        return token_problem(command.put_token.token)
    if kind == "delete_token":
        token_id = command.delete_token.token_id
        return None if TOKEN_ID_PATTERN.fullmatch(token_id) else "a token id is 16 lowercase hex digits"
    if kind == "add_acls":
        return acls_problem(command.add_acls.acls)
    if kind == "remove_acls":
        return acls_problem(command.remove_acls.acls)
    if kind == "alter_scram":
        return alter_scram_problem(command.alter_scram)
    return f"not a security command: {kind}"


AUTH_COMMAND_KINDS = frozenset(
    {"put_user", "delete_user", "put_token", "delete_token", "add_acls", "remove_acls", "alter_scram"}
)


# ---------------------------------------------------------------------------------------------------
# Apply: every replica, deterministic (the command passed auth_command_problem).


def acl_key(acl: kq_pb2.Acl) -> bytes:
    """An ACL's row key: its deterministic encoding, so equal ACLs are one row."""
    return acl.SerializeToString(deterministic=True)


def apply_auth(writer: StoreWriter, command: kq_pb2.Command) -> AuthResult:
    """Applies a checked security command."""
    kind = command.WhichOneof("kind")
    if kind == "put_user":
        user_key = command.put_user.name.encode()
        exists = writer.security_row(b"users", user_key) is not None
        if not exists and writer.security_count(b"users") >= USERS_MAX:
            return AuthResult(ErrorCode.SECURITY_LIMIT_REACHED)
        writer.put_security_row(b"users", user_key, command.put_user.SerializeToString(deterministic=True))
        return AuthResult(ErrorCode.OK, created=not exists)
    if kind == "delete_user":
        if not _delete_user(writer, command.delete_user.name):
            return AuthResult(ErrorCode.UNKNOWN_USER)
        return AuthResult(ErrorCode.OK)
    if kind == "alter_scram":
        return _apply_alter_scram(writer, command.alter_scram)
    if kind == "put_token":
        token = command.put_token.token
        if writer.security_row(b"users", token.user.encode()) is None:
            return AuthResult(ErrorCode.UNKNOWN_USER)
        key = token.token_id.encode()
        if writer.security_row(b"tokens", key) is None and writer.security_count(b"tokens") >= TOKENS_MAX:
            return AuthResult(ErrorCode.SECURITY_LIMIT_REACHED)
        writer.put_security_row(b"tokens", key, token.SerializeToString(deterministic=True))
        return AuthResult(ErrorCode.OK, created=True)
    if kind == "delete_token":
        if not writer.delete_security_row(b"tokens", command.delete_token.token_id.encode()):
            return AuthResult(ErrorCode.UNKNOWN_TOKEN)
        return AuthResult(ErrorCode.OK)
    if kind == "add_acls":
        keys = {acl_key(acl) for acl in command.add_acls.acls}
        new = [key for key in sorted(keys) if writer.security_row(b"acls", key) is None]
        if writer.security_count(b"acls") + len(new) > ACLS_MAX:
            return AuthResult(ErrorCode.SECURITY_LIMIT_REACHED)
        for key in new:
            writer.put_security_row(b"acls", key, b"")
        return AuthResult(ErrorCode.OK, created=bool(new))
    if kind == "remove_acls":
        keys = {acl_key(acl) for acl in command.remove_acls.acls}
        removed = sum(writer.delete_security_row(b"acls", key) for key in sorted(keys))
        return AuthResult(ErrorCode.OK, removed=removed)
    raise ValueError(f"not a security command: {kind}")


def _delete_user(writer: StoreWriter, user: str) -> bool:
    """Deletes a user and its tokens; whether it existed."""
    if not writer.delete_security_row(b"users", user.encode()):
        return False
    for token_id, raw in writer.security_rows(b"tokens"):
        if kq_pb2.Token.FromString(raw).user == user:
            writer.delete_security_row(b"tokens", token_id)
    return True


def _apply_alter_scram(writer: StoreWriter, alter: kq_pb2.AlterScramCommand) -> AuthResult:
    """Each user's one change, by user name: an upsertion replaces (or adds) its mechanism's credential,
    creating the user when new; a deletion removes it (UNKNOWN_USER when not there), and the user with
    its last credential."""
    outcomes: list[tuple[str, ErrorCode]] = []
    changes: list[tuple[str, kq_pb2.ScramCredential | None, str]]
    changes = [(u.user, u.credential, "") for u in alter.upsertions]
    changes += [(d.user, None, d.mechanism) for d in alter.deletions]
    for user, credential, mechanism in sorted(changes, key=lambda change: change[0]):
        raw = writer.security_row(b"users", user.encode())
        current = kq_pb2.PutUserCommand.FromString(raw) if raw is not None else None
        if credential is None:
            kept = [c for c in current.credentials if c.mechanism != mechanism] if current else []
            if current is None or len(kept) == len(current.credentials):
                outcomes.append((user, ErrorCode.UNKNOWN_USER))
                continue
            if not kept:
                _delete_user(writer, user)
            else:
                _put_user(writer, user, kept)
            outcomes.append((user, ErrorCode.OK))
            continue
        if current is None and writer.security_count(b"users") >= USERS_MAX:
            outcomes.append((user, ErrorCode.SECURITY_LIMIT_REACHED))
            continue
        others = [c for c in current.credentials if c.mechanism != credential.mechanism] if current else []
        _put_user(writer, user, sorted([*others, credential], key=lambda c: c.mechanism))
        outcomes.append((user, ErrorCode.OK))
    return AuthResult(ErrorCode.OK, users=tuple(outcomes))


def _put_user(writer: StoreWriter, user: str, credentials: Iterable[kq_pb2.ScramCredential]) -> None:
    put = kq_pb2.PutUserCommand(name=user, credentials=credentials)
    writer.put_security_row(b"users", user.encode(), put.SerializeToString(deterministic=True))


# ---------------------------------------------------------------------------------------------------
# The view every node keeps (broker/auth.py rebuilds it after a security entry or a store copy).


@dataclass(frozen=True, slots=True)
class Rule:
    """One ACL, in the form the authorizer matches."""

    principal: str
    resource_type: ResourceType
    name: str
    prefixed: bool
    operation: Operation
    allow: bool

    @classmethod
    def of(cls, acl: kq_pb2.Acl) -> Rule:
        """The rule an ACL states."""
        return cls(
            acl.principal,
            acl.resource_type,
            acl.resource_name,
            acl.pattern_type == kq_pb2.ACL_PATTERN_PREFIXED,
            acl.operation,
            acl.permission == kq_pb2.ACL_PERMISSION_ALLOW,
        )

    def matches(self, principal: str, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        """Whether this rule speaks of `principal` doing `operation` on the resource."""
        if self.resource_type != resource_type or self.principal not in (principal, EVERYONE):
            return False
        if self.prefixed:
            if not name.startswith(self.name):
                return False
        elif self.name not in (name, "*"):
            return False
        return self.operation in (operation, kq_pb2.ACL_OPERATION_ALL) or (
            operation == kq_pb2.ACL_OPERATION_DESCRIBE and self.operation in _IMPLIES_DESCRIBE
        )


@dataclass(frozen=True, slots=True)
class SecurityState:
    """Users, tokens and ACLs as one node has applied them: immutable, replaced whole."""

    users: dict[str, kq_pb2.PutUserCommand]
    tokens: dict[str, kq_pb2.Token]
    acls: tuple[kq_pb2.Acl, ...]
    rules: tuple[Rule, ...]
    # The rules by resource type: a check reads only its own type's (topics, groups, the cluster).
    by_type: dict[ResourceType, tuple[Rule, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.by_type:
            for resource_type in _RESOURCE_TYPES:
                self.by_type[resource_type] = tuple(r for r in self.rules if r.resource_type == resource_type)

    @classmethod
    def load(cls, reader: StoreReader) -> SecurityState:
        """The state the store holds."""
        users = {
            key.decode(): kq_pb2.PutUserCommand.FromString(raw) for key, raw in reader.security_rows(b"users")
        }
        tokens = {key.decode(): kq_pb2.Token.FromString(raw) for key, raw in reader.security_rows(b"tokens")}
        acls = tuple(kq_pb2.Acl.FromString(key) for key, _ in reader.security_rows(b"acls"))
        return cls(users, tokens, acls, tuple(Rule.of(acl) for acl in acls))

    @classmethod
    def empty(cls) -> SecurityState:
        """No users, tokens or ACLs."""
        return cls({}, {}, (), ())

    def allowed(self, principal: str, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        """Whether a principal that is not a super-user may do `operation` on the resource."""
        allowed = False
        for rule in self.by_type.get(resource_type, ()):
            if rule.matches(principal, operation, resource_type, name):
                if not rule.allow:
                    return False
                allowed = True
        return allowed

    def credential(self, user: str, mechanism: str) -> kq_pb2.ScramCredential | None:
        """The user's SCRAM credential for `mechanism`, or None (no such user or mechanism)."""
        put = self.users.get(user)
        if put is None:
            return None
        for credential in put.credentials:
            if credential.mechanism == mechanism:
                return credential
        return None
