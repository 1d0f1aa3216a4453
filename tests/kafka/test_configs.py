"""Topic configs through Kafka's admin APIs, with real clients: create with configs, describe, alter.

The same replicated configs kq's gRPC API and CLI use (raft/topic_config.py): what a Kafka tool sets,
`kq topics describe` shows, and the reverse.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.cimpl import NewTopic

from kq.client import KqClient
from kq.deploy.cluster import LocalCluster

pytestmark = pytest.mark.system

TIMEOUT_S = 20.0


def admin(cluster: LocalCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})


def described(client: AdminClient, topic: str) -> dict[str, tuple[str, bool]]:
    """(value, is_default) of each config, as DescribeConfigs answers."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = client.describe_configs([resource])[resource].result(TIMEOUT_S)
    return {name: (entry.value, entry.is_default) for name, entry in entries.items()}


def test_create_describe_and_alter_topic_configs(kafka_cluster: LocalCluster) -> None:
    """CreateTopics with configs, DescribeConfigs with sources, IncrementalAlterConfigs SET, DELETE and
    APPEND, and the gRPC view agrees; a bad value is INVALID_CONFIG and changes nothing."""
    client = admin(kafka_cluster)
    topic = NewTopic("configured", 1, config={"retention.ms": "60000", "max.message.bytes": "100000"})
    client.create_topics([topic])["configured"].result(TIMEOUT_S)
    configs = described(client, "configured")
    assert configs["retention.ms"] == ("60000", False)
    assert configs["retention.bytes"] == ("-1", True)
    assert configs["max.message.bytes"] == ("100000", False)

    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        "configured",
        incremental_configs=[
            ConfigEntry("retention.bytes", "4096", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
        ],
    )
    client.incremental_alter_configs([resource])[resource].result(TIMEOUT_S)
    configs = described(client, "configured")
    assert configs["retention.bytes"] == ("4096", False)
    assert configs["retention.ms"] == ("-1", True)
    assert configs["cleanup.policy"] == ("delete,compact", False)
    with KqClient(kafka_cluster.bootstrap) as kq:
        kq_view = {c.name: (c.value, c.is_default) for c in kq.describe_topic("configured").configs}
    assert {name: kq_view[name] for name in ("retention.bytes", "retention.ms", "cleanup.policy")} == {
        name: configs[name] for name in ("retention.bytes", "retention.ms", "cleanup.policy")
    }

    bad = ConfigResource(
        ConfigResource.Type.TOPIC,
        "configured",
        incremental_configs=[
            ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with pytest.raises(KafkaException, match=r"retention\.ms"):
        client.incremental_alter_configs([bad])[bad].result(TIMEOUT_S)
    assert described(client, "configured") == configs


def test_create_topics_refuses_an_unknown_config(kafka_cluster: LocalCluster) -> None:
    client = admin(kafka_cluster)
    future = client.create_topics([NewTopic("misconfigured", 1, config={"segment.bytes": "1"})])[
        "misconfigured"
    ]
    with pytest.raises(KafkaException, match="unknown topic config"):
        future.result(TIMEOUT_S)


def test_alter_configs_replaces_every_override(kafka_cluster: LocalCluster) -> None:
    """AlterConfigs (not incremental) leaves exactly the given overrides: the others go back to defaults."""
    client = admin(kafka_cluster)
    client.create_topics([NewTopic("replaced", 1, config={"retention.ms": "1000"})])["replaced"].result(
        TIMEOUT_S
    )
    resource = ConfigResource(ConfigResource.Type.TOPIC, "replaced", set_config={"retention.bytes": "2048"})
    client.alter_configs([resource])[resource].result(TIMEOUT_S)
    configs = described(client, "replaced")
    assert configs["retention.bytes"] == ("2048", False)
    assert configs["retention.ms"] == ("-1", True)


def test_a_compacted_topic_refuses_records_without_a_key(kafka_cluster: LocalCluster) -> None:
    """As Kafka: a keyless record to a cleanup.policy=compact topic is INVALID_RECORD for a Kafka
    producer and INVALID_ARGUMENT (InvalidRequestError) for kq's client; keyed ones are stored."""
    from confluent_kafka import KafkaError, Producer

    from kq.client.errors import InvalidRequestError

    with KqClient(kafka_cluster.bootstrap) as kq:
        kq.create_topic("keyed-only", partitions=1, configs={"cleanup.policy": "compact"})
        with pytest.raises(InvalidRequestError, match="has no key"):
            kq.send("keyed-only", b"v", partition=0)
        assert kq.send("keyed-only", b"v", b"k", partition=0).offset == 0
        producer = Producer({"bootstrap.servers": kafka_cluster.kafka_bootstrap, "enable.idempotence": False})
        errors: list[KafkaError | None] = []
        producer.produce(
            "keyed-only", b"no key", partition=0, on_delivery=lambda error, _: errors.append(error)
        )
        assert producer.flush(TIMEOUT_S) == 0  # Alone: Kafka refuses a whole batch with a keyless record.
        producer.produce(
            "keyed-only", b"keyed", key=b"k2", partition=0, on_delivery=lambda e, _: errors.append(e)
        )
        assert producer.flush(TIMEOUT_S) == 0
        assert errors[0] is not None and errors[0].code() == KafkaError.INVALID_RECORD
        assert errors[1] is None
        assert kq.list_offsets("keyed-only")[0].log_end_offset == 2
