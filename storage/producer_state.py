"""Per-partition producer state: idempotence, fencing and open transactions.

For every producer id that wrote to the partition we keep its epoch, the
metadata of its last five batches (sequence range and offsets, so a retried
batch is answered with its original offsets instead of being appended
twice), the coordinator epoch of its last marker, and the first offset of its
open transaction (which holds the last stable offset back).

This module is sans-I/O: ``check_append()`` answers whether a batch may be
appended (and returns a ``ProducerAppend`` that the log applies after its write
succeeds); ``apply_marker()`` ends a transaction and says whether it belongs in
the aborted-transaction index. Snapshots are bytes in, bytes out.

Snapshot file format (Kafka's ``.snapshot``, version 1), named by the log
offset it reflects (20 digits) in the partition directory::

    version: int16                     1
    crc: uint32                        CRC-32C of everything after this field
    entry_count: int32
    entries: (producer_id int64, producer_epoch int16, last_sequence int32,
              last_offset int64, offset_delta int32, timestamp int64,
              coordinator_epoch int32, current_txn_first_offset int64 (-1: none))*

Kafka snapshots only the last batch of each producer; after a restart the
duplicate window is rebuilt from the log after the snapshot.
"""

from __future__ import annotations

import collections
import struct

import attrs

from protocol.records import BatchHeader, ControlType, crc32c

BATCHES_TO_RETAIN = 5  # Kafka's max.in.flight limit for idempotence
NO_SEQUENCE = -1
NO_EPOCH = -1
INT32_MAX = 2**31 - 1

SNAPSHOT_VERSION = 1
_SNAPSHOT_HEADER = struct.Struct(">hI")
_COUNT = struct.Struct(">i")
_SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")


class ProducerStateError(Exception):
    """A batch the producer state refuses; ``error_name`` is the Kafka error code name."""

    error_name = "UNKNOWN_SERVER_ERROR"


class OutOfOrderSequenceError(ProducerStateError):
    error_name = "OUT_OF_ORDER_SEQUENCE_NUMBER"


class InvalidProducerEpochError(ProducerStateError):
    error_name = "INVALID_PRODUCER_EPOCH"


class UnknownProducerIdError(ProducerStateError):
    error_name = "UNKNOWN_PRODUCER_ID"


class TransactionCoordinatorFencedError(ProducerStateError):
    error_name = "TRANSACTION_COORDINATOR_FENCED"


class InvalidTxnStateError(ProducerStateError):
    error_name = "INVALID_TXN_STATE"


class CorruptSnapshotError(ValueError):
    pass


@attrs.frozen
class BatchMetadata:
    first_sequence: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


@attrs.define
class ProducerEntry:
    producer_id: int
    producer_epoch: int = NO_EPOCH
    batches: collections.deque = attrs.field(factory=lambda: collections.deque(maxlen=BATCHES_TO_RETAIN))
    coordinator_epoch: int = -1
    last_timestamp: int = -1
    current_txn_first_offset: int | None = None

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, header: BatchHeader) -> BatchMetadata | None:
        for batch in self.batches:
            if batch.first_sequence == header.base_sequence and batch.last_sequence == header.last_sequence:
                return batch
        return None


@attrs.frozen
class DuplicateBatch:
    """The batch was already appended: answer with its original offsets."""

    first_offset: int
    last_offset: int
    timestamp: int


@attrs.frozen
class ProducerAppend:
    """What appending one producer batch changes; applied after the write succeeds."""

    producer_id: int
    producer_epoch: int
    first_sequence: int
    last_sequence: int
    is_transactional: bool
    timestamp: int
    offset_delta: int


@attrs.frozen
class CompletedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the marker's offset
    is_aborted: bool


def _in_sequence(last_sequence: int, next_sequence: int) -> bool:
    # Sequences wrap from int32 max to 0.
    return next_sequence == last_sequence + 1 or (last_sequence == INT32_MAX and next_sequence == 0)


class ProducerStateManager:
    def __init__(self):
        self.producers: dict[int, ProducerEntry] = {}
        # first offset of each open transaction -> producer id (ordered by offset)
        self.ongoing: dict[int, int] = {}
        # The log offset up to which this state reflects the log.
        self.map_end_offset = 0

    # -- client batches -----------------------------------------------------------

    def check_append(self, header: BatchHeader) -> ProducerAppend | DuplicateBatch | None:
        """Validate a client batch. Returns None for non-idempotent batches,
        a DuplicateBatch for a retry already in the log, else the change to
        apply after the append. Raises a ProducerStateError to refuse it."""
        producer_id = header.producer_id
        if producer_id < 0:
            return None
        epoch = header.producer_epoch
        entry = self.producers.get(producer_id)
        if header.base_sequence == NO_SEQUENCE:
            # Written by a coordinator (transactional offset commits), not a
            # client: no sequence to check, and never a duplicate.
            if entry is not None and epoch < entry.producer_epoch:
                raise InvalidProducerEpochError(
                    f"producer {producer_id} epoch {epoch} is older than the current epoch {entry.producer_epoch}"
                )
            return ProducerAppend(producer_id, epoch, NO_SEQUENCE, NO_SEQUENCE, header.is_transactional, header.max_timestamp, header.last_offset_delta)
        if entry is not None:
            if epoch < entry.producer_epoch:
                raise InvalidProducerEpochError(
                    f"producer {producer_id} epoch {epoch} is older than the current epoch {entry.producer_epoch}"
                )
            if epoch == entry.producer_epoch:
                duplicate = entry.find_duplicate(header)
                if duplicate is not None:
                    return DuplicateBatch(duplicate.first_offset, duplicate.last_offset, duplicate.timestamp)
        sequence = header.base_sequence
        if entry is None or entry.producer_epoch == NO_EPOCH:
            if sequence != 0 and header.base_sequence != NO_SEQUENCE:
                # KIP-360: the broker has no state for this producer (expired or
                # removed with its data); the client bumps its epoch and restarts.
                raise UnknownProducerIdError(
                    f"no state for producer {producer_id}; first sequence {sequence} is not 0"
                )
        elif epoch != entry.producer_epoch:
            if sequence != 0:
                raise OutOfOrderSequenceError(
                    f"producer {producer_id} bumped its epoch to {epoch} but its first sequence is {sequence}, not 0"
                )
        elif entry.batches and not _in_sequence(entry.last_sequence, sequence):
            raise OutOfOrderSequenceError(
                f"producer {producer_id} epoch {epoch}: expected sequence {entry.last_sequence + 1}, got {sequence}"
            )
        if header.is_transactional and entry is not None and entry.current_txn_first_offset is not None and epoch != entry.producer_epoch:
            raise InvalidTxnStateError(f"producer {producer_id} has an open transaction from epoch {entry.producer_epoch}")
        return ProducerAppend(
            producer_id=producer_id,
            producer_epoch=epoch,
            first_sequence=sequence,
            last_sequence=header.last_sequence,
            is_transactional=header.is_transactional,
            timestamp=header.max_timestamp,
            offset_delta=header.last_offset_delta,
        )

    def apply_append(self, change: ProducerAppend, first_offset: int, last_offset: int) -> None:
        entry = self.producers.get(change.producer_id)
        if entry is None:
            entry = self.producers[change.producer_id] = ProducerEntry(change.producer_id)
        if change.producer_epoch != entry.producer_epoch:
            entry.producer_epoch = change.producer_epoch
            entry.batches.clear()
        entry.batches.append(
            BatchMetadata(change.first_sequence, change.last_sequence, last_offset, change.offset_delta, change.timestamp)
        )
        entry.last_timestamp = change.timestamp
        if change.is_transactional and entry.current_txn_first_offset is None:
            entry.current_txn_first_offset = first_offset
            self.ongoing[first_offset] = change.producer_id
        self.map_end_offset = max(self.map_end_offset, last_offset + 1)

    # -- markers -------------------------------------------------------------------

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"marker from coordinator epoch {coordinator_epoch} is older than {entry.coordinator_epoch}"
            )
        if producer_epoch < entry.producer_epoch:
            raise InvalidProducerEpochError(
                f"marker for producer {producer_id} epoch {producer_epoch} is older than {entry.producer_epoch}"
            )

    def apply_marker(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, control: ControlType, offset: int, timestamp: int
    ) -> CompletedTxn | None:
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(producer_id, producer_epoch)
        if producer_epoch > entry.producer_epoch:
            # A marker written with a bumped epoch (a fence or a timeout abort):
            # the old epoch's batches say nothing about the new epoch's sequences.
            entry.producer_epoch = producer_epoch
            entry.batches.clear()
        entry.coordinator_epoch = coordinator_epoch
        entry.last_timestamp = timestamp
        first_offset = entry.current_txn_first_offset
        entry.current_txn_first_offset = None
        self.map_end_offset = max(self.map_end_offset, offset + 1)
        if first_offset is None:
            return None  # a marker for a transaction with no data here
        self.ongoing.pop(first_offset, None)
        return CompletedTxn(producer_id, first_offset, offset, is_aborted=control == ControlType.ABORT)

    # -- queries ---------------------------------------------------------------------

    def first_unstable_offset(self) -> int | None:
        return min(self.ongoing) if self.ongoing else None

    # -- expiry and truncation ------------------------------------------------------

    def remove_expired(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Forget producers idle longer than ``expiration_ms``, never with an open transaction."""
        expired = [
            pid
            for pid, entry in self.producers.items()
            if entry.current_txn_first_offset is None and entry.last_timestamp >= 0 and now_ms - entry.last_timestamp >= expiration_ms
        ]
        for pid in expired:
            del self.producers[pid]
        return expired

    def truncate_head(self, log_start_offset: int) -> None:
        """Drop producers whose every batch is below the new log start offset."""
        for pid in [pid for pid, e in self.producers.items() if e.current_txn_first_offset is None and 0 <= e.last_offset < log_start_offset]:
            del self.producers[pid]

    # -- snapshots ------------------------------------------------------------------

    def snapshot_bytes(self) -> bytes:
        body = bytearray(_COUNT.pack(len(self.producers)))
        for entry in self.producers.values():
            last = entry.batches[-1] if entry.batches else None
            body += _SNAPSHOT_ENTRY.pack(
                entry.producer_id,
                entry.producer_epoch,
                last.last_sequence if last else NO_SEQUENCE,
                last.last_offset if last else -1,
                last.offset_delta if last else 0,
                entry.last_timestamp,
                entry.coordinator_epoch,
                -1 if entry.current_txn_first_offset is None else entry.current_txn_first_offset,
            )
        return _SNAPSHOT_HEADER.pack(SNAPSHOT_VERSION, crc32c(bytes(body))) + bytes(body)

    @classmethod
    def from_snapshot(cls, data: bytes, map_end_offset: int) -> "ProducerStateManager":
        if len(data) < _SNAPSHOT_HEADER.size + _COUNT.size:
            raise CorruptSnapshotError(f"snapshot of {len(data)} bytes is too short")
        version, crc = _SNAPSHOT_HEADER.unpack_from(data)
        if version != SNAPSHOT_VERSION:
            raise CorruptSnapshotError(f"snapshot version {version} is not {SNAPSHOT_VERSION}")
        body = data[_SNAPSHOT_HEADER.size :]
        actual = crc32c(body)
        if actual != crc:
            raise CorruptSnapshotError(f"snapshot crc {crc:#010x} does not match {actual:#010x}")
        (count,) = _COUNT.unpack_from(body)
        if count < 0 or len(body) != _COUNT.size + count * _SNAPSHOT_ENTRY.size:
            raise CorruptSnapshotError(f"snapshot declares {count} entries but holds {len(body)} bytes")
        state = cls()
        for index in range(count):
            (pid, epoch, last_seq, last_offset, offset_delta, timestamp, coordinator_epoch, txn_first) = _SNAPSHOT_ENTRY.unpack_from(
                body, _COUNT.size + index * _SNAPSHOT_ENTRY.size
            )
            entry = ProducerEntry(pid, epoch, coordinator_epoch=coordinator_epoch, last_timestamp=timestamp)
            if last_offset >= 0:
                first_seq = NO_SEQUENCE if last_seq == NO_SEQUENCE else max(0, last_seq - offset_delta)
                entry.batches.append(BatchMetadata(first_seq, last_seq, last_offset, offset_delta, timestamp))
            if txn_first >= 0:
                entry.current_txn_first_offset = txn_first
                state.ongoing[txn_first] = pid
            state.producers[pid] = entry
        state.map_end_offset = map_end_offset
        return state
