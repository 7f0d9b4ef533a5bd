"""The exactly-once consume-transform-produce loop behind ``App.run``
(Kafka Streams' exactly_once_v2, on asyncio with ``txn.aio`` clients).

One ``Runner`` is one app instance: one consumer-group member (group id =
application id, static member ``{application_id}-{instance_id}``, the
cooperative ``copartitioned-sticky`` assignor of ``txn.assignors``) and one
transactional producer (transactional id the same string). The loop:

    poll (columns) -> for each record: deserialize, run the processor(s) (their store
            writes go to the transaction's pending layer, their emits to
            the producer, inside the open transaction)
         -> every commit_interval_ms or commit_records, whichever first:
            the stores' pending writes to their changelogs,
            send_offsets_to_transaction(next offsets, group metadata),
            commit_transaction
         -> [crash point streaming.after_commit_before_store_apply]
         -> apply the pending writes to memory and to each shard's SQLite
            file together with the changelog offset they reach.

What happens when:

| event | what the runner does |
| --- | --- |
| partitions assigned | wait until the group's offsets for them are stable (an old owner's transaction decided), then restore each store shard: SQLite contents, then the changelog (read_committed) from the file's offset to its stable end; only then their first record |
| partitions revoked | commit the open transaction (abort if it cannot), close their shards (kept in memory until the rebalance's assignment: one given back only catches up with its changelog) |
| partitions lost (fenced by the group) | abort the open transaction, close their shards |
| abortable error (TransactionAbortable, CommitFailed, retries exhausted, connection) | abort, rewind every partition to its committed offset, drop pending store writes |
| commit outcome unknown | a new producer (init_transactions settles the outcome), then rewind and catch every shard up from its changelog |
| producer fenced (its transactional id taken) | ``InstanceFencedError``: stop, nothing more is written |
| a record fails (bad bytes, processor raises) | ``on_error="dead-letter"``: its raw bytes to the dead-letter topic in the same transaction, headers naming the error and position; ``"stop"``: abort, ``ProcessingError`` naming the record. The record's own store writes and emits are dropped either way; the rest of the transaction is untouched |
| stop, SIGTERM, SIGINT | commit the open transaction, close the stores, leave |

The lifecycle behind that table (starting, restoring, running, committing,
rebalancing, stopping, fenced, failed) is ``streaming.lifecycle``'s one
transition table; ``state`` is where this instance stands.

The pieces, in the manner of Kafka Streams' StreamThread: ``streaming.task``
runs a record through the processors (no I/O, shared with
``streaming.testing``), ``streaming.transaction`` owns the producer and the
transaction covering output, changelog and offsets and says what became of
each commit, ``streaming.restore`` holds the store shards and restores them
from their changelogs; this module polls, rebalances, rewinds and drives the
lifecycle.

Metrics: the runner counts into ``app.metrics`` (plain numbers: counters,
aborts by cause, commit times handed to its observers) and keeps the lag of
its assigned partitions and the progress of restores as state; with
``metrics_address`` it serves them for Prometheus on its own loop
(``streaming.metrics``, the one module of the runner that imports
``prometheus_client``), refreshing the lag every ``LAG_REFRESH_SECONDS``.

"""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
import sys
import threading
import time

import numpy as np

from protocol.retry import RUNNER, Backoff, retry
from streaming import topics
from streaming.app import App
from streaming.errors import TopicsMismatchError
from streaming.global_tables import GlobalTableReader
from streaming.lifecycle import RunnerEvent, RunnerState, transition
from streaming.picking import RecordPicker, copartition_groups, table_topics
from streaming.restore import RESTORE_CHUNK, Shards
from streaming.task import Task, fetched_records
from streaming.transaction import Outcome, Transaction, abort_cause
from txn.admin import AsyncAdmin
from txn.column_batches import binary_array, numpy_array
from txn.consumer import AsyncConsumer
from txn.errors import GROUP_FENCING, TRANSIENT_ERRORS, InvalidConfigurationError, KafkaError
from txn.types import TopicPartition

__all__ = ["Runner", "abort_cause"]

log = logging.getLogger("streaming.runner")

# The group's assignor: cooperative (KIP-429: a rebalance moves only the
# partitions that change hands, and the others are processed through it, a
# round held up by a dead member's session included) and co-partitioned
# (partition N of every source on one instance, with its store shards).
DEFAULTS_CONSUMER = {"max_poll_records": 500, "partition_assignment_strategy": ("copartitioned-sticky",)}
COPARTITIONING_ASSIGNORS = {"copartitioned-sticky", "range"}  # the assignors that keep partition N of every source on one member
SEND_RECORDS = 2000  # emits gathered before they go to the producer as column batches, unless a commit comes first
LAG_REFRESH_SECONDS = 1.0  # how often the lag is asked for while metrics are served

E = RunnerEvent


def load_columnar() -> None:
    """Load what the columnar fetch and produce load on first use
    (``protocol.columnar``, numpy, pyarrow's compute functions): before the
    group is joined, not in the first fetch, where a second of imports would
    hold the event loop, and the heartbeats, past a short session timeout."""
    importlib.import_module("protocol.columnar")

    binary_array([b""]).take(numpy_array(np.zeros(1, dtype=np.int64)))


async def _retry(operation, what: str, *, stopping, backoff: Backoff | None = None):
    """``await operation()`` under the runner's policy (``protocol.retry.RUNNER``)
    until it returns, trying again after each ``TRANSIENT_ERRORS`` failure; if
    ``stopping()`` after the wait, the error is raised instead (the poll passes
    ``lambda: True``: its caller's loop checks commits, progress and idleness
    between tries, keeping ``backoff`` across them). Logged at WARNING once
    per outage, then DEBUG: a broker that stays down would otherwise fill the log."""

    def logged(error: BaseException, tries: Backoff) -> None:
        (log.warning if not tries.failures else log.debug)("%s failed (%s); trying again", what, error)

    return await retry(operation, backoff or Backoff(RUNNER), retriable=lambda error: isinstance(error, TRANSIENT_ERRORS), on_failure=logged, stopping=stopping)


class Runner:
    def __init__(self, app: App, *, until_idle: float | None = None, progress_interval: float | None = None, progress_out=None, metrics_address: tuple[str, int] | None = None,
                 handle_signals: bool = True):
        self.app = app
        self.handle_signals = handle_signals
        self.metrics_address = metrics_address
        self.metrics = app.metrics
        self.until_idle = until_idle
        self.progress_interval = progress_interval
        self.progress_out = progress_out or sys.stderr
        self.state = RunnerState.STARTING
        self.task = Task(app, self._store)
        # Co-partitioned inputs (a table and the streams joined with it) go
        # through the picker, in timestamp order; other apps straight through.
        self.copartitioned = copartition_groups(app)
        self.picker = RecordPicker(self.copartitioned, app.max_task_idle_ms, table_topics(app), self.task.order_time) if self.copartitioned else None
        self.global_reader: GlobalTableReader | None = None
        self.txn = Transaction(app, self.task, self._store_file, on_fenced=lambda: self._enter(E.FENCE))
        self.shards: Shards | None = None
        self.assigned: set[TopicPartition] = set()
        self.consumer: AsyncConsumer | None = None
        self.restorer: AsyncConsumer | None = None
        self.admin: AsyncAdmin | None = None
        self.processed: dict[TopicPartition, int] = {}  # next offset per partition, as far as processed
        self.topic_partitions: dict[tuple[str, int], TopicPartition] = {}  # made once, not per record
        self.last_activity = time.monotonic()
        self.next_purge = time.monotonic() + app.repartition_purge_interval_ms / 1000
        # What the metrics read besides app.metrics: the lag per assigned
        # partition (as last asked for) and the restores' progress.
        self.lag: dict[TopicPartition, int] = {}

    # -- what the metrics and the lifecycle read -----------------------------------------------

    @property
    def txn_open(self) -> bool:
        return self.txn.open

    @property
    def restoring(self) -> dict[tuple[str, int], tuple[int, int]]:
        return self.shards.restoring if self.shards is not None else {}

    @property
    def failed(self) -> bool:
        return self.state in (RunnerState.FENCED, RunnerState.FAILED)

    def _enter(self, event: RunnerEvent) -> None:
        before, self.state = self.state, transition(self.state, event)
        if before is not self.state:
            log.debug("runner %s -> %s (%s)", before.value, self.state.value, event.value)

    def _store(self, name: str, partition: int):
        return self.shards.store(name, partition)

    def _store_file(self, store):
        return self.shards.file_of(store) if self.shards is not None else None

    def _stopping(self) -> bool:
        return self.app.stopping

    # -- the whole run -------------------------------------------------------------------------

    async def run(self) -> None:
        app = self.app
        lock = app.lock_state_dir()
        loop = asyncio.get_running_loop()
        installed = []
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, app.stop)
                installed.append(signum)
        load_columnar()  # after the handlers: a SIGTERM meanwhile stops the run as it would later
        common = {k: v for k, v in app.consumer_options.items() if k in app.producer_options}
        endpoint = exported = None
        try:
            if self.metrics_address is not None:
                from streaming.metrics import RunnerMetrics

                exported = RunnerMetrics(app, self)
                endpoint = await exported.serve(*self.metrics_address)
                app.metrics_url = f"http://{self.metrics_address[0]}:{endpoint.bound_port}/metrics"
                log.info("serving metrics on %s", app.metrics_url)
            self.admin = AsyncAdmin(app.bootstrap_servers, **common)
            await self._prepare_topics()
            await self.txn.start()
            if self.task.globals:
                self.global_reader = GlobalTableReader(app, self.task.globals, common)
                await self.global_reader.restore(await self.admin.list_topics())
            self.consumer = AsyncConsumer(
                app.bootstrap_servers, group_id=app.application_id, isolation_level="read_committed",
                **{**DEFAULTS_CONSUMER, **self._consumer_options(), "group_instance_id": app.transactional_id, "enable_auto_commit": False},
            )
            self.restorer = AsyncConsumer(app.bootstrap_servers, isolation_level="read_committed", **{**common, "max_poll_records": RESTORE_CHUNK})
            self.shards = Shards(app, self.admin, self.restorer, self.txn.producer.config.transaction_timeout_ms)
            log.info("instance %s of %s starting (transactional id %s)", app.instance_id, app.application_id, app.transactional_id)
            self.consumer.subscribe(sorted(self.task.by_topic), listener=self)
            await self._loop()
            if self.txn.open:
                await self._commit_or_abort()
            self._enter(E.STOP)
        except BaseException:
            log.debug("the run ended by an error", exc_info=True)
            if not self.failed:
                self._enter(E.FAIL)
            raise
        finally:
            await self._shutdown()
            if endpoint is not None:
                await endpoint.stop()
                exported.close()
                app.metrics_url = None
            for signum in installed:
                loop.remove_signal_handler(signum)
            lock.close()

    async def _shutdown(self) -> None:
        if self.failed:
            await self.txn.abort_quietly("stopped_on_error")
        if self.global_reader is not None:
            try:
                await self.global_reader.close()
            except Exception as error:
                log.warning("closing the global tables' consumer: %s", error)
        for client in (self.consumer, self.restorer, self.admin):
            if client is not None:
                try:
                    await client.close()  # the consumer's close revokes: our listener closes the stores
                except Exception as error:
                    log.warning("closing %s: %s", type(client).__name__, error)
        if self.shards is not None:
            await self.shards.close(list(self.shards.held))
        await self.txn.close()
        if self.state is RunnerState.STOPPING:
            self._enter(E.CLOSED)

    def _consumer_options(self) -> dict:
        """The app's consumer options, with a co-partitioning assignor kept
        when inputs are co-partitioned: ``copartitioned-sticky`` (the
        default) or ``range`` give partition N of every topic the members
        subscribe to one member; another (plain ``cooperative-sticky`` may
        split them, and two instances would then write one store shard) is
        replaced by the default, with a warning."""
        options = dict(self.app.consumer_options)
        if self.copartitioned:
            chosen = options.get("partition_assignment_strategy") or DEFAULTS_CONSUMER["partition_assignment_strategy"]
            chosen = tuple(name.strip() for name in (chosen.split(",") if isinstance(chosen, str) else chosen))
            if not set(chosen) <= COPARTITIONING_ASSIGNORS:
                log.warning("partition_assignment_strategy %s replaced by %s: co-partitioned inputs (%s) need partition N of each on one instance",
                            ",".join(chosen), ",".join(DEFAULTS_CONSUMER["partition_assignment_strategy"]),
                            "; ".join(" + ".join(group) for group in self.copartitioned))
                chosen = DEFAULTS_CONSUMER["partition_assignment_strategy"]
            options["partition_assignment_strategy"] = chosen
        return options

    async def _prepare_topics(self) -> None:
        """Check the cluster's topics against what the app needs and create
        what is missing (``streaming.topics``: sources must exist; the
        repartition topics, changelogs, dead-letter topic and sinks are
        created with the app's ``replication_factor`` and
        ``min_insync_replicas``); refuse to start, creating nothing, when a
        present one does not fit or the topology no longer names state of
        this application (``TopicsMismatchError``)."""
        app = self.app
        existing = await self.admin.list_topics()
        try:
            groups = [group.group_id for group in await self.admin.list_groups()]
        except InvalidConfigurationError as error:  # not authorized to list groups
            log.warning("not checking for state the topology no longer names: %s", error)
        else:
            orphans = topics.orphaned(app, existing, groups)
            changelogs = [orphan.topic for orphan in orphans if orphan.kind == "changelog"]
            if changelogs:
                orphans = topics.compacted_only(orphans, await self.admin.describe_configs(changelogs))
            if orphans:
                raise TopicsMismatchError(topics.orphaned_message(app, orphans))
        wanted = topics.needs(app, existing)
        compacted = [need.topic for need in wanted if need.compacted and need.topic in existing]
        present_configs = {}
        if compacted:
            try:
                present_configs = await self.admin.describe_configs(compacted)
            except InvalidConfigurationError as error:  # not authorized to describe them
                log.warning("not checking the changelogs' cleanup.policy: %s", error)
        wrong = topics.problems(wanted, existing, present_configs)
        counts = {**existing, **{need.topic: need.partitions for need in wanted if need.kind == "repartition"}}
        for group in self.copartitioned:
            by_topic = {topic: counts[topic] for topic in group if topic in counts}
            if len(set(by_topic.values())) > 1:
                wrong.append(f"topics {' and '.join(f'{topic} ({count} partitions)' for topic, count in by_topic.items())} must be co-partitioned "
                             f"(they meet in one store: a table and a stream joined with it, or one processor's sources): give them one partition count")
        if wrong:
            raise TopicsMismatchError("; ".join(wrong))
        to_create = {need.topic: need.partitions for need in wanted if need.topic not in existing}
        if to_create:
            configs = {need.topic: app.internal_topic_config(**({"cleanup.policy": "compact"} if need.compacted else {})) for need in wanted if need.topic in to_create}
            await self.admin.create_topics(to_create, replication_factor=app.replication_factor, configs=configs, exist_ok=True)
            log.info("created %s", ", ".join(sorted(to_create)))

    # -- the loop ------------------------------------------------------------------------------

    async def _loop(self) -> None:
        app, consumer, txn = self.app, self.consumer, self.txn
        interval = app.commit_interval_ms / 1000
        next_progress = time.monotonic() + (self.progress_interval or 0)
        next_lag = time.monotonic()
        progress_mark = (time.monotonic(), 0, 0)
        self.last_activity = time.monotonic()
        poll_backoff = Backoff(RUNNER)
        max_records = consumer.config.max_poll_records
        while not app.stopping:
            timeout = max(0.0, txn.started + interval - time.monotonic()) if txn.open else 0.5
            picker = self.picker
            if picker is not None and (wait := picker.wait_ms(int(time.time() * 1000))) is not None:
                timeout = min(timeout, wait / 1000)
            try:
                # One try per turn of this loop (stopping=True after the
                # wait): commits, progress and idleness are looked at between tries.
                # While the picker holds records ready to go, fetch nothing more (its memory stays bounded).
                polled = {} if picker is not None and picker.backlog else await _retry(
                    lambda: consumer.poll_columns(min(timeout, 0.5), max_records), "poll", stopping=lambda: True, backoff=poll_backoff)
            except TRANSIENT_ERRORS:
                continue
            records = [record for tp, columns in polled.items() for record in fetched_records(tp.topic, tp.partition, columns)]
            if picker is not None:
                picker.add(records)
                # At most a poll's worth per turn, so commits and rebalances come between.
                records = picker.take(int(time.time() * 1000), limit=max_records)
            if self.global_reader is not None:
                try:
                    await self.global_reader.catch_up()
                except TRANSIENT_ERRORS as error:
                    log.debug("reading the global tables: %s", error)
            if records:
                self.last_activity = time.monotonic()
                processed = 0
                try:
                    for raw in records:
                        await self._process(raw)
                        processed += 1
                        if app.commit_records is not None and txn.records >= app.commit_records:
                            if not await self._commit_or_abort():
                                break  # rewound: the rest of this poll is read again
                finally:
                    self.metrics.add("records_in", processed)
                # Enough emits go to the producer as column batches, to be
                # written while the next records are processed (the rest with the commit).
                if len(txn.pending) >= SEND_RECORDS:
                    await txn.send_pending()
                else:
                    await asyncio.sleep(0)  # a turn for the consumer's heartbeats and the producer's sends
            if self.task.wall_clock_timers and self.state is RunnerState.RUNNING:
                await self._fire_wall_clock_timers()
            if txn.open and time.monotonic() - txn.started >= interval:
                carried_records = txn.records > 0
                await self._commit_or_abort()
                if carried_records:  # a slow commit is not idleness; a commit of timers' work alone is
                    self.last_activity = time.monotonic()
            if app.internal_topics and time.monotonic() >= self.next_purge:
                await self._purge_repartition_topics()
            now = time.monotonic()
            if self.metrics_address is not None and now >= next_lag:
                self.lag = await self._lag() or self.lag
                next_lag = now + LAG_REFRESH_SECONDS
            if self.progress_interval and now >= next_progress:
                progress_mark = await self._progress(progress_mark)
                next_progress = now + self.progress_interval
            # Idle time counts from the first assignment on (joining a group may take a while).
            if self.until_idle is not None and not records and not txn.open and not (picker is not None and len(picker)) and self.metrics.get("rebalances") and now - self.last_activity >= self.until_idle:
                log.info("idle for %.1f s: stopping", self.until_idle)
                return

    async def _process(self, raw) -> None:
        """Run every processor of ``raw``'s topic on it, inside the open transaction."""
        txn = self.txn
        txn.begin()
        try:
            outputs = self.task.process(raw)
        except Exception:
            self._enter(E.FAIL)  # on_error="stop": ProcessingError
            raise
        txn.add(outputs)
        tp = self.topic_partitions.get((raw.topic, raw.partition))
        if tp is None:
            tp = self.topic_partitions[(raw.topic, raw.partition)] = TopicPartition(raw.topic, raw.partition)
        self.processed[tp] = raw.offset + 1
        txn.processed(tp, raw.offset + 1)

    async def _fire_wall_clock_timers(self) -> None:
        """Fire the wall-clock timers due on the partitions held, inside the open transaction."""
        held: dict[str, set[int]] = {}
        for processor in self.app.processors:
            held[processor.name] = {tp.partition for tp in self.assigned if tp.topic in processor.sources}
        due = self.task.wall_clock_due(int(time.time() * 1000), held)
        if not due:
            return
        txn = self.txn
        txn.begin()
        try:
            outputs = self.task.fire_due(due)
        except Exception:
            self._enter(E.FAIL)  # a timer raised: ProcessingError
            raise
        txn.add(outputs)

    async def _purge_repartition_topics(self) -> None:
        """Delete the records of the repartition partitions held up to the
        group's committed offsets (DeleteRecords): they were read, and what
        they did is committed. A failure waits for the next interval."""
        self.next_purge = time.monotonic() + self.app.repartition_purge_interval_ms / 1000
        held = sorted(tp for tp in self.assigned if tp.topic in self.app.internal_topics)
        if not held:
            return
        try:
            committed = await self.consumer.committed(held)
            before = {tp: meta.offset for tp, meta in committed.items() if meta is not None and meta.offset > 0}
            if before:
                await self.admin.delete_records(before)
        except (KafkaError, OSError) as error:
            log.warning("purging the repartition topics: %s (tried again in %d ms)", error, self.app.repartition_purge_interval_ms)

    # -- commit ----------------------------------------------------------------------------------

    async def _commit_or_abort(self) -> bool:
        """Commit the open transaction; on an abortable error (or an unknown
        outcome, settled) rewind (False). Fencing raises ``InstanceFencedError``."""
        self._enter(E.COMMIT)
        sent = []  # the group metadata the offsets went with, read when they are sent

        def group_metadata():
            sent.append(self.consumer.group_metadata())
            return sent[-1]

        result = await self.txn.commit(group_metadata)
        if result.outcome is Outcome.COMMITTED:
            self._enter(E.COMMITTED)
            return True
        if result.outcome is Outcome.UNKNOWN:
            await self._recover(catch_up_stores=True)
            # Committed iff the group's offsets reached the transaction's
            # (the rewind just read them into ``processed``). A partition not
            # rewound cannot tell.
            rewound = {tp: self.processed.get(tp, -1) for tp in self.assigned if tp in self.consumer.assignment()}
            self.txn.settled(result, rewound)
        else:
            if getattr(result.error, "code", None) in GROUP_FENCING:
                # The group moved on without us (this member's session ended,
                # e.g. the process was stopped): rejoin at the next poll, which
                # reports the partitions lost, rather than wait for a heartbeat
                # to find out. Unless the refused generation is one this
                # member has left already: a round completed while the offsets
                # were on their way, and what it owns now is its own (losing
                # it would cost a restore and another round for nothing).
                self.consumer.enforce_rebalance(result.error.code, sent[-1].generation_id if sent else None)
            await self._recover(catch_up_stores=False)
        self._enter(E.ABORTED)
        return False

    async def _recover(self, *, catch_up_stores: bool) -> None:
        """Rewind every assigned partition to its committed offset (and catch
        the shards up with the changelog, when our last commit may have
        happened after all). Retried until the broker answers."""

        async def rewind():
            if catch_up_stores:
                await self.shards.catch_up_all()
            await self._rewind(sorted(self.assigned))

        await _retry(rewind, "rewinding", stopping=self._stopping)

    async def _rewind(self, partitions: list[TopicPartition]) -> None:
        consumer = self.consumer
        partitions = [tp for tp in partitions if tp in consumer.assignment()]
        if not partitions:
            return
        if self.picker is not None:
            self.picker.drop((tp.topic, tp.partition) for tp in partitions)
        committed = await consumer.committed(partitions)
        starts = await consumer.beginning_offsets([tp for tp in partitions if committed.get(tp) is None])
        for tp in partitions:
            offset = committed[tp].offset if committed.get(tp) else starts[tp]
            consumer.seek(tp, offset)
            self.processed[tp] = offset

    # -- rebalances (the consumer calls these inside poll) -------------------------------------

    async def on_partitions_revoked(self, partitions) -> None:
        log.info("revoked %s", ", ".join(map(str, sorted(partitions))) or "nothing")
        if self.txn.open and not self.failed:
            await self._commit_or_abort()
        self._enter(E.REVOKED)
        await self._release(partitions)

    async def on_partitions_lost(self, partitions) -> None:
        log.warning("partitions lost (the group moved on without this member): %s%s", ", ".join(map(str, sorted(partitions))) or "none",
                    "; aborting the open transaction" if self.txn.open and not self.failed else "")
        self._enter(E.LOST)
        if self.txn.open and not self.failed:
            await self.txn.abort("partitions_lost")
        await self._release(partitions)

    async def on_partitions_assigned(self, partitions) -> None:
        self.metrics.add("rebalances")
        self._enter(E.ASSIGNED)
        partitions = set(partitions)
        self.assigned |= partitions
        shards = self.shards

        async def restore():
            # Wait until no transaction of a previous owner still holds a
            # pending offset commit for these partitions (KIP-447): then that
            # owner's changelog writes are decided too.
            await self.consumer.committed(sorted(partitions))
            for name, partition in sorted(self.task.stores_needed(partitions) - set(shards.held)):
                await shards.open(name, partition)

        # No record of these partitions may be processed before their stores are restored.
        if self.task.stores_needed(partitions) - set(shards.held):
            await _retry(restore, "restoring stores", stopping=self._stopping)
        for tp in partitions:
            self.processed.pop(tp, None)
        if self.picker is not None:
            self.picker.assign((tp.topic, tp.partition) for tp in partitions)
        shards.parked.clear()  # what was given up and not given back: someone else's now
        self.last_activity = time.monotonic()
        self._enter(E.RESTORED)
        log.info("assigned %s", ", ".join(map(str, sorted(partitions))) or "nothing")

    async def _release(self, partitions) -> None:
        self.assigned -= set(partitions)
        if self.picker is not None:
            self.picker.revoke((tp.topic, tp.partition) for tp in partitions)
        for tp in partitions:
            self.processed.pop(tp, None)
        await self.shards.close(sorted(set(self.shards.held) - self.task.stores_needed(self.assigned)), park=True)

    # -- progress ------------------------------------------------------------------------------

    async def _progress(self, mark: tuple[float, int, int]) -> tuple[float, int, int]:
        now = time.monotonic()
        records_in, records_out = self.metrics.get("records_in", 0), self.metrics.get("records_out", 0)
        elapsed = max(1e-9, now - mark[0])
        lags = await self._lag()
        lag = "(unknown)" if lags is None else " ".join(f"{tp}:{behind}" for tp, behind in sorted(lags.items()))
        print(
            f"{self.app.application_id}/{self.app.instance_id}: in {(records_in - mark[1]) / elapsed:,.0f}/s "
            f"out {(records_out - mark[2]) / elapsed:,.0f}/s, {self.metrics.get('commits', 0)} commits, "
            f"{self.metrics.get('aborts', 0)} aborts; lag {lag or '(no partitions)'}",
            file=self.progress_out, flush=True,
        )
        return now, records_in, records_out

    async def _lag(self) -> dict[TopicPartition, int] | None:
        """Records behind the end (the last stable offset: the consumer reads
        read_committed) per assigned partition; None if the broker did not answer."""
        try:
            assigned = sorted(self.assigned)
            ends = await self.consumer.end_offsets(assigned) if assigned else {}
            # Nothing processed from a partition yet: the consumer's position
            # (where it reads next: the committed offset, until records come).
            positions = {tp: self.processed[tp] if tp in self.processed else await self.consumer.position(tp) for tp in assigned}
            return {tp: max(0, ends[tp] - positions[tp]) for tp in assigned}
        except (KafkaError, OSError):
            return None
