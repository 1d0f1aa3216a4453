"""`kq transactions`: the Kafka transactions the cluster's coordinator keeps (list, describe).

Kafka clients run the transactions (README, "Kafka clients"); this shows each transactional id's
producer id and epoch, state (Kafka's names: Ongoing, PrepareCommit, CompleteAbort, ...), timeout and
the partitions and consumer groups of its open transaction, as `kafka-transactions.sh` does.
"""

from __future__ import annotations

import dataclasses

import click

from kq.cli.context import open_client
from kq.cli.errors import CommandError
from kq.cli.output import plain_table, print_json, print_table, print_text
from kq.client import TransactionDescription

FORMAT_CHOICE = click.Choice(["table", "json"])


@click.group()
def transactions() -> None:
    """List and describe Kafka transactions.

    \b
    kq transactions list
    kq transactions describe payments-1
    """


@transactions.command(name="list")
@click.option("--state", help="Only transactions in this state (Ongoing, CompleteCommit, ...).")
@click.option("--format", "output_format", type=FORMAT_CHOICE, default="table", show_default=True)
@click.pass_context
def list_(ctx: click.Context, state: str | None, output_format: str) -> None:
    """List transactional ids with their producer, epoch and state."""
    found = [t for t in open_client(ctx).list_transactions() if state is None or t.state == state]
    if output_format == "json":
        print_json([dataclasses.asdict(t) for t in found])
        return
    if not found:
        print_text("no transactions")
        return
    table = plain_table("transactional id", "producer id", "epoch", "state", "partitions")
    for t in found:
        table.add_row(
            t.transactional_id, str(t.producer_id), str(t.producer_epoch), t.state, str(len(t.partitions))
        )
    print_table(table)


@transactions.command()
@click.argument("transactional_id")
@click.option("--format", "output_format", type=FORMAT_CHOICE, default="table", show_default=True)
@click.pass_context
def describe(ctx: click.Context, transactional_id: str, output_format: str) -> None:
    """One transactional id: producer, state, timeout, partitions and groups of its transaction."""
    found = open_client(ctx).list_transactions(transactional_id)
    if not found:
        raise CommandError(f"unknown transactional id {transactional_id}")
    described: TransactionDescription = found[0]
    if output_format == "json":
        print_json(dataclasses.asdict(described))
        return
    print_text(f"transactional id {described.transactional_id}")
    print_text(f"producer id {described.producer_id}, epoch {described.producer_epoch}")
    print_text(f"state {described.state}, timeout {described.timeout_ms} ms")
    partitions = ", ".join(f"{topic}-{partition}" for topic, partition in described.partitions)
    print_text(f"partitions {partitions or '-'}")
    print_text(f"groups {', '.join(described.groups) or '-'}")
