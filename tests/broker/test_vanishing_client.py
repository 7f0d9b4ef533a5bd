"""A client that vanishes while its request's coordinator write is out.

A connection that dies (reset by the peer) cancels the requests still in
flight on it: the writer of the answers fails on the dead socket and the
connection's TaskGroup cancels its siblings. A coordinator state change
started by such a request must still run to its end (write, then apply):
otherwise the transactional id stays busy (CONCURRENT_TRANSACTIONS until a
restart), or memory stays behind what ``__transaction_state`` /
``__consumer_offsets`` already hold.

Each test holds the durability of one internal topic's appends (a slow
fsync: the record is in the log, its writer waits), pipelines a long-polling
Fetch and the coordinator request on one connection, resets the connection,
waits until the broker has dropped it (so the request was cancelled: the
write is still held), releases the write, and then checks with a new client
that the change was applied without anyone asking again, that memory equals
the log, and that a restart finds the same.
"""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest

from broker.broker import EmbeddedBroker
from broker.replay import replay
from coordinator.state import TxnState
from coordinator.txn_log import TRANSACTION_STATE_TOPIC, decode_key, decode_value
from protocol.framing import ClientConnection
from protocol.messages import ApiKey
from tests.helpers import create_topic, raw_request, wait_for

pytestmark = pytest.mark.slow  # each waits out a 3 s long poll and restarts a broker

CONCURRENT_TRANSACTIONS = 51


class HeldDurability:
    """Holds the durability acknowledgement of every append to ``topic``
    until ``release()``: a slow fsync under that topic's partitions."""

    def __init__(self, broker: EmbeddedBroker, topic: str):
        self.broker = broker
        self.topic = topic
        self.waiting = 0  # writers held now (read from the test's thread)
        broker.call(self._install)

    def _install(self, broker) -> None:
        self.gate = asyncio.Event()
        for partition in range(broker.replicas.topics[self.topic].partitions):
            partition_log = broker.replicas.get_log(self.topic, partition)
            partition_log.wait_durable = self._held(partition_log.wait_durable)

    def _held(self, wait_durable):
        async def held(offset):
            self.waiting += 1
            try:
                await self.gate.wait()
            finally:
                self.waiting -= 1
            await wait_durable(offset)

        return held

    def release(self) -> None:
        self.broker.call(lambda broker: self.gate.set())


def fetch_long_poll(topic: str) -> tuple[int, int, dict]:
    """A Fetch of an empty partition that waits 3 s for data: its answer,
    written after the peer is gone, is what fails the connection's writer."""
    body = {"max_wait_ms": 3000, "min_bytes": 1, "isolation_level": 0, "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]}
    return ApiKey.FETCH, 4, body


def send_then_vanish(broker: EmbeddedBroker, held: HeldDurability, requests: list[tuple[int, int, dict]]) -> None:
    """Pipeline ``requests`` on one connection; once the last one's write is
    held, reset the connection (SO_LINGER 0: what a killed client with
    unread data does) and wait until the broker has dropped it."""
    connection = ClientConnection(client_id="vanishing")
    sock = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
    try:
        sock.sendall(b"".join(connection.send_request(api_key, version, body)[1] for api_key, version, body in requests))
        wait_for(lambda: held.waiting >= 1, 20, "the request's write to be held")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()
    # The broker drops the connection once the Fetch's answer fails to go
    # out: the held request, which cannot have finished (its write is
    # held until release()), is cancelled then.
    wait_for(lambda: broker.call(lambda b: b.server.open_connections) == 0, 30, "the broker to drop the dead connection")


def add_partition(transactional_id: str, producer_id: int, producer_epoch: int) -> tuple[int, int, dict]:
    body = {"v3_and_below_transactional_id": transactional_id, "v3_and_below_producer_id": producer_id, "v3_and_below_producer_epoch": producer_epoch, "v3_and_below_topics": [{"name": "vanish", "partitions": [0]}]}
    return ApiKey.ADD_PARTITIONS_TO_TXN, 3, body


def state_on_disk(broker, transactional_id: str) -> TxnState:
    last = None
    for partition in range(broker.replicas.topics[TRANSACTION_STATE_TOPIC].partitions):
        for batch in replay(broker.replicas.get_log(TRANSACTION_STATE_TOPIC, partition)):
            for record in batch.records:
                if not batch.header.is_control and decode_key(record.key) == transactional_id:
                    last = decode_value(transactional_id, record.value)
    return last.state


def test_end_txn_of_a_vanished_client_is_decided_and_completed(tmp_path):
    data_dir = str(tmp_path / "data")
    transactional_id = "vanishing-producer"
    with EmbeddedBroker(data_dir) as broker:
        create_topic(broker.bootstrap, "vanish", 1)
        init = raw_request(broker.port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": transactional_id, "transaction_timeout_ms": 60000})
        pid, epoch = init["producer_id"], init["producer_epoch"]
        added = raw_request(broker.port, *add_partition(transactional_id, pid, epoch))
        assert added["results_by_topic_v3_and_below"][0]["results_by_partition"][0]["partition_error_code"] == 0
        held = HeldDurability(broker, TRANSACTION_STATE_TOPIC)
        end_txn = (ApiKey.END_TXN, 3, {"transactional_id": transactional_id, "producer_id": pid, "producer_epoch": epoch, "committed": True})
        send_then_vanish(broker, held, [fetch_long_poll("vanish"), end_txn])
        held.release()

        # The client's retry: answered CONCURRENT_TRANSACTIONS while the
        # markers are written, then success (the commit happened).
        def retried():
            error = raw_request(broker.port, *end_txn)["error_code"]
            assert error in (0, CONCURRENT_TRANSACTIONS), error
            return error == 0

        wait_for(retried, 20, "the retried EndTxn to find the transaction committed")
        in_memory = broker.call(lambda b: b.transactions.coordinator.txns[transactional_id].state)
        assert in_memory == TxnState.COMPLETE_COMMIT
        assert broker.call(lambda b: state_on_disk(b, transactional_id)) == in_memory
    with EmbeddedBroker(data_dir) as broker:
        assert broker.call(lambda b: b.transactions.coordinator.txns[transactional_id].state) == TxnState.COMPLETE_COMMIT
        again = raw_request(broker.port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": transactional_id, "transaction_timeout_ms": 60000})
        assert (again["error_code"], again["producer_id"], again["producer_epoch"]) == (0, pid, epoch + 1)


def test_add_partitions_is_answered_and_applied_while_its_record_waits_for_its_fsync(tmp_path):
    """AddPartitionsToTxn has no write to wait for (answered once appended:
    nothing between its checks and its apply awaits), so a client that
    vanishes cannot leave it half done; its record is in the log before the
    answer, and the id is free for the next request."""
    transactional_id = "vanishing-adder"
    with EmbeddedBroker(str(tmp_path / "data")) as broker:
        create_topic(broker.bootstrap, "vanish", 1)
        init = raw_request(broker.port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": transactional_id, "transaction_timeout_ms": 60000})
        pid, epoch = init["producer_id"], init["producer_epoch"]
        held = HeldDurability(broker, TRANSACTION_STATE_TOPIC)
        added = raw_request(broker.port, *add_partition(transactional_id, pid, epoch))
        assert added["results_by_topic_v3_and_below"][0]["results_by_partition"][0]["partition_error_code"] == 0
        assert held.waiting == 0
        assert broker.call(lambda b: b.transactions.coordinator.txns[transactional_id].state) == TxnState.ONGOING
        assert broker.call(lambda b: state_on_disk(b, transactional_id)) == TxnState.ONGOING
        held.release()
        end_txn = raw_request(broker.port, ApiKey.END_TXN, 3, {"transactional_id": transactional_id, "producer_id": pid, "producer_epoch": epoch, "committed": False})
        assert end_txn["error_code"] == 0, "the id is not left busy"


def test_sync_group_of_a_vanished_leader_is_applied(tmp_path):
    data_dir = str(tmp_path / "data")
    with EmbeddedBroker(data_dir, group_initial_rebalance_delay_ms=0) as broker:
        create_topic(broker.bootstrap, "vanish", 1)

        def join(member_id=""):
            body = {"group_id": "vanishing", "session_timeout_ms": 30000, "rebalance_timeout_ms": 30000, "member_id": member_id, "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b""}]}
            return raw_request(broker.port, ApiKey.JOIN_GROUP, 5, body)

        def described():
            return raw_request(broker.port, ApiKey.DESCRIBE_GROUPS, 5, {"groups": ["vanishing"], "include_authorized_operations": False})["groups"][0]

        joined = join(join()["member_id"])
        assert joined["error_code"] == 0 and joined["leader"] == joined["member_id"]
        held = HeldDurability(broker, "__consumer_offsets")
        sync = (ApiKey.SYNC_GROUP, 3, {"group_id": "vanishing", "generation_id": joined["generation_id"], "member_id": joined["member_id"], "assignments": [{"member_id": joined["member_id"], "assignment": b"mine"}]})
        send_then_vanish(broker, held, [fetch_long_poll("vanish"), sync])
        assert described()["group_state"] == "CompletingRebalance"
        held.release()
        # Nobody asks again: the written assignment is applied all the same.
        wait_for(lambda: described()["group_state"] == "Stable", 20, "the written assignment to be applied")
        assert described()["members"][0]["member_assignment"] == b"mine"
        answer = raw_request(broker.port, *sync)
        assert (answer["error_code"], answer["assignment"]) == (0, b"mine")
    with EmbeddedBroker(data_dir, group_initial_rebalance_delay_ms=0) as broker:
        after = raw_request(broker.port, ApiKey.DESCRIBE_GROUPS, 5, {"groups": ["vanishing"], "include_authorized_operations": False})["groups"][0]
        assert after["group_state"] == "Stable" and after["members"][0]["member_assignment"] == b"mine"


def test_offset_commit_of_a_vanished_client_is_cached(tmp_path):
    data_dir = str(tmp_path / "data")

    def committed(broker):
        fetched = raw_request(broker.port, ApiKey.OFFSET_FETCH, 6, {"group_id": "vanishing-offsets", "topics": None})
        return {(t["name"], p["partition_index"]): p["committed_offset"] for t in fetched["topics"] for p in t["partitions"]}

    with EmbeddedBroker(data_dir) as broker:
        create_topic(broker.bootstrap, "vanish", 1)
        held = HeldDurability(broker, "__consumer_offsets")
        commit = (ApiKey.OFFSET_COMMIT, 7, {"group_id": "vanishing-offsets", "generation_id_or_member_epoch": -1, "member_id": "", "group_instance_id": None,
                                            "topics": [{"name": "vanish", "partitions": [{"partition_index": 0, "committed_offset": 7, "committed_leader_epoch": -1, "committed_metadata": ""}]}]})
        send_then_vanish(broker, held, [fetch_long_poll("vanish"), commit])
        held.release()
        wait_for(lambda: committed(broker) == {("vanish", 0): 7}, 20, "the written offset to be served")
    with EmbeddedBroker(data_dir) as broker:
        assert committed(broker) == {("vanish", 0): 7}
