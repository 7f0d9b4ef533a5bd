"""Requests in flight on one connection share fsync rounds
(``storage.group_commit.FsyncRounds.arriving``, filled by ``broker.server``).

A librdkafka idempotent producer with small batches keeps Produce requests in
flight and sends the next one as each answer reaches it: the next request's
bytes come in just after the previous one's append asked for a round. A round
started at once covered one request each time (a bench run: 16,646 rounds for
16,667 requests); waiting the turn or two that request's append is away lets
the two share one fsync. And what the server puts in that set leaves it:
after clients that vanish mid-frame, with requests unanswered, or held at
the in-flight limit, it is empty again."""

from __future__ import annotations

import socket
import struct
import time

from broker.broker import EmbeddedBroker
from protocol.framing import ClientConnection
from protocol.messages import ApiKey
from protocol.records import encode_batch
from faults.process import BrokerProcess
from tests.helpers import Scrape, create_topic, free_port, recreate_topics, wait_for

RECORDS = 1_500  # 1 KiB each; a 4 KiB batch holds three: at least 500 requests


def test_a_producer_with_requests_in_flight_shares_rounds(tmp_path):
    """A broker process of its own (a broker on a thread of the test's process
    shares its GIL with the client's callbacks, and can fall into step with
    the client so that each next request arrives during the fsync); the
    rounds and their appends from its metrics."""
    from confluent_kafka import Producer

    metrics_port = free_port()
    broker = BrokerProcess(str(tmp_path / "data"), "group.initial.rebalance.delay.ms=0", args=("--metrics", f"127.0.0.1:{metrics_port}")).start()
    try:
        create_topic(broker.bootstrap, "pipelined", 1)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all",
                             "linger.ms": 1, "batch.size": 4096, "queue.buffering.max.messages": 100_000})
        producer.produce("pipelined", b"first", partition=0)
        assert producer.flush(30) == 0  # connected, producer id given
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        before = Scrape(url)
        for _ in range(RECORDS):
            producer.produce("pipelined", b"x" * 1024, partition=0)
        assert producer.flush(60) == 0
        after = Scrape(url)
        rounds = after.value("onceflow_log_flush_round_appends_count") - before.value("onceflow_log_flush_round_appends_count")
        appends = after.value("onceflow_log_flush_round_appends_sum") - before.value("onceflow_log_flush_round_appends_sum")
        assert appends >= RECORDS // 3  # a 4 KiB batch holds at most three 1 KiB records: a request each
        # One round per request without the settling (a bench run: 16,646
        # rounds for 16,667 appends); two per round with it.
        assert rounds <= 0.75 * appends, f"{rounds:.0f} rounds for {appends:.0f} appends"
    finally:
        broker.kill()


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
