"""The CLI's own errors: each prints one `kq: error: <reason>` line to stderr and sets the exit code.

Commands raise these (or let a `client` error rise: `cli.main.KqGroup` converts it); nothing else
prints errors.
"""

from __future__ import annotations

from typing import IO, Any

import click

PROGRAM_NAME = "kq"
SERVER_ERROR_EXIT_CODE = 1
USAGE_ERROR_EXIT_CODE = 2


def _error_line(message: str) -> str:
    """The message on one line: a server's or click's text may hold newlines; the contract is one line."""
    return " ".join(message.split())


class CommandError(click.ClickException):
    """A failure reported by the cluster (or found in the input): one line, exit code 1."""

    exit_code = SERVER_ERROR_EXIT_CODE

    def show(self, file: IO[Any] | None = None) -> None:
        """Prints `kq: error: <reason>` to stderr."""
        click.echo(f"{PROGRAM_NAME}: error: {_error_line(self.format_message())}", file=file, err=True)


class UsageLineError(CommandError):
    """A bad command line: one line (no usage block), exit code 2 as click uses for usage errors."""

    exit_code = USAGE_ERROR_EXIT_CODE
