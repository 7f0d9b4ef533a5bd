"""The shared test helpers that carry a rule of their own."""

from __future__ import annotations

from tests.helpers import read_values, recreate_topics
from txn import Producer


def test_recreated_topics_start_empty_when_an_earlier_attempt_left_them(embedded_broker):
    """A rerun (pytest-rerunfailures) of a test on its module's broker finds
    the topic its first attempt made, with that attempt's records."""
    recreate_topics(embedded_broker.bootstrap, {"rerun": 2})
    with Producer(bootstrap_servers=embedded_broker.bootstrap) as producer:
        producer.send("rerun", b"first attempt", partition=0).result(10)
    recreate_topics(embedded_broker.bootstrap, {"rerun": 2})  # the rerun: before, TOPIC_ALREADY_EXISTS
    with Producer(bootstrap_servers=embedded_broker.bootstrap) as producer:
        producer.send("rerun", b"second attempt", partition=1).result(10)
    assert read_values(embedded_broker.bootstrap, "rerun", partitions=2, isolation="read_uncommitted", expect=1) == [b"second attempt"]
