"""The runner reading through Fetch responses that end inside a record batch
(the fault proxy's fetch cut, shaped like Apache Kafka's byte-sliced
answers): its input and, after its state directory is lost, its changelog
restore both skip the partial tail and fetch it again; output and state stay
exactly once."""

from __future__ import annotations

import os
import shutil
import sys
from collections import Counter

import pytest

from faults.process import REPO
from tests.helpers import broker_behind_proxy, read_all
from tests.streaming.runner_support import changelog_state, create_topics, expected, payments
from txn import Producer

sys.path.insert(0, os.path.join(REPO, "examples"))
from payments_pipeline import build_app  # noqa: E402

FAST = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 300, "transaction_timeout_ms": 6000}


def send_in_small_batches(bootstrap: str, events) -> None:
    """About ten payments a batch, so that an answer holds several batches."""
    with Producer(bootstrap_servers=bootstrap, batch_size=512, linger_ms=1) as producer:
        for account, value in events:
            producer.send("payments", value.encode(), key=account.encode())
        producer.flush()


@pytest.mark.slow  # two app runs of a few seconds each
def test_balances_exactly_once_through_cut_fetches_and_a_restore(tmp_path):
    with broker_behind_proxy(str(tmp_path / "data"), seed=8, group_min_session_timeout_ms=1000) as (proxy, broker):
        create_topics(broker.bootstrap, partitions=2)
        events = payments(600, seed=3)
        send_in_small_batches(broker.bootstrap, events[:400])
        proxy.cut_fetches("tail")
        state_dir = str(tmp_path / "state")
        # A small fetch size: many answers, each holding a few batches and cut inside the last.
        first = build_app(proxy.address, state_dir, commit_records=40, max_partition_fetch_bytes=2048, **FAST)
        first.run(until_idle=1.5)
        cut_in_first_run = proxy.counters().fetch_responses_cut
        assert first.metrics["records_in"] == 400
        send_in_small_batches(broker.bootstrap, events[400:])
        shutil.rmtree(state_dir)  # the next run rebuilds its store from the changelog, through the cut
        second = build_app(proxy.address, state_dir, commit_records=40, max_partition_fetch_bytes=2048, **FAST)
        second.run(until_idle=1.5)
        assert second.metrics["records_in"] == 200 and second.metrics["restored_records"] > 0
        assert cut_in_first_run >= 3 and proxy.counters().fetch_responses_cut > cut_in_first_run
        proxy.heal()
        outputs, balances = expected(events)
        produced = Counter(record.value.decode() for record in read_all(broker.bootstrap, "balances", 2, expect=600))
        assert produced == Counter(outputs.values())
        assert changelog_state(broker.bootstrap, partitions=2) == balances
