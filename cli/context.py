"""What every command shares: the global settings, the client opened from them, address parsing.

Commands get their client from `open_client(ctx)`, which ties its lifetime to the click context so
its channels close when the command ends, however it ends.

Metadata reads that must see what another `kq` process just did (`topics create` then `produce`)
go to the leader (`metadata_node`): a follower applies a commit up to a heartbeat later, and a new
process has no Raft index to wait for. Measured on a local cluster: 7 of 100 describes sent to a
follower right after a create did not find the topic yet.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import click

from kq.client import KqClient, TlsConfig
from kq.proto.limits import CLI_BOOTSTRAP_NODES_MAX, CLI_RPC_TIMEOUT_S_MAX

DEFAULT_BOOTSTRAP = "127.0.0.1:9101,127.0.0.1:9102,127.0.0.1:9103"  # The nodes of deploy/run-cluster.sh.
RETRY_TIMEOUT_S_DEFAULT = 10.0  # Longer than a leader failover (0.5-2 s), short enough for a person to wait.
PORT_MAX = 65_535


@dataclass(frozen=True, slots=True)
class Settings:
    """The global options, resolved: where the cluster is and how long to keep retrying."""

    bootstrap: tuple[str, ...]
    retry_timeout_s: float
    tls: TlsConfig | None = None  # --tls-ca (and --tls-cert, --tls-key): None, plain text.
    token: str | None = None  # --token: a bearer token sent with every call.
    secret: str | None = None  # --secret-file's content: the cluster secret (a super-user's proof).


def address_problem(address: str) -> str | None:
    """Why `address` is not a host:port, or None when it is one."""
    host, separator, port = address.rpartition(":")
    if not separator or not host:
        return f"{address!r} is not host:port"
    if not port.isdigit() or not 0 < int(port) <= PORT_MAX:
        return f"{address!r} has no valid port (1-{PORT_MAX})"
    return None


def parse_bootstrap(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, ...]:
    """The --bootstrap list as addresses; a click callback so a bad list is a usage error (exit 2)."""
    addresses = tuple(part.strip() for part in value.split(",") if part.strip())
    if not addresses:
        raise click.BadParameter("needs at least one host:port")
    if len(addresses) > CLI_BOOTSTRAP_NODES_MAX:
        raise click.BadParameter(f"at most {CLI_BOOTSTRAP_NODES_MAX} addresses")
    for address in addresses:
        problem = address_problem(address)
        if problem is not None:
            raise click.BadParameter(problem)
    return addresses


def parse_node(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """A --node host:port, checked; a click callback."""
    if value is None:
        return None
    problem = address_problem(value)
    if problem is not None:
        raise click.BadParameter(problem)
    return value


def open_client(ctx: click.Context) -> KqClient:
    """A client for the configured cluster, closed when the command's context ends."""
    settings = ctx.find_object(Settings)
    assert settings is not None, "the kq group stores Settings before any command runs"
    client = KqClient(
        settings.bootstrap,
        retry_timeout_s=settings.retry_timeout_s,
        rpc_timeout_s=min(CLI_RPC_TIMEOUT_S_MAX, settings.retry_timeout_s),
        tls=settings.tls,
        token=settings.token,
        secret=settings.secret,
    )
    return ctx.with_resource(client)


def metadata_node(client: KqClient, node: str | None) -> str | None:
    """The node to read metadata from: the one asked for, else the current leader, else None (any node)."""
    # With no leader right now (None), any node's view is the best there is.
    return node if node is not None else client.leader_address()


def stdin_is_interactive() -> bool:
    """Whether a person can answer a prompt: stdin is a terminal."""
    return sys.stdin.isatty()
