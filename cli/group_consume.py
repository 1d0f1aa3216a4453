"""`kq consume TOPIC --group G`: read as a member of a consumer group, over `client.GroupConsumer`.

The group's members share the topic's partitions, and the cluster keeps where the group is
(committed offsets), so a second `kq consume --group G` in another terminal takes half the
partitions, and a later run continues where the last one stopped.

- **Start**: per partition, the group's committed offset; without one, `--reset` (default latest,
  as Kafka's console consumer; `--from-beginning` means `--reset earliest`).
- **Stop**: without `--follow`, once every partition the member owns has reached the log end it had
  when the member was given it (records appended meanwhile may print too); with `--follow`, at
  Ctrl-C. `--max N` stops after N records either way.
- **Commit**: `auto` lets the GroupConsumer commit on its interval, before a rebalance and when it
  closes; `manual` commits after each batch is written to stdout. Both commit only what was printed,
  so delivery is at-least-once.
- **Ctrl-C** (or SIGTERM) lets the batch being written finish, then the member commits (auto) and
  leaves the group, so its partitions move to the other members at once. A second Ctrl-C stops
  without waiting. Each new assignment is noted on stderr.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

import click

from kq.cli.group_output import assignment_text
from kq.cli.output import Formatter, write_records
from kq.client import GroupConsumer, KqClient, RebalanceError

COMMIT_MODES = ("auto", "manual")
RESET_POLICIES = ("earliest", "latest")
ASSIGNOR_NAMES = ("range", "roundrobin", "sticky")  # The broker's; it checks them again.
CLIENT_ID_DEFAULT = "kq-consume"  # The broker appends a unique suffix to make the member id.
FOLLOW_POLL_MS = 500  # How long one poll waits for records; also how late Ctrl-C can take effect.
CATCH_UP_POLL_MS = 200  # Without --follow the records wanted exist already; a poll waits only briefly.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

Command = TypeVar("Command", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """What `kq consume --group` was asked to do, checked."""

    group: str
    topics: tuple[str, ...]
    pattern: str
    commit: str
    reset: str
    assignor: str  # '' leaves the choice to the broker: the group's, or range for a new group.
    client_id: str


def group_options(command: Command) -> Command:
    """Adds the --group options to `kq consume`."""
    options = [
        click.option(
            "--group",
            "-g",
            metavar="GROUP",
            help="Consume as a member of GROUP: share the partitions with its other members and "
            "continue from its committed offsets.",
        ),
        click.option(
            "--pattern", metavar="REGEX", help="With --group: every topic matching REGEX instead of TOPIC."
        ),
        click.option(
            "--commit",
            type=click.Choice(COMMIT_MODES),
            help="With --group: auto (every 5 s, before a rebalance, on exit) or manual (after each "
            "printed batch). Default: auto.",
        ),
        click.option(
            "--reset",
            type=click.Choice(RESET_POLICIES),
            help="With --group: where to start a partition the group has no committed offset for. "
            "Default: latest.",
        ),
        click.option(
            "--assignor",
            type=click.Choice(ASSIGNOR_NAMES),
            help="With --group: how partitions are shared, for a group this member creates (a group "
            "that exists keeps its own). Default: range.",
        ),
        click.option(
            "--client-id",
            metavar="ID",
            help="With --group: this member's name, the start of its member id. "
            f"Default: {CLIENT_ID_DEFAULT}.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def group_settings(
    *,
    group: str | None,
    topic: str | None,
    pattern: str | None,
    from_beginning: bool,
    commit: str | None,
    reset: str | None,
    assignor: str | None,
    client_id: str | None,
    standalone_options: dict[str, bool],
) -> GroupSettings | None:
    """The checked group settings, or None without --group; a misfit combination is a usage error.

    `standalone_options` maps each option that only reads without a group to whether it was given.
    """
    if group is None:
        given = {"--pattern": pattern, "--commit": commit, "--reset": reset, "--assignor": assignor}
        for name, value in {**given, "--client-id": client_id}.items():
            if value is not None:
                raise click.UsageError(f"{name} needs --group")
        return None
    for name, was_given in standalone_options.items():
        if was_given:
            raise click.UsageError(f"--group and {name} cannot be used together")
    if (topic is None) == (pattern is None):
        raise click.UsageError("with --group, name either a TOPIC or a --pattern")
    if from_beginning and reset is not None:
        raise click.UsageError("--from-beginning and --reset cannot be used together")
    return GroupSettings(
        group=group,
        topics=() if topic is None else (topic,),
        pattern=pattern or "",
        commit=commit or "auto",
        reset="earliest" if from_beginning else reset or "latest",
        assignor=assignor or "",
        client_id=client_id or CLIENT_ID_DEFAULT,
    )


class CatchUp:
    """The log end each owned partition had when it was assigned: where a run without --follow stops."""

    def __init__(self, client: KqClient) -> None:
        self._client = client
        self._ends: dict[tuple[str, int], int] = {}

    def assigned(self, partitions: list[tuple[str, int]]) -> None:
        """Reads the log ends of a new assignment (and forgets the partitions given up)."""
        ends = {}
        for topic in sorted({topic for topic, _ in partitions}):
            for partition, offsets in self._client.list_offsets(topic).items():
                ends[(topic, partition)] = offsets.log_end_offset
        self._ends = {tp: ends[tp] for tp in partitions}

    def done(self, consumer: GroupConsumer) -> bool:
        """Whether the member has read every owned partition up to its end."""
        return all(consumer.position(topic, p) >= end for (topic, p), end in self._ends.items())


def consume_group(
    client: KqClient, settings: GroupSettings, *, follow: bool, records_max: int | None, formatter: Formatter
) -> None:
    """Prints the group's records as one member, until caught up (or Ctrl-C), then leaves the group."""
    catch_up = CatchUp(client)
    consumer: GroupConsumer

    def on_assign(partitions: list[tuple[str, int]]) -> None:
        if not follow:
            catch_up.assigned(partitions)
        click.echo(
            f"kq: group {settings.group}, generation {consumer.generation}: member {consumer.member_id} "
            f"reads {assignment_text(partitions)}",
            err=True,
        )

    consumer = GroupConsumer(
        client,
        settings.group,
        settings.topics,
        pattern=settings.pattern,
        assignor=settings.assignor,
        client_id=settings.client_id,
        auto_offset_reset=settings.reset,
        enable_auto_commit=settings.commit == "auto",
        on_assign=on_assign,
    )
    with stop_on_signals() as stop:
        try:
            _poll_and_print(
                consumer,
                stop,
                catch_up=None if follow else catch_up,
                manual_commit=settings.commit == "manual",
                records_max=records_max,
                formatter=formatter,
            )
        finally:
            consumer.close()  # Commits in auto mode and leaves, so the partitions move at once.


def _poll_and_print(
    consumer: GroupConsumer,
    stop: threading.Event,
    *,
    catch_up: CatchUp | None,
    manual_commit: bool,
    records_max: int | None,
    formatter: Formatter,
) -> None:
    """The member's loop: poll, print, commit (manual mode), until asked to stop or done."""
    count = 0
    timeout_ms = CATCH_UP_POLL_MS if catch_up is not None else FOLLOW_POLL_MS
    while not stop.is_set():
        limit = None if records_max is None else records_max - count
        records = consumer.poll(timeout_ms, max_records=limit)
        if records:
            write_records(records, formatter)
            count += len(records)
            if manual_commit:
                _commit_printed(consumer)
        if records_max is not None and count >= records_max:
            return
        if catch_up is not None and catch_up.done(consumer):
            return


def _commit_printed(consumer: GroupConsumer) -> None:
    """Commits what was just printed; a commit that lost a rebalance means records may print again."""
    try:
        consumer.commit()
    except RebalanceError:
        click.echo(
            f"kq: note: group {consumer.group} rebalanced before the commit; "
            "the last records may be printed again",
            err=True,
        )


@contextlib.contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by the first SIGINT or SIGTERM; a second one raises KeyboardInterrupt at once.

    Outside the main thread (where Python cannot take signals) the event is simply never set.
    """
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handle(_signal_number: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = {number: signal.signal(number, handle) for number in STOP_SIGNALS}
    try:
        yield stop
    finally:
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
