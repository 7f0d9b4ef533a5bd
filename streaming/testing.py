"""Test an app without a broker: ``TestDriver`` runs the app's processors,
dataflow steps, stores, windows and dead-letter routing through the same
code as the runner (``streaming.task``, ``streaming.store``), with
in-memory topics instead of the broker, no sockets and no threads.

    from streaming.testing import TestDriver

    driver = TestDriver(app)                     # the App object the app module builds
    driver.pipe("payments", "acct-1", {"amount": 5}, timestamp=1_000)
    assert driver.read("balances") == [("acct-1", {"account": "acct-1", "balance": 5})]
    assert driver.store("balances")["acct-1"] == 5
    driver.advance_wall_clock(60_000)            # fires wall-clock timers

What it models, and how:

- **Topics** are in-memory logs with offsets, partitioned as the producer
  partitions (murmur2 of the key bytes; ``partitions=`` sets the counts, 1
  by default; repartition topics take their source's). ``pipe`` serializes
  with the formats the app declared for the topic (a processor's source
  formats), ``read`` deserializes with the formats of its writers. Records a
  processor emits to a topic the app reads (a repartition topic, another
  processor's source) are processed in turn once committed, as the runner's
  read_committed consumer would see them.
- **Tables and joins**: co-partitioned inputs (a table's topic and a
  stream joined with it) readable together go in timestamp order, as the
  runner's picker takes them (``pipe_together`` produces several records
  before processing any); a global table's records are applied as soon as
  they are piped, and read again from the start on ``crash()``.
- **Transactions**: by default every input record is committed as soon as it
  is processed (``commit_every=1``), as Kafka Streams' TopologyTestDriver
  does. ``commit_every=N`` (or ``None``: only ``commit()``) keeps records in
  an open transaction: their outputs are invisible to ``read`` and their
  store writes pending until the commit, which moves outputs, store changes
  (to the in-memory changelogs) and input positions together.
- **A crash** (``crash()``): the open transaction is lost, each store is
  rebuilt from its changelog (what was committed, nothing from memory), and
  every partition is read again from its last committed position. Piping the
  same input with and without a crash and comparing what ``read`` gives tests
  a processor's idempotence: state kept outside the stores shows up there.
- **Errors**: under ``on_error="dead-letter"`` a failing record goes to the
  dead-letter topic (``dead_letters()`` reads it, with the error's headers
  decoded); under ``"stop"`` ``pipe`` raises ``ProcessingError``, the open
  transaction is aborted, and the record stays first in line (as a restarted
  runner would read it again).
- **Time**: a record's timestamp defaults to the driver's wall clock (0 at
  the start, moved by ``advance_wall_clock``, which takes milliseconds or a
  ``timedelta``). Stream time, windows and their closing follow the records'
  timestamps, as in the runner.

The counters the runner keeps (``records_in``, ``records_out``,
``commits``, ``dead_letters``, the processors' ``ctx.count``) go to
``app.metrics`` here too.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable

import attrs

from protocol.partitioning import default_partition
from streaming.app import App
from streaming.durations import milliseconds
from streaming.errors import ProcessingError
from streaming.serde import Serde, resolve
from streaming.store import Store, decode_key, decode_value
from streaming.picking import copartition_groups, order_key, table_topics
from streaming.task import Task
from txn.types import ConsumerRecord

__all__ = ["DeadLetter", "TestDriver", "TestRecord"]

BYTES = resolve("bytes")


@attrs.frozen
class TestRecord:
    """A record ``read_records`` gives: key and value deserialized."""

    __test__ = False  # not a pytest test class

    key: Any
    value: Any
    timestamp: int
    headers: tuple = ()
    partition: int = 0
    offset: int = 0


@attrs.frozen
class DeadLetter:
    """A record the app sent to its dead-letter topic: the raw key and value
    as they were read, and why and where it failed."""

    key: bytes | None
    value: bytes | None
    error: str
    stage: str  # "deserializing" or "processing"
    processor: str
    topic: str
    partition: int
    offset: int
    timestamp: int


@attrs.define
class _Entry:
    raw: ConsumerRecord
    committed: bool  # visible to read_committed readers
    formats: tuple[Serde, Serde] | None  # what the writer serialized with (None: bytes)
    aborted: bool = False  # never visible (its transaction was aborted)


class TestDriver:
    """Drives one app instance that owns every partition (see the module doc)."""

    __test__ = False  # not a pytest test class

    def __init__(self, app: App, *, partitions: int | dict[str, int] = 1, commit_every: int | None = 1, wall_clock_ms: int = 0):
        if not app.processors:
            raise ValueError("the app has no processors: register one with @app.processor(...)")
        if commit_every is not None and commit_every < 1:
            raise ValueError(f"commit_every is a positive number of records, or None (commit() only), not {commit_every!r}")
        self.app = app
        self.commit_every = commit_every
        self.wall_clock_ms = int(wall_clock_ms)
        self._partitions = partitions
        self.task = Task(app, self._shard)
        self.logs: dict[str, list[list[_Entry]]] = {}
        self.shards: dict[tuple[str, int], Store] = {}
        self.changelogs: dict[tuple[str, int], dict[bytes, bytes]] = {}  # compacted: encoded key -> encoded value
        self.committed: dict[tuple[str, int], int] = {}  # next offset per source partition, as committed
        self.position: dict[tuple[str, int], int] = {}  # next offset per source partition, as processed
        self.read_from: dict[tuple[str, int], int] = {}  # what read() has handed out
        self.open_offsets: dict[tuple[str, int], int] = {}
        self.open_outputs: list[_Entry] = []  # the open transaction's outputs, in the order sent
        self.open_records = 0
        self._round_robin = itertools.count()
        self._sequence = itertools.count()
        self._arrival: dict[tuple[str, int, int], int] = {}  # (topic, partition, offset) -> when it became readable
        self.formats_in = dict(app.declared_formats)
        for processor in app.processors:
            for topic in processor.sources:
                self.formats_in.setdefault(topic, (processor.key_serde, processor.value_serde))
        for topic, table in app.global_tables.items():
            self.formats_in.setdefault(topic, (table.key_serde, table.value_serde))
        groups = copartition_groups(app)
        self._group_of = {topic: index for index, group in enumerate(groups) for topic in group}
        self._rank = {topic: 0 for topic in table_topics(app)}
        self._held = {processor.name: set(range(self.partitions(processor.sources[0]))) for processor in app.processors}
        self.task.wall_clock_due(self.wall_clock_ms, self._held)  # wall-clock timers count from now
        self.formats_out = {}
        for processor in app.processors:
            if processor.sink is not None:
                self.formats_out.setdefault(processor.sink, (processor.sink_key_serde, processor.sink_value_serde))

    # -- topics ----------------------------------------------------------------------------------

    def partitions(self, topic: str) -> int:
        like = self.app.internal_topics.get(topic)
        if like is not None:
            return self.partitions(like)
        if isinstance(self._partitions, int):
            return self._partitions
        return self._partitions.get(topic, 1)

    def _log(self, topic: str) -> list[list[_Entry]]:
        if topic not in self.logs:
            self.logs[topic] = [[] for _ in range(self.partitions(topic))]
        return self.logs[topic]

    def _append(self, topic: str, key: bytes | None, value: bytes | None, headers, timestamp: int, partition: int | None, formats, committed: bool) -> _Entry:
        log = self._log(topic)
        if partition is None:
            partition = default_partition(key, len(log), self._round_robin)
        elif not 0 <= partition < len(log):
            raise ValueError(f"{topic} has {len(log)} partition(s), not a partition {partition}")
        offset = len(log[partition])
        entry = _Entry(ConsumerRecord(topic, partition, offset, int(timestamp), key, value, tuple(headers or ())), committed, formats)
        log[partition].append(entry)
        if committed:
            self._arrival[(topic, partition, offset)] = next(self._sequence)
        return entry

    # -- input -----------------------------------------------------------------------------------

    def pipe(self, topic: str, key, value, *, timestamp: int | None = None, headers=(), partition: int | None = None) -> None:
        """Produce one record to ``topic`` (serialized with the formats the
        app reads it with) and process everything it leads to."""
        self._produce_input(topic, key, value, timestamp, headers, partition)
        self._run()

    def pipe_bytes(self, topic: str, key: bytes | None, value: bytes | None, *, timestamp: int | None = None, headers=(), partition: int | None = None) -> None:
        """Produce one record as raw bytes (to test what bad input does)."""
        self._produce_input(topic, key, value, timestamp, headers, partition, raw=True)
        self._run()

    def pipe_together(self, records: Iterable) -> None:
        """Produce several records, to any topics, before processing any of
        them, as if the runner's consumer had fetched them in one poll:
        each is ``(topic, key, value)`` or ``(topic, key, value, timestamp)``.
        Co-partitioned inputs (a table and a stream joined with it) are then
        processed in timestamp order, whatever order they came in."""
        for record in records:
            topic, key, value, *rest = record
            self._produce_input(topic, key, value, rest[0] if rest else None, (), None)
        self._run()

    def _produce_input(self, topic: str, key, value, timestamp, headers, partition, *, raw: bool = False) -> None:
        self._check_source(topic)
        if not raw:
            key_serde, value_serde = self.formats_in.get(topic, (BYTES, BYTES))
            key, value = key_serde.serialize(key), value_serde.serialize(value)
        stamp = self.wall_clock_ms if timestamp is None else int(timestamp)
        entry = self._append(topic, key, value, headers, stamp, partition, None, committed=True)
        if topic in self.task.globals:  # read at once, outside any transaction, as the runner reads it between polls
            self.task.globals[topic].apply(entry.raw)

    def _check_source(self, topic: str) -> None:
        if topic not in self.task.by_topic and topic not in self.task.globals:
            raise ValueError(f"no processor of the app reads {topic!r} (it reads {', '.join(sorted(set(self.task.by_topic) | set(self.task.globals)))})")

    def pipe_many(self, topic: str, records: Iterable) -> None:
        """``pipe`` each of ``records``: (key, value) or (key, value, timestamp)."""
        for record in records:
            key, value, *rest = record
            self.pipe(topic, key, value, timestamp=rest[0] if rest else None)

    # -- processing ------------------------------------------------------------------------------

    def _next_record(self) -> ConsumerRecord | None:
        """The next record to process among the readable ones: the one that
        became readable first, except that the heads of co-partitioned inputs
        (one task, ``streaming.picking``) go in timestamp order among
        themselves, as the runner's picker takes what it has buffered."""
        by_task: dict = {}
        for topic in self.task.by_topic:
            group = self._group_of.get(topic)
            for partition, entries in enumerate(self._log(topic)):
                offset = self.position.get((topic, partition), 0)
                while offset < len(entries) and entries[offset].aborted:
                    offset = self.position[(topic, partition)] = offset + 1
                if offset < len(entries) and entries[offset].committed:
                    raw = entries[offset].raw
                    task = (topic, partition) if group is None else (group, partition)
                    best = by_task.get(task)
                    if best is None or order_key(raw, self._rank, self.task.order_time) < order_key(best, self._rank, self.task.order_time):
                        by_task[task] = raw
        if not by_task:
            return None
        return min(by_task.values(), key=lambda raw: self._arrival[(raw.topic, raw.partition, raw.offset)])

    def _run(self) -> None:
        while (raw := self._next_record()) is not None:
            self._process(raw)
            if self.commit_every is not None and self.open_records >= self.commit_every:
                self.commit()

    def _process(self, raw: ConsumerRecord) -> None:
        try:
            outputs = self.task.process(raw)
        except ProcessingError:
            self._abort()
            raise
        self._produce(outputs)
        where = (raw.topic, raw.partition)
        self.position[where] = self.open_offsets[where] = raw.offset + 1
        self.open_records += 1
        self.app.metrics.add("records_in")

    def _produce(self, outputs: list) -> None:
        """What the processors (or timers) emitted, into the open transaction."""
        for topic, key, value, headers, timestamp, processor in outputs:
            formats = (processor.sink_key_serde, processor.sink_value_serde) if processor is not None else None
            self.open_outputs.append(self._append(topic, key, value, headers, timestamp, None, formats, committed=False))

    def _shard(self, name: str, partition: int) -> Store:
        store = self.shards.get((name, partition))
        if store is None:
            store = self.shards[(name, partition)] = self._restored(name, partition)
        return store

    def _restored(self, name: str, partition: int) -> Store:
        changelog = self.changelogs.get((name, partition), {})
        return Store(name, partition, dict(changelog), len(changelog))

    # -- transactions ----------------------------------------------------------------------------

    def commit(self) -> None:
        """Commit the open transaction (outputs, store changes, positions),
        then process what its outputs made readable."""
        if not self.open_records and not self.open_outputs and not self.task.dirty:
            return
        for store in self.task.take_dirty():
            changes = store.take_pending()
            changelog = self.changelogs.setdefault((store.name, store.partition), {})
            for key, value in changes.items():
                if value is None:
                    changelog.pop(key, None)
                else:
                    changelog[key] = value
            store.apply_committed(changes, store.next_offset + len(changes))
        for entry in self.open_outputs:
            entry.committed = True
            self._arrival[(entry.raw.topic, entry.raw.partition, entry.raw.offset)] = next(self._sequence)
        metrics = self.app.metrics
        metrics.add("commits")
        metrics.add("records_out", len(self.open_outputs))
        for name, n in self.task.counts.items():
            metrics.add(name, n)
        self.committed.update(self.open_offsets)
        self._forget()
        self._run()

    def _forget(self) -> None:
        self.open_offsets = {}
        self.open_outputs = []
        self.open_records = 0
        self.task.forget()

    def _abort(self) -> None:
        """Drop the open transaction: its outputs, its store writes, its positions."""
        for store in self.task.take_dirty():
            store.discard_pending()
        for store in self.shards.values():
            store.discard_pending()
        for entry in self.open_outputs:
            entry.aborted = True
        for where in self.open_offsets:
            self.position[where] = self.committed.get(where, 0)
        self._forget()

    def crash(self) -> None:
        """Lose everything not committed, rebuild every store from its
        changelog, and read every partition again from its last commit."""
        self._abort()
        self.shards = {}
        self.position = dict(self.committed)
        for topic, copy in self.task.globals.items():  # read again from the start, as a restarted runner does
            copy.contents.clear()
            for entries in self.logs.get(topic, []):
                for entry in entries:
                    copy.apply(entry.raw)
        self.task._first_wall_clock_fire.clear()
        self.task.wall_clock_due(self.wall_clock_ms, self._held)
        self._run()

    # -- output ----------------------------------------------------------------------------------

    def _unread(self, topic: str) -> list[_Entry]:
        if topic not in self.logs:
            return []
        found = []
        for partition, entries in enumerate(self.logs[topic]):
            start = self.read_from.get((topic, partition), 0)
            end = start
            while end < len(entries) and (entries[end].committed or entries[end].aborted):
                end += 1  # up to the first record of an open transaction (read_committed)
            found += [entry for entry in entries[start:end] if entry.committed]
            self.read_from[(topic, partition)] = end
        found.sort(key=lambda entry: self._arrival[(entry.raw.topic, entry.raw.partition, entry.raw.offset)])
        return found

    def read_records(self, topic: str) -> list[TestRecord]:
        """The committed records of ``topic`` not read before, in the order
        they were committed, deserialized with their writer's formats."""
        records = []
        for entry in self._unread(topic):
            key_serde, value_serde = entry.formats or self.formats_out.get(topic, (BYTES, BYTES))
            raw = entry.raw
            records.append(TestRecord(key_serde.deserialize(raw.key), value_serde.deserialize(raw.value), raw.timestamp, raw.headers, raw.partition, raw.offset))
        return records

    def read(self, topic: str) -> list[tuple[Any, Any]]:
        """``(key, value)`` of each committed record of ``topic`` not read before."""
        return [(record.key, record.value) for record in self.read_records(topic)]

    def dead_letters(self) -> list[DeadLetter]:
        """The records sent to the dead-letter topic and not read before."""
        letters = []
        for entry in self._unread(self.app.dead_letter_topic):
            raw = entry.raw
            headers = {name: value.decode("utf-8", "replace") for name, value in raw.headers if name.startswith("onceflow.")}
            letters.append(DeadLetter(
                raw.key, raw.value, headers["onceflow.error"], headers["onceflow.error.stage"], headers["onceflow.processor"],
                headers["onceflow.source.topic"], int(headers["onceflow.source.partition"]), int(headers["onceflow.source.offset"]), raw.timestamp,
            ))
        return letters

    def store(self, name: str, partition: int | None = None) -> dict:
        """The contents of store ``name`` (every partition's, or one's) as
        the processors see them now, pending writes included."""
        known = {store for processor in self.app.processors for store in processor.stores}
        if name not in known:
            raise KeyError(f"the app has no store {name!r} (it has {', '.join(sorted(known)) or 'none'})")
        partitions = {p for (store, p) in set(self.shards) | set(self.changelogs) if store == name}
        contents: dict = {}
        for p in sorted(partitions):
            if partition is None or p == partition:
                contents.update(self._shard(name, p).items())
        return contents

    def changelog(self, name: str, partition: int = 0) -> dict:
        """The committed contents of store ``name``'s changelog partition (compacted)."""
        return {decode_key(key): decode_value(value) for key, value in sorted(self.changelogs.get((name, partition), {}).items())}

    # -- time ------------------------------------------------------------------------------------

    def advance_wall_clock(self, duration) -> None:
        """Move the driver's wall clock on by ``duration`` (ms or timedelta)."""
        self.wall_clock_ms += milliseconds(duration, "the wall clock's step (it only moves forward)")
        self.fire_wall_clock_timers()

    def fire_wall_clock_timers(self) -> None:
        """Fire the wall-clock timers due at the driver's clock on every
        partition (``advance_wall_clock`` does), then commit unless
        ``commit_every=None``."""
        due = self.task.wall_clock_due(self.wall_clock_ms, self._held)
        if not due:
            return
        try:
            outputs = self.task.fire_due(due)
        except ProcessingError:
            self._abort()
            raise
        self._produce(outputs)
        if self.commit_every is not None:
            self.commit()
