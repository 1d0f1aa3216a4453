"""`kq produce`: records from arguments, stdin or a file, sent in batches, with an optional progress bar.

Each VALUE argument, or each input line, is one record. Lines end at `\\n` (a `\\r` before it is
dropped too), and an empty line is sent as a record with an empty value, as Kafka's console producer
does. With `--key-separator SEP` a line is split at its first SEP into key and value; a line without
SEP is an error (as in Kafka), reported with its line number before its batch is sent.

Records go out through `KqClient.send_batch`, at most CLI_PRODUCE_RECORDS_MAX records or
CLI_PRODUCE_BYTES_MAX bytes at a time, and a batch is also sent as soon as the input pauses, so
`tail -f app.log | kq produce logs` delivers each line when it is written. Batches that were sent
before a failure stay written (the error line says how many records).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import click

from kq.cli.context import metadata_node, open_client
from kq.cli.errors import CommandError
from kq.cli.input_lines import LineReader
from kq.cli.output import counted, print_text, produce_summary
from kq.cli.progress import ProgressBar
from kq.client import KqClient, KqClientError, ProducerRecord, RecordMetadata
from kq.client.partitioner import partition_for_key
from kq.proto.limits import CLI_PRODUCE_BYTES_MAX, CLI_PRODUCE_RECORDS_MAX

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, the shell convention.


class PartitionChooser:
    """Each record's partition: the fixed one, else the client's rule (Kafka's murmur2 of the key, else
    round-robin), from a partition count read on the leader.

    The CLI chooses instead of the client because the client looks the count up on any node, and a
    follower may not have applied a topic that another `kq` process created a moment ago.
    """

    def __init__(self, partition_count: int, fixed_partition: int | None, first_partition: int) -> None:
        assert partition_count > 0 and 0 <= first_partition < partition_count
        self._count = partition_count
        self._fixed = fixed_partition
        self._next = first_partition  # Random per run, so one-record runs do not all land on partition 0.

    def choose(self, key: bytes | None) -> int:
        """The partition for a record with `key`."""
        if self._fixed is not None:
            return self._fixed
        if key is not None:
            return partition_for_key(key, self._count)
        partition, self._next = self._next, (self._next + 1) % self._count
        return partition


@dataclass(frozen=True, slots=True)
class RecordShape:
    """What the options say about every record: a fixed key or a key separator, headers, the partition."""

    key: bytes | None
    key_separator: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    partitions: PartitionChooser

    def record(self, data: bytes, number: int, noun: str) -> ProducerRecord:
        """The record for input item `number` (a line or an argument, named by `noun` in errors)."""
        key, value = self.key, data
        if self.key_separator is not None:
            key, found, value = data.partition(self.key_separator)
            if not found:
                raise CommandError(
                    f"{noun} {number} has no key separator {self.key_separator.decode(errors='replace')!r}"
                )
        return ProducerRecord(
            value=value, key=key, headers=self.headers, partition=self.partitions.choose(key)
        )


@dataclass(frozen=True, slots=True)
class InputItem:
    """One record's input: its bytes, input bytes used (for progress), whether the input paused after it."""

    data: bytes
    consumed_bytes: int
    paused: bool


class OffsetTally:
    """How many records were sent and the offset range written in each partition."""

    def __init__(self) -> None:
        self.count = 0
        self.ranges: dict[int, tuple[int, int]] = {}

    def add(self, metadata: Sequence[RecordMetadata]) -> None:
        """Counts acknowledged records."""
        for item in metadata:
            low, high = self.ranges.get(item.partition, (item.offset, item.offset))
            self.ranges[item.partition] = (min(low, item.offset), max(high, item.offset))
        self.count += len(metadata)


def _parse_header(
    _ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]
) -> tuple[tuple[str, bytes], ...]:
    headers = []
    for text in values:
        name, found, value = text.partition("=")
        if not found or not name:
            raise click.BadParameter(f"{text!r} is not name=value")
        headers.append((name, _arg_bytes(value)))
    return tuple(headers)


def _arg_bytes(text: str) -> bytes:
    """An argument's original bytes (Python decodes argv with surrogateescape; this undoes it)."""
    return text.encode("utf-8", "surrogateescape")


@click.command()
@click.argument("topic")
@click.argument("values", nargs=-1)
@click.option(
    "--file",
    "file_path",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path),
    help="Read records from this file, one per line ('-' for stdin).",
)
@click.option("--key", help="Key of every record.")
@click.option("--key-separator", metavar="SEP", help="Split each line at its first SEP into key and value.")
@click.option("--partition", type=click.IntRange(min=0), help="Send every record to this partition.")
@click.option(
    "--header",
    "headers",
    multiple=True,
    callback=_parse_header,
    metavar="NAME=VALUE",
    help="Add this header to every record (repeatable).",
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Show a progress bar on stderr (default: when stderr is a terminal and input is piped).",
)
@click.pass_context
def produce(
    ctx: click.Context,
    topic: str,
    values: tuple[str, ...],
    file_path: Path | None,
    key: str | None,
    key_separator: str | None,
    partition: int | None,
    headers: tuple[tuple[str, bytes], ...],
    progress: bool | None,
) -> None:
    """Send records to TOPIC: each VALUE, or else each line of stdin (or --file).

    Empty lines are sent as empty values. Prints one summary line: records sent, offsets per partition.
    """
    if key is not None and key_separator is not None:
        raise click.UsageError("--key and --key-separator cannot be used together")
    if values and file_path is not None:
        raise click.UsageError("give VALUE arguments or --file, not both")
    if key_separator == "":
        raise click.UsageError("--key-separator cannot be empty")
    client = open_client(ctx)
    count = _partition_count(client, topic, partition)
    shape = RecordShape(
        key=None if key is None else _arg_bytes(key),
        key_separator=None if key_separator is None else _arg_bytes(key_separator),
        headers=headers,
        partitions=PartitionChooser(count, partition, random.randrange(count)),
    )
    tally = OffsetTally()
    try:
        if values:
            items = (InputItem(_arg_bytes(v), len(v), paused=False) for v in values)
            _send_all(client, topic, shape, items, "argument", ProgressBar(bool(progress), None), tally)
        else:
            with _open_input(file_path) as stream:
                _send_lines(client, topic, shape, stream, progress, tally)
    except KeyboardInterrupt:
        raise ProduceInterruptedError(f"interrupted after sending {tally.count} records") from None
    print_text(produce_summary(topic, tally.count, tally.ranges))


def _partition_count(client: KqClient, topic: str, partition: int | None) -> int:
    """The topic's partition count from the leader; fails on an unknown topic (even with empty input)
    and on a --partition the topic does not have."""
    count = client.describe_topic(topic, metadata_node(client, None)).topic.partitions
    if partition is not None and partition >= count:
        raise click.BadParameter(
            f"topic {topic} has {counted(count, 'partition')} (0-{count - 1}), not {partition}",
            param_hint="'--partition'",
        )
    return count


def _open_input(file_path: Path | None) -> AbstractContextManager[BinaryIO]:
    """The input stream: the file, or stdin (left open: it is not ours to close)."""
    if file_path is None or str(file_path) == "-":
        return nullcontext(sys.stdin.buffer)
    return file_path.open("rb")


def _send_lines(
    client: KqClient,
    topic: str,
    shape: RecordShape,
    stream: BinaryIO,
    progress: bool | None,
    tally: OffsetTally,
) -> None:
    """Sends every line of `stream`; the progress bar is on by default for piped input on a terminal."""
    reader = LineReader(stream)
    if progress is None:
        progress = sys.stderr.isatty() and not reader.interactive
    items = (InputItem(line, consumed_bytes, reader.paused()) for line, consumed_bytes in reader.lines())
    _send_all(client, topic, shape, items, "line", ProgressBar(progress, reader.size_bytes), tally)


def _send_all(
    client: KqClient,
    topic: str,
    shape: RecordShape,
    items: Iterator[InputItem],
    noun: str,
    progress_bar: ProgressBar,
    tally: OffsetTally,
) -> None:
    """Sends records in batches: full ones, or whatever is there when the input pauses."""
    batch: list[ProducerRecord] = []
    batch_bytes = consumed_bytes = 0
    with progress_bar:
        for number, item in enumerate(items, start=1):
            record = shape.record(item.data, number, noun)
            batch.append(record)
            batch_bytes += len(record.value or b"") + len(record.key or b"")
            consumed_bytes += item.consumed_bytes
            if item.paused or len(batch) >= CLI_PRODUCE_RECORDS_MAX or batch_bytes >= CLI_PRODUCE_BYTES_MAX:
                _send_batch(client, topic, batch, tally)
                progress_bar.advance(tally.count, consumed_bytes)
                batch, batch_bytes, consumed_bytes = [], 0, 0
        if batch:
            _send_batch(client, topic, batch, tally)
            progress_bar.advance(tally.count, consumed_bytes)


def _send_batch(client: KqClient, topic: str, batch: list[ProducerRecord], tally: OffsetTally) -> None:
    """Sends one batch; a failure after earlier batches says how many records those wrote."""
    try:
        tally.add(client.send_batch(topic, batch))
    except KqClientError as error:
        if tally.count == 0:
            raise
        raise CommandError(f"{error} ({tally.count} records were sent before this batch)") from error


class ProduceInterruptedError(CommandError):
    """Ctrl-C during produce: exit 130 and say what was sent (those records stay written)."""

    exit_code = INTERRUPTED_EXIT_CODE
