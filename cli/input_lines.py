"""`LineReader`: lines from a byte stream, and whether the input has paused (nothing more to read now).

The producer sends a batch when the input pauses, so a slow writer (`tail -f`, a person typing)
sees each line delivered at once while a fast one still gets full batches. Knowing that needs the
reader to own its buffer: Python's buffered reader can hold lines the OS no longer reports as
readable, so this reader takes whatever is available (`read1`) and splits lines itself.
"""

from __future__ import annotations

import os
import select
import stat
from collections.abc import Callable, Iterator
from typing import BinaryIO

from kq.cli.errors import CommandError
from kq.proto.limits import CLI_LINE_BYTES_MAX

CHUNK_BYTES = 64 * 1024


class LineReader:
    """Splits a binary stream into lines (without `\\n` or `\\r\\n`), in bounded memory."""

    def __init__(self, stream: BinaryIO) -> None:
        self._read: Callable[[int], bytes] = getattr(stream, "read1", stream.read)
        self._fd = _file_descriptor(stream)
        self._buffer = bytearray()
        self._position = 0  # Start of the unread part of _buffer.
        self._eof = False
        status = os.fstat(self._fd) if self._fd is not None else None
        mode = status.st_mode if status is not None else 0
        self.size_bytes: int | None = status.st_size if status is not None and stat.S_ISREG(mode) else None
        self.interactive = self._fd is not None and os.isatty(self._fd)
        self._pollable = self._fd is not None and not stat.S_ISREG(mode)

    def lines(self) -> Iterator[tuple[bytes, int]]:
        """Yields (line, input bytes it used) until end of input; a final line needs no newline."""
        number = 0
        scan_from = self._position
        while True:
            newline = self._buffer.find(b"\n", scan_from)
            if newline >= 0:
                number += 1
                yield self._take(newline, newline + 1)
                scan_from = self._position
            elif self._eof:
                if self._position < len(self._buffer):
                    yield self._take(len(self._buffer), len(self._buffer))
                return
            elif len(self._buffer) - self._position > CLI_LINE_BYTES_MAX:
                raise CommandError(f"line {number + 1} is longer than {CLI_LINE_BYTES_MAX} bytes")
            else:
                unread_bytes = len(self._buffer) - self._position
                self._fill()
                scan_from = unread_bytes  # _fill moved the unread part to the front; skip what was scanned.

    def paused(self) -> bool:
        """Whether no complete line is buffered and the OS has nothing more to read right now."""
        if self._eof or not self._pollable or self._buffer.find(b"\n", self._position) >= 0:
            return False
        assert self._fd is not None
        try:
            readable, _, _ = select.select([self._fd], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def _take(self, end: int, next_position: int) -> tuple[bytes, int]:
        line = bytes(self._buffer[self._position : end])
        consumed_bytes = next_position - self._position
        self._position = next_position
        if line.endswith(b"\r"):
            line = line[:-1]
        return line, consumed_bytes

    def _fill(self) -> None:
        """Reads what is available; drops the consumed front of the buffer first."""
        del self._buffer[: self._position]
        self._position = 0
        chunk = self._read(CHUNK_BYTES)
        if chunk:
            self._buffer += chunk
        else:
            self._eof = True


def _file_descriptor(stream: BinaryIO) -> int | None:
    try:
        return stream.fileno()
    except (OSError, ValueError, AttributeError):
        return None
