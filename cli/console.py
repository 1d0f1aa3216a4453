"""`kq console`: serve the web console (console/) for the cluster at --bootstrap until Ctrl-C."""

from __future__ import annotations

import click
import uvicorn

from kq.cli.context import Settings
from kq.client import KqClient
from kq.console.app import Console, build_app
from kq.console.sampler import LagSampler
from kq.proto.limits import CONSOLE_TIMEOUT_S


@click.command("console")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the console binds.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535), help="Its port.")
@click.option(
    "--allow-writes",
    is_flag=True,
    help="Offer the produce form (without it the console is read-only: a POST is refused with 403).",
)
@click.pass_obj
def console(settings: Settings, host: str, port: int, allow_writes: bool) -> None:
    """Serve a web console: cluster, topics, records, groups and their lag, in a browser.

    It talks to the cluster only through the client library, like every other kq command, with the
    global options' credentials (--tls-*, --token): it sees and does what that principal may.
    """
    client = KqClient(
        settings.bootstrap,
        retry_timeout_s=min(settings.retry_timeout_s, CONSOLE_TIMEOUT_S),
        rpc_timeout_s=CONSOLE_TIMEOUT_S,
        tls=settings.tls,
        token=settings.token,
        secret=settings.secret,
    )
    sampler = LagSampler(client)
    sampler.start()
    mode = "writes allowed" if allow_writes else "read-only"
    click.echo(f"kq console on http://{host}:{port}/ ({mode}); Ctrl-C stops it", err=True)
    try:
        uvicorn.run(
            build_app(Console(client, sampler, allow_writes)), host=host, port=port, log_level="warning"
        )
    finally:
        sampler.stop()
        client.close()
