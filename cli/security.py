"""`kq users`, `kq tokens`, `kq acls` and `kq whoami`: managing who may do what (broker/auth.py).

A password is read from a prompt (or one line of stdin with --password-stdin) and turned into SCRAM
credentials here; only those reach the cluster. A new token is printed once, alone on stdout, so
`TOKEN=$(kq tokens create --user alice)` works; the cluster keeps only its hash.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

import click

from kq.cli.context import open_client
from kq.cli.errors import CommandError
from kq.cli.output import plain_table, print_json, print_table, time_text
from kq.client.security import OPERATIONS, SCRAM_HASHES, acl, describe_acl
from kq.proto import kq_pb2
from kq.proto.limits import TOKEN_TTL_S_MAX

_FORMAT = click.option(
    "--format", "output_format", type=click.Choice(["table", "json"]), default="table", show_default=True
)


@click.group()
def users() -> None:
    """Users: principals User:<name> that log in with a password (Kafka SASL) or hold tokens."""


@users.command("add")
@click.argument("name")
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of stdin.")
@click.option(
    "--mechanism",
    "mechanisms",
    type=click.Choice(list(SCRAM_HASHES)),
    multiple=True,
    help="SCRAM mechanisms to keep credentials for (default: both).",
)
@click.pass_context
def add_user(ctx: click.Context, name: str, password_stdin: bool, mechanisms: tuple[str, ...]) -> None:
    """Create user NAME, or set a new password for it."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True, err=True)
    if not password:
        raise CommandError("the password is empty")
    created = open_client(ctx).put_user(name, password, mechanisms or tuple(SCRAM_HASHES))
    click.echo(f"{'created' if created else 'updated'} user {name}")


@users.command("list")
@_FORMAT
@click.pass_context
def list_users(ctx: click.Context, output_format: str) -> None:
    """List users, their SCRAM mechanisms and how many tokens each holds."""
    rows = open_client(ctx).list_users()
    if output_format == "json":
        print_json([{"name": u.name, "mechanisms": list(u.mechanisms), "tokens": u.tokens} for u in rows])
        return
    table = plain_table("USER", "MECHANISMS", "TOKENS")
    for user in rows:
        table.add_row(user.name, ",".join(user.mechanisms), str(user.tokens))
    print_table(table)


@users.command("remove")
@click.argument("name")
@click.pass_context
def remove_user(ctx: click.Context, name: str) -> None:
    """Delete user NAME and its tokens (its ACLs stay)."""
    open_client(ctx).delete_user(name)
    click.echo(f"removed user {name}")


@click.group()
def tokens() -> None:
    """Bearer tokens (`kq --token`, KqClient(token=...)): a user's credentials for gRPC calls."""


@tokens.command("create")
@click.option("--user", default="", help="Whose token (default: your own user).")
@click.option(
    "--ttl",
    "ttl_s",
    type=click.IntRange(0, TOKEN_TTL_S_MAX),
    default=0,
    metavar="SECONDS",
    help="Expire after this long (0: never).",
)
@click.option("--description", default="", help="A note kept with the token.")
@click.pass_context
def create_token(ctx: click.Context, user: str, ttl_s: int, description: str) -> None:
    """Create a token and print it (once: the cluster keeps only its hash)."""
    created = open_client(ctx).create_token(user, ttl_s, description)
    expiry = f", expires {time_text(created.expires_ms)}" if created.expires_ms else ""
    click.echo(f"token {created.token_id}{expiry}", err=True)
    click.echo(created.token)


@tokens.command("list")
@click.option("--user", default="", help="Only this user's tokens.")
@_FORMAT
@click.pass_context
def list_tokens(ctx: click.Context, user: str, output_format: str) -> None:
    """List tokens (ids, owners, times; never secrets)."""
    rows = open_client(ctx).list_tokens(user)
    if output_format == "json":
        print_json(
            [
                {
                    "id": t.token_id,
                    "user": t.user,
                    "created_ms": t.created_ms,
                    "expires_ms": t.expires_ms,
                    "description": t.description,
                }
                for t in rows
            ]
        )
        return
    table = plain_table("ID", "USER", "CREATED", "EXPIRES", "DESCRIPTION")
    for token in rows:
        expires = time_text(token.expires_ms) if token.expires_ms else "never"
        table.add_row(token.token_id, token.user, time_text(token.created_ms), expires, token.description)
    print_table(table)


@tokens.command("revoke")
@click.argument("token_id")
@click.pass_context
def revoke_token(ctx: click.Context, token_id: str) -> None:
    """Revoke the token TOKEN_ID: every node refuses it from then on."""
    open_client(ctx).revoke_token(token_id)
    click.echo(f"revoked token {token_id}")


_ACL_OPTIONS = (
    click.option("--principal", required=True, help="User:<name>, or User:* for every user."),
    click.option(
        "--operation",
        "operations",
        type=click.Choice(list(OPERATIONS)),
        multiple=True,
        required=True,
        help="What is allowed (or denied); repeatable.",
    ),
    click.option("--topic", help="A topic name (or prefix with --prefixed; * for every topic)."),
    click.option("--group", help="A consumer group name (or prefix with --prefixed; * for every group)."),
    click.option(
        "--transactional-id", help="A Kafka transactional.id (or prefix with --prefixed; * for every id)."
    ),
    click.option("--cluster", "on_cluster", is_flag=True, help="The cluster itself (admin operations)."),
    click.option("--prefixed", is_flag=True, help="The name is a prefix: every name starting with it."),
    click.option("--deny", is_flag=True, help="Deny instead of allow (a deny wins over any allow)."),
)


def _with_acl_options(
    command: Callable[[click.Context, list[kq_pb2.Acl]], None],
) -> Callable[..., None]:
    """`command(ctx, rules)` as a click callback taking the options that name ACLs (`acls add` and
    `acls remove` share them), one ACL per --operation."""

    @functools.wraps(command)
    def with_rules(
        ctx: click.Context,
        principal: str,
        operations: tuple[str, ...],
        topic: str | None,
        group: str | None,
        transactional_id: str | None,
        on_cluster: bool,
        prefixed: bool,
        deny: bool,
    ) -> None:
        named = (("topic", topic), ("group", group), ("transactional-id", transactional_id))
        chosen = [(kind, name) for kind, name in named if name is not None]
        if on_cluster:
            chosen.append(("cluster", "kq-cluster"))
        if len(chosen) != 1:
            raise CommandError(
                "name one resource: --topic NAME, --group NAME, --transactional-id ID or --cluster"
            )
        kind, name = chosen[0]
        command(ctx, [acl(principal, op, kind, name, prefixed=prefixed, deny=deny) for op in operations])

    decorated: Callable[..., None] = click.pass_context(with_rules)
    for option in reversed(_ACL_OPTIONS):
        decorated = option(decorated)
    return decorated


@click.group()
def acls() -> None:
    """Access rules: which principal may do what on which topics, groups and the cluster.

    \b
    kq acls add --principal User:alice --operation write --topic orders
    kq acls add --principal User:alice --operation read --topic logs. --prefixed
    kq acls add --principal User:alice --operation read --group billing
    kq acls list
    """


@acls.command("add")
@_with_acl_options
def add_acls(ctx: click.Context, rules: list[kq_pb2.Acl]) -> None:
    """Add ACLs (one per --operation)."""
    open_client(ctx).add_acls(rules)
    for rule in rules:
        click.echo(f"added {describe_acl(rule)}")


@acls.command("remove")
@_with_acl_options
def remove_acls(ctx: click.Context, rules: list[kq_pb2.Acl]) -> None:
    """Remove the ACLs that match exactly (one per --operation)."""
    removed = open_client(ctx).remove_acls(rules)
    click.echo(f"removed {removed} of {len(rules)} ACLs")


@acls.command("list")
@click.option("--principal", default="", help="Only this principal's ACLs.")
@_FORMAT
@click.pass_context
def list_acls(ctx: click.Context, principal: str, output_format: str) -> None:
    """List ACLs."""
    rules = open_client(ctx).list_acls(principal)
    if output_format == "json":
        print_json([describe_acl(rule) for rule in rules])
        return
    for rule in rules:
        click.echo(describe_acl(rule))


@click.command()
@click.pass_context
def whoami(ctx: click.Context) -> None:
    """Print the principal the cluster sees for these credentials."""
    principal, super_user = open_client(ctx).whoami()
    click.echo(principal + (" (super-user)" if super_user else ""))
