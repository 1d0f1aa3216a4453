"""The Kafka listener's settings from the node's configuration; the brokers follow the membership."""

from __future__ import annotations

from collections.abc import Callable

from kq.broker.config import ConfigError, KafkaConfig, NodeConfig
from kq.broker.kafka.base import BROKER_ID_MAX, KafkaSettings
from kq.broker.membership import MembershipView
from kq.broker.workers import broker_id


def check_kafka_members(config: NodeConfig) -> None:
    """Kafka names brokers by number, so with a Kafka listener every configured node id must be an
    integer and every member needs a Kafka address (AddNode asks the same of a new node). Raises
    ConfigError otherwise."""
    for peer in (config.self_peer, *config.peers):
        if not peer.node_id.isdigit() or int(peer.node_id) > BROKER_ID_MAX:
            raise ConfigError(
                f"with a Kafka listener, node ids must be integers (Kafka broker ids): {peer.node_id!r}"
            )
        if not peer.kafka_address:
            raise ConfigError(
                f"node {peer.node_id} has no Kafka address: list it in --peers as id=raft=grpc=kafka"
            )


def kafka_settings(
    config: NodeConfig, kafka: KafkaConfig, view: Callable[[], MembershipView]
) -> KafkaSettings:
    """This node's Kafka settings, its brokers read from `view` (a Membership's). Raises ConfigError as
    `check_kafka_members` does."""
    check_kafka_members(config)

    def broker_id_of(node_id: str) -> int:
        """With worker processes, a member's process of this group (broker/workers.py)."""
        return broker_id(int(node_id), config.group) if config.processes > 1 else int(node_id)

    return KafkaSettings(
        view,
        broker_id_of(config.node_id),
        kafka.auto_create_topics,
        kafka.default_partitions,
        config.peer_credentials,
        config.node_metadata,
        kafka.sasl_mechanisms,
        broker_id_of,
        kafka.consumer_heartbeat_interval_ms,
        kafka.consumer_session_timeout_ms,
    )
