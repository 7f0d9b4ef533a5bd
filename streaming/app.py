"""The processor API: ``App``, the ``@app.processor`` decorator, the ``Record``
a processor receives and the context (``ctx``) it acts through.

    app = streaming.App(bootstrap_servers="127.0.0.1:9092", application_id="balances", state_dir="./state")

    @app.processor(source="payments", sink="balances", stores=["balances"], key_format="str", value_format="json")
    def running_balance(record, ctx):
        store = ctx.store("balances")
        balance = store.get(record.key, 0) + record.value["amount"]
        store.put(record.key, balance)
        ctx.emit(record.key, {"account": record.key, "balance": balance})

    app.run()

This module holds the user-facing objects and the settings; ``streaming.runner``
runs them (one consumer-group member and one transactional producer per
``App`` instance), ``streaming.testing.TestDriver`` runs them without a
broker, both through ``streaming.task``. The processor is a plain function:
it must not block on I/O of its own, and it cannot await (its stores answer
from memory).

Internal topics (changelogs, repartition and dead-letter topics) are created
by the runner with ``replication_factor`` (-1: the broker's
``default.replication.factor``) and, when given, ``min_insync_replicas`` as
their ``min.insync.replicas``: on a Kafka cluster a store's changelog is its
only durable copy, so it wants the replication of the app's own outputs.
Sink topics missing at start are created the same way (``streaming.topics``
has the whole table, and the checks of topics already there), and the
repartition topics are purged up to the committed offsets every
``repartition_purge_interval_ms``.

Tables and joins (``app.table``, ``app.global_table``, ``stream.join``)
are in ``streaming.tables``; ``max_task_idle_ms`` (a timedelta or ms,
default 100) bounds how long co-partitioned inputs wait for each other to
be met in timestamp order (``streaming.picking``).

Where it runs: ``bootstrap_servers`` and ``state_dir``, when not given,
come from ``ONCEFLOW_BOOTSTRAP_SERVERS`` and ``ONCEFLOW_STATE_DIR`` (so one
app module runs against any cluster and on any disk, under ``onceflow run``
or a container's environment), else ``127.0.0.1:9092`` and
``./state/{application_id}``; ``onceflow run --bootstrap-servers ...
--state-dir ...`` overrides both (``App.place``).

Identity: ``instance_id`` is the one given, else the environment's
``ONCEFLOW_INSTANCE_ID`` (what an orchestrator hands each replica: a
StatefulSet's pod name), else generated once and kept in
``state_dir/instance-id``. A restarted process keeps its transactional id
(``{application_id}-{instance_id}``, which fences its own previous
incarnation) and its static group membership (``group.instance.id``, the
same string), while processes with their own state directories never clash.
Only an id from outside the state directory survives the loss of that
directory: an instance back on an empty disk under the same id takes its
old place in the group at once (KIP-345) and restores its stores from their
changelogs, where one with a new id waits, and makes the group wait, until
the old place's session times out. A lock file keeps two processes off one
state directory.
"""

from __future__ import annotations

import fcntl
import os
import threading
import uuid
from typing import Any, Callable

import attrs

from protocol.names import InvalidTopicError, validate_topic_name
from streaming.durations import milliseconds
from streaming.errors import StateDirInUseError
from streaming.serde import Serde, resolve
from streaming.store import Store, StoreError
from streaming.tables import Table, make_table, materializer
from txn.config import CommonConfig, ConsumerConfig, ProducerConfig
from txn.errors import ConfigError
from txn.security import is_security_option

ON_ERROR = ("stop", "dead-letter")
BOOTSTRAP_SERVERS_VARIABLE = "ONCEFLOW_BOOTSTRAP_SERVERS"
STATE_DIR_VARIABLE = "ONCEFLOW_STATE_DIR"
DEFAULT_BOOTSTRAP_SERVERS = "127.0.0.1:9092"
INSTANCE_ID_VARIABLE = "ONCEFLOW_INSTANCE_ID"  # an identity given from outside the state directory
RUNNER_OWNED_OPTIONS = {"group_id", "group_instance_id", "transactional_id", "isolation_level", "enable_auto_commit", "enable_idempotence", "bootstrap_servers"}


@attrs.frozen
class Record:
    """One input record as a processor sees it (key and value deserialized)."""

    key: Any
    value: Any
    topic: str
    partition: int
    offset: int
    timestamp: int  # milliseconds, the record's CreateTime
    headers: tuple = ()  # ((str, bytes), ...)


@attrs.frozen
class Processor:
    name: str
    function: Callable
    sources: tuple[str, ...]
    sink: str | None
    stores: tuple[str, ...]
    key_serde: Serde
    value_serde: Serde
    sink_key_serde: Serde
    sink_value_serde: Serde
    # fn(record) -> event time in ms, in place of the record's CreateTime.
    timestamp_extractor: Callable[[Record], int] | None = None
    # Topics it may write with ctx.emit(topic=...) besides its sink, each
    # with the partition count it must have (None: any; created with its
    # sources' when missing).
    outputs: tuple[tuple[str, int | None], ...] = ()

    def may_write(self, topic: str) -> bool:
        return topic == self.sink or any(name == topic for name, _partitions in self.outputs)


TIMER_KINDS = ("stream_time", "wall_clock")


@attrs.frozen
class Timer:
    """``function(ctx)`` run every ``every_ms`` for each partition of a
    processor (see ``App.schedule``)."""

    name: str
    processor: str
    every_ms: int
    kind: str
    function: Callable


def legal_topic_name(name: str, what: str) -> str:
    """``name`` if it is a legal topic name (``protocol.names``: the broker's
    own rule), else a ``ConfigError`` saying which setting made it."""
    try:
        return validate_topic_name(name)
    except InvalidTopicError as error:
        raise ConfigError(f"{what}: {error}") from None


def legal_instance_id(instance_id, application_id: str, what: str) -> str:
    """``instance_id`` if ``{application_id}-{instance_id}`` is a legal
    transactional id and ``group.instance.id`` (the topic names' rule, as
    Kafka's for a group instance id), else a ``ConfigError`` naming ``what``."""
    if not isinstance(instance_id, str) or not instance_id.strip():
        raise ConfigError(f"{what} must be a non-empty string, not {instance_id!r}")
    legal_topic_name(f"{application_id}-{instance_id}", f"{what} {instance_id!r} names the instance's transactional id and group.instance.id")
    return instance_id


def timer_store(processor: str) -> str:
    """The store holding a processor's timers' next fire times and stream time."""
    return f"{processor}-timers"


class Context:
    """What a processor acts through (``ctx``): its stores, ``emit``, ``count``
    and the current record's position (``topic``, ``partition``, ``offset``,
    ``timestamp``). One object per task, re-aimed at every record by
    ``streaming.task``, which owns what it collects."""

    __slots__ = ("_shard", "_count", "_processor", "_outputs", "_touched", "_globals", "topic", "partition", "offset", "timestamp")

    def __init__(self, shard: Callable[[str, int], Store], count: Callable[[str, int], None]):
        self._shard = shard  # (store name, partition) -> the assigned shard
        self._count = count  # counts into the open transaction's counters
        self._processor: Processor | None = None
        self._outputs: list = []  # (topic, key bytes, value bytes, headers, timestamp, processor)
        self._touched: list[Store] = []
        self._globals: dict = {}  # topic -> the global table's in-memory copy (streaming.tables.GlobalStore)
        self.topic, self.partition, self.offset, self.timestamp = "", -1, -1, -1

    def store(self, name: str) -> Store:
        if name not in self._processor.stores:
            raise StoreError(f"processor {self._processor.name} did not declare store {name!r} (stores={list(self._processor.stores)})")
        store = self._shard(name, self.partition)
        if store not in self._touched:
            self._touched.append(store)
        return store

    def global_table(self, topic: str):
        """The global table of ``topic`` (``app.global_table``), read-only: ``get(key, default)``, ``in``."""
        try:
            return self._globals[topic]
        except KeyError:
            raise StoreError(f"{topic!r} is not a global table of the app (app.global_table({topic!r}) makes it one)") from None

    def emit(self, key, value, topic: str | None = None, headers=None, timestamp: int | None = None) -> None:
        """Send a record to the processor's sink (or ``topic``) in this transaction."""
        processor = self._processor
        topic = topic or processor.sink
        if topic is None:
            raise ValueError(f"processor {processor.name} has no sink: emit(..., topic=...) names one")
        if not processor.may_write(topic):
            declared = [processor.sink] * (processor.sink is not None) + [name for name, _partitions in processor.outputs]
            raise ValueError(f"processor {processor.name} did not declare {topic!r} (it writes {', '.join(map(repr, declared)) or 'nothing'}): "
                             f"name it in app.processor(..., outputs=[{topic!r}]), so the runner creates or checks it at start")
        self._outputs.append((
            topic,
            processor.sink_key_serde.serialize(key),
            processor.sink_value_serde.serialize(value),
            tuple(headers) if headers else (),
            self.timestamp if timestamp is None else int(timestamp),
            processor,
        ))

    def count(self, metric: str, n: int = 1) -> None:
        """Add ``n`` to the app's counter ``metric`` when this transaction
        commits (an aborted one is rewound and counts again when redone)."""
        self._count(metric, n)


class Metrics(dict):
    """Counters by name (``records_in``, ``records_out``, ``commits``,
    ``aborts``, ``dead_letters``, ``restored_records``, ``rebalances``, and
    whatever processors count with ``ctx.count``). A plain dict of ints,
    readable from any thread while the app runs and after.

    What a transaction did (``records_out``, ``dead_letters``, the ``ctx.count``
    counters) is added when it commits, so a record redone after an abort is
    counted once. ``aborts_by_cause`` splits ``aborts`` by why the runner aborted. Timings
    (``commit_seconds``) are not kept here: ``observe`` hands each to the
    ``observers`` (``streaming.metrics`` adds one when the app serves
    Prometheus metrics; none by default)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.aborts_by_cause: dict[str, int] = {}
        self.observers: list[Callable[[str, float], None]] = []

    def add(self, name: str, n: int = 1) -> None:
        self[name] = self.get(name, 0) + n

    def aborted(self, cause: str) -> None:
        self.add("aborts")
        self.aborts_by_cause[cause] = self.aborts_by_cause.get(cause, 0) + 1

    def observe(self, name: str, value: float) -> None:
        for observer in self.observers:
            observer(name, value)


def _outputs(outputs) -> tuple[tuple[str, int | None], ...]:
    """``app.processor``'s ``outputs`` (names, or ``{topic: partitions}``) as (topic, partitions or None) pairs."""
    if isinstance(outputs, str):
        outputs = (outputs,)
    pairs = list(outputs.items()) if isinstance(outputs, dict) else [(topic, None) for topic in outputs]
    for topic, partitions in pairs:
        if not isinstance(topic, str):
            raise ConfigError(f"outputs names topics (or maps them to partition counts), not {topic!r}")
        if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1):
            raise ConfigError(f"output {topic!r}: a partition count is a positive int (or None), not {partitions!r}")
    return tuple(pairs)


class App:
    def __init__(
        self,
        bootstrap_servers=None,
        application_id: str = "",
        state_dir: str | None = None,
        instance_id: str | None = None,
        commit_interval_ms: int = 100,
        commit_records: int | None = None,
        on_error: str = "stop",
        dead_letter_topic: str | None = None,
        crash_point: Callable[[str], None] | None = None,
        replication_factor: int = -1,
        min_insync_replicas: int | None = None,
        max_task_idle_ms=100,
        repartition_purge_interval_ms: int = 30_000,
        **client_options,
    ):
        if not application_id:
            raise ConfigError("application_id is required: it names the app's group, transactional ids and internal topics")
        bootstrap_servers = bootstrap_servers or os.environ.get(BOOTSTRAP_SERVERS_VARIABLE) or DEFAULT_BOOTSTRAP_SERVERS
        state_dir = state_dir or os.environ.get(STATE_DIR_VARIABLE) or os.path.join("state", application_id)
        legal_topic_name(f"{application_id}-dead-letters", f"application_id {application_id!r} names the app's internal topics")
        if dead_letter_topic is not None:
            legal_topic_name(dead_letter_topic, "dead_letter_topic")
        if on_error not in ON_ERROR:
            raise ConfigError(f"on_error must be one of {', '.join(map(repr, ON_ERROR))}, not {on_error!r}")
        if commit_interval_ms <= 0 or (commit_records is not None and commit_records <= 0):
            raise ConfigError("commit_interval_ms and commit_records must be positive")
        if isinstance(replication_factor, bool) or not isinstance(replication_factor, int) or not (replication_factor == -1 or replication_factor >= 1):
            raise ConfigError(f"replication_factor is -1 (the broker's default.replication.factor) or at least 1, not {replication_factor!r}")
        if min_insync_replicas is not None and (isinstance(min_insync_replicas, bool) or not isinstance(min_insync_replicas, int) or min_insync_replicas < 1):
            raise ConfigError(f"min_insync_replicas is at least 1 (or None: the broker's default), not {min_insync_replicas!r}")
        if min_insync_replicas is not None and replication_factor != -1 and min_insync_replicas > replication_factor:
            raise ConfigError(f"min_insync_replicas ({min_insync_replicas}) above replication_factor ({replication_factor}) would refuse every write")
        self.bootstrap_servers = bootstrap_servers
        self.application_id = application_id
        self.state_dir = os.path.abspath(state_dir)
        self.commit_interval_ms = commit_interval_ms
        self.commit_records = commit_records
        self.on_error = on_error
        self.dead_letter_topic = dead_letter_topic or f"{application_id}-dead-letters"
        self.replication_factor = replication_factor
        self.min_insync_replicas = min_insync_replicas
        # How long co-partitioned inputs wait for each other (streaming.picking).
        self.max_task_idle_ms = milliseconds(max_task_idle_ms, "max_task_idle_ms")
        if isinstance(repartition_purge_interval_ms, bool) or not isinstance(repartition_purge_interval_ms, int) or repartition_purge_interval_ms <= 0:
            raise ConfigError(f"repartition_purge_interval_ms is a positive number of milliseconds, not {repartition_purge_interval_ms!r}")
        # How often the runner deletes the repartition records it has read
        # and committed (DeleteRecords), as Kafka Streams' repartition.purge.interval.ms.
        self.repartition_purge_interval_ms = repartition_purge_interval_ms
        # A seam for the fault harness: called with a point's name where a
        # crash matters ("streaming.after_commit_before_store_apply"); the
        # composing process passes faults.points.point, or nothing.
        self.crash_point = crash_point or (lambda name: None)
        self.consumer_options, self.producer_options = split_client_options(client_options)
        transaction_timeout_ms = int(self.producer_options.get("transaction_timeout_ms", 10_000))
        if commit_interval_ms >= transaction_timeout_ms:
            raise ConfigError(f"commit_interval_ms ({commit_interval_ms}) must be shorter than transaction_timeout_ms ({transaction_timeout_ms}): the broker aborts a transaction open longer")
        self.processors: list[Processor] = []
        self.timers: list[Timer] = []
        self.tables: dict[str, Table] = {}  # by store name (app.table)
        self.global_tables: dict[str, Table] = {}  # by topic (app.global_table)
        # Formats of topics a processor reads as bytes and deserializes
        # itself (a stream-stream join's two sources): what the test driver pipes with.
        self.declared_formats: dict[str, tuple[Serde, Serde]] = {}
        # Topics the app's own layers need ({topic: the topic whose partition
        # count it takes}), created by the runner before it starts: the
        # dataflow layer's repartition topics.
        self.internal_topics: dict[str, str] = {}
        # Topics written other than as a processor's sink ({topic: the topic
        # whose partition count it takes}): windows' on_late topics. The
        # runner creates every sink missing (streaming.topics).
        self.sink_topics: dict[str, str] = {}
        self.metrics = Metrics()
        self.metrics_url: str | None = None  # where a running app serves its Prometheus metrics (run(metrics_address=...))
        self._instance_id = None if instance_id is None else legal_instance_id(instance_id, application_id, "instance_id")
        self._stop = threading.Event()
        self._runner = None

    def place(self, *, bootstrap_servers: str | None = None, state_dir: str | None = None, instance_id: str | None = None) -> None:
        """Where this app runs, over what it was built with (each when
        given): ``onceflow run``'s ``--bootstrap-servers``, ``--state-dir``
        and ``--instance-id``. Before ``run()``."""
        if bootstrap_servers:
            self.bootstrap_servers = bootstrap_servers
        if state_dir:
            self.state_dir = os.path.abspath(state_dir)
        if instance_id:
            self._instance_id = instance_id

    def add_client_options(self, options: dict) -> None:
        """More client options (as the constructor's keywords), over those
        given before: ``onceflow run``'s security flags reach the app's clients here."""
        consumer, producer = split_client_options(options)
        self.consumer_options.update(consumer)
        self.producer_options.update(producer)

    # -- building ----------------------------------------------------------------------------------

    def processor(self, source, sink: str | None = None, stores=(), key_format="bytes", value_format="bytes", sink_key_format=None, sink_value_format=None, name: str | None = None,
                  timestamp_extractor: Callable[[Record], int] | None = None, outputs=()):
        """Register ``fn(record, ctx)`` for every record of ``source`` (a
        topic or a list of topics). The sink's key format, unless given, is
        the source's (the same key, the same bytes, the same partition); its
        value format is ``"auto"``: what the emitted values need (bytes,
        text, else JSON), not the source's. ``timestamp_extractor(record)`` gives a
        record's event time (ms) from its payload: the processor, its emits
        and its stream-time timers see that instead of the CreateTime.

        ``outputs``: the topics ``ctx.emit(..., topic=...)`` writes besides
        the sink, as names or ``{topic: partitions}``. The runner creates the
        missing ones at start (with the partitions given, else as many as
        the processor's sources have) and, where a count is given, refuses
        to start when the topic exists with another (``TopicsMismatchError``);
        a count may be given for the sink too. Emitting to a topic not
        declared fails the record, naming it."""
        sources = (source,) if isinstance(source, str) else tuple(source)
        stores = (stores,) if isinstance(stores, str) else tuple(stores)
        if not sources:
            raise ConfigError("a processor needs at least one source topic")
        for store in stores:
            legal_topic_name(self.changelog_topic(store), f"store {store!r} names its changelog topic")
        declared_outputs = _outputs(outputs)
        for topic in sources + ((sink,) if sink is not None else ()) + tuple(name for name, _partitions in declared_outputs):
            legal_topic_name(topic, "a processor's source, sink or output")

        def register(function: Callable) -> Callable:
            processor_name = name or getattr(function, "__name__", f"processor-{len(self.processors)}")
            if any(p.name == processor_name for p in self.processors):
                raise ConfigError(f"two processors are named {processor_name!r}")
            self.processors.append(
                Processor(
                    processor_name, function, sources, sink, stores,
                    resolve(key_format), resolve(value_format),
                    resolve(sink_key_format if sink_key_format is not None else key_format),
                    resolve(sink_value_format if sink_value_format is not None else "auto"),
                    timestamp_extractor,
                    declared_outputs,
                )
            )
            return function

        return register

    def schedule(self, processor: str, every, kind: str = "stream_time", name: str | None = None):
        """Register ``fn(ctx)`` to run every ``every`` (a timedelta or
        milliseconds) for each partition of ``processor``'s sources this
        instance holds, in the same transaction as the records: its
        ``ctx.store``/``ctx.emit`` are the processor's, ``ctx.partition`` the
        partition, ``ctx.timestamp`` the time it fires for.

        ``kind="stream_time"``: fires when the partition's stream time (the
        highest event time its records brought) reaches the next multiple
        of ``every`` (once per record at most, for the latest multiple
        reached), so it is as deterministic as the input.
        ``"wall_clock"``: fires when the clock reaches the next multiple of
        ``every``, records or not (an idle partition included).

        The next fire time of each timer and the stream time live in the
        processor's store ``{processor}-timers`` (changelogged like any
        store), so a timer fires once per multiple, crash or not."""
        from streaming.durations import milliseconds

        if kind not in TIMER_KINDS:
            raise ConfigError(f"a timer's kind is one of {', '.join(map(repr, TIMER_KINDS))}, not {kind!r}")
        every_ms = milliseconds(every, "a timer's interval", positive=True)

        def register(function: Callable) -> Callable:
            index = next((i for i, p in enumerate(self.processors) if p.name == processor), None)
            if index is None:
                raise ConfigError(f"schedule: no processor is named {processor!r} (register it first; there are {[p.name for p in self.processors]})")
            timer_name = name or getattr(function, "__name__", f"timer-{len(self.timers)}")
            if any(t.processor == processor and t.name == timer_name for t in self.timers):
                raise ConfigError(f"processor {processor!r} has two timers named {timer_name!r}")
            store = timer_store(processor)
            legal_topic_name(self.changelog_topic(store), f"processor {processor!r} cannot have timers: its store {store!r} names its changelog topic")
            owner = self.processors[index]
            if store not in owner.stores:
                self.processors[index] = attrs.evolve(owner, stores=owner.stores + (store,))
            self.timers.append(Timer(timer_name, processor, every_ms, kind, function))
            return function

        return register

    def table(self, topic: str, key_format="str", value_format="json", *, store: str | None = None) -> Table:
        """``topic`` read as a table: its latest value per key, in a
        changelogged store (``{topic}-table`` unless ``store`` names it),
        kept by a processor of its own; join a stream with it
        (``stream.join(table, joiner)``). See ``streaming.tables``."""
        table = make_table(topic, key_format, value_format, store, is_global=False)
        if table.store in self.tables:
            raise ConfigError(f"a table already keeps store {table.store!r} (app.table({self.tables[table.store].topic!r})): name another with store=")
        self.processor(source=topic, stores=[table.store], key_format=key_format, value_format=value_format, name=table.store)(materializer(table.store))
        self.tables[table.store] = table
        return table

    def global_table(self, topic: str, key_format="str", value_format="json") -> Table:
        """``topic`` read whole by every instance, in memory, before any
        record is processed and on between polls (small reference data; a
        join with it needs no co-partitioning). See ``streaming.tables``."""
        legal_topic_name(topic, "a global table's topic")
        if topic in self.global_tables:
            raise ConfigError(f"{topic!r} is already a global table of this app")
        table = self.global_tables[topic] = make_table(topic, key_format, value_format, topic, is_global=True)
        return table

    def stream(self, topic: str, key_format="bytes", value_format="bytes", timestamp_extractor: Callable[[Record], int] | None = None):
        """The dataflow layer's way in (``app.stream("t").filter(...).to("out")``);
        ``timestamp_extractor`` as for ``processor``."""
        from streaming.dataflow import Stream

        return Stream(self, topic, key_format=key_format, value_format=value_format, timestamp_extractor=timestamp_extractor)

    def changelog_topic(self, store: str) -> str:
        return f"{self.application_id}-{store}-changelog"

    def internal_topic_config(self, **config: str) -> dict[str, str]:
        """The topic configs of an internal topic the runner creates: ``config``
        plus ``min.insync.replicas`` when the app sets it."""
        if self.min_insync_replicas is not None:
            config["min.insync.replicas"] = str(self.min_insync_replicas)
        return config

    # -- identity -----------------------------------------------------------------------------------

    @property
    def instance_id(self) -> str:
        """This instance's id: given, else ``ONCEFLOW_INSTANCE_ID``, else read
        from (or, the first time, written to) ``state_dir/instance-id``."""
        if self._instance_id is None and os.environ.get(INSTANCE_ID_VARIABLE):
            self._instance_id = legal_instance_id(os.environ[INSTANCE_ID_VARIABLE], self.application_id, INSTANCE_ID_VARIABLE)
        if self._instance_id is None:
            path = os.path.join(self.state_dir, "instance-id")
            os.makedirs(self.state_dir, exist_ok=True)
            try:
                with open(path, encoding="utf-8") as file:
                    self._instance_id = file.read().strip()
            except FileNotFoundError:
                self._instance_id = uuid.uuid4().hex[:12]
                temporary = path + ".tmp"
                with open(temporary, "w", encoding="utf-8") as file:
                    file.write(self._instance_id + "\n")
                    file.flush()
                    os.fsync(file.fileno())
                os.replace(temporary, path)
                # The rename is durable once the directory is (as
                # storage.durable does it; streaming may not import storage).
                directory = os.open(self.state_dir, os.O_RDONLY)
                try:
                    os.fsync(directory)
                finally:
                    os.close(directory)
        return self._instance_id

    @property
    def transactional_id(self) -> str:
        return f"{self.application_id}-{self.instance_id}"

    def lock_state_dir(self):
        """Hold ``state_dir/.lock`` for the life of the returned file."""
        os.makedirs(self.state_dir, exist_ok=True)
        lock = open(os.path.join(self.state_dir, ".lock"), "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise StateDirInUseError(f"state_dir {self.state_dir} is in use by another process (each instance needs its own)") from None
        return lock

    # -- running ---------------------------------------------------------------------------------

    def run(self, until_idle: float | None = None, progress_interval: float | None = None, progress_out=None, metrics_address: tuple[str, int] | None = None) -> None:
        """Process until ``stop()``, SIGTERM or SIGINT (each finishes the open
        transaction), or, with ``until_idle``, until no record came for that
        many seconds. Raises ``ProcessingError`` (``on_error="stop"``) or
        ``InstanceFencedError``. ``progress_interval`` prints a progress line
        to ``progress_out`` (stderr) that often. ``metrics_address`` (host,
        port; port 0 picks one) serves Prometheus metrics there while it
        runs (``streaming.metrics``; ``metrics_url`` says where)."""
        import asyncio

        asyncio.run(self.run_async(until_idle, progress_interval, progress_out, metrics_address, handle_signals=True))

    async def run_async(self, until_idle: float | None = None, progress_interval: float | None = None, progress_out=None, metrics_address: tuple[str, int] | None = None,
                        *, handle_signals: bool = False) -> None:
        """``run`` on the running event loop (``await app.run_async()`` in
        Jupyter, an async server, a task of your own). SIGTERM and SIGINT
        are left to the loop's owner unless ``handle_signals``; ``stop()``
        (or cancelling the task: the open transaction is then aborted) ends it."""
        from streaming.runner import Runner

        if not self.processors:
            raise ConfigError("the app has no processors: register one with @app.processor(...)")
        runner = self._runner = Runner(self, until_idle=until_idle, progress_interval=progress_interval, progress_out=progress_out, metrics_address=metrics_address,
                                       handle_signals=handle_signals)
        try:
            await runner.run()
        finally:
            self._stop.clear()  # a stop asked before the run began ends it (cleared only once it is over)

    def stop(self) -> None:
        """Ask a running app to finish its transaction and return (any
        thread); asked before ``run`` starts, the run returns without processing."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()


def split_client_options(options: dict) -> tuple[dict, dict]:
    """Client options (Kafka or Python spelling) for the consumer and the
    producer; the security settings (``security_protocol``, ``sasl.*``,
    ``ssl.*``) go to both, hence to every client the runner opens."""
    common = {field.name for field in attrs.fields(CommonConfig)}
    consumer_only = {field.name for field in attrs.fields(ConsumerConfig)} - common
    producer_only = {field.name for field in attrs.fields(ProducerConfig)} - common
    consumer, producer, unknown = {}, {}, []
    for raw_name, value in options.items():
        name = raw_name.replace(".", "_").replace("-", "_")
        if name in RUNNER_OWNED_OPTIONS:
            raise ConfigError(f"{raw_name} is set by the runner (application_id and instance_id decide it)")
        if name in common or is_security_option(raw_name):
            consumer[name] = producer[name] = value
        elif name in consumer_only:
            consumer[name] = value
        elif name in producer_only:
            producer[name] = value
        else:
            unknown.append(raw_name)
    if unknown:
        raise ConfigError(f"unknown client option(s): {', '.join(sorted(unknown))}")
    return consumer, producer
