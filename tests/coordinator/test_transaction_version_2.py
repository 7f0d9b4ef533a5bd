"""KIP-890 part 2 in the transaction coordinator (``end_transaction_bumped``,
``add_partitions(transaction_version=2)``), driven with the in-memory fakes
of ``test_coordinator``: the epoch bumped at every EndTxn, the markers at the
new epoch, retries answered with it, an abort with nothing added, the move
to a new producer id at the top of the epoch range, and the records that
carry all of it through a reload."""

from __future__ import annotations

import asyncio

from coordinator.metadata import MAX_PRODUCER_EPOCH, TRANSACTION_VERSION_2, TopicPartition
from coordinator.state import TxnState
from coordinator.txn_log import decode_value, encode_value
from protocol.errors import ErrorCode
from tests.helpers import make_txn_coordinator

P0, P1 = TopicPartition("t", 0), TopicPartition("t", 1)


async def started(coordinator, transactional_id="tx"):
    init = await coordinator.init_producer_id(transactional_id, 60_000)
    assert init.error == ErrorCode.NONE
    return init.producer_id, init.producer_epoch


def test_each_end_bumps_the_epoch_and_the_markers_carry_the_new_one():
    async def scenario():
        coordinator, _ = make_txn_coordinator()
        pid, epoch = await started(coordinator)
        for n, commit in enumerate((True, False, True)):
            assert await coordinator.add_partitions("tx", pid, epoch + n, [P0], transaction_version=TRANSACTION_VERSION_2) == ErrorCode.NONE
            ended = await coordinator.end_transaction_bumped("tx", pid, epoch + n, commit)
            assert (ended.error, ended.producer_id, ended.producer_epoch) == (ErrorCode.NONE, pid, epoch + n + 1)
            await coordinator.wait_idle()
            assert coordinator.markers.written[-1] == (pid, epoch + n + 1, commit, [P0])
            assert coordinator.txns["tx"].state == (TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT)
        # The old epoch is fenced for the next transaction's requests.
        assert await coordinator.add_partitions("tx", pid, epoch + 2, [P1], transaction_version=TRANSACTION_VERSION_2) == ErrorCode.PRODUCER_FENCED

    asyncio.run(scenario())


def test_a_retried_end_from_the_old_epoch_gets_the_same_answer_even_after_a_reload():
    async def scenario():
        coordinator, _ = make_txn_coordinator()
        pid, epoch = await started(coordinator)
        await coordinator.add_partitions("tx", pid, epoch, [P0, P1], transaction_version=TRANSACTION_VERSION_2)
        first = await coordinator.end_transaction_bumped("tx", pid, epoch, True)
        await coordinator.wait_idle()
        assert await coordinator.end_transaction_bumped("tx", pid, epoch, True) == first
        # The opposite decision from the old epoch is fenced, not re-decided.
        assert (await coordinator.end_transaction_bumped("tx", pid, epoch, False)).error == ErrorCode.PRODUCER_FENCED
        # What the log holds says the same after a restart.
        reloaded, _ = make_txn_coordinator()
        reloaded.load(("tx", decode_value("tx", encode_value(m))) for m in coordinator.txn_log.records if not isinstance(m, tuple))
        assert await reloaded.end_transaction_bumped("tx", pid, epoch, True) == first

    asyncio.run(scenario())


def test_an_abort_with_nothing_added_still_bumps_the_epoch_but_a_commit_is_refused():
    async def scenario():
        coordinator, _ = make_txn_coordinator()
        pid, epoch = await started(coordinator)
        assert (await coordinator.end_transaction_bumped("tx", pid, epoch, True)).error == ErrorCode.INVALID_TXN_STATE
        aborted = await coordinator.end_transaction_bumped("tx", pid, epoch, False)
        assert (aborted.error, aborted.producer_epoch) == (ErrorCode.NONE, epoch + 1)
        await coordinator.wait_idle()
        assert coordinator.txns["tx"].state == TxnState.COMPLETE_ABORT and coordinator.markers.written == [(pid, epoch + 1, False, [])]
        # The classic EndTxn keeps the classic rule: nothing added, nothing to abort.
        other_pid, other_epoch = await started(coordinator, "classic")
        assert await coordinator.end_transaction("classic", other_pid, other_epoch, False) == ErrorCode.INVALID_TXN_STATE

    asyncio.run(scenario())


def test_at_the_top_of_the_epoch_range_the_id_moves_to_a_new_producer_id():
    async def scenario():
        coordinator, _ = make_txn_coordinator()
        pid, _epoch = await started(coordinator)
        top = MAX_PRODUCER_EPOCH - 1
        coordinator.txns["tx"] = _at_epoch(coordinator.txns["tx"], top)
        await coordinator.add_partitions("tx", pid, top, [P0], transaction_version=TRANSACTION_VERSION_2)
        ended = await coordinator.end_transaction_bumped("tx", pid, top, True)
        assert ended.error == ErrorCode.NONE and ended.producer_id != pid and ended.producer_epoch == 0
        await coordinator.wait_idle()
        assert coordinator.markers.written[-1] == (pid, MAX_PRODUCER_EPOCH, True, [P0]), "the markers keep the old id at its last epoch"
        current = coordinator.txns["tx"]
        assert (current.producer_id, current.producer_epoch, current.previous_producer_id) == (ended.producer_id, 0, pid)
        assert coordinator.txns.of_producer(ended.producer_id) is current
        # A retry from the old id is answered with the new one; the new one goes on.
        assert await coordinator.end_transaction_bumped("tx", pid, top, True) == ended
        assert await coordinator.add_partitions("tx", ended.producer_id, 0, [P1], transaction_version=TRANSACTION_VERSION_2) == ErrorCode.NONE
        # The record of the decision carries the next producer id through a reload.
        prepare = [m for m in coordinator.txn_log.records if m.state == TxnState.PREPARE_COMMIT][-1]
        assert decode_value("tx", encode_value(prepare)).next_producer_id == ended.producer_id

    asyncio.run(scenario())


def _at_epoch(metadata, epoch):
    import attrs

    return attrs.evolve(metadata, producer_epoch=epoch)


def test_classic_records_are_written_as_before():
    """Below version 2 a record is TransactionLogValue version 0, as it
    was, except where onceflow's own tagged fields are needed: a commit's
    decision names where each of its logs ended (``data_ends``), and its
    Complete (and the id's records after it) where its markers were
    appended (``committed_ends``), which only version 1 can carry."""

    async def scenario():
        coordinator, _ = make_txn_coordinator()
        pid, epoch = await started(coordinator)
        await coordinator.add_partitions("tx", pid, epoch, [P0])
        await coordinator.end_transaction("tx", pid, epoch, False)
        await coordinator.add_partitions("tx", pid, epoch, [P0])
        await coordinator.end_transaction("tx", pid, epoch, True)
        await coordinator.wait_idle()
        versions = [(metadata.state, encode_value(metadata)[:2]) for metadata in coordinator.txn_log.records]
        assert versions[:-2] == [(state, b"\x00\x00") for state, _ in versions[:-2]], versions
        assert versions[-2:] == [(TxnState.PREPARE_COMMIT, b"\x00\x01"), (TxnState.COMPLETE_COMMIT, b"\x00\x01")]
        assert decode_value("tx", encode_value(coordinator.txn_log.records[-2])).data_ends == (("t", 0, 0),)
        assert decode_value("tx", encode_value(coordinator.txn_log.records[-1])).transaction_version == 0
        assert coordinator.txns["tx"].producer_epoch == epoch

    asyncio.run(scenario())
