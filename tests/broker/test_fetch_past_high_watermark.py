"""A Fetch at an offset past the high watermark but within the log (records
appended and answered to an acks=1 producer, not yet durable) is answered
empty, without an error, as Kafka answers it; only an offset past the log's
end is OFFSET_OUT_OF_RANGE. A consumer that seeks to an offset its
producer was just told therefore waits for it instead of resetting.

The topic's ``flush.interval.ms`` holds the log's next fsync round back
for seconds, so the high watermark (the durable end) stays behind the log
end while the test looks."""

from __future__ import annotations

import time

import pytest

from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.records import encode_batch
from tests.helpers import raw_fetch, raw_request, recreate_topics

TOPIC = "fetch-past-high-watermark"
HELD_MS = 4_000  # the log's next fsync round waits this long after its last


def _produce(port: int, topic: str, value: bytes, acks: int) -> dict:
    data = [{"index": 0, "records": encode_batch([(None, value, (), 1_000)])}]
    answer = raw_request(port, ApiKey.PRODUCE, 8, {"transactional_id": None, "acks": acks, "timeout_ms": 10_000, "topic_data": [{"name": topic, "partition_data": data}]})
    return answer["responses"][0]["partition_responses"][0]


def _fetch(port: int, topic: str, offset: int, max_wait_ms: int = 0) -> dict:
    return raw_fetch(port, topic, [offset], max_wait_ms=max_wait_ms, max_bytes=1 << 20)["responses"][0]["partitions"][0]


def _held_back_topic(broker, name: str) -> None:
    """A topic whose first record is durable (acks=all: the log's first round
    runs at once) and whose second, sent with acks=1, waits ``HELD_MS`` for
    its round: high watermark 1, log end 2."""
    recreate_topics(broker.bootstrap, {name: 1}, configs={name: {"flush.interval.ms": str(HELD_MS)}})
    assert _produce(broker.port, name, b"durable", acks=-1)["error_code"] == 0
    appended = _produce(broker.port, name, b"appended", acks=1)
    assert appended["error_code"] == 0 and appended["base_offset"] == 1


def test_a_fetch_between_the_high_watermark_and_the_log_end_is_empty_not_out_of_range(module_broker):
    _held_back_topic(module_broker, TOPIC)
    began = time.monotonic()
    at_log_end = _fetch(module_broker.port, TOPIC, 2)
    at_high_watermark = _fetch(module_broker.port, TOPIC, 1)
    past_log_end = _fetch(module_broker.port, TOPIC, 3)
    assert time.monotonic() - began < HELD_MS / 1000 / 2, "the round came before the test looked: nothing was held back"
    assert at_log_end["high_watermark"] == 1
    assert at_log_end["error_code"] == ErrorCode.NONE
    assert not at_log_end["records"]
    assert at_high_watermark["error_code"] == ErrorCode.NONE and not at_high_watermark["records"]
    assert past_log_end["error_code"] == ErrorCode.OFFSET_OUT_OF_RANGE


@pytest.mark.slow  # waits out the held round
def test_a_long_poll_past_the_high_watermark_returns_the_records_once_durable(module_broker):
    topic = TOPIC + "-poll"
    _held_back_topic(module_broker, topic)
    began = time.monotonic()
    # Waits at offset 1 (the acks=1 record, not yet durable) until the held round makes it durable.
    answer = _fetch(module_broker.port, topic, 1, max_wait_ms=HELD_MS * 2)
    waited = time.monotonic() - began
    assert answer["error_code"] == ErrorCode.NONE
    assert answer["high_watermark"] == 2
    assert b"appended" in bytes(answer["records"])
    assert waited > 1.0, f"answered after {waited:.2f} s: the record was durable before the round it was held for"


@pytest.mark.slow  # waits out the held round
def test_a_real_consumer_seeking_to_a_just_appended_offset_waits_for_it_instead_of_resetting(module_broker):
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = TOPIC + "-consumer"
    _held_back_topic(module_broker, topic)
    consumer = Consumer({"bootstrap.servers": module_broker.bootstrap, "group.id": "past-hw", "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 2)])  # the log end: where the next record lands
        assert consumer.poll(1.0) is None  # nothing yet, and no reset to the earliest record
        producer = Producer({"bootstrap.servers": module_broker.bootstrap, "acks": "all"})
        producer.produce(topic, b"next", partition=0)
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 30
        seen = []
        while time.monotonic() < deadline and not seen:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen.append((message.offset(), message.value()))
        assert seen == [(2, b"next")]
    finally:
        consumer.close()
