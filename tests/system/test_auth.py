"""Authentication and ACLs on three real nodes started with `--auth` (TLS without client certificates,
so principals come from tokens): without credentials every RPC answers UNAUTHENTICATED; a user
without ACLs is refused PERMISSION_DENIED and changes nothing; ACLs grant exactly what they name, on
every node; a revoked token or a deleted user stops working on every node; the CLI manages it all."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from kq.cli.main import kq
from kq.client import AuthenticationError, KqClient, PermissionDeniedError, ProducedBatch, TlsConfig
from kq.client.security import acl
from kq.deploy.cluster import LocalCluster
from kq.proto import kq_pb2
from kq.proto.errors import ERROR_CODE_METADATA_KEY, ErrorCode, metadata_value
from kq.proto.records import BatchBuilder, NewRecord

pytestmark = pytest.mark.system

REFUSED_TIMEOUT_S = 2.0
PROPAGATION_S = 5.0  # Followers apply an entry a heartbeat or so after the leader.


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    base = tmp_path_factory.mktemp("auth")
    with LocalCluster(
        base / "cluster",
        tls_dir=base / "certs",
        require_client_certs=False,
        kafka=False,
        node_args=("--auth", "--super-user", "User:admin"),
    ) as cluster:
        with cluster_admin(cluster) as admin:
            admin.create_topic("t", partitions=1)
            admin.send("t", b"before", partition=0)
        yield cluster


def cluster_admin(cluster: LocalCluster) -> KqClient:
    """A super-user client: the cluster secret's holder (Node:admin)."""
    return KqClient(cluster.bootstrap, tls=_ca(cluster), secret=cluster.secret)


def _ca(cluster: LocalCluster) -> TlsConfig:
    assert cluster.tls is not None
    return TlsConfig(cluster.tls.ca)


def user_with_token(cluster: LocalCluster, name: str) -> str:
    with cluster_admin(cluster) as admin:
        admin.put_user(name, f"{name}-password")
        token = admin.create_token(name, description="test").token
    settle(cluster)
    return token


def settle(cluster: LocalCluster) -> None:
    """Waits until every node applied what the leader has: each node checks credentials and ACLs
    against its own copy, which follows the leader's by a heartbeat or so."""
    leader = cluster.wait_ready()
    with cluster_admin(cluster) as admin:
        applied = admin.node_status(cluster.nodes[leader].grpc_address).applied_index
    cluster.wait_applied(applied, list(cluster.nodes))


def test_every_rpc_without_credentials_answers_unauthenticated(guarded: LocalCluster) -> None:
    """Each method of kq.v1.Broker, called with no token (and with a wrong one), on a follower and on
    the leader: UNAUTHENTICATED with kq-error-code 29; nothing changed."""
    leader = guarded.wait_ready()
    service = kq_pb2.DESCRIPTOR.services_by_name["Broker"]
    credentials = grpc.ssl_channel_credentials(_ca(guarded).ca)
    for node_id, spec in guarded.nodes.items():
        with grpc.secure_channel(spec.grpc_address, credentials) as channel:
            for method in service.methods:
                request_class = getattr(kq_pb2, method.input_type.name)
                path = f"/kq.v1.Broker/{method.name}"
                for metadata in ((), (("authorization", "Bearer kq_0123456789abcdef_wrong"),)):
                    with pytest.raises(grpc.RpcError) as caught:
                        if method.client_streaming:
                            bidi = channel.stream_stream(path, request_class.SerializeToString, None)
                            next(iter(bidi(iter([request_class()]), metadata=metadata, timeout=5)))
                        elif method.server_streaming:
                            stream = channel.unary_stream(path, request_class.SerializeToString, None)
                            next(iter(stream(request_class(), metadata=metadata, timeout=5)))
                        else:
                            unary = channel.unary_unary(path, request_class.SerializeToString, None)
                            unary(request_class(), metadata=metadata, timeout=5)
                    error = caught.value
                    where = f"{method.name} on node {node_id} (leader {leader})"
                    assert error.code() == grpc.StatusCode.UNAUTHENTICATED, where
                    code = metadata_value(error.trailing_metadata(), ERROR_CODE_METADATA_KEY)
                    assert code == str(int(ErrorCode.UNAUTHENTICATED)), where
    with cluster_admin(guarded) as admin:
        assert [topic.name for topic in admin.list_topics()] == ["t"]
        assert admin.list_offsets("t")[0].log_end_offset == 1


def test_a_user_without_acls_is_denied_and_nothing_changes(guarded: LocalCluster) -> None:
    token = user_with_token(guarded, "nobody")
    with KqClient(
        guarded.bootstrap, tls=_ca(guarded), token=token, retry_timeout_s=REFUSED_TIMEOUT_S
    ) as user:
        assert user.whoami() == ("User:nobody", False)
        with pytest.raises(PermissionDeniedError):
            user.create_topic("mine", partitions=1)
        with pytest.raises(PermissionDeniedError):
            user.send("t", b"sneaky", partition=0)
        with pytest.raises(PermissionDeniedError):
            user.fetch("t", 0, 0)
        with pytest.raises(PermissionDeniedError):
            user.delete_topic("t")
        with pytest.raises(PermissionDeniedError):
            user.add_acls([acl("User:nobody", "all", "topic", "*")])
        with pytest.raises(PermissionDeniedError):
            user.join_group("g", topics=["t"])
        assert user.list_topics() == []  # Only what it may describe.
        own = user.create_token(description="mine")  # Its own tokens need no ACL...
        assert own.token_id in [info.token_id for info in user.list_tokens("nobody")]
        with pytest.raises(PermissionDeniedError):
            user.list_tokens()  # ...everyone's do.
        assert user.whoami() == ("User:nobody", False)
    with cluster_admin(guarded) as admin:
        assert [topic.name for topic in admin.list_topics()] == ["t"]
        assert admin.list_offsets("t")[0].log_end_offset == 1
        assert not admin.list_acls("User:nobody")
        assert "g" not in [group.name for group in admin.list_groups()]


def test_acls_grant_exactly_what_they_name_on_every_node(guarded: LocalCluster) -> None:
    token = user_with_token(guarded, "alice")
    with cluster_admin(guarded) as admin:
        admin.create_topic("orders.eu", partitions=1)
        admin.create_topic("payroll", partitions=1)
        admin.add_acls(
            [
                acl("User:alice", "write", "topic", "orders.", prefixed=True),
                acl("User:alice", "read", "topic", "orders.", prefixed=True),
                acl("User:alice", "read", "group", "billing"),
            ]
        )
    settle(guarded)
    leader = guarded.wait_ready()
    follower = next(node for node in guarded.nodes if node != leader)
    at_follower = guarded.nodes[follower].grpc_address
    with KqClient([at_follower], tls=_ca(guarded), token=token) as alice:
        assert [topic.name for topic in alice.list_topics(node=at_follower)] == ["orders.eu"]
        sent = alice.send("orders.eu", b"order-1", partition=0)  # Via the follower: redirected.
        records = alice.fetch("orders.eu", 0, sent.offset, wait_ms=5_000, node=at_follower).records
        assert [record.value for record in records] == [b"order-1"]
        assignment = alice.join_group("billing", topics=["orders.eu"])
        alice.commit_offsets(
            "billing", {("orders.eu", 0): 1}, member_id=assignment.member_id, generation=assignment.generation
        )
        with pytest.raises(PermissionDeniedError):
            alice.send("payroll", b"raise", partition=0)
        # One ProduceMany call naming both topics: the refused one fails alone (Kafka answers per partition).
        orders, payroll = BatchBuilder(), BatchBuilder()
        orders.append(NewRecord(None, b"order-2"))
        payroll.append(NewRecord(None, b"raise"))
        both = alice.produce_batches([("orders.eu", 0, orders), ("payroll", 0, payroll)])
        assert isinstance(both[0], ProducedBatch) and both[0].base_offset == sent.offset + 1
        assert isinstance(both[1], PermissionDeniedError)
        with pytest.raises(PermissionDeniedError):
            alice.join_group("other", topics=["orders.eu"])
        with pytest.raises(PermissionDeniedError):
            alice.delete_topic("orders.eu")  # READ and WRITE do not include DELETE.
        alice.leave_group("billing", assignment.member_id)


def test_list_groups_shows_every_group_to_describe_on_the_cluster(guarded: LocalCluster) -> None:
    """As Kafka's ListGroups: DESCRIBE on the cluster lists every group; DESCRIBE on a group lists
    that group only; no ACL lists none."""
    with cluster_admin(guarded) as admin:
        for group in ("ledger", "audit"):
            member = admin.join_group(group, topics=["t"])
            admin.leave_group(group, member.member_id)
        admin.add_acls(
            [acl("User:ops", "describe", "cluster"), acl("User:viewer", "describe", "group", "ledger")]
        )
        everything = {group.name for group in admin.list_groups()}
    assert {"ledger", "audit"} <= everything
    tokens = {name: user_with_token(guarded, name) for name in ("ops", "viewer", "stranger")}
    expected = {"ops": everything, "viewer": {"ledger"}, "stranger": set()}
    for name, token in tokens.items():
        with KqClient(guarded.bootstrap, tls=_ca(guarded), token=token) as user:
            assert {group.name for group in user.list_groups()} == expected[name], name


def test_a_revoked_token_and_a_deleted_user_stop_working_on_every_node(guarded: LocalCluster) -> None:
    token = user_with_token(guarded, "carol")
    second = ""
    with cluster_admin(guarded) as admin:
        second = admin.create_token("carol").token
        token_id = token.split("_")[1]
        assert token_id in [info.token_id for info in admin.list_tokens("carol")]
        admin.revoke_token(token_id)
    _refused_everywhere(guarded, token)
    with KqClient(guarded.bootstrap, tls=_ca(guarded), token=second) as carol:
        assert carol.whoami() == ("User:carol", False)
    with cluster_admin(guarded) as admin:
        admin.delete_user("carol")
        assert "carol" not in [user.name for user in admin.list_users()]
    _refused_everywhere(guarded, second)


def _refused_everywhere(cluster: LocalCluster, token: str) -> None:
    for spec in cluster.nodes.values():
        deadline = time.monotonic() + PROPAGATION_S
        with KqClient([spec.grpc_address], tls=_ca(cluster), token=token, retry_timeout_s=0.5) as client:
            while True:
                try:
                    client.whoami()
                except AuthenticationError:
                    break
                assert time.monotonic() < deadline, f"{spec.grpc_address} still accepts the token"
                time.sleep(0.1)


def test_the_cli_adds_users_tokens_and_acls(guarded: LocalCluster, tmp_path: Path) -> None:
    assert guarded.tls_dir is not None
    secret_file = tmp_path / "secret"
    secret_file.write_text(guarded.secret + "\n")
    base = ["--bootstrap", ",".join(guarded.bootstrap), "--tls-ca", str(guarded.tls_dir / "ca.pem")]
    admin = [*base, "--secret-file", str(secret_file)]
    runner = CliRunner()
    added = runner.invoke(kq, [*admin, "users", "add", "dave", "--password-stdin"], input="dave-pw\n")
    assert added.exit_code == 0 and added.output.strip() == "created user dave", added.output
    created = runner.invoke(kq, [*admin, "tokens", "create", "--user", "dave", "--ttl", "3600"])
    assert created.exit_code == 0, created.output
    token = created.stdout.strip().splitlines()[-1]
    assert token.startswith("kq_")
    settle(guarded)
    granted = runner.invoke(
        kq, [*admin, "acls", "add", "--principal", "User:dave", "--operation", "describe", "--topic", "t"]
    )
    assert granted.exit_code == 0 and "User:dave ALLOW describe topic t" in granted.output, granted.output
    settle(guarded)
    listed = runner.invoke(kq, [*admin, "acls", "list", "--principal", "User:dave"])
    assert listed.output.strip() == "User:dave ALLOW describe topic t"
    whoami = runner.invoke(kq, [*base, "--token", token, "whoami"])
    assert whoami.exit_code == 0 and whoami.output.strip() == "User:dave", whoami.output
    topics = runner.invoke(kq, [*base, "--token", token, "topics", "list"])
    assert topics.exit_code == 0 and "t" in topics.output.split(), topics.output
    denied = runner.invoke(kq, [*base, "--token", token, "topics", "create", "x", "--partitions", "1"])
    assert denied.exit_code != 0 and "User:dave may not CREATE" in denied.output, denied.output
    anonymous = runner.invoke(kq, [*base, "--timeout", "1", "topics", "list"])
    assert anonymous.exit_code != 0 and len(anonymous.output.strip().splitlines()) == 1, anonymous.output
    removed = runner.invoke(kq, [*admin, "users", "remove", "dave"])
    assert removed.exit_code == 0, removed.output
