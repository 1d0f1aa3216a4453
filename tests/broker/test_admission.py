"""Reader admission alone (no sockets, no threads): the limits, the per-peer bound, release on every exit."""

from __future__ import annotations

from collections.abc import Generator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kq.broker.admission import ReaderAdmission, ReaderLimits
from kq.broker.errors import TooManyReadersError
from kq.proto.errors import ErrorCode
from kq.proto.limits import READERS_MAX, READERS_PER_CONNECTION_MAX


def test_the_default_limits_admit_a_thousand_streams_a_node_and_bound_one_connection() -> None:
    """The node admits READERS_MAX waiting calls (at least a thousand streams: issue 18), one
    connection a share of them, so one client can never take every slot."""
    limits = ReaderLimits()
    assert (limits.readers_max, limits.peer_readers_max) == (READERS_MAX, READERS_PER_CONNECTION_MAX)
    assert 1_000 <= READERS_PER_CONNECTION_MAX < READERS_MAX


def test_the_node_limit_refuses_one_more_reader_and_a_release_admits_it() -> None:
    """At readers_max (from distinct peers) the next is refused with TOO_MANY_READERS naming the limit."""
    admission = ReaderAdmission(ReaderLimits(readers_max=32, peer_readers_max=8))
    for peer in range(32):
        admission.acquire(f"ipv4:10.0.0.{peer}:5000")
    with pytest.raises(TooManyReadersError) as caught:
        admission.acquire("ipv4:10.0.1.1:5000")
    assert caught.value.code == ErrorCode.TOO_MANY_READERS and caught.value.retriable
    assert "maximum of 32 waiting readers" in str(caught.value) and "\n" not in str(caught.value)
    assert admission.readers() == 32
    admission.release("ipv4:10.0.0.3:5000")
    admission.acquire("ipv4:10.0.1.1:5000")
    assert admission.readers() == 32


def test_one_peer_is_refused_at_its_share_while_others_are_admitted() -> None:
    """A single connection gets peer_readers_max slots; the rest stay for other clients."""
    admission = ReaderAdmission(ReaderLimits(readers_max=32, peer_readers_max=8))
    for _ in range(8):
        admission.acquire("greedy")
    with pytest.raises(TooManyReadersError, match="this client connection holds its maximum of 8"):
        admission.acquire("greedy")
    admission.acquire("modest")
    assert (admission.readers(), admission.peers()) == (9, 2)


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 12)), max_size=300))
def test_counts_follow_a_model_and_the_peer_map_holds_only_peers_with_a_slot(
    operations: list[tuple[bool, int]],
) -> None:
    """Any sequence of acquires and releases: counts match a model; the map never outgrows readers_max."""
    admission = ReaderAdmission(ReaderLimits(readers_max=10, peer_readers_max=3))
    held: dict[str, int] = {}
    for acquire, number in operations:
        peer = f"peer-{number}"
        if acquire:
            admitted = sum(held.values()) < 10 and held.get(peer, 0) < 3
            try:
                admission.acquire(peer)
                assert admitted
                held[peer] = held.get(peer, 0) + 1
            except TooManyReadersError:
                assert not admitted
        elif held.get(peer, 0):
            admission.release(peer)
            held[peer] -= 1
            if not held[peer]:
                del held[peer]
        assert admission.readers() == sum(held.values())
        assert admission.peers() == len(held) <= 10
    for peer, count in list(held.items()):
        for _ in range(count):
            admission.release(peer)
    assert (admission.readers(), admission.peers()) == (0, 0)


def test_a_slot_is_released_on_an_exception_and_when_a_generator_is_closed() -> None:
    """`admitted` frees its slot when the block raises and when a suspended stream is closed (a cancel)."""
    admission = ReaderAdmission(ReaderLimits(readers_max=1, peer_readers_max=1))
    with pytest.raises(ValueError), admission.admitted("p"):
        raise ValueError("a handler failed")
    assert (admission.readers(), admission.peers()) == (0, 0)

    def stream() -> Generator[int, None, None]:
        with admission.admitted("p"):
            yield 1
            yield 2

    reader = stream()
    assert next(reader) == 1 and admission.readers() == 1
    with pytest.raises(TooManyReadersError):  # The one slot is taken while the stream is suspended.
        next(stream())
    reader.close()  # What gRPC does to a cancelled stream's generator.
    assert (admission.readers(), admission.peers()) == (0, 0)
    with admission.admitted("p"):
        assert admission.readers() == 1
    assert admission.readers() == 0


def test_releasing_a_slot_never_taken_is_a_bug() -> None:
    """A release without its acquire would corrupt the counts: it fails loudly instead."""
    admission = ReaderAdmission(ReaderLimits(readers_max=1, peer_readers_max=1))
    with pytest.raises(AssertionError):
        admission.release("p")
