"""`Calls`: the two calls the API mixins of KqClient make on the client's connections.

A Protocol in a leaf module: client/connection.py `Connections` is one, and the mixins
(client/security.py, client/transactions.py, client/groups_api.py) type their `_connections` with
it instead of naming `Connections`, whose module imports security's interceptor (imports point
one way: DESIGN.md).
"""

from __future__ import annotations

from typing import Any, Protocol


class Calls(Protocol):
    """A write, sent to the Raft group's leader, and a read, served by any node of the group."""

    def write(self, method: str, request: Any, timeout_s: float | None = None, group: int = 0) -> Any:
        """`method`'s answer to `request` from the group's leader (client/connection.py)."""
        ...

    def read(
        self,
        method: str,
        request: Any,
        node: str | None = None,
        timeout_s: float | None = None,
        retry_timeout_s: float | None = None,
        group: int | None = None,
    ) -> Any:
        """`method`'s answer to `request` from a node holding the group (client/connection.py)."""
        ...
