"""`kq topics`: create, list, describe, configure, grow and delete topics.

Names and partition counts are checked by the broker (one set of rules, at the gRPC edge), so the
CLI passes them through and reports the broker's reason.
"""

from __future__ import annotations

import click

from kq.cli.context import metadata_node, open_client, parse_node, stdin_is_interactive
from kq.cli.output import (
    config_to_dict,
    configs_table,
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
from kq.raft.topic_config import parse_assignments

FORMAT_CHOICE = click.Choice(["table", "json"])


@click.group()
def topics() -> None:
    """Create, list, describe and delete topics."""


def parse_configs(ctx: click.Context, param: click.Parameter, texts: tuple[str, ...]) -> dict[str, str]:
    """`--config name=value` options as a dict (the broker checks names and values)."""
    try:
        return parse_assignments(texts)
    except ValueError as error:
        raise click.BadParameter(str(error), ctx, param) from None


CONFIG_HELP = (
    "A topic config by Kafka's name, e.g. retention.ms=86400000, retention.bytes, cleanup.policy,"
    " max.message.bytes, message.timestamp.type; repeatable."
)


@topics.command()
@click.argument("name")
@click.option("--partitions", "-p", type=int, default=1, show_default=True, help="Number of partitions.")
@click.option(
    "--config", "-c", "configs", multiple=True, callback=parse_configs, metavar="NAME=VALUE", help=CONFIG_HELP
)
@click.option("--if-not-exists", is_flag=True, help="Succeed without change when the topic exists.")
@click.pass_context
def create(
    ctx: click.Context, name: str, partitions: int, configs: dict[str, str], if_not_exists: bool
) -> None:
    """Create topic NAME (letters, digits, '.', '_', '-'; at most 249 bytes)."""
    client = open_client(ctx)
    try:
        info = client.create_topic(name, partitions, configs)
    except TopicExistsError:
        if not if_not_exists:
            raise
        print_text(f"topic {name} already exists")
        return
    print_text(f"created topic {info.name} with {counted(info.partitions, 'partition')} (id {info.topic_id})")


@topics.command(name="add-partitions")
@click.argument("name")
@click.option("--partitions", "-p", type=int, required=True, help="The new partition count (more than now).")
@click.option("--validate-only", is_flag=True, help="Only check the change; change nothing.")
@click.pass_context
def add_partitions(ctx: click.Context, name: str, partitions: int, validate_only: bool) -> None:
    """Grow topic NAME to PARTITIONS partitions (Kafka's CreatePartitions): the existing partitions
    and their records stay; keyed records of later writes may map to other partitions than before."""
    client = open_client(ctx)
    info = client.create_partitions(name, partitions, validate_only)
    verb = "would grow" if validate_only else "grew"
    print_text(f"{verb} topic {info.name} to {counted(info.partitions, 'partition')}")


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
    if description.configs:
        print_table(configs_table(description.configs))


@topics.command(name="alter-config")
@click.argument("name")
@click.option(
    "--set",
    "-s",
    "set_configs",
    multiple=True,
    callback=parse_configs,
    metavar="NAME=VALUE",
    help=CONFIG_HELP,
)
@click.option(
    "--delete",
    "-d",
    "remove",
    multiple=True,
    metavar="NAME",
    help="Remove an override (back to the default).",
)
@click.option("--validate-only", is_flag=True, help="Check the change and show the result; change nothing.")
@click.option("--format", "output_format", type=FORMAT_CHOICE, default="table", show_default=True)
@click.pass_context
def alter_config(
    ctx: click.Context,
    name: str,
    set_configs: dict[str, str],
    remove: tuple[str, ...],
    validate_only: bool,
    output_format: str,
) -> None:
    """Set or remove config overrides of topic NAME; shows every config in effect afterwards."""
    if not set_configs and not remove:
        raise click.UsageError("give at least one --set NAME=VALUE or --delete NAME")
    client = open_client(ctx)
    configs = client.alter_topic_config(name, set_configs, remove, validate_only)
    if output_format == "json":
        print_json([config_to_dict(config) for config in configs])
        return
    if validate_only:
        print_text(f"valid; topic {name} would have:")
    print_table(configs_table(configs))


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
