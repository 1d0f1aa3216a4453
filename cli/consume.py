"""`kq consume`: print a topic's records from its end (as Kafka's console consumer), start, or an offset.

With `--group` the command is a member of a consumer group instead (`cli.group_consume`); what
follows is the standalone reader, which chooses its own partitions and offsets and commits nothing.

Without `--follow` the command stops at the log ends it saw when it started: `--from-beginning`
dumps the topic and exits. The default start, the log end, therefore prints nothing without
`--follow` (a note on stderr says so); `kq consume TOPIC --follow` is Kafka's console consumer.
With `--follow` it waits for new records until Ctrl-C, which exits 0.

The start and end offsets come from the leader (or `--node`); records are then read from any node
(or `--node`). Each fetch passes the highest Raft applied index seen so far, starting with the
leader's, as `min_index`: every record acknowledged before the command started is seen, and offsets
only go forward while moving between nodes. A node that has not applied `min_index` yet answers with
no records at once (a fetch that does not wait), which means "not yet", not "nothing there": the
reader then asks for that partition again with a wait, which the node spends catching up, before it
moves on. So without --follow the partitions come out in ascending order, each from its start
position, at most CLI_FETCH_RECORDS_MAX records of one partition before the next one's turn.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import click

from kq.cli.context import metadata_node, open_client, parse_node
from kq.cli.group_consume import consume_group, group_options, group_settings
from kq.cli.output import Formatter, counted, format_json, format_plain, write_records
from kq.client import ConsumerRecord, KqClient
from kq.client.types import FetchResult
from kq.proto.limits import CLI_FETCH_RECORDS_MAX

SINGLE_PARTITION_WAIT_MS = 1_000  # Long-poll this long when only one partition can have new records.
POLL_SLICE_MS = 100  # With several partitions, long-poll one this long, then look at all of them again.


class PartitionReader:
    """Reads chosen partitions from given offsets up to given ends (or forever), at most N records."""

    def __init__(
        self,
        client: KqClient,
        topic: str,
        positions: dict[int, int],
        *,
        end_offsets: dict[int, int] | None,
        node: str | None,
        min_index: int,
        records_max: int | None,
    ) -> None:
        self._client = client
        self._topic = topic
        self._positions = dict(positions)
        self._end_offsets = end_offsets
        self._node = node
        self._min_index = min_index
        self._records_max = records_max
        self.count = 0

    def batches(self) -> Iterator[Sequence[ConsumerRecord]]:
        """Yields records batch by batch, each partition in offset order, until done (never if following)."""
        turn = 0
        while not self._done():
            pending = self._pending_partitions()
            found = False
            for partition in pending:
                records = self._fetch(partition, wait_ms=0)
                if records:
                    found = True
                    yield records
                if self._done():
                    return
            if not found:  # Everything is caught up: wait on one partition, a different one each time.
                turn = (turn + 1) % len(pending)
                wait_ms = SINGLE_PARTITION_WAIT_MS if len(pending) == 1 else POLL_SLICE_MS
                records = self._fetch(pending[turn], wait_ms)
                if records:
                    yield records

    def _pending_partitions(self) -> list[int]:
        if self._end_offsets is None:
            return list(self._positions)
        return [p for p, offset in self._positions.items() if offset < self._end_offsets[p]]

    def _done(self) -> bool:
        if self._records_max is not None and self.count >= self._records_max:
            return True
        return not self._pending_partitions()

    def _fetch(self, partition: int, wait_ms: int) -> Sequence[ConsumerRecord]:
        position = self._positions[partition]
        limit = CLI_FETCH_RECORDS_MAX
        if self._records_max is not None:
            limit = min(limit, self._records_max - self.count)
        if self._end_offsets is not None:
            limit = min(limit, self._end_offsets[partition] - position)
        min_index = self._min_index

        def ask(wait: int) -> FetchResult:
            return self._client.fetch(
                self._topic,
                partition,
                position,
                max_records=limit,
                wait_ms=wait,
                node=self._node,
                min_index=min_index,
            )

        result = ask(wait_ms)
        while result.applied_index < min_index:
            # A node behind `min_index` answered "not yet" (its store may not even hold the records
            # the leader counted): ask again, waiting, rather than move on to the next partition
            # and print it first. The wait ends as soon as a node has caught up and holds records.
            result = ask(max(wait_ms, SINGLE_PARTITION_WAIT_MS))
        self._min_index = max(self._min_index, result.applied_index)
        records = result.records[:limit]
        if len(result.records) > limit:
            self._positions[partition] = records[-1].offset + 1
        else:  # Past the records, or past offsets compaction left empty.
            self._positions[partition] = max(self._positions[partition], result.next_offset)
        self.count += len(records)
        return records


def start_positions(
    offsets: dict[int, tuple[int, int]], partitions: Sequence[int], from_beginning: bool, offset: int | None
) -> dict[int, int]:
    """Where each chosen partition starts: log start, an explicit offset (checked), or log end.

    `offsets` maps each partition to (log start, log end).
    """
    positions = {}
    for partition in partitions:
        log_start, log_end = offsets[partition]
        if offset is not None and not log_start <= offset <= log_end:
            raise click.BadParameter(
                f"offset {offset} is outside partition {partition}'s range {log_start}-{log_end}",
                param_hint="'--offset'",
            )
        positions[partition] = log_start if from_beginning else log_end if offset is None else offset
    return positions


def _chosen_partitions(topic: str, count: int, requested: tuple[int, ...]) -> list[int]:
    if not requested:
        return list(range(count))
    for partition in requested:
        if partition >= count:
            raise click.BadParameter(
                f"topic {topic} has {counted(count, 'partition')} (0-{count - 1}), not {partition}",
                param_hint="'--partition'",
            )
    return sorted(set(requested))


@click.command()
@click.argument("topic", required=False)
@click.option(
    "--partition",
    "-p",
    "partitions",
    type=click.IntRange(min=0),
    multiple=True,
    help="Read this partition (repeatable; default: all).",
)
@click.option(
    "--from-beginning",
    is_flag=True,
    help="Start at each partition's log start (default: its end); with --group: --reset earliest.",
)
@click.option("--offset", type=click.IntRange(min=0), help="Start at this offset in each chosen partition.")
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new records (until Ctrl-C).")
@click.option("--max", "records_max", type=click.IntRange(min=1), help="Stop after this many records.")
@click.option("--node", callback=parse_node, metavar="HOST:PORT", help="Read from this node (default: any).")
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["plain", "json"]),
    default="plain",
    show_default=True,
    help="plain: one value per line; json: one JSON object per record.",
)
@click.option("--print-key", is_flag=True, help="plain format: print key SEP value.")
@click.option("--key-separator", default="\t", show_default=r"\t", metavar="SEP", help="SEP for --print-key.")
@group_options
@click.pass_context
def consume(
    ctx: click.Context,
    topic: str | None,
    partitions: tuple[int, ...],
    from_beginning: bool,
    offset: int | None,
    follow: bool,
    records_max: int | None,
    node: str | None,
    output_format: str,
    print_key: bool,
    key_separator: str,
    group: str | None,
    pattern: str | None,
    commit: str | None,
    reset: str | None,
    assignor: str | None,
    client_id: str | None,
) -> None:
    """Print records of TOPIC, one per line, to stdout.

    Starts at the log end unless --from-beginning or --offset; stops at the log end seen at start
    unless --follow. A missing key or value prints as null in the plain format.

    With --group GROUP, reads as a member of that consumer group: from the group's committed
    offsets (else --reset), sharing the partitions with the group's other members, committing
    what it printed; stops when caught up (or at Ctrl-C with --follow) and leaves the group.
    """
    separator = key_separator.encode("utf-8", "surrogateescape")
    formatter: Formatter = (
        format_json
        if output_format == "json"
        else lambda r: format_plain(r, print_key=print_key, key_separator=separator)
    )
    settings = group_settings(
        group=group,
        topic=topic,
        pattern=pattern,
        from_beginning=from_beginning,
        commit=commit,
        reset=reset,
        assignor=assignor,
        client_id=client_id,
        standalone_options={
            "--partition": bool(partitions),
            "--offset": offset is not None,
            "--node": bool(node),
        },
    )
    if settings is not None:
        consume_group(open_client(ctx), settings, follow=follow, records_max=records_max, formatter=formatter)
        return
    if topic is None:
        raise click.UsageError("Missing argument 'TOPIC'.")
    if from_beginning and offset is not None:
        raise click.UsageError("--from-beginning and --offset cannot be used together")
    try:
        reader = _reader(
            open_client(ctx), topic, partitions, from_beginning, offset, follow, node, records_max
        )
        if not follow and not from_beginning and offset is None:
            click.echo(
                "kq: note: starting at the log end without --follow prints nothing; add --from-beginning "
                "or --follow",
                err=True,
            )
        for records in reader.batches():
            write_records(records, formatter)
    except KeyboardInterrupt:
        return  # Ctrl-C is how a person stops following: a clean exit, whenever it comes.


def _reader(
    client: KqClient,
    topic: str,
    partitions: tuple[int, ...],
    from_beginning: bool,
    offset: int | None,
    follow: bool,
    node: str | None,
    records_max: int | None,
) -> PartitionReader:
    """A reader of the chosen partitions, positioned and bounded by what the leader (or --node) holds now."""
    description = client.describe_topic(topic, metadata_node(client, node))
    offsets = {p.partition: (p.log_start_offset, p.log_end_offset) for p in description.partitions}
    chosen = _chosen_partitions(topic, description.topic.partitions, partitions)
    return PartitionReader(
        client,
        topic,
        start_positions(offsets, chosen, from_beginning, offset),
        end_offsets=None if follow else {p: offsets[p][1] for p in chosen},
        node=node,
        min_index=description.applied_index,
        records_max=records_max,
    )
