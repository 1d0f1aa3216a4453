"""The one wait-for helper: poll a condition until it holds or a deadline passes, then fail clearly.

Tests, chaos, bench and the cluster harness never synchronise with a bare `sleep`: they wait on a
condition with a deadline, and a wait that runs out says what it waited for, for how long, and (when
the caller can tell) the last state it saw.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

POLL_S = 0.05


class WaitTimeoutError(TimeoutError):
    """A condition did not hold before its deadline; the message names it and the last state seen."""


def wait_for(
    condition: Callable[[], T | None],
    what: str,
    timeout_s: float,
    *,
    poll_s: float = POLL_S,
    last_state: Callable[[], str] | None = None,
) -> T:
    """Calls `condition` every `poll_s` until it returns a truthy value, and returns that value.

    Raises `WaitTimeoutError("timed out after N s waiting for <what>[; last: <last_state()>]")` when
    `timeout_s` passes first. The condition is always called at least once, so a zero timeout is a
    single check. Exceptions from the condition propagate: a node that died is not a timeout.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            detail = f"; last: {last_state()}" if last_state is not None else ""
            raise WaitTimeoutError(f"timed out after {timeout_s:.1f} s waiting for {what}{detail}")
        time.sleep(min(poll_s, remaining_s))


def holds_within(condition: Callable[[], object], timeout_s: float, *, poll_s: float = POLL_S) -> bool:
    """Whether `condition` held within `timeout_s` (for measurements that report a miss, not fail)."""
    try:
        wait_for(condition, "a condition", timeout_s, poll_s=poll_s)
    except WaitTimeoutError:
        return False
    return True
