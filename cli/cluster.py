"""`kq cluster status`: every node's own view (role, term, indexes, leader, peers); `kq cluster
add-node` / `remove-node`: membership changes (broker/membership.py).

Each node is asked directly, so the table shows disagreements (two leaders in different terms, a
lagging follower) instead of hiding them; a node that does not answer is a `down` row. The nodes
asked are the bootstrap nodes and every member they name, so a node added later shows too.
"""

from __future__ import annotations

import click

from kq.broker.config import ConfigError, parse_peer
from kq.cli.context import open_client
from kq.cli.errors import CommandError
from kq.cli.output import (
    group_leaders_table,
    members_table,
    print_json,
    print_table,
    status_table,
    status_to_dict,
)
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
    """Show each node's role, term, commit and applied index, leader and connected peers (and, with
    worker processes, each Raft group's leader).

    Exits 1 when no node answers.
    """
    client = open_client(ctx)
    answers = client.cluster_status_by_address()
    addresses = [address for address, _ in answers]
    statuses = [status for _, status in answers]
    if output_format == "json":
        print_json([status_to_dict(a, s) for a, s in zip(addresses, statuses, strict=True)])
    else:
        print_table(status_table(addresses, statuses))
        groups = group_leaders_table(statuses)
        if groups is not None:  # Nodes with worker processes: a Raft group each.
            print_table(groups)
    if all(isinstance(s, KqClientError) for s in statuses):
        raise CommandError(f"no node answered (last: {statuses[-1]})")


@cluster.command("add-node")
@click.argument("spec")
@click.pass_context
def add_node(ctx: click.Context, spec: str) -> None:
    """Add a running node to the cluster's voters. SPEC is id=raft_host:port=grpc_host:port
    [=kafka_host:port][@rack], as in --peers.

    Start the node first with --join and --peers naming the current members and itself; it catches up
    from the leader (entries, or a copy of the store). One change at a time.
    """
    try:
        peer = parse_peer(spec)
    except ConfigError as error:
        raise CommandError(str(error)) from error
    members = open_client(ctx).add_node(
        peer.node_id, peer.raft_address, peer.grpc_address, peer.kafka_address, peer.rack
    )
    click.echo(f"added node {peer.node_id}; the cluster's members:")
    print_table(members_table(members))


@cluster.command("remove-node")
@click.argument("node_id")
@click.pass_context
def remove_node(ctx: click.Context, node_id: str) -> None:
    """Remove node NODE_ID (running or down) from the cluster's voters, then stop it.

    Removing the leader first hands its leadership to another node. Refused when the remaining
    voters would have no majority running.
    """
    members = open_client(ctx).remove_node(node_id)
    click.echo(f"removed node {node_id}; stop its process now. The cluster's members:")
    print_table(members_table(members))
