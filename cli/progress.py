"""`ProgressBar`: produce's progress on stderr (records sent, input bytes read), or nothing when disabled.

Kept on stderr so stdout carries only the command's result; `kq produce` turns it on when stderr is
a terminal and the input is piped or a file (or with --progress).
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn


class ProgressBar:
    """A rich progress bar on stderr (records sent, input bytes read), or nothing when disabled."""

    def __init__(self, enabled: bool, total_bytes: int | None) -> None:
        self._progress: Progress | None = None
        if enabled:
            self._progress = Progress(
                TextColumn("sending"),
                BarColumn(),
                DownloadColumn(),
                TextColumn("{task.fields[records]} records"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )
            self._task = self._progress.add_task("produce", total=total_bytes, records=0)

    def __enter__(self) -> ProgressBar:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def advance(self, records_total: int, consumed_bytes: int) -> None:
        """Shows `records_total` records sent and `consumed_bytes` more input read."""
        if self._progress is not None:
            self._progress.update(self._task, advance=consumed_bytes, records=records_total)
