"""The fault proxy over real sockets: byte-level faults against a tiny echo
server, Kafka request framing, seeded schedules, and real Kafka clients going
through the proxy to an embedded broker that advertises the proxy's address."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
import types
import uuid

import pytest

from faults.proxy import (
    SCHEDULE_ACTIONS,
    SCHEDULE_KINDS,
    FaultProxy,
    KafkaRequestFramer,
    RequestHeader,
    ScheduledAction,
    ThreadedFaultProxy,
    client_id_is,
    random_schedule,
    run_schedule,
    run_schedule_async,
)
from faults.proxy_state import FetchRequestSeen, ResponseFramer, cut_fetch_response
from protocol.framing import ClientConnection, ServerConnection, encode_response
from protocol.messages import ApiKey
from protocol.records import encode_batch, split_partial_tail
from tests.helpers import broker_behind_proxy, create_topic, read_values, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUIET = 0.4  # how long "nothing arrives" is watched for


# ------------------------------------------------------------------ helpers


class EchoServer(socketserver.ThreadingTCPServer):
    """Echoes every byte back and keeps what each connection sent, in accept order."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        self.received: list[bytearray] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), EchoHandler)

    @property
    def port(self) -> int:
        return self.server_address[1]

    def received_total(self) -> bytes:
        with self.lock:
            return b"".join(bytes(part) for part in self.received)

    def wait_received(self, size: int, timeout: float = 5.0) -> bytes:
        deadline = time.monotonic() + timeout
        while len(self.received_total()) < size and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.received_total()


class EchoHandler(socketserver.BaseRequestHandler):
    def handle(self):
        with self.server.lock:
            mine = bytearray()
            self.server.received.append(mine)
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while data := self.request.recv(65536):
                with self.server.lock:
                    mine += data
                self.request.sendall(data)
        except OSError:
            pass


@pytest.fixture
def echo_server():
    server = EchoServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def raw_proxy(echo_server):
    with ThreadedFaultProxy("127.0.0.1", echo_server.port, kafka_framing=False, seed=7) as proxy:
        yield proxy


@pytest.fixture
def kafka_framed_proxy(echo_server):
    with ThreadedFaultProxy("127.0.0.1", echo_server.port) as proxy:
        yield proxy


_opened_sockets: list[socket.socket] = []


@pytest.fixture(autouse=True)
def close_test_sockets():
    yield
    while _opened_sockets:
        _opened_sockets.pop().close()


def connect(proxy, timeout: float = 5.0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    _opened_sockets.append(sock)
    sock.settimeout(timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.connect(("127.0.0.1", proxy.port))
    return sock


def receive_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError(f"end of stream after {len(data)} of {size} bytes")
        data += chunk
    return bytes(data)


def assert_nothing_arrives(sock: socket.socket, seconds: float = QUIET) -> None:
    sock.settimeout(seconds)
    with pytest.raises(socket.timeout):
        sock.recv(1)
    sock.settimeout(5.0)


def round_trip(sock: socket.socket, payload: bytes) -> tuple[bytes, float]:
    started = time.monotonic()
    sock.sendall(payload)
    return receive_exactly(sock, len(payload)), time.monotonic() - started


def request_frame(api_key: int, correlation_id: int, body: bytes = b"", *, api_version: int = 1, client_id: str | None = "tester") -> bytes:
    """A Kafka request frame with a v1 header (client id as int16-length string)."""
    if client_id is None:
        client = struct.pack(">h", -1)
    else:
        encoded = client_id.encode()
        client = struct.pack(">h", len(encoded)) + encoded
    rest = struct.pack(">hhi", api_key, api_version, correlation_id) + client + body
    return struct.pack(">i", len(rest)) + rest


# ------------------------------------------------------------------ plain forwarding


def test_forwards_both_ways_on_every_connection(raw_proxy, echo_server):
    sockets = [connect(raw_proxy) for _ in range(3)]
    for number, sock in enumerate(sockets):
        payload = f"hello from {number}".encode()
        assert round_trip(sock, payload)[0] == payload
    total = sum(len(f"hello from {number}") for number in range(3))
    counters = raw_proxy.counters()
    assert counters.upstream.bytes_forwarded == counters.downstream.bytes_forwarded == total
    assert counters.connections_accepted == 3
    assert raw_proxy.connection_count() == 3
    for sock in sockets:
        sock.close()
    wait_for(lambda: raw_proxy.connection_count() == 0)
    assert [event.detail["outcome"] for event in raw_proxy.events() if event.kind == "connection_closed"] == ["closed"] * 3


def test_large_payload_arrives_whole_and_in_order(raw_proxy):
    payload = os.urandom(3 * 1024 * 1024)
    sock = connect(raw_proxy)
    sender = threading.Thread(target=sock.sendall, args=(payload,))
    sender.start()
    assert receive_exactly(sock, len(payload)) == payload
    sender.join()
    sock.close()


def test_half_close_is_forwarded(raw_proxy):
    sock = connect(raw_proxy)
    sock.sendall(b"last words")
    sock.shutdown(socket.SHUT_WR)
    assert receive_exactly(sock, 10) == b"last words"
    assert sock.recv(1) == b""  # the echo server saw our EOF and closed: EOF comes back
    sock.close()


def test_a_bind_failure_reaches_the_caller(raw_proxy):
    with pytest.raises(OSError):
        ThreadedFaultProxy("127.0.0.1", 1, listen_port=raw_proxy.port).start()


def test_unreachable_target_resets_the_client(echo_server):
    unused = socket.create_server(("127.0.0.1", 0))
    port = unused.getsockname()[1]
    unused.close()
    with ThreadedFaultProxy("127.0.0.1", port, kafka_framing=False) as proxy:
        with pytest.raises((ConnectionResetError, EOFError, BrokenPipeError)):  # see test_refuse_...
            round_trip(connect(proxy), b"anyone?")
        assert proxy.counters().connections_failed == 1
        proxy.retarget("127.0.0.1", echo_server.port)
        assert round_trip(connect(proxy), b"found")[0] == b"found"


# ------------------------------------------------------------------ cut and refuse


def test_cut_resets_every_current_connection_and_new_ones_work(raw_proxy, echo_server):
    first, second = connect(raw_proxy), connect(raw_proxy)
    for sock in (first, second):
        round_trip(sock, b"ping")
    assert raw_proxy.cut() == 2
    for sock in (first, second):
        with pytest.raises(ConnectionResetError):
            round_trip(sock, b"ping")
    wait_for(lambda: raw_proxy.connection_count() == 0)
    assert round_trip(connect(raw_proxy), b"again")[0] == b"again"
    assert raw_proxy.counters().connections_cut == 2


def test_cut_drops_what_was_held(raw_proxy, echo_server):
    sock = connect(raw_proxy)
    raw_proxy.hold("upstream")
    sock.sendall(b"never delivered")
    wait_for(lambda: raw_proxy.counters().upstream.bytes_read == len(b"never delivered"))
    raw_proxy.cut()
    raw_proxy.release("upstream")
    wait_for(lambda: raw_proxy.counters().upstream.bytes_dropped == len(b"never delivered"))
    assert echo_server.received_total() == b""


def test_refuse_resets_new_connections_only(raw_proxy):
    established = connect(raw_proxy)
    round_trip(established, b"before")
    raw_proxy.refuse()
    # The kernel completes the handshake and the reset follows at once: it may
    # reach us while connect() is still returning, or on the first exchange.
    with pytest.raises((ConnectionResetError, EOFError, BrokenPipeError)):
        round_trip(connect(raw_proxy), b"let me in")
    assert round_trip(established, b"still here")[0] == b"still here"
    raw_proxy.refuse(on=False)
    assert round_trip(connect(raw_proxy), b"welcome")[0] == b"welcome"
    assert raw_proxy.counters().connections_refused == 1


# ------------------------------------------------------------------ blackhole, delay, hold


def test_blackhole_upstream_drops_bytes_and_keeps_the_connection(raw_proxy, echo_server):
    sock = connect(raw_proxy)
    raw_proxy.blackhole("upstream")
    sock.sendall(b"lost")
    assert_nothing_arrives(sock)
    assert echo_server.received_total() == b""
    raw_proxy.blackhole("upstream", on=False)
    assert round_trip(sock, b"found")[0] == b"found"
    counters = raw_proxy.counters()
    assert counters.upstream.bytes_dropped == 4
    assert counters.upstream.bytes_forwarded == 5
    assert counters.upstream.bytes_read == 9


def test_blackhole_downstream_lets_requests_through_but_no_answers(raw_proxy, echo_server):
    sock = connect(raw_proxy)
    raw_proxy.blackhole("downstream")
    sock.sendall(b"heard but unanswered")
    assert echo_server.wait_received(20) == b"heard but unanswered"
    assert_nothing_arrives(sock)
    wait_for(lambda: raw_proxy.counters().downstream.bytes_dropped == 20)


def test_delay_delivers_after_the_delay(raw_proxy):
    sock = connect(raw_proxy)
    round_trip(sock, b"warm")
    raw_proxy.delay("upstream", 0.3)
    echoed, elapsed = round_trip(sock, b"slow")
    assert echoed == b"slow" and elapsed >= 0.3
    raw_proxy.delay("both", 0.2)
    assert round_trip(sock, b"slower")[1] >= 0.4
    raw_proxy.delay("both", 0)
    assert round_trip(sock, b"fast")[1] < 0.3


def test_jitter_never_reorders(raw_proxy):
    sock = connect(raw_proxy)
    raw_proxy.delay("both", 0.01, jitter=0.05)
    pieces = [f"<{number}>".encode() for number in range(200)]
    for piece in pieces:
        sock.sendall(piece)
        time.sleep(0.001)
    expected = b"".join(pieces)
    assert receive_exactly(sock, len(expected)) == expected


def test_hold_buffers_until_release(raw_proxy, echo_server):
    sock = connect(raw_proxy)
    raw_proxy.hold("downstream")
    for piece in (b"one ", b"two ", b"three"):
        sock.sendall(piece)
    assert echo_server.wait_received(13) == b"one two three"
    assert_nothing_arrives(sock)
    raw_proxy.release("downstream")
    assert receive_exactly(sock, 13) == b"one two three"


def test_faults_apply_to_connections_opened_later(raw_proxy, echo_server):
    raw_proxy.blackhole("upstream")
    sock = connect(raw_proxy)
    sock.sendall(b"x")
    assert_nothing_arrives(sock)
    raw_proxy.heal()
    assert round_trip(sock, b"y")[0] == b"y"


def test_delay_connection_by_accept_index_lets_others_overtake(raw_proxy):
    slow, fast = connect(raw_proxy), connect(raw_proxy)  # accept indexes 0 and 1
    wait_for(lambda: raw_proxy.connection_count() == 2)
    raw_proxy.delay_connection(0, 0.8, direction="upstream")
    started = time.monotonic()
    slow.sendall(b"first sent")
    fast.sendall(b"second sent")
    assert receive_exactly(fast, 11) == b"second sent"
    fast_done = time.monotonic() - started
    assert receive_exactly(slow, 10) == b"first sent"
    slow_done = time.monotonic() - started
    assert fast_done < 0.5 <= 0.8 <= slow_done
    raw_proxy.clear_connection_delays()
    assert round_trip(slow, b"quick now")[1] < 0.5


def test_delay_connection_by_predicate_on_first_request(raw_proxy):
    raw_proxy.delay_connection(lambda first: first.startswith(b"slow"), 0.6)
    slow, fast = connect(raw_proxy), connect(raw_proxy)
    assert round_trip(fast, b"fast hello")[1] < 0.4
    echoed, elapsed = round_trip(slow, b"slow hello")
    assert echoed == b"slow hello" and elapsed >= 0.6
    assert round_trip(slow, b"later")[1] >= 0.6  # the whole connection stays matched


def test_fault_arguments_are_checked(raw_proxy):
    with pytest.raises(ValueError):
        raw_proxy.delay("sideways", 1.0)
    with pytest.raises(ValueError):
        raw_proxy.delay("both", -1.0)
    with pytest.raises(TypeError):
        raw_proxy.delay_connection("first", 1.0)
    with pytest.raises(ValueError, match="Kafka framing"):
        raw_proxy.delay_requests(ApiKey.END_TXN, 1.0)


# ------------------------------------------------------------------ counters and events


def test_event_log_records_faults_applied_and_cleared_in_order(raw_proxy):
    before = time.time()
    raw_proxy.blackhole("upstream")
    raw_proxy.blackhole("upstream", on=False)
    raw_proxy.delay("downstream", 0.1, jitter=0.05)
    raw_proxy.delay("downstream", 0)
    raw_proxy.hold()
    raw_proxy.release()
    raw_proxy.refuse()
    raw_proxy.refuse(False)
    raw_proxy.cut()
    raw_proxy.heal()
    events = raw_proxy.events(faults_only=True)
    assert [event.kind for event in events] == [
        "blackhole", "blackhole_cleared", "delay", "delay_cleared", "hold",
        "release", "refuse", "refuse_cleared", "cut", "heal",
    ]
    assert events[2].detail == {"direction": "downstream", "seconds": 0.1, "jitter": 0.05}
    times = [event.at for event in events]
    assert before <= times[0] and times == sorted(times)
    assert any(event.kind == "started" for event in raw_proxy.events())


def test_heal_returns_to_a_fresh_proxys_state(raw_proxy, echo_server):
    fresh = raw_proxy.faults_in_effect()
    raw_proxy.blackhole()
    raw_proxy.hold("upstream")
    raw_proxy.delay("downstream", 1.0)
    raw_proxy.refuse()
    raw_proxy.delay_connection(3, 1.0)
    assert raw_proxy.faults_in_effect() != fresh
    raw_proxy.heal()
    assert raw_proxy.faults_in_effect() == fresh


# ------------------------------------------------------------------ Kafka framing (sans-I/O)


def test_request_header_parse():
    frame = request_frame(ApiKey.END_TXN, 42, b"body", api_version=3, client_id="producer-1")
    # peek reads a frame after its int32 size prefix
    assert RequestHeader.peek(frame[4:]) == RequestHeader(ApiKey.END_TXN, 3, 42, "producer-1")
    assert RequestHeader.peek(request_frame(ApiKey.API_VERSIONS, 1, client_id=None)[4:]).client_id is None
    assert RequestHeader.peek(frame[4:11]) is None
    assert client_id_is("producer-1")(frame) and not client_id_is("other")(frame)


@pytest.mark.parametrize("piece_size", [None, 1, 3, 7])
def test_framer_gives_the_same_frames_whole_and_piecewise(piece_size):
    frames = [request_frame(ApiKey.METADATA, 1), request_frame(ApiKey.END_TXN, 2, b"x" * 300), request_frame(ApiKey.PRODUCE, 3, b"y" * 70000)]
    stream = b"".join(frames)
    framer = KafkaRequestFramer()
    pieces = [stream] if piece_size is None else [stream[i:i + piece_size] for i in range(0, len(stream), piece_size)]
    output = [item for piece in pieces for item in framer.feed(piece)]
    assert [frame for _header, frame in output] == frames
    assert [header.api_key for header, _frame in output] == [ApiKey.METADATA, ApiKey.END_TXN, ApiKey.PRODUCE]
    assert [header.correlation_id for header, _frame in output] == [1, 2, 3]
    assert framer.take_partial() == b"" and not framer.framing_lost


def test_framer_passes_a_non_kafka_stream_through():
    framer = KafkaRequestFramer(max_frame_bytes=1024)
    good = request_frame(ApiKey.METADATA, 1)
    assert framer.feed(good + b"GET / HTTP/1.1\r\n") == [(RequestHeader(ApiKey.METADATA, 1, 1, "tester"), good), (None, b"GET / HTTP/1.1\r\n")]
    assert framer.framing_lost
    assert framer.feed(b"more") == [(None, b"more")]


def test_framer_keeps_a_partial_frame_for_end_of_stream():
    framer = KafkaRequestFramer()
    frame = request_frame(ApiKey.PRODUCE, 9, b"payload")
    assert framer.feed(frame[:-3]) == []
    assert framer.take_partial() == frame[:-3]


# ------------------------------------------------------------------ fetch responses cut inside a batch


def response_frame(correlation_id: int, body: bytes) -> bytes:
    return struct.pack(">ii", 4 + len(body), correlation_id) + body


@pytest.mark.parametrize("piece_size", [None, 1, 5, 64])
def test_response_framer_holds_what_it_was_asked_for_and_passes_the_rest(piece_size):
    frames = [response_frame(1, b"a" * 10), response_frame(2, b"b" * 300), response_frame(3, b""), response_frame(4, b"d" * 70000)]
    stream = b"".join(frames)
    framer = ResponseFramer()
    framer.hold(2, "the second")
    pieces = [stream] if piece_size is None else [stream[i:i + piece_size] for i in range(0, len(stream), piece_size)]
    output = [item for piece in pieces for item in framer.feed(piece)]
    held = [(context, frame) for context, frame in output if context is not None]
    assert held == [("the second", frames[1])]
    position = [context for context, _frame in output].index("the second")
    assert b"".join(frame for context, frame in output[:position]) == frames[0]
    assert b"".join(frame for context, frame in output[position + 1:]) == frames[2] + frames[3]
    assert framer.take_partial() == b""


def test_response_framer_passes_chunks_as_they_come_when_nothing_is_held():
    framer = ResponseFramer()
    stream = response_frame(1, b"x" * 100) + response_frame(2, b"y" * 100)
    assert [framer.feed(stream[:150]), framer.feed(stream[150:])] == [[(None, stream[:150])], [(None, stream[150:])]]
    framer = ResponseFramer(max_frame_bytes=1024)
    assert framer.feed(b"HTTP/1.1 200 OK\r\n") == [(None, b"HTTP/1.1 200 OK\r\n")] and framer.framing_lost


def batches(count: int) -> list[bytes]:
    return [encode_batch([(b"k", b"v" * (20 + n), (), 1000)], base_offset=n) for n in range(count)]


def fetch_exchange(version: int, partition_max_bytes: int = 1 << 20):
    """A client, the Fetch request frame it sent and the response frame:
    partition 0 answers three batches, partition 1 one batch, partition 2
    nothing."""
    name = {"topic": "t"} if version < 13 else {"topic_id": uuid.UUID(int=7)}
    client = ClientConnection(client_id="cut-test")
    correlation_id, request = client.send_request(ApiKey.FETCH, version, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 1,
        "topics": [{**name, "partitions": [{"partition": p, "fetch_offset": 0, "partition_max_bytes": partition_max_bytes} for p in range(3)]}],
    })
    records = {0: b"".join(batches(3)), 1: batches(1)[0], 2: None}
    body = {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [{**name, "partitions": [
        {"partition_index": p, "error_code": 0, "high_watermark": 3, "last_stable_offset": 3, "log_start_offset": 0, "aborted_transactions": [], "records": records[p]}
        for p in range(3)
    ]}]}
    return client, request, bytes(encode_response(ApiKey.FETCH, version, correlation_id, body)), records


@pytest.mark.parametrize("version", [4, 11, 12, 13, 17])
def test_tail_cut_ends_a_partition_inside_its_last_batch_and_reframes(version):
    last_batch_start = sum(len(batch) for batch in batches(2))
    kept_sizes = set()
    for seed in range(20):
        client, request, response, records = fetch_exchange(version)
        seen = FetchRequestSeen.from_frame(request, "tail")
        assert seen.widened is None and seen.api_version == version
        cut, cuts = cut_fetch_response(response, seen, random.Random(seed))
        assert [(c["partition"], c["kept"] + c["dropped"]) for c in cuts] == [(0, len(records[0]))]
        client.receive_data(cut)  # parses only if the sizes were fixed up
        answer = client.next_response().body["responses"][0]["partitions"]
        kept = bytes(answer[0]["records"])
        assert records[0].startswith(kept) and last_batch_start < len(kept) < len(records[0])
        assert split_partial_tail(kept)[0] == last_batch_start
        assert bytes(answer[1]["records"]) == records[1], "one batch: Kafka sends the first batch whole"
        assert answer[2]["records"] is None and answer[0]["high_watermark"] == 3
        kept_sizes.add(len(kept))
    assert len(kept_sizes) > 5, "the cut falls at different bytes"


@pytest.mark.parametrize("version", [4, 12, 13])
def test_partition_max_bytes_cut_widens_the_request_and_slices_at_the_clients_limit(version):
    client, request, response, records = fetch_exchange(version, partition_max_bytes=100)
    seen = FetchRequestSeen.from_frame(request, "partition_max_bytes")
    server = ServerConnection()
    server.receive_data(seen.widened)
    widened = server.next_request()
    assert [p["partition_max_bytes"] for p in widened.body["topics"][0]["partitions"]] == [200, 200, 200]
    assert widened.correlation_id == struct.unpack_from(">i", request, 8)[0] and widened.client_id == "cut-test"
    cut, cuts = cut_fetch_response(response, seen, random.Random(0))
    assert [(c["partition"], c["kept"]) for c in cuts] == [(0, 100)]
    client.receive_data(cut)
    answer = client.next_response().body["responses"][0]["partitions"]
    assert bytes(answer[0]["records"]) == records[0][:100] and bytes(answer[1]["records"]) == records[1]


def test_cut_fetches_arguments_are_checked(raw_proxy, kafka_framed_proxy):
    with pytest.raises(ValueError, match="Kafka framing"):
        raw_proxy.cut_fetches()
    with pytest.raises(ValueError, match="mode"):
        kafka_framed_proxy.cut_fetches("middle")
    with pytest.raises(ValueError, match="times"):
        kafka_framed_proxy.cut_fetches("tail", times=0)
    kafka_framed_proxy.cut_fetches("tail", times=2)
    assert kafka_framed_proxy.faults_in_effect()["fetch_cut"] == {"mode": "tail", "remaining": 2}
    kafka_framed_proxy.heal()
    assert kafka_framed_proxy.faults_in_effect()["fetch_cut"] is None


# ------------------------------------------------------------------ Kafka request rules over sockets


def test_drop_requests_swallows_whole_frames(kafka_framed_proxy, echo_server):
    metadata, produce, another = request_frame(ApiKey.METADATA, 1), request_frame(ApiKey.PRODUCE, 2, b"p" * 100), request_frame(ApiKey.METADATA, 3)
    kafka_framed_proxy.drop_requests(api_key=ApiKey.PRODUCE)
    sock = connect(kafka_framed_proxy)
    # One write, so the dropped frame arrives in the middle of a chunk.
    sock.sendall(metadata + produce + another)
    assert receive_exactly(sock, len(metadata + another)) == metadata + another
    counters = kafka_framed_proxy.counters()
    assert (counters.requests_seen, counters.requests_dropped) == (3, 1)
    assert counters.upstream.bytes_dropped == len(produce)
    dropped = [event for event in kafka_framed_proxy.events() if event.kind == "request_dropped"]
    assert [(event.detail["api_key"], event.detail["correlation_id"]) for event in dropped] == [(0, 2)]


def test_drop_requests_times_then_lets_the_rest_through(kafka_framed_proxy):
    kafka_framed_proxy.drop_requests(api_key=ApiKey.PRODUCE, times=1)
    sock = connect(kafka_framed_proxy)
    first, retry = request_frame(ApiKey.PRODUCE, 1), request_frame(ApiKey.PRODUCE, 2)
    sock.sendall(first + retry)
    assert receive_exactly(sock, len(retry)) == retry
    assert kafka_framed_proxy.faults_in_effect()["request_rules"] == []


def test_delayed_request_holds_back_its_connection_but_not_others(kafka_framed_proxy):
    """TCP semantics: a delayed EndTxn keeps every later request of its
    connection behind it; another connection's requests overtake it."""
    kafka_framed_proxy.delay_requests(api_key=ApiKey.END_TXN, seconds=0.8)
    producer, other = connect(kafka_framed_proxy), connect(kafka_framed_proxy)
    end_txn, after_it, elsewhere = request_frame(ApiKey.END_TXN, 1), request_frame(ApiKey.METADATA, 2), request_frame(ApiKey.METADATA, 7)
    started = time.monotonic()
    producer.sendall(end_txn)
    producer.sendall(after_it)
    other.sendall(elsewhere)
    assert receive_exactly(other, len(elsewhere)) == elsewhere
    assert time.monotonic() - started < 0.5
    assert receive_exactly(producer, len(end_txn + after_it)) == end_txn + after_it
    assert time.monotonic() - started >= 0.8
    assert kafka_framed_proxy.counters().requests_delayed == 1


def test_delay_connection_by_client_id(kafka_framed_proxy):
    kafka_framed_proxy.delay_connection(client_id_is("laggard"), 0.6)
    laggard, prompt = connect(kafka_framed_proxy), connect(kafka_framed_proxy)
    assert round_trip(prompt, request_frame(ApiKey.API_VERSIONS, 1, client_id="prompt"))[1] < 0.4
    assert round_trip(laggard, request_frame(ApiKey.API_VERSIONS, 1, client_id="laggard"))[1] >= 0.6


# ------------------------------------------------------------------ schedules


def test_random_schedule_is_reproducible():
    first = random_schedule(1234, 60.0, SCHEDULE_KINDS)
    assert first == random_schedule(1234, 60.0, list(reversed(SCHEDULE_KINDS)))
    assert first != random_schedule(1235, 60.0, SCHEDULE_KINDS)
    assert all(isinstance(item, ScheduledAction) and item.action in SCHEDULE_ACTIONS for item in first)
    times = [item.at for item in first]
    assert times == sorted(times) and 0 <= times[0] and times[-1] <= 60.0
    long_run = random_schedule(1234, 600.0, SCHEDULE_KINDS)
    assert {item.action for item in long_run} >= set(SCHEDULE_KINDS) | {"release", "clear_requests", "clear_connection_delays"}


def test_random_schedule_does_not_depend_on_hash_order():
    """Kinds given as a set iterate in a per-process order; the schedule must not."""
    program = "from faults.proxy import random_schedule; print(random_schedule(5, 30.0, {'cut', 'hold', 'delay', 'refuse', 'blackhole'}))"
    outputs = {
        subprocess.run([sys.executable, "-c", program], cwd=REPO, env={**os.environ, "PYTHONHASHSEED": str(hash_seed)}, capture_output=True, text=True, check=True).stdout
        for hash_seed in (1, 2, 3)
    }
    assert len(outputs) == 1


def test_random_schedule_ends_healed():
    for seed in range(20):
        proxy = FaultProxy("127.0.0.1", 1)
        fresh = proxy.faults_in_effect()
        schedule = random_schedule(seed, 20.0, SCHEDULE_KINDS)
        for item in schedule:
            getattr(proxy, item.action)(**item.args)
        assert proxy.faults_in_effect() == fresh, (seed, schedule)


def test_random_schedule_rejects_unknown_kinds():
    with pytest.raises(ValueError):
        random_schedule(1, 10.0, ["meteor"])


def test_run_schedule_applies_actions_on_time(raw_proxy):
    schedule = [(0.0, "hold", {"direction": "upstream"}), (0.2, "release", {"direction": "upstream"}), (0.3, "cut", {})]
    started, started_at = time.monotonic(), time.time()  # events are stamped by the proxy's clock, time.time
    assert run_schedule(raw_proxy, schedule) == 3
    assert time.monotonic() - started >= 0.3
    events = raw_proxy.events(faults_only=True)
    assert [event.kind for event in events] == ["hold", "release", "cut"]
    # Each action comes no earlier than its time after the start; the gap
    # between two stamps is no bound (the first may reach the loop late).
    assert events[1].at - started_at >= 0.2 and events[2].at - started_at >= 0.3
    with pytest.raises(ValueError, match="not a schedule action"):
        run_schedule(raw_proxy, [(0.0, "stop", {})])


def test_run_schedule_stops_early(raw_proxy):
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    assert run_schedule(raw_proxy, [(0.0, "hold", {}), (5.0, "release", {})], stop=stop) == 1


def test_run_schedule_async_on_a_fault_proxy(echo_server):
    async def scenario():
        async with FaultProxy("127.0.0.1", echo_server.port, kafka_framing=False) as proxy:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            player = asyncio.create_task(run_schedule_async(proxy, [(0.0, "hold", {}), (0.3, "release", {})]))
            started = asyncio.get_running_loop().time()
            writer.write(b"held")
            assert await asyncio.wait_for(reader.readexactly(4), 5) == b"held"
            assert asyncio.get_running_loop().time() - started >= 0.25
            await player
            writer.close()
        return proxy.events(faults_only=True)

    assert [event.kind for event in asyncio.run(scenario())] == ["hold", "release"]


# ------------------------------------------------------------------ real Kafka clients


@pytest.fixture
def proxied_broker(tmp_path):
    """An embedded broker that advertises the proxy, so clients never go around it
    (``tests.helpers.broker_behind_proxy``)."""
    with broker_behind_proxy(str(tmp_path / "data")) as (proxy, broker):
        yield types.SimpleNamespace(proxy=proxy, broker=broker, bootstrap=proxy.address)


def test_without_advertising_the_proxy_clients_go_around_it(embedded_broker):
    """The pitfall ``proxied_broker`` avoids: after bootstrapping through the
    proxy, a client follows Metadata to the broker's own address, and faults on
    the proxy no longer touch its produce requests."""
    from confluent_kafka import Producer

    with ThreadedFaultProxy("127.0.0.1", embedded_broker.port) as proxy:
        proxy.drop_requests(api_key=ApiKey.PRODUCE)
        producer = Producer({"bootstrap.servers": proxy.address, "linger.ms": 1})
        for number in range(10):
            producer.produce("around", value=b"%d" % number)
        assert producer.flush(20) == 0
        assert proxy.counters().requests_dropped == 0
        del producer  # destroyed now, before the proxy goes away, so it does not retry a dead port


def test_confluent_producer_through_the_proxy(proxied_broker):
    from confluent_kafka import Producer

    topic = f"plain-{uuid.uuid4().hex[:8]}"
    create_topic(proxied_broker.bootstrap, topic)
    producer = Producer({"bootstrap.servers": proxied_broker.bootstrap, "linger.ms": 1, "enable.idempotence": True})
    for number in range(100):
        producer.produce(topic, value=b"%d" % number)
    assert producer.flush(20) == 0
    assert sorted(read_values(proxied_broker.bootstrap, topic, partitions=3, expect=100)) == sorted(b"%d" % number for number in range(100))
    counters = proxied_broker.proxy.counters()
    assert counters.requests_seen > 0 and counters.upstream.bytes_forwarded > 0


@pytest.mark.slow
def test_idempotent_producer_survives_cuts_without_loss_or_duplicates(proxied_broker):
    from confluent_kafka import Producer

    proxy = proxied_broker.proxy
    topic = f"cut-{uuid.uuid4().hex[:8]}"
    create_topic(proxied_broker.bootstrap, topic)
    failures = []
    producer = Producer({
        "bootstrap.servers": proxied_broker.bootstrap,
        "enable.idempotence": True,
        "linger.ms": 2,
        "batch.num.messages": 50,
        "reconnect.backoff.ms": 20,
        "reconnect.backoff.max.ms": 200,
    })
    total = 4000
    for number in range(total):
        producer.produce(topic, key=b"%d" % (number % 7), value=b"%d" % number, on_delivery=lambda error, message: error and failures.append(error))
        producer.poll(0)
        if number % 1000 == 500:
            time.sleep(0.01)  # let produce requests get in flight, then cut them off
            wait_for(lambda: proxy.cut() > 0, timeout=20)  # as soon as the client is connected again
    assert producer.flush(60) == 0
    assert failures == []
    assert proxy.counters().connections_cut >= 4
    values = read_values(proxied_broker.bootstrap, topic, partitions=3, expect=total)
    assert len(values) == total  # nothing written twice
    assert set(values) == {b"%d" % number for number in range(total)}  # nothing lost


@pytest.mark.slow
def test_idempotent_producer_retries_a_dropped_produce_request(proxied_broker):
    from confluent_kafka import Producer

    proxy = proxied_broker.proxy
    topic = f"drop-{uuid.uuid4().hex[:8]}"
    create_topic(proxied_broker.bootstrap, topic, partitions=1)
    producer = Producer({"bootstrap.servers": proxied_broker.bootstrap, "enable.idempotence": True, "linger.ms": 1, "request.timeout.ms": 1500, "socket.timeout.ms": 2000})
    producer.produce(topic, value=b"warm-up")
    assert producer.flush(20) == 0
    proxy.drop_requests(api_key=ApiKey.PRODUCE, times=1)
    started = time.monotonic()
    producer.produce(topic, value=b"once")
    assert producer.flush(30) == 0
    assert time.monotonic() - started >= 1.5  # the client waited out socket.timeout.ms
    assert proxy.counters().requests_dropped == 1
    assert sorted(read_values(proxied_broker.bootstrap, topic, partitions=1, expect=2)) == [b"once", b"warm-up"]


@pytest.mark.slow
def test_transactional_commit_waits_for_a_delayed_end_txn(proxied_broker):
    from confluent_kafka import Producer

    proxy = proxied_broker.proxy
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    create_topic(proxied_broker.bootstrap, topic)
    producer = Producer({"bootstrap.servers": proxied_broker.bootstrap, "transactional.id": f"delayed-{uuid.uuid4()}", "linger.ms": 1})
    producer.init_transactions(20)
    producer.begin_transaction()
    for number in range(20):
        producer.produce(topic, value=b"%d" % number)
    assert producer.flush(20) == 0
    proxy.delay_requests(api_key=ApiKey.END_TXN, seconds=1.5)
    started = time.monotonic()
    producer.commit_transaction(30)
    assert time.monotonic() - started >= 1.5
    delayed = [event for event in proxy.events() if event.kind == "request_delayed"]
    assert [event.detail["api_key"] for event in delayed] == [ApiKey.END_TXN]
    proxy.clear_requests(ApiKey.END_TXN)
    assert sorted(read_values(proxied_broker.bootstrap, topic, partitions=3, expect=20)) == sorted(b"%d" % number for number in range(20))


def test_librdkafka_reads_through_cut_fetches(proxied_broker):
    """The cut is shaped like Apache Kafka's: librdkafka, which reads Kafka's
    answers every day, takes the cut answers and reads every record once."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = f"cut-fetch-{uuid.uuid4().hex[:8]}"
    create_topic(proxied_broker.bootstrap, topic, partitions=1)
    producer = Producer({"bootstrap.servers": proxied_broker.bootstrap, "linger.ms": 1, "batch.num.messages": 20})
    values = [b"%04d-" % number + b"x" * 60 for number in range(1000)]
    for value in values:
        producer.produce(topic, value=value)
    assert producer.flush(20) == 0
    proxy = proxied_broker.proxy
    proxy.cut_fetches("tail")
    consumer = Consumer({"bootstrap.servers": proxied_broker.bootstrap, "group.id": f"cut-{uuid.uuid4()}", "enable.auto.commit": False, "max.partition.fetch.bytes": 8192})
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen = []
    deadline = time.monotonic() + 30
    try:
        while len(seen) < len(values) and time.monotonic() < deadline:
            for message in consumer.consume(500, 0.2):
                assert message.error() is None, message.error()
                seen.append(message.value())
    finally:
        consumer.close()
    assert seen == values
    assert proxy.counters().fetch_responses_cut >= 10
