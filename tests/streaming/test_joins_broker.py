"""Tables and joins on the runner against a real broker process: a table
update stamped earlier but arriving later is applied first within
``max_task_idle_ms`` (and not with 0), a global table read whole before the
first record, co-partitioning refused by name when the partition counts
differ, and partition N of a table and its stream kept on one instance even
when a sticky assignor is asked for. Exactly once through SIGKILLs:
examples/enrichment.py in test_dataflow_chaos.py."""

from __future__ import annotations

import json
import threading
import time

import pytest

import streaming
from faults.process import BrokerProcess
from tests.helpers import read_all
from txn import Admin, Producer
from streaming.errors import TopicsMismatchError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    broker = BrokerProcess(str(tmp_path_factory.mktemp("joins-broker")), "group.initial.rebalance.delay.ms=0", "group.min.session.timeout.ms=1000").start()
    yield broker.bootstrap
    broker.kill()


def produce(bootstrap: str, topic: str, key: str, value, timestamp: int) -> None:
    with Producer(bootstrap_servers=bootstrap) as producer:
        producer.send(topic, None if value is None else json.dumps(value).encode(), key=key.encode(), timestamp=timestamp)
        producer.flush()


def joining_app(bootstrap: str, state_dir: str, prefix: str, **options) -> streaming.App:
    app = streaming.App(bootstrap_servers=bootstrap, application_id=f"{prefix}-app", state_dir=state_dir, session_timeout_ms=3000, heartbeat_interval_ms=300, **options)
    regions = app.table(f"{prefix}-regions")
    owners = app.global_table(f"{prefix}-owners")
    (app.stream(f"{prefix}-payments", key_format="str", value_format="json")
        .left_join(regions, lambda payment, region: {**payment, "region": region})
        .join(owners, lambda payment, owner: {**payment, "owner": owner["name"]}, on=lambda payment: payment["owner"])
        .to(f"{prefix}-out"))
    return app


def start(app: streaming.App) -> threading.Thread:
    thread = threading.Thread(target=app.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not app.metrics.get("rebalances") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert app.metrics.get("rebalances"), "the app never got its partitions"
    return thread


@pytest.mark.parametrize("idle_ms, region", [(4000, "emea"), (0, None)])
def test_a_table_update_stamped_earlier_but_arriving_later_is_applied_first_within_the_bound(bootstrap, tmp_path, idle_ms, region):
    prefix = f"order{idle_ms}"
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics({f"{prefix}-regions": 2, f"{prefix}-owners": 1, f"{prefix}-payments": 2, f"{prefix}-out": 2})
    for number in range(50):  # the global table is read whole before any payment: every payment finds its owner
        produce(bootstrap, f"{prefix}-owners", f"o-{number}", {"name": f"owner {number}"}, 1)
    app = joining_app(bootstrap, str(tmp_path / "state"), prefix, max_task_idle_ms=idle_ms)
    thread = start(app)
    try:
        produce(bootstrap, f"{prefix}-payments", "acct-1", {"id": 1, "owner": "o-49"}, 2_000)
        time.sleep(0.5)
        produce(bootstrap, f"{prefix}-regions", "acct-1", "emea", 1_000)  # arrives later, happened earlier
        [record] = read_all(bootstrap, f"{prefix}-out", 2, expect=1, idle=1.0)
    finally:
        app.stop()
        thread.join(30)
    assert json.loads(record.value) == {"id": 1, "owner": "owner 49", "region": region}
    assert record.timestamp == 2_000


def test_inputs_of_different_partition_counts_are_refused_by_name(bootstrap, tmp_path):
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics({"mismatch-regions": 2, "mismatch-owners": 1, "mismatch-payments": 3})
    app = joining_app(bootstrap, str(tmp_path / "state"), "mismatch")
    with pytest.raises(TopicsMismatchError, match=r"topics mismatch-regions \(2 partitions\) and mismatch-payments \(3 partitions\) must be co-partitioned"):
        app.run()


def test_partition_n_of_a_table_and_its_stream_stay_on_one_instance_under_a_sticky_assignor_request(bootstrap, tmp_path):
    prefix = "placed"
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics({f"{prefix}-regions": 4, f"{prefix}-owners": 1, f"{prefix}-payments": 4, f"{prefix}-out": 4})
    apps = [joining_app(bootstrap, str(tmp_path / f"state{i}"), prefix, partition_assignment_strategy="cooperative-sticky") for i in range(2)]
    threads = [start(app) for app in apps]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            held = [app._runner.assigned for app in apps]
            if all(held) and sum(map(len, held)) == 8:
                break
            time.sleep(0.1)
        assert sum(map(len, held)) == 8 and all(held), held
        for assigned in held:
            by_topic = {topic: {tp.partition for tp in assigned if tp.topic == topic} for topic in (f"{prefix}-regions", f"{prefix}-payments")}
            assert by_topic[f"{prefix}-regions"] == by_topic[f"{prefix}-payments"], held
    finally:
        for app in apps:
            app.stop()
        for thread in threads:
            thread.join(30)


def test_a_global_table_is_read_on_while_the_app_runs(bootstrap, tmp_path):
    prefix = "later"
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics({f"{prefix}-regions": 1, f"{prefix}-owners": 2, f"{prefix}-payments": 1, f"{prefix}-out": 1})
    app = joining_app(bootstrap, str(tmp_path / "state"), prefix)
    thread = start(app)
    try:
        produce(bootstrap, f"{prefix}-owners", "o-new", {"name": "New"}, 1)
        time.sleep(2.0)  # read between polls (at most every 0.1 s)
        produce(bootstrap, f"{prefix}-payments", "acct-1", {"id": 1, "owner": "o-new"}, 2_000)
        [record] = read_all(bootstrap, f"{prefix}-out", 1, expect=1, idle=1.0)
    finally:
        app.stop()
        thread.join(30)
    assert json.loads(record.value) == {"id": 1, "owner": "New", "region": None}
