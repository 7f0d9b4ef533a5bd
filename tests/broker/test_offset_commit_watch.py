"""The broker closes the connection of a producer whose TxnOffsetCommit is
overdue after its AddOffsetsToTxn (``broker.offset_commit_watch``), and only
that: the bookkeeping on its own, then raw requests over a real socket.
(``test_librdkafka_broker_restarts`` shows the client it is for.)"""

from __future__ import annotations

import socket
import time

import pytest

from broker.offset_commit_watch import PendingOffsetCommits
from protocol.errors import ErrorCode
from protocol.framing import ClientConnection
from protocol.messages import ApiKey
from tests.conftest import module_broker as broker  # noqa: F401  (with MODULE_BROKER_CONFIG)

STALL_MS = 200
MODULE_BROKER_CONFIG = (f"transaction.offset.commit.stall.ms={STALL_MS}",)


def test_waits_fall_due_in_order_and_progress_ends_them():
    closes = {name: (lambda reason, name=name: None) for name in "abc"}
    pending = PendingOffsetCommits(wait_seconds=0.5)
    pending.offsets_added("a", closes["a"], now=10.0)
    pending.offsets_added("b", closes["b"], now=10.2)
    pending.offsets_added("c", closes["c"], now=10.3)
    pending.progressed("b")  # its TxnOffsetCommit came
    pending.offsets_added("a", closes["a"], now=10.4)  # a second AddOffsetsToTxn: its wait starts again
    assert pending.next_due() == pytest.approx(10.8)
    assert pending.due(10.79) == []
    assert pending.due(10.8) == [("c", closes["c"])]
    assert pending.due(11.0) == [("a", closes["a"])]
    assert len(pending) == 0 and pending.next_due() is None


class Wire:
    """One raw Kafka connection: requests in order, answers decoded."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.connection = ClientConnection(client_id="watch-test")

    def request(self, api_key: int, version: int, body: dict) -> dict:
        _correlation, frame = self.connection.send_request(api_key, version, body)
        self.sock.sendall(frame)
        while True:
            response = self.connection.next_response()
            if response is not None:
                return response.body
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the broker closed the connection")
            self.connection.receive_data(data)

    def closed_within(self, seconds: float) -> bool:
        """Whether the broker closes the connection within ``seconds`` (nothing is sent meanwhile)."""
        self.sock.settimeout(seconds)
        try:
            return self.sock.recv(1) == b""
        except TimeoutError:
            return False
        finally:
            self.sock.settimeout(10)

    def close(self) -> None:
        self.sock.close()


def offsets_added(port: int, transactional_id: str) -> tuple[Wire, int, int]:
    wire = Wire(port)
    init = wire.request(ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": transactional_id, "transaction_timeout_ms": 60_000, "producer_id": -1, "producer_epoch": -1})
    assert init["error_code"] == ErrorCode.NONE
    producer_id, epoch = init["producer_id"], init["producer_epoch"]
    added = wire.request(ApiKey.ADD_OFFSETS_TO_TXN, 3, {"transactional_id": transactional_id, "producer_id": producer_id, "producer_epoch": epoch, "group_id": "g"})
    assert added["error_code"] == ErrorCode.NONE
    return wire, producer_id, epoch


def commit_offsets(wire: Wire, transactional_id: str, producer_id: int, epoch: int) -> None:
    committed = wire.request(
        ApiKey.TXN_OFFSET_COMMIT,
        3,
        {"transactional_id": transactional_id, "group_id": "g", "producer_id": producer_id, "producer_epoch": epoch, "generation_id": -1, "member_id": "",
         "group_instance_id": None, "topics": [{"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 5, "committed_leader_epoch": -1, "committed_metadata": ""}]}]},
    )
    assert committed["topics"][0]["partitions"][0]["error_code"] == ErrorCode.NONE


def test_a_producer_that_never_commits_its_offsets_loses_that_connection(broker):
    wire, _producer_id, _epoch = offsets_added(broker.port, "stuck")
    started = time.monotonic()
    try:
        assert wire.closed_within(5), "the broker kept the stuck producer's connection open"
        assert time.monotonic() - started >= STALL_MS / 1000 * 0.9
    finally:
        wire.close()


def test_a_producer_that_commits_its_offsets_keeps_its_connection(broker):
    wire, producer_id, epoch = offsets_added(broker.port, "healthy")
    try:
        commit_offsets(wire, "healthy", producer_id, epoch)
        assert not wire.closed_within(STALL_MS / 1000 * 3)
        ended = wire.request(ApiKey.END_TXN, 3, {"transactional_id": "healthy", "producer_id": producer_id, "producer_epoch": epoch, "committed": True})
        assert ended["error_code"] == ErrorCode.NONE
    finally:
        wire.close()


def test_a_producer_that_aborts_instead_keeps_its_connection(broker):
    wire, producer_id, epoch = offsets_added(broker.port, "aborting")
    try:
        ended = wire.request(ApiKey.END_TXN, 3, {"transactional_id": "aborting", "producer_id": producer_id, "producer_epoch": epoch, "committed": False})
        assert ended["error_code"] == ErrorCode.NONE
        assert not wire.closed_within(STALL_MS / 1000 * 3)
    finally:
        wire.close()


def test_a_healthy_producer_slowed_by_a_loaded_machine_keeps_its_connection_under_the_default(embedded_broker):
    """A pause of 600 ms between AddOffsetsToTxn's answer and TxnOffsetCommit
    (a scheduling gap a machine under heavy load shows) is not a stall: the
    broker's default wait (it was 200 ms) leaves the connection alone."""
    wire, producer_id, epoch = offsets_added(embedded_broker.port, "slowed")
    try:
        assert not wire.closed_within(0.6), "the default closed a healthy client's connection"
        commit_offsets(wire, "slowed", producer_id, epoch)
    finally:
        wire.close()
