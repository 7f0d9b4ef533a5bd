"""Producer state in the partition log: duplicates, sequences, epochs, open
transactions holding the last stable offset, aborted-transaction index, and
snapshots that survive restarts and damage."""

from __future__ import annotations

import os

import pytest

from protocol.records import ControlType, encode_batch, encode_control_batch
from storage.config import LogConfig
from storage.log import PartitionLog
from storage.producer_state import (
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    ProducerStateManager,
    UnknownProducerIdError,
)


def batch(pid=7, epoch=0, seq=0, n=2, txn=False, key=b"k"):
    return encode_batch([(key, b"v%d" % i, (), 1000) for i in range(n)], producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=txn)


def marker(kind, pid=7, epoch=0, coordinator_epoch=0):
    return encode_control_batch(kind, producer_id=pid, producer_epoch=epoch, coordinator_epoch=coordinator_epoch, timestamp=2000)


@pytest.fixture
def partition_log(tmp_path):
    log = PartitionLog.open(str(tmp_path), LogConfig(flush_policy="os", segment_bytes=400))
    yield log
    log.close()


def test_retried_batch_is_answered_with_its_original_offsets(partition_log):
    first = partition_log.append(batch(seq=0))
    partition_log.append(batch(seq=2))
    retry = partition_log.append(batch(seq=0))
    assert retry.duplicate and (retry.first_offset, retry.last_offset) == (first.first_offset, first.last_offset)
    assert partition_log.log_end_offset == 4, "nothing appended twice"


def test_sequence_gap_and_stale_epoch_and_unknown_producer(partition_log):
    partition_log.append(batch(seq=0))
    with pytest.raises(OutOfOrderSequenceError):
        partition_log.append(batch(seq=5))
    partition_log.append(batch(epoch=1, seq=0))
    with pytest.raises(InvalidProducerEpochError):
        partition_log.append(batch(epoch=0, seq=2))
    with pytest.raises(OutOfOrderSequenceError):
        partition_log.append(batch(epoch=2, seq=3))  # a new epoch starts at 0
    with pytest.raises(UnknownProducerIdError):
        partition_log.append(batch(pid=99, seq=10))
    assert partition_log.log_end_offset == 4


def test_only_the_last_five_batches_are_remembered(partition_log):
    for i in range(6):
        partition_log.append(batch(seq=2 * i))
    assert partition_log.append(batch(seq=2)).duplicate
    with pytest.raises(OutOfOrderSequenceError):
        partition_log.append(batch(seq=0))  # older than the window: not recognized


def test_open_transaction_holds_the_lso_and_abort_is_indexed(partition_log):
    partition_log.append(batch(pid=1, seq=0, n=3))
    assert partition_log.last_stable_offset == 3
    partition_log.append(batch(pid=2, seq=0, txn=True))  # offsets 3-4
    partition_log.append(batch(pid=3, seq=0, txn=True))  # offsets 5-6
    partition_log.append(batch(pid=1, seq=3))  # 7-8
    assert partition_log.last_stable_offset == 3
    partition_log.append_control(marker(ControlType.ABORT, pid=2), coordinator_epoch=0)  # 9
    assert partition_log.last_stable_offset == 5, "pid 3 still open"
    partition_log.append_control(marker(ControlType.COMMIT, pid=3), coordinator_epoch=0)  # 10
    assert partition_log.last_stable_offset == partition_log.high_watermark == 11
    assert partition_log.aborted_transactions(0, 11) == [{"producer_id": 2, "first_offset": 3}]
    assert partition_log.aborted_transactions(9, 11) == [{"producer_id": 2, "first_offset": 3}]
    assert partition_log.aborted_transactions(10, 11) == []


def test_a_marker_encoded_by_the_log_is_the_marker_handed_in_byte_for_byte(tmp_path):
    """``append_marker`` (the coordinator's) skips the checks
    ``append_control`` makes of bytes handed in; what it writes and what it
    does to the producer state are the same."""
    logs = {}
    for name in ("handed_in", "encoded_here"):
        partition_log = logs[name] = PartitionLog.open(str(tmp_path / name), LogConfig(flush_policy="os"))
        partition_log.append(batch(pid=2, seq=0, txn=True))
        partition_log.append(batch(pid=3, seq=0, txn=True))
        for kind, pid in ((ControlType.ABORT, 2), (ControlType.COMMIT, 3)):
            if name == "handed_in":
                info, aborted = partition_log.append_control(marker(kind, pid=pid, coordinator_epoch=1), coordinator_epoch=1)
            else:
                info, aborted = partition_log.append_marker(kind, producer_id=pid, producer_epoch=0, coordinator_epoch=1, timestamp=2000)
            assert (info.first_offset, aborted is not None) == ((4, True) if pid == 2 else (5, False))
        assert partition_log.last_stable_offset == 6
        assert partition_log.aborted_transactions(0, 6) == [{"producer_id": 2, "first_offset": 0}]
        partition_log.close()
    read = {name: open(log.segments[0].log_path, "rb").read() for name, log in logs.items()}
    assert read["handed_in"] == read["encoded_here"]
    reopened = PartitionLog.open(str(tmp_path / "encoded_here"), LogConfig(flush_policy="os"))
    from storage.producer_state import TransactionCoordinatorFencedError

    reopened.append(batch(pid=2, seq=2, txn=True))
    with pytest.raises(TransactionCoordinatorFencedError):
        reopened.append_marker(ControlType.ABORT, producer_id=2, producer_epoch=0, coordinator_epoch=0, timestamp=2000)
    reopened.close()


def test_marker_from_an_older_coordinator_epoch_is_refused(partition_log):
    partition_log.append(batch(pid=2, seq=0, txn=True))
    partition_log.append_control(marker(ControlType.COMMIT, pid=2, coordinator_epoch=5), coordinator_epoch=5)
    partition_log.append(batch(pid=2, seq=2, txn=True))
    from storage.producer_state import TransactionCoordinatorFencedError

    with pytest.raises(TransactionCoordinatorFencedError):
        partition_log.append_control(marker(ControlType.ABORT, pid=2, coordinator_epoch=4), coordinator_epoch=4)


@pytest.mark.parametrize("clean", [True, False])
def test_state_survives_restart(tmp_path, clean):
    config = LogConfig(flush_policy="os", segment_bytes=400)
    log = PartitionLog.open(str(tmp_path), config)
    for i in range(10):
        log.append(batch(pid=1, seq=2 * i))
    log.append(batch(pid=2, seq=0, txn=True))
    open_first = log.log_end_offset - 2
    log.append(batch(pid=3, seq=0, txn=True))
    log.append_control(marker(ControlType.ABORT, pid=3), coordinator_epoch=0)
    assert any(name.endswith(".snapshot") for name in os.listdir(tmp_path)), "rolls take snapshots"
    if clean:
        log.close()
    else:
        for segment in log.segments:
            segment.flush_indexes()
    reopened = PartitionLog.open(str(tmp_path), config)
    assert reopened.append(batch(pid=1, seq=18)).duplicate, "the duplicate window survived"
    assert reopened.last_stable_offset == open_first, "the open transaction still holds the LSO"
    assert reopened.aborted_transactions(0, reopened.log_end_offset) == [{"producer_id": 3, "first_offset": open_first + 2}]
    reopened.close()


def test_corrupt_snapshot_is_ignored_and_state_rebuilt_from_the_log(tmp_path):
    config = LogConfig(flush_policy="os", segment_bytes=400)
    log = PartitionLog.open(str(tmp_path), config)
    for i in range(10):
        log.append(batch(pid=1, seq=2 * i))
    log.close()
    for name in os.listdir(tmp_path):
        if name.endswith(".snapshot"):
            path = tmp_path / name
            data = bytearray(path.read_bytes())
            data[-1] ^= 0xFF
            path.write_bytes(bytes(data))
    reopened = PartitionLog.open(str(tmp_path), config)
    assert reopened.append(batch(pid=1, seq=18)).duplicate
    with pytest.raises(OutOfOrderSequenceError):
        reopened.append(batch(pid=1, seq=40))
    reopened.close()


def test_snapshot_bytes_round_trip_and_expiry():
    state = ProducerStateManager()
    from storage.producer_state import ProducerAppend

    state.apply_append(ProducerAppend(5, 2, 0, 9, True, 1234, 9), 100, 109)
    state.apply_append(ProducerAppend(6, 0, 0, 0, False, 10, 0), 110, 110)
    copy = ProducerStateManager.from_snapshot(state.snapshot_bytes(), 111)
    assert copy.producers[5].current_txn_first_offset == 100
    assert copy.first_unstable_offset() == 100
    assert copy.producers[6].last_sequence == 0
    assert copy.remove_expired(now_ms=10_000, expiration_ms=1000) == [6], "never while a transaction is open"
