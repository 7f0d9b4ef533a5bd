"""The transaction coordinator's decisions, driven with in-memory I/O fakes."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest


from coordinator.coordinator import CoordinatorSettings, TransactionCoordinator
from coordinator.metadata import MAX_PRODUCER_EPOCH, TopicPartition, TxnMetadata
from coordinator.producer_ids import ProducerIdAllocator
from coordinator.state import TxnState
from coordinator.txn_log import decode_key, decode_value, encode_key, encode_value, java_string_hash, partition_for
from protocol.clock import ManualClock
from protocol.errors import ErrorCode
from tests.helpers import MemoryMarkers, MemoryProducerIds, MemoryTxnLog, make_txn_coordinator

P0, P1 = TopicPartition("t", 0), TopicPartition("t", 1)


def hold_writes(fake) -> asyncio.Event:
    """Make ``fake.write`` (the state log's or the markers') wait until the
    returned event is set, then write as before."""
    gate = asyncio.Event()
    write = fake.write

    async def held(*args):
        await gate.wait()
        await write(*args)

    fake.write = held
    return gate


def run(coroutine):
    return asyncio.run(coroutine)


def test_commit_writes_prepare_then_markers_then_complete():
    async def scenario():
        coordinator, _ = make_txn_coordinator()
        init = await coordinator.init_producer_id("tx", 60_000)
        assert init.error == ErrorCode.NONE and init.producer_epoch == 0
        assert await coordinator.add_partitions("tx", init.producer_id, 0, [P0, P1]) == ErrorCode.NONE
        assert await coordinator.end_transaction("tx", init.producer_id, 0, True) == ErrorCode.NONE
        states = [m.state for m in coordinator.txn_log.records]
        assert states[:3] == [TxnState.EMPTY, TxnState.ONGOING, TxnState.PREPARE_COMMIT]
        await coordinator.wait_idle()
        assert coordinator.txn_log.records[-1].state == TxnState.COMPLETE_COMMIT
        assert coordinator.markers.written == [(init.producer_id, 0, True, [P0, P1])]
        # A retried EndTxn(commit) is answered success; the opposite is refused.
        assert await coordinator.end_transaction("tx", init.producer_id, 0, True) == ErrorCode.NONE
        assert await coordinator.end_transaction("tx", init.producer_id, 0, False) == ErrorCode.INVALID_TXN_STATE

    run(scenario())


def test_end_txn_is_answered_once_prepare_is_durable_and_markers_and_complete_follow():
    """Kafka's order: EndTxn waits for the decision to be durable and no
    more; the markers and Complete are written after the answer. (An
    abort: its markers are durable before its Complete, which a test can
    hold; a commit's are appended without waiting, see below.)"""

    class HeldLog(MemoryTxnLog):
        def __init__(self):
            super().__init__()
            self.durable = asyncio.Event()  # the PrepareCommit write "fsyncs" when set

        async def write(self, metadata):
            if metadata.state == TxnState.PREPARE_ABORT:
                await self.durable.wait()
            await super().write(metadata)

    class HeldMarkers(MemoryMarkers):
        def __init__(self):
            super().__init__()
            self.release = asyncio.Event()

        async def write(self, metadata, commit):
            await self.release.wait()
            await super().write(metadata, commit)

    async def scenario():
        coordinator = TransactionCoordinator(txn_log=HeldLog(), markers=HeldMarkers(), producer_ids=MemoryProducerIds(), settings=CoordinatorSettings(), clock=ManualClock())
        init = await coordinator.init_producer_id("tx", 60_000)
        await coordinator.add_partitions("tx", init.producer_id, 0, [P0])
        ending = asyncio.create_task(coordinator.end_transaction("tx", init.producer_id, 0, False))
        await asyncio.sleep(0.01)
        assert not ending.done(), "no answer before PrepareAbort is durable"
        coordinator.txn_log.durable.set()
        assert await asyncio.wait_for(ending, 5) == ErrorCode.NONE, "answered with the markers still unwritten"
        assert coordinator.markers.written == []
        assert [m.state for m in coordinator.txn_log.records][-1] == TxnState.PREPARE_ABORT
        coordinator.markers.release.set()
        await coordinator.wait_idle()
        assert coordinator.markers.written == [(init.producer_id, 0, False, [P0])]
        assert coordinator.txn_log.records[-1].state == TxnState.COMPLETE_ABORT

    run(scenario())


def test_end_txn_while_markers_are_being_written_is_concurrent():
    async def scenario():
        coordinator, _ = make_txn_coordinator()
        init = await coordinator.init_producer_id("tx", 60_000)
        await coordinator.add_partitions("tx", init.producer_id, 0, [P0])
        coordinator.markers.fail_times = 2  # markers keep failing for a while
        assert await coordinator.end_transaction("tx", init.producer_id, 0, False) == ErrorCode.NONE
        assert await coordinator.end_transaction("tx", init.producer_id, 0, False) == ErrorCode.CONCURRENT_TRANSACTIONS
        await coordinator.wait_idle()
        assert coordinator.txns["tx"].state == TxnState.COMPLETE_ABORT, "markers are retried until written"

    run(scenario())


def test_new_instance_fences_the_old_and_aborts_its_transaction():
    async def scenario():
        coordinator, _ = make_txn_coordinator()
        old = await coordinator.init_producer_id("tx", 60_000)
        await coordinator.add_partitions("tx", old.producer_id, 0, [P0])
        first_try = await coordinator.init_producer_id("tx", 60_000)
        assert first_try.error == ErrorCode.CONCURRENT_TRANSACTIONS
        await coordinator.wait_idle()
        assert coordinator.markers.written == [(old.producer_id, 1, False, [P0])], "aborted with the bumped epoch"
        new = await coordinator.init_producer_id("tx", 60_000)
        assert (new.error, new.producer_id, new.producer_epoch) == (ErrorCode.NONE, old.producer_id, 2)
        # Every later call of the old instance fails with a fencing error.
        assert await coordinator.add_partitions("tx", old.producer_id, 0, [P1]) == ErrorCode.PRODUCER_FENCED
        assert await coordinator.end_transaction("tx", old.producer_id, 0, True) == ErrorCode.PRODUCER_FENCED

    run(scenario())


def test_timed_out_transaction_is_aborted_and_its_producer_fenced():
    async def scenario():
        coordinator, clock = make_txn_coordinator()
        init = await coordinator.init_producer_id("tx", 5_000)
        await coordinator.add_partitions("tx", init.producer_id, 0, [P0])
        clock.advance(4.0)
        assert await coordinator.abort_timed_out() == []
        clock.advance(2.0)
        assert await coordinator.abort_timed_out() == ["tx"]
        await coordinator.wait_idle()
        assert coordinator.txns["tx"].state == TxnState.COMPLETE_ABORT
        assert coordinator.txns["tx"].producer_epoch == 1
        assert await coordinator.end_transaction("tx", init.producer_id, 0, True) == ErrorCode.PRODUCER_FENCED
        # KIP-360: the fenced producer learns what happened to its transaction.
        assert await coordinator.end_transaction("tx", init.producer_id, 0, False) == ErrorCode.NONE

    run(scenario())


def test_failed_state_write_changes_nothing():
    async def scenario():
        coordinator, _ = make_txn_coordinator()
        init = await coordinator.init_producer_id("tx", 60_000)
        await coordinator.add_partitions("tx", init.producer_id, 0, [P0])
        coordinator.txn_log.fail = True
        assert await coordinator.end_transaction("tx", init.producer_id, 0, True) == ErrorCode.KAFKA_STORAGE_ERROR
        assert coordinator.txns["tx"].state == TxnState.ONGOING
        assert coordinator.markers.written == []

    run(scenario())


def test_recovery_completes_prepared_transactions():
    async def scenario():
        coordinator, _ = make_txn_coordinator()
        init = await coordinator.init_producer_id("tx", 60_000)
        await coordinator.add_partitions("tx", init.producer_id, 0, [P0, P1])
        prepared = coordinator.txns["tx"].prepare_commit(1)
        restarted, _ = make_txn_coordinator()
        restarted.load([("tx", prepared), ("gone", None)])
        await asyncio.gather(*restarted.recover())
        assert restarted.markers.written == [(init.producer_id, 0, True, [P0, P1])]
        assert restarted.txns["tx"].state == TxnState.COMPLETE_COMMIT

    run(scenario())


def test_timeouts_are_validated_and_idempotent_producers_get_fresh_ids():
    async def scenario():
        coordinator, _ = make_txn_coordinator(transaction_max_timeout_ms=10_000)
        assert (await coordinator.init_producer_id("tx", 20_000)).error == ErrorCode.INVALID_TRANSACTION_TIMEOUT
        a = await coordinator.init_producer_id(None, 0)
        b = await coordinator.init_producer_id(None, 0)
        assert a.error == b.error == ErrorCode.NONE and a.producer_id != b.producer_id

    run(scenario())


def test_expired_transactional_ids_are_tombstoned():
    async def scenario():
        coordinator, clock = make_txn_coordinator(transactional_id_expiration_ms=1000)
        await coordinator.init_producer_id("tx", 500)
        clock.advance(1.5)
        assert await coordinator.expire_transactional_ids() == ["tx"]
        assert coordinator.txn_log.records[-1] == ("tx", None)

    run(scenario())


def test_state_log_records_round_trip_and_partitioning():
    coordinator, _ = make_txn_coordinator()

    async def scenario():
        init = await coordinator.init_producer_id("payments-copier", 60_000)
        await coordinator.add_partitions("payments-copier", init.producer_id, 0, [P0, P1, TopicPartition("__consumer_offsets", 7)])
        return coordinator.txns["payments-copier"]

    metadata = run(scenario())
    assert decode_key(encode_key("payments-copier")) == "payments-copier"
    assert decode_value("payments-copier", encode_value(metadata)) == metadata
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("Aa") == java_string_hash("BB")
    assert partition_for("my-transactional-id", 50) == abs(java_string_hash("my-transactional-id")) % 50


def test_producer_ids_are_never_reused_across_restarts(tmp_path):
    first = ProducerIdAllocator(str(tmp_path), block_size=10)
    handed = [first.allocate() for _ in range(15)]
    second = ProducerIdAllocator(str(tmp_path), block_size=10)  # a crash: no clean close
    more = [second.allocate() for _ in range(5)]
    assert len(set(handed + more)) == 20
    assert min(more) > max(handed)


def test_kip360_epoch_bump_from_a_known_producer():
    async def scenario():
        coordinator, _ = make_txn_coordinator()
        first = await coordinator.init_producer_id("tx", 60_000)
        bumped = await coordinator.init_producer_id("tx", 60_000, first.producer_id, first.producer_epoch)
        assert (bumped.error, bumped.producer_id, bumped.producer_epoch) == (ErrorCode.NONE, first.producer_id, first.producer_epoch + 1)
        retried = await coordinator.init_producer_id("tx", 60_000, first.producer_id, first.producer_epoch)
        assert (retried.producer_id, retried.producer_epoch) == (bumped.producer_id, bumped.producer_epoch), "a retried bump answers the same"
        stale = await coordinator.init_producer_id("tx", 60_000, first.producer_id, first.producer_epoch - 1 if first.producer_epoch else 7)
        assert stale.error == ErrorCode.PRODUCER_FENCED
        wrong = await coordinator.init_producer_id("tx", 60_000, 999_999, 0)
        assert wrong.error == ErrorCode.INVALID_PRODUCER_ID_MAPPING

    run(scenario())


def test_a_cancelled_request_loses_only_its_answer_the_change_is_applied():
    """EndTxn's request task is cancelled (its connection died) while the
    PrepareCommit write is out: the write and its apply still run to their
    end (memory equals the log), markers and Complete follow, and the id is
    not left busy."""

    async def scenario():
        coordinator, _ = make_txn_coordinator()
        init = await coordinator.init_producer_id("tx", 60_000)
        pid = init.producer_id
        assert await coordinator.add_partitions("tx", pid, 0, [P0]) == ErrorCode.NONE
        gate = hold_writes(coordinator.txn_log)
        request = asyncio.create_task(coordinator.end_transaction("tx", pid, 0, True))
        await asyncio.sleep(0.01)
        request.cancel()
        await asyncio.wait([request])
        assert request.cancelled()
        assert await coordinator.end_transaction("tx", pid, 0, True) == ErrorCode.CONCURRENT_TRANSACTIONS  # still in flight
        gate.set()
        await coordinator.wait_idle()
        assert coordinator.txns["tx"].state == TxnState.COMPLETE_COMMIT == coordinator.txn_log.records[-1].state
        assert [m.state for m in coordinator.txn_log.records][-2:] == [TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT]
        assert coordinator.markers.written == [(pid, 0, True, [P0])]
        assert await coordinator.end_transaction("tx", pid, 0, True) == ErrorCode.NONE
        again = await coordinator.init_producer_id("tx", 60_000)
        assert (again.error, again.producer_epoch) == (ErrorCode.NONE, 1)
        await coordinator.close()

    run(scenario())


def test_close_stops_a_change_in_flight_and_waits_for_it():
    async def scenario():
        coordinator, _ = make_txn_coordinator()
        stopped = asyncio.Event()

        async def never_durable(metadata):
            try:
                await asyncio.sleep(3600)
            finally:
                stopped.set()

        coordinator.txn_log.write = never_durable
        request = asyncio.create_task(coordinator.init_producer_id("tx", 60_000))
        await asyncio.sleep(0.01)
        await coordinator.close()
        assert stopped.is_set(), "close() returned before the write's cleanup ran"
        assert "tx" not in coordinator.txns
        request.cancel()
        await asyncio.wait([request])

    run(scenario())


def test_transactional_produce_finds_its_producer_without_scanning_every_id():
    import attrs

    from coordinator.coordinator import TxnTable

    async def scenario():
        coordinator, _ = make_txn_coordinator()
        ids = [await coordinator.init_producer_id(f"tx{i}", 60_000) for i in range(3)]
        await coordinator.add_partitions("tx1", ids[1].producer_id, 0, [P0])
        assert coordinator.verify_transactional_produce(ids[1].producer_id, 0, P0) == ErrorCode.NONE
        assert coordinator.verify_transactional_produce(ids[1].producer_id, 0, P1) == ErrorCode.INVALID_TXN_STATE
        assert coordinator.verify_transactional_produce(ids[2].producer_id, 0, P0) == ErrorCode.INVALID_TXN_STATE
        assert coordinator.verify_transactional_produce(99_999, 0, P0) == ErrorCode.INVALID_TXN_STATE

    run(scenario())
    table = TxnTable()
    coordinator, _ = make_txn_coordinator()

    async def one():
        return await coordinator.init_producer_id("a", 60_000)

    first = run(one())
    metadata = coordinator.txns["a"]
    table["a"] = metadata
    assert table.of_producer(first.producer_id) is metadata
    moved = attrs.evolve(metadata, producer_id=first.producer_id + 7)  # a new producer id (epoch exhausted)
    table["a"] = moved
    assert table.of_producer(first.producer_id) is None and table.of_producer(first.producer_id + 7) is moved
    table.pop("a")
    assert table.of_producer(first.producer_id + 7) is None and "a" not in table


def test_sibling_add_requests_are_answered_at_once_and_a_request_during_a_completion_waits_for_it():
    """librdkafka sends AddPartitionsToTxn and AddOffsetsToTxn together: each
    is answered once appended, so neither waits for the other. A request
    arriving while the previous transaction's markers are written (an
    abort's: a commit's are appended without waiting) waits for Complete
    rather than getting CONCURRENT_TRANSACTIONS and a 100 ms client
    backoff; a change that never ends still gets CONCURRENT_TRANSACTIONS
    once the wait runs out."""

    async def scenario():
        coordinator, _ = make_txn_coordinator()
        pid = (await coordinator.init_producer_id("tx", 60_000)).producer_id
        partitions = asyncio.create_task(coordinator.add_partitions("tx", pid, 0, [P0]))
        offsets = asyncio.create_task(coordinator.add_partitions("tx", pid, 0, [P1]))
        assert await asyncio.wait_for(asyncio.gather(partitions, offsets), 5) == [ErrorCode.NONE, ErrorCode.NONE]
        assert coordinator.txns["tx"].partitions == {P0, P1}
        # The next transaction's first request while the markers of this one are out.
        markers_gate = hold_writes(coordinator.markers)
        assert await coordinator.end_transaction("tx", pid, 0, False) == ErrorCode.NONE
        next_add = asyncio.create_task(coordinator.add_partitions("tx", pid, 0, [P0]))
        await asyncio.sleep(0.05)
        assert not next_add.done()
        markers_gate.set()
        assert await asyncio.wait_for(next_add, 5) == ErrorCode.NONE
        # A change that does not end within the wait: CONCURRENT_TRANSACTIONS, as Kafka answers.
        markers_gate.clear()
        assert await coordinator.end_transaction("tx", pid, 0, False) == ErrorCode.NONE
        coordinator_wait = coordinator._await_quiet
        coordinator._await_quiet = lambda tid: coordinator_wait(tid, timeout=0.05)
        assert await coordinator.add_partitions("tx", pid, 0, [P1]) == ErrorCode.CONCURRENT_TRANSACTIONS
        markers_gate.set()
        coordinator._await_quiet = coordinator_wait
        assert await coordinator.add_partitions("tx", pid, 0, [P1]) == ErrorCode.NONE
        await coordinator.wait_idle()

    run(scenario())


class RoundLog(MemoryTxnLog):
    """A state log whose appends become durable only when ``fsync()`` runs a
    round (every record appended so far, as one file's fsync covers all its
    bytes); ``durable`` is what a power cut would leave."""

    def __init__(self):
        super().__init__()
        self.durable_count = 0
        self.waiting = []  # (record count, future)
        self.rounds = 0

    def append(self, metadata):
        if self.fail:
            raise OSError("disk gone")
        self.records.append(metadata)
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((len(self.records), future))
        return future

    def append_unflushed(self, metadata):
        """Appended; no round asked for until the result is called."""
        if self.fail:
            raise OSError("disk gone")
        self.records.append(metadata)
        count = len(self.records)

        def wait_durable():
            future = asyncio.get_running_loop().create_future()
            if self.durable_count >= count:
                future.set_result(None)
            else:
                self.waiting.append((count, future))
            return future

        return wait_durable

    def fsync(self):
        self.rounds += 1
        self.durable_count = len(self.records)
        for _count, future in self.waiting:
            future.set_result(None)
        self.waiting = []

    def fail_round(self, error):
        """The round's fsync failed: its waiters get ``error``, and the log
        refuses every later append until it is reopened (as a real one)."""
        self.rounds += 1
        self.fail = True
        for _count, future in self.waiting:
            future.set_exception(error)
        self.waiting = []

    @property
    def durable(self):
        return self.records[: self.durable_count]


async def turns(count=20):
    """Let every task that can run do so (no round runs meanwhile)."""
    for _ in range(count):
        await asyncio.sleep(0)


async def settle(log, until):
    """Run rounds while anything waits, until ``until`` is done."""
    for _ in range(100):
        await asyncio.sleep(0)
        if until.done():
            return
        if log.waiting:
            log.fsync()
    raise AssertionError("never done")


def round_coordinator(log):
    return TransactionCoordinator(txn_log=log, markers=MemoryMarkers(), producer_ids=MemoryProducerIds(), settings=CoordinatorSettings(), clock=ManualClock())


async def ongoing_on_rounds(log):
    """A coordinator on ``log`` with "tx" initialised and P0 added, each durable."""
    coordinator = round_coordinator(log)
    init = asyncio.create_task(coordinator.init_producer_id("tx", 60_000))
    await settle(log, init)
    pid = init.result().producer_id
    add = asyncio.create_task(coordinator.add_partitions("tx", pid, 0, [P0]))
    await settle(log, add)
    log.fsync()  # the log's next round (EndTxn's, in the client's next transaction)
    return coordinator, pid


async def recovered_from(records, pid):
    """A restart from ``records`` (PrepareCommit last): recovery writes P0's
    marker again and appends CompleteCommit (which asks for no round of its
    own: the id's next record's round covers it)."""
    restarted_log = RoundLog()
    restarted = round_coordinator(restarted_log)
    restarted.load([(m.transactional_id, m) for m in records])
    completing = asyncio.gather(*restarted.recover())
    await settle(restarted_log, completing)
    assert restarted.markers.written == [(pid, 0, True, [P0])]
    assert restarted.txns["tx"].state == TxnState.COMPLETE_COMMIT == restarted_log.records[-1].state
    return restarted, restarted_log


def test_add_partitions_is_answered_once_appended_and_made_durable_by_the_next_round_of_its_log():
    """AddPartitionsToTxn appends Ongoing (behind the previous transaction's
    Complete, which is not durable yet either) and is answered before any
    round, and asks for none: the producer's Produce waits only for its own
    data, and the log's next round (EndTxn's Prepare, behind it) covers
    Complete and Ongoing both. A power cut before that round leaves
    PrepareCommit last: recovery writes the markers again and completes,
    and knows no transaction on the partition added (the broker aborts a
    batch there, and its producer's transaction: ``abort_after_unknown_batches``)."""

    async def scenario():
        log = RoundLog()
        coordinator, pid = await ongoing_on_rounds(log)
        end = asyncio.create_task(coordinator.end_transaction("tx", pid, 0, True))
        await turns()
        assert not end.done() and log.records[-1].state == TxnState.PREPARE_COMMIT
        log.fsync()  # PrepareCommit's round
        await turns()
        assert end.result() == ErrorCode.NONE
        assert log.records[-1].state == TxnState.COMPLETE_COMMIT and log.durable_count == len(log.records) - 1
        rounds = log.rounds
        next_add = asyncio.create_task(coordinator.add_partitions("tx", pid, 0, [P1]))
        await turns()
        assert [m.state for m in log.records[-3:]] == [TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT, TxnState.ONGOING]
        assert next_add.done() and next_add.result() == ErrorCode.NONE, "answered once appended"
        assert log.rounds == rounds and log.durable[-1].state == TxnState.PREPARE_COMMIT
        cut = list(log.durable)  # a power cut now
        assert not log.waiting, "nothing asked for a round"
        log.fsync()  # the log's next round
        await turns()
        assert log.durable[-1].state == TxnState.ONGOING and log.rounds == rounds + 1, "Complete and the next Ongoing took one round"
        assert coordinator.markers.written == [(pid, 0, True, [P0])]
        # EndTxn's Prepare lands behind Ongoing in the same log: its round covers it.
        assert coordinator.is_known_open_transaction(pid, 0, P1) and not coordinator.is_known_open_transaction(pid, 0, P0)
        await coordinator.close()

        # What the cut left: PrepareCommit last. Recovery completes it again,
        # and knows no open transaction on P1 (the broker aborts any batch there).
        assert cut[-1].state == TxnState.PREPARE_COMMIT
        restarted, restarted_log = await recovered_from(cut, pid)
        assert not restarted.is_known_open_transaction(pid, 0, P1)
        again = asyncio.create_task(restarted.add_partitions("tx", pid, 0, [P1]))
        await settle(restarted_log, again)
        assert again.result() == ErrorCode.NONE
        assert restarted.is_known_open_transaction(pid, 0, P1)
        await restarted.close()

    run(scenario())


def test_a_complete_asks_for_no_round_of_its_own_and_a_cut_before_the_next_one_is_finished_by_recovery():
    """The markers are written and Complete is appended with no fsync round
    asked for (nothing answered depends on it; the id's next record's round
    covers it): a cut then leaves PrepareCommit last, and a restart from
    what was durable completes the transaction again."""

    async def scenario():
        log = RoundLog()
        coordinator, pid = await ongoing_on_rounds(log)
        end = asyncio.create_task(coordinator.end_transaction("tx", pid, 0, True))
        await turns()
        log.fsync()  # PrepareCommit's round
        await turns()
        assert end.result() == ErrorCode.NONE and log.records[-1].state == TxnState.COMPLETE_COMMIT
        assert not log.waiting, "Complete asked for no round"
        await asyncio.wait_for(coordinator.wait_idle(), 5)
        assert "tx" not in coordinator._busy
        durable = list(log.durable)
        await coordinator.close()

        assert durable[-1].state == TxnState.PREPARE_COMMIT
        restarted, _restarted_log = await recovered_from(durable, pid)
        await restarted.close()

    run(scenario())


async def commit_on_two_partitions(coordinator, log_ends: dict):
    """"tx" commits on P0 and P1, whose logs end at ``log_ends``: (its
    producer id, the PrepareCommit written)."""
    coordinator.markers.log_ends = log_ends
    pid = (await coordinator.init_producer_id("tx", 60_000)).producer_id
    assert await coordinator.add_partitions("tx", pid, 0, [P0, P1]) == ErrorCode.NONE
    assert await coordinator.end_transaction("tx", pid, 0, True) == ErrorCode.NONE
    return pid, next(m for m in coordinator.txn_log.records if m.state == TxnState.PREPARE_COMMIT)


def _reloaded(coordinator, upto_state):
    """A new coordinator on the same I/O fakes, loaded with the records up
    to the first of ``upto_state`` (what a crash right after it leaves)."""
    records = coordinator.txn_log.records
    cut = next(i for i, m in enumerate(records) if m.state == upto_state) + 1
    restarted = TransactionCoordinator(txn_log=coordinator.txn_log, markers=coordinator.markers, producer_ids=coordinator.producer_ids,
                                       settings=coordinator.settings, clock=coordinator.clock)
    restarted.load((m.transactional_id, m) for m in records[:cut])
    return restarted


def test_a_decision_at_the_end_names_its_data_and_commits_only_what_recovery_finds_whole():
    """``durable_at_end``: PrepareCommit names each partition's log end;
    reloaded with every log still there it commits; with one log short of
    its end (a cut took data back) it aborts instead, with an epoch bump,
    and the producer's retried commit is told UNKNOWN_PRODUCER_ID."""
    async def scenario(short: bool):
        coordinator, _ = make_txn_coordinator(durable_at_end=True)
        pid, decision = await commit_on_two_partitions(coordinator, {P0: 5, P1: 9})
        assert decision.data_ends == (("t", 0, 5), ("t", 1, 9))
        assert decode_value("tx", encode_value(decision)).data_ends == decision.data_ends
        await coordinator.wait_idle()
        assert coordinator.txn_log.records[-1].data_ends == (), "Complete names no data"

        restarted = _reloaded(coordinator, TxnState.PREPARE_COMMIT)
        restarted.markers.log_ends = {P0: 5, P1: 8 if short else 9}
        restarted.recover()
        await restarted.wait_idle()
        after = restarted.txns["tx"]
        if not short:
            assert after.state == TxnState.COMPLETE_COMMIT
            return
        assert (after.state, after.producer_epoch) == (TxnState.COMPLETE_ABORT, 1)
        assert restarted.markers.written[-1] == (pid, 1, False, [P0, P1])
        assert await restarted.end_transaction("tx", pid, 0, True) == ErrorCode.UNKNOWN_PRODUCER_ID
        assert await restarted.end_transaction("tx", pid, 0, False) == ErrorCode.NONE
        bumped = await restarted.init_producer_id("tx", 60_000, pid, 0)
        assert (bumped.error, bumped.producer_epoch) == (ErrorCode.NONE, 2)

    run(scenario(short=False))
    run(scenario(short=True))


@pytest.mark.parametrize("written_at_end", [True, False], ids=["written at end", "written by default"])
@pytest.mark.parametrize("recovered_at_end", [True, False], ids=["recovered at end", "recovered by default"])
def test_a_decided_commit_is_completed_at_start_only_with_its_data_whole_whatever_the_setting(written_at_end, recovered_at_end):
    """Every commit decision names where its producer's data ends (here
    P0: 5, P1: 9) and is answered only once that data is durable, so a
    start completes it only if every log still reaches those ends, with
    ``durable_at_end`` on or off then: a decision written with it on and
    recovered after a power cut with it off (an operator changed it across
    the stop) was completed unchecked, over the hole. A log short of its
    end aborts the commit (never answered); whole, it completes."""
    async def scenario(short: bool):
        coordinator, _ = make_txn_coordinator(durable_at_end=written_at_end)
        pid, decision = await commit_on_two_partitions(coordinator, {P0: 5, P1: 9})
        await coordinator.wait_idle()
        reloaded = decode_value("tx", encode_value(decision))
        assert (reloaded.data_ends, reloaded.data_ends_are_log_ends) == ((("t", 0, 5), ("t", 1, 9)), False)

        restarted = TransactionCoordinator(txn_log=coordinator.txn_log, markers=coordinator.markers, producer_ids=coordinator.producer_ids,
                                           settings=CoordinatorSettings(durable_at_end=recovered_at_end), clock=coordinator.clock)
        restarted.load([("tx", reloaded)])
        restarted.markers.log_ends = {P0: 5, P1: 8 if short else 9}
        restarted.recover()
        await restarted.wait_idle()
        after = restarted.txns["tx"]
        if short:
            assert (after.state, after.producer_epoch) == (TxnState.COMPLETE_ABORT, 1), "aborted: its data has a hole"
            assert await restarted.end_transaction("tx", pid, 0, True) == ErrorCode.UNKNOWN_PRODUCER_ID
        else:
            assert (after.state, after.producer_epoch) == (TxnState.COMPLETE_COMMIT, 0)

    run(scenario(short=True))
    run(scenario(short=False))


@pytest.mark.parametrize("recovered_at_end", [True, False])
def test_an_old_decision_naming_its_logs_ends_is_checked_only_with_the_setting_on(recovered_at_end):
    """A PrepareCommit written before the ends were exact (no exactness
    flag: ``data_ends_are_log_ends``) names each log's end at the decision,
    which may lie past its producer's data (another producer's bytes that
    a cut took back). It keeps the old rule: checked with
    ``durable_at_end`` on (such a decision was answered only once durable
    up to those ends), completed unchecked with it off (one written by
    default may have been answered: a short log must not abort it)."""
    async def scenario():
        coordinator, _ = make_txn_coordinator(durable_at_end=recovered_at_end)
        old = TxnMetadata("tx", 7, 0, 60_000, TxnState.PREPARE_COMMIT, frozenset({P0}), data_ends=(("t", 0, 9),), data_ends_are_log_ends=True)
        reloaded = decode_value("tx", encode_value(old))
        assert (reloaded.data_ends, reloaded.data_ends_are_log_ends) == ((("t", 0, 9),), True), "written without the flag, read as log ends"
        coordinator.load([("tx", reloaded)])
        coordinator.markers.log_ends = {P0: 6}
        coordinator.recover()
        await coordinator.wait_idle()
        expected = TxnState.COMPLETE_ABORT if recovered_at_end else TxnState.COMPLETE_COMMIT
        assert coordinator.txns["tx"].state == expected

    run(scenario())


def test_a_commit_decided_by_default_is_answered_only_once_its_data_is_durable_up_to_its_ends():
    """Without ``durable_at_end`` the data was durable before its answers,
    so the decision's wait for it is over at once; a client that sent
    EndTxn before its Produce was answered still gets no answer before the
    data the decision names is durable: a start after a power cut that
    took it back aborts that decision, which must not have been answered."""
    async def scenario():
        coordinator, _ = make_txn_coordinator()
        coordinator.markers.log_ends = {P0: 5}
        coordinator.markers.data_round = asyncio.get_running_loop().create_future()
        pid = (await coordinator.init_producer_id("tx", 60_000)).producer_id
        assert await coordinator.add_partitions("tx", pid, 0, [P0]) == ErrorCode.NONE
        ended = asyncio.create_task(coordinator.end_transaction("tx", pid, 0, True))
        await asyncio.sleep(0.05)
        assert coordinator.txn_log.records[-1].state == TxnState.PREPARE_COMMIT, "the decision is written"
        assert not ended.done(), "not answered before its data is durable"
        coordinator.markers.data_round.set_result(None)
        assert await asyncio.wait_for(ended, 5) == ErrorCode.NONE
        await coordinator.wait_idle()

    run(scenario())


def test_transactions_ongoing_after_an_unclean_stop_are_aborted_with_a_bump():
    async def scenario():
        coordinator, _ = make_txn_coordinator(durable_at_end=True)
        init = await coordinator.init_producer_id("tx", 60_000)
        pid = init.producer_id
        assert await coordinator.add_partitions("tx", pid, 0, [P0]) == ErrorCode.NONE
        restarted = _reloaded(coordinator, TxnState.ONGOING)
        restarted.recover()
        assert await restarted.abort_ongoing_after_unclean_stop() == ["tx"]
        await restarted.wait_idle()
        assert (restarted.txns["tx"].state, restarted.txns["tx"].producer_epoch) == (TxnState.COMPLETE_ABORT, 1)
        assert await restarted.end_transaction("tx", pid, 0, True) == ErrorCode.UNKNOWN_PRODUCER_ID
        assert await restarted.end_transaction("tx", pid, 5, True) == ErrorCode.PRODUCER_FENCED, "only the epoch the abort bumped away"

    run(scenario())


def test_no_transactional_batch_is_let_in_while_a_decision_at_the_end_is_in_flight():
    async def scenario():
        coordinator, _ = make_txn_coordinator(durable_at_end=True)
        init = await coordinator.init_producer_id("tx", 60_000)
        pid = init.producer_id
        assert await coordinator.add_partitions("tx", pid, 0, [P0]) == ErrorCode.NONE
        assert coordinator.verify_transactional_produce(pid, 0, P0) == ErrorCode.NONE
        ended = asyncio.ensure_future(coordinator.end_transaction("tx", pid, 0, True))
        await asyncio.sleep(0)
        assert coordinator.verify_transactional_produce(pid, 0, P0) == ErrorCode.INVALID_TXN_STATE
        assert await ended == ErrorCode.NONE
        await coordinator.wait_idle()

    run(scenario())


@pytest.mark.parametrize("durable_at_end", [False, True])
def test_a_commit_goes_on_before_its_markers_are_durable_and_recovery_can_finish_them(durable_at_end):
    """A commit's data and decision are durable, so its markers are
    appended and the id goes on without waiting for their fsync: the next
    transaction's AddPartitionsToTxn is answered while it is held. Complete
    and every later record name where the markers were appended
    (``committed_ends``), by which recovery tells a lost marker's
    transaction (below them) from a later one; the next Complete, which
    drops those places, waits until the markers are durable, and an
    abort's Complete names none."""
    async def scenario():
        coordinator, _ = make_txn_coordinator(durable_at_end=durable_at_end)
        coordinator.markers.log_ends = {P0: 5}
        coordinator.markers.durable = asyncio.get_running_loop().create_future()  # the markers' fsync, held
        init = await coordinator.init_producer_id("tx", 60_000)
        pid = init.producer_id
        assert await coordinator.add_partitions("tx", pid, 0, [P0]) == ErrorCode.NONE
        assert await coordinator.end_transaction("tx", pid, 0, True) == ErrorCode.NONE
        added = await asyncio.wait_for(coordinator.add_partitions("tx", pid, 0, [P1]), 5)
        assert added == ErrorCode.NONE, "answered with the markers not durable"
        topic_id = uuid.uuid5(uuid.NAMESPACE_OID, "t")
        complete, ongoing = coordinator.txn_log.records[-2:]
        assert (complete.state, complete.committed_ends) == (TxnState.COMPLETE_COMMIT, (("t", 0, 5, topic_id),))
        assert (ongoing.state, ongoing.committed_ends) == (TxnState.ONGOING, (("t", 0, 5, topic_id),))
        assert decode_value("tx", encode_value(ongoing)).committed_ends == (("t", 0, 5, topic_id),)
        assert coordinator.decided_commit_covers(pid, 0, P0, topic_id, 4)
        assert not coordinator.decided_commit_covers(pid, 0, P0, topic_id, 5), "from the end on: a later transaction's"
        assert not coordinator.decided_commit_covers(pid, 0, P0, uuid.uuid4(), 0), "a topic of the same name made since"
        assert not coordinator.decided_commit_covers(pid, 0, P1, topic_id, 0) and not coordinator.decided_commit_covers(pid + 1, 0, P0, topic_id, 0)

        assert coordinator.markers.asked_markers == 1, "their fsync was asked for, and nothing waited"
        coordinator.markers.log_ends = {P0: 5, P1: 3}
        assert await asyncio.wait_for(coordinator.end_transaction("tx", pid, 0, False), 5) == ErrorCode.NONE
        assert coordinator.markers.asked_markers >= 2, "asked again by the next decision (answered at once once durable)"
        assert coordinator.txn_log.records[-1].committed_ends == (("t", 0, 5, topic_id),), "the decision keeps their places"
        await asyncio.sleep(0.05)
        assert coordinator.txn_log.records[-1].state == TxnState.PREPARE_ABORT, "no Complete before those markers are durable"
        coordinator.markers.durable.set_result(None)
        await coordinator.wait_idle()
        assert coordinator.txn_log.records[-1].state == TxnState.COMPLETE_ABORT
        assert coordinator.txn_log.records[-1].committed_ends == (), "an abort's markers are durable before Complete"

    run(scenario())


@pytest.mark.parametrize("version", [1, 2])
def test_after_an_unclean_stop_an_ended_id_has_its_epoch_fenced_with_no_retry_left_to_match(version):
    """``durable_at_end``: an id whose last transaction ended (here
    CompleteCommit) is reloaded after an unclean stop that may have taken
    a whole next transaction back. Its epoch is bumped with no "last
    epoch": EndTxn(commit) from the old epoch (a lost next transaction, or
    the retry of the last EndTxn: the same request) is PRODUCER_FENCED, not
    NONE; AddPartitions and KIP-360's bump from it too; a new instance's
    InitProducerId goes on. An id aborted at recovery keeps its answer
    (UNKNOWN_PRODUCER_ID, abortable) and is not fenced again; one at the
    top of the epoch range moves to a new producer id."""
    async def scenario():
        coordinator, _ = make_txn_coordinator(durable_at_end=True)
        pid = (await coordinator.init_producer_id("tx", 60_000)).producer_id
        other = (await coordinator.init_producer_id("open", 60_000)).producer_id
        assert await coordinator.add_partitions("open", other, 0, [P1]) == ErrorCode.NONE
        assert await coordinator.add_partitions("tx", pid, 0, [P0], transaction_version=version) == ErrorCode.NONE
        if version == 2:
            ended = await coordinator.end_transaction_bumped("tx", pid, 0, True)
            assert (ended.error, ended.producer_epoch) == (ErrorCode.NONE, 1)
        else:
            assert await coordinator.end_transaction("tx", pid, 0, True) == ErrorCode.NONE
        await coordinator.wait_idle()
        epoch = coordinator.txns["tx"].producer_epoch
        restarted = _reloaded(coordinator, TxnState.COMPLETE_COMMIT)
        restarted.recover()
        assert await restarted.abort_ongoing_after_unclean_stop() == ["open"]
        assert await restarted.fence_ended_after_unclean_stop() == ["tx"]
        fenced = restarted.txns["tx"]
        assert (fenced.state, fenced.producer_epoch, fenced.last_producer_epoch) == (TxnState.COMPLETE_COMMIT, epoch + 1, -1)
        assert restarted.txn_log.records[-1] == fenced, "written, then applied"
        if version == 2:
            assert (await restarted.end_transaction_bumped("tx", pid, epoch, True)).error == ErrorCode.PRODUCER_FENCED
            assert (await restarted.end_transaction_bumped("tx", pid, epoch - 1, True)).error == ErrorCode.PRODUCER_FENCED
        else:
            assert await restarted.end_transaction("tx", pid, epoch, True) == ErrorCode.PRODUCER_FENCED
        assert await restarted.add_partitions("tx", pid, epoch, [P1]) == ErrorCode.PRODUCER_FENCED
        assert (await restarted.init_producer_id("tx", 60_000, pid, epoch)).error == ErrorCode.PRODUCER_FENCED
        fresh = await restarted.init_producer_id("tx", 60_000)
        assert (fresh.error, fresh.producer_id, fresh.producer_epoch) == (ErrorCode.NONE, pid, epoch + 2)
        assert await restarted.end_transaction("open", other, 0, True) == ErrorCode.UNKNOWN_PRODUCER_ID, "aborted at recovery: abortable, not fenced"

        top = TxnMetadata(transactional_id="top", producer_id=7, producer_epoch=MAX_PRODUCER_EPOCH - 1, timeout_ms=60_000, state=TxnState.COMPLETE_ABORT, previous_producer_id=3)
        moved = top.fence_ended(0, next_producer_id=8)
        assert (moved.producer_id, moved.producer_epoch, moved.previous_producer_id, moved.last_producer_epoch) == (8, 0, -1, -1)

    run(scenario())


@pytest.mark.parametrize("left", ["complete", "empty", "ongoing with fewer partitions", "an older epoch"])
def test_a_producer_whose_batch_no_transaction_names_has_its_transaction_aborted_with_a_bump(left):
    """At start the broker found a batch of producer P at epoch E that no
    transaction names (its AddPartitions record lost, the batch durable).
    If E is still its id's epoch (the id ended at E, or is Ongoing without
    that partition), the transaction P began is aborted with a bump and its
    commit from E is told UNKNOWN_PRODUCER_ID, never NONE (version 1's
    CompleteCommit would take it for a retry) nor a commit of the rest;
    its abort from E is answered and KIP-360's bump goes on. A batch of an
    older epoch leaves the id alone."""
    async def scenario():
        coordinator, _ = make_txn_coordinator()
        pid = (await coordinator.init_producer_id("tx", 60_000)).producer_id
        if left == "complete":
            assert await coordinator.add_partitions("tx", pid, 0, [P0]) == ErrorCode.NONE
            assert await coordinator.end_transaction("tx", pid, 0, True) == ErrorCode.NONE
            await coordinator.wait_idle()
        elif left == "ongoing with fewer partitions":
            assert await coordinator.add_partitions("tx", pid, 0, [P0]) == ErrorCode.NONE
        before = coordinator.txns["tx"]
        batch_epoch = -1 if left == "an older epoch" else 0
        restarted = _reloaded(coordinator, before.state)
        restarted.recover()
        aborted = await restarted.abort_after_unknown_batches([(pid, batch_epoch), (pid, batch_epoch), (pid + 99, 0)])
        await restarted.wait_idle()
        after = restarted.txns["tx"]
        if left == "an older epoch":
            assert aborted == [] and after == before
            return
        assert aborted == ["tx"]
        assert (after.state, after.producer_epoch, after.last_producer_epoch) == (TxnState.COMPLETE_ABORT, 1, 0)
        marked = [P0] if left == "ongoing with fewer partitions" else []
        assert [w for w in restarted.markers.written if w[2] is False] == [(pid, 1, False, marked)]
        assert restarted.verify_transactional_produce(pid, 0, P0) == ErrorCode.UNKNOWN_PRODUCER_ID, "a batch of it too: abortable"
        assert await restarted.end_transaction("tx", pid, 0, True) == ErrorCode.UNKNOWN_PRODUCER_ID
        assert await restarted.end_transaction("tx", pid, 0, False) == ErrorCode.NONE
        bumped = await restarted.init_producer_id("tx", 60_000, pid, 0)
        assert (bumped.error, bumped.producer_epoch) == (ErrorCode.NONE, 2)
        assert restarted.verify_transactional_produce(pid, 0, P0) == ErrorCode.INVALID_PRODUCER_EPOCH, "once it went on: fenced"

    run(scenario())


def test_a_commit_completed_again_at_start_leaves_a_later_transaction_of_its_producer_alone():
    """Every commit decision names where each of its logs ended. A start
    that completes it again (its Complete lost) writes no marker where the
    producer's open transaction begins past that end (a later
    transaction's, whose own record was lost with Complete): the marker
    would commit it. That partition is left to the start's check for
    unknown transactions."""
    async def scenario():
        coordinator, _ = make_txn_coordinator()
        pid, decision = await commit_on_two_partitions(coordinator, {P0: 5, P1: 7})
        await coordinator.wait_idle()
        assert decision.data_ends == (("t", 0, 5), ("t", 1, 7))
        restarted = _reloaded(coordinator, TxnState.PREPARE_COMMIT)
        restarted.markers.later_open = {P1}
        restarted.recover()
        assert not restarted.is_known_open_transaction(pid, 0, P1), "left to the check for unknown transactions"
        assert restarted.is_known_open_transaction(pid, 0, P0)
        await restarted.wait_idle()
        assert restarted.markers.written[-1] == (pid, 0, True, [P0])
        assert restarted.txns["tx"].state == TxnState.COMPLETE_COMMIT

    run(scenario())
