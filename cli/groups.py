"""`kq groups`: list, describe (with lag), reset the offsets of, and delete consumer groups.

Reads go to the leader (`metadata_node`), so a group another `kq` process just changed is seen as
changed. Group names, topics and offsets are checked by the broker; a reset or delete of a group
with active members is refused there, and the CLI reports the broker's one-line reason.
"""

from __future__ import annotations

import click

from kq.cli.context import metadata_node, open_client, parse_node, stdin_is_interactive
from kq.cli.errors import CommandError
from kq.cli.group_output import (
    datetime_to_ms,
    group_heading,
    group_summary_to_dict,
    group_to_dict,
    groups_table,
    lag_table,
    ms_to_text,
    offsets_table,
    offsets_to_dict,
    total_lag_line,
)
from kq.cli.output import counted, print_json, print_table, print_text
from kq.client import GroupNotFoundError, KqClient
from kq.client.types import GroupDescription

FORMAT_CHOICE = click.Choice(["table", "json"])
RESET_TARGET_OPTIONS = ("--to-earliest", "--to-latest", "--to-offset", "--to-datetime", "--to-timestamp")


@click.group()
def groups() -> None:
    """List, describe, reset and delete consumer groups."""


@groups.command(name="list")
@click.option("--format", "output_format", type=FORMAT_CHOICE, default="table", show_default=True)
@click.option("--node", callback=parse_node, metavar="HOST:PORT", help="Ask this node (default: the leader).")
@click.pass_context
def list_(ctx: click.Context, output_format: str, node: str | None) -> None:
    """List groups with their phase, generation and member count."""
    client = open_client(ctx)
    summaries = sorted(client.list_groups(metadata_node(client, node)), key=lambda summary: summary.name)
    if output_format == "json":
        print_json([group_summary_to_dict(summary) for summary in summaries])
    elif summaries:
        print_table(groups_table(summaries))
    else:
        print_text("no groups")


@groups.command()
@click.argument("group")
@click.option("--node", callback=parse_node, metavar="HOST:PORT", help="Ask this node (default: the leader).")
@click.option("--format", "output_format", type=FORMAT_CHOICE, default="table", show_default=True)
@click.pass_context
def describe(ctx: click.Context, group: str, node: str | None, output_format: str) -> None:
    """Show GROUP's members and, per partition, its committed offset, the log end and the lag.

    Lag is the log end minus the committed offset; a partition with no committed offset (`-`)
    counts from its log start.
    """
    client = open_client(ctx)
    description = client.describe_group(group, metadata_node(client, node))
    if output_format == "json":
        print_json(group_to_dict(description))
        return
    print_text(group_heading(description))
    if description.partitions:
        print_table(lag_table(description))
    print_text(total_lag_line(description))


@groups.command(name="reset-offsets")
@click.argument("group")
@click.option(
    "--topic",
    "-t",
    "topics",
    multiple=True,
    required=True,
    help="Reset this topic's partitions (repeatable).",
)
@click.option("--to-earliest", is_flag=True, help="To each partition's log start.")
@click.option("--to-latest", is_flag=True, help="To each partition's log end (skip everything).")
@click.option("--to-offset", type=click.IntRange(min=0), metavar="N", help="To offset N in every partition.")
@click.option(
    "--to-datetime",
    metavar="ISO8601",
    help="To the first record at or after this time, e.g. 2024-05-01T12:00:00Z (no zone: local time).",
)
@click.option(
    "--to-timestamp",
    type=click.IntRange(min=0),
    metavar="MS",
    help="To the first record at or after this many milliseconds since the epoch.",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--format", "output_format", type=FORMAT_CHOICE, default="table", show_default=True)
@click.pass_context
def reset_offsets(
    ctx: click.Context,
    group: str,
    topics: tuple[str, ...],
    to_earliest: bool,
    to_latest: bool,
    to_offset: int | None,
    to_datetime: str | None,
    to_timestamp: int | None,
    yes: bool,
    output_format: str,
) -> None:
    """Move GROUP's committed offsets on the given topics; the group must have no active members.

    Exactly one --to-* option says where. A group that does not exist yet is created with these
    offsets, so its first consumer starts there. Prints the new offsets.
    """
    given = (to_offset, to_datetime, to_timestamp)
    if sum([to_earliest, to_latest, *(value is not None for value in given)]) != 1:
        raise click.UsageError(f"choose exactly one of {', '.join(RESET_TARGET_OPTIONS)}")
    if to_datetime is not None:
        to_timestamp = _datetime_option(to_datetime)
    target, target_text = _reset_target(to_earliest, to_latest, to_offset, to_timestamp)
    client = open_client(ctx)
    if not yes:
        _refuse_if_active(group, _existing_group(client, group))
        _confirm(
            f"Reset the offsets of group {group} on {', '.join(topics)} to {target_text}?",
            f"resetting the offsets of group {group} needs confirmation: pass --yes",
        )
    offsets = client.reset_offsets(
        group, list(topics), target, offset=to_offset or 0, timestamp_ms=to_timestamp or 0
    )
    if output_format == "json":
        print_json(offsets_to_dict(group, offsets))
        return
    print_text(f"group {group}: {counted(len(offsets), 'partition')} reset to {target_text}")
    print_table(offsets_table(offsets))


def _datetime_option(text: str) -> int:
    try:
        timestamp_ms = datetime_to_ms(text)
    except ValueError as error:
        raise click.BadParameter(
            f"{text!r} is not an ISO 8601 date and time (e.g. 2024-05-01T12:00:00Z)",
            param_hint="'--to-datetime'",
        ) from error
    if timestamp_ms < 0:
        raise click.BadParameter(f"{text!r} is before 1970", param_hint="'--to-datetime'")
    return timestamp_ms


def _reset_target(
    to_earliest: bool, to_latest: bool, to_offset: int | None, to_timestamp: int | None
) -> tuple[str, str]:
    """The client's reset target and how to say it to a person."""
    if to_earliest:
        return "earliest", "earliest"
    if to_latest:
        return "latest", "latest"
    if to_offset is not None:
        return "offset", f"offset {to_offset}"
    assert to_timestamp is not None, "the caller checked that exactly one target was chosen"
    return "timestamp", f"the first record at or after {ms_to_text(to_timestamp)}"


@groups.command()
@click.argument("group")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def delete(ctx: click.Context, group: str, yes: bool) -> None:
    """Delete GROUP and its committed offsets; the group must have no active members."""
    client = open_client(ctx)
    if not yes:
        description = client.describe_group(group, metadata_node(client, None))  # Unknown: fail first.
        _refuse_if_active(group, description)
        _confirm(
            f"Delete group {group} ({counted(len(description.partitions), 'partition')} with offsets)?",
            f"deleting group {group} needs confirmation: pass --yes",
        )
    client.delete_group(group)
    print_text(f"deleted group {group}")


def _existing_group(client: KqClient, group: str) -> GroupDescription | None:
    """The group as the leader holds it, or None when it does not exist (yet)."""
    try:
        return client.describe_group(group, metadata_node(client, None))
    except GroupNotFoundError:
        return None


def _refuse_if_active(group: str, description: GroupDescription | None) -> None:
    """Fails before asking a question whose answer the broker would refuse anyway."""
    if description is not None and description.members:
        # The broker's own words for the same refusal, so the message does not depend on the path.
        raise CommandError(f"group {group} has active members; stop its consumers first")


def _confirm(question: str, refusal: str) -> None:
    """Asks on a terminal (declining exits 1); without one, refuses with a usage error."""
    if not stdin_is_interactive():
        raise click.UsageError(f"{refusal} (stdin is not a terminal)")
    click.confirm(question, abort=True)
