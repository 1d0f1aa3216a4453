"""Users, tokens and ACLs in apply (raft/auth.py): validation shared with the edge, deterministic
effects and limits, and the authorization rule (deny wins, prefixes, wildcards, implied DESCRIBE)."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterator
from pathlib import Path

import pytest

from kq.broker.auth import DELETE, DESCRIBE, GROUP, READ, TOPIC, WRITE
from kq.client.security import acl, scram_credential, scram_keys
from kq.proto import kq_pb2
from kq.proto.errors import ErrorCode
from kq.raft import auth, commands
from kq.raft.auth import AuthResult, SecurityState, acl_problem, auth_command_problem, credentials_problem
from kq.raft.results import RejectedResult
from kq.raft.state_machine import apply
from kq.storage import Store

MAP_BYTES = 64 * 1024**2


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(tmp_path / "store", map_size_bytes=MAP_BYTES)
    yield opened
    opened.close()


class Log:
    """Applies commands to a store at rising indexes."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.index = 0

    def __call__(self, command: kq_pb2.Command) -> object:
        self.index += 1
        return apply(self.store, self.index, commands.encode(command))

    def state(self) -> SecurityState:
        with self.store.read() as reader:
            return SecurityState.load(reader)


def token(token_id: str = "0123456789abcdef", user: str = "alice", expires_ms: int = 0) -> kq_pb2.Token:
    return kq_pb2.Token(
        token_id=token_id, user=user, secret_sha256=b"h" * 32, created_ms=5, expires_ms=expires_ms
    )


def test_a_user_is_created_replaced_and_deleted_with_its_tokens(store: Store) -> None:
    log = Log(store)
    credentials = [scram_credential("SCRAM-SHA-256", "pw")]
    assert log(commands.put_user("alice", credentials)) == AuthResult(ErrorCode.OK, created=True)
    assert log(commands.put_user("alice", credentials)) == AuthResult(ErrorCode.OK, created=False)
    assert log(commands.put_token(token())) == AuthResult(ErrorCode.OK, created=True)
    assert log(commands.put_token(token(user="bob"))) == AuthResult(ErrorCode.UNKNOWN_USER)
    state = log.state()
    assert set(state.users) == {"alice"} and set(state.tokens) == {"0123456789abcdef"}
    assert state.credential("alice", "SCRAM-SHA-256") == credentials[0]
    assert state.credential("alice", "SCRAM-SHA-512") is None
    assert log(commands.delete_user("alice")) == AuthResult(ErrorCode.OK)
    assert log(commands.delete_user("alice")) == AuthResult(ErrorCode.UNKNOWN_USER)
    assert log.state().tokens == {}  # The user's tokens went with it.
    assert log(commands.delete_token("0123456789abcdef")) == AuthResult(ErrorCode.UNKNOWN_TOKEN)


def test_alter_scram_sets_and_removes_one_mechanism_per_user(store: Store) -> None:
    """AlterScram (Kafka's AlterUserScramCredentials) creates a user, adds and replaces one mechanism
    without touching the other, answers UNKNOWN_USER for a credential that is not there, and deletes
    the user (and its tokens) with its last credential."""
    log = Log(store)
    sha256, sha512 = scram_credential("SCRAM-SHA-256", "pw"), scram_credential("SCRAM-SHA-512", "pw")

    def upsert(user: str, credential: kq_pb2.ScramCredential) -> kq_pb2.ScramUpsertion:
        return kq_pb2.ScramUpsertion(user=user, credential=credential)

    def delete(user: str, mechanism: str) -> kq_pb2.ScramDeletion:
        return kq_pb2.ScramDeletion(user=user, mechanism=mechanism)

    result = log(commands.alter_scram([upsert("erin", sha256)], [delete("frank", "SCRAM-SHA-256")]))
    assert result == AuthResult(
        ErrorCode.OK, users=(("erin", ErrorCode.OK), ("frank", ErrorCode.UNKNOWN_USER))
    )
    assert log(commands.alter_scram([upsert("erin", sha512)], [])) == AuthResult(
        ErrorCode.OK, users=(("erin", ErrorCode.OK),)
    )
    state = log.state()
    assert state.credential("erin", "SCRAM-SHA-256") == sha256
    assert state.credential("erin", "SCRAM-SHA-512") == sha512
    assert log(commands.put_token(token(user="erin"))) == AuthResult(ErrorCode.OK, created=True)
    log(commands.alter_scram([], [delete("erin", "SCRAM-SHA-256")]))
    assert log.state().credential("erin", "SCRAM-SHA-256") is None and "erin" in log.state().users
    log(commands.alter_scram([], [delete("erin", "SCRAM-SHA-512")]))
    assert log.state().users == {} and log.state().tokens == {}
    assert "once per request" in (
        auth_command_problem(commands.alter_scram([upsert("x", sha256)], [delete("x", "SCRAM-SHA-512")]))
        or ""
    )


def test_acls_are_a_set_and_removal_counts_what_was_there(store: Store) -> None:
    log = Log(store)
    rule = acl("User:alice", "read", "topic", "t")
    assert log(commands.add_acls([rule, rule])) == AuthResult(ErrorCode.OK, created=True)
    assert log(commands.add_acls([rule])) == AuthResult(ErrorCode.OK, created=False)
    assert log.state().acls == (rule,)
    other = acl("User:bob", "read", "topic", "t")
    assert log(commands.remove_acls([rule, other])) == AuthResult(ErrorCode.OK, removed=1)
    assert log.state().acls == ()


def test_full_tables_are_refused_alike(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "USERS_MAX", 1)
    monkeypatch.setattr(auth, "ACLS_MAX", 2)
    log = Log(store)
    credentials = [scram_credential("SCRAM-SHA-512", "pw")]
    assert log(commands.put_user("alice", credentials)).error == ErrorCode.OK  # type: ignore[attr-defined]
    assert log(commands.put_user("bob", credentials)) == AuthResult(ErrorCode.SECURITY_LIMIT_REACHED)
    assert log(commands.put_user("alice", credentials)).error == ErrorCode.OK  # type: ignore[attr-defined]
    rules = [acl("User:alice", op, "topic", "t") for op in ("read", "write", "describe")]
    assert log(commands.add_acls(rules)) == AuthResult(ErrorCode.SECURITY_LIMIT_REACHED)
    assert log.state().acls == ()  # All or nothing.


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        (commands.put_user("a b", [scram_credential("SCRAM-SHA-256", "pw")]), "a user name is"),
        (commands.put_user("ANONYMOUS", [scram_credential("SCRAM-SHA-256", "pw")]), "ANONYMOUS"),
        (commands.put_user("alice", []), "at least one mechanism"),
        (commands.put_token(token(token_id="XYZ")), "16 lowercase hex"),
        (commands.put_token(token(expires_ms=5)), "expires after"),
        (commands.delete_token("nope"), "16 lowercase hex"),
        (commands.add_acls([]), "1 to"),
        (commands.add_acls([acl("alice", "read", "topic", "t")]), "User:<name>"),
        (commands.add_acls([acl("User:alice", "read", "cluster", "other")]), "kq-cluster"),
        (commands.add_acls([acl("User:alice", "read", "topic", "a/b")]), "topic or group name"),
        (commands.add_acls([acl("User:alice", "read", "topic", "*", prefixed=True)]), "topic or group name"),
    ],
)
def test_bad_security_commands_are_refused_at_the_edge_and_in_apply(
    store: Store, command: kq_pb2.Command, problem: str
) -> None:
    found = auth_command_problem(command)
    assert found is not None and problem in found
    result = Log(store)(command)
    assert isinstance(result, RejectedResult) and problem in result.reason


def test_credentials_must_fit_their_mechanism() -> None:
    good = scram_credential("SCRAM-SHA-512", "pw")
    assert credentials_problem([good]) is None
    short = kq_pb2.ScramCredential()
    short.CopyFrom(good)
    short.stored_key = good.stored_key[:32]
    assert "64 bytes" in (credentials_problem([short]) or "")
    assert "twice" in (credentials_problem([good, good]) or "")
    weak = kq_pb2.ScramCredential()
    weak.CopyFrom(good)
    weak.iterations = 1000
    assert "iterations" in (credentials_problem([weak]) or "")


def test_scram_keys_follow_rfc_5802() -> None:
    """RFC 7677's SCRAM-SHA-256 example: user "user", password "pencil", its salt and 4096 iterations."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    stored_key, server_key = scram_keys("SCRAM-SHA-256", "pencil", salt, 4096)
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", salt, 4096)
    assert server_key == hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    assert stored_key == hashlib.sha256(hmac.new(salted, b"Client Key", hashlib.sha256).digest()).digest()
    # The server signature of RFC 7677's exchange, computed from the server key alone.
    auth_message = (
        b"n=user,r=rOprNGfwEbeRWgbNEkqO,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    )
    signature = hmac.new(server_key, auth_message, hashlib.sha256).digest()
    assert base64.b64encode(signature) == b"6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _state(*rules: kq_pb2.Acl) -> SecurityState:
    return SecurityState({}, {}, rules, tuple(auth.Rule.of(rule) for rule in rules))


def test_allow_deny_prefix_wildcard_and_implied_describe() -> None:
    state = _state(
        acl("User:alice", "read", "topic", "logs.", prefixed=True),
        acl("User:alice", "read", "topic", "logs.secret", deny=True),
        acl("User:*", "describe", "group", "*"),
        acl("User:bob", "all", "topic", "orders"),
    )
    assert state.allowed("User:alice", READ, TOPIC, "logs.app")
    assert state.allowed("User:alice", DESCRIBE, TOPIC, "logs.app")  # READ implies DESCRIBE.
    assert not state.allowed("User:alice", READ, TOPIC, "logs.secret")  # A deny wins.
    assert not state.allowed("User:alice", WRITE, TOPIC, "logs.app")
    assert not state.allowed("User:alice", READ, TOPIC, "logs")  # The prefix is "logs.".
    assert not state.allowed("User:alice", READ, GROUP, "logs.app")  # Another resource type.
    assert state.allowed("User:carol", DESCRIBE, GROUP, "any")  # User:* and "*".
    assert not state.allowed("User:carol", READ, GROUP, "any")
    assert state.allowed("User:bob", DELETE, TOPIC, "orders") and not state.allowed(
        "User:bob", READ, TOPIC, "o"
    )
    assert not state.allowed("User:nobody", DESCRIBE, TOPIC, "orders")  # No ACL: no.


def test_every_acl_the_client_helper_builds_is_valid() -> None:
    for operation in ("all", "read", "write", "create", "delete", "alter", "describe"):
        for kind, name in (("topic", "t"), ("group", "g"), ("cluster", "kq-cluster")):
            assert acl_problem(acl("User:alice", operation, kind, name)) is None
