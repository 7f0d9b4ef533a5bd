"""Wakes a transactional client whose TxnOffsetCommit never comes.

The client this is for: librdkafka 2.16 (confluent-kafka 2.16) with its
default ``metadata.recovery.strategy=rebootstrap``. When it sees every broker
down (with one broker: at every broker restart) it re-bootstraps and
decommissions the broker handles it had learned, but its coordinator cache
keeps the decommissioned handle as the group's coordinator. The next
``send_offsets_to_transaction`` gets AddOffsetsToTxn answered, then parks its
TxnOffsetCommit until that handle changes state, which a decommissioned
handle never does: only another handle's state change wakes it
(confluentinc/librdkafka#5511), and its own timeout is not checked either
(#5456). The transaction hangs until the coordinator aborts it at
``transaction.timeout.ms`` and fences the producer.

What the broker sees is the symptom: AddOffsetsToTxn answered, then neither
TxnOffsetCommit nor EndTxn from that transactional id. After
``transaction.offset.commit.stall.ms`` (onceflow's own setting) it closes the
connection the AddOffsetsToTxn came on, once per AddOffsetsToTxn. The
client's transaction-coordinator handle goes down and up again; that state
change wakes the parked request, which looks the group coordinator up again
and sends. A closed connection is something every Kafka client survives (its
requests are retried as after any network failure), and a healthy client
sends TxnOffsetCommit within milliseconds of the answer, so a client that is
merely slow loses one connection and nothing else.

``PendingOffsetCommits`` is the bookkeeping (no I/O, its own clock readings);
``OffsetCommitWatch`` wraps the broker's dispatcher to feed it and runs the
loop that closes the connections when they are due.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import attrs

from protocol.errors import ErrorCode
from protocol.messages import ApiKey

log = logging.getLogger(__name__)


@attrs.frozen
class _Waiting:
    due: float  # monotonic seconds
    close_connection: Callable[[str], None]


@attrs.define
class PendingOffsetCommits:
    """Transactional ids whose AddOffsetsToTxn was answered and whose
    TxnOffsetCommit (or EndTxn) has not come yet, each with the connection
    to close when it is ``wait_seconds`` overdue."""

    wait_seconds: float
    # transactional id -> its wait, oldest first (every wait is as long, so
    # insertion order is due order)
    _waiting: dict[str, _Waiting] = attrs.field(factory=dict)

    def offsets_added(self, transactional_id: str, close_connection: Callable[[str], None], now: float) -> None:
        self._waiting.pop(transactional_id, None)  # re-added: its wait starts again, at the end
        self._waiting[transactional_id] = _Waiting(now + self.wait_seconds, close_connection)

    def progressed(self, transactional_id: str) -> None:
        """TxnOffsetCommit or EndTxn arrived: this client is not stuck."""
        self._waiting.pop(transactional_id, None)

    def due(self, now: float) -> list[tuple[str, Callable[[str], None]]]:
        """The waits that are over, removed: (transactional id, its connection's close)."""
        over = []
        for transactional_id, waiting in self._waiting.items():
            if waiting.due > now:
                break
            over.append((transactional_id, waiting.close_connection))
        for transactional_id, _close in over:
            del self._waiting[transactional_id]
        return over

    def next_due(self) -> float | None:
        return next(iter(self._waiting.values())).due if self._waiting else None

    def __len__(self) -> int:
        return len(self._waiting)


class OffsetCommitWatch:
    """Wraps a dispatcher ``(request, session) -> answer``: notes each
    answered AddOffsetsToTxn with its connection and each TxnOffsetCommit and
    EndTxn; ``run()`` closes the connections whose wait is over."""

    def __init__(self, inner, *, wait_ms: int, clock: Callable[[], float]):
        self._inner = inner
        self.pending = PendingOffsetCommits(wait_ms / 1000.0)
        self._wait_ms = wait_ms
        self._clock = clock  # () -> monotonic seconds
        self._added = asyncio.Event()
        self.closed = 0  # connections closed so far (for tests and the log)

    async def __call__(self, request, session):
        api_key = request.api_key
        if api_key in (ApiKey.TXN_OFFSET_COMMIT, ApiKey.END_TXN):
            transactional_id = request.body.get("transactional_id")
            if transactional_id:
                self.pending.progressed(transactional_id)
        answer = await self._inner(request, session)
        if api_key == ApiKey.ADD_OFFSETS_TO_TXN and session is not None and session.close_connection is not None:
            transactional_id = request.body.get("transactional_id")
            if transactional_id and answer is not None and answer.get("error_code", ErrorCode.NONE) == ErrorCode.NONE:
                self.pending.offsets_added(transactional_id, session.close_connection, self._clock())
                self._added.set()
        return answer

    async def run(self) -> None:
        """Close each connection when its wait is over; forever (a broker loop)."""
        while True:
            now = self._clock()
            for transactional_id, close_connection in self.pending.due(now):
                self.closed += 1
                close_connection(
                    f"transactional id {transactional_id!r} had AddOffsetsToTxn answered {self._wait_ms} ms ago and sent "
                    "neither TxnOffsetCommit nor EndTxn (a client waiting on a stale group coordinator, such as librdkafka "
                    "after a re-bootstrap: the reconnect wakes it; transaction.offset.commit.stall.ms)"
                )
            next_due = self.pending.next_due()
            if next_due is None:
                self._added.clear()
                await self._added.wait()
            else:
                await asyncio.sleep(max(0.0, next_due - now))
