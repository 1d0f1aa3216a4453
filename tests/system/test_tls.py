"""gRPC over TLS on three real nodes with mutual TLS required (certificates from `kq certs init`):
the client library and the CLI work with the cluster's CA and a client certificate, writes reach the
leader through a follower, and a client without TLS, without a certificate or with another CA's
certificate is refused, changing nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kq.broker.main import main as node_main
from kq.cli.main import kq
from kq.client import KqClient, KqClientError, PermissionDeniedError, TlsConfig
from kq.client.security import acl
from kq.client.tls import is_loopback
from kq.deploy import certs
from kq.deploy.cluster import LocalCluster

pytestmark = pytest.mark.system

REFUSED_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Mutual TLS with `--auth`: a client certificate's common name is its principal; `admin` is a
    super-user, `bob` (a certificate of the same CA) holds no ACL."""
    base = tmp_path_factory.mktemp("tls")
    certs.init(base / "certs", {"1": ["127.0.0.1"]}, ["admin", "bob"], days=1)
    with LocalCluster(
        base / "cluster", tls_dir=base / "certs", node_args=("--auth", "--super-user", "User:admin")
    ) as cluster:
        yield cluster


def test_a_certificate_is_its_principal_and_acls_bind_it(secure: LocalCluster) -> None:
    assert secure.tls_dir is not None
    directory = secure.tls_dir
    bob_tls = TlsConfig.from_files(directory / "ca.pem", directory / "bob.pem", directory / "bob-key.pem")
    with KqClient(secure.bootstrap, tls=bob_tls, retry_timeout_s=REFUSED_TIMEOUT_S) as bob:
        assert bob.whoami() == ("User:bob", False)
        with pytest.raises(PermissionDeniedError):
            bob.create_topic("bobs", partitions=1)
        with pytest.raises(PermissionDeniedError):
            bob.create_token("admin")  # Another user's token needs ALTER on the cluster.
        with pytest.raises(PermissionDeniedError):
            bob.list_tokens()  # Everyone's tokens need DESCRIBE on the cluster.
    with KqClient(secure.bootstrap, tls=secure.tls) as admin:
        assert admin.whoami() == ("User:admin", True)
        admin.add_acls([acl("User:bob", "create", "topic", "bobs")])
        secure.wait_applied(admin.index_seen, list(secure.nodes))  # Each node checks its own copy.
    with KqClient(secure.bootstrap, tls=bob_tls) as bob:
        bob.create_topic("bobs", partitions=1)
        with pytest.raises(PermissionDeniedError):
            bob.create_topic("other", partitions=1)


def test_a_client_with_the_cluster_ca_and_a_certificate_reads_and_writes(secure: LocalCluster) -> None:
    leader = secure.wait_ready()
    follower = next(node for node in secure.nodes if node != leader)
    with KqClient([secure.nodes[follower].grpc_address], tls=secure.tls) as client:
        client.create_topic("secure", partitions=1)  # Sent to a follower: redirected to the leader.
        sent = client.send("secure", b"over tls", partition=0)
        at_follower = secure.nodes[follower].grpc_address
        records = client.fetch("secure", 0, 0, wait_ms=5_000, node=at_follower).records
    assert [record.value for record in records] == [b"over tls"] and sent.offset == 0


def test_clients_without_tls_without_a_certificate_or_from_another_ca_are_refused(
    secure: LocalCluster, tmp_path: Path
) -> None:
    assert secure.tls is not None and secure.tls_dir is not None
    other = certs.init(tmp_path / "other", {"1": ["127.0.0.1"]}, ["admin"], days=1)
    strangers = {
        "plain text": None,
        "no client certificate": TlsConfig(secure.tls.ca),
        "another CA's certificate": TlsConfig.from_files(
            secure.tls_dir / "ca.pem", tmp_path / "other" / "admin.pem", tmp_path / "other" / "admin-key.pem"
        ),
        "another CA": TlsConfig.from_files(
            other.ca, tmp_path / "other" / "admin.pem", tmp_path / "other" / "admin-key.pem"
        ),
    }
    for what, tls in strangers.items():
        with (
            KqClient(secure.bootstrap, retry_timeout_s=REFUSED_TIMEOUT_S, tls=tls) as client,
            pytest.raises(KqClientError),
        ):
            client.create_topic(f"refused-{len(what)}", partitions=1)
    with KqClient(secure.bootstrap, tls=secure.tls) as client:
        assert not [topic.name for topic in client.list_topics() if topic.name.startswith("refused-")]


def _librdkafka_ssl(cluster: LocalCluster, client: str) -> dict[str, object]:
    """librdkafka's settings for the cluster's Kafka listener over SSL, presenting `client`'s certificate."""
    assert cluster.tls_dir is not None
    directory = cluster.tls_dir
    return {
        "bootstrap.servers": cluster.kafka_bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": str(directory / "ca.pem"),
        "ssl.certificate.location": str(directory / f"{client}.pem"),
        "ssl.key.location": str(directory / f"{client}-key.pem"),
    }


def test_kafka_clients_produce_and_consume_over_mutual_tls(secure: LocalCluster) -> None:
    """librdkafka and kafka-python with security.protocol=SSL and the admin certificate; a plain-text
    client gets no metadata."""
    confluent = pytest.importorskip("confluent_kafka")
    kafka = pytest.importorskip("kafka")
    assert secure.tls_dir is not None
    directory = secure.tls_dir
    producer = confluent.Producer(_librdkafka_ssl(secure, "admin"))
    for i in range(5):
        producer.produce("kafka-secure", value=f"ssl-{i}".encode())
    assert producer.flush(30) == 0
    consumer = kafka.KafkaConsumer(
        "kafka-secure",
        bootstrap_servers=secure.kafka_bootstrap,
        security_protocol="SSL",
        ssl_cafile=str(directory / "ca.pem"),
        ssl_certfile=str(directory / "admin.pem"),
        ssl_keyfile=str(directory / "admin-key.pem"),
        ssl_check_hostname=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=10_000,
    )
    values = []
    try:
        for message in consumer:  # Up to consumer_timeout_ms without a record: not a wait to the end.
            values.append(message.value)
            if len(values) == 5:
                break
    finally:
        consumer.close()
    assert values == [f"ssl-{i}".encode() for i in range(5)]
    admin = pytest.importorskip("confluent_kafka.admin")
    plain = admin.AdminClient({"bootstrap.servers": secure.kafka_bootstrap})
    with pytest.raises(confluent.KafkaException):
        plain.list_topics(timeout=3)


def test_a_kafka_client_certificate_is_its_principal_for_acls(secure: LocalCluster) -> None:
    """Over the Kafka listener too, bob's certificate makes it User:bob: its produce is refused
    TOPIC_AUTHORIZATION_FAILED and writes nothing until an ACL lets it WRITE the topic."""
    confluent = pytest.importorskip("confluent_kafka")
    bob = {**_librdkafka_ssl(secure, "bob"), "message.timeout.ms": 10_000}
    with KqClient(secure.bootstrap, tls=secure.tls) as admin:
        admin.create_topic("kafka-bob", partitions=1)
        admin.add_acls([acl("User:bob", "describe", "topic", "kafka-bob")])
        secure.wait_applied(admin.index_seen, list(secure.nodes))
    reports: list[object] = []
    producer = confluent.Producer(bob)
    producer.produce("kafka-bob", value=b"refused", on_delivery=lambda error, _message: reports.append(error))
    producer.flush(30)
    assert [getattr(error, "code", lambda: None)() for error in reports] == [
        confluent.KafkaError.TOPIC_AUTHORIZATION_FAILED
    ]
    with KqClient(secure.bootstrap, tls=secure.tls) as admin:
        assert admin.list_offsets("kafka-bob")[0].log_end_offset == 0
        admin.add_acls([acl("User:bob", "write", "topic", "kafka-bob")])
        secure.wait_applied(admin.index_seen, list(secure.nodes))
    producer = confluent.Producer(bob)
    producer.produce("kafka-bob", value=b"allowed")
    assert producer.flush(30) == 0


def test_the_cli_talks_tls_with_its_options(secure: LocalCluster) -> None:
    assert secure.tls_dir is not None
    directory = secure.tls_dir
    base = ["--bootstrap", ",".join(secure.bootstrap), "--tls-ca", str(directory / "ca.pem")]
    with_cert = [
        *base,
        "--tls-cert",
        str(directory / "admin.pem"),
        "--tls-key",
        str(directory / "admin-key.pem"),
    ]
    created = CliRunner().invoke(kq, [*with_cert, "topics", "create", "cli-secure", "--partitions", "1"])
    assert created.exit_code == 0, created.output
    refused = CliRunner().invoke(kq, [*base, "--timeout", "2", "topics", "list"])
    assert refused.exit_code != 0
    half = CliRunner().invoke(kq, ["--tls-cert", str(directory / "admin.pem"), "topics", "list"])
    assert half.exit_code != 0 and "need --tls-ca" in half.output


def test_a_node_refuses_half_a_tls_setup(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        node_main,
        [
            "--node-id", "1", "--grpc-address", "127.0.0.1:1", "--raft-address", "127.0.0.1:2",
            "--peers", "1=127.0.0.1:2=127.0.0.1:1", "--data-dir", str(tmp_path), "--secret", "s",
            "--tls-cert", str(tmp_path / "missing.pem"),
        ],
    )  # fmt: skip
    assert result.exit_code == 2 and "TLS needs all of --tls-cert, --tls-key and --tls-ca" in result.output


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--grpc-address", "10.255.255.1:9101"], "is not a loopback address: serve gRPC over TLS"),
        (["--kafka-address", "10.255.255.1:9092"], "serve Kafka over TLS (--kafka-tls) or pass --insecure"),
        (["--raft-address", "10.255.255.1:7101"], "authenticated by --secret but not encrypted"),
    ],
)
def test_plain_text_on_a_non_loopback_address_needs_insecure(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    """Plain text is the default on loopback only: exposing it takes --insecure (a usage error without)."""
    arguments = [
        "--node-id", "1", "--grpc-address", "127.0.0.1:1", "--raft-address", "127.0.0.1:2",
        "--peers", "1=127.0.0.1:2=127.0.0.1:1=127.0.0.1:3", "--data-dir", str(tmp_path), "--secret", "s",
    ]  # fmt: skip
    result = CliRunner().invoke(node_main, [*arguments, *flags])
    assert result.exit_code == 2 and message in result.output


def test_loopback_means_localhost_127_0_0_0_8_and_ipv6_one() -> None:
    assert all(is_loopback(a) for a in ("localhost:1", "127.0.0.1:1", "127.9.8.7:1", "[::1]:1"))
    assert not any(is_loopback(a) for a in ("10.0.0.1:1", "0.0.0.0:1", "kq-1.example:1", "[::]:1"))
