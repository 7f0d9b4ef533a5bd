"""``__transaction_state`` records: Kafka's TransactionLogKey/Value layout.

A record's key is ``version: int16`` (0) then TransactionLogKey
(``transactional_id``); its value is ``version: int16`` then
TransactionLogValue (producer id and epoch, timeout, status, partitions,
timestamps), or null (a tombstone: the transactional id expired). The topic
is compacted, so the latest record per id is the id's state; replaying the
log in order rebuilds every id's metadata.

A transactional id lives in partition ``abs(java_hash(id)) % partitions``,
Kafka's choice, so tools that know Kafka's layout find it where they expect.
"""

from __future__ import annotations

import struct

from coordinator.metadata import TopicPartition, TxnMetadata
from coordinator.state import TxnState
from protocol import schema
from protocol.partitioning import java_string_hash, partition_for  # noqa: F401 (re-exported)
from protocol.messages import TRANSACTION_LOG_KEY, TRANSACTION_LOG_VALUE

TRANSACTION_STATE_TOPIC = "__transaction_state"
DEFAULT_PARTITIONS = 50
KEY_VERSION = 0
VALUE_VERSION = 0
_VERSION = struct.Struct(">h")


def encode_key(transactional_id: str) -> bytes:
    return _VERSION.pack(KEY_VERSION) + schema.encode(TRANSACTION_LOG_KEY, KEY_VERSION, {"transactional_id": transactional_id})


def encode_value(metadata: TxnMetadata) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for partition in sorted(metadata.partitions, key=lambda p: (p.topic, p.partition)):
        by_topic.setdefault(partition.topic, []).append(partition.partition)
    body = {
        "producer_id": metadata.producer_id,
        "producer_epoch": metadata.producer_epoch,
        "transaction_timeout_ms": metadata.timeout_ms,
        "transaction_status": int(metadata.state),
        "transaction_partitions": [{"topic": t, "partition_ids": p} for t, p in by_topic.items()],
        "transaction_last_update_timestamp_ms": metadata.last_update_ms,
        "transaction_start_timestamp_ms": metadata.start_ms,
    }
    return _VERSION.pack(VALUE_VERSION) + schema.encode(TRANSACTION_LOG_VALUE, VALUE_VERSION, body)


def decode_key(data: bytes) -> str:
    (version,) = _VERSION.unpack_from(data)
    if version != KEY_VERSION:
        raise ValueError(f"unknown TransactionLogKey version {version}")
    body, _ = schema.decode(TRANSACTION_LOG_KEY, version, data, 2)
    return body["transactional_id"]


def decode_value(transactional_id: str, data: bytes | None) -> TxnMetadata | None:
    if data is None:
        return None
    (version,) = _VERSION.unpack_from(data)
    if version not in (0, 1):
        raise ValueError(f"unknown TransactionLogValue version {version}")
    body, _ = schema.decode(TRANSACTION_LOG_VALUE, version, data, 2, exact=False)
    partitions = frozenset(
        TopicPartition(entry["topic"], partition)
        for entry in body["transaction_partitions"] or []
        for partition in entry["partition_ids"]
    )
    return TxnMetadata(
        transactional_id=transactional_id,
        producer_id=body["producer_id"],
        producer_epoch=body["producer_epoch"],
        timeout_ms=body["transaction_timeout_ms"],
        state=TxnState(body["transaction_status"]),
        partitions=partitions,
        last_update_ms=body["transaction_last_update_timestamp_ms"],
        start_ms=body["transaction_start_timestamp_ms"],
    )
