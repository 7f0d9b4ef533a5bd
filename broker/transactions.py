"""Wires the transaction coordinator to the broker's logs.

``TransactionManager`` owns:

- the ``__transaction_state`` internal topic (compacted,
  ``transaction.state.log.num.partitions`` partitions), created on first start;
- ``StateLogWriter``: appends a transactional id's metadata record to its
  partition and waits until it is durable (or, for Complete, hands back the
  wait: ``append``);
- ``MarkerWriter``: appends COMMIT/ABORT control batches to every partition of
  a transaction (``__consumer_offsets`` included) and waits until all are
  durable, then tells the fetch long-poll and the group coordinator (a
  commit's markers are not waited for: ``append``);
- the producer-id allocator (blocks in ``__cluster_metadata/producer-ids``);
- the timer loop that aborts timed-out transactions and expires idle ids
  (``background()``: the broker runs it in its TaskGroup);
- loading at start: every ``__transaction_state`` partition is replayed;
  open transactions that a decided commit covers but whose marker a crash
  took back are committed (``commit_decided_unmarked``); the coordinator
  finishes what was left in a Prepare state; then every
  open partition (those recovered at start, and the coordinators') is
  checked for open transactions the recovered state does not name, and
  each is aborted with a marker before the broker serves
  (``end_unknown_transactions``: AddPartitionsToTxn is answered once
  appended, and a transactional Produce once its own data is durable, so a
  power cut may keep a transactional batch and lose the record that put
  its partition in the transaction), and so is the transaction its
  producer began at that epoch; with
  ``transaction.durable.at.end``, after an unclean stop, every transaction
  recovered Ongoing is aborted first (bytes its client was answered for
  may be gone), and every id whose last transaction ended has its epoch
  fenced (a next transaction may have been answered and lost whole).

Named crash points (``faults``) are passed to the coordinator as a callable,
so a test can kill the broker between the durable decision and the markers.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Awaitable, Callable

from coordinator.coordinator import CoordinatorSettings, TransactionCoordinator
from coordinator.metadata import TopicPartition, TxnMetadata
from coordinator.producer_ids import ProducerIdAllocator
from coordinator.txn_log import (
    TRANSACTION_STATE_TOPIC,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    partition_for,
)
from broker.client_rounds import note_durability_wait
from broker.replay import replay
from protocol.clock import Clock
from protocol.records import ControlType, encode_one_record_batch
from protocol.tasks import every

log = logging.getLogger(__name__)

COORDINATOR_EPOCH = 0


class StateLogWriter:
    def __init__(self, replicas, partitions: int, clock: Clock, on_written: Callable[[TxnMetadata], None] | None = None):
        self.replicas = replicas
        self.partitions = partitions
        self.clock = clock
        # Told of each metadata once it is durable, and of a Complete once
        # appended (the broker's metrics count the CompleteCommit/CompleteAbort
        # ones: one per finished transaction).
        self.on_written = on_written
        # Transactional id -> its partition and its records' key, both
        # functions of the id alone, computed once rather than for each of a
        # transaction's three records; an id leaves with its tombstone.
        self._placements: dict[str, tuple[int, bytes]] = {}

    def _placement(self, transactional_id: str) -> tuple[object, bytes]:
        """The id's ``__transaction_state`` log and its records' key."""
        placement = self._placements.get(transactional_id)
        if placement is None:
            placement = self._placements[transactional_id] = (partition_for(transactional_id, self.partitions), encode_key(transactional_id))
        partition, key = placement
        partition_log = self.replicas.get_log(TRANSACTION_STATE_TOPIC, partition)
        if partition_log is None:
            raise RuntimeError(f"{TRANSACTION_STATE_TOPIC}-{partition} is not open")
        return partition_log, key

    async def write(self, metadata: TxnMetadata) -> None:
        """Append and wait until durable: the coordinator's changes a client
        waits for (InitProducerId, an EndTxn's decision), each a round on
        its path (``broker.client_rounds``)."""
        durable = self._append(metadata.transactional_id, encode_value(metadata))
        note_durability_wait(durable)
        await self._told_when_durable(durable, metadata)

    def append(self, metadata: TxnMetadata) -> Awaitable[None]:
        """Append now (raises what the log refuses); the result is done once
        the record is durable. An id's records all go to one partition, in
        order, and durability there is a prefix, so a later record of the id
        is durable only with this one."""
        durable = self._append(metadata.transactional_id, encode_value(metadata))
        note_durability_wait(durable)  # an EndTxn's decision beside its data; Complete's comes after the answer and counts nothing
        return self._told_when_durable(durable, metadata)

    async def _told_when_durable(self, durable: Awaitable[None], metadata: TxnMetadata) -> None:
        await durable
        if self.on_written is not None:
            self.on_written(metadata)

    def append_unflushed(self, metadata: TxnMetadata) -> Callable[[], Awaitable[None]]:
        """Append now and ask for no fsync (AddPartitionsToTxn, answered
        once appended; Complete, which nothing answered depends on: ``on_written``
        is told of it now); the result, called, asks for one and returns a
        future done once the record is durable."""
        partition_log, key = self._placement(metadata.transactional_id)
        info = partition_log.append(encode_one_record_batch(key, encode_value(metadata), self.clock.wall_ms()), flush=False)
        if self.on_written is not None and metadata.state.is_complete:
            self.on_written(metadata)
        return lambda: partition_log.wait_durable(info.last_offset)

    async def tombstone(self, transactional_id: str) -> None:
        durable = self._append(transactional_id, None)
        self._placements.pop(transactional_id, None)
        await durable

    def _append(self, transactional_id: str, value: bytes | None) -> Awaitable[None]:
        partition_log, key = self._placement(transactional_id)
        info = partition_log.append(encode_one_record_batch(key, value, self.clock.wall_ms()))
        return partition_log.wait_durable(info.last_offset)


class MarkerWriter:
    """Appends COMMIT/ABORT control batches: the coordinator's, for every
    partition of a transaction it ends, and the ones a tool asks for with
    WriteTxnMarkers. Either way the marker is durable before it counts, and
    ``on_marker`` tells the group coordinator, so offsets pending in
    ``__consumer_offsets`` are applied or dropped with it."""

    def __init__(self, replicas, clock: Clock, crash_point: Callable[[str], None], on_marker: Callable | None = None):
        self.replicas = replicas
        self.clock = clock
        self.crash_point = crash_point
        self.on_marker = on_marker

    async def write_requested(self, topic: str, index: int, *, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool) -> None:
        """One marker a WriteTxnMarkers request asked for (KIP-664's abort of a
        hanging transaction). Raises what the partition's producer state refuses."""
        partition_log = self.replicas.get_log(topic, index)
        if partition_log is None:
            raise LookupError(f"no partition {topic}-{index}")
        info, _aborted = partition_log.append_marker(ControlType.COMMIT if commit else ControlType.ABORT, producer_id=producer_id,
                                                     producer_epoch=producer_epoch, coordinator_epoch=coordinator_epoch, timestamp=self.clock.wall_ms())
        await partition_log.wait_durable(info.last_offset)
        self.replicas.notify_appended(topic, index)
        if self.on_marker is not None:
            self.on_marker(topic, index, producer_id, commit)

    # -- A commit's decision (and a seal) names where the producer's data
    # ends in each partition; it is answered once that data is durable (with
    # transaction.durable.at.end its Produce and TxnOffsetCommit requests
    # were answered once appended, and this is the round that makes them
    # durable; without it they were durable before their answers).

    def data_ends(self, metadata: TxnMetadata) -> tuple:
        """(topic, partition, end) of each partition of the transaction
        that has a log, sorted: the end is where the producer's open
        transaction there ends (the last offset of its last batch + 1,
        from the log's producer state: a TxnOffsetCommit's offsets records
        in ``__consumer_offsets`` are its batches too), or 0 where it has
        none (added, never written to: nothing to find again, and any open
        transaction of the producer found there later is a later one's).

        Not the log's end: that may include other producers' bytes
        appended past this transaction's data and not yet durable (answered
        after their own fsync, or not at all), which a power cut may take
        back with this transaction whole; a decision naming them would be
        aborted at start though its data is there. A log that still
        reaches the producer's own end holds every byte of the
        transaction: a log keeps no byte past one a crash took back."""
        ends = []
        for partition in sorted(metadata.partitions, key=lambda p: (p.topic, p.partition)):
            partition_log = self.replicas.get_log(partition.topic, partition.partition)
            if partition_log is None:  # deleted: nothing of it will be read
                continue
            entry = partition_log.producer_state.producers.get(metadata.producer_id)
            # An open transaction of the producer id here is this one: the
            # partition's producer state refuses a batch of another epoch
            # while one is open, and version 2's decision (one epoch up)
            # comes before any batch of the next epoch.
            open_here = entry is not None and entry.current_txn_first_offset is not None
            ends.append((partition.topic, partition.partition, entry.last_offset + 1 if open_here else 0))
        return tuple(ends)

    def data_durable(self, metadata: TxnMetadata) -> Awaitable[None]:
        """Ask now (so that the decision's round covers them) for every log
        of ``metadata.data_ends`` to be durable up to its end; the result is
        done once all are (at once for a log durable that far already: a
        decision without ``transaction.durable.at.end``, its data answered
        once durable)."""
        waits = []
        for topic, index, end in metadata.data_ends:
            partition_log = self.replicas.get_log(topic, index)
            if partition_log is not None and end > partition_log.durable_offset:
                durable = partition_log.wait_durable(end - 1)
                note_durability_wait(durable)
                waits.append(durable)
        return asyncio.gather(*waits)

    def data_present(self, metadata: TxnMetadata) -> bool:
        """After a restart: whether each log of ``metadata.data_ends`` still
        reaches its end (a log that cannot be opened does not): with exact
        ends, whether the transaction's data is whole."""
        for topic, index, end in metadata.data_ends:
            try:
                partition_log = self.replicas.get_log(topic, index)
            except Exception as error:
                log.error("%s-%d cannot be opened (%s): the commit decided on its data cannot be checked", topic, index, error)
                return False
            if partition_log is not None and partition_log.log_end_offset < end:
                return False
        return True

    def opened_after(self, metadata: TxnMetadata) -> frozenset:
        """After a restart: each partition of ``metadata.data_ends`` (a
        commit's decision) where the producer's open transaction begins at
        or past the end the decision named: a later transaction's, begun
        once this commit's markers and Complete were appended. Its marker
        is there: a log keeps no byte past one a crash took back. This
        transaction's own data there begins below its end; where it wrote
        nothing (end 0) any open transaction of the producer is a later
        one's. (An end of an older record, its log's end at the decision,
        lies at or past the exact one and below the marker, so it tells
        the two apart the same way.)"""
        later = set()
        for topic, index, end in metadata.data_ends:
            partition_log = self.replicas.get_log(topic, index)
            entry = partition_log.producer_state.producers.get(metadata.producer_id) if partition_log is not None else None
            if entry is not None and entry.current_txn_first_offset is not None and entry.current_txn_first_offset >= end:
                later.add(TopicPartition(topic, index))
        return frozenset(later)

    async def write(self, metadata: TxnMetadata, commit: bool) -> None:
        """The markers of a transaction the coordinator ends, each durable
        before it counts (``on_marker``, fetchers woken)."""
        for partition, waiter, _offset in self._append_markers(metadata, commit):
            await waiter
            self.replicas.notify_appended(partition.topic, partition.partition)
            if self.on_marker is not None:
                self.on_marker(partition.topic, partition.partition, metadata.producer_id, commit)

    def append(self, metadata: TxnMetadata, commit: bool) -> tuple[Callable[[], Awaitable[None]], tuple]:
        """A commit's markers, appended now with no fsync asked for and
        counted at once (``on_marker``: the offsets they commit are applied
        before the coordinator takes the id's next request; fetchers woken:
        the transaction's data below them is durable, so it is readable up
        to the high watermark), since its decision and data are durable and
        a start after a crash writes a lost one again. Returns a callable
        that asks for their fsync and returns a future done once all are
        durable, and (topic, partition, marker offset, topic id) of each."""
        appended, marked_at = [], []
        for partition, partition_log, offset in self._append_markers(metadata, commit, ask=False):
            self.replicas.notify_appended(partition.topic, partition.partition)
            if self.on_marker is not None:
                self.on_marker(partition.topic, partition.partition, metadata.producer_id, commit)
            appended.append((partition_log, offset))
            marked_at.append((partition.topic, partition.partition, offset, self.replicas.topics[partition.topic].topic_id))

        def ask_durable() -> Awaitable[None]:
            # Asked again by the id's next records (two or three a
            # transaction), by when the markers' round is usually over: a
            # done future then, not a gather of done futures (what
            # ``wait_durable`` answers for an offset made durable on a log
            # that has not failed since).
            if all(partition_log.is_durable(offset) for partition_log, offset in appended):
                durable = asyncio.get_running_loop().create_future()
                durable.set_result(None)
                return durable
            return asyncio.gather(*(partition_log.wait_durable(offset) for partition_log, offset in appended))

        return ask_durable, tuple(marked_at)

    def _append_markers(self, metadata: TxnMetadata, commit: bool, *, ask: bool = True) -> list[tuple[TopicPartition, object, int]]:
        """Append the marker of every partition of ``metadata`` (a deleted
        one has none); (partition, its durability or, without ``ask``, its
        log, its offset) of each."""
        control = ControlType.COMMIT if commit else ControlType.ABORT
        waits = []
        for partition in sorted(metadata.partitions, key=lambda p: (p.topic, p.partition)):
            partition_log = self.replicas.get_log(partition.topic, partition.partition)
            if partition_log is None:
                log.warning("no log for %s (deleted?); skipping its %s marker", partition, control.name)
                continue
            if len(waits) == 1:
                self.crash_point("coordinator.markers_partial")
            info, _aborted = partition_log.append_marker(control, producer_id=metadata.producer_id, producer_epoch=metadata.producer_epoch,
                                                         coordinator_epoch=COORDINATOR_EPOCH, timestamp=self.clock.wall_ms())
            waits.append((partition, partition_log.wait_durable(info.last_offset) if ask else partition_log, info.last_offset))
        return waits


class TransactionManager:
    def __init__(self, *, replicas, config, crash_point: Callable[[str], None] = lambda name: None, on_marker=None, clock: Clock | None = None, on_state_written=None):
        self.replicas = replicas
        self.config = config
        self.crash_point = crash_point
        self.partitions = config.transaction_state_partitions
        clock = clock or Clock()
        self.state_log = StateLogWriter(replicas, self.partitions, clock, on_state_written)
        self.markers = MarkerWriter(replicas, clock, crash_point, on_marker)
        self.producer_ids = ProducerIdAllocator(os.path.join(replicas.data_dir, "__cluster_metadata"))
        self.coordinator = TransactionCoordinator(
            txn_log=self.state_log,
            markers=self.markers,
            producer_ids=self.producer_ids,
            settings=CoordinatorSettings(
                transaction_max_timeout_ms=config.transaction_max_timeout_ms,
                transactional_id_expiration_ms=config.transactional_id_expiration_ms,
                abort_timed_out_interval_ms=config.transaction_abort_interval_ms,
                durable_at_end=config.transaction_durable_at_end,
            ),
            clock=clock,
            coordinator_epoch=COORDINATOR_EPOCH,
            crash_point=crash_point,
        )

    def ensure_topic(self) -> None:
        if TRANSACTION_STATE_TOPIC not in self.replicas.topics:
            self.replicas.create_topic(
                TRANSACTION_STATE_TOPIC,
                self.partitions,
                {"cleanup.policy": "compact", "segment.bytes": str(100 * 1024 * 1024)},
                internal=True,
            )

    def load(self) -> None:
        """Replay ``__transaction_state`` into the coordinator (latest record per id wins)."""
        entries = []
        for _partition, partition_log in self.replicas.logs_to_replay(TRANSACTION_STATE_TOPIC):
            for batch in replay(partition_log):
                if batch.header.is_control:
                    continue
                for record in batch.records:
                    try:
                        transactional_id = decode_key(record.key)
                        entries.append((transactional_id, decode_value(transactional_id, record.value)))
                    except (ValueError, TypeError) as error:
                        log.error("skipping an unreadable %s record at offset %d: %s", TRANSACTION_STATE_TOPIC, record.offset, error)
        self.coordinator.load(entries)  # recover() logs what was loaded

    async def start(self, *, end_unknown_transactions: bool = True, abort_ongoing_after_unclean_stop: bool = True,
                    commit_decided_unmarked: bool = True, fence_ended_after_unclean_stop: bool = True,
                    abort_producer_of_unknown: bool = True) -> None:
        """Load; commit the open transactions whose commit was decided and
        whose markers a stop took back (``commit_decided_unmarked``: before
        anything else writes a marker there); recover; after an unclean
        stop with ``transaction.durable.at.end`` that was not the process's
        alone (a new boot of the kernel: ``ReplicaManager.same_boot``),
        abort every unsealed Ongoing transaction
        (``TransactionCoordinator.abort_ongoing_after_unclean_stop``) and
        fence the epoch of every id whose last transaction ended
        (``fence_ended_after_unclean_stop``). Each
        check switched off only for the tests that show what it prevents."""
        self.ensure_topic()
        self.load()
        if commit_decided_unmarked:
            await self.commit_decided_unmarked()
        self.coordinator.recover()
        if abort_ongoing_after_unclean_stop and self.config.transaction_durable_at_end and not self.replicas.stopped_clean:
            if self.replicas.same_boot:
                # Only the process died (the kernel's boot is the same): every
                # byte it answered for is still in the page cache, so an open
                # transaction lost nothing, and stays open as after a clean stop.
                log.info("unclean stop in this same boot of the kernel: the open transactions lost nothing and stay open")
            else:
                await self.coordinator.abort_ongoing_after_unclean_stop()
                if fence_ended_after_unclean_stop:
                    await self.coordinator.fence_ended_after_unclean_stop()
        if end_unknown_transactions:
            await self.end_unknown_transactions(abort_producer_of_unknown=abort_producer_of_unknown)

    async def commit_decided_unmarked(self) -> list[tuple[str, int, int]]:
        """Commit, with a durable COMMIT marker, every open transaction of
        an open partition that a decided commit covers
        (``TransactionCoordinator.decided_commit_covers``): a commit's
        markers are appended without waiting for their fsync once its data
        and decision are durable, and a power cut may keep its Complete
        record (or the next transaction's records) and lose a marker. Its
        EndTxn was answered: aborting it (``end_unknown_transactions``), or ending it with another
        transaction's marker, would lose a commit. Returns (topic, partition,
        producer id) of each one committed."""
        covered = []
        for topic, index, producer_id, producer_epoch, first_offset in self._open_transactions():
            info = self.replicas.topics.get(topic)
            if info is not None and self.coordinator.decided_commit_covers(producer_id, producer_epoch, TopicPartition(topic, index), info.topic_id, first_offset):
                covered.append((topic, index, producer_id, producer_epoch, first_offset))
        committed = []
        for topic, index, producer_id, producer_epoch, first_offset in covered:
            log.warning(
                "%s-%d: committing the open transaction of producer %d epoch %d from offset %d: its commit was decided "
                "and answered, and a crash took back its marker", topic, index, producer_id, producer_epoch, first_offset,
                extra={"event": "decided_commit_marked_at_start", "topic": topic, "partition": index, "producer_id": producer_id},
            )
            await self.markers.write_requested(topic, index, producer_id=producer_id, producer_epoch=producer_epoch, coordinator_epoch=COORDINATOR_EPOCH, commit=True)
            committed.append((topic, index, producer_id))
        return committed

    async def end_unknown_transactions(self, *, abort_producer_of_unknown: bool = True) -> list[tuple[str, int, int]]:
        """Abort, with a durable ABORT marker, every open transaction of an
        open partition that no transaction of the recovered state names
        (``TransactionCoordinator.is_known_open_transaction``): its
        AddPartitionsToTxn (AddOffsetsToTxn) record was lost to a power cut
        while its batch survived (a transactional Produce or TxnOffsetCommit
        is answered once its own data is durable, not that record). Nothing
        would ever end it (it would hold the partition's last stable
        offset), and a later transaction of the same producer and epoch
        would commit it with its own. Then, with
        ``abort_producer_of_unknown``, end the transaction each such
        producer began (``TransactionCoordinator.abort_after_unknown_batches``):
        left open without the batch (or ended at the same epoch), its commit
        would lose an answered batch, or be told it committed. Partitions
        not open now were closed whole while their records were durable:
        none holds such a batch. Returns (topic, partition, producer id) of
        each one aborted."""
        unknown = [
            (topic, index, producer_id, producer_epoch, first_offset)
            for topic, index, producer_id, producer_epoch, first_offset in self._open_transactions()
            if not self.coordinator.is_known_open_transaction(producer_id, producer_epoch, TopicPartition(topic, index))
        ]
        aborted = []
        for topic, index, producer_id, producer_epoch, first_offset in unknown:
            log.warning(
                "%s-%d: aborting the open transaction of producer %d epoch %d from offset %d: no transaction names it "
                "(its AddPartitionsToTxn record was lost to a crash)", topic, index, producer_id, producer_epoch, first_offset,
                extra={"event": "unknown_transaction_aborted", "topic": topic, "partition": index, "producer_id": producer_id},
            )
            try:
                await self.markers.write_requested(topic, index, producer_id=producer_id, producer_epoch=producer_epoch, coordinator_epoch=COORDINATOR_EPOCH, commit=False)
            except Exception as error:
                log.error("%s-%d: could not abort producer %d's unknown transaction: %s", topic, index, producer_id, error)
                continue
            aborted.append((topic, index, producer_id))
        if abort_producer_of_unknown and unknown:
            await self.coordinator.abort_after_unknown_batches((producer_id, producer_epoch) for _t, _i, producer_id, producer_epoch, _o in unknown)
        return aborted

    def _open_transactions(self) -> list[tuple[str, int, int, int, int]]:
        """(topic, partition, producer id, epoch, first offset) of every open
        transaction in an open partition (``__transaction_state`` aside)."""
        return [
            (topic, index, entry.producer_id, entry.producer_epoch, entry.current_txn_first_offset)
            for (topic, index), partition_log in list(self.replicas.logs.items()) if topic != TRANSACTION_STATE_TOPIC
            for entry in list(partition_log.producer_state.producers.values()) if entry.current_txn_first_offset is not None
        ]

    def background(self) -> dict:
        """The loop the broker runs in its TaskGroup while it serves (by name)."""
        return {"transaction timers": self._timers()}

    async def _timers(self) -> None:
        async def step() -> None:
            await self.coordinator.abort_timed_out()
            await self.coordinator.expire_transactional_ids()

        await every(self.config.transaction_abort_interval_ms / 1000.0, step, "transaction timers")

    async def stop(self) -> None:
        """After the broker has stopped ``background()`` and its listener."""
        await self.coordinator.close()
