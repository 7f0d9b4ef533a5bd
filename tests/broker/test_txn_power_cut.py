"""AddPartitionsToTxn and AddOffsetsToTxn are answered once appended (their
``__transaction_state`` record not yet durable), against a real broker
process under the power-cut model (``faults.disk``: the fsync journal, then
every byte no fsync covered lost):

- a transactional Produce or TxnOffsetCommit is answered once its own
  data is durable, not its producer's AddPartitions or AddOffsets record
  (EndTxn's round makes that durable); a cut of every unsynced byte after
  EndTxn's round keeps the transaction whole;
- what a cut can leave, a transactional batch whose partition no
  transaction names any more (its record lost, the batch kept), is aborted
  with a marker when the broker starts, before it serves: it neither hangs
  (holding the partition's last stable offset) nor is committed by the
  producer's next transaction. With that check switched off
  (``ONCEFLOW_KEEP_UNKNOWN_TRANSACTIONS=1``) the same cut shows both;
- and the transaction that producer began at that epoch is aborted with an
  epoch bump: its EndTxn(commit) is told UNKNOWN_PRODUCER_ID (abortable),
  never NONE without the batch. With that switched off
  (``ONCEFLOW_KEEP_PRODUCER_OF_UNKNOWN_TRANSACTIONS=1``) the commit is told
  NONE and loses the answered batch.

The same holds with transaction version 2 (KIP-890 part 2), where the
first Produce v12 or TxnOffsetCommit v5 adds its partition itself (the
same record, answered once appended): each test runs with both versions.
Version 2's other new point, the EndTxn v5 decision that carries the next
epoch, is killed at (SIGKILL at the crash point after the decision, and a
power cut after its answer): recovery writes the markers at the new epoch,
a retried EndTxn gets the same new epoch, and the next transaction runs at it.

Each step is a raw request (``tests.helpers.raw_request``), so the test
chooses exactly which request was answered before the cut.
"""

from __future__ import annotations

import glob
import os

import pytest

from faults.disk import (
    FSYNC_JOURNAL_VARIABLE,
    KEEP_ENDED_EPOCHS_VARIABLE,
    KEEP_ONGOING_TRANSACTIONS_VARIABLE,
    KEEP_PRODUCER_OF_UNKNOWN_VARIABLE,
    KEEP_UNKNOWN_TRANSACTIONS_VARIABLE,
    LEAVE_DECIDED_UNMARKED_VARIABLE,
    after_power_cut,
    durable_sizes,
    lose_unsynced,
    written_length,
)
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.records import encode_batch
from tests.helpers import create_topic, raw_request, read_values, recreate_topics, wait_for

TOPIC, GROUP, TRANSACTIONAL_ID = "cut", "cut-group", "cut-producer"


def init(port: int) -> tuple[int, int]:
    answer = raw_request(port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": TRANSACTIONAL_ID, "transaction_timeout_ms": 60_000})
    assert answer["error_code"] == ErrorCode.NONE, answer
    return answer["producer_id"], answer["producer_epoch"]


def add_partition(port: int, pid: int, epoch: int, version: int = 1, partition: int = 0) -> None:
    """AddPartitionsToTxn; with transaction version 2 none is sent (the Produce adds it)."""
    error = add_partition_answer(port, pid, epoch, version, partition)
    assert error == ErrorCode.NONE, error


def add_partition_answer(port: int, pid: int, epoch: int, version: int = 1, partition: int = 0) -> int:
    """AddPartitionsToTxn's error code (NONE with transaction version 2: none is sent)."""
    if version == 2:
        return ErrorCode.NONE
    body = {"v3_and_below_transactional_id": TRANSACTIONAL_ID, "v3_and_below_producer_id": pid, "v3_and_below_producer_epoch": epoch,
            "v3_and_below_topics": [{"name": TOPIC, "partitions": [partition]}]}
    answer = raw_request(port, ApiKey.ADD_PARTITIONS_TO_TXN, 3, body)
    return answer["results_by_topic_v3_and_below"][0]["results_by_partition"][0]["partition_error_code"]


def produce(port: int, pid: int, epoch: int, sequence: int, value: bytes, acks: int, version: int = 1, partition: int = 0) -> int:
    """A transactional Produce (v12 with transaction version 2); its error code."""
    records = encode_batch([(None, value, (), 1_000)], producer_id=pid, producer_epoch=epoch, base_sequence=sequence, is_transactional=True)
    body = {"transactional_id": TRANSACTIONAL_ID, "acks": acks, "timeout_ms": 10_000, "topic_data": [{"name": TOPIC, "partition_data": [{"index": partition, "records": records}]}]}
    answer = raw_request(port, ApiKey.PRODUCE, 12 if version == 2 else 8, body)
    return answer["responses"][0]["partition_responses"][0]["error_code"]


def add_offsets_and_commit_them(port: int, pid: int, epoch: int, offset: int, version: int = 1) -> None:
    if version == 2:
        added = {"error_code": ErrorCode.NONE}  # TxnOffsetCommit v5 adds the offsets partition itself
    else:
        added = raw_request(port, ApiKey.ADD_OFFSETS_TO_TXN, 3, {"transactional_id": TRANSACTIONAL_ID, "producer_id": pid, "producer_epoch": epoch, "group_id": GROUP})
    assert added["error_code"] == ErrorCode.NONE, added
    body = {"transactional_id": TRANSACTIONAL_ID, "group_id": GROUP, "producer_id": pid, "producer_epoch": epoch, "generation_id": -1, "member_id": "",
            "group_instance_id": None, "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "committed_offset": offset, "committed_leader_epoch": -1, "committed_metadata": ""}]}]}
    answer = raw_request(port, ApiKey.TXN_OFFSET_COMMIT, 5 if version == 2 else 3, body)
    assert answer["topics"][0]["partitions"][0]["error_code"] == ErrorCode.NONE, answer


def end(port: int, pid: int, epoch: int, commit: bool, version: int = 1) -> int:
    return end_answer(port, pid, epoch, commit, version)["error_code"]


def end_answer(port: int, pid: int, epoch: int, commit: bool, version: int = 1) -> dict:
    """EndTxn (v5 with transaction version 2: the answer names the next epoch)."""
    body = {"transactional_id": TRANSACTIONAL_ID, "producer_id": pid, "producer_epoch": epoch, "committed": commit}
    return raw_request(port, ApiKey.END_TXN, 5 if version == 2 else 3, body)


def committed_offset(port: int) -> int:
    fetched = raw_request(port, ApiKey.OFFSET_FETCH, 7, {"group_id": GROUP, "topics": None, "require_stable": True})
    offsets = {(t["name"], p["partition_index"]): p["committed_offset"] for t in fetched["topics"] for p in t["partitions"]}
    return offsets.get((TOPIC, 0), -1)


def ends(port: int) -> tuple[int, int]:
    """(last stable offset, log end offset) of the topic's partition 0."""
    def listed(isolation):
        body = {"replica_id": -1, "isolation_level": isolation, "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": -1}]}]}
        return raw_request(port, ApiKey.LIST_OFFSETS, 4, body)["topics"][0]["partitions"][0]["offset"]

    return listed(1), listed(0)


def segments(data_dir: str, topic: str) -> list[str]:
    return glob.glob(os.path.join(data_dir, f"{topic}-*", "*.log"))


def power_back_on(broker, journal: str) -> None:
    """After the broker died (SIGKILL or a crash point): lose every byte of
    every segment that no fsync covered, then start it without crash points,
    in a new boot of the machine (``faults.disk.after_power_cut``)."""
    lose_unsynced(journal, glob.glob(os.path.join(broker.data_dir, "*", "*.log")))
    broker.env = after_power_cut()
    broker.start()


def cut_power(broker, journal: str, topic: str) -> None:
    """SIGKILL, then lose every byte of ``topic``'s segments that no fsync
    covered (the others stay as written). The broker's next start must be
    told it runs in a new boot (``after_power_cut``), as after a real cut."""
    broker.kill()
    lose_unsynced(journal, segments(broker.data_dir, topic))


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("answered", ["produce", "txn_offset_commit"])
def test_an_answered_produce_or_offset_commit_whose_add_record_a_power_cut_lost_is_never_committed_without_it(broker_process, tmp_path, answered, version):
    """AddPartitions/AddOffsets answered, then the Produce (or TxnOffsetCommit)
    answered once its own data is durable, the transaction's record not
    yet: a power cut that loses every byte no fsync covered, of every file,
    takes that record back and keeps the batch. At start the broker aborts
    the batch and the producer's transaction (the id was Empty at that
    epoch): the commit is told UNKNOWN_PRODUCER_ID, never NONE, and
    nothing of the transaction is ever visible."""
    journal = str(tmp_path / "fsyncs.journal")
    broker = broker_process(env={FSYNC_JOURNAL_VARIABLE: journal})
    create_topic(broker.bootstrap, TOPIC, 1)
    pid, epoch = init(broker.port)
    if answered == "produce":
        add_partition(broker.port, pid, epoch, version)
        assert produce(broker.port, pid, epoch, 0, b"answered", acks=-1, version=version) == ErrorCode.NONE
    else:
        add_offsets_and_commit_them(broker.port, pid, epoch, 42, version)
    assert unsynced(journal, broker.data_dir, "__transaction_state"), "answered before the transaction's record was durable"
    broker.kill()
    power_back_on(broker, journal)

    answer = wait_for(lambda: _settled(end_answer(broker.port, pid, epoch, commit=True, version=version)), 10, "the EndTxn's answer")
    assert answer["error_code"] == ErrorCode.UNKNOWN_PRODUCER_ID, answer
    commit_next(broker.port, *abort_and_bump(broker.port, pid, epoch, version), version)
    assert read_values(broker.bootstrap, TOPIC, partitions=1, expect=1) == [b"next"]
    assert committed_offset(broker.port) == -1


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("check", ["on", "off", "sigkill only"])
def test_a_batch_whose_add_partitions_record_a_power_cut_lost_is_aborted_at_start_never_committed_later(broker_process, tmp_path, check, version):
    """AddPartitions answered (its record appended, not fsynced), then a
    transactional batch appended and fsynced (acks=1: answered without
    waiting for the transaction's record), then a power cut that loses
    the unsynced ``__transaction_state`` bytes. At start the batch is in
    no transaction: the broker aborts it before it serves, so the
    partition's last stable offset reaches its end and the producer's next
    transaction (same id and epoch) commits only its own record. With the
    check off, the batch holds the last stable offset until that next
    transaction commits it with its own: the hazard the check closes.
    After a SIGKILL alone (the page cache keeps the record) the check finds
    the transaction known and leaves it to its producer, who commits it.
    With transaction version 2 the Produce v12 added the partition (the
    same record, lost the same way); the next transaction is still at the
    same epoch (no EndTxn came between), so the epoch bump alone would not
    keep the stray batch out of it: the check at start does. With the check
    on, the producer's transaction is aborted at start too: its commit is
    told UNKNOWN_PRODUCER_ID, and it aborts and goes on."""
    journal = str(tmp_path / "fsyncs.journal")
    broker = broker_process(env={FSYNC_JOURNAL_VARIABLE: journal})
    create_topic(broker.bootstrap, TOPIC, 1)
    pid, epoch = init(broker.port)
    add_partition(broker.port, pid, epoch, version)
    assert produce(broker.port, pid, epoch, 0, b"stray", acks=1, version=version) == ErrorCode.NONE
    [data] = segments(broker.data_dir, TOPIC)
    wait_for(lambda: durable_sizes(journal).get(os.path.realpath(data), 0) == written_length(data), 10, "the batch's fsync")
    state = [path for path in segments(broker.data_dir, "__transaction_state") if written_length(path) > durable_sizes(journal).get(os.path.realpath(path), 0)]
    assert state, "AddPartitionsToTxn's record was answered before any fsync covered it"
    if check == "sigkill only":
        broker.kill()
    else:
        cut_power(broker, journal, "__transaction_state")
    env = {KEEP_UNKNOWN_TRANSACTIONS_VARIABLE: "1"} if check == "off" else None
    broker.env = env if check == "sigkill only" else after_power_cut(env)
    broker.start()

    stable, log_end = ends(broker.port)
    if check == "on":
        assert log_end == 2 and stable == log_end, "the stray batch was aborted (a marker behind it) before the broker served"
    else:
        assert log_end == 1 and stable == 0, "the batch's transaction is still open"
    sequence = 1
    if check == "on":
        # The client that lived through the restart commits: its transaction was aborted at start.
        answer = wait_for(lambda: _settled(end_answer(broker.port, pid, epoch, commit=True, version=version)), 10, "the EndTxn's answer")
        assert answer["error_code"] == ErrorCode.UNKNOWN_PRODUCER_ID, answer
        pid, epoch = abort_and_bump(broker.port, pid, epoch, version)
        sequence = 0
    # The same producer's next transaction, as a client that lived through the restart sends it.
    add_partition(broker.port, pid, epoch, version)
    assert produce(broker.port, pid, epoch, sequence, b"next", acks=-1, version=version) == ErrorCode.NONE
    assert end(broker.port, pid, epoch, commit=True, version=version) == ErrorCode.NONE
    visible = read_values(broker.bootstrap, TOPIC, partitions=1, expect=1 if check == "on" else 2)
    if check == "on":
        assert visible == [b"next"], "the stray batch is never committed"
    elif check == "off":
        assert visible == [b"stray", b"next"], "without the check the next transaction commits the stray batch"
    else:
        assert visible == [b"stray", b"next"], "a transaction the state still names is its producer's to end"


def abort_and_bump(port: int, pid: int, epoch: int, version: int) -> tuple[int, int]:
    """What a client told UNKNOWN_PRODUCER_ID does: abort, then go on at a
    new epoch (version 1: KIP-360's InitProducerId from the old epoch;
    version 2: the epoch the abort's answer names). The new (pid, epoch)."""
    aborted = end_answer(port, pid, epoch, commit=False, version=version)
    assert aborted["error_code"] == ErrorCode.NONE, aborted
    if version == 2:
        return aborted["producer_id"], aborted["producer_epoch"]
    bumped = raw_request(port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": TRANSACTIONAL_ID, "transaction_timeout_ms": 60_000, "producer_id": pid, "producer_epoch": epoch})
    assert bumped["error_code"] == ErrorCode.NONE, bumped
    return bumped["producer_id"], bumped["producer_epoch"]


def commit_next(port: int, pid: int, epoch: int, version: int) -> None:
    """The producer's next transaction: one record, b"next", committed."""
    add_partition(port, pid, epoch, version)
    assert produce(port, pid, epoch, 0, b"next", acks=-1, version=version) == ErrorCode.NONE
    assert end(port, pid, epoch, commit=True, version=version) == ErrorCode.NONE


# An id whose __transaction_state partition is TRANSACTIONAL_ID's
# (``coordinator.txn_log.partition_for``): its InitProducerId's round makes
# every record appended to that log so far durable.
NEIGHBOUR = "neighbour-27"


@pytest.mark.slow
@pytest.mark.parametrize(("version", "point", "rule"), [
    (1, "complete", "on"), (2, "complete", "on"), (1, "fewer partitions", "on"), (2, "fewer partitions", "on"), (1, "offsets", "on"), (2, "offsets", "on"),
    (1, "complete", "off"), (1, "fewer partitions", "off"), (2, "fewer partitions", "off"), (1, "offsets", "off"),
])
def test_a_durable_batch_whose_add_record_a_cut_took_back_ends_its_producers_transaction(broker_process, tmp_path, version, point, rule):
    """The default durability: a transactional Produce (TxnOffsetCommit) is
    answered once its own data is durable, its AddPartitions (AddOffsets)
    record not yet. After transaction 1 commits, transaction 2 has a batch
    answered, and a power cut takes back the unsynced bytes of
    ``__transaction_state``: the state is back at transaction 1's end at
    the same epoch (``complete``, ``offsets``: the batch is the offsets
    commit's records), or Ongoing without the partition added last
    (``fewer partitions``: the first partition's record was made durable by
    a neighbour's round). At start the broker aborts the batch (no
    transaction names it) and the transaction its producer began at that
    epoch, with a bump: the client's EndTxn(commit) is told
    UNKNOWN_PRODUCER_ID, it aborts and goes on, and nothing of transaction
    2 is ever visible. With that rule off
    (``ONCEFLOW_KEEP_PRODUCER_OF_UNKNOWN_TRANSACTIONS=1``) the commit is
    told NONE: version 1's taken for a retry of transaction 1's, or either
    version's committing the partition kept without the one lost."""
    journal = str(tmp_path / "fsyncs.journal")
    broker = broker_process(env={FSYNC_JOURNAL_VARIABLE: journal})
    create_topic(broker.bootstrap, TOPIC, 2)
    pid, epoch = init(broker.port)
    add_partition(broker.port, pid, epoch, version)
    assert produce(broker.port, pid, epoch, 0, b"first", acks=-1, version=version) == ErrorCode.NONE
    first = end_answer(broker.port, pid, epoch, commit=True, version=version)
    assert first["error_code"] == ErrorCode.NONE, first
    if version == 2:
        epoch = first["producer_epoch"]
    sequence = 1 if version == 1 else 0
    told_committed = [b"first"]
    if point == "fewer partitions":
        add_partition(broker.port, pid, epoch, version)
        assert produce(broker.port, pid, epoch, sequence, b"kept", acks=-1, version=version) == ErrorCode.NONE
        neighbour = raw_request(broker.port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": NEIGHBOUR, "transaction_timeout_ms": 60_000})
        assert neighbour["error_code"] == ErrorCode.NONE, neighbour
        assert not unsynced(journal, broker.data_dir, "__transaction_state"), "the first partition's record is durable"
        add_partition(broker.port, pid, epoch, version, partition=1)
        assert produce(broker.port, pid, epoch, 0, b"answered", acks=-1, version=version, partition=1) == ErrorCode.NONE
        told_committed.append(b"kept")
    elif point == "complete":
        add_partition(broker.port, pid, epoch, version)
        assert produce(broker.port, pid, epoch, sequence, b"answered", acks=-1, version=version) == ErrorCode.NONE
    else:
        add_offsets_and_commit_them(broker.port, pid, epoch, 42, version)
    assert unsynced(journal, broker.data_dir, "__transaction_state"), "answered before the transaction's record was durable"
    assert not unsynced(journal, broker.data_dir, "__consumer_offsets" if point == "offsets" else TOPIC), "the answered batch is durable"
    cut_power(broker, journal, "__transaction_state")
    broker.env = after_power_cut({KEEP_PRODUCER_OF_UNKNOWN_VARIABLE: "1"} if rule == "off" else None)
    broker.start()

    answer = wait_for(lambda: _settled(end_answer(broker.port, pid, epoch, commit=True, version=version)), 10, "the EndTxn's answer")
    if rule == "off":
        assert answer["error_code"] == ErrorCode.NONE, "the hazard: told committed"
        assert sorted(read_values(broker.bootstrap, TOPIC, partitions=2, expect=len(told_committed))) == sorted(told_committed), "without the answered batch"
        assert committed_offset(broker.port) == -1
        return
    assert answer["error_code"] == ErrorCode.UNKNOWN_PRODUCER_ID, answer
    stable, log_end = ends(broker.port)
    assert stable == log_end, "ended with markers before the broker served"
    commit_next(broker.port, *abort_and_bump(broker.port, pid, epoch, version), version)
    assert sorted(read_values(broker.bootstrap, TOPIC, partitions=2, expect=2)) == [b"first", b"next"]
    assert committed_offset(broker.port) == -1, "the lost transaction's offsets never commit"


@pytest.mark.slow
@pytest.mark.parametrize("crash", ["sigkill after the decision", "power cut after the answer"])
def test_an_end_txn_v5_decision_survives_a_crash_at_its_new_epoch(broker_process, tmp_path, crash):
    """Transaction version 2's EndTxn writes the decision with the next
    epoch. Killed right after that record is durable (SIGKILL at the crash
    point, no answer sent), or cut after the answer (power-cut model: every
    byte no fsync covered lost): at start recovery writes the markers at the
    new epoch, so the record is committed; the client's retry of EndTxn from
    the old epoch is answered with the same new epoch (recognized from the
    reloaded record); the next transaction runs at it, and a late Produce
    of the old epoch is refused."""
    journal = str(tmp_path / "fsyncs.journal")
    env = {FSYNC_JOURNAL_VARIABLE: journal}
    if crash == "sigkill after the decision":
        env["ONCEFLOW_CRASH_POINTS"] = "coordinator.after_prepare_commit@1:exit"
    broker = broker_process(env=env)
    create_topic(broker.bootstrap, TOPIC, 1)
    pid, epoch = init(broker.port)
    assert produce(broker.port, pid, epoch, 0, b"decided", acks=-1, version=2) == ErrorCode.NONE
    if crash == "sigkill after the decision":
        with pytest.raises(OSError):
            end_answer(broker.port, pid, epoch, commit=True, version=2)
        assert broker.wait_exit(30) == 86, "the crash point fired"
    else:
        answer = end_answer(broker.port, pid, epoch, commit=True, version=2)
        assert (answer["error_code"], answer["producer_id"], answer["producer_epoch"]) == (ErrorCode.NONE, pid, epoch + 1)
        broker.kill()
        lose_unsynced(journal, glob.glob(os.path.join(broker.data_dir, "*", "*.log")))
    broker.env = None if crash == "sigkill after the decision" else after_power_cut()
    broker.start()

    assert read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=1) == [b"decided"]
    retried = wait_for(lambda: _settled(end_answer(broker.port, pid, epoch, commit=True, version=2)), 10, "the retried EndTxn's answer")
    assert (retried["error_code"], retried["producer_id"], retried["producer_epoch"]) == (ErrorCode.NONE, pid, epoch + 1)
    assert produce(broker.port, pid, epoch, 1, b"late", acks=-1, version=2) == ErrorCode.INVALID_PRODUCER_EPOCH, "the old epoch is fenced"
    assert produce(broker.port, pid, epoch + 1, 0, b"next", acks=-1, version=2) == ErrorCode.NONE
    assert end(broker.port, pid, epoch + 1, commit=True, version=2) == ErrorCode.NONE
    assert read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=2) == [b"decided", b"next"]


def _settled(answer: dict) -> dict | None:
    """An EndTxn answer once the recovery's completion is over (else None: retry)."""
    return None if answer["error_code"] == ErrorCode.CONCURRENT_TRANSACTIONS else answer


# -- transaction.durable.at.end: a transactional Produce or TxnOffsetCommit is
# answered once appended; EndTxn(commit) makes the data durable before its decision.

DURABLE_AT_END = "transaction.durable.at.end=true"


def unsynced(journal: str, data_dir: str, topic: str) -> bool:
    """Whether some segment of ``topic`` holds bytes no fsync covered."""
    durable = durable_sizes(journal)
    return any(written_length(path) > durable.get(os.path.realpath(path), 0) for path in segments(data_dir, topic))


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("answered", ["produce", "txn_offset_commit"])
def test_a_commit_decision_is_durable_only_with_the_data_it_commits(broker_process, tmp_path, answered, version):
    """The Produce (or TxnOffsetCommit) is answered before any fsync covers
    its bytes; the broker is killed right after EndTxn(commit)'s decision
    is durable, and every byte no fsync covered is lost: the decision's
    round made the data durable too, so recovery completes a commit of the
    whole transaction (without the data in that round, recovery finds the
    data gone and aborts)."""
    journal = str(tmp_path / "fsyncs.journal")
    broker = broker_process(DURABLE_AT_END, env={FSYNC_JOURNAL_VARIABLE: journal, "ONCEFLOW_CRASH_POINTS": "coordinator.after_prepare_commit@1:exit"})
    create_topic(broker.bootstrap, TOPIC, 1)
    pid, epoch = init(broker.port)
    if answered == "produce":
        add_partition(broker.port, pid, epoch, version)
        assert produce(broker.port, pid, epoch, 0, b"answered", acks=-1, version=version) == ErrorCode.NONE
        assert unsynced(journal, broker.data_dir, TOPIC), "answered before its fsync"
    else:
        add_offsets_and_commit_them(broker.port, pid, epoch, 42, version)
        assert unsynced(journal, broker.data_dir, "__consumer_offsets"), "answered before its fsync"
    with pytest.raises(OSError):
        end_answer(broker.port, pid, epoch, commit=True, version=version)
    assert broker.wait_exit(30) == 86, "the crash point fired"
    power_back_on(broker, journal)

    if answered == "produce":
        assert read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=1) == [b"answered"]
    else:
        wait_for(lambda: committed_offset(broker.port) == 42, 10, "the committed offset")


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("rule", ["on", "off", "sigkill only"])
def test_a_transaction_open_at_a_power_cut_is_aborted_at_start_never_committed_with_a_hole(broker_process, tmp_path, rule, version):
    """Two records answered once appended; the first made durable (an
    fsync round of its own), the second not; a power cut loses the second
    and keeps the transaction's record (Ongoing, the partition in it). At
    start the broker aborts the transaction with an epoch bump: the
    client's EndTxn(commit) is told UNKNOWN_PRODUCER_ID (abortable),
    nothing of it is ever visible, and the producer goes on after its
    abort. With the rule off (``ONCEFLOW_KEEP_ONGOING_TRANSACTIONS=1``)
    the commit succeeds and publishes the first record without the second,
    both answered: the hole the rule closes. After a SIGKILL alone, in the
    same boot of the kernel (nothing lost: the page cache holds the second
    record), the transaction stays open and commits both records."""
    journal = str(tmp_path / "fsyncs.journal")
    broker = broker_process(DURABLE_AT_END, env={FSYNC_JOURNAL_VARIABLE: journal})
    create_topic(broker.bootstrap, TOPIC, 1)
    pid, epoch = init(broker.port)
    add_partition(broker.port, pid, epoch, version)
    assert produce(broker.port, pid, epoch, 0, b"first", acks=-1, version=version) == ErrorCode.NONE
    [data] = segments(broker.data_dir, TOPIC)
    # Anyone's round makes the first record durable: a plain record on the same log asks for one.
    plain = encode_batch([(None, b"plain", (), 1_000)])
    raw_request(broker.port, ApiKey.PRODUCE, 8, {"transactional_id": None, "acks": -1, "timeout_ms": 10_000, "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": plain}]}]})
    wait_for(lambda: durable_sizes(journal).get(os.path.realpath(data), 0) == written_length(data), 10, "the first record's fsync")
    assert produce(broker.port, pid, epoch, 1, b"second", acks=-1, version=version) == ErrorCode.NONE
    assert unsynced(journal, broker.data_dir, TOPIC), "the second record was answered before its fsync"
    if rule == "sigkill only":
        broker.kill()
    else:
        cut_power(broker, journal, TOPIC)  # the transaction's record kept (the page cache wrote it back), the second record lost
    if rule == "sigkill only":
        broker.env = None
    else:
        broker.env = after_power_cut({KEEP_ONGOING_TRANSACTIONS_VARIABLE: "1"} if rule == "off" else None)
    broker.start()

    # Retried while the start's abort completes (its markers, then Complete), as clients retry.
    answer = wait_for(lambda: _settled(end_answer(broker.port, pid, epoch, commit=True, version=version)), 10, "the EndTxn's answer")
    if rule == "sigkill only":
        assert answer["error_code"] == ErrorCode.NONE, answer
        visible = read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=3)
        assert visible == [b"first", b"plain", b"second"], "kept open through the process's crash, committed whole"
        return
    if rule == "off":
        assert answer["error_code"] == ErrorCode.NONE
        visible = read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=2)
        assert visible == [b"first", b"plain"], "committed without its second record: a hole"
        return
    assert answer["error_code"] == ErrorCode.UNKNOWN_PRODUCER_ID, answer
    stable, log_end = ends(broker.port)
    assert stable == log_end, "aborted with a marker before the broker served"
    commit_next(broker.port, *abort_and_bump(broker.port, pid, epoch, version), version)
    assert read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=2) == [b"plain", b"next"]


@pytest.mark.slow
@pytest.mark.parametrize(("version", "next_step", "rule", "setting"), [
    (1, "end", "on", "at end"), (2, "end", "on", "at end"), (1, "another partition", "on", "at end"), (2, "another partition", "on", "at end"),
    (1, "end", "off", "at end"), (2, "another partition", "off", "at end"), (1, "end", "on", "default"), (2, "another partition", "on", "default"),
])
def test_a_transaction_a_power_cut_took_back_whole_is_never_answered_as_committed(broker_process, tmp_path, version, next_step, rule, setting):
    """Transaction 1 commits; transaction 2 of the same producer has its
    AddPartitions and its Produce (acks=-1) answered once appended; a power
    cut loses every byte no fsync covered. The state is back at transaction
    1's end (CompleteCommit at the epoch transaction 2 runs at, with
    transaction version 1), and nothing on disk shows that transaction 2
    began. Its client then ends it (``end``) or first sends a record to a
    partition it had not sent to yet (``another partition``): the broker
    fences the epoch at start (``transaction.durable.at.end`` after an
    unclean stop), so the commit is told PRODUCER_FENCED, neither that it
    committed (the retry of transaction 1's EndTxn looks the same) nor that
    it aborted, and a new InitProducerId goes on. With the fence off
    (``ONCEFLOW_KEEP_ENDED_EPOCHS=1``) version 1's EndTxn is answered NONE
    with its answered record gone, and either version commits the other
    partition's record without it: a hole. In the default mode the Produce
    was answered once its batch was durable (the AddPartitions record not
    yet): the start finds the batch in no transaction and aborts it and its
    producer's transaction, so the commit is told UNKNOWN_PRODUCER_ID
    (abortable), and the producer aborts and goes on."""
    journal = str(tmp_path / "fsyncs.journal")
    settings = [DURABLE_AT_END] if setting == "at end" else []
    broker = broker_process(*settings, env={FSYNC_JOURNAL_VARIABLE: journal})
    create_topic(broker.bootstrap, TOPIC, 2)
    pid, epoch = init(broker.port)
    add_partition(broker.port, pid, epoch, version)
    assert produce(broker.port, pid, epoch, 0, b"first", acks=-1, version=version) == ErrorCode.NONE
    first = end_answer(broker.port, pid, epoch, commit=True, version=version)
    assert first["error_code"] == ErrorCode.NONE, first
    if version == 2:
        epoch = first["producer_epoch"]
    wait_for(lambda: not unsynced(journal, broker.data_dir, TOPIC), 10, "the first commit's marker's fsync")
    add_partition(broker.port, pid, epoch, version)
    assert produce(broker.port, pid, epoch, 1 if version == 1 else 0, b"answered", acks=-1, version=version) == ErrorCode.NONE
    assert unsynced(journal, broker.data_dir, "__transaction_state"), "AddPartitions answered before any fsync"
    assert unsynced(journal, broker.data_dir, TOPIC) == (setting == "at end"), "answered before any fsync, or once its batch was durable"
    broker.kill()
    lose_unsynced(journal, glob.glob(os.path.join(broker.data_dir, "*", "*.log")))
    broker.env = after_power_cut({KEEP_ENDED_EPOCHS_VARIABLE: "1"} if rule == "off" else None)
    broker.start()

    expected = [b"first"]
    if next_step == "another partition":
        # The client goes on with its transaction: a record to a partition it had not sent to yet.
        sent = wait_for(lambda: _settled({"error_code": add_partition_answer(broker.port, pid, epoch, version, partition=1)}), 10, "AddPartitions' answer")
        if sent["error_code"] == ErrorCode.NONE:
            sent = {"error_code": produce(broker.port, pid, epoch, 0, b"other", acks=-1, version=version, partition=1)}
        if rule == "on":
            assert sent["error_code"] != ErrorCode.NONE, "the epoch is fenced, or its transaction was aborted at start"
        else:
            assert sent["error_code"] == ErrorCode.NONE, sent
            expected.append(b"other")
    answer = wait_for(lambda: _settled(end_answer(broker.port, pid, epoch, commit=True, version=version)), 10, "the EndTxn's answer")
    if rule == "off":
        assert answer["error_code"] == ErrorCode.NONE, "the hazard: told committed"
        assert sorted(read_values(broker.bootstrap, TOPIC, partitions=2, expect=len(expected))) == sorted(expected), "without the answered record"
        return
    if setting == "default":
        assert answer["error_code"] == ErrorCode.UNKNOWN_PRODUCER_ID, answer
        pid, epoch = abort_and_bump(broker.port, pid, epoch, version)
    else:
        assert answer["error_code"] == ErrorCode.PRODUCER_FENCED, answer
        bump = {"transactional_id": TRANSACTIONAL_ID, "transaction_timeout_ms": 60_000, "producer_id": pid, "producer_epoch": epoch}
        assert raw_request(broker.port, ApiKey.INIT_PRODUCER_ID, 4, bump)["error_code"] == ErrorCode.PRODUCER_FENCED, "the fenced epoch cannot bump back in"
        pid, epoch = init(broker.port)  # a new instance of the producer goes on
    add_partition(broker.port, pid, epoch, version)
    assert produce(broker.port, pid, epoch, 0, b"next", acks=-1, version=version) == ErrorCode.NONE
    assert end(broker.port, pid, epoch, commit=True, version=version) == ErrorCode.NONE
    assert read_values(broker.bootstrap, TOPIC, partitions=2, expect=2) == [b"first", b"next"]


@pytest.mark.slow
def test_librdkafka_goes_on_after_its_transaction_was_aborted_at_start(broker_process, tmp_path):
    """librdkafka (classic protocol) had its records answered once appended;
    a power cut loses them and the broker aborts the open transaction at
    start. Its commit fails with an abortable error (not a fatal one), the
    abort bumps the epoch (KIP-360), and its next transaction commits."""
    from confluent_kafka import KafkaException, Producer

    journal = str(tmp_path / "fsyncs.journal")
    broker = broker_process(DURABLE_AT_END, env={FSYNC_JOURNAL_VARIABLE: journal})
    create_topic(broker.bootstrap, TOPIC, 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "cut-librdkafka", "linger.ms": 1})
    producer.init_transactions(10)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(TOPIC, value=b"lost-%d" % i, partition=0)
    assert producer.flush(10) == 0, "answered"
    assert unsynced(journal, broker.data_dir, TOPIC), "answered before any fsync"
    cut_power(broker, journal, TOPIC)
    broker.env = after_power_cut()
    broker.start()

    with pytest.raises(KafkaException) as failed:
        producer.commit_transaction(30)
    error = failed.value.args[0]
    assert error.txn_requires_abort() and not error.fatal(), error
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(TOPIC, value=b"next", partition=0)
    producer.commit_transaction(30)
    assert read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=1) == [b"next"]


@pytest.mark.slow
def test_librdkafka_and_our_producer_go_on_after_a_cut_took_back_their_add_partitions_record(broker_process, tmp_path):
    """The default durability: librdkafka's and our producer's (both
    versions) records are answered once durable, their AddPartitions
    record not yet; a power cut takes that record back and keeps the
    records. At start the broker aborts the records and each producer's
    transaction: a record librdkafka sends then is refused with
    UNKNOWN_PRODUCER_ID, each commit fails with an abortable error, the
    abort bumps the epoch, and the next transaction commits."""
    import asyncio

    from confluent_kafka import KafkaError, KafkaException, Producer

    from txn.errors import TransactionAbortableError
    from txn.producer import AsyncProducer

    journal = str(tmp_path / "fsyncs.journal")
    broker = broker_process(env={FSYNC_JOURNAL_VARIABLE: journal})
    create_topic(broker.bootstrap, TOPIC, 1)
    rd = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "cut-librdkafka", "linger.ms": 1})
    rd.init_transactions(10)
    rd.begin_transaction()
    rd.produce(TOPIC, value=b"lost-librdkafka", partition=0)
    assert rd.flush(10) == 0, "answered"
    loop = asyncio.new_event_loop()

    async def opened():
        ours = {}
        for version in (1, 2):
            producer = ours[version] = AsyncProducer(broker.bootstrap, transactional_id=f"ours-v{version}", linger_ms=0, transaction_version=version)
            await producer.init_transactions()
            producer.begin_transaction()
            await producer.send(TOPIC, b"lost-ours-%d" % version, partition=0)
            await producer.flush()
        return ours

    ours = loop.run_until_complete(opened())
    assert unsynced(journal, broker.data_dir, "__transaction_state") and not unsynced(journal, broker.data_dir, TOPIC)
    cut_power(broker, journal, "__transaction_state")
    broker.env = after_power_cut()
    broker.start()

    # librdkafka sends one more record first: refused as its transaction was (abortable).
    refused = []
    rd.produce(TOPIC, value=b"late-librdkafka", partition=0, on_delivery=lambda error, _message: refused.append(error))
    rd.flush(15)
    assert [error.code() for error in refused] == [KafkaError.UNKNOWN_PRODUCER_ID], refused
    with pytest.raises(KafkaException) as failed:
        rd.commit_transaction(30)
    error = failed.value.args[0]
    assert error.txn_requires_abort() and not error.fatal(), error
    rd.abort_transaction(30)
    rd.begin_transaction()
    rd.produce(TOPIC, value=b"next-librdkafka", partition=0)
    rd.commit_transaction(30)

    async def go_on():
        for version, producer in ours.items():
            with pytest.raises(TransactionAbortableError):
                await producer.commit_transaction()
            await producer.abort_transaction()
            producer.begin_transaction()
            await producer.send(TOPIC, b"next-ours-%d" % version, partition=0)
            await producer.commit_transaction()
            await producer.close()

    loop.run_until_complete(go_on())
    loop.close()
    visible = read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=3)
    assert sorted(visible) == [b"next-librdkafka", b"next-ours-1", b"next-ours-2"]


async def commit_as_a_new_aiokafka(dead, bootstrap: str) -> None:
    """Stop an aiokafka producer that met a fatal error and commit
    ``next-aiokafka`` through a new instance with the same transactional id."""
    from aiokafka import AIOKafkaProducer

    try:
        await dead.stop()
    except Exception:
        pass  # its sender routine died with the fatal error
    fresh = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="aiokafka")
    await fresh.start()
    await fresh.begin_transaction()
    await fresh.send_and_wait(TOPIC, b"next-aiokafka", partition=0)
    await fresh.commit_transaction()
    await fresh.stop()


@pytest.mark.slow
def test_the_python_clients_go_on_after_a_produce_from_the_epoch_aborted_at_start(broker_process, tmp_path):
    """The default durability: kafka-python's and aiokafka's records are
    answered once durable, their AddPartitions record not yet; a power cut
    takes that record back. At start the broker aborts the records and each
    producer's transaction with an epoch bump, and the next record either
    sends in that transaction is refused with UNKNOWN_PRODUCER_ID.
    kafka-python bumps its epoch itself (KIP-360) and commits its next
    transaction; aiokafka treats the error as fatal, and a new instance
    with the same id commits. Nothing of the transaction the cut broke is
    ever visible."""
    import asyncio

    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import UnknownProducerId
    from kafka import KafkaProducer
    from kafka.errors import KafkaError, UnknownProducerIdError

    journal = str(tmp_path / "fsyncs.journal")
    broker = broker_process(env={FSYNC_JOURNAL_VARIABLE: journal})
    create_topic(broker.bootstrap, TOPIC, 1)
    loop = asyncio.new_event_loop()

    async def opened():
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="aiokafka")
        await producer.start()
        await producer.begin_transaction()
        await producer.send_and_wait(TOPIC, b"lost-aiokafka", partition=0)
        return producer

    aiokafka = loop.run_until_complete(opened())
    kafka_python = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kafka-python")
    kafka_python.init_transactions()
    kafka_python.begin_transaction()
    kafka_python.send(TOPIC, b"lost-kafka-python", partition=0)
    kafka_python.flush()
    assert unsynced(journal, broker.data_dir, "__transaction_state") and not unsynced(journal, broker.data_dir, TOPIC)
    cut_power(broker, journal, "__transaction_state")
    broker.env = after_power_cut()
    broker.start()

    async def aiokafka_goes_on():
        with pytest.raises(UnknownProducerId):
            await aiokafka.send_and_wait(TOPIC, b"refused-aiokafka", partition=0)
        with pytest.raises(Exception):
            await aiokafka.commit_transaction()  # fatal: the instance cannot go on
        await commit_as_a_new_aiokafka(aiokafka, broker.bootstrap)

    loop.run_until_complete(aiokafka_goes_on())
    loop.close()
    with pytest.raises(UnknownProducerIdError):
        kafka_python.send(TOPIC, b"refused-kafka-python", partition=0).get(timeout=10)

    def began() -> bool:
        try:
            kafka_python.begin_transaction()  # possible once its own epoch bump is done
        except KafkaError:
            return False
        return True

    wait_for(began, 10, "kafka-python's epoch bump")
    kafka_python.send(TOPIC, b"next-kafka-python", partition=0)
    kafka_python.commit_transaction()
    kafka_python.close(timeout=5)
    visible = read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=2)
    assert sorted(visible) == [b"next-aiokafka", b"next-kafka-python"]


@pytest.mark.slow
def test_our_producer_and_the_python_clients_after_their_transaction_was_aborted_at_start(broker_process, tmp_path):
    """Each client had its records answered once appended, then a power cut
    lost them and the broker aborted the open transactions at start. Our
    producer (both transaction versions) is told its commit is abortable,
    aborts and commits its next transaction. kafka-python and aiokafka
    treat every EndTxn error but a retriable one as fatal (as after a
    Kafka transaction timeout): the instance is done, and a new one with
    the same id commits."""
    import asyncio

    from aiokafka import AIOKafkaProducer
    from kafka import KafkaProducer

    from txn.errors import TransactionAbortableError
    from txn.producer import AsyncProducer

    journal = str(tmp_path / "fsyncs.journal")
    broker = broker_process(DURABLE_AT_END, env={FSYNC_JOURNAL_VARIABLE: journal})
    create_topic(broker.bootstrap, TOPIC, 1)

    async def opened():
        ours = {}
        for version in (1, 2):
            producer = ours[version] = AsyncProducer(broker.bootstrap, transactional_id=f"ours-v{version}", linger_ms=0, transaction_version=version)
            await producer.init_transactions()
            producer.begin_transaction()
            await producer.send(TOPIC, b"lost-ours-%d" % version, partition=0)
            await producer.flush()
        theirs = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="aiokafka")
        await theirs.start()
        await theirs.begin_transaction()
        await theirs.send_and_wait(TOPIC, b"lost-aiokafka", partition=0)
        return ours, theirs

    loop = asyncio.new_event_loop()
    ours, aiokafka = loop.run_until_complete(opened())
    kafka_python = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kafka-python")
    kafka_python.init_transactions()
    kafka_python.begin_transaction()
    kafka_python.send(TOPIC, b"lost-kafka-python", partition=0)
    kafka_python.flush()
    assert unsynced(journal, broker.data_dir, TOPIC), "answered before any fsync"
    cut_power(broker, journal, TOPIC)
    broker.env = after_power_cut()
    broker.start()

    async def go_on():
        for version, producer in ours.items():
            with pytest.raises(TransactionAbortableError):
                await producer.commit_transaction()
            await producer.abort_transaction()
            producer.begin_transaction()
            await producer.send(TOPIC, b"next-ours-%d" % version, partition=0)
            await producer.commit_transaction()
            await producer.close()
        with pytest.raises(Exception):
            await aiokafka.commit_transaction()
        with pytest.raises(Exception):
            await aiokafka.begin_transaction()  # fatal: the instance cannot go on
        await commit_as_a_new_aiokafka(aiokafka, broker.bootstrap)

    loop.run_until_complete(go_on())
    loop.close()
    with pytest.raises(Exception, match="UnknownProducerId"):
        kafka_python.commit_transaction()
    with pytest.raises(Exception, match="error state"):
        kafka_python.begin_transaction()
    kafka_python.close(timeout=1)
    fresh = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kafka-python")
    fresh.init_transactions()
    fresh.begin_transaction()
    fresh.send(TOPIC, b"next-kafka-python", partition=0)
    fresh.commit_transaction()
    fresh.close(timeout=5)
    visible = read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=4)
    assert sorted(visible) == [b"next-aiokafka", b"next-kafka-python", b"next-ours-1", b"next-ours-2"]


@pytest.mark.slow
def test_every_client_fenced_at_start_goes_on_with_a_new_instance(broker_process, tmp_path):
    """librdkafka, kafka-python, aiokafka and our producer (both
    transaction versions) each commit a transaction, then have a next one's
    record answered once appended; a power cut takes that transaction back
    whole, and the broker fences every ended id's epoch at start. Each
    client's commit fails, and none is told it committed: our producer
    raises ProducerFencedError, the others a fatal error. A new instance
    with the same transactional id (a new InitProducerId) commits, and
    nothing of the lost transactions is ever visible."""
    import asyncio

    from aiokafka import AIOKafkaProducer
    from confluent_kafka import KafkaException, Producer
    from kafka import KafkaProducer

    from txn.errors import ProducerFencedError
    from txn.producer import AsyncProducer

    journal = str(tmp_path / "fsyncs.journal")
    broker = broker_process(DURABLE_AT_END, env={FSYNC_JOURNAL_VARIABLE: journal})
    create_topic(broker.bootstrap, TOPIC, 1)
    loop = asyncio.new_event_loop()

    def ours(version):
        return AsyncProducer(broker.bootstrap, transactional_id=f"ours-v{version}", linger_ms=0, transaction_version=version)

    async def ours_commit(producer, value, *, init=True):
        if init:
            await producer.init_transactions()
        producer.begin_transaction()
        await producer.send(TOPIC, value, partition=0)
        await producer.commit_transaction()

    async def aiokafka_commit(producer, value):
        await producer.begin_transaction()
        await producer.send_and_wait(TOPIC, value, partition=0)
        await producer.commit_transaction()

    def librdkafka_commit(producer, value):
        producer.begin_transaction()
        producer.produce(TOPIC, value=value, partition=0)
        producer.commit_transaction(30)

    def kafka_python_commit(producer, value):
        producer.begin_transaction()
        producer.send(TOPIC, value, partition=0)
        producer.commit_transaction()

    def librdkafka():
        producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "librdkafka", "linger.ms": 1})
        producer.init_transactions(10)
        return producer

    def kafka_python():
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kafka-python")
        producer.init_transactions()
        return producer

    async def aiokafka():
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="aiokafka")
        await producer.start()
        return producer

    # Transaction 1 of each, committed; then transaction 2 of each, answered once appended.
    mine = {version: ours(version) for version in (1, 2)}
    for version, producer in mine.items():
        loop.run_until_complete(ours_commit(producer, b"first-ours-%d" % version))
    rd, kp, aio = librdkafka(), kafka_python(), loop.run_until_complete(aiokafka())
    librdkafka_commit(rd, b"first-librdkafka")
    kafka_python_commit(kp, b"first-kafka-python")
    loop.run_until_complete(aiokafka_commit(aio, b"first-aiokafka"))
    wait_for(lambda: not unsynced(journal, broker.data_dir, TOPIC), 10, "the first commits' markers' fsyncs")

    async def ours_second():
        for version, producer in mine.items():
            producer.begin_transaction()
            await producer.send(TOPIC, b"lost-ours-%d" % version, partition=0)
            await producer.flush()
        await aio.begin_transaction()
        await aio.send_and_wait(TOPIC, b"lost-aiokafka", partition=0)

    loop.run_until_complete(ours_second())
    rd.begin_transaction()
    rd.produce(TOPIC, value=b"lost-librdkafka", partition=0)
    assert rd.flush(10) == 0
    kp.begin_transaction()
    kp.send(TOPIC, b"lost-kafka-python", partition=0)
    kp.flush()
    assert unsynced(journal, broker.data_dir, TOPIC) and unsynced(journal, broker.data_dir, "__transaction_state"), "answered before any fsync"
    broker.kill()
    lose_unsynced(journal, glob.glob(os.path.join(broker.data_dir, "*", "*.log")))
    broker.env = after_power_cut()
    broker.start()

    async def ours_go_on():
        for version, producer in mine.items():
            with pytest.raises(ProducerFencedError):
                await producer.commit_transaction()
            await producer.close()
            fresh = ours(version)
            await ours_commit(fresh, b"next-ours-%d" % version)
            await fresh.close()
        with pytest.raises(Exception):
            await aio.commit_transaction()
        try:
            await aio.stop()
        except Exception:
            pass  # its sender routine died with the fatal error
        fresh = await aiokafka()
        await aiokafka_commit(fresh, b"next-aiokafka")
        await fresh.stop()

    loop.run_until_complete(ours_go_on())
    loop.close()
    with pytest.raises(KafkaException) as failed:
        rd.commit_transaction(30)
    assert failed.value.args[0].fatal(), failed.value.args[0]
    librdkafka_commit(librdkafka(), b"next-librdkafka")
    with pytest.raises(Exception, match="ProducerFenced"):
        kp.commit_transaction()
    kp.close(timeout=1)
    fresh = kafka_python()
    kafka_python_commit(fresh, b"next-kafka-python")
    fresh.close(timeout=5)
    clients = [b"ours-1", b"ours-2", b"librdkafka", b"kafka-python", b"aiokafka"]
    expected = sorted([b"first-" + c for c in clients] + [b"next-" + c for c in clients])
    assert sorted(read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=len(expected))) == expected


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("crash", ["power cut", "sigkill only"])
def test_a_decided_commit_whose_data_a_cut_took_back_is_aborted_at_start(broker_process, tmp_path, version, crash):
    """EndTxn(commit)'s decision and the data it commits share one fsync
    round. Killed once the decision is appended, before that round, with a
    cut that keeps the decision (the page cache wrote it back) and loses
    the data: recovery finds a log short of the end the decision names and
    aborts instead of committing a hole. The client was never answered; its
    retried commit is told UNKNOWN_PRODUCER_ID (abortable), and after its
    abort its next transaction commits. (Without the check recovery
    commits the transaction with its record gone: checked by hand.) After
    a SIGKILL alone the page cache kept the data: recovery finds it whole
    and completes the commit, and the retry is told it succeeded."""
    journal = str(tmp_path / "fsyncs.journal")
    broker = broker_process(DURABLE_AT_END, env={FSYNC_JOURNAL_VARIABLE: journal, "ONCEFLOW_CRASH_POINTS": "coordinator.decision_appended@1:exit"})
    create_topic(broker.bootstrap, TOPIC, 1)
    pid, epoch = init(broker.port)
    add_partition(broker.port, pid, epoch, version)
    assert produce(broker.port, pid, epoch, 0, b"taken back", acks=-1, version=version) == ErrorCode.NONE
    with pytest.raises(OSError):
        end_answer(broker.port, pid, epoch, commit=True, version=version)
    assert broker.wait_exit(30) == 86, "the crash point fired"
    assert unsynced(journal, broker.data_dir, "__transaction_state") and unsynced(journal, broker.data_dir, TOPIC)
    if crash == "power cut":
        lose_unsynced(journal, segments(broker.data_dir, TOPIC))
    broker.env = after_power_cut() if crash == "power cut" else None
    broker.start()

    retried = wait_for(lambda: _settled(end_answer(broker.port, pid, epoch, commit=True, version=version)), 10, "the retried EndTxn's answer")
    if crash == "sigkill only":
        assert retried["error_code"] == ErrorCode.NONE, retried
        assert read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=1) == [b"taken back"]
        return
    assert retried["error_code"] == ErrorCode.UNKNOWN_PRODUCER_ID, retried
    commit_next(broker.port, *abort_and_bump(broker.port, pid, epoch, version), version)
    assert read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=1) == [b"next"]


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2])
def test_a_decision_written_with_durability_at_the_end_is_checked_by_a_start_with_it_off(broker_process, tmp_path, version):
    """The decision is written with ``transaction.durable.at.end`` (its
    data answered once appended: the first record made durable by another
    round, the second not), the broker is killed once the decision is
    appended, and the power cut keeps the decision and loses the second
    record. The broker then starts with the setting off (an operator
    changed it across the stop): the decision names where the producer's
    data ends, and the log falls short of it, so the commit is aborted
    (never answered), not completed over the hole. (Before, the check ran
    only with the setting on: the retried commit was told NONE and the
    first record published without the second.)"""
    journal = str(tmp_path / "fsyncs.journal")
    broker = broker_process(DURABLE_AT_END, env={FSYNC_JOURNAL_VARIABLE: journal, "ONCEFLOW_CRASH_POINTS": "coordinator.decision_appended@1:exit"})
    create_topic(broker.bootstrap, TOPIC, 1)
    pid, epoch = init(broker.port)
    add_partition(broker.port, pid, epoch, version)
    assert produce(broker.port, pid, epoch, 0, b"first", acks=-1, version=version) == ErrorCode.NONE
    [data] = segments(broker.data_dir, TOPIC)
    plain = encode_batch([(None, b"plain", (), 1_000)])
    raw_request(broker.port, ApiKey.PRODUCE, 8, {"transactional_id": None, "acks": -1, "timeout_ms": 10_000, "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": plain}]}]})
    wait_for(lambda: durable_sizes(journal).get(os.path.realpath(data), 0) == written_length(data), 10, "the first record's fsync")
    assert produce(broker.port, pid, epoch, 1, b"second", acks=-1, version=version) == ErrorCode.NONE
    with pytest.raises(OSError):
        end_answer(broker.port, pid, epoch, commit=True, version=version)
    assert broker.wait_exit(30) == 86, "the crash point fired"
    assert unsynced(journal, broker.data_dir, "__transaction_state") and unsynced(journal, broker.data_dir, TOPIC)
    lose_unsynced(journal, segments(broker.data_dir, TOPIC))  # the decision kept (the page cache wrote it back), the second record lost
    broker.config = tuple(item for item in broker.config if item != DURABLE_AT_END)
    broker.env = after_power_cut()
    broker.start()

    retried = wait_for(lambda: _settled(end_answer(broker.port, pid, epoch, commit=True, version=version)), 10, "the retried EndTxn's answer")
    assert retried["error_code"] == ErrorCode.UNKNOWN_PRODUCER_ID, retried
    stable, log_end = ends(broker.port)
    assert stable == log_end, "aborted with a marker before the broker served"
    assert read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=1) == [b"plain"]
    commit_next(broker.port, *abort_and_bump(broker.port, pid, epoch, version), version)
    assert read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=2) == [b"plain", b"next"]


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2])
def test_offsets_decided_with_durability_at_the_end_are_checked_by_a_start_with_it_off(broker_process, tmp_path, version):
    """The same with the transaction's offsets: its TxnOffsetCommit was
    answered once appended, the decision names where the producer's
    offsets records end in ``__consumer_offsets``, and the cut keeps the
    decision and loses them. Started with the setting off, the broker
    aborts the commit: the retried commit is told UNKNOWN_PRODUCER_ID, not
    NONE with no offset committed (before: NONE, and no offset)."""
    journal = str(tmp_path / "fsyncs.journal")
    broker = broker_process(DURABLE_AT_END, env={FSYNC_JOURNAL_VARIABLE: journal, "ONCEFLOW_CRASH_POINTS": "coordinator.decision_appended@1:exit"})
    create_topic(broker.bootstrap, TOPIC, 1)
    pid, epoch = init(broker.port)
    add_offsets_and_commit_them(broker.port, pid, epoch, 42, version)
    assert unsynced(journal, broker.data_dir, "__consumer_offsets"), "answered before its fsync"
    with pytest.raises(OSError):
        end_answer(broker.port, pid, epoch, commit=True, version=version)
    assert broker.wait_exit(30) == 86, "the crash point fired"
    lose_unsynced(journal, segments(broker.data_dir, "__consumer_offsets"))  # the decision kept, the offsets record lost
    broker.config = tuple(item for item in broker.config if item != DURABLE_AT_END)
    broker.env = after_power_cut()
    broker.start()

    retried = wait_for(lambda: _settled(end_answer(broker.port, pid, epoch, commit=True, version=version)), 10, "the retried EndTxn's answer")
    assert retried["error_code"] == ErrorCode.UNKNOWN_PRODUCER_ID, retried
    assert committed_offset(broker.port) == -1


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2])
def test_a_commit_decided_by_default_survives_a_cut_of_another_producers_bytes_past_its_data(broker_process, tmp_path, version):
    """With the default durability the transaction's record is answered
    once durable; then another producer's record (acks=1) lands past it in
    the same log and is not made durable yet (the topic's
    ``flush.interval.ms`` holds the log's next round). EndTxn(commit) is
    answered, and a power cut takes back every byte no fsync covered: the
    other record, the commit's marker and its Complete, keeping the
    durable decision. The log now ends below where it ended at the
    decision, but not below the producer's data, which is what the
    decision names: the start completes the answered commit (a decision
    naming the log's end, checked, is aborted here: an answered commit
    lost)."""
    journal = str(tmp_path / "fsyncs.journal")
    broker = broker_process(env={FSYNC_JOURNAL_VARIABLE: journal})
    recreate_topics(broker.bootstrap, {TOPIC: 1}, configs={TOPIC: {"flush.interval.ms": "600000"}})
    pid, epoch = init(broker.port)
    add_partition(broker.port, pid, epoch, version)
    assert produce(broker.port, pid, epoch, 0, b"answered", acks=-1, version=version) == ErrorCode.NONE  # the log's first round: at once
    assert not unsynced(journal, broker.data_dir, TOPIC), "answered once durable"
    plain = encode_batch([(None, b"not durable", (), 1_000)])
    answer = raw_request(broker.port, ApiKey.PRODUCE, 8, {"transactional_id": None, "acks": 1, "timeout_ms": 10_000, "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": plain}]}]})
    assert answer["responses"][0]["partition_responses"][0]["error_code"] == ErrorCode.NONE, answer
    assert unsynced(journal, broker.data_dir, TOPIC), "another producer's record past the transaction's data, not durable"
    assert end(broker.port, pid, epoch, commit=True, version=version) == ErrorCode.NONE
    broker.kill()
    power_back_on(broker, journal)

    assert "completing 1 prepared commits" in broker.read_log(), "the start found the decision as the id's last record"
    assert read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=1) == [b"answered"], "the answered commit completed"
    assert b"not durable" not in read_values(broker.bootstrap, TOPIC, isolation="read_uncommitted", partitions=1), "the cut took the other record back"


@pytest.mark.slow
@pytest.mark.parametrize(("version", "answered", "rule", "setting"), [
    (1, "produce", "on", "default"), (2, "produce", "on", "default"), (1, "txn_offset_commit", "on", "default"), (1, "produce", "off", "default"),
    (1, "produce", "on", "at end"), (2, "txn_offset_commit", "on", "at end"), (1, "txn_offset_commit", "off", "at end"),
])
def test_a_commit_whose_markers_a_cut_took_back_after_its_complete_is_committed_at_start(broker_process, tmp_path, version, answered, rule, setting):
    """A commit's markers are appended without waiting for their fsync
    (its data and decision are durable: EndTxn is answered) and its
    Complete record follows at once (with the default durability and with
    ``transaction.durable.at.end``). Killed there, with a cut that keeps
    the Complete (the page cache wrote ``__transaction_state`` back) and
    loses the marker: at start the broker finds the partition's open
    transaction below the data ends the Complete names and commits it. With
    that rule off (``ONCEFLOW_LEAVE_DECIDED_UNMARKED=1``) no transaction
    names the partition any more and the start's check for unknown
    transactions aborts it: an answered commit lost, the hazard the rule
    closes. Either way the producer goes on with its next transaction
    (with durability at the end, as a new instance: the cut fenced its epoch)."""
    journal = str(tmp_path / "fsyncs.journal")
    settings = [DURABLE_AT_END] if setting == "at end" else []
    broker = broker_process(*settings, env={FSYNC_JOURNAL_VARIABLE: journal, "ONCEFLOW_CRASH_POINTS": "coordinator.complete_appended@1:exit"})
    create_topic(broker.bootstrap, TOPIC, 1)
    pid, epoch = init(broker.port)
    marked = TOPIC if answered == "produce" else "__consumer_offsets"
    if answered == "produce":
        add_partition(broker.port, pid, epoch, version)
        assert produce(broker.port, pid, epoch, 0, b"answered", acks=-1, version=version) == ErrorCode.NONE
    else:
        add_offsets_and_commit_them(broker.port, pid, epoch, 42, version)
    committed = end_answer(broker.port, pid, epoch, commit=True, version=version)
    assert committed["error_code"] == ErrorCode.NONE, committed
    assert broker.wait_exit(30) == 86, "the crash point fired"
    assert unsynced(journal, broker.data_dir, marked), "the marker was appended and not made durable"
    lose_unsynced(journal, segments(broker.data_dir, marked))
    broker.env = after_power_cut({LEAVE_DECIDED_UNMARKED_VARIABLE: "1"} if rule == "off" else None)
    broker.start()

    if answered == "produce":
        stable, log_end = ends(broker.port)
        assert stable == log_end, "ended with a marker before the broker served"
        visible = read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=1 if rule == "on" else None)
        assert visible == ([b"answered"] if rule == "on" else []), "committed at start" if rule == "on" else "the hazard: an answered commit aborted"
    else:
        wait_for(lambda: committed_offset(broker.port) == (42 if rule == "on" else -1), 10, "the committed offset after the start")
    if version == 2:
        pid, epoch = committed["producer_id"], committed["producer_epoch"]
    sequence = 1 if version == 1 and answered == "produce" else 0
    if setting == "at end" or (rule == "off" and answered == "produce"):
        # After a cut with durability at the end every ended id is fenced
        # (a next transaction may have been lost whole); with the rule off
        # the start took the answered batch for a lost transaction's and
        # aborted the producer's: either way a new instance goes on.
        assert add_partition_answer(broker.port, pid, epoch, 1) in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH)
        pid, epoch = init(broker.port)
        sequence = 0
    add_partition(broker.port, pid, epoch, version)
    assert produce(broker.port, pid, epoch, sequence, b"next", acks=-1, version=version) == ErrorCode.NONE
    assert end(broker.port, pid, epoch, commit=True, version=version) == ErrorCode.NONE
    expected = [b"answered", b"next"] if answered == "produce" and rule == "on" else [b"next"]
    assert read_values(broker.bootstrap, TOPIC, isolation="read_committed", partitions=1, expect=len(expected)) == expected
