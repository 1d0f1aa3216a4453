"""The group coordinator's memory stays as large as the groups: invented member ids are forgotten."""

from __future__ import annotations

import time
from pathlib import Path

from kq.broker.groups import UNKNOWN_MEMBER_GRACE_S, GroupCoordinator
from kq.broker.proposals import wall_clock_ms
from kq.storage import Store
from tests.broker.fake_consensus import FakeConsensus


def test_member_ids_no_group_holds_are_forgotten_after_the_grace(tmp_path: Path) -> None:
    """10,000 heartbeats naming made-up members leave nothing behind once the grace has passed."""
    store = Store.open(tmp_path / "store", map_size_bytes=64 * 1024**2)
    coordinator = GroupCoordinator(store, FakeConsensus(store, lambda index: None), wall_clock_ms)
    try:
        for number in range(10_000):
            coordinator.heard_from("g", f"invented-{number}")
        coordinator._forget_absent({("g", "invented-1")}, time.monotonic())
        assert len(coordinator._last_seen) == 10_000  # Within the grace: a join may be in flight.
        coordinator._forget_absent({("g", "invented-1")}, time.monotonic() + UNKNOWN_MEMBER_GRACE_S + 1)
        assert list(coordinator._last_seen) == [("g", "invented-1")]
    finally:
        coordinator.stop()
        store.close()
