"""Requests in flight on one connection share fsync rounds
(``storage.group_commit.FsyncRounds.arriving``, filled by ``broker.server``).

A librdkafka idempotent producer with small batches keeps Produce requests in
flight and sends the next one as each answer reaches it: the next request's
bytes come in just after the previous one's append asked for a round. A round
started at once covered one request each time (a bench run: 16,646 rounds for
16,667 requests); waiting the turn or two that request's append is away lets
the two share one fsync. And what the server puts in that set leaves it:
after clients that vanish mid-frame, with requests unanswered, or throttled
by a quota, it is empty again."""

from __future__ import annotations

import socket
import struct
import time

from broker.broker import EmbeddedBroker
from protocol.framing import ClientConnection
from protocol.messages import ApiKey
from protocol.records import encode_batch
from tests.helpers import create_topic, recreate_topics, wait_for

RECORDS = 1_500  # 1 KiB each; a 4 KiB batch holds three: at least 500 requests


def test_a_producer_with_requests_in_flight_shares_rounds(tmp_path):
    from confluent_kafka import Producer

    with EmbeddedBroker(str(tmp_path / "data"), group_initial_rebalance_delay_ms=0) as embedded:
        create_topic(embedded.bootstrap, "pipelined", 1)
        producer = Producer({"bootstrap.servers": embedded.bootstrap, "enable.idempotence": True, "acks": "all",
                             "linger.ms": 1, "batch.size": 4096, "queue.buffering.max.messages": 100_000})
        producer.produce("pipelined", b"first", partition=0)
        assert producer.flush(30) == 0  # connected, producer id given
        rounds = embedded.broker.fsync_rounds
        rounds_before = rounds.rounds
        for _ in range(RECORDS):
            producer.produce("pipelined", b"x" * 1024, partition=0)
        assert producer.flush(60) == 0
        rounds_taken = rounds.rounds - rounds_before
        requests_at_least = RECORDS // 3
        # One round per request without the settling (measured: 99.9%); two
        # requests per round with it.
        assert rounds_taken <= 0.75 * requests_at_least, f"{rounds_taken} rounds for at least {requests_at_least} requests"
        assert rounds.settle_turns > 0


def _produce_frame(topic: str, records: int = 1) -> bytes:
    batch = encode_batch([(None, b"v" * 100, (), 1_700_000_000_000) for _ in range(records)])
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 5000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}
    return ClientConnection(client_id="vanishing").send_request(ApiKey.PRODUCE, 9, body)[1]


def test_what_the_server_puts_on_the_way_leaves_it(tmp_path):
    """Receivers and request tasks leave ``arriving`` whatever becomes of
    them: half a frame then a close, requests pipelined then a close before
    any answer, a connection reset with bytes unread, bytes that come after
    a malformed frame stopped the connection's reader, a connection closed
    while its reader waits at the in-flight limit (never in the set: its
    bytes wait for room, not for a turn), and plain traffic."""
    with EmbeddedBroker(str(tmp_path / "data"), group_initial_rebalance_delay_ms=0) as embedded:
        create_topic(embedded.bootstrap, "vanish", 1)
        arriving = embedded.broker.fsync_rounds.arriving
        frame = _produce_frame("vanish")
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", embedded.port)) as half:
                half.sendall(frame[: len(frame) // 2])
            with socket.create_connection(("127.0.0.1", embedded.port)) as pipelined:
                pipelined.sendall(frame * 20)
            reset = socket.create_connection(("127.0.0.1", embedded.port))
            reset.sendall(frame * 5 + frame[:10])
            reset.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            reset.close()  # RST
            with socket.create_connection(("127.0.0.1", embedded.port)) as malformed:
                malformed.sendall(struct.pack(">i", 8) + b"\xff" * 8)  # no such api: the reader stops, the connection closes
                time.sleep(0.02)
                try:
                    malformed.sendall(frame * 5)  # bytes after the reader is gone
                except OSError:
                    pass
        # A connection at its in-flight limit (64 Produce requests waiting for
        # a round 5 s away): its reader stops, and what comes after stays unread
        # in its receiver until the peer goes; it is on its way to nothing, and
        # holds no round back.
        recreate_topics(embedded.bootstrap, {"held": 1}, configs={"held": {"flush.interval.ms": "5000"}})
        held_frame = _produce_frame("held")
        with socket.create_connection(("127.0.0.1", embedded.port)) as held:
            held.sendall(held_frame)  # answered by the log's first round; its next is 5 s away
            time.sleep(0.3)
            held.sendall(held_frame * 80)
            time.sleep(0.3)
            held.sendall(held_frame * 10)
            time.sleep(0.3)
            assert not arriving, "a connection whose reader waits at its in-flight limit is not on its way"
        with socket.create_connection(("127.0.0.1", embedded.port), timeout=10) as answered:
            answered.sendall(frame * 3)
            received = b""
            while received.count(b"vanish") < 3:
                received += answered.recv(1 << 16)
        wait_for(lambda: not arriving, 10, "the receivers and request tasks to leave FsyncRounds.arriving")
