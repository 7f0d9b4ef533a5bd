"""What tests of several rooms share, one copy each: making a topic, reading
one back with an independent client (``read_values``) or our own (``read_all``), waiting for a state, a raw request on
the wire, a free port, a disk that fills under ``__consumer_offsets``, windowed sums by the plain definition, a SCRAM client, a producer's
connections cut. (Fixtures live in ``conftest.py``; import these with
``from tests.helpers import ...``.)"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
import time
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


def cut_connections(producer) -> None:
    """Abort every socket of the producer, on its loop (a network fault)."""

    def cut():
        for client in producer._async.cluster._clients.values():
            if client._writer is not None:
                client._writer.transport.abort()

    producer._thread.loop.call_soon_threadsafe(cut)


@contextlib.contextmanager
def connections_cut_every(producer, seconds: float):
    """While the block runs, abort every socket of ``producer`` (our sync
    client) every ``seconds``: a network that keeps failing."""
    stop = threading.Event()

    def cutting():
        while not stop.wait(seconds):
            cut_connections(producer)

    cutter = threading.Thread(target=cutting, name="connection-cutter", daemon=True)
    cutter.start()
    try:
        yield
    finally:
        stop.set()
        cutter.join()
