"""Kafka's admin APIs on nodes of worker processes (`--processes 3`: three Raft groups, a topic's
partitions spread over them): CreatePartitions grows a topic in group 0 and every group's copy follows
(new partitions placed over the topic's groups, the old ones unmoved), DeleteRecords reaches each
partition's own group leader, DescribeLogDirs shows each partition on the brokers of its group only,
and ElectLeaders answers for each group's leader."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import ElectionType, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions
from kafka.admin import KafkaAdminClient

from kq.broker.workers import broker_id
from kq.client import KqClient, ProducerRecord
from kq.deploy.cluster import LocalCluster
from kq.deploy.waiting import wait_for
from kq.proto.placement import partition_groups
from tests.system.groups import agreed_leaders

pytestmark = pytest.mark.system

PROCESSES = 3
WAIT_S = 60.0


@pytest.fixture(scope="module")
def workers_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three nodes of three worker processes each, with Kafka listeners, once every group has a leader."""
    with LocalCluster(tmp_path_factory.mktemp("kafka-workers") / "cluster", processes=PROCESSES) as local:
        wait_for(lambda: agreed_leaders(local, list(local.nodes)), "every group's leader", WAIT_S)
        yield local


def test_admin_apis_across_raft_groups(workers_cluster: LocalCluster) -> None:
    """A 3-partition topic over three groups grows to 5 (each new partition in the group placement
    names, each old one's records in place), every partition trims through its own group's leader,
    each broker's log dir holds exactly its group's partitions, and every election is not needed or
    the balancer's (a group with a leader)."""
    cluster = workers_cluster
    with KqClient(cluster.bootstrap) as kq:
        kq.create_topic("spread", partitions=3)
        kq.send_batch("spread", [ProducerRecord(b"v", partition=p) for p in range(3) for _ in range(4)])
        topic_id = kq.describe_topic("spread").topic.topic_id
    client = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    client.create_partitions([NewPartitions("spread", 5)])["spread"].result(WAIT_S)
    placement = partition_groups(topic_id, 5, PROCESSES)
    with KqClient(cluster.bootstrap) as kq:
        assert [kq.partition_group("spread", p) for p in range(5)] == list(placement)
        assert [kq.send("spread", b"new", partition=p).offset for p in (3, 4)] == [0, 0]
        ends = {p: offsets.log_end_offset for p, offsets in kq.list_offsets("spread").items()}
    assert ends == {0: 4, 1: 4, 2: 4, 3: 1, 4: 1}

    futures = client.delete_records([TopicPartition("spread", p, min(2, ends[p])) for p in range(5)])
    low = {tp.partition: future.result(WAIT_S).low_watermark for tp, future in futures.items()}
    assert low == {0: 2, 1: 2, 2: 2, 3: 1, 4: 1}

    python_admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        answers = python_admin.describe_log_dirs()
    finally:
        python_admin.close()
    holders: dict[int, set[int]] = {p: set() for p in range(5)}
    for answer in answers:
        (log_dir,) = answer["log_dirs"]
        for topic in log_dir["topics"]:
            if topic["name"] == "spread":
                for partition in topic["partitions"]:
                    holders[partition["partition_index"]].add(answer["broker"])
    for partition, group in enumerate(placement):
        assert holders[partition] == {broker_id(int(node), group) for node in cluster.nodes}

    results = client.elect_leaders(
        ElectionType.PREFERRED, [TopicPartition("spread", p) for p in range(5)]
    ).result(WAIT_S)
    assert all(
        error is None or error.code() == KafkaError.ELECTION_NOT_NEEDED for error in results.values()
    ), results


def test_a_copy_grown_in_every_group_answers_metadata_from_any_broker(workers_cluster: LocalCluster) -> None:
    """After a grow, every broker (each node's process of each group) names the new count in Metadata:
    each group's copy of the topic grew."""
    with KqClient(workers_cluster.bootstrap) as kq:
        kq.create_topic("grown-everywhere", partitions=1)
    client = AdminClient({"bootstrap.servers": workers_cluster.kafka_bootstrap})
    client.create_partitions([NewPartitions("grown-everywhere", 4)])["grown-everywhere"].result(WAIT_S)
    for spec in workers_cluster.nodes.values():
        host, _, port = spec.kafka_address.rpartition(":")
        for group in range(PROCESSES):
            one = AdminClient({"bootstrap.servers": f"{host}:{int(port) + group}"})
            metadata = one.list_topics("grown-everywhere", timeout=WAIT_S)
            assert len(metadata.topics["grown-everywhere"].partitions) == 4
