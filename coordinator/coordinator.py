"""The transaction coordinator: InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn, timeouts and recovery, over injected I/O.

The coordinator decides; three collaborators do the I/O and are passed in
(so tests drive it with fakes and the fault harness with broken ones):

- ``txn_log.write(metadata)``: append the transactional id's next metadata to
  its ``__transaction_state`` partition and return once it is durable
  (raising if it could not be written); ``txn_log.append(metadata)``: append
  it and return at once an awaitable of its durability (for Complete);
- ``markers.write(metadata, commit)``: append a COMMIT/ABORT control batch to
  every partition of the transaction (data partitions and
  ``__consumer_offsets``) and return once all are durable;
- ``producer_ids.allocate()``: a producer id never handed out before, even
  across crashes.

The durability rule is "write, then apply": the next metadata is computed
(``TxnMetadata`` is frozen), written, and only then put in ``self.txns``. The
commit decision (PrepareCommit/PrepareAbort) is durable before any marker is
written, and Complete is written only after every marker is; after a crash,
``recover()`` finishes every transaction found in a Prepare state. Complete
alone is applied once appended, before it is durable: until it is, a crash
leaves the Prepare state last in the log and recovery completes the
transaction again (markers are idempotent), and nothing answered depends on
it (the next change of the id is appended behind it in the same log).

AddPartitionsToTxn and AddOffsetsToTxn are answered once appended, before
their record is durable (``txn_log.append_unflushed``, which starts no
fsync), and a transactional Produce or TxnOffsetCommit waits only for its
own data: the records are made durable by EndTxn's round (its Prepare
lands behind them in the same log), so a transaction's client waits for
rounds of one file each. What a power cut can leave then is a partition's
durable transactional batch whose AddPartitions (AddOffsets) record was
lost: the state went back to an Ongoing transaction without that
partition, or to the producer's last ended transaction at the same epoch.
The broker aborts such a batch at start, before it serves, as no
transaction of the recovered state names it (``is_known_open_transaction``),
and ends its producer's transaction too (``abort_after_unknown_batches``):
an unknown batch of producer P at its id's current epoch proves P began a
transaction after its last decided one, so P's EndTxn(commit) must neither
commit the rest without the batch nor be taken for a retry of the last
one. It is told UNKNOWN_PRODUCER_ID (abortable), as after an abort at
recovery, and so is a batch of that epoch (``verify_transactional_produce``).
A Produce that was not answered and whose batch was lost too is retried
after the restart and refused (its partition is in no transaction), as
before.

Every commit decision names where its producer's data ends in each
partition of the transaction (``TxnMetadata.data_ends``: its last batch's
last offset + 1, not the log's end) and is answered only once that data
is durable too (``markers.data_durable``, asked beside the decision's
own round). With ``CoordinatorSettings.durable_at_end`` (the broker's
``transaction.durable.at.end``) a transactional Produce or TxnOffsetCommit
is answered once appended, before any fsync, and that round is the one
that makes the data durable; without it the data was durable before its
answers (unless a client sent EndTxn before its Produce was answered),
and the wait is over at once. A power cut before the round is over may
keep the decision and lose data (the kernel writes pages back in any
order), so ``recover`` completes a PrepareCommit only if every log still
reaches its end, and otherwise aborts it (``_abort_decided_commit``: its
EndTxn was never answered), whatever the setting is now: a decision
written with it on may be recovered by a broker started with it off.
After
an unclean stop the broker calls ``abort_ongoing_after_unclean_stop``: an
Ongoing transaction may have lost bytes its client was answered for, so it
is aborted with an epoch bump, and its producer's commit is told
UNKNOWN_PRODUCER_ID (abortable for librdkafka and ``txn``; PRODUCER_FENCED
is fatal to librdkafka). Then ``fence_ended_after_unclean_stop`` bumps the
epoch of every id whose last transaction ended, with no "last epoch" left:
a next transaction of its producer may have been answered and taken back
whole, leaving no trace, and the old epoch's EndTxn(commit) would be taken
for a retry of the last one (version 1) or another partition added and
committed without what was lost; the old epoch is told PRODUCER_FENCED.

A commit's markers (in either mode) are appended and its Complete follows
without waiting for their fsync: the decision and the data are durable,
and the client's next transaction need not wait for that round. Complete
and the id's later records name where each marker was appended, with its
topic's id (``committed_ends``), so that a start after a power cut that
kept them and lost a marker commits the partition's unmarked transaction
(``decided_commit_covers``); the id's next Complete (or InitProducerId, or
expiry), which drops those places, is written only once those markers are
durable (``_previous_markers_durable``). Complete asks for no fsync round of
its own: nothing answered depends on it, and the id's next record's round
covers it. An abort's markers are durable before its
Complete, as before: a lost one leaves a transaction that the start's
check for unknown ones aborts anyway.

Transaction version 2 (KIP-890 part 2) changes three things, chosen per
request by the client's version of it: the first transactional Produce
(v12) or TxnOffsetCommit (v5) adds its partition itself (the broker calls
``add_partitions`` with ``transaction_version=2``: no AddPartitionsToTxn
round trip, and the same once-appended record as above);
``end_transaction_bumped`` (EndTxn v5) writes the decision with the next
epoch, so its markers fence whatever of the transaction arrives late and
the client goes on at the epoch the answer names; and an abort with no
partition added is still a decision (it bumps the epoch too).

Only one state change per transactional id is in flight at a time; a request
that arrives meanwhile gets CONCURRENT_TRANSACTIONS (retriable), as in Kafka.
A state change, once started, runs to its end as the coordinator's own task
(``protocol.tasks.OwnedWork``): the request that started it awaits it through
``asyncio.shield``, so a request cancelled meanwhile (its connection died,
taking its sibling requests with it) loses only its answer, never the apply
that follows a durable write (memory would stay behind ``__transaction_state``
and the id busy until a restart).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Iterable, Protocol

import attrs

from coordinator.metadata import (
    MAX_PRODUCER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    TRANSACTION_VERSION_2,
    TopicPartition,
    TxnMetadata,
)
from coordinator.state import STATE_NAMES, InvalidTransition, TxnState
from protocol.clock import Clock
from protocol.errors import ErrorCode
from protocol.retry import COORDINATOR_COMPLETION, Backoff, retry
from protocol.tasks import OwnedWork

log = logging.getLogger(__name__)

DEFAULT_TRANSACTION_MAX_TIMEOUT_MS = 15 * 60 * 1000
DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS = 7 * 24 * 3600 * 1000
DEFAULT_ABORT_TIMED_OUT_INTERVAL_MS = 10_000


class TxnLog(Protocol):
    async def write(self, metadata: TxnMetadata) -> None: ...

    def append(self, metadata: TxnMetadata) -> Awaitable[None]:
        """Append ``metadata`` now; the result is done once it is durable.
        Every later record of the same id lands behind it in the same log,
        so the fsync that makes a later one durable covers this one too."""
        ...

    def append_unflushed(self, metadata: TxnMetadata) -> Callable[[], Awaitable[None]]:
        """Append ``metadata`` now (raising what the log refuses) and start
        no fsync; the result, called (any number of times), asks for the
        fsync and returns an awaitable done once the record is durable."""
        ...

    async def tombstone(self, transactional_id: str) -> None: ...


class MarkerWriter(Protocol):
    async def write(self, metadata: TxnMetadata, commit: bool) -> None: ...

    def append(self, metadata: TxnMetadata, commit: bool) -> tuple[Callable[[], Awaitable[None]], tuple]:
        """Append the markers now, with no await and no fsync asked for
        (what reads the markers of ``__consumer_offsets`` is told at once).
        Returns a callable that asks for their fsync and returns an
        awaitable done once every one is durable, and where each landed:
        (topic, partition, the marker's offset, the topic's id), sorted."""
        ...

    # Every commit decision names them and its round covers the data up to
    # them (recovery's ``data_present`` and ``opened_after``):
    def data_ends(self, metadata: TxnMetadata) -> tuple:
        """(topic, partition, end) of every partition of the transaction
        (data and ``__consumer_offsets``) now, sorted: where the producer's
        data there ends (its last batch's last offset + 1), 0 where it
        wrote nothing."""
        ...

    def data_durable(self, metadata: TxnMetadata) -> Awaitable[None]:
        """Ask now for every log of ``metadata.data_ends`` to be made
        durable up to its end; the result is done once it is (raising if
        some never will be)."""
        ...

    def data_present(self, metadata: TxnMetadata) -> bool:
        """After a restart: whether every log of ``metadata.data_ends``
        still reaches its end offset (nothing of the data a crash took back)."""
        ...

    def opened_after(self, metadata: TxnMetadata) -> frozenset:
        """After a restart: the partitions of ``metadata.data_ends`` where
        the producer's open transaction begins at or past the end named."""
        ...


class ProducerIdSource(Protocol):
    def allocate(self) -> int: ...


@attrs.frozen
class InitResult:
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@attrs.frozen
class EndResult:
    """EndTxn's answer; with transaction version 2 also the producer id and
    epoch the client goes on with."""

    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@attrs.frozen
class CoordinatorSettings:
    transaction_max_timeout_ms: int = DEFAULT_TRANSACTION_MAX_TIMEOUT_MS
    transactional_id_expiration_ms: int = DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS
    abort_timed_out_interval_ms: int = DEFAULT_ABORT_TIMED_OUT_INTERVAL_MS
    # Transactional Produce/TxnOffsetCommit answered once appended: a commit's
    # decision's fsync round is the one that makes its data durable.
    durable_at_end: bool = False


class TxnTable(dict):
    """transactional id -> its metadata, also found by producer id: every
    transactional Produce asks whether its partition is in its producer's
    transaction (KIP-890), which was a scan of every id."""

    def __init__(self):
        super().__init__()
        self._by_producer_id: dict[int, str] = {}

    def of_producer(self, producer_id: int) -> TxnMetadata | None:
        transactional_id = self._by_producer_id.get(producer_id)
        return None if transactional_id is None else self.get(transactional_id)

    def __setitem__(self, transactional_id: str, metadata: TxnMetadata) -> None:
        self._unindex(transactional_id)
        super().__setitem__(transactional_id, metadata)
        self._by_producer_id[metadata.producer_id] = transactional_id

    def __delitem__(self, transactional_id: str) -> None:
        self._unindex(transactional_id)
        super().__delitem__(transactional_id)

    def pop(self, transactional_id: str, *default):
        self._unindex(transactional_id)
        return super().pop(transactional_id, *default)

    def _unindex(self, transactional_id: str) -> None:
        previous = self.get(transactional_id)
        if previous is not None and self._by_producer_id.get(previous.producer_id) == transactional_id:
            del self._by_producer_id[previous.producer_id]


# EndTxn's answer reaches its connection's writer three loop turns after
# the decision is applied (the shield around the change wakes the request,
# the request's task ends, the writer wakes and writes). A completion
# started at once appended the markers and their round ran its fsync on the
# loop ahead of the answer: in every one of 1,146 transactions of a probe,
# 0.17-0.23 ms of a 3.5 ms transaction. The completion waits those turns out.
ANSWER_TURNS = 3


class TransactionCoordinator:
    def __init__(
        self,
        *,
        txn_log: TxnLog,
        markers: MarkerWriter,
        producer_ids: ProducerIdSource,
        settings: CoordinatorSettings = CoordinatorSettings(),
        clock: Clock | None = None,
        coordinator_epoch: int = 0,
        crash_point: Callable[[str], None] = lambda name: None,
    ):
        self.txn_log = txn_log
        self.markers = markers
        self.producer_ids = producer_ids
        self.settings = settings
        # Every time here is written to __transaction_state (start, last
        # update) and compared after restarts: wall-clock milliseconds.
        self.clock = clock or Clock()
        self.coordinator_epoch = coordinator_epoch
        # The fault harness's seam: named points where a test may kill us.
        self.crash_point = crash_point
        self.txns = TxnTable()
        # Ids with a state change in flight (set before it starts, cleared
        # when it is applied or failed; for a Prepare state, once Complete is
        # appended).
        self._busy: set[str] = set()
        # State changes and completions (markers then Complete) each have this owner.
        self._work = OwnedWork("transaction coordinator")
        self._completing: dict[str, asyncio.Task] = {}
        # Set when an id stops being busy, for requests waiting on it (``_await_quiet``).
        self._quiet: dict[str, asyncio.Event] = {}
        # Ids whose last commit's markers were appended without an fsync,
        # and how to ask for it and wait (``_complete``).
        self._markers_pending: dict[str, Callable[[], Awaitable[None]]] = {}
        # id -> the epoch its producer had when the transaction was aborted
        # after an unclean stop (``abort_ongoing_after_unclean_stop``): that
        # producer's EndTxn(commit) is told UNKNOWN_PRODUCER_ID, which the
        # clients treat as abortable (memory only: a later restart forgets).
        self._aborted_at_recovery: dict[str, int] = {}
        self.loading = False

    # -- recovery ---------------------------------------------------------------

    def load(self, entries: Iterable[tuple[str, TxnMetadata | None]]) -> None:
        """Rebuild from ``__transaction_state`` records in log order (None = tombstone)."""
        for transactional_id, metadata in entries:
            if metadata is None:
                self.txns.pop(transactional_id, None)
            else:
                self.txns[transactional_id] = metadata

    def recover(self) -> list[asyncio.Task]:
        """Finish every transaction left in a Prepare state (and fence-aborts);
        one INFO line says what was loaded and what recovery does with it."""
        tasks = []
        for transactional_id, metadata in list(self.txns.items()):
            if metadata.state.is_prepare:
                log.debug(
                    "recovering transaction %s in %s: rewriting markers", transactional_id, _state_name(metadata.state),
                    extra={"transactional_id": transactional_id, "producer_id": metadata.producer_id, "producer_epoch": metadata.producer_epoch, "state": _state_name(metadata.state)},
                )
                self._busy.add(transactional_id)
                if not self._decided_data_whole(metadata):
                    tasks.append(self._work.start(self._write_then_apply(self._abort_decided_commit(metadata))))
                    continue
                metadata = self._without_later_transactions(metadata)
                tasks.append(self._spawn_completion(metadata))
        states = [metadata.state for metadata in self.txns.values()]
        counts = {
            "transactional_ids": len(states),
            "completing_commit": states.count(TxnState.PREPARE_COMMIT),
            "completing_abort": states.count(TxnState.PREPARE_ABORT),
            "ongoing": states.count(TxnState.ONGOING) + states.count(TxnState.PREPARE_EPOCH_FENCE),
        }
        log.info(
            "recovery: loaded %(transactional_ids)d transactional ids; completing %(completing_commit)d prepared commits and "
            "%(completing_abort)d prepared aborts (markers rewritten); %(ongoing)d transactions ongoing (aborted if their timeout passes)",
            counts,
            extra={"event": "transaction_recovery", **counts},
        )
        return tasks

    def _decided_data_whole(self, prepared: TxnMetadata) -> bool:
        """Whether a Prepare state found at start may be completed: a
        PrepareCommit only if every log still reaches the end its decision
        named (``markers.data_present``). Its decision was answered only
        once its data was durable up to those ends, so a log short of one
        means the answer was never given, whatever ``durable_at_end`` says
        now (a decision written with it on, recovered after a power cut
        with it off, would otherwise be committed over the hole).

        A record written before the ends were exact
        (``data_ends_are_log_ends``) names its logs' ends at the decision,
        which may lie past the data, and does not say the setting it was
        written under: with the setting on, that decision was answered
        only once durable up to those ends, and a log short of one means it
        was never answered, as before; with it off, it is completed as
        before, unchecked: written in the default mode, a log short of it
        may have lost only other producers' bytes past a commit that was
        answered, and aborting that would lose it. So for such an old
        record only, the setting changed across an unclean stop still
        misleads: written with it on and recovered with it off, it is
        completed over a hole; written with it off and recovered with it on,
        a cut of other producers' bytes aborts an answered commit. It lives
        only until its Complete (the next start of this version completes
        or aborts it), so only a stop with a decision in flight, across the
        upgrade, can leave one."""
        if prepared.state != TxnState.PREPARE_COMMIT or not prepared.data_ends:
            return True
        if prepared.data_ends_are_log_ends and not self.settings.durable_at_end:
            return True
        return self.markers.data_present(prepared)

    def _without_later_transactions(self, prepared: TxnMetadata) -> TxnMetadata:
        """A PrepareCommit about to be completed again at start, less the
        partitions where its producer's open transaction begins at or past
        the end the decision named (``MarkerWriter.opened_after``): that
        is a later transaction's, begun once this one's Complete was
        appended, and a power cut took Complete back and kept its batch
        (answered once durable, its own AddPartitions record lost with
        Complete). This commit's marker lies before it there, kept; a marker
        written again would commit the later batch. It is left open for the
        start's check for unknown transactions (``abort_after_unknown_batches``).
        The id holds this in memory until Complete replaces it."""
        later = self.markers.opened_after(prepared) if prepared.state == TxnState.PREPARE_COMMIT and prepared.data_ends else frozenset()
        if not later:
            return prepared
        log.warning(
            "transaction %s: completing its decided commit again, with no marker for %s: the producer's open transaction there "
            "began after this commit", prepared.transactional_id, ", ".join(sorted(str(p) for p in later)),
            extra={"event": "later_transaction_left_at_recovery", "transactional_id": prepared.transactional_id, "producer_id": prepared.producer_id},
        )
        prepared = attrs.evolve(prepared, partitions=prepared.partitions - later)
        self.txns[prepared.transactional_id] = prepared
        return prepared

    def _abort_decided_commit(self, prepared: TxnMetadata) -> TxnMetadata:
        """A PrepareCommit whose data a crash took back (it and its data
        shared one fsync round, and the cut kept the record, not all the
        data): its EndTxn was never answered, so it is aborted instead, with
        an epoch bump, and the producer's retried commit is told
        UNKNOWN_PRODUCER_ID (abortable)."""
        log.warning(
            "transaction %s: its commit was decided but a crash took back some of its data; aborting it", prepared.transactional_id,
            extra={"event": "decided_commit_aborted_at_recovery", "transactional_id": prepared.transactional_id, "producer_id": prepared.producer_id},
        )
        if prepared.transaction_version >= TRANSACTION_VERSION_2:
            self._aborted_at_recovery[prepared.transactional_id] = prepared.last_producer_epoch  # the decision bumped already
            return attrs.evolve(prepared, state=TxnState.PREPARE_ABORT, data_ends=(), last_update_ms=self.clock.wall_ms())
        self._aborted_at_recovery[prepared.transactional_id] = prepared.producer_epoch
        bumped = min(prepared.producer_epoch + 1, MAX_PRODUCER_EPOCH)
        return attrs.evolve(
            prepared, state=TxnState.PREPARE_ABORT, data_ends=(), last_update_ms=self.clock.wall_ms(), producer_epoch=bumped, last_producer_epoch=prepared.producer_epoch,
        )

    async def abort_ongoing_after_unclean_stop(self) -> list[str]:
        """``durable_at_end`` after an unclean stop: a transactional Produce
        or TxnOffsetCommit was answered once appended, so an Ongoing
        transaction may have lost acknowledged bytes while its record
        survived; committed, it would have a hole. Abort each one as a timed
        out one is (epoch bump, markers). Prepare states are ``recover``'s:
        a PrepareCommit completes if the data it names is whole. Returns
        the ids aborted."""
        aborted = []
        for transactional_id, metadata in list(self.txns.items()):
            if metadata.state != TxnState.ONGOING or transactional_id in self._busy:
                continue
            if metadata.sealed and self.markers.data_present(metadata):
                log.info(
                    "transaction %s was sealed before the unclean stop and its data is whole: it stays open", transactional_id,
                    extra={"event": "sealed_transaction_kept_at_recovery", "transactional_id": transactional_id, "producer_id": metadata.producer_id},
                )
                continue
            log.warning(
                "transaction %s was open at an unclean stop: aborting it (bytes it was answered for may be lost)", transactional_id,
                extra={"event": "ongoing_transaction_aborted_at_recovery", "transactional_id": transactional_id, "producer_id": metadata.producer_id},
            )
            self._aborted_at_recovery[transactional_id] = metadata.producer_epoch
            await self._abort_with_bump(metadata)
            aborted.append(transactional_id)
        return aborted

    async def fence_ended_after_unclean_stop(self) -> list[str]:
        """``durable_at_end`` after an unclean stop, once ``recover`` and
        ``abort_ongoing_after_unclean_stop`` are done: bump the epoch of every
        id whose last transaction ended (Empty, CompleteCommit,
        CompleteAbort), durably, leaving no "last epoch" a retry could match.
        Its producer may have begun a next transaction at that epoch
        (transaction version 1 keeps the epoch from one transaction to the
        next; version 2 runs the next one at the epoch the last EndTxn
        named) and had its AddPartitions and Produce answered once appended;
        the stop may have taken all of it back, leaving no trace. Left at
        that epoch, the id would tell that producer's EndTxn(commit) it
        committed (a version 1 id in CompleteCommit takes it for the retry
        of the last EndTxn, whose answer was lost), or let it add another
        partition and commit that without what was lost: a hole. The
        coordinator cannot tell that producer from one whose last answer was
        lost, so it says neither committed nor aborted: every request of the
        old epoch is told PRODUCER_FENCED (fatal to the clients; a new
        instance's InitProducerId goes on). Ids aborted at recovery are
        left alone: their epoch moved on already, and their producer is
        told its commit is abortable. Returns the ids fenced."""
        await self.wait_idle()  # the Prepare states ``recover`` completes end here too
        ended = (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
        changes = {}
        now = self.clock.wall_ms()
        for transactional_id, metadata in list(self.txns.items()):
            if metadata.state not in ended or transactional_id in self._busy or transactional_id in self._aborted_at_recovery:
                continue
            next_producer_id = self.producer_ids.allocate() if metadata.producer_epoch + 1 >= MAX_PRODUCER_EPOCH else NO_PRODUCER_ID
            changes[transactional_id] = self._change(metadata.fence_ended(now, next_producer_id), InitResult(ErrorCode.NONE))
        # Started together, so that they share fsync rounds (each change waits for its own record).
        results = await asyncio.gather(*changes.values())
        fenced = [transactional_id for transactional_id, result in zip(changes, results) if result.error == ErrorCode.NONE]
        if changes:
            log.warning(
                "unclean stop with transaction.durable.at.end: fenced the epochs of %d transactional ids whose last transaction ended "
                "(a next transaction may have been answered and lost whole); their producers must start again", len(fenced),
                extra={"event": "ended_epochs_fenced_at_recovery", "fenced": len(fenced), "failed": len(changes) - len(fenced)},
            )
        return fenced

    async def abort_after_unknown_batches(self, producers: Iterable[tuple[int, int]]) -> list[str]:
        """At start, after the broker aborted the open transactions of its
        partitions that no transaction of the recovered state names: for
        each (producer id, epoch) they were written at, if that epoch is
        still its transactional id's, the producer began a transaction after
        its last decided one, and a power cut kept the batch (answered once
        durable) and took back the record that added its partition (a
        Produce or TxnOffsetCommit waits only for its own data). The id is
        then Ongoing without that partition, or ended at that epoch. Left
        so, the producer's EndTxn(commit) would commit the rest of the
        transaction without the batch, or (transaction version 1, ended in
        CompleteCommit) be taken for the retry of its last EndTxn and told
        NONE. So its transaction is aborted with an epoch bump, as one open
        at an unclean stop is, and that commit is told UNKNOWN_PRODUCER_ID
        (abortable: the client aborts and goes on). A batch of an epoch
        older than its id's needs only the broker's marker (a later epoch
        ended that producer's transactions already). Returns the ids
        aborted."""
        await self.wait_idle()  # recovery completes Prepare states first: they may end at this epoch too
        aborted = []
        for producer_id, producer_epoch in sorted(set(producers)):
            metadata = self.txns.of_producer(producer_id)
            if metadata is None or metadata.producer_epoch != producer_epoch or metadata.transactional_id in self._busy:
                continue
            if metadata.state not in (TxnState.EMPTY, TxnState.ONGOING, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
                continue
            transactional_id = metadata.transactional_id
            log.warning(
                "transaction %s: a batch of producer %d epoch %d was found in no transaction at start (a crash took back the record "
                "that added its partition); aborting the producer's transaction", transactional_id, producer_id, producer_epoch,
                extra={"event": "transaction_of_unknown_batch_aborted", "transactional_id": transactional_id, "producer_id": producer_id},
            )
            self._aborted_at_recovery[transactional_id] = producer_epoch
            await self._abort_with_bump(metadata)
            aborted.append(transactional_id)
        return aborted

    def _aborted_under(self, transactional_id: str, producer_epoch: int, current: TxnMetadata) -> bool:
        """Whether a commit from ``producer_epoch`` meets its transaction
        aborted at recovery (``abort_ongoing_after_unclean_stop``)."""
        return (
            self._aborted_at_recovery.get(transactional_id) == producer_epoch
            and current.last_producer_epoch == producer_epoch
            and current.state in (TxnState.PREPARE_ABORT, TxnState.COMPLETE_ABORT)
        )

    # -- InitProducerId ---------------------------------------------------------

    async def init_producer_id(
        self,
        transactional_id: str | None,
        transaction_timeout_ms: int,
        expected_producer_id: int = NO_PRODUCER_ID,
        expected_producer_epoch: int = NO_PRODUCER_EPOCH,
    ) -> InitResult:
        if transactional_id is None or transactional_id == "":
            # Idempotent producer without transactions: a fresh id, epoch 0.
            return InitResult(ErrorCode.NONE, self.producer_ids.allocate(), 0)
        if transaction_timeout_ms <= 0 or transaction_timeout_ms > self.settings.transaction_max_timeout_ms:
            return InitResult(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        if self.loading:
            return InitResult(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        if transactional_id in self._busy:
            return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)
        now = self.clock.wall_ms()
        current = self.txns.get(transactional_id)
        if current is None or current.state == TxnState.DEAD:
            metadata = TxnMetadata(
                transactional_id=transactional_id,
                producer_id=self.producer_ids.allocate(),
                producer_epoch=0,
                timeout_ms=transaction_timeout_ms,
                state=TxnState.EMPTY,
                last_update_ms=now,
            )
            return await self._change(metadata, InitResult(ErrorCode.NONE, metadata.producer_id, 0))

        # KIP-360: a producer that names its id and epoch may only bump from them.
        if expected_producer_id != NO_PRODUCER_ID:
            if expected_producer_id != current.producer_id and expected_producer_id != current.previous_producer_id:
                return InitResult(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
            if expected_producer_id == current.producer_id and expected_producer_epoch not in (
                current.producer_epoch,
                current.last_producer_epoch,
            ):
                return InitResult(ErrorCode.PRODUCER_FENCED)
            if (
                expected_producer_id == current.producer_id
                and expected_producer_epoch == current.last_producer_epoch
                and current.state == TxnState.EMPTY
            ):
                # A retry of an InitProducerId that already bumped: answer the same.
                return InitResult(ErrorCode.NONE, current.producer_id, current.producer_epoch)

        if current.state.is_prepare:
            return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)
        if current.state in (TxnState.ONGOING, TxnState.PREPARE_EPOCH_FENCE):
            # An older instance left a transaction open: fence it by bumping the
            # epoch and aborting; the client retries and finds CompleteAbort.
            await self._abort_with_bump(current)
            return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)

        if current.producer_epoch + 1 >= MAX_PRODUCER_EPOCH:
            producer_id, epoch = self.producer_ids.allocate(), 0
        else:
            producer_id, epoch = current.producer_id, current.producer_epoch + 1
        try:
            metadata = current.init_producer(producer_id, epoch, transaction_timeout_ms, now)
        except InvalidTransition:
            return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)
        return await self._change(metadata, InitResult(ErrorCode.NONE, producer_id, epoch))

    # -- AddPartitionsToTxn / AddOffsetsToTxn ------------------------------------

    def _check_producer(self, transactional_id: str, producer_id: int, producer_epoch: int) -> tuple[ErrorCode, TxnMetadata | None]:
        if self.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, None
        current = self.txns.get(transactional_id)
        if current is None or current.state == TxnState.DEAD:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING, None
        if current.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING, None
        if current.producer_epoch != producer_epoch:
            return ErrorCode.PRODUCER_FENCED, None
        return ErrorCode.NONE, current

    async def _await_quiet(self, transactional_id: str, timeout: float = 2.0) -> None:
        """A client's next request for an id with a state change in flight
        (the completion of its previous transaction: markers, then Complete;
        or its own sibling request: librdkafka sends AddPartitionsToTxn and
        AddOffsetsToTxn together) waits here, up to ``timeout``, instead of
        being told CONCURRENT_TRANSACTIONS at once and backing off (librdkafka:
        20 ms, 100 ms for AddOffsetsToTxn). Kafka answers at once; what is
        answered after the wait is what Kafka would answer the retry."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while transactional_id in self._busy:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            quiet = self._quiet.setdefault(transactional_id, asyncio.Event())
            try:
                await asyncio.wait_for(quiet.wait(), remaining)
            except TimeoutError:
                return

    def _release(self, transactional_id: str) -> None:
        """The id's state change is over: wake whoever waits for it (``_await_quiet``)."""
        self._busy.discard(transactional_id)
        quiet = self._quiet.pop(transactional_id, None)
        if quiet is not None:
            quiet.set()

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
        *,
        verify_only: bool = False,
        transaction_version: int | None = None,
    ) -> ErrorCode:
        """AddPartitionsToTxn, AddOffsetsToTxn, and (``transaction_version=2``)
        what a Produce or TxnOffsetCommit of KIP-890 part 2 adds itself."""
        await self._await_quiet(transactional_id)
        error, current = self._check_producer(transactional_id, producer_id, producer_epoch)
        if error:
            return error
        partitions = frozenset(partitions)
        if transactional_id in self._busy or current.state.is_prepare or current.state == TxnState.PREPARE_EPOCH_FENCE:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if verify_only:
            ok = current.state == TxnState.ONGOING and partitions <= current.partitions
            return ErrorCode.NONE if ok else ErrorCode.INVALID_TXN_STATE
        if current.state == TxnState.ONGOING and partitions <= current.partitions:
            return ErrorCode.NONE  # already part of the transaction: nothing to write
        try:
            metadata = current.add_partitions(partitions, self.clock.wall_ms(), transaction_version)
        except InvalidTransition:
            return ErrorCode.INVALID_TXN_STATE
        # Answered once appended (see the module's docstring): no await
        # from the checks above to the apply, so the id needs no busy mark.
        try:
            self.txn_log.append_unflushed(metadata)  # made durable by the id's next record's round
        except Exception as error:
            log.error("could not write %s of %s: %s", metadata.state.name, transactional_id, error)
            return ErrorCode.KAFKA_STORAGE_ERROR
        self._apply(metadata)
        return ErrorCode.NONE

    async def seal(self, transactional_id: str, producer_id: int, producer_epoch: int) -> ErrorCode:
        """onceflow's seal of an open transaction, for a client that hands
        it to another process to commit (the Spark sink's tasks hand theirs
        to the driver). With ``durable_at_end`` an Ongoing transaction is
        aborted after an unclean stop (its answered data may be lost); a
        sealed one is spared: the seal makes every byte of the transaction
        appended so far durable in one fsync round with a record of where
        each partition's data ends (``TxnMetadata.seal``), and recovery keeps
        the transaction open if its logs still reach those ends. What the
        transaction is sent after its seal is answered only once durable
        (``answers_once_appended``). Without ``durable_at_end`` every answer
        waited for its data already and an unclean stop spares Ongoing
        transactions: nothing to write."""
        await self._await_quiet(transactional_id)
        error, current = self._check_producer(transactional_id, producer_id, producer_epoch)
        if error:
            return error
        if transactional_id in self._busy or current.state.is_prepare or current.state == TxnState.PREPARE_EPOCH_FENCE:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if current.state != TxnState.ONGOING:
            return ErrorCode.INVALID_TXN_STATE
        if not self.settings.durable_at_end:
            return ErrorCode.NONE
        sealed = current.seal(self.markers.data_ends(current), self.clock.wall_ms())
        return (await self._change(sealed, InitResult(ErrorCode.NONE))).error

    def answers_once_appended(self, producer_id: int) -> bool:
        """Whether a transactional Produce or TxnOffsetCommit of this
        producer is answered once appended (``durable_at_end``, its
        transaction not sealed) rather than once durable."""
        if not self.settings.durable_at_end:
            return False
        metadata = self.txns.of_producer(producer_id)
        return metadata is None or not metadata.sealed

    def is_known_open_transaction(self, producer_id: int, producer_epoch: int, partition: TopicPartition) -> bool:
        """Whether the recovered state names a transaction of this producer
        that holds ``partition`` and will end there with a marker (it is
        ongoing or being completed, at this epoch or a later one). A
        partition's open transaction that is not known was appended after
        an AddPartitions record that a power cut took back: nothing will
        ever end it, and a later transaction of the producer would commit
        it. The broker aborts those at start."""
        metadata = self.txns.of_producer(producer_id)
        return (
            metadata is not None
            and metadata.state in (TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT, TxnState.PREPARE_EPOCH_FENCE)
            and partition in metadata.partitions
            and producer_epoch <= metadata.producer_epoch
        )

    def verify_transactional_produce(self, producer_id: int, producer_epoch: int, partition: TopicPartition) -> ErrorCode:
        """KIP-890 part 1: may a transactional batch of this producer go to this
        partition? NONE if the partition is in its ongoing transaction;
        INVALID_PRODUCER_EPOCH if a newer epoch fenced it, UNKNOWN_PRODUCER_ID
        if one only aborted its transaction at start (``_aborted_under``);
        else INVALID_TXN_STATE."""
        metadata = self.txns.of_producer(producer_id)
        if metadata is not None:
            if producer_epoch < metadata.producer_epoch:
                if self._aborted_under(metadata.transactional_id, producer_epoch, metadata):
                    # Its transaction was aborted at start, the producer not
                    # fenced (its commit is told UNKNOWN_PRODUCER_ID): so is a
                    # batch of it, a retry or a new one. librdkafka aborts
                    # and bumps its epoch on it and goes on (checked with
                    # librdkafka 2.16); INVALID_PRODUCER_EPOCH is fatal to
                    # it, and after INVALID_TXN_STATE its abort keeps the
                    # old epoch, which the next transaction finds fenced.
                    return ErrorCode.UNKNOWN_PRODUCER_ID
                return ErrorCode.INVALID_PRODUCER_EPOCH
            if self.settings.durable_at_end and metadata.transactional_id in self._busy:
                # A decision may be on its way, its data ends already taken:
                # a batch appended now would be committed without being named.
                return ErrorCode.INVALID_TXN_STATE
            if metadata.state == TxnState.ONGOING and metadata.producer_epoch == producer_epoch and partition in metadata.partitions:
                return ErrorCode.NONE
            return ErrorCode.INVALID_TXN_STATE
        return ErrorCode.INVALID_TXN_STATE

    # -- EndTxn -------------------------------------------------------------------

    async def end_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool) -> ErrorCode:
        if self.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        current = self.txns.get(transactional_id)
        if current is None or current.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if transactional_id in self._busy:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        wanted_complete = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        wanted_prepare = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        if producer_epoch != current.producer_epoch:
            # A retry from the epoch that a timeout or fence just bumped away
            # (KIP-360): answer by what happened, never start something new.
            if producer_epoch == current.last_producer_epoch and current.state in (wanted_complete, wanted_prepare):
                return ErrorCode.NONE if current.state == wanted_complete else ErrorCode.CONCURRENT_TRANSACTIONS
            if commit and self._aborted_under(transactional_id, producer_epoch, current):
                return ErrorCode.UNKNOWN_PRODUCER_ID  # abortable: the client aborts and bumps (KIP-360)
            return ErrorCode.PRODUCER_FENCED
        if current.state == wanted_complete:
            return ErrorCode.NONE  # a retried EndTxn of what already happened
        if current.state == wanted_prepare:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        if current.state == TxnState.PREPARE_EPOCH_FENCE:
            return ErrorCode.PRODUCER_FENCED
        if current.state in (TxnState.EMPTY,) and not commit:
            # Aborting a transaction that never started: Kafka answers success
            # only if the previous one completed as abort; otherwise invalid.
            return ErrorCode.INVALID_TXN_STATE
        if current.state != TxnState.ONGOING:
            return ErrorCode.INVALID_TXN_STATE
        now = self.clock.wall_ms()
        prepared = current.prepare_commit(now) if commit else current.prepare_abort(now)
        # Once the decision is durable the client may go on; markers follow.
        return (await self._change(prepared, InitResult(ErrorCode.NONE))).error

    async def end_transaction_bumped(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool) -> EndResult:
        """EndTxn of transaction version 2 (v5): the decision is written with
        the next epoch (``TxnMetadata.prepare_end_bumped``) and the answer
        names the producer id and epoch to go on with. An abort is a
        decision even when no partition was added (the client cannot know
        whether a Produce it gave up on reached us). A retry from the epoch
        the decision bumped away gets the same answer."""
        if self.loading:
            return EndResult(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        await self._await_quiet(transactional_id)
        current = self.txns.get(transactional_id)
        if current is None or current.state == TxnState.DEAD:
            return EndResult(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        wanted_complete = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        wanted_prepare = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        if producer_id != current.producer_id:
            if producer_id == current.previous_producer_id and current.state == wanted_complete and current.transaction_version >= TRANSACTION_VERSION_2:
                # A retry across the move to the next producer id (the epoch range was used up).
                return EndResult(ErrorCode.NONE, current.producer_id, current.producer_epoch)
            return EndResult(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        if transactional_id in self._busy:
            return EndResult(ErrorCode.CONCURRENT_TRANSACTIONS)
        if producer_epoch != current.producer_epoch:
            if producer_epoch == current.last_producer_epoch and current.state in (wanted_complete, wanted_prepare):
                if current.state == wanted_complete:
                    return EndResult(ErrorCode.NONE, *current.epoch_after_end)
                return EndResult(ErrorCode.CONCURRENT_TRANSACTIONS)
            if commit and self._aborted_under(transactional_id, producer_epoch, current):
                return EndResult(ErrorCode.UNKNOWN_PRODUCER_ID)
            return EndResult(ErrorCode.PRODUCER_FENCED)
        if current.state == TxnState.PREPARE_EPOCH_FENCE:
            return EndResult(ErrorCode.PRODUCER_FENCED)
        if current.state.is_prepare:
            return EndResult(ErrorCode.CONCURRENT_TRANSACTIONS)
        ended = current.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
        if current.state != TxnState.ONGOING and not (ended and not commit):
            return EndResult(ErrorCode.INVALID_TXN_STATE)
        next_producer_id = self.producer_ids.allocate() if current.producer_epoch + 1 >= MAX_PRODUCER_EPOCH else NO_PRODUCER_ID
        prepared = current.prepare_end_bumped(commit, self.clock.wall_ms(), next_producer_id)
        result = await self._change(prepared, InitResult(ErrorCode.NONE))
        if result.error:
            return EndResult(result.error)
        return EndResult(ErrorCode.NONE, *prepared.epoch_after_end)

    # -- timeouts and expiry --------------------------------------------------------

    async def abort_timed_out(self) -> list[str]:
        """Abort (with an epoch bump that fences the producer) every transaction
        Ongoing past its timeout. Returns the ids aborted."""
        now = self.clock.wall_ms()
        aborted = []
        for transactional_id, metadata in list(self.txns.items()):
            deadline = metadata.transaction_deadline_ms()
            if deadline is None or deadline > now or transactional_id in self._busy:
                continue
            log.info("transaction %s timed out after %d ms; aborting and fencing its producer", transactional_id, metadata.timeout_ms)
            await self._abort_with_bump(metadata)
            aborted.append(transactional_id)
        return aborted

    async def expire_transactional_ids(self) -> list[str]:
        now = self.clock.wall_ms()
        expired = []
        for transactional_id, metadata in list(self.txns.items()):
            if transactional_id in self._busy:
                continue
            idle = now - metadata.last_update_ms
            if metadata.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT) and idle >= self.settings.transactional_id_expiration_ms:
                self._busy.add(transactional_id)
                if await self._work.run(self._expire(transactional_id)):
                    expired.append(transactional_id)
        return expired

    async def _expire(self, transactional_id: str) -> bool:
        try:
            try:
                await self._previous_markers_durable(transactional_id, wait=True)
                await self.txn_log.tombstone(transactional_id)
            except Exception as error:
                log.error("could not expire %s: %s", transactional_id, error)
                return False
            expired = self.txns.pop(transactional_id)
            _log_change(expired, expired.state, "Dead")
            return True
        finally:
            self._release(transactional_id)

    async def _abort_with_bump(self, current: TxnMetadata) -> None:
        now = self.clock.wall_ms()
        bump = current.producer_epoch + 1 < MAX_PRODUCER_EPOCH
        if current.state == TxnState.ONGOING:
            aborting = current.fence(now).prepare_abort(now, bump_epoch=bump)
        elif current.state == TxnState.PREPARE_EPOCH_FENCE:
            aborting = current.prepare_abort(now, bump_epoch=bump)
        else:
            aborting = current.abort_ended(now, bump_epoch=bump)  # ``abort_after_unknown_batches``
        await self._change(aborting, InitResult(ErrorCode.NONE))  # a failed write is logged; the next tick tries again

    # -- completion: markers, then Complete ---------------------------------------------

    def _spawn_completion(self, prepared: TxnMetadata) -> asyncio.Task:
        task = self._work.start(self._complete(prepared))
        self._completing[prepared.transactional_id] = task
        task.add_done_callback(lambda _t, tid=prepared.transactional_id: self._completing.get(tid) is _t and self._completing.pop(tid))
        return task

    async def _complete(self, prepared: TxnMetadata) -> None:
        """Markers (durable), then Complete. The id is released as soon as
        Complete is appended, not once it is durable: a next change of the
        id that arrives meanwhile is appended behind it in the same log and
        answered only after its own fsync, which covers Complete as well, so
        it does not wait for Complete's round before it is appended. Until
        then a crash leaves PrepareCommit as the last durable record, and
        recovery completes the transaction again (markers are idempotent);
        nothing answered depended on Complete. (With librdkafka's 1 ms
        linger, Complete's round was over before the client's next
        AddPartitionsToTxn in every transaction of one probe: the release
        saves a round only when the next request comes sooner.)"""
        transactional_id = prepared.transactional_id
        commit = prepared.state == TxnState.PREPARE_COMMIT
        released = False

        # A commit's data and decision are durable, so its markers need not
        # be before the id goes on (a start after a crash that lost one
        # writes it again: ``decided_commit_covers``); the client's next
        # transaction does not wait for their fsync round. (At the top of
        # the epoch range Complete moves the id to another producer id,
        # which the rule would not find: those markers are waited for.)
        markers_later = commit and prepared.next_producer_id == NO_PRODUCER_ID

        # Complete asks for no fsync of its own: nothing answered depends on
        # it (a crash that takes it back leaves the Prepare record, and the
        # start completes the transaction again), and the id's next record,
        # behind it in the same log, is made durable with it.
        async def markers_then_complete():
            await self._previous_markers_durable(transactional_id, wait=True)
            if markers_later:
                self.crash_point("coordinator.before_complete")  # a commit's markers go with its Complete
                ask_markers_durable, marked_at = self.markers.append(prepared, commit)
                # Their round is asked for now and nothing waits for it
                # (left to the next decision's round, a reader's high
                # watermark would stay below the markers until then).
                ask_markers_durable()
                completed = prepared.complete(self.clock.wall_ms(), committed_ends=marked_at)
                self.txn_log.append_unflushed(completed)
                self._markers_pending[transactional_id] = ask_markers_durable
                self.crash_point("coordinator.complete_appended")
                return completed
            await self.markers.write(prepared, commit)
            self.crash_point("coordinator.before_complete")
            completed = prepared.complete(self.clock.wall_ms())
            self.txn_log.append_unflushed(completed)
            return completed

        def retrying(error: BaseException, _backoff: Backoff) -> None:
            log.warning("completing %s of %s failed (%s); retrying", prepared.state.name, transactional_id, error)

        try:
            # Named crash point first: a test that dies here dies before the
            # client has EndTxn's answer, as it always has.
            self.crash_point("coordinator.after_prepare_commit" if commit else "coordinator.after_prepare_abort")
            for _ in range(ANSWER_TURNS):
                await asyncio.sleep(0)  # EndTxn's answer goes out before the markers
            # The decision stands; keep trying (a restart will too).
            completed = await retry(markers_then_complete, Backoff(COORDINATOR_COMPLETION), retriable=lambda error: isinstance(error, Exception), on_failure=retrying)
            self._apply(completed)
            self._release(transactional_id)
            released = True
        finally:
            if not released:
                self._release(transactional_id)

    async def _previous_markers_durable(self, transactional_id: str, *, wait: bool) -> None:
        """Make sure the fsync of the markers of the id's last commit, if
        they were appended without waiting for one (``_complete``), is asked
        for (a round that already covered them answers at once); with
        ``wait``, wait until they are durable: the record about to be
        appended (the next Complete, InitProducerId, a tombstone) drops the
        places recovery would finish them by. Raises what their fsync raised
        (the write is then refused: the log failed)."""
        ask = self._markers_pending.get(transactional_id)
        if ask is None:
            return
        durable = ask()
        if not wait:
            return
        await durable
        if self._markers_pending.get(transactional_id) is ask:
            del self._markers_pending[transactional_id]

    def decided_commit_covers(self, producer_id: int, producer_epoch: int, partition: TopicPartition, topic_id, first_offset: int) -> bool:
        """After an unclean stop: whether a partition's open transaction of
        this producer, from ``first_offset``, is the data of a commit whose
        markers were appended without waiting (``committed_ends``) and lost
        to the stop: it begins below where that commit's marker was
        appended in that topic (the same id: not a topic of the same name
        made since). A later transaction's data lies behind that marker, and
        a log that lost the marker lost what followed it."""
        metadata = self.txns.of_producer(producer_id)
        if metadata is None or producer_epoch > metadata.producer_epoch:
            return False
        return any(
            (topic, index, committed_topic_id) == (partition.topic, partition.partition, topic_id) and first_offset < end
            for topic, index, end, committed_topic_id in metadata.committed_ends
        )

    async def wait_idle(self) -> None:
        """Wait until every in-flight state change and completion has finished (tests)."""
        await self._work.wait()

    async def close(self) -> None:
        """Stop what is in flight. A change cut here may be written and not
        applied: memory goes with the coordinator, and ``load``/``recover``
        rebuild it from what is durable."""
        await self._work.close()

    # -- writing -------------------------------------------------------------------------

    def _apply(self, metadata: TxnMetadata) -> None:
        """Make ``metadata``, now durable, the id's state. Every state change
        of a transactional id passes here (and its expiry through
        ``_expire``), so this is where it is logged."""
        before = self.txns.get(metadata.transactional_id)
        self.txns[metadata.transactional_id] = metadata
        _log_change(metadata, before.state if before is not None else None, metadata.state)

    async def _change(self, metadata: TxnMetadata, result: InitResult) -> InitResult:
        """Write ``metadata`` then apply it, as the coordinator's own task;
        ``result`` if it was applied. The id is busy from here on: callers
        check ``_busy`` and call this with no await in between."""
        self._busy.add(metadata.transactional_id)
        error = await self._work.run(self._write_then_apply(metadata))
        return result if error == ErrorCode.NONE else InitResult(error)

    async def _write_then_apply(self, metadata: TxnMetadata) -> ErrorCode:
        transactional_id = metadata.transactional_id
        completing = False
        try:
            try:
                # A record that keeps the last commit's marker places has its
                # round cover the markers too; one that drops them waits for them.
                await self._previous_markers_durable(transactional_id, wait=not metadata.committed_ends)
                if metadata.state == TxnState.PREPARE_COMMIT:
                    # The decision names where its producer's data ends and
                    # is answered only once that data is durable too: recovery
                    # completes it only if its logs still reach those ends,
                    # and leaves a later transaction of the producer, past
                    # them, alone (``recover``).
                    metadata = metadata.with_data_ends(self.markers.data_ends(metadata))
                if self.settings.durable_at_end and (metadata.state == TxnState.PREPARE_COMMIT or metadata.sealed):
                    # The decision (or a seal) and the data it covers share
                    # one fsync round.
                    decision = self.txn_log.append(metadata)
                    data = self.markers.data_durable(metadata)  # asked before the round starts: the same round
                    self.crash_point("coordinator.seal_appended" if metadata.sealed else "coordinator.decision_appended")
                    await asyncio.gather(data, decision)
                elif metadata.state == TxnState.PREPARE_COMMIT:
                    # The data was durable before its answers (done at once),
                    # unless the client sent EndTxn before a Produce's answer.
                    await asyncio.gather(self.markers.data_durable(metadata), self.txn_log.write(metadata))
                else:
                    await self.txn_log.write(metadata)
            except Exception as error:
                log.error("could not write %s of %s: %s", metadata.state.name, transactional_id, error)
                return ErrorCode.KAFKA_STORAGE_ERROR
            self._apply(metadata)
            if metadata.state.is_prepare:
                # The decision is durable: markers, then Complete (which
                # clears the busy mark when it is appended).
                self._spawn_completion(metadata)
                completing = True
            return ErrorCode.NONE
        finally:
            if not completing:
                self._release(transactional_id)


def _state_name(state: TxnState | str | None) -> str:
    """Kafka's name of a state (``PrepareCommit``), as ListTransactions shows it."""
    if state is None:
        return "none"
    return state if isinstance(state, str) else STATE_NAMES[state]


def _log_change(metadata: TxnMetadata, old: TxnState | None, new: TxnState | str) -> None:
    """One DEBUG line per state change of a transactional id, its ids as fields."""
    if not log.isEnabledFor(logging.DEBUG):
        return  # the fields below cost a little on every transaction
    old_name, new_name = _state_name(old), _state_name(new)
    log.debug(
        "transaction %s: %s -> %s (producer %d epoch %d)", metadata.transactional_id, old_name, new_name, metadata.producer_id, metadata.producer_epoch,
        extra={
            "event": "transaction_state_change",
            "transactional_id": metadata.transactional_id,
            "producer_id": metadata.producer_id,
            "producer_epoch": metadata.producer_epoch,
            "old_state": old_name,
            "new_state": new_name,
            "partitions": sorted(str(tp) for tp in metadata.partitions),
        },
    )


__all__ = ["CoordinatorSettings", "EndResult", "InitResult", "TransactionCoordinator"]
