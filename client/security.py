"""Security calls of `KqClient` (a mixin): users, tokens, ACLs and WhoAmI; and the token on every call.

A user's password never leaves the client: `put_user` derives the SCRAM credentials (RFC 5802:
salt, iteration count, stored key and server key) here, with `scramp`, and sends only those. The
nodes verify SCRAM logins with them, and SASL PLAIN logins by deriving the same keys again.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from kq.client.calls import Calls
from kq.proto import kq_pb2
from kq.proto.limits import SCRAM_ITERATIONS_MIN

SCRAM_HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}
SCRAM_SALT_BYTES = 24


def scram_credential(
    mechanism: str, password: str, iterations: int = SCRAM_ITERATIONS_MIN
) -> kq_pb2.ScramCredential:
    """SCRAM credentials of `password` for `mechanism` (RFC 5802), with a new random salt."""
    salt = os.urandom(SCRAM_SALT_BYTES)
    stored_key, server_key = scram_keys(mechanism, password, salt, iterations)
    return kq_pb2.ScramCredential(
        mechanism=mechanism, salt=salt, stored_key=stored_key, server_key=server_key, iterations=iterations
    )


def scram_keys(mechanism: str, password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    """(StoredKey, ServerKey) of a password, as RFC 5802 derives them."""
    digest = SCRAM_HASHES[mechanism]
    salted = hashlib.pbkdf2_hmac(digest().name, password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    return digest(client_key).digest(), hmac.new(salted, b"Server Key", digest).digest()


@dataclass(frozen=True, slots=True)
class CreatedToken:
    """A new token: `token` is its only copy (the cluster keeps a hash)."""

    token: str
    token_id: str
    expires_ms: int  # 0: never.


class _ClientCall(
    collections.namedtuple(
        "_ClientCall", ["method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"]
    ),
    grpc.ClientCallDetails,
):
    """grpc's ClientCallDetails with the metadata replaced."""


NODE_METADATA_KEY = "kq-node"
ADMIN_NODE_ID = "admin"  # The node id a client holding the cluster secret presents (`secret=`).


def node_proof(secret: str, node_id: str) -> str:
    """The `kq-node` metadata value by which `node_id` proves it knows the cluster secret (--secret):
    "<id>:<HMAC-SHA256(secret, 'kq-node:' + id)>". Nodes present it on their calls to each other, and
    an operator's client may (`KqClient(secret=...)`): whoever holds the secret is a super-user."""
    mac = hmac.new(secret.encode(), f"kq-node:{node_id}".encode(), hashlib.sha256).hexdigest()
    return f"{node_id}:{mac}"


def credential_metadata(token: str | None, secret: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata a client's calls carry: its bearer token, or its proof of the cluster secret."""
    pairs: list[tuple[str, str]] = []
    if token:
        pairs.append(("authorization", f"Bearer {token}"))
    if secret:
        pairs.append((NODE_METADATA_KEY, node_proof(secret, ADMIN_NODE_ID)))
    return tuple(pairs)


class MetadataInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Adds fixed metadata (credentials) to every call of a channel."""

    def __init__(self, pairs: tuple[tuple[str, str], ...]) -> None:
        self._pairs = pairs

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = [*(details.metadata or ()), *self._pairs]
        return _ClientCall(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(
        self, continuation: Callable[[Any, Any], Any], client_call_details: Any, request: Any
    ) -> Any:
        """Every unary call."""
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(
        self, continuation: Callable[[Any, Any], Any], client_call_details: Any, request: Any
    ) -> Any:
        """Every server stream."""
        return continuation(self._details(client_call_details), request)

    def intercept_stream_stream(
        self, continuation: Callable[[Any, Any], Any], client_call_details: Any, request_iterator: Any
    ) -> Any:
        """Every request stream (ProduceStream)."""
        return continuation(self._details(client_call_details), request_iterator)


class SecurityApi:
    """Users, tokens, ACLs; `KqClient` provides `_connections` and `_saw`."""

    _connections: Calls

    def _saw(self, index: int, group: int = 0) -> None:
        raise NotImplementedError

    def put_user(self, name: str, password: str, mechanisms: Sequence[str] = tuple(SCRAM_HASHES)) -> bool:
        """Creates user `name` with `password` (or sets a new password); whether it was new."""
        credentials = [scram_credential(mechanism, password) for mechanism in mechanisms]
        response = self._connections.write(
            "PutUser", kq_pb2.PutUserRequest(name=name, credentials=credentials)
        )
        self._saw(response.index)
        return bool(response.created)

    def delete_user(self, name: str) -> None:
        """Deletes user `name` and its tokens (UnknownUserError if there is none)."""
        self._saw(self._connections.write("DeleteUser", kq_pb2.DeleteUserRequest(name=name)).index)

    def list_users(self) -> list[kq_pb2.UserInfo]:
        """Every user: name, SCRAM mechanisms, token count."""
        return list(self._connections.read("ListUsers", kq_pb2.ListUsersRequest()).users)

    def create_token(self, user: str = "", ttl_s: int = 0, description: str = "") -> CreatedToken:
        """A new bearer token of `user` (default: the caller's own user); `ttl_s` 0 never expires."""
        response = self._connections.write(
            "CreateToken", kq_pb2.CreateTokenRequest(user=user, ttl_s=ttl_s, description=description)
        )
        self._saw(response.index)
        return CreatedToken(response.token, response.token_id, response.expires_ms)

    def revoke_token(self, token_id: str) -> None:
        """Revokes a token by its id (UnknownUserError if there is none)."""
        self._saw(self._connections.write("RevokeToken", kq_pb2.RevokeTokenRequest(token_id=token_id)).index)

    def list_tokens(self, user: str = "") -> list[kq_pb2.TokenInfo]:
        """Tokens (never their secrets), of `user` or of everyone."""
        return list(self._connections.read("ListTokens", kq_pb2.ListTokensRequest(user=user)).tokens)

    def add_acls(self, acls: Sequence[kq_pb2.Acl]) -> None:
        """Adds ACLs (see `acl`)."""
        self._saw(self._connections.write("AddAcls", kq_pb2.AddAclsRequest(acls=acls)).index)

    def remove_acls(self, acls: Sequence[kq_pb2.Acl]) -> int:
        """Removes the ACLs equal to these; how many there were."""
        response = self._connections.write("RemoveAcls", kq_pb2.RemoveAclsRequest(acls=acls))
        self._saw(response.index)
        return int(response.removed)

    def list_acls(self, principal: str = "") -> list[kq_pb2.Acl]:
        """Every ACL, or a principal's."""
        return list(self._connections.read("ListAcls", kq_pb2.ListAclsRequest(principal=principal)).acls)

    def whoami(self) -> tuple[str, bool]:
        """(principal, super-user?) as the node sees this client."""
        response = self._connections.read("WhoAmI", kq_pb2.WhoAmIRequest())
        return response.principal, response.super_user


RESOURCE_TYPES = {
    "topic": kq_pb2.ACL_RESOURCE_TOPIC,
    "group": kq_pb2.ACL_RESOURCE_GROUP,
    "cluster": kq_pb2.ACL_RESOURCE_CLUSTER,
    "transactional-id": kq_pb2.ACL_RESOURCE_TRANSACTIONAL_ID,
}
OPERATIONS = {
    "all": kq_pb2.ACL_OPERATION_ALL,
    "read": kq_pb2.ACL_OPERATION_READ,
    "write": kq_pb2.ACL_OPERATION_WRITE,
    "create": kq_pb2.ACL_OPERATION_CREATE,
    "delete": kq_pb2.ACL_OPERATION_DELETE,
    "alter": kq_pb2.ACL_OPERATION_ALTER,
    "describe": kq_pb2.ACL_OPERATION_DESCRIBE,
}


def acl(
    principal: str,
    operation: str,
    resource_type: str,
    name: str = "kq-cluster",
    *,
    prefixed: bool = False,
    deny: bool = False,
) -> kq_pb2.Acl:
    """An ACL: `principal` ("User:alice", "User:*") may (`deny`: may not) do `operation` ("read", ...)
    on the `resource_type` ("topic", "group", "cluster") named `name` (or every name starting with it)."""
    return kq_pb2.Acl(
        principal=principal,
        resource_type=RESOURCE_TYPES[resource_type],
        resource_name=name,
        pattern_type=kq_pb2.ACL_PATTERN_PREFIXED if prefixed else kq_pb2.ACL_PATTERN_LITERAL,
        operation=OPERATIONS[operation],
        permission=kq_pb2.ACL_PERMISSION_DENY if deny else kq_pb2.ACL_PERMISSION_ALLOW,
    )


def describe_acl(rule: kq_pb2.Acl) -> str:
    """One line: "User:alice ALLOW read topic orders (prefixed)"."""
    operation = {value: name for name, value in OPERATIONS.items()}.get(rule.operation, "?")
    resource = {value: name for name, value in RESOURCE_TYPES.items()}.get(rule.resource_type, "?")
    permission = "DENY" if rule.permission == kq_pb2.ACL_PERMISSION_DENY else "ALLOW"
    pattern = " (prefixed)" if rule.pattern_type == kq_pb2.ACL_PATTERN_PREFIXED else ""
    return f"{rule.principal} {permission} {operation} {resource} {rule.resource_name}{pattern}"
