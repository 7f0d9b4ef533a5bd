"""``__consumer_offsets`` records: Kafka's OffsetCommit and GroupMetadata layouts.

    key   = version int16 (1: offset commit, 2: group metadata) + key struct
    value = version int16 + value struct, or null (a tombstone)

Offset commits are keyed by (group, topic, partition), group metadata by the
group id; the topic is compacted, so the latest record per key is the state.
A transactional offset commit is the same record in a transactional batch:
it counts only once its COMMIT marker follows.
"""

from __future__ import annotations

import struct

import attrs

from protocol import schema
from protocol.consumer_protocol import CONSUMER_PROTOCOL_ASSIGNMENT, CONSUMER_PROTOCOL_SUBSCRIPTION, MalformedConsumerProtocolError, decode_embedded
from protocol.messages import GROUP_METADATA_KEY, GROUP_METADATA_VALUE, OFFSET_COMMIT_KEY, OFFSET_COMMIT_VALUE

OFFSETS_TOPIC = "__consumer_offsets"
OFFSET_KEY_VERSION = 1
GROUP_KEY_VERSION = 2
OFFSET_VALUE_VERSION = 3
GROUP_VALUE_VERSION = 3
_VERSION = struct.Struct(">h")


@attrs.frozen
class OffsetAndMetadata:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1


@attrs.frozen
class OffsetKey:
    group: str
    topic: str
    partition: int


@attrs.frozen
class GroupKey:
    group: str


def offset_key(group: str, topic: str, partition: int) -> bytes:
    return _VERSION.pack(OFFSET_KEY_VERSION) + schema.encode(OFFSET_COMMIT_KEY, OFFSET_KEY_VERSION, {"group": group, "topic": topic, "partition": partition})


def offset_value(value: OffsetAndMetadata) -> bytes:
    body = {"offset": value.offset, "leader_epoch": value.leader_epoch, "metadata": value.metadata or "", "commit_timestamp": value.commit_timestamp}
    return _VERSION.pack(OFFSET_VALUE_VERSION) + schema.encode(OFFSET_COMMIT_VALUE, OFFSET_VALUE_VERSION, body)


def group_key(group: str) -> bytes:
    return _VERSION.pack(GROUP_KEY_VERSION) + schema.encode(GROUP_METADATA_KEY, GROUP_KEY_VERSION, {"group": group})


def group_value(body: dict) -> bytes:
    return _VERSION.pack(GROUP_VALUE_VERSION) + schema.encode(GROUP_METADATA_VALUE, GROUP_VALUE_VERSION, body)


def decode_key(data: bytes) -> OffsetKey | GroupKey:
    (version,) = _VERSION.unpack_from(data)
    if version in (0, 1):
        body, _ = schema.decode(OFFSET_COMMIT_KEY, version, data, 2)
        return OffsetKey(body["group"], body["topic"], body["partition"])
    if version == 2:
        body, _ = schema.decode(GROUP_METADATA_KEY, version, data, 2)
        return GroupKey(body["group"])
    raise ValueError(f"unknown __consumer_offsets key version {version}")


def decode_offset_value(data: bytes | None) -> OffsetAndMetadata | None:
    if data is None:
        return None
    (version,) = _VERSION.unpack_from(data)
    body, _ = schema.decode(OFFSET_COMMIT_VALUE, version, data, 2, exact=False)
    return OffsetAndMetadata(body["offset"], body.get("leader_epoch", -1), body["metadata"], body["commit_timestamp"])


def decode_group_value(data: bytes | None) -> dict | None:
    if data is None:
        return None
    (version,) = _VERSION.unpack_from(data)
    body, _ = schema.decode(GROUP_METADATA_VALUE, version, data, 2, exact=False)
    return body


def subscribed_topics(protocol_type: str | None, metadata: bytes) -> set[str]:
    """Topics in a consumer-protocol subscription; empty for other protocol
    types and for bytes that do not decode."""
    if protocol_type != "consumer":
        return set()
    try:
        _version, body = decode_embedded(CONSUMER_PROTOCOL_SUBSCRIPTION, metadata)
    except MalformedConsumerProtocolError:
        return set()
    return set(body["topics"])


def assigned_partitions(protocol_type: str | None, assignment: bytes) -> set[tuple[str, int]] | None:
    """The (topic, partition) pairs of a consumer-protocol assignment; None
    for other protocol types and for bytes that do not decode."""
    if protocol_type != "consumer":
        return None
    try:
        _version, body = decode_embedded(CONSUMER_PROTOCOL_ASSIGNMENT, assignment)
    except MalformedConsumerProtocolError:
        return None
    return {(group["topic"], partition) for group in body["assigned_partitions"] for partition in group["partitions"]}
