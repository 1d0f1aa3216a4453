"""Kafka's default partitioner for keyed records: murmur2 of the key, made positive, modulo the count."""

from __future__ import annotations

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2` as a signed 32-bit int (same value as Java for the same bytes)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    remainder = length % 4
    if remainder == 3:
        h ^= data[whole + 2] << 16
    if remainder >= 2:
        h ^= data[whole + 1] << 8
    if remainder >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner chooses for `key` (`toPositive(murmur2) % n`)."""
    assert partitions > 0
    return (murmur2(key) & 0x7FFFFFFF) % partitions
