"""The exactly-once consume-transform-produce loop behind ``App.run``
(Kafka Streams' exactly_once_v2, on asyncio with ``txn.aio`` clients).

One ``Runner`` is one app instance: one consumer-group member (group id =
application id, static member ``{application_id}-{instance_id}``) and one
transactional producer (transactional id the same string). The loop:

    poll -> for each record: deserialize, run the processor(s) (their store
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

Metrics: the runner counts into ``app.metrics`` (plain numbers: counters,
aborts by cause, commit times handed to its observers) and keeps the lag of
its assigned partitions and the progress of restores as state; with
``metrics_address`` it serves them for Prometheus on its own loop
(``streaming.metrics``, the one module of the runner that imports
``prometheus_client``), refreshing the lag every ``LAG_REFRESH_SECONDS``.

A shard's SQLite file can never be trusted blindly: its offset is checked
against the changelog before use. Behind (the usual case after a crash
between the Kafka commit and the SQLite apply, or after another instance
owned the partition): catch up from the changelog. Ahead of the stable end,
or behind the log start (the topic was recreated, truncated, or the file came
from elsewhere): thrown away and rebuilt from the changelog alone.
Compaction keeps offsets, so a file behind a compacted changelog still
catches up correctly, with one limit Kafka Streams shares: a file that fell
behind by more than the topic's ``delete.retention.ms`` may miss a deletion
whose tombstone compaction has since dropped.

Memory: the committed contents of every assigned shard are held in memory
(see ``streaming.store``); a rebalance keeps a revoked shard there until the
assignment arrives, so a shard given back is not reloaded.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time

from protocol.errors import ErrorCode
from streaming.app import App, Processor, Record
from streaming.backoff import RetryDelay
from streaming.errors import InstanceFencedError, ProcessingError
from streaming.store import Store, StoreError, StoreFile
from txn.admin import AsyncAdmin
from txn.consumer import AsyncConsumer
from txn.errors import ApplicationRecoverableError, CommitFailedError, CommitOutcomeUnknownError, FatalError, KafkaError, RetriableError, TransactionAbortableError
from txn.producer import AsyncProducer
from txn.types import OffsetAndMetadata, TopicPartition

log = logging.getLogger("streaming.runner")

CRASH_AFTER_COMMIT = "streaming.after_commit_before_store_apply"
RESTORE_CHUNK = 10_000  # changelog records applied to SQLite per transaction while restoring
DEFAULTS_CONSUMER = {"max_poll_records": 500}
DEFAULTS_PRODUCER = {"transaction_timeout_ms": 10_000, "linger_ms": 5}
LAG_REFRESH_SECONDS = 1.0  # how often the lag is asked for while metrics are served
GROUP_FENCING = {ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION, ErrorCode.FENCED_INSTANCE_ID}
ABORTABLE = (TransactionAbortableError, CommitFailedError, RetriableError, ConnectionError, TimeoutError, OSError)


class Context:
    """What a processor acts through (``ctx``): its stores, ``emit``, ``count``
    and the current record's position. One object, re-aimed at every record."""

    __slots__ = ("_runner", "_processor", "_outputs", "_touched", "topic", "partition", "offset", "timestamp")

    def __init__(self, runner: "Runner"):
        self._runner = runner
        self._processor: Processor | None = None
        self._outputs: list = []
        self._touched: list[Store] = []
        self.topic, self.partition, self.offset, self.timestamp = "", -1, -1, -1

    def store(self, name: str) -> Store:
        if name not in self._processor.stores:
            raise StoreError(f"processor {self._processor.name} did not declare store {name!r} (stores={list(self._processor.stores)})")
        store = self._runner.shards[(name, self.partition)][0]
        if store not in self._touched:
            self._touched.append(store)
        return store

    def emit(self, key, value, topic: str | None = None, headers=None, timestamp: int | None = None) -> None:
        """Send a record to the processor's sink (or ``topic``) in this transaction."""
        processor = self._processor
        topic = topic or processor.sink
        if topic is None:
            raise ValueError(f"processor {processor.name} has no sink: emit(..., topic=...) names one")
        self._outputs.append((
            topic,
            processor.sink_key_serde.serialize(key),
            processor.sink_value_serde.serialize(value),
            tuple(headers) if headers else (),
            self.timestamp if timestamp is None else int(timestamp),
        ))

    def count(self, metric: str, n: int = 1) -> None:
        """Add ``n`` to the app's counter ``metric`` when this transaction
        commits (an aborted one is rewound and counts again when redone)."""
        counts = self._runner.txn_counts
        counts[metric] = counts.get(metric, 0) + n


class Runner:
    def __init__(self, app: App, *, until_idle: float | None = None, progress_interval: float | None = None, progress_out=None, metrics_address: tuple[str, int] | None = None):
        self.app = app
        self.metrics_address = metrics_address
        self.metrics = app.metrics
        self.until_idle = until_idle
        self.progress_interval = progress_interval
        self.progress_out = progress_out or sys.stderr
        self.by_topic: dict[str, list[Processor]] = {}
        self.stores_by_topic: dict[str, set[str]] = {}
        for processor in app.processors:
            for topic in processor.sources:
                self.by_topic.setdefault(topic, []).append(processor)
                self.stores_by_topic.setdefault(topic, set()).update(processor.stores)
        self.shards: dict[tuple[str, int], tuple[Store, StoreFile]] = {}
        # Shards given up in the rebalance under way (their files closed), kept
        # in memory until its assignment: an eager rebalance revokes everything
        # and mostly gives it back, which then costs no reload.
        self.parked: dict[tuple[str, int], Store] = {}
        self.assigned: set[TopicPartition] = set()
        self.ctx = Context(self)
        self.producer: AsyncProducer | None = None
        self.consumer: AsyncConsumer | None = None
        self.restorer: AsyncConsumer | None = None
        self.admin: AsyncAdmin | None = None
        self.failed = False
        # The open transaction
        self.txn_open = False
        self.txn_started = 0.0
        self.txn_records = 0
        self.txn_outputs = 0
        # Counters of what the open transaction did (dead letters, the
        # processors' ctx.count): added to the metrics once it commits.
        self.txn_counts: dict[str, int] = {}
        self.txn_offsets: dict[TopicPartition, int] = {}
        self.dirty: set[Store] = set()
        self.processed: dict[TopicPartition, int] = {}  # next offset per partition, as far as processed
        self.topic_partitions: dict[tuple[str, int], TopicPartition] = {}  # made once, not per record
        self.last_activity = time.monotonic()
        # What the metrics read besides app.metrics: the lag per assigned
        # partition (as last asked for) and each shard being restored's
        # (position, stable end) in its changelog.
        self.lag: dict[TopicPartition, int] = {}
        self.restoring: dict[tuple[str, int], tuple[int, int]] = {}

    # -- the whole run -------------------------------------------------------------------------

    async def run(self) -> None:
        app = self.app
        lock = app.lock_state_dir()
        loop = asyncio.get_running_loop()
        installed = []
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, app.stop)
                installed.append(signum)
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
            self.producer = self._new_producer()
            await self.producer.init_transactions()
            self.consumer = AsyncConsumer(
                app.bootstrap_servers, group_id=app.application_id, isolation_level="read_committed",
                **{**DEFAULTS_CONSUMER, **app.consumer_options, "group_instance_id": app.transactional_id, "enable_auto_commit": False},
            )
            self.restorer = AsyncConsumer(app.bootstrap_servers, isolation_level="read_committed", **{**common, "max_poll_records": RESTORE_CHUNK})
            log.info("instance %s of %s starting (transactional id %s)", app.instance_id, app.application_id, app.transactional_id)
            self.consumer.subscribe(sorted(self.by_topic), listener=self)
            await self._loop()
            if self.txn_open:
                await self._commit_or_abort()
        except BaseException:
            self.failed = True
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
        if self.failed and self.txn_open and self.producer is not None:
            self.txn_open = False
            self.metrics.aborted("stopped_on_error")
            try:
                await self.producer.abort_transaction()
            except Exception as error:  # fenced or broker gone: the coordinator's timeout aborts it
                log.warning("could not abort the open transaction on the way out: %s", error)
        for client in (self.consumer, self.restorer, self.admin):
            if client is not None:
                try:
                    await client.close()  # the consumer's close revokes: our listener closes the stores
                except Exception as error:
                    log.warning("closing %s: %s", type(client).__name__, error)
        await self._close_shards(list(self.shards))
        if self.producer is not None:
            try:
                await self.producer.close()
            except Exception as error:
                log.warning("closing the producer: %s", error)

    def _new_producer(self) -> AsyncProducer:
        app = self.app
        return AsyncProducer(app.bootstrap_servers, transactional_id=app.transactional_id, **{**DEFAULTS_PRODUCER, **app.producer_options})

    async def _prepare_topics(self) -> None:
        """Check the sources and create the changelogs (compacted, partitioned
        like their sources), the internal topics the app declared (the
        dataflow layer's repartition topics, partitioned like the topic each
        names) and the dead-letter topic when missing, all with the app's
        ``replication_factor`` and ``min_insync_replicas``."""
        app = self.app
        existing = await self.admin.list_topics()
        internal = {topic: existing[like] for topic, like in app.internal_topics.items() if topic not in existing and like in existing}
        if internal:
            configs = {topic: app.internal_topic_config() for topic in internal}
            await self.admin.create_topics(internal, replication_factor=app.replication_factor, configs=configs, exist_ok=True)
            log.info("created %s", ", ".join(sorted(internal)))
            existing = {**existing, **internal}
        missing = sorted(t for t in self.by_topic if t not in existing)
        if missing:
            raise FatalError(message=f"source topic(s) {', '.join(missing)} do not exist: create them first")
        wanted: dict[str, int] = {}
        for processor in app.processors:
            counts = {existing[t] for t in processor.sources}
            if processor.stores and len(counts) > 1:
                raise FatalError(message=f"processor {processor.name} has stores, so its sources must have one partition count (co-partitioned), not {sorted(counts)}")
            for store in processor.stores:
                wanted[app.changelog_topic(store)] = max(wanted.get(app.changelog_topic(store), 0), max(counts))
        for topic, count in wanted.items():
            if topic in existing and existing[topic] < count:
                raise FatalError(message=f"changelog {topic} has {existing[topic]} partitions, fewer than its sources' {count}")
        to_create = {t: c for t, c in wanted.items() if t not in existing}
        configs = {t: app.internal_topic_config(**{"cleanup.policy": "compact"}) for t in to_create}
        if app.on_error == "dead-letter" and app.dead_letter_topic not in existing:
            to_create[app.dead_letter_topic] = 1
            configs[app.dead_letter_topic] = app.internal_topic_config()
        if to_create:
            await self.admin.create_topics(to_create, replication_factor=app.replication_factor, configs=configs, exist_ok=True)
            log.info("created %s", ", ".join(sorted(to_create)))

    # -- the loop ------------------------------------------------------------------------------

    async def _loop(self) -> None:
        app, consumer = self.app, self.consumer
        interval = app.commit_interval_ms / 1000
        next_progress = time.monotonic() + (self.progress_interval or 0)
        next_lag = time.monotonic()
        progress_mark = (time.monotonic(), 0, 0)
        self.last_activity = time.monotonic()
        poll_delay = RetryDelay()
        while not app.stopping:
            timeout = max(0.0, self.txn_started + interval - time.monotonic()) if self.txn_open else 0.5
            try:
                records = await consumer.poll(min(timeout, 0.5))
            except (RetriableError, ConnectionError, TimeoutError, OSError) as error:
                # Once per outage at WARNING; the retries of a broker that
                # stays down would otherwise log four lines a second.
                (log.warning if not poll_delay.failures else log.debug)("poll failed (%s); polling again", error)
                await asyncio.sleep(poll_delay.next())
                continue
            poll_delay.reset()
            if records:
                self.last_activity = time.monotonic()
                processed = 0
                try:
                    for raw in records:
                        await self._process(raw)
                        processed += 1
                        if app.commit_records is not None and self.txn_records >= app.commit_records:
                            if not await self._commit_or_abort():
                                break  # rewound: the rest of this poll is read again
                finally:
                    self.metrics.add("records_in", processed)
                # Processing never awaits anything that waits, so the batches
                # it filled would go out only at the commit's flush: let them
                # go now, to be written while the next records are processed.
                await asyncio.sleep(0)
            if self.txn_open and time.monotonic() - self.txn_started >= interval:
                await self._commit_or_abort()
                self.last_activity = time.monotonic()  # a slow commit is not idleness
            now = time.monotonic()
            if self.metrics_address is not None and now >= next_lag:
                self.lag = await self._lag() or self.lag
                next_lag = now + LAG_REFRESH_SECONDS
            if self.progress_interval and now >= next_progress:
                progress_mark = await self._progress(progress_mark)
                next_progress = now + self.progress_interval
            # Idle time counts from the first assignment on (joining a group may take a while).
            if self.until_idle is not None and not records and not self.txn_open and self.metrics.get("rebalances") and now - self.last_activity >= self.until_idle:
                log.info("idle for %.1f s: stopping", self.until_idle)
                return

    async def _process(self, raw) -> None:
        """Run every processor of ``raw``'s topic on it, inside the open transaction."""
        if not self.txn_open:
            self.producer.begin_transaction()
            self.txn_open = True
            self.txn_started = time.monotonic()
        ctx = self.ctx
        ctx.topic, ctx.partition, ctx.offset, ctx.timestamp = raw.topic, raw.partition, raw.offset, raw.timestamp
        for processor in self.by_topic[raw.topic]:
            ctx._processor = processor
            stage = "deserializing"
            try:
                record = Record(
                    processor.key_serde.deserialize(raw.key), processor.value_serde.deserialize(raw.value),
                    raw.topic, raw.partition, raw.offset, raw.timestamp, raw.headers,
                )
                stage = "processing"
                processor.function(record, ctx)
            except Exception as error:
                for store in ctx._touched:
                    store.end_record(False)
                ctx._touched.clear()
                ctx._outputs.clear()
                await self._failed_record(processor, raw, error, stage)
                continue
            for store in ctx._touched:
                if store.end_record(True):
                    self.dirty.add(store)
            ctx._touched.clear()
            if ctx._outputs:
                outputs, ctx._outputs = ctx._outputs, []
                for topic, key, value, headers, timestamp in outputs:
                    await self._send(topic, key, value, headers, timestamp)
                self.txn_outputs += len(outputs)
        tp = self.topic_partitions.get((raw.topic, raw.partition))
        if tp is None:
            tp = self.topic_partitions[(raw.topic, raw.partition)] = TopicPartition(raw.topic, raw.partition)
        self.txn_offsets[tp] = self.processed[tp] = raw.offset + 1
        self.txn_records += 1

    async def _send(self, topic: str, key, value, headers, timestamp, partition: int | None = None, *, report: bool = False):
        """Send in the open transaction; the record's future only if
        ``report`` (a failed record fails the commit either way)."""
        producer = self.producer
        if producer.can_append_now(topic, partition):
            return producer.append(topic, partition, value, key, headers, timestamp, report=report)
        return await producer.send(topic, value, key=key, partition=partition, headers=headers, timestamp=timestamp)

    async def _failed_record(self, processor: Processor, raw, error: Exception, stage: str) -> None:
        where = f"{raw.topic}-{raw.partition}@{raw.offset}"
        if self.app.on_error == "stop":
            self.metrics.add("errors")
            message = f"processor {processor.name} failed on record {where} ({stage}): {type(error).__name__}: {error}"
            log.error("%s; stopping (on_error='stop'): the open transaction is aborted, a restart reads this record again", message)
            self.failed = True
            raise ProcessingError(message, topic=raw.topic, partition=raw.partition, offset=raw.offset) from error
        headers = tuple(raw.headers) + (
            ("onceflow.error", f"{type(error).__name__}: {error}".encode("utf-8", "replace")),
            ("onceflow.error.stage", stage.encode()),
            ("onceflow.processor", processor.name.encode()),
            ("onceflow.source.topic", raw.topic.encode()),
            ("onceflow.source.partition", str(raw.partition).encode()),
            ("onceflow.source.offset", str(raw.offset).encode()),
        )
        await self._send(self.app.dead_letter_topic, raw.key, raw.value, headers, raw.timestamp)
        self.txn_outputs += 1
        self.txn_counts["dead_letters"] = self.txn_counts.get("dead_letters", 0) + 1
        log.warning("processor %s failed on record %s: %s: %s; sent to %s", processor.name, where, type(error).__name__, error, self.app.dead_letter_topic)

    # -- commit ----------------------------------------------------------------------------------

    async def _commit(self) -> None:
        producer = self.producer
        began = time.monotonic()
        written: list[tuple[Store, dict, object]] = []
        for store in self.dirty:
            changes = store.take_pending()
            if not changes:
                continue
            topic = self.app.changelog_topic(store.name)
            last = len(changes) - 1
            for index, (key, value) in enumerate(changes.items()):
                # Only the shard's last record's offset is needed: where its SQLite file stands after this commit.
                outcome = await self._send(topic, key, value, (), None, partition=store.partition, report=index == last)
            written.append((store, changes, outcome))
        self.dirty = set()
        # The offsets' round trips (AddOffsetsToTxn, TxnOffsetCommit) overlap
        # the records' flush; both finish (no orphan task) before any error counts.
        steps = [producer.flush()]
        if self.txn_offsets:
            offsets = {tp: OffsetAndMetadata(offset) for tp, offset in self.txn_offsets.items()}
            steps.append(producer.send_offsets_to_transaction(offsets, self.consumer.group_metadata()))
        for outcome in await asyncio.gather(*steps, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome
        await producer.commit_transaction()
        self.txn_open = False
        self.metrics.observe("commit_seconds", time.monotonic() - began)
        self._count_committed(self.txn_outputs, self.txn_counts)
        self._forget_transaction()
        self.app.crash_point(CRASH_AFTER_COMMIT)
        for store, changes, last in written:
            # The changelog offset after this transaction's last record of the
            # shard. An offset the broker did not report (a retried duplicate)
            # leaves the shard's position where it was: re-reading from there
            # replays writes it already has, which changes nothing.
            reached = last.result().offset + 1
            next_offset = max(store.next_offset, reached)
            store.apply_committed(changes, next_offset)
            shard = self.shards.get((store.name, store.partition))
            if shard is not None and shard[0] is store:
                await shard[1].apply(changes, next_offset)

    async def _commit_or_abort(self) -> bool:
        """Commit the open transaction; on an abortable error abort it and
        rewind (False). Fencing raises ``InstanceFencedError``."""
        try:
            await self._commit()
            return True
        except ApplicationRecoverableError as error:
            raise self._fenced(error) from error
        except CommitOutcomeUnknownError as error:
            log.warning("commit outcome unknown (%s): settling it with a new producer, then rewinding", error)
            self.metrics.add("commits_unknown")
            unsettled_offsets, outputs, counts = self.txn_offsets, self.txn_outputs, self.txn_counts
            self._forget_transaction()  # the next transaction starts from what is committed
            await self._renew_producer()
            await self._recover(catch_up_stores=True)
            # Committed iff the group's offsets reached the transaction's
            # (the rewind just read them into ``processed``): only then
            # count what it did. A partition not rewound cannot tell.
            rewound = {tp for tp in self.assigned if tp in self.consumer.assignment()}
            if unsettled_offsets and all(tp in rewound and self.processed.get(tp, -1) >= offset for tp, offset in unsettled_offsets.items()):
                self._count_committed(outputs, counts)
            return False
        except ABORTABLE as error:
            log.warning("transaction aborted: %s: %s; rewinding to the committed offsets", type(error).__name__, error)
            if getattr(error, "code", None) in GROUP_FENCING:
                # The group moved on without us (this member's session ended,
                # e.g. the process was stopped): rejoin at the next poll, which
                # reports the partitions lost, rather than wait for a heartbeat
                # to find out.
                self.consumer.enforce_rebalance(error.code)
            await self._abort(abort_cause(error))
            await self._recover(catch_up_stores=False)
            return False

    def _fenced(self, error: Exception) -> InstanceFencedError:
        self.failed = True
        self.txn_open = False
        message = (f"instance {self.app.instance_id} of {self.app.application_id} was fenced ({error}): another producer "
                   f"took transactional id {self.app.transactional_id}, or the broker aborted this instance's transaction after "
                   "it stalled past transaction_timeout_ms; it writes nothing more and stops")
        log.error(message)
        return InstanceFencedError(message)

    def _count_committed(self, outputs: int, counts: dict[str, int]) -> None:
        """A transaction committed: count it and what it did."""
        self.metrics.add("commits")
        self.metrics.add("records_out", outputs)
        for name, n in counts.items():
            self.metrics.add(name, n)

    def _forget_transaction(self) -> None:
        """The open transaction's bookkeeping, back to nothing."""
        self.txn_records = self.txn_outputs = 0
        self.txn_counts = {}
        self.txn_offsets = {}

    async def _abort(self, cause: str) -> None:
        self.metrics.aborted(cause)
        self.txn_open = False
        self._forget_transaction()
        for store in self.dirty:
            store.discard_pending()
        self.dirty = set()
        try:
            await self.producer.abort_transaction()
        except ApplicationRecoverableError as error:
            raise self._fenced(error) from error
        except (KafkaError, ConnectionError, TimeoutError, OSError) as error:
            log.warning("abort failed (%s): a new producer aborts it instead", error)
            await self._renew_producer()

    async def _renew_producer(self) -> None:
        """Replace the producer: init_transactions finishes (commit or abort,
        as the coordinator decided) whatever the old one left open."""
        self.txn_open = False
        for store in self.dirty:
            store.discard_pending()
        self.dirty = set()
        old, self.producer = self.producer, self._new_producer()
        try:
            await old.cluster.close()
        except Exception:
            pass
        try:
            await self.producer.init_transactions()
        except ApplicationRecoverableError as error:
            raise self._fenced(error) from error

    async def _recover(self, *, catch_up_stores: bool) -> None:
        """Rewind every assigned partition to its committed offset (and catch
        the shards up with the changelog, when our last commit may have
        happened after all). Retried until the broker answers."""
        delay = RetryDelay()
        while True:
            try:
                if catch_up_stores:
                    for store, file in list(self.shards.values()):
                        await self._catch_up(store, file)
                await self._rewind(sorted(self.assigned))
                return
            except (RetriableError, ConnectionError, TimeoutError, OSError) as error:
                if self.app.stopping:
                    raise
                log.warning("rewinding failed (%s); trying again", error)
                await asyncio.sleep(delay.next())

    async def _rewind(self, partitions: list[TopicPartition]) -> None:
        consumer = self.consumer
        partitions = [tp for tp in partitions if tp in consumer.assignment()]
        if not partitions:
            return
        committed = await consumer.committed(partitions)
        starts = await consumer.beginning_offsets([tp for tp in partitions if committed.get(tp) is None])
        for tp in partitions:
            offset = committed[tp].offset if committed.get(tp) else starts[tp]
            consumer.seek(tp, offset)
            self.processed[tp] = offset

    # -- rebalances (the consumer calls these inside poll) -------------------------------------

    async def on_partitions_revoked(self, partitions) -> None:
        if self.txn_open and not self.failed:
            await self._commit_or_abort()
        await self._release(partitions)

    async def on_partitions_lost(self, partitions) -> None:
        log.warning("partitions lost (the group moved on without this member): %s%s", ", ".join(map(str, sorted(partitions))) or "none",
                    "; aborting the open transaction" if self.txn_open and not self.failed else "")
        if self.txn_open and not self.failed:
            await self._abort("partitions_lost")
        await self._release(partitions)

    async def on_partitions_assigned(self, partitions) -> None:
        self.metrics.add("rebalances")
        partitions = set(partitions)
        self.assigned |= partitions
        restore_delay = RetryDelay()
        while True:  # no record of these partitions may be processed before their stores are restored
            needed = self._shards_needed(partitions) - set(self.shards)
            if not needed:
                break
            try:
                # Wait until no transaction of a previous owner still holds a
                # pending offset commit for these partitions (KIP-447): then
                # that owner's changelog writes are decided too.
                await self.consumer.committed(sorted(partitions))
                for name, partition in sorted(needed):
                    await self._open_shard(name, partition)
            except (RetriableError, ConnectionError, TimeoutError, OSError) as error:
                if self.app.stopping:
                    raise
                log.warning("restoring stores failed (%s); trying again", error)
                await asyncio.sleep(restore_delay.next())
        for tp in partitions:
            self.processed.pop(tp, None)
        self.parked.clear()  # what was given up and not given back: someone else's now
        self.last_activity = time.monotonic()
        log.info("assigned %s", ", ".join(map(str, sorted(partitions))) or "nothing")

    async def _release(self, partitions) -> None:
        self.assigned -= set(partitions)
        for tp in partitions:
            self.processed.pop(tp, None)
        await self._close_shards(sorted(set(self.shards) - self._shards_needed(self.assigned)), park=True)

    def _shards_needed(self, partitions) -> set[tuple[str, int]]:
        return {(name, tp.partition) for tp in partitions for name in self.stores_by_topic.get(tp.topic, ())}

    # -- stores --------------------------------------------------------------------------------

    def _store_path(self, name: str, partition: int) -> str:
        return os.path.join(self.app.state_dir, "stores", f"{name}-{partition}.sqlite")

    async def _open_shard(self, name: str, partition: int) -> None:
        file = StoreFile(self._store_path(name, partition), self.app.changelog_topic(name), partition)
        parked = self.parked.pop((name, partition), None)
        store = None
        if parked is not None:
            # Given up in this rebalance and given back: its memory is the
            # file's contents already (same offset), so only the changelog's
            # tail (another owner's writes meanwhile) is read.
            _nothing, next_offset = await file.open(load=False)
            if not file.discarded_reason and next_offset == parked.next_offset:
                store = parked
            else:
                await file.close()
        if store is None:
            contents, next_offset = await file.open()
            if file.discarded_reason:
                log.warning("store %s-%d: the SQLite file was %s; rebuilding it from the changelog", name, partition, file.discarded_reason)
                self.metrics.add("store_rebuilds")
            store = Store(name, partition, contents, next_offset)
        try:
            await self._catch_up(store, file)
        except BaseException:
            await file.close()
            raise
        self.shards[(name, partition)] = (store, file)

    async def _close_shards(self, keys, *, park: bool = False) -> None:
        for key in keys:
            store, file = self.shards.pop(key)
            store.discard_pending()
            await file.close()
            if park:
                self.parked[key] = store

    async def _stable_end(self, tp: TopicPartition) -> int:
        """The changelog's end once every transaction that had written to it
        when we looked is decided (its last stable offset reaches that high
        watermark): a previous owner's commit may still be on its way here."""
        high = (await self.admin.list_offsets({tp: "latest"}, isolation_level="read_uncommitted"))[tp].offset
        deadline = time.monotonic() + 2 * self.producer.config.transaction_timeout_ms / 1000 + 30
        while True:
            stable = (await self.restorer.end_offsets([tp]))[tp]
            if stable >= high or time.monotonic() > deadline:
                return stable
            await asyncio.sleep(0.1)

    async def _catch_up(self, store: Store, file: StoreFile) -> None:
        """Bring a shard to the changelog's stable end (rebuilding it if its
        file cannot be a prefix of the changelog)."""
        tp = TopicPartition(self.app.changelog_topic(store.name), store.partition)
        start = (await self.restorer.beginning_offsets([tp]))[tp]
        end = await self._stable_end(tp)
        reason = None
        if store.next_offset > end:
            reason = f"ahead of the changelog (file at {store.next_offset}, changelog's stable end {end})"
        elif store.next_offset < start and (store.committed or store.next_offset > 0):
            reason = f"behind the changelog's start (file at {store.next_offset}, log start {start}): records it lacks are gone"
        if reason:
            log.warning("store %s-%d: %s; rebuilding from the changelog", store.name, store.partition, reason)
            self.metrics.add("store_rebuilds")
            store.reset(start)
            await file.clear(start)
        elif store.next_offset < start:
            store.next_offset = start
        if store.next_offset >= end:
            return
        began = time.monotonic()
        key = (store.name, store.partition)
        self.restoring[key] = (store.next_offset, end)
        try:
            restored, position = await self._restore(store, file, tp, end)
        finally:
            self.restoring.pop(key, None)
        self.metrics.add("restored_records", restored)
        log.info("store %s-%d: restored %d changelog records up to offset %d in %.2f s", store.name, store.partition, restored, position, time.monotonic() - began)

    async def _restore(self, store: Store, file: StoreFile, tp: TopicPartition, end: int) -> tuple[int, int]:
        """Apply the changelog from the shard's offset to ``end``; (records restored, offset reached)."""
        restorer = self.restorer
        restorer.assign([tp])
        restorer.seek(tp, store.next_offset)
        changes: dict = {}
        restored = 0
        position = store.next_offset
        while position < end:
            # A short wait: at the tail there may be nothing visible left (only
            # a COMMIT marker), and the fetch would wait its whole timeout.
            for record in await restorer.poll(0.05):
                if record.key is not None:
                    changes[record.key] = record.value
                    restored += 1
            position = await restorer.position(tp)
            self.restoring[(store.name, store.partition)] = (position, end)
            if len(changes) >= RESTORE_CHUNK:
                store.apply_committed(changes, position)
                await file.apply(changes, position)
                changes = {}
        if position != store.next_offset:
            store.apply_committed(changes, position)
            await file.apply(changes, position)
        restorer.assign([])
        return restored, position

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
        except (KafkaError, ConnectionError, TimeoutError, OSError):
            return None


def abort_cause(error: BaseException) -> str:
    """Why an abortable error aborted the transaction, in a few bounded words (a metric's label)."""
    if getattr(error, "code", None) in GROUP_FENCING:
        return "group_fenced"
    if isinstance(error, CommitFailedError):
        return "commit_failed"
    if isinstance(error, TransactionAbortableError):
        return "transaction_abortable"
    if isinstance(error, RetriableError):
        return "retries_exhausted"
    if isinstance(error, TimeoutError):
        return "timeout"
    return "connection"
