"""The "consumer" protocol type's embedded bytes: Kafka's
ConsumerProtocolSubscription (inside JoinGroup) and ConsumerProtocolAssignment
(inside SyncGroup), as tables for the schema-driven codec of ``protocol.schema``.

Both travel as an int16 version, then the fields of that version in the
classic (non-flexible) encoding. A reader decodes a newer version by reading
the fields it knows and ignoring whatever follows, as Kafka's readers do.
Clients (``txn.assignors``) build and read them as typed values; the group
coordinator (``groupcoord``) reads them to tell which topics a group
subscribes to and which partitions its members were handed.
"""

from __future__ import annotations

import struct

from protocol.errors import MalformedFrameError
from protocol.schema import BYTES, INT32, STRING, ArrayOf, Field, Message, Struct, decode, encode

NO_GENERATION = -1
_VERSION = struct.Struct(">h")


class MalformedConsumerProtocolError(MalformedFrameError):
    """The embedded consumer-protocol bytes are not a valid message (the
    sender's fault)."""


def _topic_partitions(versions) -> ArrayOf:
    return ArrayOf(Struct("TopicPartition", (
        Field("topic", STRING, versions),
        Field("partitions", ArrayOf(INT32), versions),
    )))


CONSUMER_PROTOCOL_SUBSCRIPTION = Message("ConsumerProtocolSubscription", valid=(0, 3), flexible=None, body=Struct("ConsumerProtocolSubscription", (
    Field("topics", ArrayOf(STRING), (0, None)),
    Field("user_data", BYTES, (0, None), nullable=(0, None), default=None),
    Field("owned_partitions", _topic_partitions((1, None)), (1, None), ignorable=True),
    Field("generation_id", INT32, (2, None), default=NO_GENERATION, ignorable=True),
    Field("rack_id", STRING, (3, None), nullable=(3, None), default=None, ignorable=True),
)))

CONSUMER_PROTOCOL_ASSIGNMENT = Message("ConsumerProtocolAssignment", valid=(0, 3), flexible=None, body=Struct("ConsumerProtocolAssignment", (
    Field("assigned_partitions", _topic_partitions((0, None)), (0, None)),
    Field("user_data", BYTES, (0, None), nullable=(0, None), default=None),
)))


def encode_embedded(message: Message, version: int, body: dict) -> bytes:
    """``message`` at ``version`` behind its int16 version."""
    if not message.supports(version):
        low, high = message.valid
        raise ValueError(f"{message.name} has versions {low}-{high}, not {version}")
    return _VERSION.pack(version) + encode(message, version, body)


def decode_embedded(message: Message, data) -> tuple[int, dict]:
    """The version the sender wrote and the fields we know of it: a newer
    version is read as our newest, ignoring the bytes after what we know.
    Raises ``MalformedConsumerProtocolError`` for bytes that do not decode."""
    view = memoryview(data)
    if len(view) < _VERSION.size:
        raise MalformedConsumerProtocolError(f"{message.name}: {len(view)} bytes cannot hold the int16 version")
    (version,) = _VERSION.unpack_from(view)
    if version < 0:
        raise MalformedConsumerProtocolError(f"{message.name}: negative version {version}")
    readable = min(version, message.valid[1])
    try:
        body, _end = decode(message, readable, view, _VERSION.size, exact=False)
    except MalformedFrameError as error:
        sent_as = f" (sent as version {version})" if version != readable else ""
        raise MalformedConsumerProtocolError(f"{error}{sent_as}") from None
    return version, body
