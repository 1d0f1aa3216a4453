"""The node's log format: one JSON object per line off a terminal, a human line on one.

`--log-format auto` (the default) writes JSON when stderr is not a terminal (a file, a pipe, journald:
what a log shipper reads) and text when it is. JSON lines hold `ts` (UTC, ISO 8601 with milliseconds),
`level`, `node`, `logger`, `message`, `thread`, any `extra=` fields of the call, and `exc` (the
formatted traceback) when the record carries one: one event, one line, whatever the message holds.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from datetime import UTC, datetime
from typing import Any, Literal

LogFormat = Literal["auto", "json", "text"]
LOG_FORMATS: tuple[LogFormat, ...] = ("auto", "json", "text")

# The attributes every LogRecord has: anything else on a record came from `extra=` and is a field.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line."""

    def __init__(self, node_id: str) -> None:
        super().__init__()
        self._node_id = node_id

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "node": self._node_id,
            "logger": record.name,
            "message": record.getMessage(),
            "thread": record.threadName,
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def text_formatter(node_id: str) -> logging.Formatter:
    """The human format: time, level, node, logger, message (a traceback on the lines after it)."""
    return logging.Formatter(f"%(asctime)s %(levelname)s node={node_id} %(name)s: %(message)s")


def configure_logging(node_id: str, level: str, log_format: LogFormat, stream: Any = None) -> None:
    """Sends every log record of the process to `stream` (stderr) in the chosen format."""
    stream = sys.stderr if stream is None else stream
    if log_format == "auto":
        log_format = "text" if stream.isatty() else "json"
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter(node_id) if log_format == "json" else text_formatter(node_id))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # What Python would print to stderr by itself goes through the handler too, one record each.
    logging.captureWarnings(True)
    threading.excepthook = _log_thread_exception


def _log_thread_exception(arguments: threading.ExceptHookArgs) -> None:
    thread = arguments.thread.name if arguments.thread is not None else "?"
    exc_info = (arguments.exc_type, arguments.exc_value, arguments.exc_traceback)
    logging.getLogger("kq.node").error("uncaught exception in thread %s", thread, exc_info=exc_info)  # type: ignore[arg-type]
