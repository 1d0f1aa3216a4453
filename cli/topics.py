"""`kq topics`: create, list, describe and delete topics.

Names and partition counts are checked by the broker (one set of rules, at the gRPC edge), so the
CLI passes them through and reports the broker's reason.
"""

from __future__ import annotations

import click

from kq.cli.context import metadata_node, open_client, parse_node, stdin_is_interactive
from kq.cli.output import (
    counted,
    description_heading,
    description_to_dict,
    partitions_table,
    print_json,
    print_table,
    print_text,
    topic_to_dict,
    topics_table,
)
from kq.client import TopicExistsError

FORMAT_CHOICE = click.Choice(["table", "json"])


@click.group()
def topics() -> None:
    """Create, list, describe and delete topics."""


@topics.command()
@click.argument("name")
@click.option("--partitions", "-p", type=int, default=1, show_default=True, help="Number of partitions.")
@click.option("--if-not-exists", is_flag=True, help="Succeed without change when the topic exists.")
@click.pass_context
def create(ctx: click.Context, name: str, partitions: int, if_not_exists: bool) -> None:
    """Create topic NAME (letters, digits, '.', '_', '-'; at most 249 bytes)."""
    client = open_client(ctx)
    try:
        info = client.create_topic(name, partitions)
    except TopicExistsError:
        if not if_not_exists:
            raise
        print_text(f"topic {name} already exists")
        return
    print_text(f"created topic {info.name} with {counted(info.partitions, 'partition')} (id {info.topic_id})")


@topics.command(name="list")
@click.option("--format", "output_format", type=FORMAT_CHOICE, default="table", show_default=True)
@click.option("--node", callback=parse_node, metavar="HOST:PORT", help="Ask this node (default: the leader).")
@click.pass_context
def list_(ctx: click.Context, output_format: str, node: str | None) -> None:
    """List topics with their partition counts."""
    client = open_client(ctx)
    topic_infos = sorted(client.list_topics(metadata_node(client, node)), key=lambda info: info.name)
    if output_format == "json":
        print_json([topic_to_dict(info) for info in topic_infos])
    elif topic_infos:
        print_table(topics_table(topic_infos))
    else:
        print_text("no topics")


@topics.command()
@click.argument("name")
@click.option("--node", callback=parse_node, metavar="HOST:PORT", help="Ask this node (default: the leader).")
@click.option("--format", "output_format", type=FORMAT_CHOICE, default="table", show_default=True)
@click.pass_context
def describe(ctx: click.Context, name: str, node: str | None, output_format: str) -> None:
    """Show each partition's log start, log end and size, as one node sees them."""
    client = open_client(ctx)
    description = client.describe_topic(name, metadata_node(client, node))
    if output_format == "json":
        print_json(description_to_dict(description))
        return
    print_text(description_heading(description))
    print_table(partitions_table(description))


@topics.command()
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def delete(ctx: click.Context, name: str, yes: bool) -> None:
    """Delete topic NAME and all its records (asks first unless --yes)."""
    client = open_client(ctx)
    description = client.describe_topic(name, metadata_node(client, None))  # Unknown: fail before asking.
    if not yes:
        if not stdin_is_interactive():
            raise click.UsageError(
                f"deleting topic {name} needs confirmation: pass --yes (stdin is not a terminal)"
            )
        records = sum(p.log_end_offset - p.log_start_offset for p in description.partitions)
        partitions = counted(description.topic.partitions, "partition")
        click.confirm(f"Delete topic {name} ({partitions}, {counted(records, 'record')})?", abort=True)
    client.delete_topic(name)
    print_text(f"deleted topic {name}")
