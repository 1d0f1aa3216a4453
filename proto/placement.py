"""Which Raft group holds a partition, and where a node's process of a group listens: pure functions
of their arguments, shared by the nodes (raft/placement.py re-exports them), the client and the
tools, which route each partition to its group (DESIGN.md, "Scale-out: many Raft groups").

A topic's partitions go round-robin over the groups starting at the group its id names, so
consecutive topics start at consecutive groups and a topic with at least as many partitions as
groups touches every group. The group count is the topic's own, fixed at its creation (a topic
created while the cluster had one group keeps every partition in group 0).
"""

from __future__ import annotations

from pathlib import Path

from kq.proto.limits import PARTITIONS_MAX, RAFT_GROUPS_MAX


def partition_groups(topic_id: int, partitions: int, groups: int) -> tuple[int, ...]:
    """The Raft group (0..groups-1) of each partition 0..partitions-1 of the topic `topic_id`."""
    if not 1 <= groups <= RAFT_GROUPS_MAX:
        raise ValueError(f"groups must be 1..{RAFT_GROUPS_MAX}, not {groups}")
    if not 0 <= partitions <= PARTITIONS_MAX:
        raise ValueError(f"partitions must be 0..{PARTITIONS_MAX}, not {partitions}")
    if topic_id < 0:
        raise ValueError(f"topic ids are not negative: {topic_id}")
    start = topic_id % groups
    return tuple((start + partition) % groups for partition in range(partitions))


def partition_group(topic_id: int, partition: int, groups: int) -> int:
    """The Raft group of one partition (`partition_groups`' entry for it)."""
    return (topic_id % groups + partition) % groups


PORT_MAX = 65_535
GROUPS_DIR = "groups"  # <data-dir>/groups/<g>: a node's data directory of group g > 0.


def group_address(address: str, offset: int) -> str:
    """`host:port` with the port moved by `offset` ("" stays ""): a node's process of Raft group g
    listens at the node's address (its group 0's) moved by g (kq-node --processes:
    broker/workers.py), and one group's process reaches another's of the same node by their
    difference. ValueError outside ports 1..65,535."""
    if not address or offset == 0:
        return address
    host, _, port = address.rpartition(":")
    moved = int(port) + offset
    if not 0 < moved <= PORT_MAX:
        raise ValueError(f"port {moved} ({address} moved by {offset}) is not a port")
    return f"{host}:{moved}"


def group_data_dir(data_dir: Path, group: int) -> Path:
    """A node's data directory of Raft `group`, given the node's own (group 0's: a single-group
    directory is group 0's, unchanged; the others are `<data-dir>/groups/<g>`)."""
    return data_dir if group == 0 else data_dir / GROUPS_DIR / str(group)
