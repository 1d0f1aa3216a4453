"""What each Kafka API needs of the ACLs (`--auth`), as Kafka's own authorizer decides it (pure).

The Kafka edge authorizes every request itself: what it forwards to the leader over gRPC travels
as the node (a super-user there), so the leader cannot check the client's principal.

`ACLS` is the one table: per API, per resource type it touches, the operation it needs. A request
that names one resource and answers one error code (`WHOLE`: the group APIs, FindCoordinator,
DescribeCluster) is checked in `KafkaApis.answer` before its handler runs and answered that error
alone; the others are checked by their handlers per topic, group or config resource
(`KafkaBase._permitted`), so that the unauthorized ones get TOPIC_AUTHORIZATION_FAILED (29) or
GROUP_AUTHORIZATION_FAILED (30) in their own slot of the response while the rest are served, as
Kafka does. Metadata omits topics the principal may not DESCRIBE when it lists all of them, and
answers 29 for those it names; auto-creating a topic needs CreateTopics' CREATE. ListGroups lists every
group to a principal with DESCRIBE on the cluster, else only the groups it may DESCRIBE.

The ACL and SCRAM credential APIs need DESCRIBE on the cluster to read and ALTER to change, as Kafka
documents (DescribeAcls checked whole; the others answer CLUSTER_AUTHORIZATION_FAILED in each slot);
OffsetForLeaderEpoch needs DESCRIBE on each topic, as Kafka asks of consumers.

Where kq's operations differ from Kafka's: kq has no DESCRIBE_CONFIGS, ALTER_CONFIGS or
IDEMPOTENT_WRITE operations, so the config APIs need DESCRIBE and ALTER, on the topic or (a broker
resource) on the cluster; InitProducerId (an idempotent producer's id) needs WRITE on the cluster or
an ALLOW WRITE ACL on some topic (Kafka 3.0's rule, KIP-679), and is refused CLUSTER_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kq.broker.auth import (
    ALTER,
    CLUSTER,
    CREATE,
    DELETE,
    DESCRIBE,
    GROUP,
    READ,
    TOPIC,
    TRANSACTIONAL_ID,
    WRITE,
    Access,
)
from kq.proto import kq_pb2
from kq.raft.auth import CLUSTER_RESOURCE, EVERYONE, SecurityState

TOPIC_AUTHORIZATION_FAILED = 29  # Kafka's error codes of a denial, by the resource denied.
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53


class ApiKey(enum.IntEnum):
    """The Kafka APIs kq serves (KafkaApis.apis)."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    DESCRIBE_CONFIGS = 32
    CREATE_PARTITIONS = 37
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    OFFSET_DELETE = 47
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLUSTER = 60
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    DESCRIBE_TOPIC_PARTITIONS = 75


@dataclass(frozen=True, slots=True)
class Need:
    """The operation an API needs on a resource; `or_cluster`: the same operation on the cluster
    grants it too (CreateTopics: CREATE on the topic, or on the cluster)."""

    operation: int
    or_cluster: bool = False


# API -> resource type -> what it needs. An API with no entry (ApiVersions and the SASL APIs) is open
# to every connection; tests/kafka/test_sasl.py checks that every served API is listed.
ACLS: dict[ApiKey, dict[int, Need]] = {
    ApiKey.PRODUCE: {TOPIC: Need(WRITE), TRANSACTIONAL_ID: Need(WRITE)},
    ApiKey.FETCH: {TOPIC: Need(READ)},
    ApiKey.LIST_OFFSETS: {TOPIC: Need(DESCRIBE)},
    ApiKey.METADATA: {TOPIC: Need(DESCRIBE)},  # Auto-creation also needs CreateTopics' CREATE.
    ApiKey.OFFSET_COMMIT: {GROUP: Need(READ), TOPIC: Need(READ)},
    ApiKey.OFFSET_FETCH: {GROUP: Need(DESCRIBE), TOPIC: Need(DESCRIBE)},
    ApiKey.FIND_COORDINATOR: {GROUP: Need(DESCRIBE), TRANSACTIONAL_ID: Need(DESCRIBE)},
    ApiKey.JOIN_GROUP: {GROUP: Need(READ)},
    ApiKey.HEARTBEAT: {GROUP: Need(READ)},
    ApiKey.LEAVE_GROUP: {GROUP: Need(READ)},
    ApiKey.SYNC_GROUP: {GROUP: Need(READ)},
    ApiKey.DESCRIBE_GROUPS: {GROUP: Need(DESCRIBE)},
    ApiKey.LIST_GROUPS: {GROUP: Need(DESCRIBE)},  # A filter: the others are left out.
    ApiKey.CREATE_TOPICS: {TOPIC: Need(CREATE, or_cluster=True)},
    ApiKey.DELETE_TOPICS: {TOPIC: Need(DELETE)},
    # Idempotent: WRITE on the cluster, or an ALLOW WRITE on some topic (writes_some_topic); transactional:
    # WRITE on its transactional id.
    ApiKey.INIT_PRODUCER_ID: {CLUSTER: Need(WRITE), TRANSACTIONAL_ID: Need(WRITE)},
    ApiKey.ADD_PARTITIONS_TO_TXN: {TRANSACTIONAL_ID: Need(WRITE), TOPIC: Need(WRITE)},
    ApiKey.ADD_OFFSETS_TO_TXN: {TRANSACTIONAL_ID: Need(WRITE), GROUP: Need(READ)},
    ApiKey.END_TXN: {TRANSACTIONAL_ID: Need(WRITE)},
    ApiKey.TXN_OFFSET_COMMIT: {TRANSACTIONAL_ID: Need(WRITE), GROUP: Need(READ), TOPIC: Need(READ)},
    ApiKey.DESCRIBE_PRODUCERS: {TOPIC: Need(READ)},
    ApiKey.DESCRIBE_TRANSACTIONS: {TRANSACTIONAL_ID: Need(DESCRIBE)},
    ApiKey.LIST_TRANSACTIONS: {TRANSACTIONAL_ID: Need(DESCRIBE)},  # A filter: the others are left out.
    ApiKey.DESCRIBE_CONFIGS: {TOPIC: Need(DESCRIBE), CLUSTER: Need(DESCRIBE)},
    ApiKey.ALTER_CONFIGS: {TOPIC: Need(ALTER), CLUSTER: Need(ALTER)},
    ApiKey.INCREMENTAL_ALTER_CONFIGS: {TOPIC: Need(ALTER), CLUSTER: Need(ALTER)},
    ApiKey.DESCRIBE_CLUSTER: {CLUSTER: Need(DESCRIBE)},
    ApiKey.DELETE_RECORDS: {TOPIC: Need(DELETE)},
    ApiKey.CREATE_PARTITIONS: {TOPIC: Need(ALTER)},
    ApiKey.DELETE_GROUPS: {GROUP: Need(DELETE)},
    ApiKey.OFFSET_DELETE: {GROUP: Need(DELETE), TOPIC: Need(READ)},
    ApiKey.DESCRIBE_LOG_DIRS: {CLUSTER: Need(DESCRIBE)},
    ApiKey.ELECT_LEADERS: {CLUSTER: Need(ALTER)},
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: {TOPIC: Need(DESCRIBE)},
    # KIP-848: READ on the group; DESCRIBE on each topic subscribed by name (Kafka 4's check).
    ApiKey.CONSUMER_GROUP_HEARTBEAT: {GROUP: Need(READ), TOPIC: Need(DESCRIBE)},
    ApiKey.CONSUMER_GROUP_DESCRIBE: {GROUP: Need(DESCRIBE)},
    ApiKey.OFFSET_FOR_LEADER_EPOCH: {TOPIC: Need(DESCRIBE)},
    ApiKey.DESCRIBE_ACLS: {CLUSTER: Need(DESCRIBE)},
    ApiKey.CREATE_ACLS: {CLUSTER: Need(ALTER)},
    ApiKey.DELETE_ACLS: {CLUSTER: Need(ALTER)},
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: {CLUSTER: Need(DESCRIBE)},
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: {CLUSTER: Need(ALTER)},
}

OPEN_APIS = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})


def _group_id(body: Any) -> tuple[int, str] | None:
    return GROUP, body.group_id


def _coordinator_key(body: Any) -> tuple[int, str] | None:
    """A consumer group's coordinator (key_type 0) needs DESCRIBE on the group, a transaction
    coordinator's (1) on the transactional id."""
    return (GROUP, body.key) if getattr(body, "key_type", 0) == 0 else (TRANSACTIONAL_ID, body.key)


def _transactional_id(body: Any) -> tuple[int, str] | None:
    return TRANSACTIONAL_ID, body.transactional_id


# API -> the one resource a request names (None: none to check), for the APIs whose response has a
# single error code: checked before the handler runs, and a denial is the whole answer.
WHOLE: dict[ApiKey, Callable[[Any], tuple[int, str] | None]] = {
    ApiKey.JOIN_GROUP: _group_id,
    ApiKey.HEARTBEAT: _group_id,
    ApiKey.LEAVE_GROUP: _group_id,
    ApiKey.SYNC_GROUP: _group_id,
    ApiKey.CONSUMER_GROUP_HEARTBEAT: _group_id,
    ApiKey.FIND_COORDINATOR: _coordinator_key,
    ApiKey.DESCRIBE_CLUSTER: lambda _body: (CLUSTER, CLUSTER_RESOURCE),
    ApiKey.END_TXN: _transactional_id,
    ApiKey.DESCRIBE_ACLS: lambda _body: (CLUSTER, CLUSTER_RESOURCE),
}

DENIED_CODE: dict[int, int] = {
    TOPIC: TOPIC_AUTHORIZATION_FAILED,
    GROUP: GROUP_AUTHORIZATION_FAILED,
    CLUSTER: CLUSTER_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID: TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}
# Kafka's messages of those errors (Errors.java), sent where a response has a message: librdkafka
# 2.16 crashes reading a DescribeUserScramCredentials error without one.
DENIED_MESSAGE: dict[int, str] = {
    TOPIC: "Topic authorization failed.",
    GROUP: "Group authorization failed.",
    CLUSTER: "Cluster authorization failed.",
}


def access(api_key: ApiKey, resource_type: int, name: str) -> Access:
    """What API `api_key` needs on the resource (KeyError for a pair the table lacks: a bug)."""
    need = ACLS[api_key][resource_type]
    alternatives = (Access(need.operation, CLUSTER, CLUSTER_RESOURCE),) if need.or_cluster else ()
    return Access(need.operation, resource_type, name, alternatives)


def writes_some_topic(state: SecurityState, principal: str) -> bool:
    """Whether an ALLOW ACL lets `principal` WRITE some topic (InitProducerId's alternative to WRITE
    on the cluster), unless a DENY of WRITE on every topic ("*", literal) speaks of it."""
    writes = (kq_pb2.ACL_OPERATION_WRITE, kq_pb2.ACL_OPERATION_ALL)
    principals = (principal, EVERYONE)
    ours = [
        rule
        for rule in state.rules
        if rule.resource_type == TOPIC and rule.operation in writes and rule.principal in principals
    ]
    if any(not rule.allow and not rule.prefixed and rule.name == "*" for rule in ours):
        return False
    return any(rule.allow for rule in ours)
