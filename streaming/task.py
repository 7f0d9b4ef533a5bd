"""One input record through the app's processors, without I/O: the part of
the runner that ``streaming.testing.TestDriver`` shares with it.

``Task.process(raw)`` deserializes ``raw`` with each processor's formats,
calls the processors of its topic in registration order through one
``Context``, and hands back what the record did: the records to send (the
processors' emits, serialized, and dead letters), in order. Store writes go
to the stores' pending layers (``Store.end_record``); the stores a record
wrote are collected in ``dirty`` until the caller's commit takes them.

A processor that raises (or whose record cannot be deserialized) leaves no
trace: its store writes and emits are dropped. Then the app's ``on_error``
decides: ``"stop"`` raises ``ProcessingError`` naming the record (the caller
aborts); ``"dead-letter"`` adds the raw record to the outputs, bound for the
dead-letter topic, with headers naming the error, the stage, the processor
and the position, and counts it (``dead_letters``) into the transaction's
counters; the other processors of the record run as usual.

The runner's input records are ``FetchedRecord``s (``fetched_records``
makes them from the column batches its consumer polls); the test driver's
are ``txn.types.ConsumerRecord``s; both have the same fields.

What the caller provides: the shard of a (store, partition) (the runner's
restored shards, the driver's in-memory ones) and the open transaction's
counters (``counts``, a dict it resets when a transaction ends).

Timers (``App.schedule``) run here too, through the same context and into
the same transaction: after a record, the stream-time timers of its
processors whose partition's stream time reached their next fire time;
on ``fire_wall_clock(now)``, the wall-clock timers that are due. Their
state (``STREAM_TIME``, and each timer's next fire time) is in the
processor's timer store, written in the transaction like any store write.
A timer that raises stops the app (``ProcessingError`` naming the timer):
there is no record to dead-letter.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Callable

import attrs

from streaming.app import App, Context, Processor, Record, Timer, timer_store
from streaming.errors import ProcessingError
from streaming.store import Store
from streaming.tables import GlobalStore

log = logging.getLogger("streaming.runner")

STREAM_TIME = "stream-time"


def _next_fire(timer: Timer) -> tuple:
    return ("next", timer.name)


def _aligned(time_ms: int, every_ms: int) -> int:
    """The latest multiple of ``every_ms`` at or before ``time_ms``."""
    return time_ms - time_ms % every_ms


class FetchedRecord:
    """A record of a fetched column batch (``fetched_records``), with
    ``txn.types.ConsumerRecord``'s first fields: the one object the runner makes per input record.
    Its fields are plain slots filled from lists the columns give at once
    (a property reading the columns on touch cost more: the task reads every
    field of every record)."""

    __slots__ = ("topic", "partition", "offset", "timestamp", "key", "value", "headers")

    def __init__(self, topic: str, partition: int, offset: int, timestamp: int, key: bytes | None, value: bytes | None, headers: tuple):
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.timestamp = timestamp
        self.key = key
        self.value = value
        self.headers = headers

    def __repr__(self) -> str:
        return (f"FetchedRecord(topic={self.topic!r}, partition={self.partition}, offset={self.offset}, timestamp={self.timestamp}, "
                f"key={self.key!r}, value={self.value!r}, headers={self.headers!r})")


def fetched_records(topic: str, partition: int, columns) -> list[FetchedRecord]:
    """The records of one partition's fetched columns
    (``protocol.columnar.FETCHED_SCHEMA``, what ``poll_columns`` hands out):
    each column turned into Python values by Arrow at once, headers only in
    a batch that carries some."""
    count = columns.num_rows
    headers_column = columns.column(5)
    if headers_column.offsets[count].as_py() == headers_column.offsets[0].as_py():  # no record has headers
        headers = itertools.repeat((), count)
    else:
        headers = [tuple([(entry["key"], entry["value"]) for entry in entries]) if entries else () for entries in headers_column.to_pylist()]
    return list(map(FetchedRecord, itertools.repeat(topic, count), itertools.repeat(partition, count), columns.column(2).to_pylist(),
                    columns.column(3).to_pylist(), columns.column(0).to_pylist(), columns.column(1).to_pylist(), headers))


def dead_letter_headers(raw, processor: Processor, error: BaseException, stage: str) -> tuple:
    """The raw record's headers plus where and why it failed."""
    return tuple(raw.headers) + (
        ("onceflow.error", f"{type(error).__name__}: {error}".encode("utf-8", "replace")),
        ("onceflow.error.stage", stage.encode()),
        ("onceflow.processor", processor.name.encode()),
        ("onceflow.source.topic", raw.topic.encode()),
        ("onceflow.source.partition", str(raw.partition).encode()),
        ("onceflow.source.offset", str(raw.offset).encode()),
    )


def _event_time(value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"a timestamp extractor returns milliseconds (an int), not {value!r}")
    return int(value)


class Task:
    """The app's processors by source topic, the stores each topic needs, and
    the ``Context`` they act through."""

    def __init__(self, app: App, shard: Callable[[str, int], Store]):
        self.app = app
        self.by_topic: dict[str, list[Processor]] = {}
        self.stores_by_topic: dict[str, set[str]] = {}
        for processor in app.processors:
            for topic in processor.sources:
                self.by_topic.setdefault(topic, []).append(processor)
                self.stores_by_topic.setdefault(topic, set()).update(processor.stores)
        self.counts: dict[str, int] = {}
        self.dirty: set[Store] = set()
        self.shard = shard
        self.ctx = Context(shard, self._count)
        # The global tables' in-memory copies, filled by the caller (the
        # runner's streaming.global_tables, the test driver).
        self.globals = {topic: GlobalStore(table) for topic, table in app.global_tables.items()}
        self.ctx._globals = self.globals
        self.processors = {processor.name: processor for processor in app.processors}
        self.stream_timers: dict[str, list[Timer]] = {}
        self.wall_clock_timers: list[Timer] = []
        for timer in app.timers:
            if timer.kind == "stream_time":
                self.stream_timers.setdefault(timer.processor, []).append(timer)
            else:
                self.wall_clock_timers.append(timer)
        # Wall-clock timers never fired on a partition: their first fire
        # time, in memory only until they fire (then it is in the store).
        self._first_wall_clock_fire: dict[tuple[str, str, int], int] = {}

    def _count(self, metric: str, n: int) -> None:
        self.counts[metric] = self.counts.get(metric, 0) + n

    def order_time(self, raw) -> int:
        """The timestamp ``raw``'s processors will see, for ordering
        co-partitioned inputs (``streaming.picking``): what the first of its
        topic's processors with a ``timestamp_extractor`` extracts, else its
        CreateTime (also when extracting fails: processing it reports that)."""
        for processor in self.by_topic.get(raw.topic, ()):
            if processor.timestamp_extractor is not None:
                try:
                    record = Record(processor.key_serde.deserialize(raw.key), processor.value_serde.deserialize(raw.value),
                                    raw.topic, raw.partition, raw.offset, raw.timestamp, raw.headers)
                    return _event_time(processor.timestamp_extractor(record))
                except Exception:  # noqa: BLE001 - the record fails again, and is reported, when processed
                    return raw.timestamp
        return raw.timestamp

    def stores_needed(self, partitions) -> set[tuple[str, int]]:
        """The (store, partition) shards that records of ``partitions`` (TopicPartitions) use."""
        return {(name, tp.partition) for tp in partitions for name in self.stores_by_topic.get(tp.topic, ())}

    def take_dirty(self) -> set[Store]:
        dirty, self.dirty = self.dirty, set()
        return dirty

    def forget(self) -> None:
        """The transaction ended (committed or aborted): its counters and the
        stores it wrote start afresh (an abort's caller discards their pending writes)."""
        self.counts = {}

    def process(self, raw) -> list[tuple[str, bytes | None, bytes | None, tuple, int, Any]]:
        """Run every processor of ``raw``'s topic on it; the records to send,
        as (topic, key, value, headers, timestamp, processor or None)."""
        ctx = self.ctx
        ctx.topic, ctx.partition, ctx.offset, ctx.timestamp = raw.topic, raw.partition, raw.offset, raw.timestamp
        sent: list = []
        for processor in self.by_topic[raw.topic]:
            ctx._processor = processor
            stage = "deserializing"
            try:
                record = Record(
                    processor.key_serde.deserialize(raw.key), processor.value_serde.deserialize(raw.value),
                    raw.topic, raw.partition, raw.offset, raw.timestamp, raw.headers,
                )
                if processor.timestamp_extractor is not None:
                    stage = "extracting the timestamp"
                    record = attrs.evolve(record, timestamp=_event_time(processor.timestamp_extractor(record)))
                ctx.timestamp = record.timestamp
                stage = "processing"
                processor.function(record, ctx)
            except Exception as error:
                for store in ctx._touched:
                    store.end_record(False)
                ctx._touched.clear()
                ctx._outputs.clear()
                sent.append(self._failed_record(processor, raw, error, stage))
                continue
            self._keep(sent)
            if processor.name in self.stream_timers:
                self._stream_time(processor, raw.partition, record.timestamp, sent)
            ctx.timestamp = raw.timestamp
        return sent

    def _keep(self, sent: list) -> None:
        """The processor (or timer) just called succeeded: keep its store writes and emits."""
        ctx = self.ctx
        for store in ctx._touched:
            if store.end_record(True):
                self.dirty.add(store)
        ctx._touched.clear()
        if ctx._outputs:
            sent += ctx._outputs
            ctx._outputs = []

    def _write(self, state: Store, key, value) -> None:
        state.put(key, value)
        if state.end_record(True):
            self.dirty.add(state)

    def _stream_time(self, processor: Processor, partition: int, timestamp: int, sent: list) -> None:
        """The processor's stream time on ``partition`` moves to ``timestamp``
        if later; fire its stream-time timers that this makes due."""
        state = self.shard(timer_store(processor.name), partition)
        seen = state.get(STREAM_TIME)
        if seen is not None and timestamp <= seen:
            return
        self._write(state, STREAM_TIME, timestamp)
        for timer in self.stream_timers[processor.name]:
            due = state.get(_next_fire(timer))
            if due is None:  # the first record: the next multiple is the first fire
                self._write(state, _next_fire(timer), _aligned(timestamp, timer.every_ms) + timer.every_ms)
            elif timestamp >= due:
                at = _aligned(timestamp, timer.every_ms)
                self._write(state, _next_fire(timer), at + timer.every_ms)
                self._fire(processor, timer, partition, at, sent)

    def wall_clock_due(self, now_ms: int, partitions: dict[str, set[int]]) -> list[tuple[Timer, int, int]]:
        """The wall-clock timers due at ``now_ms``, as (timer, partition, fire
        time), for the partitions held of each processor (``partitions``: processor
        name -> partition numbers). Reads only: nothing is written until ``fire_due``."""
        due = []
        for timer in self.wall_clock_timers:
            for partition in sorted(partitions.get(timer.processor, ())):
                state = self.shard(timer_store(timer.processor), partition)
                next_fire = state.get(_next_fire(timer))
                if next_fire is None:
                    key = (timer.processor, timer.name, partition)
                    next_fire = self._first_wall_clock_fire.setdefault(key, _aligned(now_ms, timer.every_ms) + timer.every_ms)
                if now_ms >= next_fire:
                    due.append((timer, partition, _aligned(now_ms, timer.every_ms)))
        return due

    def fire_due(self, due: list[tuple[Timer, int, int]]) -> list:
        """Fire the wall-clock timers ``wall_clock_due`` found; the records to send."""
        sent: list = []
        for timer, partition, at in due:
            self._first_wall_clock_fire.pop((timer.processor, timer.name, partition), None)
            state = self.shard(timer_store(timer.processor), partition)
            self._write(state, _next_fire(timer), at + timer.every_ms)
            self._fire(self.processors[timer.processor], timer, partition, at, sent)
        return sent

    def _fire(self, processor: Processor, timer: Timer, partition: int, at: int, sent: list) -> None:
        ctx = self.ctx
        saved = ctx._processor, ctx.topic, ctx.partition, ctx.offset, ctx.timestamp
        ctx._processor, ctx.topic, ctx.partition, ctx.offset, ctx.timestamp = processor, processor.sources[0], partition, -1, at
        try:
            timer.function(ctx)
        except Exception as error:
            for store in ctx._touched:
                store.end_record(False)
            ctx._touched.clear()
            ctx._outputs.clear()
            self.app.metrics.add("errors")
            message = f"timer {timer.name} of processor {processor.name} failed on partition {partition} at {at} ms: {type(error).__name__}: {error}"
            log.error("%s; stopping: the open transaction is aborted", message)
            raise ProcessingError(message, topic=processor.sources[0], partition=partition, offset=-1) from error
        finally:
            ctx._processor, ctx.topic, ctx.partition, ctx.offset, ctx.timestamp = saved
        self._keep(sent)

    def _failed_record(self, processor: Processor, raw, error: Exception, stage: str) -> tuple:
        where = f"{raw.topic}-{raw.partition}@{raw.offset}"
        app = self.app
        if app.on_error == "stop":
            app.metrics.add("errors")
            message = f"processor {processor.name} failed on record {where} ({stage}): {type(error).__name__}: {error}"
            log.error("%s; stopping (on_error='stop'): the open transaction is aborted, a restart reads this record again", message)
            raise ProcessingError(message, topic=raw.topic, partition=raw.partition, offset=raw.offset) from error
        self._count("dead_letters", 1)
        log.warning("processor %s failed on record %s: %s: %s; sent to %s", processor.name, where, type(error).__name__, error, app.dead_letter_topic)
        return (app.dead_letter_topic, raw.key, raw.value, dead_letter_headers(raw, processor, error, stage), raw.timestamp, None)
