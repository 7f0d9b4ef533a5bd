"""Kafka's hash of a coordinator key (transactional id, group id) to a partition
of its internal topic: ``Utils.abs(key.hashCode()) % partitions``, with Java's
String.hashCode over UTF-16 code units, so tools that know Kafka's layout find
a key where they expect it."""

from __future__ import annotations


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
