"""The `kq` click group, its global options, and the one place where failures become one line.

Every failure a person can cause (a server rejection, a bad argument) prints exactly one line,
`kq: error: <reason>`, to stderr: exit code 1 for errors from the cluster, 2 for usage errors (as
click does). `KqGroup` converts them at the top of the command tree, so commands just raise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from kq.cli.certs import certs
from kq.cli.cluster import cluster
from kq.cli.console import console
from kq.cli.consume import consume
from kq.cli.context import DEFAULT_BOOTSTRAP, RETRY_TIMEOUT_S_DEFAULT, Settings, parse_bootstrap
from kq.cli.errors import PROGRAM_NAME, CommandError, UsageLineError
from kq.cli.groups import groups
from kq.cli.produce import produce
from kq.cli.security import acls, tokens, users, whoami
from kq.cli.topics import topics
from kq.cli.transactions import transactions
from kq.client import KqClientError, TlsConfig, TlsConfigError


class KqGroup(click.Group):
    """A click group whose failures print one `kq: error:` line instead of click's block or a traceback."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        """Parses the global options; a bad one becomes a one-line usage error."""
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as error:
            raise _one_line(error) from error

    def invoke(self, ctx: click.Context) -> Any:
        """Runs the subcommand; client errors and usage errors from below become one line."""
        try:
            return super().invoke(ctx)
        except KqClientError as error:
            raise CommandError(str(error)) from error
        except click.UsageError as error:
            raise _one_line(error) from error


def _one_line(error: click.UsageError) -> click.UsageError | UsageLineError:
    """The one-line form of a usage error; `kq` alone (help requested by no arguments) stays as help."""
    if isinstance(error, click.exceptions.NoArgsIsHelpError):
        return error
    return UsageLineError(error.format_message())


@click.group(cls=KqGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--bootstrap",
    envvar="KQ_BOOTSTRAP",
    default=DEFAULT_BOOTSTRAP,
    show_default=True,
    callback=parse_bootstrap,
    help="Comma-separated host:port list of nodes (any subset works; env KQ_BOOTSTRAP).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.1),
    default=RETRY_TIMEOUT_S_DEFAULT,
    show_default=True,
    metavar="SECONDS",
    help="Keep retrying an unreachable cluster or a leader election this long before failing.",
)
@click.option(
    "--tls-ca",
    envvar="KQ_TLS_CA",
    type=click.Path(dir_okay=False),
    help="Talk TLS to the nodes, verifying them with this PEM CA (env KQ_TLS_CA).",
)
@click.option(
    "--tls-cert",
    envvar="KQ_TLS_CERT",
    type=click.Path(dir_okay=False),
    help="PEM client certificate (mutual TLS; env KQ_TLS_CERT).",
)
@click.option(
    "--tls-key",
    envvar="KQ_TLS_KEY",
    type=click.Path(dir_okay=False),
    help="PEM key of --tls-cert (env KQ_TLS_KEY).",
)
@click.option(
    "--token",
    envvar="KQ_TOKEN",
    help="Bearer token (`kq tokens create`) for nodes started with --auth (env KQ_TOKEN).",
)
@click.option(
    "--secret-file",
    envvar="KQ_SECRET_FILE",
    type=click.Path(dir_okay=False),
    help="File holding the cluster secret (the nodes' --secret): act as a super-user, e.g. to add the "
    "first users and ACLs (env KQ_SECRET_FILE).",
)
@click.version_option(package_name="kq", prog_name=PROGRAM_NAME)
@click.pass_context
def kq(
    ctx: click.Context,
    bootstrap: tuple[str, ...],
    timeout_s: float,
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    token: str | None,
    secret_file: str | None,
) -> None:
    """kq: a Kafka-like, Raft-replicated log broker.

    \b
    kq topics create events --partitions 3
    echo hello | kq produce events
    kq consume events --from-beginning
    kq consume events --group billing --follow
    kq groups describe billing
    kq cluster status
    """
    tls = None
    if tls_ca is not None:
        try:
            tls = TlsConfig.from_files(tls_ca, tls_cert, tls_key)
        except TlsConfigError as error:
            raise UsageLineError(str(error)) from error
    elif tls_cert is not None or tls_key is not None:
        raise UsageLineError("--tls-cert and --tls-key need --tls-ca (the CA of the nodes)")
    secret = None
    if secret_file is not None:
        try:
            secret = Path(secret_file).read_text().strip()
        except OSError as error:
            raise UsageLineError(f"--secret-file: {error.strerror}: {secret_file}") from error
        if not secret:
            raise UsageLineError(f"--secret-file: {secret_file} is empty")
    ctx.obj = Settings(bootstrap=bootstrap, retry_timeout_s=timeout_s, tls=tls, token=token, secret=secret)


kq.add_command(topics)
kq.add_command(produce)
kq.add_command(consume)
kq.add_command(groups)
kq.add_command(cluster)
kq.add_command(console)
kq.add_command(certs)
kq.add_command(users)
kq.add_command(tokens)
kq.add_command(acls)
kq.add_command(whoami)
kq.add_command(transactions)


def main() -> None:
    """The `kq` console script."""
    kq(prog_name=PROGRAM_NAME)
