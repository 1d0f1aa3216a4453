"""Kafka's ACL APIs (DescribeAcls, CreateAcls, DeleteAcls) over kq's ACL model, with real clients.

What confluent-kafka's AdminClient creates, kq's gRPC ListAcls shows as the same rule, and the
reverse; what kq cannot represent is refused INVALID_REQUEST, never widened; filters match as Kafka's
do (MATCH, ANY, the cluster's "kafka-cluster"). The pure mapping is tested without a cluster first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kio.schema.create_acls.v3.request import AclCreation
from kio.static.primitive import i8

from kq.broker.kafka.acls import AclFilter, acl_of_creation, binding_of, matching
from kq.client import KqClient
from kq.client.security import acl
from kq.deploy.cluster import LocalCluster
from kq.proto import kq_pb2

TIMEOUT_S = 20.0
WAIT_S = 20.0
ANY_NAME: Any = None  # confluent-kafka's filters take None for "any", though its stubs say str.


def _creation(**changes: Any) -> AclCreation:
    fields: dict[str, Any] = {
        "resource_type": i8(2),
        "resource_name": "orders",
        "resource_pattern_type": i8(3),
        "principal": "User:alice",
        "host": "*",
        "operation": i8(3),
        "permission_type": i8(3),
    }
    fields.update(changes)
    return AclCreation(**fields)


def test_a_creation_maps_exactly_or_is_refused_with_kafkas_reason() -> None:
    """TOPIC/LITERAL/READ/ALLOW maps to kq's rule; the cluster's Kafka name maps to kq's; what kq has no
    row for (DELEGATION_TOKEN, IDEMPOTENT_WRITE, a host) is refused, and so is what Kafka refuses; a
    TRANSACTIONAL_ID maps to kq's transactional-id resource."""
    made = acl_of_creation(_creation())
    assert made == acl("User:alice", "read", "topic", "orders")
    cluster = acl_of_creation(_creation(resource_type=i8(4), resource_name="kafka-cluster", operation=i8(7)))
    assert isinstance(cluster, kq_pb2.Acl) and cluster.resource_name == "kq-cluster"
    prefixed = acl_of_creation(_creation(resource_pattern_type=i8(4), permission_type=i8(2)))
    assert isinstance(prefixed, kq_pb2.Acl)
    assert prefixed.pattern_type == kq_pb2.ACL_PATTERN_PREFIXED
    assert prefixed.permission == kq_pb2.ACL_PERMISSION_DENY
    transactional = acl_of_creation(
        _creation(resource_type=i8(5), resource_name="payments-1", operation=i8(4))
    )
    assert transactional == acl("User:alice", "write", "transactional-id", "payments-1")
    refused = {
        "delegation token": _creation(resource_type=i8(6)),
        "idempotent write": _creation(operation=i8(12)),
        "a host": _creation(host="10.0.0.1"),
        "ANY operation": _creation(operation=i8(1)),
        "MATCH pattern": _creation(resource_pattern_type=i8(2)),
        "other cluster name": _creation(resource_type=i8(4), resource_name="kq-cluster"),
        "empty name": _creation(resource_name=""),
        "no principal type": _creation(principal="alice"),
        "not a user": _creation(principal="Group:x"),
        "bad topic name": _creation(resource_name="a/b"),
    }
    for what, creation in refused.items():
        assert isinstance(acl_of_creation(creation), str), what


def _filter(**changes: Any) -> AclFilter:
    values: dict[str, Any] = {
        "resource_type": 1, "resource_name": None, "pattern_type": 1, "principal": None, "host": None,
        "operation": 1, "permission_type": 1,
    }  # fmt: skip
    values.update(changes)
    return AclFilter(**values)


def test_filters_match_as_kafkas() -> None:
    """MATCH finds the literal, wildcard and prefix rules that apply to a name; ANY and LITERAL compare
    names exactly; a filter naming something kq has no rules for matches nothing."""
    acls = [
        acl("User:a", "read", "topic", "orders"),
        acl("User:a", "read", "topic", "*"),
        acl("User:a", "write", "topic", "ord", prefixed=True),
        acl("User:b", "describe", "cluster"),
    ]

    def names(acl_filter: AclFilter) -> list[str]:
        return sorted(binding.resource_name for _, binding in matching(acls, acl_filter))

    assert names(_filter(resource_name="orders", pattern_type=2)) == ["*", "ord", "orders"]
    assert names(_filter(resource_name="orders")) == ["orders"]
    assert names(_filter(resource_name="ord", pattern_type=4)) == ["ord"]
    assert names(_filter(resource_type=4, resource_name="kafka-cluster")) == ["kafka-cluster"]
    assert names(_filter(principal="User:b")) == ["kafka-cluster"]
    assert names(_filter(host="10.0.0.1")) == []
    assert names(_filter(resource_type=5)) == []
    assert names(_filter(operation=4)) == ["ord"]
    assert _filter(operation=0).problem() is not None
    assert binding_of(acls[3]).resource_type == 4


def _until(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.system
def test_confluent_admin_creates_describes_and_deletes_acls(kafka_cluster: LocalCluster) -> None:
    """AdminClient.create_acls is kq's AddAcls (ListAcls shows it), describe_acls filters as Kafka,
    delete_acls removes what its filter matches and answers it; an unsupported one fails alone."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin._acl import AclBinding, AclBindingFilter, AclOperation, AclPermissionType
    from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

    client = AdminClient({"bootstrap.servers": kafka_cluster.kafka_bootstrap})
    allow, any_permission = AclPermissionType.ALLOW, AclPermissionType.ANY
    good = [
        AclBinding(ResourceType.TOPIC, "acl-orders", ResourcePatternType.LITERAL, "User:carol", "*",
                   AclOperation.READ, allow),
        AclBinding(ResourceType.GROUP, "acl-", ResourcePatternType.PREFIXED, "User:carol", "*",
                   AclOperation.ALL, allow),
        AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:carol", "*",
                   AclOperation.DESCRIBE, AclPermissionType.DENY),
    ]  # fmt: skip
    unsupported = AclBinding(
        ResourceType.TOPIC, "acl-orders", ResourcePatternType.LITERAL, "User:carol", "10.1.2.3",
        AclOperation.READ, allow,
    )  # fmt: skip
    futures = client.create_acls([*good, unsupported], request_timeout=TIMEOUT_S)
    for binding in good:
        assert futures[binding].result(TIMEOUT_S) is None
    with pytest.raises(KafkaException, match="every host"):
        futures[unsupported].result(TIMEOUT_S)

    with KqClient(kafka_cluster.bootstrap) as kq:
        rules = _until(lambda: kq.list_acls("User:carol") if len(kq.list_acls("User:carol")) == 3 else None,
                       "the three ACLs")  # fmt: skip
    assert acl("User:carol", "read", "topic", "acl-orders") in rules
    assert acl("User:carol", "all", "group", "acl-", prefixed=True) in rules
    assert acl("User:carol", "describe", "cluster", deny=True) in rules

    everything = AclBindingFilter(ResourceType.ANY, ANY_NAME, ResourcePatternType.ANY, "User:carol", ANY_NAME,
                                  AclOperation.ANY, any_permission)  # fmt: skip
    described = _until(
        lambda: (found := client.describe_acls(everything).result(TIMEOUT_S)) and len(found) == 3 and found,
        "DescribeAcls to show three",
    )
    assert {(b.restype, b.name, b.resource_pattern_type) for b in described} == {
        (ResourceType.TOPIC, "acl-orders", ResourcePatternType.LITERAL),
        (ResourceType.GROUP, "acl-", ResourcePatternType.PREFIXED),
        (ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL),
    }
    match = AclBindingFilter(ResourceType.GROUP, "acl-consumers", ResourcePatternType.MATCH, ANY_NAME,
                             ANY_NAME, AclOperation.ANY, any_permission)  # fmt: skip
    assert [b.name for b in client.describe_acls(match).result(TIMEOUT_S)] == ["acl-"]

    topic_filter = AclBindingFilter(ResourceType.TOPIC, ANY_NAME, ResourcePatternType.ANY, "User:carol",
                                    ANY_NAME, AclOperation.ANY, any_permission)  # fmt: skip
    deleted = client.delete_acls([topic_filter], request_timeout=TIMEOUT_S)[topic_filter].result(TIMEOUT_S)
    assert [(b.name, b.operation) for b in deleted] == [("acl-orders", AclOperation.READ)]
    with KqClient(kafka_cluster.bootstrap) as kq:
        _until(lambda: len(kq.list_acls("User:carol")) == 2, "the topic ACL to go")


@pytest.mark.system
def test_kafka_python_describes_acls(kafka_cluster: LocalCluster) -> None:
    """kafka-python's KafkaAdminClient reads and writes the same rules (its own request versions)."""
    from kafka.admin import KafkaAdminClient
    from kafka.admin._acls import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        ResourcePattern,
        ResourcePatternFilter,
        ResourceType,
    )

    client = KafkaAdminClient(bootstrap_servers=kafka_cluster.kafka_bootstrap, request_timeout_ms=20_000)
    try:
        resource = ResourcePattern(ResourceType.TOPIC, "acl-py", ACLResourcePatternType.LITERAL)
        created = client.create_acls(
            [ACL("User:dave", "*", ACLOperation.WRITE, ACLPermissionType.ALLOW, resource)]
        )
        assert created["failed"] == [], created
        acl_filter = ACLFilter(
            "User:dave",
            None,
            ACLOperation.ANY,
            ACLPermissionType.ANY,
            ResourcePatternFilter(ResourceType.ANY, None, ACLResourcePatternType.ANY),
        )
        found, _error = _until(
            lambda: (result := client.describe_acls(acl_filter)) and result[0] and result,
            "kafka-python to see its ACL",
        )
        assert [(a.resource_pattern.resource_name, a.operation) for a in found] == [
            ("acl-py", ACLOperation.WRITE)
        ]
    finally:
        client.close()


@pytest.mark.system
def test_confluent_admin_alters_and_describes_scram_credentials(kafka_cluster: LocalCluster) -> None:
    """AlterUserScramCredentials creates a kq user from a salted password, adds a second mechanism,
    deletes one; DescribeUserScramCredentials shows mechanisms and iterations; Kafka's refusals
    (too many iterations, an unknown user's credential) come back per user, the rest applied."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin._scram import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    client = AdminClient({"bootstrap.servers": kafka_cluster.kafka_bootstrap})
    sha256, sha512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512

    def alter(*alterations: Any) -> dict[str, Any]:
        return client.alter_user_scram_credentials(list(alterations), request_timeout=TIMEOUT_S)

    salt = b"s" * 16
    alter(UserScramCredentialUpsertion("erin", ScramCredentialInfo(sha256, 8192), b"pw-1", salt))[
        "erin"
    ].result(TIMEOUT_S)
    futures = alter(
        UserScramCredentialUpsertion("erin", ScramCredentialInfo(sha512, 4096), b"pw-1", salt),
        UserScramCredentialUpsertion("gil", ScramCredentialInfo(sha256, 100_000), b"pw", salt),
        UserScramCredentialDeletion("nobody", sha256),
    )
    assert futures["erin"].result(TIMEOUT_S) is None
    with pytest.raises(KafkaException, match="iterations"):
        futures["gil"].result(TIMEOUT_S)
    with pytest.raises(KafkaException, match="does not exist"):
        futures["nobody"].result(TIMEOUT_S)

    def erin() -> list[tuple[Any, int]] | None:
        futures: Any = client.describe_user_scram_credentials(["erin"])
        described = futures["erin"].result(TIMEOUT_S)
        infos = sorted((i.mechanism.value, i.iterations) for i in described.scram_credential_infos)
        return infos if len(infos) == 2 else None

    assert _until(erin, "erin's two mechanisms") == [(sha256.value, 8192), (sha512.value, 4096)]
    with KqClient(kafka_cluster.bootstrap) as kq:
        users = {user.name: sorted(user.mechanisms) for user in kq.list_users()}
    assert users["erin"] == ["SCRAM-SHA-256", "SCRAM-SHA-512"] and "gil" not in users
    alter(UserScramCredentialDeletion("erin", sha256))["erin"].result(TIMEOUT_S)
    _until(lambda: erin() is None, "erin's SHA-256 credential to go")
    with pytest.raises(KafkaException, match="does not exist"):
        unknown: Any = client.describe_user_scram_credentials(["nobody"])
        unknown["nobody"].result(TIMEOUT_S)
