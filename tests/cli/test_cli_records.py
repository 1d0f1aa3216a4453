"""`kq produce` and `kq consume` against a real 3-node cluster: exact values, keys, offsets and nodes."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from kq.cli.consume import PartitionReader
from kq.client import KqClient, ProducerRecord
from kq.client.partitioner import partition_for_key
from kq.deploy.cluster import LocalCluster

RunKq = Callable[..., Result]
# How long every node stays behind the reader's min_index in the test below: long enough for the
# reader to be answered "not yet" on every partition. The assertion holds whatever this is.
BEHIND_S = 0.5

pytestmark = pytest.mark.system


def _json_lines(result: Result) -> list[dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def _fields(records: list[dict[str, Any]], *names: str) -> list[tuple[Any, ...]]:
    return [tuple(record[name] for name in names) for record in records]


def test_produce_from_arguments_with_a_key_then_consume_as_json(
    run_kq: RunKq, client: KqClient, topic_name: str
) -> None:
    """Argument values with one --key and headers land in the key's partition at offsets 0.., in order."""
    client.create_topic(topic_name, 3)
    partition = partition_for_key(b"user-1", 3)
    sent = run_kq(
        "produce", topic_name, "a", "b", "c", "--key", "user-1", "--header", "src=cli", "--header", "n=1"
    )
    assert (sent.exit_code, sent.stdout) == (
        0,
        f"sent 3 records to {topic_name}: partition {partition} offsets 0-2\n",
    )

    records = _json_lines(run_kq("consume", topic_name, "--from-beginning", "--format", "json"))
    assert _fields(records, "topic", "partition", "offset", "key", "value") == [
        (topic_name, partition, offset, "user-1", value) for offset, value in enumerate("abc")
    ]
    assert records[0]["headers"] == [
        {"name": "src", "value": "cli", "value_base64": False},
        {"name": "n", "value": "1", "value_base64": False},
    ]
    assert records[0]["timestamp_type"] in ("CreateTime", "LogAppendTime")
    assert records[0]["timestamp_ms"] > 0


def test_produce_from_stdin_with_key_separator_then_consume_plain_with_keys(
    run_kq: RunKq, client: KqClient, topic_name: str
) -> None:
    """Each stdin line splits at its first separator into key and value; --print-key prints them back."""
    client.create_topic(topic_name, 1)
    sent = run_kq("produce", topic_name, "--key-separator", ":", stdin="k1:v1\nk2:v:2\r\nk3:\n")
    assert sent.stdout == f"sent 3 records to {topic_name}: partition 0 offsets 0-2\n"
    consumed = run_kq("consume", topic_name, "--from-beginning", "--print-key", "--key-separator", "=")
    assert (consumed.exit_code, consumed.stdout) == (0, "k1=v1\nk2=v:2\nk3=\n")


def test_produce_sends_empty_lines_as_empty_values(run_kq: RunKq, client: KqClient, topic_name: str) -> None:
    """An empty input line is a record with an empty value (Kafka's console producer does the same)."""
    client.create_topic(topic_name, 1)
    assert run_kq("produce", topic_name, stdin="a\n\nb\n").exit_code == 0
    records = _json_lines(run_kq("consume", topic_name, "--from-beginning", "--format", "json"))
    assert _fields(records, "offset", "key", "value") == [(0, None, "a"), (1, None, ""), (2, None, "b")]


def test_produce_from_a_file_to_a_partition_in_batches(
    run_kq: RunKq, client: KqClient, topic_name: str, tmp_path: Path
) -> None:
    """--file with more lines than one batch holds sends every line, in order, to the chosen partition."""
    client.create_topic(topic_name, 2)
    path = tmp_path / "lines.txt"
    path.write_text("".join(f"line {i}\n" for i in range(2_500)))
    sent = run_kq("produce", topic_name, "--file", str(path), "--partition", "1", "--progress")
    assert sent.exit_code == 0, sent.output
    assert sent.stdout == f"sent 2500 records to {topic_name}: partition 1 offsets 0-2499\n"
    assert client.list_offsets(topic_name)[1].log_end_offset == 2_500
    consumed = run_kq("consume", topic_name, "--from-beginning", "--partition", "1")
    assert consumed.stdout.splitlines() == [f"line {i}" for i in range(2_500)]


def test_consume_max_offset_and_partition_choose_exactly_those_records(
    run_kq: RunKq, client: KqClient, topic_name: str
) -> None:
    """--max stops after N records; --offset N --partition P starts exactly there; the default is the end.

    Without --follow, partitions come out in ascending order (each has fewer records than one fetch
    takes), also when the node answering one of them has not applied the leader's index yet: the
    reader asks that partition again instead of printing the next one first (it used to, under load).
    """
    client.create_topic(topic_name, 2)
    run_kq("produce", topic_name, "--partition", "0", *[f"p0-{i}" for i in range(5)])
    run_kq("produce", topic_name, "--partition", "1", *[f"p1-{i}" for i in range(3)])

    first_two = _json_lines(
        run_kq("consume", topic_name, "--from-beginning", "--max", "2", "--format", "json")
    )
    assert _fields(first_two, "partition", "offset", "value") == [(0, 0, "p0-0"), (0, 1, "p0-1")]
    from_three = run_kq("consume", topic_name, "--partition", "0", "--offset", "3")
    assert from_three.stdout == "p0-3\np0-4\n"
    both = run_kq("consume", topic_name, "--partition", "1", "--partition", "0", "--offset", "2")
    assert both.stdout == "p0-2\np0-3\np0-4\np1-2\n"
    from_end = run_kq("consume", topic_name)
    assert (from_end.exit_code, from_end.stdout) == (0, "")
    assert "--follow" in from_end.stderr


def test_consume_non_utf8_bytes_as_base64(run_kq: RunKq, client: KqClient, topic_name: str) -> None:
    """Bytes that are not UTF-8 come back byte-exact: raw in plain format, base64 and flagged in JSON."""
    client.create_topic(topic_name, 1)
    client.send(topic_name, b"\xff\x00\xfe", key=b"\x80")
    plain = run_kq("consume", topic_name, "--from-beginning")
    assert plain.stdout_bytes == b"\xff\x00\xfe\n"
    (record,) = _json_lines(run_kq("consume", topic_name, "--from-beginning", "--format", "json"))
    assert (record["key"], record["key_base64"], record["value"], record["value_base64"]) == (
        "gA==",
        True,
        "/wD+",
        True,
    )


def test_consume_from_each_node_returns_the_same_records(
    run_kq: RunKq, client: KqClient, cluster: LocalCluster, topic_name: str
) -> None:
    """Reading the whole topic from each node with --node gives identical output (same offsets everywhere)."""
    client.create_topic(topic_name, 3)
    metadata = client.send_batch(topic_name, [_record(i) for i in range(30)])
    cluster.wait_applied(max(m.index for m in metadata), list(cluster.nodes))
    outputs = {
        node: run_kq("consume", topic_name, "--from-beginning", "--node", node, "--format", "json").stdout
        for node in cluster.bootstrap
    }
    assert len(set(outputs.values())) == 1
    records = [json.loads(line) for line in next(iter(outputs.values())).splitlines()]
    assert sorted(r["value"] for r in records) == sorted(f"v{i}" for i in range(30))
    assert {(m.partition, m.offset) for m in metadata} == {(r["partition"], r["offset"]) for r in records}


def test_a_reader_ahead_of_every_node_still_reads_partitions_in_order(
    client: KqClient, topic_name: str
) -> None:
    """Nodes behind the reader's min_index answer "not yet"; it waits on that partition, not skips it."""
    client.create_topic(topic_name, 4)
    for partition in range(4):
        client.send(topic_name, f"p{partition}".encode(), partition=partition)
    applied_index = client.describe_topic(topic_name, client.leader_address()).applied_index
    reader = PartitionReader(
        client,
        topic_name,
        dict.fromkeys(range(4), 0),
        end_offsets=dict.fromkeys(range(4), 1),
        node=None,
        min_index=applied_index + 1,  # Applied nowhere until the next entry (the topic below) commits.
        records_max=None,
    )
    next_entry = threading.Timer(BEHIND_S, client.create_topic, (f"{topic_name}-next", 1))
    next_entry.start()
    try:
        values = [record.value for records in reader.batches() for record in records]
    finally:
        next_entry.join()
    assert values == [b"p0", b"p1", b"p2", b"p3"]


def _record(i: int) -> ProducerRecord:
    return ProducerRecord(f"v{i}".encode(), key=f"k{i}".encode())
