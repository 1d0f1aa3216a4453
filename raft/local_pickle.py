"""Reading back the few pickles this node wrote itself: its log entries' commands and its snapshot header.

PySyncObj keeps a log entry's command as a pickle (kq's REGULAR entries: the call, `entry_command` in
raft/pysyncobj_adapter.py; MEMBERSHIP entries: `['add' | 'rem', address, TCPNode]`), and kq's
snapshot header is a pickle of PySyncObj's tuple (raft/snapshot.py). None of these bytes comes from
the network any more: a peer's entries and headers arrive as protobuf fields and this node rebuilds
the pickles itself (raft/wire.py). Still, the node reads them back (to send them, and at start), and
an unpickler that can resolve any global is one bug away from running code, so this one resolves
only the two globals those pickles hold and refuses everything else.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

# module, name: the only globals kq's own pickles hold.
ALLOWED_GLOBALS = frozenset(
    {
        ("pysyncobj.node", "TCPNode"),  # A MEMBERSHIP entry's node; the snapshot header's cluster.
        ("kq.raft.pysyncobj_adapter", "wire_bytes"),  # An entry's command as WireBytes (header entries).
    }
)


class LocalPickleError(ValueError):
    """The bytes are not one of kq's own pickles (a global outside ALLOWED_GLOBALS, or not a pickle)."""


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED_GLOBALS:
            raise LocalPickleError(f"refused global {module}.{name}")
        return super().find_class(module, name)


def loads(data: bytes) -> Any:
    """The object pickled in `data`, resolving only ALLOWED_GLOBALS; LocalPickleError otherwise."""
    try:
        return _Unpickler(io.BytesIO(data)).load()
    except LocalPickleError:
        raise
    except Exception as error:  # Any malformed pickle: pickle raises many types (EOFError, KeyError, ...).
        raise LocalPickleError(f"not a pickle: {error!r}") from error
