"""`kq certs init DIR`: a cluster CA, node and client certificates (deploy/certs.py)."""

from __future__ import annotations

from pathlib import Path

import click

from kq.cli.errors import CommandError
from kq.deploy.certs import CertificateError, init

DEFAULT_HOSTS = ("127.0.0.1", "localhost")


@click.group()
def certs() -> None:
    """Make TLS certificates for a cluster."""


@certs.command("init")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--node",
    "node_specs",
    multiple=True,
    metavar="ID[=HOST,HOST...]",
    help="A node certificate, with the hosts it is reached at (default hosts: 127.0.0.1, localhost). "
    "Repeat per node; default: nodes 1, 2 and 3.",
)
@click.option(
    "--client", "clients", multiple=True, metavar="NAME", help="A client certificate (default: admin)."
)
@click.option("--days", default=365, show_default=True, type=int, help="How long the certificates are valid.")
def init_command(directory: Path, node_specs: tuple[str, ...], clients: tuple[str, ...], days: int) -> None:
    """Create a CA and node and client certificates in DIRECTORY (keys readable by their owner only)."""
    nodes: dict[str, tuple[str, ...]] = {}
    for spec in node_specs or ("1", "2", "3"):
        node_id, _, hosts = spec.partition("=")
        nodes[node_id] = tuple(h.strip() for h in hosts.split(",") if h.strip()) or DEFAULT_HOSTS
    try:
        issued = init(directory, nodes, clients or ("admin",), days)
    except CertificateError as error:
        raise CommandError(str(error)) from error
    click.echo(f"CA: {issued.ca}")
    for node_id, path in issued.nodes.items():
        click.echo(f"node {node_id}: {path} (key {path.with_name(path.stem + '-key.pem')})")
    for client, path in issued.clients.items():
        click.echo(f"client {client}: {path} (key {path.with_name(path.stem + '-key.pem')})")
