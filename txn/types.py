"""The values our clients hand to and get from users: partitions, records,
delivery reports, committed offsets, a consumer's group metadata.

All are frozen attrs classes (``ConsumerRecord`` a named tuple, for speed),
so they hash, compare and pickle (Spark ships them between processes).
"""

from __future__ import annotations

from typing import NamedTuple

import attrs


@attrs.frozen(order=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


def as_topic_partition(value) -> TopicPartition:
    """Accept ``TopicPartition`` or a ``(topic, partition)`` tuple."""
    if isinstance(value, TopicPartition):
        return value
    topic, partition = value
    return TopicPartition(topic, int(partition))


@attrs.frozen
class BatchMetadata:
    """Where a batch of records sent from columns landed: ``count`` records
    from ``offset`` on (-1 when the broker did not say: a retried batch it
    had written before)."""

    topic: str
    partition: int
    offset: int
    count: int


@attrs.frozen
class RecordMetadata:
    """Where a produced record landed."""

    topic: str
    partition: int
    offset: int
    timestamp: int = -1

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class ConsumerRecord(NamedTuple):
    """One record as a consumer hands it out (a named tuple: consumers make
    hundreds of thousands per second, and a tuple is the cheapest immutable
    value Python builds)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple = ()
    timestamp_type: int = 0  # 0 CreateTime, 1 LogAppendTime (the broker's time, set by the topic's message.timestamp.type)

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@attrs.frozen
class OffsetAndMetadata:
    offset: int
    metadata: str = ""


@attrs.frozen
class GroupMetadata:
    """What a transactional producer needs from a consumer to commit its
    offsets inside a transaction (KIP-447): the broker fences a commit from a
    member of an older generation."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None

    @classmethod
    def of(cls, value) -> "GroupMetadata":
        if isinstance(value, GroupMetadata):
            return value
        if isinstance(value, str):
            return cls(value)
        return cls(value["group_id"], value.get("generation_id", -1), value.get("member_id", ""), value.get("group_instance_id"))
