"""Pure tests of the CLI's formatting, line reading and record shaping: no cluster, no sockets."""

from __future__ import annotations

import base64
import io
import json
import os
from collections.abc import Iterator

import pytest

from kq.cli.context import address_problem
from kq.cli.errors import CommandError
from kq.cli.input_lines import LineReader
from kq.cli.output import (
    bytes_to_json,
    format_json,
    format_plain,
    group_leaders_table,
    produce_summary,
    status_to_dict,
)
from kq.cli.produce import OffsetTally, PartitionChooser, RecordShape
from kq.client import ConsumerRecord, GroupLeaderInfo, KqClientError, NodeStatus, RecordMetadata
from kq.client.partitioner import partition_for_key
from kq.proto.limits import CLI_LINE_BYTES_MAX


def _record(
    key: bytes | None, value: bytes | None, headers: tuple[tuple[str, bytes], ...] = ()
) -> ConsumerRecord:
    return ConsumerRecord("t", 2, 7, 1_700_000_000_000, 1, key, value, headers)


def test_plain_prints_value_or_key_separator_value_and_null_for_missing() -> None:
    """Plain format: the value alone, or key SEP value with --print-key; a missing part is `null`."""
    assert format_plain(_record(b"k", b"v")) == b"v"
    assert format_plain(_record(b"k", b"v"), print_key=True, key_separator=b" => ") == b"k => v"
    assert format_plain(_record(None, b"v"), print_key=True) == b"null\tv"
    assert format_plain(_record(b"k", None)) == b"null"
    assert format_plain(_record(b"k", b"\xff\x00")) == b"\xff\x00"  # Plain output is the raw bytes.


def test_json_line_has_every_field_and_base64_only_for_non_utf8() -> None:
    """JSON format: all fields, text for UTF-8 bytes, base64 with a flag for other bytes, null for none."""
    line = format_json(_record(None, b"\xff\xfe", (("h", "é".encode()), ("b", b"\x80"))))
    assert b"\n" not in line
    assert json.loads(line) == {
        "topic": "t",
        "partition": 2,
        "offset": 7,
        "timestamp_ms": 1_700_000_000_000,
        "timestamp_type": "LogAppendTime",
        "key": None,
        "key_base64": False,
        "value": base64.b64encode(b"\xff\xfe").decode(),
        "value_base64": True,
        "headers": [
            {"name": "h", "value": "é", "value_base64": False},
            {"name": "b", "value": "gA==", "value_base64": True},
        ],
    }
    assert json.loads(format_json(_record(b"k", b"")))["value"] == ""
    assert bytes_to_json("naïve".encode()) == ("naïve", False)


def test_produce_summary_counts_records_and_offset_ranges_per_partition() -> None:
    """The produce summary names the record count and each partition's offset range, in partition order."""
    tally = OffsetTally()
    tally.add([RecordMetadata("t", 1, 5), RecordMetadata("t", 0, 3), RecordMetadata("t", 1, 6)])
    assert (
        produce_summary("t", tally.count, tally.ranges)
        == "sent 3 records to t: partition 0 offset 3, partition 1 offsets 5-6"
    )
    assert produce_summary("t", 0, {}) == "sent 0 records to t"


def test_status_of_a_down_node_is_role_down_with_the_error() -> None:
    """A node that did not answer becomes a `down` entry carrying the error's one line."""
    assert status_to_dict("h:1", KqClientError("cannot reach h:1")) == {
        "address": "h:1",
        "role": "down",
        "error": "cannot reach h:1",
    }


def test_key_separator_splits_at_the_first_separator_and_rejects_a_line_without_one() -> None:
    """--key-separator splits each line once; a line without it fails with its number."""
    shape = RecordShape(
        key=None, key_separator=b":", headers=(("h", b"v"),), partitions=PartitionChooser(3, 1, 0)
    )
    record = shape.record(b"k:v:w", 4, "line")
    assert (record.key, record.value, record.partition, record.headers) == (b"k", b"v:w", 1, (("h", b"v"),))
    with pytest.raises(CommandError, match="line 9 has no key separator ':'"):
        shape.record(b"no separator", 9, "line")
    fixed = RecordShape(key=b"K", key_separator=None, headers=(), partitions=PartitionChooser(3, None, 0))
    assert (fixed.record(b"", 1, "line").key, fixed.record(b"", 1, "line").value) == (b"K", b"")


def test_partition_chooser_uses_the_fixed_partition_else_the_key_hash_else_round_robin() -> None:
    """Partitions are chosen like the client does: --partition, else murmur2(key) like Kafka, else in turn."""
    assert [PartitionChooser(4, 2, 0).choose(key) for key in (None, b"a")] == [2, 2]
    assert PartitionChooser(4, None, 0).choose(b"user-1") == partition_for_key(b"user-1", 4)
    chooser = PartitionChooser(3, None, 2)
    assert [chooser.choose(None) for _ in range(4)] == [2, 0, 1, 2]


def _lines(data: bytes) -> list[bytes]:
    return [line for line, _ in LineReader(io.BytesIO(data)).lines()]


def test_line_reader_strips_newlines_keeps_empty_lines_and_a_last_line_without_newline() -> None:
    """Lines end at \\n or \\r\\n; empty lines are kept (as empty values); a last line needs no newline."""
    assert _lines(b"a\r\n\nb\nlast") == [b"a", b"", b"b", b"last"]
    assert _lines(b"") == []
    assert _lines(b"x\n") == [b"x"]
    many = b"".join(b"%d\n" % i for i in range(100_000))  # Spans many read chunks.
    assert _lines(many) == [b"%d" % i for i in range(100_000)]


def test_line_reader_counts_consumed_bytes_and_refuses_an_endless_line() -> None:
    """Consumed bytes include line ends (for progress); an over-long line is an error, not a hang."""
    assert [size for _, size in LineReader(io.BytesIO(b"ab\r\nc\n")).lines()] == [4, 2]
    with pytest.raises(CommandError, match="line 2 is longer than"):
        _lines(b"ok\n" + b"x" * (CLI_LINE_BYTES_MAX + 2))


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    """An OS pipe (read end, write end), both closed afterwards."""
    read_fd, write_fd = os.pipe()
    try:
        yield read_fd, write_fd
    finally:
        os.close(write_fd)
        os.close(read_fd)


def test_line_reader_reports_a_pause_when_the_pipe_has_nothing_more(pipe: tuple[int, int]) -> None:
    """After a line, `paused()` is true only when no whole line is buffered and the pipe is empty."""
    read_fd, write_fd = pipe
    with os.fdopen(os.dup(read_fd), "rb") as stream:
        reader = LineReader(stream)
        lines = reader.lines()
        os.write(write_fd, b"one\ntwo\n")
        assert next(lines)[0] == b"one"
        assert not reader.paused()  # "two" is buffered.
        assert next(lines)[0] == b"two"
        assert reader.paused()
        os.write(write_fd, b"three")
        assert not reader.paused()  # The pipe has bytes again.


@pytest.mark.parametrize(
    ("address", "valid"),
    [
        ("127.0.0.1:9101", True),
        ("node-1:1", True),
        ("[::1]:9101", True),
        ("host", False),
        (":9101", False),
        ("h:0", False),
        ("h:70000", False),
        ("h:x", False),
    ],
)
def test_address_must_be_host_and_port(address: str, valid: bool) -> None:
    """--bootstrap and --node accept host:port with a port in 1-65535, nothing else."""
    assert (address_problem(address) is None) == valid


def test_the_group_leaders_table_shows_each_raft_group_only_with_several() -> None:
    """With worker processes each Raft group's leader is a row (from the first node that answered);
    a cluster of one group shows no such table, the node table already names its leader."""
    alone = (GroupLeaderInfo(0, "1", "h:1", 3),)
    one = NodeStatus("h:1", "1", "leader", "1", "h:1", 3, 9, 9, True, 4, group_leaders=alone)
    assert group_leaders_table([one]) is None
    several = NodeStatus(
        "h:1",
        "1",
        "leader",
        "1",
        "h:1",
        3,
        9,
        9,
        True,
        4,
        group_leaders=(GroupLeaderInfo(0, "1", "h:1", 3), GroupLeaderInfo(1, "", "", 0)),
    )
    table = group_leaders_table([KqClientError("down"), several])
    assert table is not None
    assert [list(column.cells) for column in table.columns] == [
        ["0", "1"],
        ["1", "-"],
        ["h:1", "-"],
        ["3", "0"],
    ]
