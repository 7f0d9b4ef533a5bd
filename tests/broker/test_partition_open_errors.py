"""A partition whose log cannot be opened (partitions open when a request
first needs them) is answered KAFKA_STORAGE_ERROR, per partition, by every
handler that opens logs; the requester keeps its connection, the broker keeps
serving every other partition, and the next request tries the open again."""

from __future__ import annotations

import errno
import os
import threading
import urllib.request

from confluent_kafka import KafkaError, Producer

from broker.broker import EmbeddedBroker, FaultSeams
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from storage.durable import DiskIO
from tests.helpers import create_topic, raw_request, read_values

TOPIC = "lazy-open"


class NoOpenUnder(DiskIO):
    """Opens of files in one directory fail (EMFILE, as with a full fd table) while ``broken`` is set."""

    def __init__(self, directory_name: str):
        self.directory_name = f"/{directory_name}/"
        self.broken = threading.Event()
        self.refused = 0

    def open(self, path, flags):
        if self.broken.is_set() and self.directory_name in path:
            self.refused += 1
            raise OSError(errno.EMFILE, "Too many open files", path)
        return super().open(path, flags)


def produce_one(bootstrap: str, partition: int, value: bytes):
    """Produce one record with no retries; the delivery error (None if it was written)."""
    outcome = []
    producer = Producer({"bootstrap.servers": bootstrap, "retries": 0, "acks": "all", "message.timeout.ms": 20000})
    producer.produce(TOPIC, value=value, partition=partition, on_delivery=lambda error, _message: outcome.append(error))
    assert producer.flush(30) == 0, "the delivery report never came"
    return outcome[0]


def partition_codes(response: dict, topics_field: str, partitions_field: str, index_field: str) -> dict[int, int]:
    return {p[index_field]: p["error_code"] for t in response[topics_field] for p in t[partitions_field]}


def test_a_partition_that_cannot_open_gets_storage_errors_and_the_others_keep_working(tmp_path):
    disk = NoOpenUnder(f"{TOPIC}-1")
    with EmbeddedBroker(str(tmp_path), seams=FaultSeams(disk_io=disk), metrics_address=("127.0.0.1", 0)) as broker:
        create_topic(broker.bootstrap, TOPIC, 2)
        disk.broken.set()
        # A metrics scrape reports what is open and never opens a partition.
        with urllib.request.urlopen(broker.metrics_url, timeout=10) as scrape:
            assert scrape.status == 200 and scrape.read()
        assert disk.refused == 0 and not broker.call(lambda b: b.replicas.is_open(TOPIC, 1))

        # A real client: its record for the broken partition fails with
        # KAFKA_STORAGE_ERROR; the other partition takes its record.
        error = produce_one(broker.bootstrap, 1, b"lost?")
        assert error is not None and error.code() == KafkaError.KAFKA_STORAGE_ERROR, error
        assert produce_one(broker.bootstrap, 0, b"kept") is None
        assert disk.refused >= 1

        # Every handler that opens logs answers the partition, not the connection.
        port = broker.port
        fetched = raw_request(port, ApiKey.FETCH, 4, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
            "topics": [{"topic": TOPIC, "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20},
                {"partition": 1, "fetch_offset": 0, "partition_max_bytes": 1 << 20},
            ]}],
        })
        assert partition_codes(fetched, "responses", "partitions", "partition_index") == {0: ErrorCode.NONE, 1: ErrorCode.KAFKA_STORAGE_ERROR}
        listed = raw_request(port, ApiKey.LIST_OFFSETS, 1, {
            "replica_id": -1,
            "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": -1}, {"partition_index": 1, "timestamp": -1}]}],
        })
        assert partition_codes(listed, "topics", "partitions", "partition_index") == {0: ErrorCode.NONE, 1: ErrorCode.KAFKA_STORAGE_ERROR}
        assert [p["offset"] for t in listed["topics"] for p in t["partitions"] if p["partition_index"] == 0] == [1]
        deleted = raw_request(port, ApiKey.DELETE_RECORDS, 0, {
            "timeout_ms": 5000,
            "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "offset": 0}, {"partition_index": 1, "offset": 0}]}],
        })
        assert partition_codes(deleted, "topics", "partitions", "partition_index") == {0: ErrorCode.NONE, 1: ErrorCode.KAFKA_STORAGE_ERROR}
        described = raw_request(port, ApiKey.DESCRIBE_PRODUCERS, 0, {"topics": [{"name": TOPIC, "partition_indexes": [0, 1]}]})
        assert partition_codes(described, "topics", "partitions", "partition_index") == {0: ErrorCode.NONE, 1: ErrorCode.KAFKA_STORAGE_ERROR}
        marked = raw_request(port, ApiKey.WRITE_TXN_MARKERS, 0, {"markers": [{
            "producer_id": 4242, "producer_epoch": 0, "transaction_result": False, "coordinator_epoch": 0,
            "topics": [{"name": TOPIC, "partition_indexes": [1]}],
        }]})
        assert [p["error_code"] for m in marked["markers"] for t in m["topics"] for p in t["partitions"]] == [ErrorCode.KAFKA_STORAGE_ERROR]
        assert not broker.call(lambda b: b.replicas.is_open(TOPIC, 1)), "a failed open keeps nothing"

        # The disk recovers: the next request opens the partition, and nothing was lost.
        disk.broken.clear()
        assert produce_one(broker.bootstrap, 1, b"after") is None
        assert sorted(read_values(broker.bootstrap, TOPIC, partitions=2, expect=2)) == [b"after", b"kept"]


def test_a_partition_whose_recovery_fails_at_start_stays_offline_and_the_broker_serves(tmp_path):
    data_dir = str(tmp_path)
    with EmbeddedBroker(data_dir) as broker:
        create_topic(broker.bootstrap, TOPIC, 2)
        assert produce_one(broker.bootstrap, 0, b"zero") is None
        assert produce_one(broker.bootstrap, 1, b"one") is None
    # As after a crash: no partition vouches for its files, so start recovers both.
    for name in (".clean_shutdown", f"{TOPIC}-0/.clean_shutdown", f"{TOPIC}-1/.clean_shutdown"):
        os.remove(os.path.join(data_dir, name))
    disk = NoOpenUnder(f"{TOPIC}-1")
    disk.broken.set()
    with EmbeddedBroker(data_dir, seams=FaultSeams(disk_io=disk)) as broker:
        recovered = broker.call(lambda b: list(b.replicas.recovered_at_start))
        assert (TOPIC, 0) in recovered and (TOPIC, 1) not in recovered and disk.refused >= 1
        error = produce_one(broker.bootstrap, 1, b"refused")
        assert error is not None and error.code() == KafkaError.KAFKA_STORAGE_ERROR, error
        assert produce_one(broker.bootstrap, 0, b"zero again") is None
        disk.broken.clear()
        assert produce_one(broker.bootstrap, 1, b"one again") is None
        assert sorted(read_values(broker.bootstrap, TOPIC, partitions=2, expect=4)) == [b"one", b"one again", b"zero", b"zero again"]
