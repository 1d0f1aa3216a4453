"""The kq source's options, parsed and checked once; every bad option is one error that names it.

Option names and meanings follow Spark's Kafka source (`subscribe`, `startingOffsets`, ...), with
`kq.*` options for what is kq's own. Spark hands options over with lower-cased names; errors quote
the documented spelling.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from kq.proto.limits import FETCH_RECORDS_MAX, SPARK_FETCH_DELAY_MS_MAX, SPARK_MIN_PARTITIONS_MAX

EARLIEST = -2  # Kafka's sentinel for "the log start" in offsets JSON.
LATEST = -1  # Kafka's sentinel for "the log end" in offsets JSON.
NODE_ADDRESS = re.compile(r"[A-Za-z0-9.\-_]+:[0-9]{1,5}|\[[0-9A-Fa-f:.]+\]:[0-9]{1,5}")


class KqSourceError(ValueError):
    """A bad option, or a read that cannot be planned or done as asked; the message says which."""


class DataLossError(KqSourceError):
    """Records the query needed are gone (deleted below the log start, or the topic was recreated)."""


class TopicPartition(NamedTuple):
    """One partition of one topic."""

    topic: str
    partition: int


class ReadFrom(Enum):
    """Which nodes serve an input partition's fetches (`kq.readFrom`)."""

    FOLLOWER = "follower"  # Followers first (spread over input partitions), the leader as a last resort.
    LEADER = "leader"  # The leader first, then the followers.
    ANY = "any"  # Every node, spread over input partitions.
    NODE = "node"  # One pinned node (host:port), never another.


class SubscriptionKind(Enum):
    """How the topics are chosen: exactly one of Kafka's three options."""

    SUBSCRIBE = "subscribe"
    SUBSCRIBE_PATTERN = "subscribePattern"
    ASSIGN = "assign"


@dataclass(frozen=True, slots=True)
class Subscription:
    """The topics (or partitions) to read."""

    kind: SubscriptionKind
    topics: tuple[str, ...] = ()  # SUBSCRIBE: the topic names; ASSIGN: the assigned partitions' topics.
    pattern: str = ""  # SUBSCRIBE_PATTERN: a regular expression matching whole topic names.
    partitions: tuple[TopicPartition, ...] = ()  # ASSIGN only.


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """`earliest`, `latest`, or specific offsets per partition (EARLIEST/LATEST allowed as values)."""

    kind: str  # "earliest", "latest" or "specific".
    offsets: tuple[tuple[TopicPartition, int], ...] = ()

    def as_dict(self) -> dict[TopicPartition, int]:
        """The specific offsets by partition."""
        return dict(self.offsets)


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Every option of one read, checked. Picklable: it travels to the executors inside the reader."""

    nodes: tuple[str, ...]
    subscription: Subscription
    starting: OffsetSpec | None  # None: the default (earliest for batch, latest for streaming).
    ending: OffsetSpec | None  # Batch only; None: latest.
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    fail_on_data_loss: bool
    include_headers: bool
    read_from: ReadFrom
    pinned_node: str  # The node when read_from is NODE, else "".
    fetch_max_records: int
    # kq.fetch.maxRecords unset: each fetch takes whole stored batches until they hold
    # fetch_max_records, so no batch is fetched and decoded twice (KqClient.fetch `whole_batches`).
    fetch_whole_batches: bool
    debug_served_by: bool
    debug_fetch_delay_ms: int


# Lower-cased name (as Spark passes it) -> documented name.
KNOWN_OPTIONS = {
    name.lower(): name
    for name in (
        "kq.nodes",
        "subscribe",
        "subscribePattern",
        "assign",
        "startingOffsets",
        "endingOffsets",
        "maxOffsetsPerTrigger",
        "minPartitions",
        "failOnDataLoss",
        "includeHeaders",
        "kq.readFrom",
        "kq.fetch.maxRecords",
        "kq.debug.servedBy",
        "kq.debug.fetchDelayMs",
    )
}
OFFSETS_EXAMPLE = '{"topicA":{"0":23,"1":-1},"topicB":{"0":-2}}'
ASSIGN_EXAMPLE = '{"topicA":[0,1],"topicB":[2,4]}'


def option_error(name: str, problem: str, component: str = "kq source") -> KqSourceError:
    """The one error for a bad option: `kq source option 'name': problem` (or `kq sink option ...`)."""
    return KqSourceError(f"{component} option '{name}': {problem}")


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Checks every option that does not depend on batch or streaming; raises KqSourceError."""
    values = {key.lower(): str(value) for key, value in options.items()}
    reject_unknown(values, KNOWN_OPTIONS, "kq source")
    read_from, pinned_node = _read_from(values.get("kq.readfrom", "follower"))
    fetch_records = positive_int(values, "kq.fetch.maxRecords", FETCH_RECORDS_MAX)
    return SourceOptions(
        nodes=node_addresses(values.get("kq.nodes")),
        subscription=_subscription(values),
        starting=_offset_spec("startingOffsets", values.get("startingoffsets")),
        ending=_offset_spec("endingOffsets", values.get("endingoffsets")),
        max_offsets_per_trigger=positive_int(values, "maxOffsetsPerTrigger", None),
        min_partitions=positive_int(values, "minPartitions", SPARK_MIN_PARTITIONS_MAX),
        fail_on_data_loss=_boolean(values, "failOnDataLoss", default=True),
        include_headers=_boolean(values, "includeHeaders", default=False),
        read_from=read_from,
        pinned_node=pinned_node,
        fetch_max_records=fetch_records or FETCH_RECORDS_MAX,
        fetch_whole_batches=fetch_records is None,
        debug_served_by=_boolean(values, "kq.debug.servedBy", default=False),
        debug_fetch_delay_ms=_non_negative_int(values, "kq.debug.fetchDelayMs", SPARK_FETCH_DELAY_MS_MAX),
    )


def check_batch(options: SourceOptions) -> None:
    """Kafka's batch rules: the read starts no later than `latest` and ends no earlier than `earliest`."""
    if options.starting is not None:
        if options.starting.kind == "latest":
            raise option_error("startingOffsets", "'latest' is not allowed in a batch query")
        if any(offset == LATEST for _, offset in options.starting.offsets):
            raise option_error("startingOffsets", "-1 (latest) is not allowed in a batch query")
    if options.ending is not None:
        if options.ending.kind == "earliest":
            raise option_error("endingOffsets", "'earliest' is not allowed in a batch query")
        if any(offset == EARLIEST for _, offset in options.ending.offsets):
            raise option_error("endingOffsets", "-2 (earliest) is not allowed in a batch query")


def check_streaming(options: SourceOptions) -> None:
    """Kafka's streaming rule: a stream has no end."""
    if options.ending is not None:
        raise option_error("endingOffsets", "not allowed in a streaming query (a stream has no end)")


def reject_unknown(values: Mapping[str, str], known: Mapping[str, str], component: str) -> None:
    """Raises for the first option of `values` (lower-cased names) that `known` does not name."""
    for key in values:
        if key in known:
            continue
        if key.startswith("kafka."):
            raise option_error(
                key, "kq takes no kafka.* options; name the cluster's nodes with kq.nodes", component
            )
        names = ", ".join(sorted(known.values(), key=str.lower))
        raise option_error(key, f"unknown option (known: {names})", component)


def node_addresses(value: str | None, component: str = "kq source") -> tuple[str, ...]:
    """`kq.nodes`: some of the cluster's nodes, as host:port,host:port."""
    if value is None or not value.strip():
        required = "required: some of the cluster's nodes as host:port,host:port"
        raise option_error("kq.nodes", required, component)
    nodes = tuple(node.strip() for node in value.split(",") if node.strip())
    for node in nodes:
        if not NODE_ADDRESS.fullmatch(node):
            raise option_error("kq.nodes", f"{node!r} is not host:port", component)
    return nodes


def _subscription(values: Mapping[str, str]) -> Subscription:
    given = [kind for kind in SubscriptionKind if kind.value.lower() in values]
    if len(given) != 1:
        names = "', '".join(kind.value for kind in SubscriptionKind)
        found = f"got {', '.join(kind.value for kind in given)}" if given else "got none"
        raise option_error("subscribe", f"give exactly one of '{names}' ({found})")
    kind = given[0]
    value = values[kind.value.lower()]
    if kind is SubscriptionKind.SUBSCRIBE:
        topics = tuple(dict.fromkeys(topic.strip() for topic in value.split(",") if topic.strip()))
        if not topics:
            raise option_error("subscribe", "no topic named (a comma-separated list of topics)")
        return Subscription(kind, topics=topics)
    if kind is SubscriptionKind.SUBSCRIBE_PATTERN:
        try:
            re.compile(value)
        except re.error as error:
            raise option_error("subscribePattern", f"not a regular expression: {error}") from None
        if not value:
            raise option_error("subscribePattern", "empty pattern")
        return Subscription(kind, pattern=value)
    partitions = _assignment(value)
    return Subscription(
        kind, topics=tuple(dict.fromkeys(tp.topic for tp in partitions)), partitions=partitions
    )


def _assignment(value: str) -> tuple[TopicPartition, ...]:
    problem = f"expected JSON like {ASSIGN_EXAMPLE}, got {value!r}"
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        raise option_error("assign", problem) from None
    if not isinstance(parsed, dict) or not parsed:
        raise option_error("assign", problem)
    partitions: list[TopicPartition] = []
    for topic, numbers in parsed.items():
        if not topic or not isinstance(numbers, list) or not numbers:
            raise option_error("assign", problem)
        for number in numbers:
            if not isinstance(number, int) or isinstance(number, bool) or number < 0:
                raise option_error("assign", f"partition {number!r} of {topic!r} is not a partition number")
            partitions.append(TopicPartition(topic, number))
    return tuple(sorted(set(partitions)))


def _offset_spec(name: str, value: str | None) -> OffsetSpec | None:
    if value is None:
        return None
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        return OffsetSpec(text.lower())
    problem = f"expected 'earliest', 'latest' or JSON like {OFFSETS_EXAMPLE}, got {value!r}"
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        raise option_error(name, problem) from None
    if not isinstance(parsed, dict) or not parsed:
        raise option_error(name, problem)
    offsets: dict[TopicPartition, int] = {}
    for topic, by_partition in parsed.items():
        if not topic or not isinstance(by_partition, dict) or not by_partition:
            raise option_error(name, problem)
        for partition, offset in by_partition.items():
            if not partition.isdigit():
                raise option_error(name, f"partition {partition!r} of {topic!r} is not a partition number")
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
                raise option_error(
                    name,
                    f"offset {offset!r} of {topic}-{partition} is not an offset,"
                    " -1 (latest) or -2 (earliest)",
                )
            offsets[TopicPartition(topic, int(partition))] = offset
    return OffsetSpec("specific", tuple(sorted(offsets.items())))


def _read_from(value: str) -> tuple[ReadFrom, str]:
    text = value.strip()
    for mode in (ReadFrom.FOLLOWER, ReadFrom.LEADER, ReadFrom.ANY):
        if text.lower() == mode.value:
            return mode, ""
    if NODE_ADDRESS.fullmatch(text):
        return ReadFrom.NODE, text
    raise option_error(
        "kq.readFrom", f"expected 'follower', 'leader', 'any' or a node's host:port, got {value!r}"
    )


def _boolean(values: Mapping[str, str], name: str, *, default: bool) -> bool:
    value = values.get(name.lower())
    if value is None:
        return default
    if value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise option_error(name, f"expected true or false, got {value!r}")


def positive_int(
    values: Mapping[str, str], name: str, maximum: int | None, component: str = "kq source"
) -> int | None:
    """Option `name` as a whole number from 1 (to `maximum`), or None when it is not given."""
    value = values.get(name.lower())
    if value is None:
        return None
    number = _integer(name, value, component)
    if number < 1 or (maximum is not None and number > maximum):
        limit = f" and at most {maximum:,}" if maximum is not None else ""
        raise option_error(name, f"expected a whole number of at least 1{limit}, got {value!r}", component)
    return number


def _non_negative_int(values: Mapping[str, str], name: str, maximum: int) -> int:
    value = values.get(name.lower())
    if value is None:
        return 0
    number = _integer(name, value)
    if not 0 <= number <= maximum:
        raise option_error(name, f"expected a whole number from 0 to {maximum:,}, got {value!r}")
    return number


def _integer(name: str, value: str, component: str = "kq source") -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise option_error(name, f"expected a whole number, got {value!r}", component) from None
