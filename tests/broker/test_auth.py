"""Authentication at the edge (broker/auth.py): node proofs, certificate names and bearer tokens, each
checked against the replicated state; and the once-a-minute denial log."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from kq.broker.auth import (
    READ,
    TOPIC,
    Access,
    DenialLog,
    Principal,
    Security,
    node_metadata,
    token_secret_hash,
)
from kq.client.security import acl, credential_metadata, scram_credential
from kq.proto import kq_pb2
from kq.raft import commands
from kq.raft.state_machine import apply
from kq.storage import Store

SECRET = "cluster-secret"
NOW_MS = 1_000_000
TOKEN_ID = "0123456789abcdef"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
    entries = [
        commands.put_user("alice", [scram_credential("SCRAM-SHA-256", "pw")]),
        commands.put_token(
            kq_pb2.Token(
                token_id=TOKEN_ID,
                user="alice",
                secret_sha256=token_secret_hash("s3cret"),
                created_ms=1,
                expires_ms=NOW_MS + 1,
            )
        ),
    ]
    for index, command in enumerate(entries, start=1):
        apply(opened, index, commands.encode(command))
    yield opened
    opened.close()


def security(store: Store, enabled: bool = True, now_ms: int = NOW_MS) -> Security:
    return Security(store, enabled, ["User:admin"], SECRET, lambda: now_ms)


def test_a_valid_token_is_its_user_until_it_expires(store: Store) -> None:
    metadata = credential_metadata(f"kq_{TOKEN_ID}_s3cret", None)
    assert security(store).authenticate(metadata, None) == Principal("User:alice", False)
    assert security(store, now_ms=NOW_MS + 1).authenticate(metadata, None) is None  # Expired.
    for wrong in (f"kq_{TOKEN_ID}_other", "kq_ffffffffffffffff_s3cret", "s3cret", f"kq_{TOKEN_ID}_"):
        assert security(store).authenticate(credential_metadata(wrong, None), None) is None, wrong
    assert security(store).authenticate([("authorization", f"Basic kq_{TOKEN_ID}_s3cret")], None) is None


def test_the_cluster_secret_makes_a_node_and_a_wrong_one_nothing(store: Store) -> None:
    assert security(store).authenticate(node_metadata(SECRET, "2"), None) == Principal("Node:2", True)
    assert security(store).authenticate(credential_metadata(None, SECRET), None) == Principal(
        "Node:admin", True
    )
    assert security(store).authenticate(node_metadata("guess", "2"), None) is None
    assert security(store).authenticate([("kq-node", "2:" + "0" * 64)], None) is None


def test_a_certificate_names_its_user_or_node(store: Store) -> None:
    def by_certificate(name: bytes) -> Principal | None:
        return security(store).authenticate([], {"x509_common_name": [name]})

    assert by_certificate(b"admin") == Principal("User:admin", True)  # --super-user User:admin.
    assert by_certificate(b"bob") == Principal("User:bob", False)
    assert by_certificate(b"kq node 3") == Principal("Node:3", True)


def test_without_credentials_auth_refuses_and_no_auth_is_anonymous(store: Store) -> None:
    assert security(store).authenticate([], {}) is None
    assert security(store, enabled=False).authenticate([], {}) == Principal("User:ANONYMOUS", True)


def test_the_view_follows_applied_security_entries(store: Store) -> None:
    view = security(store)
    principal = Principal("User:alice", False)
    access = Access(READ, TOPIC, "t")
    assert not view.allowed(principal, access)
    result = apply(store, 3, commands.encode(commands.add_acls([_read_t()])))
    view.on_applied(result)
    assert view.allowed(principal, access)
    assert view.visible(principal, TOPIC, ["t", "u"]) == ["t"]


def _read_t() -> kq_pb2.Acl:
    return acl("User:alice", "read", "topic", "t")


def test_a_denial_is_logged_once_a_minute_per_principal_and_resource(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = DenialLog(interval_s=60.0, keys_max=2)
    access = Access(READ, TOPIC, "t")
    with caplog.at_level(logging.WARNING, logger="kq.broker.auth"):
        assert log.report("User:bob", access, now_s=0.0)
        assert not log.report("User:bob", access, now_s=59.0)
        assert log.report("User:carol", access, now_s=1.0)
        assert not log.report("User:dave", access, now_s=2.0)  # Two pairs remembered, both recent.
        assert log.report("User:bob", access, now_s=61.0)
    assert [record.getMessage() for record in caplog.records] == [
        "denied User:bob: READ on topic t",
        "denied User:carol: READ on topic t",
        "denied User:bob: READ on topic t",
    ]
