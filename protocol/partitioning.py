"""Kafka's two hashes from a key to a partition, so that tools and clients
that know Kafka's layout find a key where they expect it:

- a coordinator key (transactional id, group id) to a partition of its
  internal topic: ``Utils.abs(key.hashCode()) % partitions``, with Java's
  String.hashCode over UTF-16 code units (``partition_for``);
- a record key to a partition of its topic, the producer's default
  partitioner: murmur2 of the key bytes, positive part, modulo the partition
  count; keyless records go round robin (``default_partition``)."""

from __future__ import annotations

import functools


def java_string_hash(text: str) -> int:
    value = 0
    data = text.encode("utf-16-be")
    for index in range(0, len(data), 2):
        value = (31 * value + ((data[index] << 8) | data[index + 1])) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def partition_for(key: str, partitions: int) -> int:
    # Kafka's Utils.abs maps Integer.MIN_VALUE to 0 rather than overflowing.
    value = java_string_hash(key)
    return (0 if value == -(1 << 31) else abs(value)) % partitions


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (as the Java client's Utils.murmur2), a signed int32."""
    length = len(data)
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(length // 4):
        k = int.from_bytes(data[i * 4 : i * 4 + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = length & ~3
    extra = length % 4
    if extra == 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h >= 1 << 31 else h


@functools.lru_cache(maxsize=16_384)
def _key_hash(key: bytes) -> int:
    # Keys repeat (accounts, users, orders) and murmur2 in Python costs
    # microseconds per key, a good part of a pipeline's per-record time; a
    # bounded cache (about 2 MB when full) makes a repeated key nearly free.
    return murmur2(key) & 0x7FFFFFFF


def default_partition(key: bytes | None, partitions: int, counter) -> int:
    if key is None:
        return next(counter) % partitions
    if type(key) is bytes:  # hashable, so cacheable (a bytearray is not)
        return _key_hash(key) % partitions
    return (murmur2(key) & 0x7FFFFFFF) % partitions
