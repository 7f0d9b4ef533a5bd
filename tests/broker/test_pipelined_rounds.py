"""Requests in flight on one connection share fsync rounds
(``storage.group_commit.FsyncRounds.arriving``, filled by ``broker.server``).

A librdkafka idempotent producer with small batches keeps two Produce
requests in flight and sends the next one as an answer reaches it: its bytes
come in just after the append that asked for a round, and a round started at
once covered one request each time (a bench run: 16,646 rounds for 16,667
appends). The test makes that moment exact on the broker's own loop, where a
librdkafka client's timing is not (on a loaded machine its requests shared
rounds now and then with or without the wait: 0.80-0.99 rounds per append
without it, 0.79-0.87 with it, four at once on two cores). And what the
server puts in that set leaves it: after clients that vanish mid-frame, with
requests unanswered, or held at the in-flight limit, it is empty again."""

from __future__ import annotations

import socket
import struct
import time

from broker.broker import EmbeddedBroker
from protocol.framing import ClientConnection
from protocol.messages import ApiKey
from protocol.records import encode_batch
from tests.helpers import create_topic, recreate_topics, wait_for

def test_a_request_read_after_the_append_that_asked_for_a_round_shares_it(tmp_path):
    """The moment a pipelining client meets, made exact: on the broker's loop,
    an append asks for a round, and in the same step the next Produce request
    is sent on a connection whose reader waits; the loop's next poll reads it
    before the round's turn. The round waits for it (one round for both);
    without the wait it covered the append alone and the request took a round
    of its own (two)."""
    with EmbeddedBroker(str(tmp_path / "data"), group_initial_rebalance_delay_ms=0) as embedded:
        create_topic(embedded.bootstrap, "pipelined", 1)
        with socket.create_connection(("127.0.0.1", embedded.port), timeout=10) as client:
            answers = ClientConnection(client_id="pipelined")

            def produce(sock: socket.socket) -> None:
                sock.sendall(answers.send_request(ApiKey.PRODUCE, 9, _produce_body("pipelined"))[1])

            def answer() -> dict:
                while (response := answers.next_response()) is None:
                    answers.receive_data(client.recv(1 << 16))
                return response.body

            produce(client)  # the connection is served, its reader waits for the next request
            assert answer()["responses"][0]["partition_responses"][0]["error_code"] == 0
            rounds = embedded.broker.fsync_rounds
            rounds_before, turns_before = rounds.rounds, rounds.settle_turns

            def append_then_send(broker) -> None:
                broker.replicas.get_log("pipelined", 0).append(encode_batch([(None, b"a" * 100, (), 1_700_000_000_000)]))
                produce(client)

            embedded.call(append_then_send)
            body = answer()
            assert body["responses"][0]["partition_responses"][0]["error_code"] == 0
            assert rounds.rounds - rounds_before == 1, f"{rounds.rounds - rounds_before} rounds for the append and the request read after it"
            assert rounds.settle_turns > turns_before


def _produce_body(topic: str, records: int = 1) -> dict:
    batch = encode_batch([(None, b"v" * 100, (), 1_700_000_000_000) for _ in range(records)])
    return {"transactional_id": None, "acks": -1, "timeout_ms": 5000, "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}


def _produce_frame(topic: str, records: int = 1) -> bytes:
    return ClientConnection(client_id="vanishing").send_request(ApiKey.PRODUCE, 9, _produce_body(topic, records))[1]


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
