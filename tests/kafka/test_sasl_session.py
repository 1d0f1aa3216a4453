"""The Kafka listener's SASL state machine and its API -> ACL table, without sockets (pure)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import scramp

from kq.broker.auth import (
    ALTER,
    CLUSTER,
    CREATE,
    DESCRIBE,
    GROUP,
    READ,
    TOPIC,
    TRANSACTIONAL_ID,
    WRITE,
    Access,
    Security,
    token_secret_hash,
)
from kq.broker.config import ConfigError, parse_sasl_mechanisms
from kq.broker.kafka import sasl
from kq.broker.kafka.authorize import ACLS, OPEN_APIS, WHOLE, ApiKey, access, writes_some_topic
from kq.broker.kafka.codes import (
    ILLEGAL_SASL_STATE,
    NONE,
    SASL_AUTHENTICATION_FAILED,
    UNSUPPORTED_SASL_MECHANISM,
)
from kq.broker.kafka.sasl import MECHANISMS, Answer, SaslSession, SaslState
from kq.client.security import acl, scram_credential, scram_keys
from kq.proto import kq_pb2
from kq.proto.limits import KAFKA_SASL_ROUNDS_MAX, KAFKA_SASL_TOKEN_BYTES_MAX, SCRAM_ITERATIONS_MIN
from kq.raft.auth import CLUSTER_RESOURCE, Rule, SecurityState
from kq.storage import Store
from tests.kafka.test_listener import EXPECTED_VERSIONS

TOKEN_ID = "0123456789abcdef"
TOKEN_SECRET = "s3cret-of-the-token"
TOKEN = f"kq_{TOKEN_ID}_{TOKEN_SECRET}"


@pytest.fixture
def security(tmp_path: Path) -> Iterator[Security]:
    """Authentication on; users alice (both SCRAM mechanisms) and bob (SCRAM-SHA-512 only), a token of
    bob's, and an ACL letting alice write topics starting with "orders"."""
    store = Store.open(tmp_path / "store", 64 * 1024 * 1024)
    try:
        node = Security(store, True, ("User:admin",), "secret", lambda: 1_000)
        users = {
            "alice": kq_pb2.PutUserCommand(
                name="alice",
                credentials=[scram_credential(m, "alice-pw") for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")],
            ),
            "bob": kq_pb2.PutUserCommand(
                name="bob", credentials=[scram_credential("SCRAM-SHA-512", "bob-pw")]
            ),
        }
        tokens = {
            TOKEN_ID: kq_pb2.Token(
                token_id=TOKEN_ID, user="bob", secret_sha256=token_secret_hash(TOKEN_SECRET), created_ms=1
            )
        }
        acls = (acl("User:alice", "write", "topic", "orders", prefixed=True),)
        node.state = SecurityState(users, tokens, acls, tuple(Rule.of(a) for a in acls))
        yield node
    finally:
        store.close()


def _plain(session: SaslSession, user: str, password: str, authzid: str = "") -> int:
    assert session.handshake("PLAIN", 1).error_code == NONE
    return session.authenticate(f"{authzid}\0{user}\0{password}".encode()).error_code


def test_plain_accepts_the_password_and_binds_the_user(security: Security) -> None:
    """PLAIN derives the stored key from the password: alice's (SHA-256) and bob's (SHA-512 only)."""
    for user, password in (("alice", "alice-pw"), ("bob", "bob-pw")):
        session = SaslSession(security, MECHANISMS)
        assert _plain(session, user, password) == NONE
        assert session.state is SaslState.DONE and session.principal is not None
        assert session.principal.name == f"User:{user}" and not session.principal.super_user


def test_plain_refuses_a_wrong_password_an_unknown_user_and_a_foreign_authzid(security: Security) -> None:
    for user, password, authzid in (("alice", "wrong", ""), ("carol", "x", ""), ("alice", "alice-pw", "bob")):
        session = SaslSession(security, MECHANISMS)
        assert _plain(session, user, password, authzid) == SASL_AUTHENTICATION_FAILED
        assert session.state is SaslState.FAILED and session.principal is None


def test_plain_takes_a_token_as_the_password_of_its_user(security: Security) -> None:
    """A kq token authenticates its own user whatever user name the client gives; a wrong one does not."""
    session = SaslSession(security, MECHANISMS)
    assert _plain(session, "anyone", TOKEN) == NONE
    assert session.principal is not None and session.principal.name == "User:bob"
    assert _plain(SaslSession(security, MECHANISMS), "bob", TOKEN + "x") == SASL_AUTHENTICATION_FAILED


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_completes_with_a_real_client_and_proves_the_server(security: Security, mechanism: str) -> None:
    """scramp's client against the session: two rounds, and the client verifies the server's signature."""
    session = SaslSession(security, MECHANISMS)
    assert session.handshake(mechanism, 1).error_code == NONE
    client = scramp.ScramClient([mechanism], "alice", "alice-pw")
    first = session.authenticate(client.get_client_first().encode())
    assert first.error_code == NONE and session.state is SaslState.AUTHENTICATING
    client.set_server_first(first.token.decode())
    final = session.authenticate(client.get_client_final().encode())
    assert final.error_code == NONE
    client.set_server_final(final.token.decode())  # Raises unless the server knew the stored key.
    assert session.principal is not None and session.principal.name == "User:alice"


def _scram_attempt(security: Security, mechanism: str, user: str, password: str) -> tuple[str, Answer]:
    """One SCRAM exchange by scramp's client: the server-first message, and the answer to client-final."""
    session = SaslSession(security, MECHANISMS)
    assert session.handshake(mechanism, 1).error_code == NONE
    client = scramp.ScramClient([mechanism], user, password)
    first = session.authenticate(client.get_client_first().encode())
    assert first.error_code == NONE and session.state is SaslState.AUTHENTICATING
    client.set_server_first(first.token.decode())
    answer = session.authenticate(client.get_client_final().encode())
    assert session.principal is None or answer.error_code == NONE
    return first.token.decode(), answer


def _salt_and_iterations(server_first: str) -> tuple[str, str]:
    fields = dict(part.split("=", 1) for part in server_first.split(","))
    return fields["s"], fields["i"]


def test_scram_refuses_a_wrong_password_and_an_unknown_user_alike(security: Security) -> None:
    """A wrong password, an unknown user (carol) and a user without this mechanism's credential (bob,
    SCRAM-SHA-512 only) all get a server-first message and the same failure at client-final: the
    exchange does not tell which names exist."""
    answers = [
        _scram_attempt(security, "SCRAM-SHA-256", user, password)[1]
        for user, password in (("alice", "wrong"), ("carol", "pw"), ("bob", "bob-pw"))
    ]
    for answer in answers:
        assert answer.error_code == SASL_AUTHENTICATION_FAILED and answer.close
        assert answer.message is not None and "Authentication failed" in answer.message
    assert len({(a.error_code, a.message, a.token, a.close) for a in answers}) == 1


def test_an_unknown_users_salt_is_the_same_on_every_node_and_every_time(
    security: Security, tmp_path: Path
) -> None:
    """The stand-in's salt is a function of the cluster secret and the name: stable, as a real user's
    stored salt is, across sessions and nodes (another Security with the same secret); different for
    another name and under another secret; with the iteration count kq's clients give users."""
    first, _ = _scram_attempt(security, "SCRAM-SHA-256", "carol", "pw")
    again, _ = _scram_attempt(security, "SCRAM-SHA-256", "carol", "other")
    salt, iterations = _salt_and_iterations(first)
    assert _salt_and_iterations(again) == (salt, iterations)
    assert iterations == str(SCRAM_ITERATIONS_MIN)
    assert _salt_and_iterations(_scram_attempt(security, "SCRAM-SHA-256", "dave", "pw")[0])[0] != salt
    assert _salt_and_iterations(_scram_attempt(security, "SCRAM-SHA-512", "carol", "pw")[0])[0] != salt
    store = Store.open(tmp_path / "other", 64 * 1024 * 1024)
    try:
        for secret, same in (("secret", True), ("another secret", False)):
            node = Security(store, True, ("User:admin",), secret, lambda: 1_000)
            node.state = security.state
            other_salt = _salt_and_iterations(_scram_attempt(node, "SCRAM-SHA-256", "carol", "pw")[0])[0]
            assert (other_salt == salt) is same
    finally:
        store.close()


def test_plain_derives_a_key_for_an_unknown_user_as_for_a_known_one(
    security: Security, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PLAIN's answer to an unknown user costs the same key derivation as a wrong password (the same
    mechanism and iteration count), so its timing does not tell the name exists."""
    derivations: list[tuple[str, int]] = []
    real = scram_keys

    def counted(mechanism: str, password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
        derivations.append((mechanism, iterations))
        return real(mechanism, password, salt, iterations)

    monkeypatch.setattr(sasl, "scram_keys", counted)
    assert _plain(SaslSession(security, MECHANISMS), "alice", "wrong") == SASL_AUTHENTICATION_FAILED
    assert _plain(SaslSession(security, MECHANISMS), "carol", "wrong") == SASL_AUTHENTICATION_FAILED
    alice = security.state.credential("alice", "SCRAM-SHA-256")
    assert alice is not None
    assert derivations == [("SCRAM-SHA-256", alice.iterations), ("SCRAM-SHA-256", alice.iterations)]


def test_the_state_machine_refuses_out_of_order_and_oversized_steps(security: Security) -> None:
    """Authenticate before a handshake, a second handshake, an unknown or disabled mechanism, an
    oversized token, too many rounds: each answered with its own code and the connection closed."""
    early = SaslSession(security, MECHANISMS).authenticate(b"x")
    assert early.error_code == ILLEGAL_SASL_STATE and early.close
    unknown = SaslSession(security, MECHANISMS).handshake("GSSAPI", 1)
    assert unknown.error_code == UNSUPPORTED_SASL_MECHANISM and unknown.close
    assert unknown.message is not None and "SCRAM-SHA-512" in unknown.message
    disabled = SaslSession(security, ("SCRAM-SHA-256",)).handshake("PLAIN", 1)
    assert disabled.error_code == UNSUPPORTED_SASL_MECHANISM
    twice = SaslSession(security, MECHANISMS)
    twice.handshake("PLAIN", 1)
    assert twice.handshake("PLAIN", 1).error_code == ILLEGAL_SASL_STATE
    big = SaslSession(security, MECHANISMS)
    big.handshake("PLAIN", 1)
    assert (
        big.authenticate(b"\0alice\0" + b"x" * KAFKA_SASL_TOKEN_BYTES_MAX).error_code
        == SASL_AUTHENTICATION_FAILED
    )
    done = SaslSession(security, MECHANISMS)
    assert _plain(done, "alice", "alice-pw") == NONE
    assert done.authenticate(b"\0alice\0alice-pw").error_code == ILLEGAL_SASL_STATE
    assert KAFKA_SASL_ROUNDS_MAX >= 2  # SCRAM's two rounds fit.


def test_a_v0_handshake_switches_to_bare_tokens(security: Security) -> None:
    session = SaslSession(security, MECHANISMS)
    assert session.handshake("PLAIN", 0).error_code == NONE and session.raw_tokens
    assert session.authenticate(b"\0alice\0alice-pw").error_code == NONE


@pytest.mark.parametrize(
    "token",
    [
        b"",
        b"\0",
        b"\0\0",
        b"a\0b",
        b"\xff\0\xfe\0\xfd",
        b"\0alice\0",
        b"\0\0pw",
        b"n,,n=alice,r=x",
        b"\x00" * 50,
    ],
)
def test_malformed_tokens_fail_cleanly(security: Security, token: bytes) -> None:
    """Garbage in either mechanism is SASL_AUTHENTICATION_FAILED, never an exception."""
    for mechanism in MECHANISMS:
        session = SaslSession(security, MECHANISMS)
        session.handshake(mechanism, 1)
        answers = [session.authenticate(token) for _ in range(2)]
        assert all(
            answer.error_code in (NONE, SASL_AUTHENTICATION_FAILED, ILLEGAL_SASL_STATE) for answer in answers
        )
        assert session.principal is None


def test_every_served_api_has_a_rule() -> None:
    """The table names every API kq serves: a new API cannot be added without deciding its ACL."""
    assert {int(key) for key in ApiKey} == set(EXPECTED_VERSIONS)
    assert set(ACLS) | OPEN_APIS == set(ApiKey) and not set(ACLS) & OPEN_APIS
    for api_key, resource_type in ((key, next(iter(ACLS[key]))) for key in WHOLE):
        assert resource_type in (GROUP, CLUSTER, TRANSACTIONAL_ID), api_key


def test_the_table_states_kafkas_rules() -> None:
    """Spot checks against Kafka's authorizer, written out."""
    cluster = Access(CREATE, CLUSTER, CLUSTER_RESOURCE)
    assert access(ApiKey.PRODUCE, TOPIC, "t") == Access(WRITE, TOPIC, "t")
    assert access(ApiKey.FETCH, TOPIC, "t") == Access(READ, TOPIC, "t")
    assert access(ApiKey.METADATA, TOPIC, "t") == Access(DESCRIBE, TOPIC, "t")
    assert access(ApiKey.CREATE_TOPICS, TOPIC, "t") == Access(CREATE, TOPIC, "t", (cluster,))
    assert access(ApiKey.OFFSET_COMMIT, GROUP, "g").operation == READ
    assert access(ApiKey.OFFSET_FETCH, GROUP, "g").operation == DESCRIBE
    assert access(ApiKey.FIND_COORDINATOR, GROUP, "g").operation == DESCRIBE
    members = (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP)
    assert all(access(key, GROUP, "g").operation == READ for key in members)
    assert access(ApiKey.INCREMENTAL_ALTER_CONFIGS, TOPIC, "t").operation == ALTER
    assert access(ApiKey.DESCRIBE_CLUSTER, CLUSTER, CLUSTER_RESOURCE).operation == DESCRIBE
    assert access(ApiKey.CONSUMER_GROUP_HEARTBEAT, GROUP, "g").operation == READ  # KIP-848.
    assert access(ApiKey.CONSUMER_GROUP_HEARTBEAT, TOPIC, "t").operation == DESCRIBE
    assert access(ApiKey.CONSUMER_GROUP_DESCRIBE, GROUP, "g").operation == DESCRIBE


def test_acls_decide_per_api(security: Security) -> None:
    """alice may WRITE (and so DESCRIBE) "orders*" topics, not READ them; mallory may do nothing."""
    alice, mallory = security.user_principal("alice"), security.user_principal("mallory")
    assert security.allowed(alice, access(ApiKey.PRODUCE, TOPIC, "orders-eu"))
    assert security.allowed(alice, access(ApiKey.METADATA, TOPIC, "orders-eu"))
    assert not security.allowed(alice, access(ApiKey.FETCH, TOPIC, "orders-eu"))
    assert not security.allowed(alice, access(ApiKey.PRODUCE, TOPIC, "payments"))
    assert not security.allowed(mallory, access(ApiKey.METADATA, TOPIC, "orders-eu"))
    assert security.allowed(security.user_principal("admin"), access(ApiKey.DELETE_TOPICS, TOPIC, "x"))
    assert writes_some_topic(security.state, "User:alice")
    assert not writes_some_topic(security.state, "User:mallory")
    deny_all = acl("User:alice", "write", "topic", "*", deny=True)
    rules = (*security.state.rules, Rule.of(deny_all))
    assert not writes_some_topic(SecurityState({}, {}, (), rules), "User:alice")


def test_the_mechanisms_flag_takes_known_names_only() -> None:
    """`--kafka-sasl-mechanisms`: a comma-separated subset, case-insensitive, without repeats."""
    assert parse_sasl_mechanisms("scram-sha-512, PLAIN,PLAIN") == ("SCRAM-SHA-512", "PLAIN")
    for bad in ("", " , ", "GSSAPI", "PLAIN,OAUTHBEARER"):
        with pytest.raises(ConfigError, match="--kafka-sasl-mechanisms"):
            parse_sasl_mechanisms(bad)
