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

onceflow adds three tagged fields of its own to value version 1 (which
Kafka's readers skip as unknown): ``DATA_ENDS_TAG``, on every PrepareCommit
(and a seal: ``transaction.durable.at.end``), names where the producer's
data in each partition of the transaction ends (``TxnMetadata.data_ends``);
``DATA_ENDS_EXACT_TAG`` (a bool, true) says those ends are exact: a record
without it was written when each end was its log's end at the decision
(``TxnMetadata.data_ends_are_log_ends``), which may lie past the producer's
data. The flag is a separate tag so that a broker of before reads the
exact ends as the ends it knew, which are at most those; both rules it
applies to them (a log short of an end loses the transaction; an open
transaction of the producer at or past an end is a later one's) hold for
exact ends too. ``COMMITTED_ENDS_TAG``, on a commit's Complete and the
id's records after it, names where that commit's markers were appended
(without waiting for their fsync), each with its topic's id
(``TxnMetadata.committed_ends``). A record with any of them is written as
version 1 whatever the client's transaction version.

A value is written by hand for its two shapes (``encode_value``: three a
transaction, on the request path) and read through the generic codec over
``VALUE_SCHEMA`` (at load); ``encode_value_by_schema`` writes it through
that codec too, the reference a property test holds the two byte-equal to.

A transactional id lives in partition ``abs(java_hash(id)) % partitions``,
Kafka's choice, so tools that know Kafka's layout find it where they expect.
"""

from __future__ import annotations

import struct
import uuid

import attrs

from coordinator.metadata import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TRANSACTION_VERSION_2, TopicPartition, TxnMetadata
from coordinator.state import TxnState
from protocol import schema
from protocol.schema import BOOL, INT32, INT64, STRING, UUID, ZERO_UUID, ArrayOf, Field, Struct, write_uvarint
from protocol.partitioning import java_string_hash, partition_for  # noqa: F401 (re-exported)
from protocol.messages import TRANSACTION_LOG_KEY, TRANSACTION_LOG_VALUE

TRANSACTION_STATE_TOPIC = "__transaction_state"
DEFAULT_PARTITIONS = 50
KEY_VERSION = 0
VALUE_VERSION = 0
VALUE_VERSION_TAGGED = 1  # for transactions of KIP-890 part 2
_VERSION = struct.Struct(">h")
# A value's fixed front: version, producer id, epoch, timeout, status.
_HEAD = struct.Struct(">hqhib")
_TIMESTAMPS = struct.Struct(">qq")  # last update, start
_PARTITION_END = struct.Struct(">iqB")  # partition, end offset, no tagged fields (0)
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
# Far above Kafka's own tags (0-2 today), so that none of its future ones meets it.
DATA_ENDS_TAG = 10_000
COMMITTED_ENDS_TAG = 10_001
DATA_ENDS_EXACT_TAG = 10_002


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
    Field("onceflow_data_ends_exact", BOOL, None, tagged=(1, None), tag=DATA_ENDS_EXACT_TAG),
)))


def encode_key(transactional_id: str) -> bytes:
    return _VERSION.pack(KEY_VERSION) + schema.encode(TRANSACTION_LOG_KEY, KEY_VERSION, {"transactional_id": transactional_id})


def encode_value(metadata: TxnMetadata) -> bytes:
    """The record's value: version 0 (Kafka's classic layout) or, for a
    transaction of version 2 or a record naming data or committed ends,
    version 1 (flexible: compact lengths, tagged fields written when not
    their default, in tag order).

    Written by hand for these two fixed shapes: the generic codec over
    ``VALUE_SCHEMA`` (``encode_value_by_schema``, kept as the reference)
    cost about as much as all the rest of appending the record, and each
    transaction writes three. The tests hold the two byte-equal over
    generated metadata."""
    by_topic = _partition_ids_by_topic(metadata)
    try:
        if _classic(metadata):
            out = bytearray(_HEAD.pack(VALUE_VERSION, metadata.producer_id, metadata.producer_epoch, metadata.timeout_ms, metadata.state))
            out += _INT32.pack(len(by_topic))
            for topic, ids in by_topic.items():
                name = topic.encode("utf-8")
                out += _INT16.pack(len(name))
                out += name
                out += struct.pack(f">i{len(ids)}i", len(ids), *ids)
            out += _TIMESTAMPS.pack(metadata.last_update_ms, metadata.start_ms)
            return bytes(out)
        out = bytearray(_HEAD.pack(VALUE_VERSION_TAGGED, metadata.producer_id, metadata.producer_epoch, metadata.timeout_ms, metadata.state))
        write_uvarint(out, len(by_topic) + 1)
        for topic, ids in by_topic.items():
            _compact_string(out, topic)
            write_uvarint(out, len(ids) + 1)
            out += struct.pack(f">{len(ids)}i", *ids)
            out.append(0)  # the entry's tagged fields: none
        out += _TIMESTAMPS.pack(metadata.last_update_ms, metadata.start_ms)
        tagged = []
        if metadata.previous_producer_id != NO_PRODUCER_ID:
            tagged.append((0, _INT64.pack(metadata.previous_producer_id)))
        if metadata.next_producer_id != NO_PRODUCER_ID:
            tagged.append((1, _INT64.pack(metadata.next_producer_id)))
        if metadata.transaction_version != 0:
            tagged.append((2, _INT16.pack(metadata.transaction_version)))
        if metadata.data_ends:
            tagged.append((DATA_ENDS_TAG, _data_ends(metadata.data_ends)))
        if metadata.committed_ends:
            tagged.append((COMMITTED_ENDS_TAG, _committed_ends(metadata.committed_ends)))
        if _data_ends_exact(metadata):
            tagged.append((DATA_ENDS_EXACT_TAG, b"\x01"))
        write_uvarint(out, len(tagged))
        for tag, field in tagged:
            write_uvarint(out, tag)
            write_uvarint(out, len(field))
            out += field
        return bytes(out)
    except struct.error as error:  # as the generic codec reports a value out of its type's range
        raise ValueError(f"TransactionLogValue of {metadata.transactional_id!r}: cannot encode: {error}") from None


def encode_value_by_schema(metadata: TxnMetadata) -> bytes:
    """``encode_value`` through the generic schema codec: the reference the
    hand-written encoder is tested against."""
    body = {
        "producer_id": metadata.producer_id,
        "producer_epoch": metadata.producer_epoch,
        "transaction_timeout_ms": metadata.timeout_ms,
        "transaction_status": int(metadata.state),
        "transaction_partitions": [{"topic": t, "partition_ids": p} for t, p in _partition_ids_by_topic(metadata).items()],
        "transaction_last_update_timestamp_ms": metadata.last_update_ms,
        "transaction_start_timestamp_ms": metadata.start_ms,
    }
    if _classic(metadata):
        return _VERSION.pack(VALUE_VERSION) + schema.encode(TRANSACTION_LOG_VALUE, VALUE_VERSION, body)
    body.update(
        client_transaction_version=metadata.transaction_version,
        previous_producer_id=metadata.previous_producer_id,
        next_producer_id=metadata.next_producer_id,
        onceflow_data_ends=[{"topic": topic, "partition": partition, "end_offset": end} for topic, partition, end in metadata.data_ends],
        onceflow_committed_ends=[{"topic": topic, "partition": partition, "end_offset": end, "topic_id": topic_id}
                                 for topic, partition, end, topic_id in metadata.committed_ends],
        onceflow_data_ends_exact=_data_ends_exact(metadata),
    )
    return _VERSION.pack(VALUE_VERSION_TAGGED) + schema.encode(VALUE_SCHEMA, VALUE_VERSION_TAGGED, body)


def _classic(metadata: TxnMetadata) -> bool:
    """Whether the record is written as version 0 (nothing of version 1 to say)."""
    return metadata.transaction_version < TRANSACTION_VERSION_2 and not metadata.data_ends and not metadata.committed_ends


def _data_ends_exact(metadata: TxnMetadata) -> bool:
    """Whether the record says its data ends are exact (the producer's own)."""
    return bool(metadata.data_ends) and not metadata.data_ends_are_log_ends


def _partition_ids_by_topic(metadata: TxnMetadata) -> dict[str, list[int]]:
    """The transaction's partitions, topics and ids in sorted order."""
    by_topic: dict[str, list[int]] = {}
    for partition in sorted(metadata.partitions, key=lambda p: (p.topic, p.partition)):
        by_topic.setdefault(partition.topic, []).append(partition.partition)
    return by_topic


def _compact_string(out: bytearray, text: str) -> None:
    data = text.encode("utf-8")
    write_uvarint(out, len(data) + 1)
    out += data


def _data_ends(data_ends: tuple) -> bytearray:
    """``onceflow_data_ends``: a compact array of DataEnd."""
    out = bytearray()
    write_uvarint(out, len(data_ends) + 1)
    for topic, partition, end in data_ends:
        _compact_string(out, topic)
        out += _PARTITION_END.pack(partition, end, 0)
    return out


def _committed_ends(committed_ends: tuple) -> bytearray:
    """``onceflow_committed_ends``: a compact array of CommittedEnd."""
    out = bytearray()
    write_uvarint(out, len(committed_ends) + 1)
    for topic, partition, end, topic_id in committed_ends:
        _compact_string(out, topic)
        out += topic_id.bytes if isinstance(topic_id, uuid.UUID) else ZERO_UUID.bytes if topic_id is None else bytes(topic_id)
        out += _PARTITION_END.pack(partition, end, 0)
    return out


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
    data_ends = tuple((end["topic"], end["partition"], end["end_offset"]) for end in body.get("onceflow_data_ends") or ())
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
        data_ends=data_ends,
        data_ends_are_log_ends=bool(data_ends) and not body.get("onceflow_data_ends_exact"),
        committed_ends=tuple((end["topic"], end["partition"], end["end_offset"], end["topic_id"]) for end in body.get("onceflow_committed_ends") or ()),
    )
