"""``__transaction_state`` records: Kafka's TransactionLogKey/Value layout.

A record's key is ``version: int16`` (0) then TransactionLogKey
(``transactional_id``); its value is ``version: int16`` then
TransactionLogValue (producer id and epoch, timeout, status, partitions,
timestamps), or null (a tombstone: the transactional id expired). The topic
is compacted, so the latest record per id is the id's state; replaying the
log in order rebuilds every id's metadata.

A transaction of KIP-890 part 2 is written as value version 1 with its
tagged fields (``ClientTransactionVersion`` 2, ``PreviousProducerId``,
``NextProducerId``), as Kafka writes it; every other record stays version 0,
byte for byte what it was. Reloaded, a version-2 decision (Prepare or
Complete) knows the epoch it bumped from (``last_producer_epoch``): one
below its own, so a retried EndTxn is recognized after a restart too.

onceflow adds two tagged fields of its own to value version 1 (which
Kafka's readers skip as unknown): ``DATA_ENDS_TAG``, on a PrepareCommit
written beside its data (or a seal: ``transaction.durable.at.end``), names
the log end each partition of the transaction had reached;
``COMMITTED_ENDS_TAG``, on a commit's Complete and the id's records after
it, names where that commit's markers were appended (without waiting for
their fsync), each with its topic's id (``TxnMetadata.committed_ends``). A
record with either is written as version 1 whatever the client's
transaction version.

A transactional id lives in partition ``abs(java_hash(id)) % partitions``,
Kafka's choice, so tools that know Kafka's layout find it where they expect.
"""

from __future__ import annotations

import struct

import attrs

from coordinator.metadata import NO_PRODUCER_EPOCH, TRANSACTION_VERSION_2, TopicPartition, TxnMetadata
from coordinator.state import TxnState
from protocol import schema
from protocol.schema import INT32, INT64, STRING, UUID, ArrayOf, Field, Struct
from protocol.partitioning import java_string_hash, partition_for  # noqa: F401 (re-exported)
from protocol.messages import TRANSACTION_LOG_KEY, TRANSACTION_LOG_VALUE

TRANSACTION_STATE_TOPIC = "__transaction_state"
DEFAULT_PARTITIONS = 50
KEY_VERSION = 0
VALUE_VERSION = 0
VALUE_VERSION_TAGGED = 1  # for transactions of KIP-890 part 2
_VERSION = struct.Struct(">h")
# Far above Kafka's own tags (0-2 today), so that none of its future ones meets it.
DATA_ENDS_TAG = 10_000
COMMITTED_ENDS_TAG = 10_001


VALUE_SCHEMA = attrs.evolve(TRANSACTION_LOG_VALUE, body=Struct("TransactionLogValue", (
    *TRANSACTION_LOG_VALUE.body.fields,
    Field("onceflow_data_ends", ArrayOf(Struct("DataEnd", (
        Field("topic", STRING, (1, None)),
        Field("partition", INT32, (1, None)),
        Field("end_offset", INT64, (1, None)),
    ))), None, tagged=(1, None), tag=DATA_ENDS_TAG),
    Field("onceflow_committed_ends", ArrayOf(Struct("CommittedEnd", (
        Field("topic", STRING, (1, None)),
        Field("topic_id", UUID, (1, None)),
        Field("partition", INT32, (1, None)),
        Field("end_offset", INT64, (1, None)),
    ))), None, tagged=(1, None), tag=COMMITTED_ENDS_TAG),
)))


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
    if metadata.transaction_version < TRANSACTION_VERSION_2 and not metadata.data_ends and not metadata.committed_ends:
        return _VERSION.pack(VALUE_VERSION) + schema.encode(TRANSACTION_LOG_VALUE, VALUE_VERSION, body)
    body.update(
        client_transaction_version=metadata.transaction_version,
        previous_producer_id=metadata.previous_producer_id,
        next_producer_id=metadata.next_producer_id,
        onceflow_data_ends=[{"topic": topic, "partition": partition, "end_offset": end} for topic, partition, end in metadata.data_ends],
        onceflow_committed_ends=[{"topic": topic, "partition": partition, "end_offset": end, "topic_id": topic_id}
                                 for topic, partition, end, topic_id in metadata.committed_ends],
    )
    return _VERSION.pack(VALUE_VERSION_TAGGED) + schema.encode(VALUE_SCHEMA, VALUE_VERSION_TAGGED, body)


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
    body, _ = schema.decode(VALUE_SCHEMA, version, data, 2, exact=False)
    partitions = frozenset(
        TopicPartition(entry["topic"], partition)
        for entry in body["transaction_partitions"] or []
        for partition in entry["partition_ids"]
    )
    state = TxnState(body["transaction_status"])
    transaction_version = body.get("client_transaction_version") or 0
    last_epoch = NO_PRODUCER_EPOCH
    ended = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
    if transaction_version >= TRANSACTION_VERSION_2 and state in ended and body["producer_epoch"] > 0:
        last_epoch = body["producer_epoch"] - 1  # the decision bumped it
    return TxnMetadata(
        transactional_id=transactional_id,
        producer_id=body["producer_id"],
        producer_epoch=body["producer_epoch"],
        timeout_ms=body["transaction_timeout_ms"],
        state=state,
        partitions=partitions,
        last_update_ms=body["transaction_last_update_timestamp_ms"],
        start_ms=body["transaction_start_timestamp_ms"],
        last_producer_epoch=last_epoch,
        previous_producer_id=body.get("previous_producer_id", -1),
        next_producer_id=body.get("next_producer_id", -1),
        transaction_version=transaction_version,
        data_ends=tuple((end["topic"], end["partition"], end["end_offset"]) for end in body.get("onceflow_data_ends") or ()),
        committed_ends=tuple((end["topic"], end["partition"], end["end_offset"], end["topic_id"]) for end in body.get("onceflow_committed_ends") or ()),
    )
