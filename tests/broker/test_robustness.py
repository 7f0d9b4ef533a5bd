"""No peer input crashes the broker or stalls other connections.

Garbage, truncated, oversized and mutated frames are thrown at a running
broker over real sockets; after each, a well-behaved request on a separate
connection must still be answered.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.framing import ClientConnection
from protocol.messages import ApiKey
from tests.conftest import module_broker as shared_broker  # noqa: F401  (one broker process for the module)
from tests.helpers import create_topic


def api_versions_v0(correlation_id: int = 7) -> bytes:
    client_id = b"probe"
    body = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    return struct.pack(">i", len(body)) + body


def metadata_v1_all(correlation_id: int = 9) -> bytes:
    client_id = b"probe"
    body = struct.pack(">hhih", 3, 1, correlation_id, len(client_id)) + client_id + struct.pack(">i", -1)
    return struct.pack(">i", len(body)) + body


def read_frame(sock: socket.socket, timeout: float = 10.0) -> bytes:
    sock.settimeout(timeout)
    header = _read_exactly(sock, 4)
    (size,) = struct.unpack(">i", header)
    return _read_exactly(sock, size)


def _read_exactly(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def assert_broker_answers(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(api_versions_v0(1234))
        response = read_frame(sock)
        (correlation_id, error_code) = struct.unpack_from(">ih", response)
        assert correlation_id == 1234 and error_code == 0


def send_and_drain(port: int, payload: bytes, wait: float = 0.2) -> None:
    """Send ``payload``, then read until the broker answers or closes (or we stop waiting)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            return
        sock.settimeout(wait)
        try:
            while sock.recv(65536):
                pass
        except (socket.timeout, OSError):
            pass


def test_api_versions_answered(shared_broker):
    assert_broker_answers(shared_broker.port)


def test_requests_sent_before_the_peer_closes_its_side_are_still_answered(shared_broker):
    """A client that sends its requests and shuts its sending side (a
    half-close) gets every answer, in order, before the broker closes."""
    with socket.create_connection(("127.0.0.1", shared_broker.port), timeout=10) as sock:
        sock.sendall(b"".join(api_versions_v0(correlation_id) for correlation_id in (7, 8, 9)))
        sock.shutdown(socket.SHUT_WR)
        answers = [struct.unpack_from(">ih", read_frame(sock)) for _ in range(3)]
        assert answers == [(7, 0), (8, 0), (9, 0)]
        assert sock.recv(1) == b""  # then the broker closes


def test_unsupported_api_versions_version_gets_error_35_and_ranges(shared_broker):
    client_id = b"probe"
    body = struct.pack(">hhih", 18, 99, 5, len(client_id)) + client_id + b"\x00\x00\x00"
    with socket.create_connection(("127.0.0.1", shared_broker.port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        response = read_frame(sock)
    correlation_id, error_code, count = struct.unpack_from(">ihi", response)
    assert (correlation_id, error_code) == (5, 35)
    keys = {struct.unpack_from(">hhh", response, 10 + 6 * i)[0] for i in range(count)}
    assert {0, 1, 2, 3, 18} <= keys


def test_a_version_we_do_not_advertise_is_refused_though_the_schema_knows_it(shared_broker):
    """Produce v2 (a magic-1 message set) is in the schema tables but not in
    what ApiVersions advertises: the connection is closed without an answer,
    and the broker goes on serving others."""
    from broker.apis import SUPPORTED_APIS
    from protocol.messages import APIS, ApiKey

    low, _high = SUPPORTED_APIS[ApiKey.PRODUCE]
    assert APIS[ApiKey.PRODUCE].request.valid[0] < low, "the schema tables know an older Produce than we serve"
    client_id = b"old"
    body = struct.pack(">hhih", ApiKey.PRODUCE, low - 1, 7, len(client_id)) + client_id + struct.pack(">hii", 1, 1000, 0)
    with socket.create_connection(("127.0.0.1", shared_broker.port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        with pytest.raises(ConnectionError):
            read_frame(sock)
    assert_broker_answers(shared_broker.port)


@pytest.mark.parametrize(
    "payload",
    [
        struct.pack(">i", -5),
        struct.pack(">i", 2**31 - 1),
        struct.pack(">i", 200 * 1024 * 1024) + b"x" * 100,
        struct.pack(">i", 3) + b"\x00\x00\x00",
        struct.pack(">i", 8) + struct.pack(">hhi", 999, 0, 1),
        struct.pack(">i", 10) + struct.pack(">hhih", 3, 1, 1, 500),
        metadata_v1_all()[:-2],
        struct.pack(">i", 14) + struct.pack(">hhih", 3, 1, 1, -1) + struct.pack(">i", 2**31 - 1),
        b"\x00",
        b"",
    ],
    ids=["negative-size", "huge-size", "over-max-frame", "short-header", "unknown-api", "bad-client-id", "truncated-body", "absurd-array", "one-byte", "empty"],
)
def test_bad_frames_do_not_hurt_the_broker(shared_broker, payload):
    send_and_drain(shared_broker.port, payload)
    assert_broker_answers(shared_broker.port)


def test_slow_loris_does_not_stall_others(shared_broker):
    """A peer that sends half a frame and stalls holds only its own connection."""
    stalled = socket.create_connection(("127.0.0.1", shared_broker.port), timeout=5)
    try:
        stalled.sendall(api_versions_v0()[:6])
        started = time.monotonic()
        assert_broker_answers(shared_broker.port)
        assert time.monotonic() - started < 5
    finally:
        stalled.close()


def test_pipelined_requests_answered_in_order(shared_broker):
    with socket.create_connection(("127.0.0.1", shared_broker.port), timeout=10) as sock:
        sock.sendall(b"".join(api_versions_v0(i) if i % 2 else metadata_v1_all(i) for i in range(20)))
        ids = [struct.unpack_from(">i", read_frame(sock))[0] for _ in range(20)]
    assert ids == list(range(20))


def test_an_answer_ready_at_once_waits_behind_one_that_waits(shared_broker):
    """Requests answered without waiting (ApiVersions, Metadata) are answered
    on the spot, with no task; behind a long-polling Fetch on the same
    connection their answers still go out after the Fetch's, in request
    order."""
    topic = f"order-{uuid.uuid4().hex[:8]}"
    create_topic(f"127.0.0.1:{shared_broker.port}", topic, 1)
    connection = ClientConnection(client_id="order")
    fetch = {"max_wait_ms": 600, "min_bytes": 1, "isolation_level": 0,
             "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]}
    requests = [(ApiKey.API_VERSIONS, 0, {}), (ApiKey.FETCH, 4, fetch), (ApiKey.API_VERSIONS, 0, {}), (ApiKey.METADATA, 1, {"topics": None})]
    frames = [connection.send_request(api_key, version, body) for api_key, version, body in requests]
    with socket.create_connection(("127.0.0.1", shared_broker.port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(b"".join(frame for _correlation_id, frame in frames))
        answered = []
        for _ in requests:
            answered.append((struct.unpack_from(">i", read_frame(sock))[0], time.monotonic() - started))
    assert [correlation_id for correlation_id, _ in answered] == [correlation_id for correlation_id, _frame in frames]
    assert answered[0][1] < 0.5 <= answered[1][1] <= answered[2][1]  # the first at once; the Fetch waited out its poll


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.one_of(
        st.binary(max_size=300),
        st.builds(lambda body: struct.pack(">i", len(body)) + body, st.binary(max_size=300)),
        st.builds(
            lambda key, version, tail: (lambda body: struct.pack(">i", len(body)) + body)(
                struct.pack(">hhih", key, version, 1, 3) + b"abc" + tail
            ),
            st.integers(-1, 70),
            st.integers(-1, 20),
            st.binary(max_size=200),
        ),
    )
)
def test_fuzzed_frames(shared_broker, payload):
    send_and_drain(shared_broker.port, payload, wait=0.05)
    assert_broker_answers(shared_broker.port)


def test_mutated_real_requests(shared_broker):
    """Every single-byte mutation of a real Metadata request leaves the broker serving."""
    import random

    rng = random.Random(42)
    base = bytearray(metadata_v1_all())
    for position in range(4, len(base)):
        mutated = bytearray(base)
        mutated[position] = rng.randrange(256)
        send_and_drain(shared_broker.port, bytes(mutated), wait=0.05)
    assert_broker_answers(shared_broker.port)


@pytest.mark.parametrize("topic", ["__consumer_offsets", "__transaction_state"])
def test_a_client_may_not_write_into_the_coordinators_topics(shared_broker, topic):
    """A record a client could put into a coordinator's log would be loaded
    back as coordinator state (a forged commit, a group's offsets): the
    broker refuses the Produce, as Kafka does, and appends nothing."""
    from confluent_kafka import KafkaError, Producer

    from txn import Admin, TopicPartition

    with Admin(bootstrap_servers=shared_broker.bootstrap) as admin:  # both exist from the broker's start
        before = admin.list_offsets({TopicPartition(topic, 0): "latest"})[TopicPartition(topic, 0)].offset
    errors = []
    producer = Producer({"bootstrap.servers": shared_broker.bootstrap, "message.send.max.retries": 0})
    producer.produce(topic, b"forged coordinator record", key=b"forged", partition=0, on_delivery=lambda error, _message: errors.append(error))
    assert producer.flush(30) == 0
    assert len(errors) == 1 and errors[0] is not None and errors[0].code() == KafkaError.TOPIC_EXCEPTION, errors
    with Admin(bootstrap_servers=shared_broker.bootstrap) as admin:
        assert admin.list_offsets({TopicPartition(topic, 0): "latest"})[TopicPartition(topic, 0)].offset == before


@pytest.mark.parametrize("topic", ["__consumer_offsets", "__transaction_state"])
def test_the_coordinators_topics_can_be_neither_deleted_nor_resized_nor_truncated(shared_broker, topic):
    """Deleting one would drop every group's offsets or every transaction's
    state; more partitions would move ids to other partitions (an id's
    partition is hash modulo the count); deleting records would drop state
    the coordinator loads at its next start. Each is refused, as an invalid
    topic, and the topic keeps its partitions and records."""
    from confluent_kafka import KafkaError
    from confluent_kafka import TopicPartition as KafkaTopicPartition
    from confluent_kafka.admin import AdminClient, NewPartitions

    admin = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    refusals = [
        lambda: admin.create_partitions([NewPartitions(topic, 60)])[topic].result(15),
        lambda: list(admin.delete_records([KafkaTopicPartition(topic, 0, 0)]).values())[0].result(15),
        lambda: admin.delete_topics([topic])[topic].result(15),
    ]
    for attempt in refusals:
        with pytest.raises(Exception) as refused:
            attempt()
        assert refused.value.args[0].code() == KafkaError.TOPIC_EXCEPTION, refused.value
    metadata = admin.list_topics(topic, timeout=15).topics[topic]
    assert metadata.error is None and len(metadata.partitions) == 50
