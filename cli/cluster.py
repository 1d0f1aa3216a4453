"""`kq cluster status`: every bootstrap node's own view (role, term, indexes, leader, peers).

Each node is asked directly, so the table shows disagreements (two leaders in different terms, a
lagging follower) instead of hiding them; a node that does not answer is a `down` row.
"""

from __future__ import annotations

import click

from kq.cli.context import open_client
from kq.cli.errors import CommandError
from kq.cli.output import print_json, print_table, status_table, status_to_dict
from kq.client import KqClientError


@click.group()
def cluster() -> None:
    """Inspect the cluster."""


@cluster.command()
@click.option(
    "--format", "output_format", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@click.pass_context
def status(ctx: click.Context, output_format: str) -> None:
    """Show each bootstrap node's role, term, commit and applied index, leader and connected peers.

    Exits 1 when no node answers.
    """
    client = open_client(ctx)
    statuses = client.cluster_status()
    addresses = client.bootstrap
    if output_format == "json":
        print_json([status_to_dict(a, s) for a, s in zip(addresses, statuses, strict=True)])
    else:
        print_table(status_table(addresses, statuses))
    if all(isinstance(s, KqClientError) for s in statuses):
        raise CommandError(f"no node answered (last: {statuses[-1]})")
