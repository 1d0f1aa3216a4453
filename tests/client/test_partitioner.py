"""Kafka's default partitioner: murmur2 matches Java's values and partitions match Kafka's choices."""

from __future__ import annotations

import pytest

from kq.client.partitioner import murmur2, partition_for_key


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        # From Kafka's UtilsTest.testMurmur2.
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_kafka(key: bytes, expected: int) -> None:
    """The hash equals Kafka's Utils.murmur2 for Kafka's own test vectors."""
    assert murmur2(key) == expected


@pytest.mark.parametrize(
    ("key", "partition"),
    [(b"", 681), (b"a", 524), (b"ab", 434), (b"abc", 107), (b"123456789", 566), (b"\x00 ", 742)],
)
def test_partition_matches_kafka_default_partitioner(key: bytes, partition: int) -> None:
    """With 1000 partitions the choice equals the Java client's (vectors used by kafka-python)."""
    assert partition_for_key(key, 1000) == partition
