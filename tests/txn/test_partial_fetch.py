"""Fetch responses that end inside a record batch, as Apache Kafka's may (it
answers with a byte slice of its log): the fetcher at every cut of crafted
bytes, and our consumer reading through the fault proxy's fetch cut, with
both isolation levels; a first batch that never comes whole is a clear error
naming ``max.partition.fetch.bytes``, not a loop or a CRC error."""

from __future__ import annotations

import time
import types
import uuid

import pytest

from protocol.messages import ApiKey
from protocol.records import ControlType, encode_batch, encode_control_batch
from tests.helpers import broker_behind_proxy, raw_request
from txn import Admin, Consumer, Producer, RecordBatchTooLargeError, TopicPartition
from txn.config import ConsumerConfig
from txn.fetcher import fetched_partition

TP = TopicPartition("crafted", 0)


# ------------------------------------------------------------------ the fetcher, crafted bytes


def crafted_section():
    """Batches of one partition from offset 0, each with the offsets a
    read_committed and a read_uncommitted reader sees in it and its next
    offset; and the aborted transactions a broker would list for them."""
    batches = [
        # producer 7's transaction, aborted
        (encode_batch([(b"k", b"a%d" % n, (), 1000) for n in range(3)], base_offset=0, producer_id=7, producer_epoch=0, base_sequence=0, is_transactional=True), [], [0, 1, 2], 3),
        (encode_control_batch(ControlType.ABORT, producer_id=7, producer_epoch=0, coordinator_epoch=0, timestamp=1001, base_offset=3), [], [], 4),
        # producer 8's transaction, committed
        (encode_batch([(b"k", b"c%d" % n, (), 1002) for n in range(3)], base_offset=4, producer_id=8, producer_epoch=0, base_sequence=0, is_transactional=True), [4, 5, 6], [4, 5, 6], 7),
        (encode_control_batch(ControlType.COMMIT, producer_id=8, producer_epoch=0, coordinator_epoch=0, timestamp=1003, base_offset=7), [], [], 8),
        # no transaction
        (encode_batch([(None, b"p%d" % n, (), 1004) for n in range(2)], base_offset=8), [8, 9], [8, 9], 10),
    ]
    return batches, [{"producer_id": 7, "first_offset": 0}]


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_the_fetcher_reads_the_whole_batches_before_a_cut_at_any_byte(isolation):
    batches, aborted = crafted_section()
    data = b"".join(batch for batch, *_ in batches)
    config = ConsumerConfig(bootstrap_servers="127.0.0.1:9092", isolation_level=isolation, max_partition_fetch_bytes=len(data))
    ends = [sum(len(batch) for batch, *_ in batches[: count + 1]) for count in range(len(batches))]
    for cut in range(1, len(data) + 1):
        whole = sum(1 for end in ends if end <= cut)
        if whole == 0:
            with pytest.raises(RecordBatchTooLargeError, match="max.partition.fetch.bytes"):
                fetched_partition(data[:cut], aborted, tp=TP, fetch_offset=0, config=config)
            continue
        fetched = fetched_partition(data[:cut], aborted, tp=TP, fetch_offset=0, config=config)
        seen = [offsets for _batch, committed, uncommitted, _next in batches[:whole] for offsets in (committed if isolation == "read_committed" else uncommitted)]
        assert [record.offset for record in fetched.records] == seen, f"cut at byte {cut}"
        assert fetched.end == batches[whole - 1][3], f"cut at byte {cut}: the next fetch starts at the partial batch"


def test_a_first_batch_that_never_comes_whole_names_the_setting_and_its_size():
    batch = encode_batch([(b"k", b"v" * 200, (), 1000) for _ in range(10)], base_offset=40)
    config = ConsumerConfig(bootstrap_servers="127.0.0.1:9092", max_partition_fetch_bytes=1024)
    with pytest.raises(RecordBatchTooLargeError) as info:
        fetched_partition(batch[:1024], [], tp=TP, fetch_offset=40, config=config)
    message = str(info.value)
    assert f"is {len(batch)} bytes, of which the broker sent 1024" in message
    assert f"raise max.partition.fetch.bytes (now 1024) to at least {len(batch)}" in message
    with pytest.raises(RecordBatchTooLargeError, match=r"larger than the 7 bytes .* raise max.partition.fetch.bytes \(now 1024\)"):
        fetched_partition(batch[:7], [], tp=TP, fetch_offset=40, config=config)


# ------------------------------------------------------------------ our consumer through the proxy


@pytest.fixture(scope="module")
def proxied(tmp_path_factory):
    """A broker behind a fault proxy (``tests.helpers.broker_behind_proxy``:
    the shared ``module_broker`` cannot advertise a proxy's port), with one
    topic of transactions (every third aborted) in small batches."""
    with broker_behind_proxy(str(tmp_path_factory.mktemp("partial-fetch")), seed=27) as (proxy, broker):
        with Admin(bootstrap_servers=broker.bootstrap) as admin:
            admin.create_topics({"mixed": 1})
        producer = Producer(bootstrap_servers=broker.bootstrap, transactional_id=f"mixed-{uuid.uuid4()}")
        producer.init_transactions()
        committed, everything = [], []
        for number in range(40):
            producer.begin_transaction()
            values = [b"%02d-%d-" % (number, n) + b"x" * 40 for n in range(8)]
            for value in values:
                producer.send("mixed", value, partition=0)
            producer.flush()
            everything += values
            if number % 3 == 2:
                producer.abort_transaction()
            else:
                producer.commit_transaction()
                committed += values
        producer.close()
        yield types.SimpleNamespace(proxy=proxy, broker=broker, committed=committed, everything=everything)


def read_through(bootstrap: str, isolation: str, want: int, *, timeout: float = 20.0, **options) -> list[bytes]:
    consumer = Consumer(bootstrap_servers=bootstrap, isolation_level=isolation, **options)
    consumer.assign([TopicPartition("mixed", 0)])
    consumer.seek(TopicPartition("mixed", 0), 0)
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < want and time.monotonic() < deadline:
            values += [record.value for record in consumer.poll(0.2)]
        values += [record.value for record in consumer.poll(0.3)]  # nothing more may come
    finally:
        consumer.close()
    return values


@pytest.mark.parametrize("mode", ["tail", "partition_max_bytes"])
@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_our_consumer_reads_every_record_once_through_cut_fetches(proxied, mode, isolation):
    """Each answer holds a few batches (the limit is 2 KiB, a batch about
    0.5 KiB) and ends inside one: the consumer reads what came whole, in
    order, and fetches the rest next time."""
    proxy = proxied.proxy
    proxy.heal()
    cut_before = proxy.counters().fetch_responses_cut
    proxy.cut_fetches(mode)
    want = proxied.committed if isolation == "read_committed" else proxied.everything
    values = read_through(proxy.address, isolation, len(want), max_partition_fetch_bytes=2048)
    proxy.heal()
    assert values == want
    cuts = [event for event in proxy.events() if event.kind == "fetch_cut"]
    assert proxy.counters().fetch_responses_cut - cut_before >= 10, "most answers were cut"
    assert all(part["dropped"] > 0 for event in cuts for part in event.detail["partitions"])


def test_a_first_batch_larger_than_the_fetch_size_is_a_clear_error(proxied):
    """A broker that slices at ``partition_max_bytes`` exactly (before KIP-74)
    never sends a batch larger than it whole: the consumer says which setting
    to raise and to what, at once, instead of looping or blaming a CRC."""
    proxy, broker = proxied.proxy, proxied.broker
    topic = f"big-{uuid.uuid4().hex[:8]}"
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({topic: 1})
    producer = Producer(bootstrap_servers=broker.bootstrap, linger_ms=50)
    for _ in range(20):
        producer.send(topic, b"v" * 200, partition=0)
    producer.close()
    fetched = raw_request(broker.port, ApiKey.FETCH, 12, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
        "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}],
    })
    records = fetched["responses"][0]["partitions"][0]["records"]
    first_batch_size = int.from_bytes(records[8:12], "big") + 12
    assert first_batch_size > 2048
    proxy.heal()
    proxy.cut_fetches("partition_max_bytes")
    consumer = Consumer(bootstrap_servers=proxy.address, max_partition_fetch_bytes=1024)
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek(TopicPartition(topic, 0), 0)
    started = time.monotonic()
    try:
        with pytest.raises(RecordBatchTooLargeError) as info:
            for _ in range(50):
                consumer.poll(0.2)
    finally:
        consumer.close()
        proxy.heal()
    assert time.monotonic() - started < 5
    message = str(info.value)
    assert f"Fetch {topic}-0 at offset 0" in message
    assert f"is {first_batch_size} bytes, of which the broker sent 1024" in message
    assert f"raise max.partition.fetch.bytes (now 1024) to at least {first_batch_size}" in message
