"""Client quotas over real sockets: set with our Admin (AlterClientQuotas),
read back (DescribeClientQuotas), kept across a restart, and enforced on
librdkafka's producer and consumer, whose measured byte rate stays near the
quota while a principal without one runs free."""

import json
import time

import pytest
from confluent_kafka import Consumer, Producer

from broker.broker import EmbeddedBroker
from tests.helpers import create_topic, wait_for
from txn import Admin
from txn.admin import ClientQuotaEntry
from txn.errors import InvalidConfigurationError

QUOTA = 200_000  # bytes/s
VALUE = b"x" * 1000
# Two one-second samples: the rate reacts within seconds (Kafka's default is 11).
FAST_WINDOW = {"quota.window.num": "2", "quota.window.size.seconds": "1"}


def start_broker(data_dir, properties=FAST_WINDOW):
    return EmbeddedBroker(str(data_dir), group_initial_rebalance_delay_ms=0, properties=dict(properties)).start()


def test_quotas_set_over_the_wire_are_described_and_survive_a_restart(tmp_path):
    broker = start_broker(tmp_path / "data")
    try:
        with Admin(bootstrap_servers=broker.bootstrap) as admin:
            admin.alter_client_quotas({"user": "alice"}, {"producer_byte_rate": 1024, "consumer_byte_rate": 4096})
            admin.alter_client_quotas({"user": None}, {"producer_byte_rate": 512})
            admin.alter_client_quotas({"user": "carol"}, {"producer_byte_rate": 1}, validate_only=True)
            with pytest.raises(InvalidConfigurationError, match="not a quota onceflow enforces"):
                admin.alter_client_quotas({"user": "bob"}, {"request_percentage": 50})
            with pytest.raises(InvalidConfigurationError, match="user quotas only"):
                admin.alter_client_quotas({"user": "bob", "client-id": "c"}, {"producer_byte_rate": 50})
            assert admin.describe_client_quotas("alice") == [ClientQuotaEntry((("user", "alice"),), {"consumer_byte_rate": 4096.0, "producer_byte_rate": 1024.0})]
    finally:
        broker.stop()
    broker = start_broker(tmp_path / "data")
    try:
        with Admin(bootstrap_servers=broker.bootstrap) as admin:
            everything = admin.describe_client_quotas()
            assert {entry.user: entry.values for entry in everything} == {
                None: {"producer_byte_rate": 512.0},
                "alice": {"consumer_byte_rate": 4096.0, "producer_byte_rate": 1024.0},
            }
            assert [entry.user for entry in admin.describe_client_quotas(None)] == [None]
            admin.alter_client_quotas({"user": "alice"}, {"consumer_byte_rate": None})
            assert admin.describe_client_quotas("alice")[0].values == {"producer_byte_rate": 1024.0}
        # The restarted broker enforces what it loaded, not only describes it.
        assert broker.call(lambda b: b.quotas.config.for_user("ANONYMOUS", "producer_byte_rate")) == 512.0
    finally:
        broker.stop()


class Stats:
    def __init__(self):
        self.throttle_max_ms = 0

    def __call__(self, text):
        for entry in json.loads(text).get("brokers", {}).values():
            self.throttle_max_ms = max(self.throttle_max_ms, entry.get("throttle", {}).get("max", 0))


def produce_for(bootstrap, topic, seconds, stats=None):
    """Produce as fast as librdkafka lets us for ``seconds``; the bytes
    acknowledged per second from the first acknowledgement on."""
    acknowledged = []
    config = {"bootstrap.servers": bootstrap, "batch.size": 16384, "linger.ms": 5, "acks": "all"}
    if stats is not None:
        config.update({"statistics.interval.ms": 200, "stats_cb": stats})
    producer = Producer(config)

    def delivered(error, message):
        if error is None:
            acknowledged.append((time.monotonic(), len(message.value())))

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            producer.produce(topic, VALUE, on_delivery=delivered)
        except BufferError:
            producer.poll(0.05)
            continue
        if len(producer) > 2000:
            producer.poll(0.01)  # a bounded backlog: we measure the broker's pace, not our queue
        else:
            producer.poll(0)
    end = time.monotonic()
    producer.purge()
    producer.flush(30)
    in_time = [(at, size) for at, size in acknowledged if at <= end]
    assert in_time, "nothing was acknowledged"
    return sum(size for _at, size in in_time) / (end - in_time[0][0])


@pytest.mark.slow
def test_a_producer_over_its_byte_rate_is_throttled_and_held_near_it(tmp_path):
    broker = start_broker(tmp_path / "data")
    try:
        create_topic(broker.bootstrap, "free", 1)
        create_topic(broker.bootstrap, "limited", 1)
        # First without a quota: the same producer is far faster, so the check below can fail.
        free_rate = produce_for(broker.bootstrap, "free", 2.0)
        assert free_rate > 3 * QUOTA, f"the unthrottled producer ran at only {free_rate:.0f} B/s"
        with Admin(bootstrap_servers=broker.bootstrap) as admin:
            admin.alter_client_quotas({"user": "ANONYMOUS"}, {"producer_byte_rate": QUOTA})
        stats = Stats()
        rate = produce_for(broker.bootstrap, "limited", 8.0, stats)
        assert 0.7 * QUOTA <= rate <= 1.3 * QUOTA, f"throttled producer ran at {rate:.0f} B/s against a quota of {QUOTA}"
        assert stats.throttle_max_ms > 0, "librdkafka saw no throttle_time_ms"
        # A quota for another user leaves this principal alone again.
        with Admin(bootstrap_servers=broker.bootstrap) as admin:
            admin.alter_client_quotas({"user": "ANONYMOUS"}, {"producer_byte_rate": None})
            admin.alter_client_quotas({"user": "someone-else"}, {"producer_byte_rate": QUOTA})
        assert produce_for(broker.bootstrap, "free", 2.0) > 3 * QUOTA
    finally:
        broker.stop()


def consume_for(bootstrap, topic, seconds, stats=None):
    config = {
        "bootstrap.servers": bootstrap, "group.id": f"g-{time.monotonic_ns()}", "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "fetch.max.bytes": 65536, "message.max.bytes": 65536, "max.partition.fetch.bytes": 65536,
    }
    if stats is not None:
        config.update({"statistics.interval.ms": 200, "stats_cb": stats})
    consumer = Consumer(config)
    consumer.subscribe([topic])
    received = []
    deadline = time.monotonic() + seconds + 30  # the first assignment may take a while under load
    started = None
    while time.monotonic() < deadline:
        message = consumer.poll(0.1)
        if message is None or message.error():
            continue
        now = time.monotonic()
        if started is None:
            started, deadline = now, now + seconds
        received.append(len(message.value()))
    consumer.close()
    assert started is not None, "nothing was consumed"
    return sum(received) / seconds


@pytest.mark.slow
def test_a_consumer_over_its_byte_rate_is_throttled_and_held_near_it(tmp_path):
    broker = start_broker(tmp_path / "data")
    try:
        create_topic(broker.bootstrap, "input", 1)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "batch.size": 16384})  # fetches of ~64 KB below
        for _ in range(6000):  # 6 MB: more than either consumer below reads
            producer.produce("input", VALUE)
            producer.poll(0)
        assert producer.flush(60) == 0
        free_rate = consume_for(broker.bootstrap, "input", 1.5)
        assert free_rate > 3 * QUOTA, f"the unthrottled consumer ran at only {free_rate:.0f} B/s"
        with Admin(bootstrap_servers=broker.bootstrap) as admin:
            admin.alter_client_quotas({"user": None}, {"consumer_byte_rate": QUOTA})  # the default: every user
        wait_for(lambda: broker.call(lambda b: b.quotas.config.for_user("ANONYMOUS", "consumer_byte_rate")) == QUOTA)
        stats = Stats()
        rate = consume_for(broker.bootstrap, "input", 8.0, stats)
        assert 0.7 * QUOTA <= rate <= 1.3 * QUOTA, f"throttled consumer ran at {rate:.0f} B/s against a quota of {QUOTA}"
        assert stats.throttle_max_ms > 0, "librdkafka saw no throttle_time_ms"
    finally:
        broker.stop()
