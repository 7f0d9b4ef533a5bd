"""onceflow's seal of an open transaction (``TransactionCoordinator.seal``),
against a real broker process with ``transaction.durable.at.end=true``,
under SIGKILL and the power-cut model (``faults.disk``: the fsync journal,
then every byte no fsync covered lost).

With that setting an unclean stop aborts every transaction it finds open:
their Produce requests were answered once appended, so answered bytes may
be lost. A transaction handed to another process while open (the Spark
sink's task hands its transaction to the driver) is sealed first: its data
made durable and recorded with where each partition's data ends. Recovery
keeps a sealed transaction open when its logs still reach those ends, and
the process holding its handle commits it; a seal the crash took back
(record kept, data lost: the seal was never answered) is aborted. What a
sealed transaction is sent afterwards is answered only once durable.
"""

from __future__ import annotations

import uuid

import pytest

from faults.disk import FSYNC_JOURNAL_VARIABLE, after_power_cut
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from tests.broker.test_txn_power_cut import (
    DURABLE_AT_END,
    TOPIC,
    TRANSACTIONAL_ID,
    _settled,
    add_partition,
    cut_power,
    end_answer,
    init,
    produce,
    segments,
    unsynced,
)
from tests.helpers import create_topic, raw_request, read_values, wait_for


def _initialized(port: int) -> dict | None:
    answer = raw_request(port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": TRANSACTIONAL_ID, "transaction_timeout_ms": 60_000})
    return answer if answer["error_code"] == ErrorCode.NONE else None


def seal(port: int, pid: int, epoch: int) -> int:
    """AddPartitionsToTxn v3 of the partition already added, with onceflow's seal tag; its error code."""
    body = {"v3_and_below_transactional_id": TRANSACTIONAL_ID, "v3_and_below_producer_id": pid, "v3_and_below_producer_epoch": epoch,
            "v3_and_below_topics": [{"name": TOPIC, "partitions": [0]}], "onceflow_seal": True}
    answer = raw_request(port, ApiKey.ADD_PARTITIONS_TO_TXN, 3, body)
    return answer["results_by_topic_v3_and_below"][0]["results_by_partition"][0]["partition_error_code"]


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("sealed", [True, False])
def test_a_sealed_transaction_survives_a_power_cut_open_and_commits_whole(broker_process, tmp_path, sealed, version):
    """A record answered once appended, then the seal, then a second record
    (answered once durable: the transaction is sealed), then a power cut:
    the transaction is still open after the restart, and its commit
    publishes both records. Unsealed, the same cut loses the answered
    record and the broker aborts the transaction at start (its commit is
    told UNKNOWN_PRODUCER_ID): the seal is what spares it."""
    journal = str(tmp_path / "fsyncs.journal")
    broker = broker_process(DURABLE_AT_END, env={FSYNC_JOURNAL_VARIABLE: journal})
    create_topic(broker.bootstrap, TOPIC, 1)
    pid, epoch = init(broker.port)
    add_partition(broker.port, pid, epoch, version)
    assert produce(broker.port, pid, epoch, 0, b"before the seal", acks=-1, version=version) == ErrorCode.NONE
    assert unsynced(journal, broker.data_dir, TOPIC), "answered once appended"
    if sealed:
        assert seal(broker.port, pid, epoch) == ErrorCode.NONE
        assert not unsynced(journal, broker.data_dir, TOPIC), "the seal made the data durable before its answer"
        assert produce(broker.port, pid, epoch, 1, b"after the seal", acks=-1, version=version) == ErrorCode.NONE
        assert not unsynced(journal, broker.data_dir, TOPIC), "a sealed transaction's Produce is answered once durable"
    cut_power(broker, journal, TOPIC)
    broker.env = after_power_cut()
    broker.start()

    # Retried while the start's abort of the unsealed transaction completes (CONCURRENT_TRANSACTIONS), as clients retry.
    answer = wait_for(lambda: _settled(end_answer(broker.port, pid, epoch, commit=True, version=version)), 10, "the EndTxn's answer")
    if not sealed:
        assert answer["error_code"] == ErrorCode.UNKNOWN_PRODUCER_ID, answer
        assert read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=0) == []
        return
    assert answer["error_code"] == ErrorCode.NONE, answer
    assert read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=2) == [b"before the seal", b"after the seal"]


@pytest.mark.slow
def test_a_seal_whose_data_a_cut_took_back_is_aborted_at_start(broker_process, tmp_path):
    """The seal's record and the data it covers share one fsync round.
    Killed once the record is appended, before that round, with a cut that
    keeps the record (the page cache wrote it back) and loses the data:
    the seal was never answered, recovery finds the log short of the end
    the seal names and aborts the transaction (its commit is told
    UNKNOWN_PRODUCER_ID), never keeping a transaction with a hole open."""
    journal = str(tmp_path / "fsyncs.journal")
    broker = broker_process(DURABLE_AT_END, env={FSYNC_JOURNAL_VARIABLE: journal, "ONCEFLOW_CRASH_POINTS": "coordinator.seal_appended@1:exit"})
    create_topic(broker.bootstrap, TOPIC, 1)
    pid, epoch = init(broker.port)
    add_partition(broker.port, pid, epoch)
    assert produce(broker.port, pid, epoch, 0, b"taken back", acks=-1) == ErrorCode.NONE
    with pytest.raises(OSError):
        seal(broker.port, pid, epoch)
    assert broker.wait_exit(30) == 86, "the crash point fired"
    assert unsynced(journal, broker.data_dir, "__transaction_state") and unsynced(journal, broker.data_dir, TOPIC)
    from faults.disk import lose_unsynced

    lose_unsynced(journal, segments(broker.data_dir, TOPIC))
    broker.env = after_power_cut()
    broker.start()
    answer = wait_for(lambda: _settled(end_answer(broker.port, pid, epoch, commit=True)), 10, "the EndTxn's answer")
    assert answer["error_code"] == ErrorCode.UNKNOWN_PRODUCER_ID, answer


def test_a_seal_is_refused_to_a_fenced_producer_and_for_an_unknown_partition(embedded_broker):
    """The seal checks the producer like any transactional request (an old
    epoch is fenced), and a request naming a partition that does not exist
    seals nothing."""
    create_topic(embedded_broker.bootstrap, TOPIC, 1)
    port = embedded_broker.port
    pid, epoch = init(port)
    add_partition(port, pid, epoch)
    assert produce(port, pid, epoch, 0, b"x", acks=-1) == ErrorCode.NONE
    # Another InitProducerId fences the first epoch and aborts its transaction (CONCURRENT_TRANSACTIONS until it has).
    bumped = wait_for(lambda: _initialized(port), 10, "the second InitProducerId")
    newer_epoch = bumped["producer_epoch"]
    assert bumped["producer_id"] == pid and newer_epoch > epoch
    assert seal(port, pid, epoch) in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH)
    answer = raw_request(port, ApiKey.ADD_PARTITIONS_TO_TXN, 3, {
        "v3_and_below_transactional_id": TRANSACTIONAL_ID, "v3_and_below_producer_id": pid, "v3_and_below_producer_epoch": newer_epoch,
        "v3_and_below_topics": [{"name": f"missing-{uuid.uuid4().hex[:6]}", "partitions": [0]}], "onceflow_seal": True})
    assert answer["results_by_topic_v3_and_below"][0]["results_by_partition"][0]["partition_error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


@pytest.mark.slow
def test_our_producer_seals_and_another_process_commits_after_an_unclean_stop(broker_process, tmp_path):
    """``Producer.seal_transaction`` and ``Producer.resume``, as the Spark
    sink's task and driver use them: the task's transaction, sealed, lives
    through an unclean stop of the broker in a new boot (which aborts the
    unsealed ones) and the driver's process commits it."""
    from txn import Producer

    broker = broker_process(DURABLE_AT_END)
    topic = f"sealed-{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, topic, 2)
    with Producer(bootstrap_servers=broker.bootstrap, transactional_id=f"task-{uuid.uuid4().hex[:6]}") as task:
        task.init_transactions()
        task.begin_transaction()
        for index in range(10):
            task.send(topic, f"v{index}".encode(), partition=index % 2)
        handle = task.seal_transaction()
    broker.kill()
    broker.env = after_power_cut()
    broker.start()
    driver = Producer.resume(handle, bootstrap_servers=broker.bootstrap)
    try:
        driver.commit_transaction()
    finally:
        driver.close()
    values = read_values(broker.bootstrap, topic, isolation="read_committed", partitions=2, expect=10)
    assert sorted(values) == sorted(f"v{index}".encode() for index in range(10))
