"""SASL_SSL and ACLs on the Kafka listeners of three real nodes (`--kafka-tls --kafka-sasl --auth`).

Users and ACLs are created over gRPC by the super-user User:admin (the client certificate of `kq
certs init`). Then librdkafka (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) and kafka-python (SCRAM-SHA-512)
produce and consume as a user that holds ACLs; a wrong password fails authentication and the node
closes the connection; a user without ACLs is refused per topic and group, and writes nothing; and
random SASL frames never break a node.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsV0
from kio.schema.describe_acls.v1.request import DescribeAclsRequest
from kio.schema.describe_user_scram_credentials.v0.request import (
    DescribeUserScramCredentialsRequest,
    UserName,
)
from kio.schema.metadata.v4.request import MetadataRequest, MetadataRequestTopic
from kio.schema.offset_for_leader_epoch.v4.request import (
    OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
)
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32

from kq.client import KqClient
from kq.client.security import acl
from kq.deploy.cluster import LocalCluster
from kq.proto.limits import KAFKA_UNAUTHENTICATED_FRAME_BYTES_MAX
from tests.kafka.wire import decode_response, read_frame, request_frame

pytestmark = pytest.mark.system

confluent = pytest.importorskip("confluent_kafka")
confluent_admin = pytest.importorskip("confluent_kafka.admin")
kafka = pytest.importorskip("kafka")

ALICE, ALICE_PASSWORD = "alice", "alice-password-1"
MALLORY, MALLORY_PASSWORD = "mallory", "mallory-password-1"
TOPIC = "sasl-orders"  # alice may do anything with "sasl-*" topics and groups; mallory may DESCRIBE it.
MALLORY_GROUP = "sasl-mallory"  # mallory may DESCRIBE (find its coordinator), not READ (join).
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
WAIT_S = 30.0
FUZZ_EXAMPLES = 300


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three nodes with SASL_SSL Kafka listeners and --auth; users alice and mallory, their ACLs, and
    the topic (one partition)."""
    base = tmp_path_factory.mktemp("kafka-sasl")
    node_args = ["--auth", "--super-user", "User:admin", "--kafka-sasl"]
    with LocalCluster(base / "cluster", tls_dir=base / "certs", node_args=node_args) as cluster:
        with KqClient(cluster.bootstrap, tls=cluster.tls) as admin:
            admin.put_user(ALICE, ALICE_PASSWORD)
            admin.put_user(MALLORY, MALLORY_PASSWORD)
            admin.add_acls(
                [
                    acl(f"User:{ALICE}", "all", "topic", "sasl-", prefixed=True),
                    acl(f"User:{ALICE}", "all", "group", "sasl-", prefixed=True),
                    acl(f"User:{MALLORY}", "describe", "topic", TOPIC),
                    acl(f"User:{MALLORY}", "describe", "group", MALLORY_GROUP),
                ]
            )
            admin.create_topic(TOPIC, partitions=1)
            for mechanism in MECHANISMS:
                admin.create_topic(f"sasl-{mechanism.lower()}", partitions=1)
            # Each node checks passwords and ACLs against its own copy, a heartbeat or so behind.
            cluster.wait_applied(admin.index_seen, list(cluster.nodes))
        yield cluster


def _sasl(cluster: LocalCluster, mechanism: str, user: str, password: str) -> dict[str, Any]:
    """librdkafka's settings for SASL_SSL, as the README gives them."""
    assert cluster.tls_dir is not None
    return {
        "bootstrap.servers": cluster.kafka_bootstrap,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(cluster.tls_dir / "ca.pem"),
        "sasl.mechanisms": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def _end_offset(cluster: LocalCluster, topic: str) -> int:
    with KqClient(cluster.bootstrap, tls=cluster.tls) as admin:
        return admin.list_offsets(topic)[0].log_end_offset


def _until(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_produces_and_consumes_in_a_group_over_sasl_ssl(
    secure: LocalCluster, mechanism: str
) -> None:
    """alice, with each mechanism: three records produced, then read back by a consumer group that commits."""
    topic = f"sasl-{mechanism.lower()}"
    settings = _sasl(secure, mechanism, ALICE, ALICE_PASSWORD)
    producer = confluent.Producer(settings)
    for i in range(3):
        producer.produce(topic, value=f"{mechanism}-{i}".encode())
    assert producer.flush(WAIT_S) == 0
    consumer = confluent.Consumer(
        {**settings, "group.id": f"sasl-group-{mechanism.lower()}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    try:

        def three() -> bool:
            message = consumer.poll(1.0)
            if message is not None:
                assert message.error() is None, message.error()
                values.append(message.value())
            return len(values) >= 3

        _until(three, "three records")
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert values == [f"{mechanism}-{i}".encode() for i in range(3)]


def test_kafka_python_produces_and_consumes_over_sasl_ssl(secure: LocalCluster) -> None:
    """kafka-python with SCRAM-SHA-512: a producer, then a group consumer."""
    assert secure.tls_dir is not None
    common: dict[str, Any] = {
        "bootstrap_servers": secure.kafka_bootstrap,
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(secure.tls_dir / "ca.pem"),
        "ssl_check_hostname": False,
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": ALICE,
        "sasl_plain_password": ALICE_PASSWORD,
    }
    producer = kafka.KafkaProducer(**common)
    try:
        for i in range(3):
            producer.send(TOPIC, f"python-{i}".encode()).get(timeout=WAIT_S)
    finally:
        producer.close()
    consumer = kafka.KafkaConsumer(
        TOPIC, group_id="sasl-python", auto_offset_reset="earliest", consumer_timeout_ms=10_000, **common
    )
    values = []
    try:
        for message in consumer:
            values.append(message.value)
            if len(values) == 3:
                break
    finally:
        consumer.close()
    assert values == [f"python-{i}".encode() for i in range(3)]


@pytest.mark.parametrize(("user", "password"), [(ALICE, "wrong"), ("mallory", "any")])
def test_a_wrong_password_fails_authentication_and_writes_nothing(
    secure: LocalCluster, user: str, password: str
) -> None:
    """librdkafka reports the failed authentication, alike for a wrong password and a user that does
    not exist (whose SCRAM exchange also runs to client-final); its records are never written."""
    before = _end_offset(secure, TOPIC)
    errors: list[Any] = []
    settings = {**_sasl(secure, "SCRAM-SHA-256", user, password), "error_cb": errors.append}
    producer = confluent.Producer({**settings, "message.timeout.ms": 3000})
    producer.produce(TOPIC, value=b"never")
    producer.flush(10)
    failures = [e for e in errors if e.code() == confluent.KafkaError._AUTHENTICATION]
    assert failures and "Authentication failed" in failures[0].str(), errors
    assert _end_offset(secure, TOPIC) == before


def _tls_socket(cluster: LocalCluster, node_id: str = "1") -> ssl.SSLSocket:
    """A TLS connection to a node's Kafka listener, without a client certificate (SASL_SSL asks none
    even under --tls-require-client-cert)."""
    assert cluster.tls_dir is not None
    context = ssl.create_default_context(cafile=str(cluster.tls_dir / "ca.pem"))
    context.check_hostname = False
    host, _, port = cluster.nodes[node_id].kafka_address.rpartition(":")
    return context.wrap_socket(socket.create_connection((host, int(port)), timeout=10))


def test_the_node_answers_the_failure_then_closes_the_connection(secure: LocalCluster) -> None:
    """On the wire: SaslHandshake v1, then SaslAuthenticate with a wrong PLAIN password is answered
    SASL_AUTHENTICATION_FAILED (58) with a message, and the connection is closed; a request before
    authenticating also closes it, so does a frame over the unauthenticated limit, and an unknown
    mechanism is answered UNSUPPORTED_SASL_MECHANISM (33)."""
    with _tls_socket(secure) as sock:
        sock.sendall(request_frame(SaslHandshakeRequest(mechanism="PLAIN")))
        assert decode_response(read_frame(sock), 17, 1)[1].error_code == 0
        sock.sendall(request_frame(SaslAuthenticateRequest(auth_bytes=b"\0alice\0nope")))
        _, answer = decode_response(read_frame(sock), 36, 2)
        assert answer.error_code == 58 and "Authentication failed" in (answer.error_message or "")
        with pytest.raises(ConnectionError):
            read_frame(sock)
    with _tls_socket(secure) as sock:
        sock.sendall(request_frame(SaslHandshakeRequest(mechanism="GSSAPI")))
        _, answer = decode_response(read_frame(sock), 17, 1)
        assert answer.error_code == 33 and set(answer.mechanisms) == set(MECHANISMS)
    with _tls_socket(secure) as sock:
        sock.sendall(struct.pack(">i", KAFKA_UNAUTHENTICATED_FRAME_BYTES_MAX + 1))  # Refused unread.
        with pytest.raises(ConnectionError):
            read_frame(sock)
    with _tls_socket(secure) as sock:
        sock.sendall(request_frame(ApiVersionsV0()))
        assert decode_response(read_frame(sock), 18, 0)[1].error_code == 0  # Answered before SASL.
        sock.sendall(request_frame(MetadataRequest(topics=None, allow_auto_topic_creation=False)))
        with pytest.raises(ConnectionError):
            read_frame(sock)


def test_a_user_without_acls_is_refused_per_topic_and_group_and_writes_nothing(secure: LocalCluster) -> None:
    """mallory (authenticated, DESCRIBE only) gets TOPIC_AUTHORIZATION_FAILED producing and fetching,
    and GROUP_AUTHORIZATION_FAILED joining a group; the topic's end and the group's offsets stay."""
    before = _end_offset(secure, TOPIC)
    settings = _sasl(secure, "SCRAM-SHA-256", MALLORY, MALLORY_PASSWORD)
    reports: list[Any] = []
    producer = confluent.Producer({**settings, "message.timeout.ms": 10_000})
    producer.produce(TOPIC, value=b"forbidden", on_delivery=lambda error, _message: reports.append(error))
    producer.flush(WAIT_S)
    assert [error.code() for error in reports] == [confluent.KafkaError.TOPIC_AUTHORIZATION_FAILED]

    reader = confluent.Consumer({**settings, "group.id": MALLORY_GROUP, "enable.auto.commit": False})
    reader.assign([confluent.TopicPartition(TOPIC, 0, 0)])  # No group: a plain fetch.
    try:
        error = _until(lambda: _error_of(reader.poll(1.0)), "a fetch error")
    finally:
        reader.close()
    assert error.code() == confluent.KafkaError.TOPIC_AUTHORIZATION_FAILED

    member = confluent.Consumer({**settings, "group.id": MALLORY_GROUP, "auto.offset.reset": "earliest"})
    member.subscribe([TOPIC])
    try:
        error = _until(lambda: _error_of(member.poll(1.0)), "a group error")
    finally:
        member.close()
    assert error.code() == confluent.KafkaError.GROUP_AUTHORIZATION_FAILED
    modern = confluent.Consumer({**settings, "group.id": MALLORY_GROUP, "group.protocol": "consumer"})
    modern.subscribe([TOPIC])  # KIP-848: ConsumerGroupHeartbeat needs READ on the group.
    try:
        error = _until(lambda: _error_of(modern.poll(1.0)), "a consumer-group error")
    finally:
        modern.close()
    # librdkafka makes a refused ConsumerGroupHeartbeat fatal, naming the broker's code.
    assert error.code() == confluent.KafkaError._FATAL and "Group authorization failed" in error.str()
    assert _end_offset(secure, TOPIC) == before
    with KqClient(secure.bootstrap, tls=secure.tls) as admin:
        assert MALLORY_GROUP not in [group.name for group in admin.list_groups()]  # Never joined.


def test_list_groups_shows_every_group_to_describe_on_the_cluster(secure: LocalCluster) -> None:
    """Kafka's ListGroups rule through librdkafka's admin client: a user with DESCRIBE on the cluster
    sees every group; mallory (DESCRIBE on one other group) does not see it."""
    with KqClient(secure.bootstrap, tls=secure.tls) as admin:
        member = admin.join_group("audited", topics=[TOPIC])
        admin.leave_group("audited", member.member_id)
        admin.put_user("auditor", "auditor-password-1")
        admin.add_acls([acl("User:auditor", "describe", "cluster")])
        secure.wait_applied(admin.index_seen, list(secure.nodes))

    def listed(user: str, password: str) -> set[str]:
        client = confluent_admin.AdminClient(_sasl(secure, "SCRAM-SHA-256", user, password))
        result = client.list_consumer_groups(request_timeout=WAIT_S).result()
        return {group.group_id for group in result.valid}

    assert "audited" in listed("auditor", "auditor-password-1")
    assert "audited" not in listed(MALLORY, MALLORY_PASSWORD)


def test_admin_apis_check_the_acls_kafka_documents(secure: LocalCluster) -> None:
    """mallory (DESCRIBE on one topic and one group) is refused each admin API as Kafka refuses it:
    DeleteRecords and CreatePartitions TOPIC_AUTHORIZATION_FAILED (DELETE, ALTER on the topic),
    DeleteGroups GROUP_AUTHORIZATION_FAILED (DELETE on the group), ElectLeaders
    CLUSTER_AUTHORIZATION_FAILED (ALTER on the cluster), DescribeLogDirs no log dirs (DESCRIBE on the
    cluster), DescribeTopicPartitions TOPIC_AUTHORIZATION_FAILED for a topic she may not DESCRIBE,
    OffsetDelete GROUP_AUTHORIZATION_FAILED (DELETE on the group); alice (everything on sasl-* topics,
    nothing on the cluster) may grow her topic and trim it; nothing mallory asked for changed."""
    mallory = confluent_admin.AdminClient(_sasl(secure, "SCRAM-SHA-256", MALLORY, MALLORY_PASSWORD))

    def refused(future: Any) -> int:
        with pytest.raises(confluent.KafkaException) as error:
            future.result(WAIT_S)
        return int(error.value.args[0].code())

    trimmed = mallory.delete_records([confluent.TopicPartition(TOPIC, 0, 0)])
    assert refused(next(iter(trimmed.values()))) == confluent.KafkaError.TOPIC_AUTHORIZATION_FAILED
    grown = mallory.create_partitions([confluent_admin.NewPartitions(TOPIC, 2)])[TOPIC]
    assert refused(grown) == confluent.KafkaError.TOPIC_AUTHORIZATION_FAILED
    deleted = mallory.delete_consumer_groups([MALLORY_GROUP])[MALLORY_GROUP]
    assert refused(deleted) == confluent.KafkaError.GROUP_AUTHORIZATION_FAILED
    elected = mallory.elect_leaders(confluent.ElectionType.PREFERRED, [confluent.TopicPartition(TOPIC, 0)])
    assert refused(elected) == confluent.KafkaError.CLUSTER_AUTHORIZATION_FAILED

    alice = confluent_admin.AdminClient(_sasl(secure, "SCRAM-SHA-256", ALICE, ALICE_PASSWORD))
    topic = "sasl-scram-sha-256"
    alice.create_partitions([confluent_admin.NewPartitions(topic, 2)])[topic].result(WAIT_S)
    trimmed = alice.delete_records([confluent.TopicPartition(topic, 1, -1)])
    assert next(iter(trimmed.values())).result(WAIT_S).low_watermark == 0
    with KqClient(secure.bootstrap, tls=secure.tls) as admin:
        assert admin.describe_topic(TOPIC).topic.partitions == 1
        assert admin.describe_topic(topic).topic.partitions == 2

    assert secure.tls_dir is not None
    python_admin = kafka.KafkaAdminClient(
        bootstrap_servers=secure.kafka_bootstrap,
        security_protocol="SASL_SSL",
        ssl_cafile=str(secure.tls_dir / "ca.pem"),
        ssl_check_hostname=False,
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username=MALLORY,
        sasl_plain_password=MALLORY_PASSWORD,
    )
    try:  # DescribeLogDirs needs DESCRIBE on the cluster; DescribeTopicPartitions DESCRIBE on the topic.
        # Refused as Kafka does (CLUSTER_AUTHORIZATION_FAILED, no results), which kafka-python lists as empty.
        assert [answer["log_dirs"] for answer in python_admin.describe_log_dirs()] == [[], [], []]
        described = python_admin.describe_topic_partitions([TOPIC, topic])
        codes = {entry["name"]: entry["error_code"] for entry in described["topics"]}
        assert codes == {TOPIC: 0, topic: 29}
        with pytest.raises(kafka.errors.GroupAuthorizationFailedError):  # OffsetDelete: DELETE on the group.
            python_admin.delete_group_offsets(MALLORY_GROUP, [kafka.TopicPartition(TOPIC, 0)])
    finally:
        python_admin.close()


def _error_of(message: Any) -> Any:
    return None if message is None else message.error()


def test_random_sasl_frames_never_break_a_node(secure: LocalCluster) -> None:
    """SaslHandshake and SaslAuthenticate frames with random mechanisms and bytes, bare tokens after a
    v0 handshake, and random bytes: every node lives, answers, and logs no traceback."""
    node_ids = sorted(secure.nodes)

    @settings(
        max_examples=FUZZ_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(
        handshake=st.sampled_from(
            [None, ("PLAIN", 0), ("PLAIN", 1), ("SCRAM-SHA-256", 1), ("SCRAM-SHA-512", 0)]
        ),
        token=st.binary(max_size=600),
        framing=st.sampled_from(["authenticate", "bare", "handshake", "random"]),
        repeat=st.integers(1, 3),
        node=st.sampled_from(node_ids),
    )
    def one(handshake: tuple[str, int] | None, token: bytes, framing: str, repeat: int, node: str) -> None:
        with _tls_socket(secure, node) as sock:
            sock.settimeout(1.0)
            try:
                if handshake is not None:
                    request = SaslHandshakeRequest(mechanism=handshake[0])
                    sock.sendall(_with_version(request_frame(request), handshake[1]))
                    read_frame(sock)
                for _ in range(repeat):
                    if framing == "authenticate":
                        sock.sendall(request_frame(SaslAuthenticateRequest(auth_bytes=token)))
                    elif framing == "handshake":
                        sock.sendall(request_frame(SaslHandshakeRequest(mechanism=token.decode("latin-1"))))
                    else:
                        sock.sendall(struct.pack(">i", len(token)) + token)
                    read_frame(sock)
            except OSError:
                pass  # Closed by the node, or no answer: both fine.
        assert all(secure.running(node_id) for node_id in node_ids)

    one()
    for node_id in node_ids:
        with _tls_socket(secure, node_id) as sock:
            sock.sendall(request_frame(ApiVersionsV0()))
            assert decode_response(read_frame(sock), 18, 0)[1].error_code == 0
        log = secure.log_path(node_id).read_text(errors="replace")
        assert "CRITICAL" not in log and "Traceback" not in log, f"node {node_id}'s log: {log[-2000:]}"


def _with_version(frame: bytes, version: int) -> bytes:
    return frame[:6] + struct.pack(">h", version) + frame[8:]


def test_a_v0_handshake_takes_a_bare_token_then_serves_requests(secure: LocalCluster) -> None:
    """SaslHandshake v0 (before KIP-152): the PLAIN token goes as a bare frame, answered by an empty
    bare frame; the connection is then authenticated and Metadata is answered."""
    with _tls_socket(secure) as sock:
        sock.sendall(_with_version(request_frame(SaslHandshakeRequest(mechanism="PLAIN")), 0))
        assert decode_response(read_frame(sock), 17, 0)[1].error_code == 0
        token = f"\0{ALICE}\0{ALICE_PASSWORD}".encode()
        sock.sendall(struct.pack(">i", len(token)) + token)
        assert read_frame(sock) == b""
        sock.sendall(request_frame(MetadataRequest(topics=None, allow_auto_topic_creation=False)))
        _, metadata = decode_response(read_frame(sock), 3, 4)
        assert TOPIC in {topic.name for topic in metadata.topics}


def test_metadata_lists_only_the_topics_a_user_may_describe(secure: LocalCluster) -> None:
    """mallory, listing every topic, sees only the one it may DESCRIBE; naming another gets
    TOPIC_AUTHORIZATION_FAILED (29) and does not create it."""
    with _tls_socket(secure, "2") as sock:
        sock.sendall(request_frame(SaslHandshakeRequest(mechanism="PLAIN")))
        read_frame(sock)
        token = f"\0{MALLORY}\0{MALLORY_PASSWORD}".encode()
        sock.sendall(request_frame(SaslAuthenticateRequest(auth_bytes=token)))
        assert decode_response(read_frame(sock), 36, 2)[1].error_code == 0
        sock.sendall(request_frame(MetadataRequest(topics=None, allow_auto_topic_creation=False)))
        _, listed = decode_response(read_frame(sock), 3, 4)
        assert {topic.name for topic in listed.topics} == {TOPIC}
        named = MetadataRequest(
            topics=(MetadataRequestTopic(name=TopicName("sasl-mallory-new")),), allow_auto_topic_creation=True
        )
        sock.sendall(request_frame(named))
        _, answer = decode_response(read_frame(sock), 3, 4)
        assert [(topic.name, topic.error_code) for topic in answer.topics] == [("sasl-mallory-new", 29)]
    with KqClient(secure.bootstrap, tls=secure.tls) as admin:
        assert "sasl-mallory-new" not in [topic.name for topic in admin.list_topics()]


def test_acl_and_scram_apis_need_the_cluster_and_a_kafka_set_password_logs_in(secure: LocalCluster) -> None:
    """mallory (no cluster ACL) is refused CLUSTER_AUTHORIZATION_FAILED by DescribeAcls, CreateAcls,
    DeleteAcls and both SCRAM APIs, and changes nothing; a user with ALTER on the cluster sets frank's
    password through AlterUserScramCredentials (a salted password: the password never travels), and
    frank then logs in with SCRAM-SHA-512 over the Kafka listener. OffsetForLeaderEpoch of a topic
    mallory may not DESCRIBE answers TOPIC_AUTHORIZATION_FAILED for it alone."""
    from confluent_kafka.admin._acl import AclBinding, AclBindingFilter, AclOperation, AclPermissionType
    from confluent_kafka.admin._resource import ResourcePatternType, ResourceType
    from confluent_kafka.admin._scram import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    with KqClient(secure.bootstrap, tls=secure.tls) as admin:
        admin.put_user("keeper", "keeper-password-1")
        admin.add_acls([acl("User:keeper", "alter", "cluster")])
        secure.wait_applied(admin.index_seen, list(secure.nodes))
        acls_before = admin.list_acls()
    denied = confluent.KafkaError.CLUSTER_AUTHORIZATION_FAILED
    mallory = confluent_admin.AdminClient(_sasl(secure, "SCRAM-SHA-256", MALLORY, MALLORY_PASSWORD))
    binding = AclBinding(ResourceType.TOPIC, TOPIC, ResourcePatternType.LITERAL, f"User:{MALLORY}", "*",
                         AclOperation.ALL, AclPermissionType.ALLOW)  # fmt: skip
    every: Any = None
    everything = AclBindingFilter(ResourceType.ANY, every, ResourcePatternType.ANY, every, every,
                                  AclOperation.ANY, AclPermissionType.ANY)  # fmt: skip
    upsertion = UserScramCredentialUpsertion(
        MALLORY, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"taken-over", b"s" * 16
    )
    attempts: list[Callable[[], Any]] = [
        lambda: mallory.create_acls([binding], request_timeout=WAIT_S)[binding].result(WAIT_S),
        lambda: mallory.delete_acls([everything], request_timeout=WAIT_S)[everything].result(WAIT_S),
        lambda: mallory.alter_user_scram_credentials([upsertion], request_timeout=WAIT_S)[MALLORY].result(
            WAIT_S
        ),
    ]
    for attempt in attempts:
        with pytest.raises(confluent.KafkaException) as refused:
            attempt()
        assert refused.value.args[0].code() == denied
    with KqClient(secure.bootstrap, tls=secure.tls) as admin:
        assert admin.list_acls() == acls_before
    # For a top-level error librdkafka's describe_acls answers an empty list, and its
    # describe_user_scram_credentials aborts the process: the raw answers say it.
    with _tls_socket(secure) as sock:
        sock.sendall(_with_version(request_frame(SaslHandshakeRequest(mechanism="PLAIN")), 0))
        read_frame(sock)
        token = f"\0{MALLORY}\0{MALLORY_PASSWORD}".encode()
        sock.sendall(struct.pack(">i", len(token)) + token)
        assert read_frame(sock) == b""
        any_code = i8(1)
        sock.sendall(request_frame(DescribeAclsRequest(
            resource_type_filter=any_code, resource_name_filter=None, pattern_type_filter=any_code,
            principal_filter=None, host_filter=None, operation=any_code, permission_type=any_code,
        )))  # fmt: skip
        _, described = decode_response(read_frame(sock), 29, 1)
        assert described.error_code == denied and described.resources == ()
        sock.sendall(request_frame(DescribeUserScramCredentialsRequest(users=(UserName(name=ALICE),))))
        _, scram = decode_response(read_frame(sock), 50, 0)
        assert scram.error_code == denied and [r.error_code for r in scram.results] == [denied]
        # OffsetForLeaderEpoch needs DESCRIBE on each topic: mallory has it on TOPIC only.
        sock.sendall(request_frame(OffsetForLeaderEpochRequest(replica_id=BrokerId(-1), topics=tuple(
            OffsetForLeaderTopic(topic=TopicName(name), partitions=(
                OffsetForLeaderPartition(partition=i32(0), leader_epoch=i32(1)),
            ))
            for name in (TOPIC, "sasl-plain")
        ))))  # fmt: skip
        _, epochs = decode_response(read_frame(sock), 23, 4)
        codes = {topic.topic: topic.partitions[0].error_code for topic in epochs.topics}
        assert codes["sasl-plain"] == 29 and codes[TOPIC] != 29

    keeper = confluent_admin.AdminClient(_sasl(secure, "SCRAM-SHA-512", "keeper", "keeper-password-1"))
    frank = UserScramCredentialUpsertion(
        "frank", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"frank-password-1", b"f" * 16
    )
    assert (
        keeper.alter_user_scram_credentials([frank], request_timeout=WAIT_S)["frank"].result(WAIT_S) is None
    )
    with KqClient(secure.bootstrap, tls=secure.tls) as admin:
        _until(lambda: "frank" in {user.name for user in admin.list_users()}, "frank")
        secure.wait_applied(admin.index_seen, list(secure.nodes))
    login = confluent_admin.AdminClient(_sasl(secure, "SCRAM-SHA-512", "frank", "frank-password-1"))
    assert login.list_topics(timeout=WAIT_S).brokers  # Authenticated: Metadata is answered.
