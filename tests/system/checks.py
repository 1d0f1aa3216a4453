"""Reading whole partitions from each node and comparing them: shared by the system tests."""

from __future__ import annotations

from kq.client import ConsumerRecord, KqClient

READ_BATCH_RECORDS = 5_000


def read_partition(client: KqClient, topic: str, partition: int, node: str) -> list[ConsumerRecord]:
    """Every record of the partition as `node` holds it, from its log start to its log end."""
    offsets = client.list_offsets(topic, node)[partition]
    records: list[ConsumerRecord] = []
    offset = offsets.log_start_offset
    while offset < offsets.log_end_offset:
        batch = client.fetch(
            topic, partition, offset, max_records=READ_BATCH_RECORDS, max_bytes=4 << 20, node=node
        )
        assert batch.served_by, "a fetch response names the node that served it"
        assert batch.records, f"no records at {offset} below the log end {offsets.log_end_offset} on {node}"
        records += batch.records
        offset = batch.records[-1].offset + 1
    return records


def read_everywhere(
    client: KqClient, topic: str, partitions: int, nodes: list[str]
) -> dict[str, dict[int, list[ConsumerRecord]]]:
    """node -> partition -> records; asserts every node holds identical records at identical offsets."""
    result = {node: {p: read_partition(client, topic, p, node) for p in range(partitions)} for node in nodes}
    reference = result[nodes[0]]
    for node in nodes[1:]:
        for partition in range(partitions):
            assert result[node][partition] == reference[partition], f"{node} differs on partition {partition}"
    for partition, records in reference.items():
        offsets = [record.offset for record in records]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))) if offsets else True, partition
    return result
