"""The dataflow layer: chains of ``filter``/``map``/``flat_map``/``key_by``,
aggregations and event-time windows, compiled down to ordinary processors
of the runner (``app.processor``), so they share its one exactly-once
runtime: state in changelogged stores, output, store changes and input
offsets committed in one transaction.

    import streaming
    from datetime import timedelta

    from streaming.windows import tumbling

    app = streaming.App(bootstrap_servers="127.0.0.1:9092", application_id="words", state_dir="./state")
    (app.stream("lines", value_format="str")
        .flat_map(str.split)                      # one record per word, key unchanged
        .key_by(lambda word: word)                # the word becomes the key (repartitioned, see below)
        .window(tumbling(timedelta(minutes=1)), grace=timedelta(seconds=10))   # records up to 10 s late are counted
        .count()
        .to("word-counts", key_format="str", value_format="json"))
    app.run()

What the functions get and return (one rule for every step): a function
gets the record's **value** and returns

| step | returns | the record goes on with |
| --- | --- | --- |
| ``filter(f)`` | truthy to keep it | the same key, value and timestamp |
| ``map(f)`` | the new value | the same key and timestamp |
| ``flat_map(f)`` | an iterable of new values | one record per value, same key and timestamp |
| ``key_by(f)`` | the new key | the same value and timestamp |
| ``peek(f)`` | anything (ignored; ``print()`` prints) | unchanged (``f`` runs again for a record redone after an abort) |

Pass ``with_key=True`` and the function gets ``(key, value)`` instead:

    payments.map(lambda payment: payment["amount"])                               # value -> value
    payments.map(lambda account, payment: {**payment, "account": account}, with_key=True)
    payments.key_by(lambda payment: payment["region"])                            # value -> key

Only ``key_by`` changes keys, and timestamps (event time) are never
changed, so windows downstream see the time the event happened: the
record's CreateTime, or what ``app.stream(..., timestamp_extractor=fn)``
takes from its payload (``fn(record) -> ms``). Headers
of a source record go on with it through the stateless steps.

Aggregations are per key and turn the stream into the stream of the
aggregate's changes (key, new aggregate), like a Kafka Streams KTable's
changelog: ``aggregate(initial, add)`` with ``add(aggregate, value) ->
aggregate`` (``initial`` a JSON value or a function making one),
``count()``, ``reduce(f)`` (``f(aggregate, value)``, the first value is the
aggregate). Aggregates live in a state store (``store=`` names it; the
default name is ``{processor}-{kind}-{n}``, n counting the chain's
stateful steps: name your stores if the chain may change) and must be JSON
values. A record whose key is ``None`` cannot be aggregated: that is an
error (routed by the app's ``on_error``), never a silent skip.

Windows (``streaming.windows``): ``.window(tumbling(size) | hopping(size,
advance) | session(gap) | sliding(difference), grace=0, emit="close" |
"update", on_late=None)`` then ``aggregate``/``count``/``reduce``; every
duration is a ``timedelta`` or milliseconds. Session windows merge a key's
sessions that a record bridges (``aggregate`` then needs ``merge=fn(earlier,
later)``; ``count`` adds, ``reduce`` combines), and a session ``[start,
end]`` (``end`` its last record's time) closes at ``end + gap + grace``.
Sliding windows are Kafka Streams' ``SlidingWindows``: ``[t - difference,
t]`` for each record ``t``, and ``[t + 1, t + 1 + difference]`` once a
record falls there (both ends inclusive), closing when stream time passes
``end + grace``. Each result is a record with the key and the value
``{"start": ms, "end": ms, "value": aggregate}``, stamped with the highest
event time among the window's records. ``emit="close"`` (the default)
emits each window once, when stream time (the highest event time seen on
the input partition, kept in the store) reaches its end + grace;
``emit="update"`` emits on every change instead (the last one is the
final value) and nothing at close. Records later than their window's end +
grace are dropped and counted in the ``late_records_dropped`` metric
(once per record, even when a hopping record missed several windows), and
with ``on_late`` sent to a side topic (``on_late="late-clicks"``: key and
value as they came, in the sink's formats, in the same transaction) or
handed to ``on_late(key, value, timestamp)``. A
partition that stops receiving records stops its stream time too: its last
windows close when a later record arrives, as in Kafka Streams, unless the
window says ``close_when_idle=duration``: then a partition without records
for that long (by the wall clock) takes the wall clock for its stream time,
and the windows it has passed the end + grace of close and are emitted.

Joins with a table (``streaming.tables``): ``join(table, joiner)`` keeps
the records whose key ``app.table(topic)`` holds, with the value
``joiner(value, table_value)``; ``left_join`` keeps every record
(``table_value`` None on a miss); the key and timestamp stay the stream's.
The table's topic and the stream are co-partitioned and met in timestamp
order (``streaming.picking``); a re-keyed stream is repartitioned before
the join, its key written in the table's key format. An
``app.global_table(topic)`` is looked up by the key or by ``on(value)``.
``join(other_stream, joiner, within=...)`` (and ``left_join``) pairs the
records of two co-partitioned streams of one key at most ``within`` apart
(``streaming.stream_join``); both topics feed one processor, which reads
them as bytes and deserializes each with its own stream's formats.

Keys and partitions. State is per input partition (a store per partition,
changelogged like it), so an aggregation is correct only if all records of
a key arrive on one partition. A source topic is taken to be partitioned by
its key, as Kafka producers do by default. When ``key_by`` changes the key
before an aggregation, the chain is cut there, as Kafka Streams does: the
first processor writes the re-keyed records to an internal repartition
topic ``{application_id}-{name}-repartition-{n}`` (as many partitions as
the source, partitioned by the new key), and a second processor of the same
app reads it and aggregates. Both run in the app's one transactional
runner, so the hop is exactly once as well (the repartition records and
the offsets of the source commit together; the second processor reads them
read_committed and commits its own offsets with its output). So each
``.to()`` registers one processor, or one per repartition in its chain.
The repartition topics are listed in ``app.internal_topics`` and created
(partitioned like the source) when the app starts to run.
Keys and values crossing a repartition topic keep their Python types (str,
bytes, int, float, bool, None, tuples, lists, dicts with str keys).
"""

from __future__ import annotations

import builtins
import copy
import sys
from typing import Any, Callable

import attrs

from streaming.app import legal_topic_name
from streaming.durations import milliseconds
from streaming.serde import INTERNAL_FORMAT, resolve
from streaming.stream_join import LEFT, RIGHT, WindowedJoin
from streaming.tables import Table
from streaming.windows import FIRST_VALUE, NEXT_CLOSE, SessionAggregation, SessionWindows, SlidingAggregation, SlidingWindows, WindowedAggregation, Windows

EMIT_MODES = ("close", "update")
LATE_METRIC = "late_records_dropped"
IDLE_TIMER = "close-idle-windows"  # the wall-clock timer of close_when_idle
_MISSING = object()

# A compiled step: (ctx, key, value, timestamp, headers) -> None, calling the next step.
Next = Callable[[Any, Any, Any, int, Any], None]


# -- steps ------------------------------------------------------------------------------------


def _call(fn, with_key: bool):
    """fn as a function of (key, value)."""
    if with_key:
        return fn
    return lambda _key, value: fn(value)


@attrs.frozen
class Filter:
    fn: Callable
    with_key: bool = False

    def compile(self, downstream: Next, store: str | None) -> Next:
        keep = _call(self.fn, self.with_key)

        def step(ctx, key, value, timestamp, headers):
            if keep(key, value):
                downstream(ctx, key, value, timestamp, headers)

        return step


@attrs.frozen
class Map:
    fn: Callable
    with_key: bool = False

    def compile(self, downstream: Next, store: str | None) -> Next:
        change = _call(self.fn, self.with_key)

        def step(ctx, key, value, timestamp, headers):
            downstream(ctx, key, change(key, value), timestamp, headers)

        return step


@attrs.frozen
class FlatMap:
    fn: Callable
    with_key: bool = False

    def compile(self, downstream: Next, store: str | None) -> Next:
        expand = _call(self.fn, self.with_key)

        def step(ctx, key, value, timestamp, headers):
            for item in expand(key, value):
                downstream(ctx, key, item, timestamp, headers)

        return step


@attrs.frozen
class Peek:
    """Hands each record to ``fn`` and passes it on unchanged: debugging,
    logging. ``fn``'s own effects are not in the transaction: a record
    redone after an abort is peeked again."""

    fn: Callable
    with_key: bool = False

    def compile(self, downstream: Next, store: str | None) -> Next:
        look = _call(self.fn, self.with_key)

        def step(ctx, key, value, timestamp, headers):
            look(key, value)
            downstream(ctx, key, value, timestamp, headers)

        return step


@attrs.frozen
class KeyBy:
    fn: Callable
    with_key: bool = False

    def compile(self, downstream: Next, store: str | None) -> Next:
        new_key = _call(self.fn, self.with_key)

        def step(ctx, key, value, timestamp, headers):
            downstream(ctx, new_key(key, value), value, timestamp, headers)

        return step


def _initial_factory(initial) -> Callable[[], Any]:
    if callable(initial):
        return initial
    return lambda: copy.deepcopy(initial)


def _require_key(key, kind: str) -> None:
    if key is None:
        raise ValueError(f"{kind}: a record with a None key cannot be aggregated (give it a key with key_by)")


@attrs.frozen
class Aggregate:
    """Per-key running aggregate; ``initial`` is FIRST_VALUE for a reduce."""

    kind: str  # aggregate, count, reduce: names the default store
    add: Callable[[Any, Any], Any]
    initial: Any = FIRST_VALUE
    store: str | None = None
    stateful = True

    def compile(self, downstream: Next, store: str) -> Next:
        add, kind = self.add, self.kind
        first = self.initial is FIRST_VALUE
        initial = None if first else _initial_factory(self.initial)

        def step(ctx, key, value, timestamp, headers):
            _require_key(key, kind)
            state = ctx.store(store)
            current = state.get(key, _MISSING)
            if current is _MISSING:
                aggregate = value if first else add(initial(), value)
            else:
                aggregate = add(current, value)
            state.put(key, aggregate)
            downstream(ctx, key, aggregate, timestamp, None)

        return step


@attrs.frozen
class WindowedAggregate:
    kind: str
    windows: Windows | SessionWindows | SlidingWindows
    grace_ms: int
    emit: str
    add: Callable[[Any, Any], Any]
    initial: Any = FIRST_VALUE
    store: str | None = None
    merge: Callable[[Any, Any], Any] | None = None  # session windows: two sessions' aggregates into one
    on_late: Any = None  # a topic name, or fn(key, value, timestamp), for records later than grace
    close_when_idle_ms: int | None = None  # a partition this long without a record has the wall clock for stream time
    stateful = True

    def aggregation(self) -> WindowedAggregation | SessionAggregation | SlidingAggregation:
        initial = FIRST_VALUE if self.initial is FIRST_VALUE else _initial_factory(self.initial)
        if isinstance(self.windows, SessionWindows):
            return SessionAggregation(self.windows, self.grace_ms, self.add, self.merge, initial)
        if isinstance(self.windows, SlidingWindows):
            return SlidingAggregation(self.windows, self.grace_ms, self.add, initial)
        return WindowedAggregation(self.windows, self.grace_ms, self.add, initial)

    def compile(self, downstream: Next, store: str) -> Next:
        aggregation, kind, on_update, on_late = self.aggregation(), self.kind, self.emit == "update", self.on_late

        def step(ctx, key, value, timestamp, headers):
            _require_key(key, kind)
            update = aggregation.update(ctx.store(store), key, value, timestamp)
            if update.late:
                ctx.count(LATE_METRIC)
                if isinstance(on_late, str):
                    ctx.emit(key, value, topic=on_late, timestamp=timestamp, headers=headers)
                elif on_late is not None:
                    on_late(key, value, timestamp)
            if on_update:
                for result in update.changed:
                    downstream(ctx, result.key, result.as_value(), result.timestamp, None)

        return step

    def observer(self, downstream: Next, store: str) -> Callable[[Any, int], None]:
        """Advance stream time with every input record, before it flows, and
        emit (emit="close") the windows that closes."""
        aggregation, on_close = self.aggregation(), self.emit == "close"

        def observe(ctx, timestamp):
            for result in aggregation.advance(ctx.store(store), timestamp):
                if on_close:
                    downstream(ctx, result.key, result.as_value(), result.timestamp, None)

        return observe


@attrs.frozen
class TableJoin:
    """A stream-table join (``left``: a left join): the record's value and
    the table's value for its key (or for ``on(value)``, a global table)
    through ``joiner``; the key and timestamp stay the stream's."""

    table: Table
    joiner: Callable[[Any, Any], Any]
    left: bool
    on: Callable[[Any], Any] | None = None
    kind = "join"

    @property
    def stateful(self) -> bool:
        # A table's store is per partition, so a re-keyed stream is
        # repartitioned before it (as before an aggregation); a global table is whole everywhere.
        return not self.table.is_global

    @property
    def store(self) -> str | None:
        return None if self.table.is_global else self.table.store

    def compile(self, downstream: Next, store: str | None) -> Next:
        joiner, left, on, topic = self.joiner, self.left, self.on, self.table.topic
        if self.table.is_global:
            def step(ctx, key, value, timestamp, headers):
                lookup = key if on is None else on(value)
                found = None if lookup is None else ctx.global_table(topic).get(lookup)
                if found is not None or left:
                    downstream(ctx, key, joiner(value, found), timestamp, headers)
        else:
            def step(ctx, key, value, timestamp, headers):
                found = None if key is None else ctx.store(store).get(key)
                if found is not None or left:
                    downstream(ctx, key, joiner(value, found), timestamp, headers)

        return step


@attrs.frozen
class StreamJoin:
    """A windowed join with another stream (``streaming.stream_join``): this
    step takes the chain's (left) records; the other stream's records come
    in through ``compile_other``, in the same processor."""

    other: Any  # the other Stream (its topic, formats and stateless steps)
    joiner: Callable[[Any, Any], Any]
    within_ms: int
    grace_ms: int
    left: bool
    store: str | None = None
    kind = "join"
    stateful = True

    def windowed_join(self) -> WindowedJoin:
        return WindowedJoin(self.within_ms, self.grace_ms, self.joiner, self.left)

    def compile(self, downstream: Next, store: str) -> Next:
        return self._side(LEFT, downstream, store)

    def compile_other(self, downstream: Next, store: str) -> Next:
        return self._side(RIGHT, downstream, store)

    def _side(self, side: str, downstream: Next, store: str) -> Next:
        join = self.windowed_join()

        def step(ctx, key, value, timestamp, headers):
            pairs, late = join.add(ctx.store(store), side, key, value, timestamp, ctx.offset)
            if late:
                ctx.count(LATE_METRIC)
            for result_key, result, result_timestamp in pairs:
                downstream(ctx, result_key, result, result_timestamp, None)

        return step

    def observer(self, downstream: Next, store: str) -> Callable[[Any, int], None]:
        """Advance stream time with every record of either stream, and emit
        the left join's records that expire unmatched."""
        join = self.windowed_join()

        def observe(ctx, timestamp):
            for key, result, result_timestamp in join.advance(ctx.store(store), timestamp):
                downstream(ctx, key, result, result_timestamp, None)

        return observe


# -- the chain ------------------------------------------------------------------------------------


def _emit_to_sink(ctx, key, value, timestamp, headers):
    ctx.emit(key, value, timestamp=timestamp, headers=headers)


@attrs.frozen
class Segment:
    """One processor of a compiled chain."""

    name: str
    source: str
    sink: str
    steps: tuple
    stores: tuple[str, ...]
    key_format: Any
    value_format: Any
    sink_key_format: Any
    sink_value_format: Any
    timestamp_extractor: Callable | None = None
    # A stream-stream join's other stream: its topic, formats and stateless
    # steps. The processor then reads both topics as bytes and deserializes
    # each with its own stream's formats.
    other_source: str | None = None
    other_steps: tuple = ()
    other_formats: tuple = ()

    def build(self) -> tuple[Callable, Callable | None]:
        """The processor ``fn(record, ctx)``, and the wall-clock timer
        ``fn(ctx)`` that closes the windows of an idle partition (None
        unless a window step asks for it: ``close_when_idle``)."""
        downstream: Next = _emit_to_sink
        observers, idle_observers = [], []
        other_head = None
        store_of = dict(zip([i for i, s in enumerate(self.steps) if getattr(s, "stateful", False)], self.stores))
        for index in range(len(self.steps) - 1, -1, -1):
            step = self.steps[index]
            if isinstance(step, (WindowedAggregate, StreamJoin)):
                observers.append(step.observer(downstream, store_of[index]))
                if getattr(step, "close_when_idle_ms", None) is not None:
                    idle_observers.append((observers[-1], store_of[index]))
            if isinstance(step, StreamJoin):
                other_head = step.compile_other(downstream, store_of[index])
                for other_step in reversed(self.other_steps):
                    other_head = other_step.compile(other_head, None)
            downstream = step.compile(downstream, store_of.get(index))
        head = downstream
        observers.reverse()  # upstream windows close (and flow down) first
        idle_observers.reverse()
        # Whether a partition had a record since the idle check before (in
        # memory: after a restart every partition starts as busy).
        busy: dict[int, bool] = {}

        if other_head is not None:
            other_source = self.other_source
            this_key, this_value = resolve(self.key_format), resolve(self.value_format)
            other_key, other_value = (resolve(fmt) for fmt in self.other_formats)

            def process(record, ctx):
                if idle_observers:
                    busy[ctx.partition] = True
                for observe in observers:
                    observe(ctx, record.timestamp)
                if record.topic == other_source:
                    other_head(ctx, other_key.deserialize(record.key), other_value.deserialize(record.value), record.timestamp, record.headers)
                else:
                    head(ctx, this_key.deserialize(record.key), this_value.deserialize(record.value), record.timestamp, record.headers)
        elif not observers:
            def process(record, ctx):
                head(ctx, record.key, record.value, record.timestamp, record.headers)
        else:
            def process(record, ctx):
                if idle_observers:
                    busy[ctx.partition] = True
                for observe in observers:
                    observe(ctx, record.timestamp)
                head(ctx, record.key, record.value, record.timestamp, record.headers)

        def close_idle_windows(ctx):
            if busy.get(ctx.partition, True):
                busy[ctx.partition] = False
                return
            for observe, store in idle_observers:
                # The wall clock stands in for stream time, when that closes
                # a window (else nothing is written: an idle app stays quiet).
                next_close = ctx.store(store).get(NEXT_CLOSE)
                if next_close is not None and next_close <= ctx.timestamp:
                    observe(ctx, ctx.timestamp)

        process.__name__ = process.__qualname__ = self.name.replace("-", "_")
        return process, (close_idle_windows if idle_observers else None)

    def idle_check_ms(self) -> int | None:
        """How often the idle check runs: the shortest ``close_when_idle`` of the segment's windows."""
        idles = [step.close_when_idle_ms for step in self.steps if isinstance(step, WindowedAggregate) and step.close_when_idle_ms is not None]
        return min(idles) if idles else None


@attrs.frozen
class Stream:
    """A stream of records from ``topic``; every step returns a new Stream,
    so one stream can branch into several chains (each its own ``.to()``)."""

    app: Any
    topic: str
    key_format: Any = "bytes"
    value_format: Any = "bytes"
    steps: tuple = ()
    timestamp_extractor: Callable | None = None  # event time from the source records' payload

    def _then(self, step) -> "Stream":
        return attrs.evolve(self, steps=self.steps + (step,))

    def filter(self, keep: Callable, *, with_key: bool = False) -> "Stream":
        return self._then(Filter(keep, with_key))

    def map(self, change: Callable, *, with_key: bool = False) -> "Stream":
        return self._then(Map(change, with_key))

    def flat_map(self, expand: Callable, *, with_key: bool = False) -> "Stream":
        return self._then(FlatMap(expand, with_key))

    def key_by(self, new_key: Callable, *, with_key: bool = False) -> "Stream":
        return self._then(KeyBy(new_key, with_key))

    def peek(self, look: Callable, *, with_key: bool = False) -> "Stream":
        """Call ``look`` on each record (its value, or key and value), and go
        on with the record unchanged. Not exactly once: a record redone
        after an abort is looked at again."""
        return self._then(Peek(look, with_key))

    def print(self, label: str = "", *, file=None) -> "Stream":
        """Print each record as ``label key: value`` (to ``file``, default
        stdout) and go on with it unchanged: ``peek`` for a quick look."""
        prefix = f"{label} " if label else ""
        return self.peek(lambda key, value: builtins.print(f"{prefix}{key!r}: {value!r}", file=file or sys.stdout, flush=True), with_key=True)

    def aggregate(self, initial, add: Callable, *, store: str | None = None) -> "Stream":
        return self._then(Aggregate("aggregate", add, initial, store))

    def count(self, *, store: str | None = None) -> "Stream":
        return self._then(Aggregate("count", _count_one, 0, store))

    def reduce(self, combine: Callable, *, store: str | None = None) -> "Stream":
        return self._then(Aggregate("reduce", combine, FIRST_VALUE, store))

    def join(self, table, joiner: Callable[[Any, Any], Any], *, on: Callable[[Any], Any] | None = None, within=None, grace=0, store: str | None = None) -> "Stream":
        """With a table: records whose key the table holds go on with the value
        ``joiner(value, table_value)`` (the others are dropped); the key and
        timestamp stay the stream's. ``table`` is an ``app.table`` (co-partitioned
        with this stream, met in timestamp order) or an ``app.global_table``,
        looked up by the record's key or by ``on(value)``. See ``streaming.tables``.

        With another stream (``app.stream(...)``, co-partitioned):
        ``within`` (a timedelta or ms) is required; each pair of records of
        one key at most ``within`` apart goes on as ``joiner(this_value,
        other_value)``, stamped with the later timestamp; ``grace`` is how
        late a record may come. See ``streaming.stream_join``."""
        if isinstance(table, Stream):
            return self._then(_stream_join(self, table, joiner, within, grace, False, store))
        return self._then(_table_join(table, joiner, False, on))

    def left_join(self, table, joiner: Callable[[Any, Any], Any], *, on: Callable[[Any], Any] | None = None, within=None, grace=0, store: str | None = None) -> "Stream":
        """``join``, keeping every record of this stream: ``table_value`` is
        None on a miss (with a stream: once no partner can come any more)."""
        if isinstance(table, Stream):
            return self._then(_stream_join(self, table, joiner, within, grace, True, store))
        return self._then(_table_join(table, joiner, True, on))

    def window(self, windows, *, grace=0, emit: str = "close", on_late=None, close_when_idle=None) -> "WindowedStream":
        """Cut the stream into ``windows``; ``grace`` (a timedelta or
        milliseconds) is how late a record may come after its window's end;
        a later record is counted (``late_records_dropped``) and, with
        ``on_late``, sent to that topic (as it came, with the sink's
        formats) or given to ``on_late(key, value, timestamp)``.

        ``close_when_idle`` (a timedelta or milliseconds; off by default):
        a partition that has had no record for that long (one to two times
        it, by the wall clock) has the wall clock stand in for its stream
        time once that closes a window, so its windows whose end + grace
        the clock has passed close and are emitted, in a transaction like
        the records'. Stream time then is the clock's: a record older than
        it minus grace is late.
        A wall-clock timer of the processor runs the check (its store is
        ``{processor}-timers``)."""
        if not isinstance(windows, (Windows, SessionWindows, SlidingWindows)):
            raise TypeError("window() takes tumbling(size), hopping(size, advance), session(gap) or sliding(difference) from streaming.windows")
        if emit not in EMIT_MODES:
            raise ValueError(f"emit must be one of {', '.join(EMIT_MODES)}, not {emit!r}")
        if on_late is not None and not isinstance(on_late, str) and not callable(on_late):
            raise TypeError(f"on_late is a topic name or a function (key, value, timestamp), not {on_late!r}")
        idle_ms = None if close_when_idle is None else milliseconds(close_when_idle, "close_when_idle", positive=True)
        return WindowedStream(self, windows, milliseconds(grace, "grace"), emit, on_late, idle_ms)

    def segments(self, topic: str, *, key_format=None, value_format=None, name: str | None = None) -> list[Segment]:
        """The processors ``.to(topic)`` registers (see the module's docstring)."""
        base = name or f"{self.topic}-to-{topic}"
        application_id = getattr(self.app, "application_id", "app")
        segments: list[Segment] = []
        source, source_formats = self.topic, (self.key_format, self.value_format)
        current: list = []
        stores: list[str] = []
        rekeyed = False
        stateful_index = 0
        for step in self.steps:
            if getattr(step, "stateful", False) and rekeyed:
                repartition = f"{application_id}-{base}-repartition-{len(segments)}"
                # Before a table join the new key is written as the table's
                # key is, so that equal keys land on equal partitions.
                repartition_key = step.table.key_serde if isinstance(step, TableJoin) else INTERNAL_FORMAT
                segments.append(Segment(f"{base}-{len(segments)}", source, repartition, tuple(current), tuple(stores), *source_formats, repartition_key, INTERNAL_FORMAT))
                source, source_formats = repartition, (repartition_key, INTERNAL_FORMAT)
                current, stores, rekeyed = [], [], False
            if isinstance(step, StreamJoin) and (rekeyed or segments):
                raise ValueError("a stream-stream join after key_by is not supported yet: join the streams first, or re-key both with their own .to() before joining")
            if isinstance(step, KeyBy):
                rekeyed = True
            if getattr(step, "stateful", False):
                stores.append(step.store or f"{base}-{step.kind}-{stateful_index}")
                stateful_index += 1
            current.append(step)
        # Keys keep the source's format (one key, one byte string, one
        # partition); values are written as they need ("auto").
        sink_formats = (key_format if key_format is not None else self.key_format, value_format if value_format is not None else "auto")
        last_name = base if not segments else f"{base}-{len(segments)}"
        segments.append(Segment(last_name, source, topic, tuple(current), tuple(stores), *source_formats, *sink_formats))
        segments = [_with_other_stream(segment) for segment in segments]
        if self.timestamp_extractor is not None:
            # Event time is taken once, from the source records; downstream
            # segments read records already stamped with it.
            segments[0] = attrs.evolve(segments[0], timestamp_extractor=self.timestamp_extractor)
        return segments

    def to(self, topic: str, *, key_format=None, value_format=None, name: str | None = None) -> "Stream":
        """Register the chain's processor(s) with the app, writing to
        ``topic`` (the key format defaults to the source's, the value format
        to ``"auto"``: bytes, text, else JSON, as the values need); returns this stream, so a chain can go on (each
        further ``.to()`` registers processors of their own, reading the
        source again). ``processor_names(topic)`` names what was registered."""
        segments = self.segments(topic, key_format=key_format, value_format=value_format, name=name)
        for upstream, downstream in zip(segments, segments[1:]):
            declare_internal_topic(self.app, upstream.sink, like=self.topic)
        late_topics = tuple(step.on_late for step in self.steps if isinstance(step, WindowedAggregate) and isinstance(step.on_late, str))
        for topic in late_topics:
            self.app.sink_topics.setdefault(topic, self.topic)
        for segment in segments:
            joined = segment.other_source is not None  # reads two topics as bytes, deserializes each as its stream says
            if joined:
                self.app.declared_formats.setdefault(segment.source, (resolve(segment.key_format), resolve(segment.value_format)))
                self.app.declared_formats.setdefault(segment.other_source, tuple(map(resolve, segment.other_formats)))
            process, close_idle_windows = segment.build()
            self.app.processor(
                source=[segment.source, segment.other_source] if joined else segment.source, sink=segment.sink, stores=list(segment.stores),
                key_format="bytes" if joined else segment.key_format, value_format="bytes" if joined else segment.value_format,
                sink_key_format=segment.sink_key_format, sink_value_format=segment.sink_value_format,
                name=segment.name, **({"timestamp_extractor": segment.timestamp_extractor} if segment.timestamp_extractor is not None else {}),
                outputs=late_topics,
            )(process)
            if close_idle_windows is not None:
                self.app.schedule(segment.name, every=segment.idle_check_ms(), kind="wall_clock", name=IDLE_TIMER)(close_idle_windows)
        return self

    def processor_names(self, topic: str, *, name: str | None = None) -> list[str]:
        """The names of the processors ``.to(topic)`` registers (or did)."""
        return [segment.name for segment in self.segments(topic, name=name)]


def _with_other_stream(segment: Segment) -> Segment:
    join = next((step for step in segment.steps if isinstance(step, StreamJoin)), None)
    if join is None:
        return segment
    other = join.other
    return attrs.evolve(segment, other_source=other.topic, other_steps=other.steps, other_formats=(other.key_format, other.value_format))


def _stream_join(this, other, joiner, within, grace, left: bool, store) -> StreamJoin:
    if within is None:
        raise ValueError("a stream-stream join needs within= (a timedelta or ms): how far apart two records' timestamps may be")
    if not callable(joiner):
        raise TypeError(f"a joiner is fn(left_value, right_value) -> value, not {joiner!r}")
    if other.app is not this.app or other.topic == this.topic:
        raise ValueError("a stream joins another stream of the same app, from another topic")
    if any(isinstance(step, KeyBy) or getattr(step, "stateful", False) for step in other.steps) or other.timestamp_extractor is not None:
        raise ValueError("the other stream of a join may only filter, map and flat_map (no key_by, aggregation, join or timestamp_extractor) before it, for now")
    return StreamJoin(other, joiner, milliseconds(within, "within"), milliseconds(grace, "grace"), left, store)


def _table_join(table, joiner, left: bool, on) -> TableJoin:
    if not isinstance(table, Table):
        raise TypeError(f"join() takes a table (app.table(topic) or app.global_table(topic)), not {table!r}")
    if not callable(joiner):
        raise TypeError(f"a joiner is fn(stream_value, table_value) -> value, not {joiner!r}")
    if on is not None and not table.is_global:
        raise ValueError(f"on= looks a global table up by another key; {table.topic!r} is co-partitioned with the stream, so it is looked up by the record's key")
    return TableJoin(table, joiner, left, on)


def declare_internal_topic(app, topic: str, *, like: str) -> None:
    """Note that ``topic`` (a repartition topic) must exist, with as many
    partitions as ``like``, before the app runs: the runner creates what
    ``app.internal_topics`` ({topic: like}) lists when it is missing. A name
    the broker would refuse (too long, a bad character) is refused here."""
    legal_topic_name(topic, f"the repartition topic of a chain from {like!r} (name the chain shorter: .to(..., name=...))")
    app.internal_topics[topic] = like


def _count_one(count, _value):
    return count + 1


@attrs.frozen
class WindowedStream:
    """A stream cut into event-time windows; aggregate it to get a Stream back."""

    stream: Stream
    windows: Windows | SessionWindows | SlidingWindows
    grace_ms: int
    emit: str
    on_late: Any = None
    close_when_idle_ms: int | None = None

    def _aggregate(self, kind: str, add: Callable, initial, store: str | None, merge: Callable | None) -> Stream:
        if isinstance(self.windows, SessionWindows) and merge is None:
            raise ValueError("session windows merge sessions: aggregate(initial, add, merge=fn(earlier, later)) says how")
        return self.stream._then(WindowedAggregate(kind, self.windows, self.grace_ms, self.emit, add, initial, store, merge, self.on_late, self.close_when_idle_ms))

    def aggregate(self, initial, add: Callable, *, store: str | None = None, merge: Callable | None = None) -> Stream:
        """``merge(earlier, later)`` combines two sessions' aggregates (session windows only)."""
        return self._aggregate("aggregate", add, initial, store, merge)

    def count(self, *, store: str | None = None) -> Stream:
        return self._aggregate("count", _count_one, 0, store, _sum)

    def reduce(self, combine: Callable, *, store: str | None = None) -> Stream:
        return self._aggregate("reduce", combine, FIRST_VALUE, store, combine)


def _sum(earlier, later):
    return earlier + later
