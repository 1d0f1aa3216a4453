"""Partition assignors for consumer groups: pure and deterministic (they run inside apply).

Each takes the members' subscriptions, the partition count of every subscribed topic and the
previous assignment, and returns member -> sorted partitions. Every partition of a subscribed topic
goes to exactly one member subscribed to its topic.
"""

from __future__ import annotations

from collections.abc import Callable

TopicPartition = tuple[str, int]
Assignment = dict[str, list[TopicPartition]]
Subscriptions = dict[str, frozenset[str]]  # member id -> topics


def assign_range(
    subscriptions: Subscriptions, partitions: dict[str, int], previous: Assignment
) -> Assignment:
    """Kafka's RangeAssignor: per topic, contiguous ranges to the sorted subscribed members."""
    result: Assignment = {member: [] for member in subscriptions}
    for topic in sorted(partitions):
        members = sorted(m for m, topics in subscriptions.items() if topic in topics)
        if not members:
            continue
        share, extra = divmod(partitions[topic], len(members))
        start = 0
        for position, member in enumerate(members):
            count = share + (1 if position < extra else 0)
            result[member] += [(topic, p) for p in range(start, start + count)]
            start += count
    return {member: sorted(owned) for member, owned in result.items()}


def assign_round_robin(
    subscriptions: Subscriptions, partitions: dict[str, int], previous: Assignment
) -> Assignment:
    """Kafka's RoundRobinAssignor: all partitions in order, dealt to the sorted members in turn."""
    members = sorted(subscriptions)
    result: Assignment = {member: [] for member in members}
    turn = 0
    for topic in sorted(partitions):
        for partition in range(partitions[topic]):
            for _ in range(len(members)):
                member = members[turn % len(members)]
                turn += 1
                if topic in subscriptions[member]:
                    result[member].append((topic, partition))
                    break
    return result


def assign_sticky(
    subscriptions: Subscriptions, partitions: dict[str, int], previous: Assignment
) -> Assignment:
    """Balanced within one, keeping as many previous owners as balance allows.

    Quotas: with T partitions and N members, T % N members may own one more than the rest; members
    that already own more keep the larger quotas. Each member keeps its previous partitions up to
    its quota; the rest go, in order, to the eligible member owning fewest.
    """
    members = sorted(subscriptions)
    if not members:
        return {}
    every = [(topic, p) for topic in sorted(partitions) for p in range(partitions[topic])]
    kept = {
        member: sorted(
            tp
            for tp in previous.get(member, [])
            if tp[0] in subscriptions[member] and tp[1] < partitions.get(tp[0], 0)
        )
        for member in members
    }
    share, extra = divmod(len(every), len(members))
    by_holdings = sorted(members, key=lambda m: (-len(kept[m]), m))
    quota = {member: share + (1 if rank < extra else 0) for rank, member in enumerate(by_holdings)}
    result: Assignment = {member: kept[member][: quota[member]] for member in members}
    taken = {tp for owned in result.values() for tp in owned}
    for tp in every:
        if tp in taken:
            continue
        eligible = [m for m in members if tp[0] in subscriptions[m]]
        if not eligible:
            continue
        with_room = [m for m in eligible if len(result[m]) < quota[m]] or eligible
        owner = min(with_room, key=lambda m: (len(result[m]), m))
        result[owner].append(tp)
        taken.add(tp)
    return {member: sorted(owned) for member, owned in result.items()}


ASSIGNORS: dict[str, Callable[[Subscriptions, dict[str, int], Assignment], Assignment]] = {
    "range": assign_range,
    "roundrobin": assign_round_robin,
    "sticky": assign_sticky,
}
