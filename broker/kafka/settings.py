"""The cluster as Kafka clients see it, from the node's configuration."""

from __future__ import annotations

import base64
import hashlib

from kq.broker.config import ConfigError, KafkaConfig, NodeConfig
from kq.broker.kafka.base import KafkaBrokerInfo, KafkaSettings

BROKER_ID_MAX = 2**31 - 1


def kafka_settings(config: NodeConfig, kafka: KafkaConfig) -> KafkaSettings:
    """The Kafka brokers of the cluster (every node with a Kafka address) and this node's settings.

    Kafka names brokers by number, so every node id must be an integer; the cluster id is derived
    from the members' Raft addresses, so every node reports the same one without agreeing on it.
    Raises ConfigError when a node id is not a number or a member has no Kafka address.
    """
    members = (config.self_peer, *config.peers)
    brokers = []
    for peer in sorted(members, key=lambda member: member.node_id):
        if not peer.node_id.isdigit() or int(peer.node_id) > BROKER_ID_MAX:
            raise ConfigError(
                f"with a Kafka listener, node ids must be integers (Kafka broker ids): {peer.node_id!r}"
            )
        if not peer.kafka_address:
            raise ConfigError(
                f"node {peer.node_id} has no Kafka address: list it in --peers as id=raft=grpc=kafka"
            )
        host, _, port = peer.kafka_address.rpartition(":")
        brokers.append(
            KafkaBrokerInfo(
                int(peer.node_id), peer.node_id, host, int(port), peer.grpc_address, peer.rack or None
            )
        )
    digest = hashlib.sha256(",".join(sorted(member.raft_address for member in members)).encode()).digest()
    return KafkaSettings(
        brokers=tuple(brokers),
        self_broker_id=int(config.node_id),
        cluster_id=base64.urlsafe_b64encode(digest[:16]).decode().rstrip("="),
        auto_create_topics=kafka.auto_create_topics,
        default_partitions=kafka.default_partitions,
    )
