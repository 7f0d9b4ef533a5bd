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

    # -- transitions: each returns the next value; the caller persists it first --

    def _next(self, event: TxnEvent, now_ms: int, **changes) -> "TxnMetadata":
        return attrs.evolve(self, state=transition(self.state, event), last_update_ms=now_ms, **changes)

    def add_partitions(self, partitions, now_ms: int) -> "TxnMetadata":
        start = self.start_ms if self.state == TxnState.ONGOING else now_ms
        return self._next(TxnEvent.ADD_PARTITIONS, now_ms, partitions=self.partitions | frozenset(partitions), start_ms=start)

    def prepare_commit(self, now_ms: int) -> "TxnMetadata":
        return self._next(TxnEvent.COMMIT, now_ms)

    def prepare_abort(self, now_ms: int, *, bump_epoch: bool = False) -> "TxnMetadata":
        if bump_epoch:
            return self._next(
                TxnEvent.ABORT,
                now_ms,
                producer_epoch=self.producer_epoch + 1,
                last_producer_epoch=self.producer_epoch,
            )
        return self._next(TxnEvent.ABORT, now_ms)

    def fence(self, now_ms: int) -> "TxnMetadata":
        return self._next(TxnEvent.FENCE, now_ms)

    def complete(self, now_ms: int) -> "TxnMetadata":
        return self._next(TxnEvent.MARKERS_WRITTEN, now_ms, partitions=frozenset(), start_ms=-1)

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
        )

    def expire(self, now_ms: int) -> "TxnMetadata":
        return self._next(TxnEvent.EXPIRE, now_ms)

    def transaction_deadline_ms(self) -> int | None:
        if self.state != TxnState.ONGOING or self.start_ms < 0:
            return None
        return self.start_ms + self.timeout_ms
