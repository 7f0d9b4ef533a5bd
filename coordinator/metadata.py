"""Per-transactional-id metadata: the value the coordinator computes, writes to
``__transaction_state``, and only then swaps in.

``TxnMetadata`` is frozen; every change is ``attrs.evolve(...)`` producing the
next value, so the "write the intent, then apply it" order is visible at each
call site: ``pending = meta.prepare_commit(now)``, append ``pending`` to the
log, wait for it to be durable, then ``self.txns[id] = pending``.
"""

from __future__ import annotations

import attrs

from coordinator.state import TxnEvent, TxnState, transition

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_PRODUCER_EPOCH = 32767  # int16; an epoch this high forces a new producer id
# Kafka's ClientTransactionVersion: 2 is KIP-890 part 2 (the partition added by
# the first Produce, the epoch bumped at every EndTxn); below 2, the classic protocol.
TRANSACTION_VERSION_2 = 2


@attrs.frozen
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@attrs.frozen
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: frozenset[TopicPartition] = frozenset()
    last_update_ms: int = 0
    start_ms: int = -1
    # The epoch before the last bump, so a retried InitProducerId (KIP-360) or
    # EndTxn from the just-fenced epoch can be recognized.
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    previous_producer_id: int = NO_PRODUCER_ID
    next_producer_id: int = NO_PRODUCER_ID
    # The client's transaction version (Kafka's ClientTransactionVersion):
    # TRANSACTION_VERSION_2 once a client of KIP-890 part 2 began the transaction.
    transaction_version: int = 0
    # A PrepareCommit (and a seal) names, per partition of the transaction,
    # where its producer's data there ends: the last offset of its last
    # batch + 1, or 0 where it wrote nothing ((topic, partition, end
    # offset), sorted). The decision is answered only once its data is
    # durable up to those ends, so recovery commits only if every log still
    # reaches them, in either durability mode, and writes no marker again
    # where the producer's open transaction begins at or past one (a later
    # transaction's).
    data_ends: tuple = ()
    # Set only on a record read back without onceflow's exactness flag
    # (written before the ends were exact): each end is then its log's end
    # at the decision, which may lie past the producer's data (other
    # producers' bytes), so a log short of it may still hold the whole
    # transaction (``TransactionCoordinator.recover`` says what it does
    # with one).
    data_ends_are_log_ends: bool = False
    # Where the markers of the last committed transaction were appended,
    # without waiting for their fsync (its Complete and the next
    # transaction's records may reach the disk before them): (topic,
    # partition, marker offset, topic id). A start after a crash commits an
    # unmarked transaction of this producer that begins below them in the
    # same topic (``coordinator.decided_commit_covers``).
    # Carried by every later state until a write that waits for those
    # markers first (the next decision, InitProducerId) replaces it.
    committed_ends: tuple = ()

    # -- transitions: each returns the next value; the caller persists it first --

    def _next(self, event: TxnEvent, now_ms: int, **changes) -> "TxnMetadata":
        return attrs.evolve(self, state=transition(self.state, event), last_update_ms=now_ms, **changes)

    def add_partitions(self, partitions, now_ms: int, transaction_version: int | None = None) -> "TxnMetadata":
        start = self.start_ms if self.state == TxnState.ONGOING else now_ms
        version = self.transaction_version if transaction_version is None else transaction_version
        return self._next(TxnEvent.ADD_PARTITIONS, now_ms, partitions=self.partitions | frozenset(partitions), start_ms=start, transaction_version=version)

    def seal(self, data_ends: tuple, now_ms: int) -> "TxnMetadata":
        """The transaction stays open with its data durable up to
        ``data_ends``: an unclean stop then spares it (``sealed``)."""
        return self._next(TxnEvent.SEAL, now_ms, data_ends=data_ends, data_ends_are_log_ends=False)

    def with_data_ends(self, data_ends: tuple) -> "TxnMetadata":
        """This decision, naming where its producer's data ends (exact)."""
        return attrs.evolve(self, data_ends=data_ends, data_ends_are_log_ends=False)

    @property
    def sealed(self) -> bool:
        """An open transaction whose data was made durable and recorded
        (``seal``): after an unclean stop it stays open if its data is whole,
        and what it is sent from then on is answered only once durable."""
        return self.state == TxnState.ONGOING and bool(self.data_ends)

    def prepare_commit(self, now_ms: int) -> "TxnMetadata":
        # A seal's data ends are not the decision's (the coordinator names
        # those when it writes a decision under ``transaction.durable.at.end``).
        return self._next(TxnEvent.COMMIT, now_ms, data_ends=())

    def prepare_end_bumped(self, commit: bool, now_ms: int, next_producer_id: int = NO_PRODUCER_ID) -> "TxnMetadata":
        """KIP-890 part 2's EndTxn: the decision carries the next epoch, so
        its markers fence every request of the transaction that arrives
        late, and the next transaction begins at that epoch. At the top of
        the epoch range the markers keep the last epoch and Complete moves
        the id to ``next_producer_id`` (epoch 0)."""
        if self.state == TxnState.ONGOING:
            event = TxnEvent.COMMIT if commit else TxnEvent.ABORT
        else:
            event = TxnEvent.COMMIT if commit else TxnEvent.ABORT_NOTHING_ADDED
        return self._next(
            event,
            now_ms,
            producer_epoch=min(self.producer_epoch + 1, MAX_PRODUCER_EPOCH),
            last_producer_epoch=self.producer_epoch,
            next_producer_id=next_producer_id,
            transaction_version=TRANSACTION_VERSION_2,
            data_ends=(),
        )

    @property
    def epoch_after_end(self) -> tuple[int, int]:
        """(producer id, epoch) a client of transaction version 2 goes on
        with once this decision is complete (the EndTxn answer)."""
        if self.next_producer_id != NO_PRODUCER_ID:
            return self.next_producer_id, 0
        return self.producer_id, self.producer_epoch

    def prepare_abort(self, now_ms: int, *, bump_epoch: bool = False) -> "TxnMetadata":
        if bump_epoch:
            return self._next(
                TxnEvent.ABORT,
                now_ms,
                producer_epoch=self.producer_epoch + 1,
                last_producer_epoch=self.producer_epoch,
                data_ends=(),
            )
        return self._next(TxnEvent.ABORT, now_ms, data_ends=())

    def abort_ended(self, now_ms: int, *, bump_epoch: bool = True) -> "TxnMetadata":
        """From an ended state (Empty, Complete): the abort of a transaction
        the producer began at this epoch and the state lost, found at start
        by its batch alone; no partition to mark (the broker marks that
        batch itself). The epoch is bumped, as a timed-out abort's is."""
        changes = {"producer_epoch": self.producer_epoch + 1, "last_producer_epoch": self.producer_epoch} if bump_epoch else {}
        return self._next(TxnEvent.ABORT_ENDED, now_ms, partitions=frozenset(), data_ends=(), **changes)

    def fence(self, now_ms: int) -> "TxnMetadata":
        return self._next(TxnEvent.FENCE, now_ms, data_ends=())

    def complete(self, now_ms: int, *, committed_ends: tuple = ()) -> "TxnMetadata":
        """Markers written: Complete. ``committed_ends``: a commit's markers
        were appended, not yet durable; the record names where (with topic
        ids) so that recovery can finish them."""
        if self.next_producer_id != NO_PRODUCER_ID:
            # The epoch range is used up: the id goes on with the next producer id.
            return self._next(
                TxnEvent.MARKERS_WRITTEN,
                now_ms,
                partitions=frozenset(),
                start_ms=-1,
                data_ends=(),
                previous_producer_id=self.producer_id,
                producer_id=self.next_producer_id,
                producer_epoch=0,
                last_producer_epoch=NO_PRODUCER_EPOCH,
                next_producer_id=NO_PRODUCER_ID,
                committed_ends=(),
            )
        return self._next(TxnEvent.MARKERS_WRITTEN, now_ms, partitions=frozenset(), start_ms=-1, data_ends=(), committed_ends=committed_ends)

    def init_producer(self, producer_id: int, producer_epoch: int, timeout_ms: int, now_ms: int) -> "TxnMetadata":
        return self._next(
            TxnEvent.INIT_PRODUCER_ID,
            now_ms,
            previous_producer_id=self.producer_id if producer_id != self.producer_id else self.previous_producer_id,
            producer_id=producer_id,
            last_producer_epoch=self.producer_epoch if producer_id == self.producer_id else NO_PRODUCER_EPOCH,
            producer_epoch=producer_epoch,
            timeout_ms=timeout_ms,
            partitions=frozenset(),
            start_ms=-1,
            committed_ends=(),
        )

    def fence_ended(self, now_ms: int, next_producer_id: int = NO_PRODUCER_ID) -> "TxnMetadata":
        """No transaction open, the epoch moved on, and no "last epoch" left
        that a retry from the old one could match: every request of the old
        epoch is fenced (``TransactionCoordinator.fence_ended_after_unclean_stop``).
        At the top of the epoch range the id moves to ``next_producer_id``,
        naming no previous producer id the old one could be taken for."""
        if next_producer_id != NO_PRODUCER_ID:
            return self._next(TxnEvent.FENCE_ENDED, now_ms, producer_id=next_producer_id, producer_epoch=0,
                              last_producer_epoch=NO_PRODUCER_EPOCH, previous_producer_id=NO_PRODUCER_ID)
        return self._next(TxnEvent.FENCE_ENDED, now_ms, producer_epoch=self.producer_epoch + 1, last_producer_epoch=NO_PRODUCER_EPOCH)

    def expire(self, now_ms: int) -> "TxnMetadata":
        return self._next(TxnEvent.EXPIRE, now_ms)

    def transaction_deadline_ms(self) -> int | None:
        if self.state != TxnState.ONGOING or self.start_ms < 0:
            return None
        return self.start_ms + self.timeout_ms
