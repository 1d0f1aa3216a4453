"""CPU per Raft message: PySyncObj's old transport encoding against kq's (raft/wire.py), in one process.

    python -m kq.bench.raft_wire [--repeats 5]

For an append carrying one entry of kq's (a Command of 200 B, 10 KB or 1 MiB of random bytes, as
`entry_command` builds it) and for a heartbeat, it times, in CPU seconds of this thread
(`time.thread_time`), what the sender and the receiver spend on one message: PySyncObj's TcpConnection
(protocol-2 pickle, zlib level 3, Fernet with a password; then the reverse) against kq's transport
(`encode_message`, `decode_message`: protobuf, the sender's canonical check, the receiver's rebuild).
Socket and TLS costs are not included (TLS is AES-GCM in OpenSSL, well under Fernet's AES-CBC + HMAC in
Python objects). Each figure is the median of `--repeats` batches.
"""

from __future__ import annotations

import os
import statistics
import time
import zlib
from collections.abc import Callable
from typing import Any

import click
import pysyncobj.pickle
from pysyncobj.encryptor import getEncryptor
from pysyncobj.node import TCPNode

from kq.raft.pysyncobj_adapter import entry_command
from kq.raft.wire import decode_message, encode_message

SIZES = {"heartbeat": 0, "200 B": 200, "10 KB": 10_000, "1 MiB": 1024 * 1024}
BATCH_CPU_S = 0.2  # Each batch runs for about this much CPU time.


def per_call_us(function: Callable[[], Any], repeats: int) -> float:
    """Median over `repeats` batches of the CPU microseconds one call takes."""
    started = time.thread_time()
    function()
    count = max(1, int(BATCH_CPU_S / max(time.thread_time() - started, 1e-6)))
    results = []
    for _ in range(repeats):
        started = time.thread_time()
        for _ in range(count):
            function()
        results.append((time.thread_time() - started) / count * 1e6)
    return statistics.median(results)


def message(size: int) -> dict[str, Any]:
    entries = [] if size == 0 else [(entry_command(0, os.urandom(size)), 12, 3)]
    return {
        "type": "append_entries",
        "term": 3,
        "commit_index": 11,
        "entries": entries,
        "prevLogIdx": 11,
        "prevLogTerm": 3,
    }


def measure(sample: dict[str, Any], encryptor: Any, repeats: int) -> tuple[float, float, float, float]:
    """(old send, old receive, new send, new receive) CPU µs for one message."""

    def old_send() -> bytes:
        return bytes(encryptor.encrypt_at_time(zlib.compress(pysyncobj.pickle.dumps(sample), 3), 1))

    old_wire = old_send()
    new_wire = encode_message(sample)
    return (
        per_call_us(old_send, repeats),
        per_call_us(lambda: pysyncobj.pickle.loads(zlib.decompress(encryptor.decrypt(old_wire))), repeats),
        per_call_us(lambda: encode_message(sample), repeats),
        per_call_us(lambda: decode_message(new_wire, TCPNode), repeats),
    )


@click.command()
@click.option("--repeats", type=click.IntRange(1, 100), default=5, show_default=True)
def main(repeats: int) -> None:
    """Prints sender and receiver CPU µs per message, old and new."""
    encryptor = getEncryptor("benchmark password")
    columns = ("old send", "old receive", "new send", "new receive")
    print(
        f"{'message':10}"
        + "".join(f"{column:>13}" for column in columns)
        + f"  (CPU µs, median of {repeats})"
    )
    for name, size in SIZES.items():
        figures = measure(message(size), encryptor, repeats)
        print(f"{name:10}" + "".join(f"{figure:>13,.1f}" for figure in figures))


if __name__ == "__main__":
    main()
