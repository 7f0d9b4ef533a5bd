"""What tests of several rooms share, one copy each: making a topic, reading
one back with an independent client (``read_values``) or our own (``read_all``), waiting for a state, a raw request on
the wire, a free port, a disk that fills under ``__consumer_offsets``, windowed sums by the plain definition, a SCRAM client, a producer's
connections cut again and again, a broker behind a fault proxy, a walk through a state table; the interop records every client writes and reads, a scrape of the metrics endpoint, the Spark sink's tasks and
driver without Spark, both coordinators on in-memory I/O, and a dict standing in for a store (``DictState``). (Fixtures live in ``conftest.py``; import these with
``from tests.helpers import ...``.)"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import socket
import threading
import time
import urllib.request
import uuid

from faults.certificates import TestCA  # noqa: F401  (tests import it from here)
from protocol import scram
from storage.durable import DiskIO

# Once a reader has what it expected, it waits this long for anything more
# (a duplicate, a record that should not be visible) before it returns.
GRACE_FOR_EXTRAS = 0.5


def create_topic(bootstrap: str, topic: str, partitions: int = 3, *, timeout: float = 15.0) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout)


def recreate_topics(bootstrap: str, topics: dict[str, int], *, configs: dict[str, dict[str, str]] | None = None) -> None:
    """Create ``topics`` ({name: partitions}) empty, deleting first any of
    them an earlier attempt of the same test left on the same broker: a test
    rerun by pytest-rerunfailures on a module's broker starts as the first
    attempt did instead of failing with TOPIC_ALREADY_EXISTS."""
    from txn import Admin

    with Admin(bootstrap_servers=bootstrap) as admin:
        left = [name for name in topics if name in admin.list_topics()]
        if left:
            admin.delete_topics(left)
        admin.create_topics(topics, configs=configs)


def seed_input(bootstrap: str, topic: str, count: int) -> None:
    """``count`` records, values ``b"0"``, ``b"1"``, ... keyed ``k<i mod 1000>``,
    written by an idempotent confluent-kafka producer (a copier's input)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20, "batch.size": 1 << 20})
    for i in range(count):
        while True:
            try:
                producer.produce(topic, key=b"k%d" % (i % 1000), value=b"%d" % i)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


def read_values(
    bootstrap: str,
    topic: str,
    *,
    partitions: int,
    isolation: str = "read_committed",
    expect: int | None = None,
    idle: float = 1.5,
    timeout: float = 30.0,
) -> list[bytes]:
    """Every value a fresh confluent-kafka consumer with ``isolation`` reads
    from the start of the topic's first ``partitions`` partitions.

    Without ``expect`` it stops once nothing new came for ``idle`` seconds.
    With ``expect`` it waits (up to ``timeout``) until that many are in, then
    ``GRACE_FOR_EXTRAS`` more, so that a duplicate or a record that should be
    hidden still shows up in the result."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4()}", "isolation.level": isolation, "enable.auto.commit": False, "enable.partition.eof": False})
    consumer.assign([TopicPartition(topic, partition, 0) for partition in range(partitions)])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    last_new = time.monotonic()
    try:
        while time.monotonic() < deadline:
            messages = consumer.consume(500, 0.2)
            for message in messages:
                assert message.error() is None, message.error()
                values.append(message.value())
            now = time.monotonic()
            if messages:
                last_new = now
            quiet = now - last_new
            if expect is None and quiet >= idle:
                break
            if expect is not None and len(values) >= expect and quiet >= GRACE_FOR_EXTRAS:
                break
    finally:
        consumer.close()
    return values


def read_all(
    bootstrap: str,
    topic: str,
    partitions: int,
    *,
    isolation: str = "read_committed",
    idle: float = 1.5,
    expect: int | None = None,
    timeout: float = 120.0,
    to_end: bool = False,
    on_poll=None,
) -> list:
    """Every record (``txn`` Records: key, value, partition, offset, headers)
    our own consumer with ``isolation`` reads from the start of the topic's
    first ``partitions`` partitions: until ``expect`` arrived (if given) and
    nothing more came for ``idle`` seconds, or ``timeout``. With ``to_end``
    it reads up to the end offsets the partitions have when it starts
    instead (no idle wait: for a writer that is done and committed).
    ``on_poll(records)`` sees every non-empty poll (a fault history's final read)."""
    from txn import Admin, Consumer, TopicPartition

    assigned = [TopicPartition(topic, p) for p in range(partitions)]
    ends = {}
    if to_end:
        with Admin(bootstrap) as admin:
            ends = {tp: listed.offset for tp, listed in admin.list_offsets({tp: "latest" for tp in assigned}).items()}
    consumer = Consumer(bootstrap_servers=bootstrap, isolation_level=isolation, max_poll_records=10_000)
    consumer.assign(assigned)
    records: list = []
    last_new, deadline = time.monotonic(), time.monotonic() + timeout

    def more_to_read() -> bool:
        if to_end:
            return any(consumer.position(tp) < end for tp, end in ends.items())
        return (expect is not None and len(records) < expect) or time.monotonic() - last_new < idle

    try:
        while time.monotonic() < deadline and more_to_read():
            got = consumer.poll(0.3)
            if got:
                records += got
                last_new = time.monotonic()
                if on_poll is not None:
                    on_poll(got)
    finally:
        consumer.close()
    return records


def wait_for(condition, timeout: float = 10.0, what: str = "the condition", *, interval: float = 0.05):
    """Poll ``condition()`` until it is true and return what it returned; fail
    the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def raw_request(port: int, api_key: int, version: int, body: dict) -> dict:
    """One request on a fresh connection to 127.0.0.1:``port``; the decoded answer."""
    from protocol.framing import ClientConnection

    connection = ClientConnection(client_id="raw")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        _correlation_id, frame = connection.send_request(api_key, version, body)
        sock.sendall(frame)
        while True:
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionError(f"127.0.0.1:{port} closed the connection without answering")
            connection.receive_data(data)
            response = connection.next_response()
            if response is not None:
                return response.body


def raw_fetch(port: int, topic: str, offsets: list[int], *, max_wait_ms: int = 0, min_bytes: int = 1, max_bytes: int = 8 << 20, partition_max_bytes: int = 1 << 20) -> dict:
    """One Fetch v11 (read_uncommitted, no session) of ``topic``'s partitions
    0.. at ``offsets``; the decoded answer."""
    from protocol.messages import ApiKey

    partitions = [{"partition": index, "current_leader_epoch": -1, "fetch_offset": offset, "log_start_offset": -1, "partition_max_bytes": partition_max_bytes}
                  for index, offset in enumerate(offsets)]
    return raw_request(port, ApiKey.FETCH, 11, {"replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": min_bytes, "max_bytes": max_bytes, "isolation_level": 0,
                                                "session_id": 0, "session_epoch": -1, "topics": [{"topic": topic, "partitions": partitions}], "forgotten_topics_data": [], "rack_id": ""})


def free_port() -> int:
    """A TCP port nobody listens on right now (bind to it soon: another process may take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PathTrackingIO(DiskIO):
    """A DiskIO seam that knows the path of every descriptor it opened
    (``paths``), for fault seams that act on some files only."""

    def __init__(self):
        self.paths: dict[int, str] = {}

    def open(self, path, flags):
        fd = super().open(path, flags)
        self.paths[fd] = path
        return fd

    def close(self, fd):
        self.paths.pop(fd, None)
        super().close(fd)


class FullDiskUnderOffsets(PathTrackingIO):
    """A broker's DiskIO seam whose writes under ``__consumer_offsets`` fail
    with ENOSPC while ``full`` is set (``refused`` counts them)."""

    def __init__(self):
        super().__init__()
        self.full = threading.Event()
        self.refused = 0

    def write(self, fd, data):
        if self.full.is_set() and "__consumer_offsets" in self.paths.get(fd, ""):
            self.refused += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        super().write(fd, data)


def recompute_windowed_sums(records, size: int, advance: int, grace: int):
    """Windowed sums of ``(key, timestamp, value)`` records by the plain
    definition, independent of ``streaming.windows`` (what its tests and the
    dataflow's broker test check it against): stream time is the
    running maximum; a record joins each window [s, s+size) (s a multiple of
    advance, s >= 0) holding it whose end + grace is above the stream time
    at the record; a window is emitted at the first record that brings
    stream time to its end + grace."""
    stream_time = None
    sums: dict = {}
    emitted_at: dict = {}
    late = 0
    for index, (key, ts, value) in enumerate(records):
        stream_time = ts if stream_time is None else max(stream_time, ts)
        for window in list(sums):
            if window not in emitted_at and stream_time >= window[1] + size + grace:
                emitted_at[window] = index
        missed = False
        for start in range(0, ts + 1):
            if start % advance or not (start <= ts < start + size):
                continue
            if stream_time >= start + size + grace:
                missed = True
                continue
            sums[(key, start)] = sums.get((key, start), 0) + value
        late += missed
    finals = {w: (sums[w], emitted_at[w]) for w in emitted_at}
    still_open = {w: s for w, s in sums.items() if w not in emitted_at}
    return finals, still_open, late


class ScramClient:
    """A SCRAM client's half of the exchange, from ``protocol.scram``, for driving
    the broker's SASL server (in memory or over a socket)."""

    def __init__(self, mechanism: str, username: str, password: str):
        self.mechanism = scram.MECHANISMS[mechanism]
        self.username, self.password = username, password
        self.nonce = scram.b64encode(os.urandom(18))
        self.first_bare = f"n={scram.escape_username(username)},r={self.nonce}"

    def first(self) -> bytes:
        return f"n,,{self.first_bare}".encode()

    def final(self, server_first: bytes, *, nonce: str | None = None, binding: str = "biws") -> bytes:
        attributes = scram.parse_attributes(server_first.decode())
        salted = scram.salted_password(self.mechanism, self.password.encode(), scram.b64decode(attributes["s"]), int(attributes["i"]))
        without_proof = f"c={binding},r={nonce or attributes['r']}"
        auth_message = f"{self.first_bare},{server_first.decode()},{without_proof}".encode()
        self.expected_signature = scram.server_signature(self.mechanism, scram.server_key(self.mechanism, salted), auth_message)
        return f"{without_proof},p={scram.b64encode(scram.client_proof(self.mechanism, salted, auth_message))}".encode()


def read_partition(bootstrap, topic, partition, expect, *, isolation="read_committed", timeout=30.0):
    """Up to ``expect`` records of one partition, read by our own consumer
    from its start, then whatever else comes in 0.3 s (that should be nothing)."""
    from txn import Consumer, TopicPartition

    consumer = Consumer(bootstrap_servers=bootstrap, isolation_level=isolation)
    consumer.assign([TopicPartition(topic, partition)])
    records, deadline = [], time.monotonic() + timeout
    while len(records) < expect and time.monotonic() < deadline:
        records.extend(consumer.poll(0.5))
    time.sleep(0.3)
    records.extend(consumer.poll(0.3))  # nothing more should come
    consumer.close()
    return records


@contextlib.contextmanager
def connections_cut_every(producer, seconds: float):
    """While the block runs, abort every socket of ``producer`` (our sync
    client) every ``seconds``: a network that keeps failing."""
    stop = threading.Event()

    def cutting():
        while not stop.wait(seconds):
            producer.cut_connections()

    cutter = threading.Thread(target=cutting, name="connection-cutter", daemon=True)
    cutter.start()
    try:
        yield
    finally:
        stop.set()
        cutter.join()


@contextlib.contextmanager
def broker_behind_proxy(directory: str, *, seed: int | None = None, **settings):
    """An embedded broker (``settings`` as ``EmbeddedBroker`` takes them;
    no initial rebalance delay unless given) that advertises a fault proxy
    in front of it, so that every client, after bootstrapping, keeps going
    through the proxy instead of following Metadata around it. The proxy
    starts first (its port goes into the broker's metadata), then is pointed
    at the broker. Yields ``(proxy, broker)``; ``proxy.address`` is the
    bootstrap to give clients, ``broker.bootstrap`` the way around it."""
    from broker.broker import EmbeddedBroker
    from faults.proxy import ThreadedFaultProxy

    settings.setdefault("group_initial_rebalance_delay_ms", 0)
    with ThreadedFaultProxy("127.0.0.1", 0, **({} if seed is None else {"seed": seed})) as proxy:
        with EmbeddedBroker(directory, advertised_host="127.0.0.1", advertised_port=proxy.port, **settings) as broker:
            proxy.retarget("127.0.0.1", broker.port)
            yield proxy, broker


def walk(transition, state, moves):
    """Take ``moves`` (``[(event, the state it must lead to)]``) through a
    state machine's ``transition`` from ``state``, checking every step;
    returns the last state."""
    for event, expected in moves:
        reached = transition(state, event)
        assert reached == expected, f"{event} in {state} led to {reached}, not {expected}"
        state = reached
    return state


# ----------------------------------------------------------------- interop: records every client writes and reads


# The records the interop tests write and read with every client.
INTEROP_COUNT = 200


def interop_records():
    return [
        (b"key-%d" % i if i % 3 else None, b"value-%d" % i * (1 + i % 5), [("h", b"%d" % i), ("empty", b"")] if i % 2 else [], 1_700_000_000_000 + i)
        for i in range(INTEROP_COUNT)
    ]


def as_comparable(records):
    return [(k, v, [(hk, bytes(hv) if hv is not None else None) for hk, hv in h], t) for k, v, h, t in records]


def read_with_confluent(bootstrap, topic):
    from confluent_kafka import Consumer as ConfluentConsumer
    from confluent_kafka import TopicPartition as ConfluentPartition

    consumer = ConfluentConsumer({"bootstrap.servers": bootstrap, "group.id": "interop", "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.assign([ConfluentPartition(topic, 0, 0)])
    out, deadline = [], time.monotonic() + 20
    while len(out) < INTEROP_COUNT and time.monotonic() < deadline:
        for message in consumer.consume(500, 0.2):
            if message.error() is None:
                out.append((message.key(), message.value(), list(message.headers() or []), message.timestamp()[1]))
    consumer.close()
    return out


def read_with_kafka_python(bootstrap, topic):
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed", auto_offset_reset="earliest")
    consumer.assign([KafkaPartition(topic, 0)])
    out, deadline = [], time.monotonic() + 20
    while len(out) < INTEROP_COUNT and time.monotonic() < deadline:
        for records in consumer.poll(200).values():
            out += [(r.key, r.value, list(r.headers or []), r.timestamp) for r in records]
    consumer.close()
    return out


def read_with_aiokafka(bootstrap, topic):
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as AioPartition

    async def read():
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level="read_committed", auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign([AioPartition(topic, 0)])
            out, deadline = [], time.monotonic() + 20
            while len(out) < INTEROP_COUNT and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    out += [(r.key, r.value, list(r.headers or []), r.timestamp) for r in records]
            return out
        finally:
            await consumer.stop()

    return asyncio.run(read())


INTEROP_READERS = {"confluent-kafka": read_with_confluent, "kafka-python": read_with_kafka_python, "aiokafka": read_with_aiokafka}


def write_with_confluent(bootstrap, topic, codec):
    from confluent_kafka import Producer as ConfluentProducer

    producer = ConfluentProducer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20, "enable.idempotence": True})
    for key, value, headers, timestamp in interop_records():
        producer.produce(topic, value=value, key=key, headers=headers, timestamp=timestamp, partition=0)
    assert producer.flush(20) == 0


def write_with_kafka_python(bootstrap, topic, codec):
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type=None if codec == "none" else codec, linger_ms=20)
    for key, value, headers, timestamp in interop_records():
        producer.send(topic, value=value, key=key, headers=headers, timestamp_ms=timestamp, partition=0)
    producer.flush(20)
    producer.close()


def write_with_aiokafka(bootstrap, topic, codec):
    from aiokafka import AIOKafkaProducer

    async def write():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=None if codec == "none" else codec, linger_ms=20, enable_idempotence=True)
        await producer.start()
        try:
            for key, value, headers, timestamp in interop_records():
                await producer.send(topic, value=value, key=key, headers=headers, timestamp_ms=timestamp, partition=0)
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(write())


INTEROP_WRITERS = {"confluent-kafka": write_with_confluent, "kafka-python": write_with_kafka_python, "aiokafka": write_with_aiokafka}


# ----------------------------------------------------------------- the broker's metrics endpoint


class Scrape:
    """One scrape of a broker's Prometheus endpoint, read with
    ``prometheus_client``'s parser: sample values by name and labels."""

    def __init__(self, url: str):
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            text = response.read().decode()
        self.families = {family.name: family for family in text_string_to_metric_families(text)}
        self.samples: dict[tuple[str, frozenset], float] = {}
        for family in self.families.values():
            for sample in family.samples:
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def value(self, name: str, default: float | None = None, **labels) -> float:
        key = (name, frozenset((k, str(v)) for k, v in labels.items()))
        if key not in self.samples:
            if default is not None:
                return default
            raise KeyError(f"no sample {name}{labels}")
        return self.samples[key]

    def matching(self, name: str, **labels) -> dict[frozenset, float]:
        wanted = {(k, str(v)) for k, v in labels.items()}
        return {key[1]: value for key, value in self.samples.items() if key[0] == name and wanted <= key[1]}

    def total(self, name: str, **labels) -> float:
        return sum(self.matching(name, **labels).values())


def scrape(broker) -> Scrape:
    return Scrape(broker.metrics_url)


# ----------------------------------------------------------------- the Spark sink without Spark (its driver and tasks called directly)


def spark_sink_options(bootstrap: str = "127.0.0.1:9", **extra) -> dict:
    """The sink's options as a query gives them: topic "out", prefix "job"."""
    return {"kafka.bootstrap.servers": bootstrap, "topic": "out", "transactionalIdPrefix": "job", **extra}


def sink_kv_schema():
    """The key and value string columns the sink tests write (imported when
    asked: pyspark is not every test's)."""
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType([StructField("key", StringType()), StructField("value", StringType())])


def sink_rows(values, key: bool = True):
    """One Arrow batch of ``values`` as the sink's task gets them."""
    import pyarrow as pa

    data = {"key": [f"k{v}" for v in values], "value": [str(v) for v in values]} if key else {"value": [str(v) for v in values]}
    return pa.RecordBatch.from_pydict(data)


def run_sink_tasks(parsed, values, partitions, query_id, run_id, batch, crash=None):
    """One batch's tasks: ``values`` split over ``partitions`` tasks (round
    robin), each writing its open transaction; returns their commit messages."""
    from streaming.spark.crashpoints import no_crash
    from streaming.spark.sink import validate_schema
    from streaming.spark.sink_task import TaskIdentity, write_task

    columns = validate_schema(sink_kv_schema(), parsed.topic)
    messages = []
    for p in range(partitions):
        mine = values[p::partitions]
        messages.append(write_task(parsed, columns, iter([sink_rows(mine)] if mine else []), TaskIdentity(query_id, run_id, batch, p, 0), crash or no_crash))
    return messages


def read_committed_values(bootstrap, topic="out", partitions=3, timeout=30.0):
    """Every committed value in ``topic``, read to the end (which needs the LSO
    to be at the end: no open transaction left)."""
    from txn import Admin, Consumer, TopicPartition

    with Admin(bootstrap) as admin:
        ends = {tp: o.offset for tp, o in admin.list_offsets({TopicPartition(topic, p): "latest" for p in range(partitions)}, isolation_level="read_uncommitted").items()}
    values = []
    with Consumer(bootstrap, isolation_level="read_committed") as consumer:
        consumer.assign(list(ends))
        for tp in ends:
            consumer.seek(tp, 0)
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            assert time.monotonic() < deadline, f"read_committed readers stalled: positions {[consumer.position(tp) for tp in ends]} of {list(ends.values())}"
            values += [r.value.decode() for r in consumer.poll(0.5)]
    return values


def open_sink_transactions(bootstrap, prefix="job"):
    """The transactional ids of ``prefix`` with a transaction Ongoing."""
    from txn import Admin

    with Admin(bootstrap) as admin:
        return [t.transactional_id for t in admin.list_transactions(states=["Ongoing"]) if t.transactional_id.startswith(prefix)]


def new_query():
    """A fresh (query id, run id) pair."""
    return str(uuid.uuid4()), str(uuid.uuid4())


# ----------------------------------------------------------------- the coordinators on in-memory I/O


class MemoryTxnLog:
    """The transaction state log in memory: records kept in order, writes
    that fail while ``fail`` is set."""

    def __init__(self):
        self.records = []
        self.fail = False

    async def write(self, metadata):
        await self.append(metadata)

    def append(self, metadata):
        if self.fail:
            raise OSError("disk gone")
        self.records.append(metadata)
        return self._durable()

    async def _durable(self):
        pass

    def append_unflushed(self, metadata):
        """Appended now; durable when asked, at once (or once ``flushed`` is
        set, if a test holds it)."""
        if self.fail:
            raise OSError("disk gone")
        self.records.append(metadata)
        self.asked_durable = getattr(self, "asked_durable", 0)

        def wait_durable():
            self.asked_durable += 1
            future = asyncio.get_running_loop().create_future()
            held = getattr(self, "flushed", None)
            if held is None:
                future.set_result(None)
            else:
                held.add_done_callback(lambda _f: future.done() or future.set_result(None))
            return future

        return wait_durable

    async def tombstone(self, transactional_id):
        self.records.append((transactional_id, None))


class MemoryMarkers:
    """Markers written in memory; the next ``fail_times`` writes fail.
    ``log_ends`` (partition -> offset) stands for the partition logs: at a
    decision, where the producer's data ends in each (what the decision
    names); after a restart, where each log ends (what recovery checks it
    against). ``data_round``, a future a test may set, holds every
    ``data_durable`` until it is done (the data's fsync round)."""

    def __init__(self):
        self.written = []
        self.fail_times = 0
        self.log_ends = {}

    def data_ends(self, metadata):
        return tuple((p.topic, p.partition, self.log_ends.get(p, 0)) for p in sorted(metadata.partitions, key=str))

    def data_durable(self, metadata):
        held = getattr(self, "data_round", None)
        return asyncio.sleep(0) if held is None else asyncio.shield(held)

    def opened_after(self, metadata):
        """The partitions a test says hold a later open transaction (``later_open``)."""
        return frozenset(p for p in getattr(self, "later_open", ()) if p in metadata.partitions)

    def data_present(self, metadata):
        from coordinator.metadata import TopicPartition

        return all(self.log_ends.get(TopicPartition(topic, index), 0) >= end for topic, index, end in metadata.data_ends)

    async def write(self, metadata, commit):
        if self.fail_times:
            self.fail_times -= 1
            raise OSError("partition unavailable")
        self.written.append((metadata.producer_id, metadata.producer_epoch, commit, sorted(metadata.partitions, key=str)))

    def append(self, metadata, commit):
        """Appended at once, each marker at its partition's ``log_ends``;
        durable when asked (``asked_markers`` counts), at once unless a test
        holds ``durable`` (a future). Topic ids: uuid5 of the name."""
        import uuid

        self.written.append((metadata.producer_id, metadata.producer_epoch, commit, sorted(metadata.partitions, key=str)))
        self.asked_markers = getattr(self, "asked_markers", 0)

        def ask():
            self.asked_markers += 1
            durable = getattr(self, "durable", None)
            if durable is None:
                durable = asyncio.get_running_loop().create_future()
                durable.set_result(None)
            return durable

        marked_at = tuple((p.topic, p.partition, self.log_ends.get(p, 0), uuid.uuid5(uuid.NAMESPACE_OID, p.topic)) for p in sorted(metadata.partitions, key=str))
        return ask, marked_at


class MemoryProducerIds:
    """Producer ids counted up from 1001."""

    def __init__(self):
        self.next = 1000

    def allocate(self):
        self.next += 1
        return self.next


def make_txn_coordinator(**settings):
    """A transaction coordinator on in-memory I/O and a manual clock."""
    from coordinator.coordinator import CoordinatorSettings, TransactionCoordinator
    from protocol.clock import ManualClock

    clock = ManualClock()
    coordinator = TransactionCoordinator(
        txn_log=MemoryTxnLog(), markers=MemoryMarkers(), producer_ids=MemoryProducerIds(), settings=CoordinatorSettings(**settings), clock=clock
    )
    return coordinator, clock


class MemoryOffsetsLog:
    """The offsets log in memory: the batches appended, in order."""

    def __init__(self):
        self.batches = []

    async def append(self, group_id, records, *, producer_id=-1, producer_epoch=-1):
        self.batches.append((group_id, records, producer_id))


def make_group_coordinator(**settings):
    """A coordinator on a manual clock: time passes only when a test says so
    (``clock.advance``), and timers fire when it calls ``check_timeouts``."""
    from groupcoord.coordinator import GroupCoordinator, GroupSettings
    from protocol.clock import ManualClock

    clock = ManualClock()
    settings.setdefault("initial_rebalance_delay_ms", 200)
    settings.setdefault("min_session_timeout_ms", 100)
    coordinator = GroupCoordinator(offsets_log=MemoryOffsetsLog(), settings=GroupSettings(**settings), clock=clock)
    return coordinator, clock


def join_group(coordinator, member_id="", session=1000, group="g", instance=None, protocols=(("range", b"meta"),), skip_assignment_supported=False):
    """A consumer JoinGroup request (a coroutine) with the usual fields."""
    return coordinator.join_group(
        group_id=group, member_id=member_id, group_instance_id=instance, client_id="c", client_host="h",
        session_timeout_ms=session, rebalance_timeout_ms=session, protocol_type="consumer", protocols=list(protocols), require_known_member_id=True,
        skip_assignment_supported=skip_assignment_supported,
    )


async def joined_together(coordinator, *joins, group="g"):
    """Run JoinGroup requests until all of them wait, then let the initial
    rebalance delay pass: they complete as one generation."""
    tasks = [asyncio.ensure_future(j) for j in joins]
    for _ in range(100):
        members = coordinator.groups[group].members.values() if group in coordinator.groups else ()
        if sum(1 for m in members if m.join_future is not None and not m.join_future.done()) == len(tasks):
            break
        await asyncio.sleep(0)
    coordinator.clock.advance(coordinator.settings.initial_rebalance_delay_ms / 1000)
    await coordinator.check_timeouts()
    return await asyncio.wait_for(asyncio.gather(*tasks), 5)


async def join_two(coordinator):
    """Two members joined as generation 1 of group "g"."""
    from protocol.errors import ErrorCode

    first = await join_group(coordinator)
    second = await join_group(coordinator)
    assert first["error_code"] == second["error_code"] == ErrorCode.MEMBER_ID_REQUIRED
    a, b = await joined_together(coordinator, join_group(coordinator, first["member_id"]), join_group(coordinator, second["member_id"]))
    return a, b


class DictState:
    """A store stand-in for the sans-I/O core: values go through JSON, as a
    real store's do, so a non-JSON aggregate or a tuple/list mix-up shows."""

    def __init__(self):
        self.data: dict = {}

    def get(self, key, default=None):
        raw = self.data.get(key)
        return default if raw is None else json.loads(raw)

    def put(self, key, value):
        self.data[key] = json.dumps(value)

    def delete(self, key):
        self.data.pop(key, None)

    def items(self):
        return [(key, json.loads(raw)) for key, raw in sorted(self.data.items(), key=lambda item: repr(item[0]))]
