"""A process that used the sync clients exits without asyncio's complaints:
no task destroyed while pending, no exception never retrieved, whether the
clients were closed or not (their loop thread stops what is left)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPT = r'''
import sys
from txn import Consumer, Producer
from txn.types import TopicPartition

bootstrap, scenario = sys.argv[1], sys.argv[2]
if scenario == "producer never closed":
    producer = Producer(bootstrap_servers=bootstrap)
    producer.send("exit-topic", b"x").result(10)
elif scenario == "clients closed, async commit pending":
    producer = Producer(bootstrap_servers=bootstrap, transactional_id="exit-tx")
    producer.init_transactions()
    with producer.transaction():
        for i in range(5):
            producer.send("exit-topic", b"%d" % i)
    producer.close()
    consumer = Consumer(bootstrap_servers=bootstrap, group_id="exit-group", auto_offset_reset="earliest", heartbeat_interval_ms=100)
    consumer.subscribe(["exit-topic"])
    seen = []
    while len(seen) < 5:
        seen += consumer.poll(1.0)
    consumer.commit(asynchronous=True)  # not waited for: close() finishes it
    consumer.close()
elif scenario == "consumer in a group never closed":
    with Producer(bootstrap_servers=bootstrap) as producer:
        producer.send("exit-topic", b"x").result(10)
    consumer = Consumer(bootstrap_servers=bootstrap, group_id="exit-group-2", auto_offset_reset="earliest", heartbeat_interval_ms=100)
    consumer.subscribe(["exit-topic"])
    while not consumer.poll(1.0):
        pass
    consumer.commit(asynchronous=True)
print("finished", flush=True)
'''


@pytest.mark.parametrize("scenario", ["producer never closed", "clients closed, async commit pending", "consumer in a group never closed"])
def test_a_client_process_exits_without_pending_tasks_or_unretrieved_errors(embedded_broker, scenario):
    environment = dict(os.environ, PYTHONPATH=REPO)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, embedded_broker.bootstrap, scenario], cwd=REPO, env=environment, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "finished" in done.stdout, done.stderr
    assert "Task was destroyed" not in done.stderr, done.stderr
    assert "never retrieved" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_closed_asyncio_clients_leave_no_task_on_the_loop(embedded_broker):
    """Every task a client starts (connection readers, deliveries, the group's
    join round and heartbeats, asynchronous commits) is its own and ends by
    its close()."""
    import asyncio

    from txn import aio

    async def scenario():
        async with asyncio.timeout(60):
            await clients_at_work()
        left = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        assert left == [], left

    async def clients_at_work():
        async with aio.Producer(bootstrap_servers=embedded_broker.bootstrap, transactional_id="tasks-tx") as producer:
            await producer.init_transactions()
            producer.begin_transaction()
            delivered = [await producer.send("tasks-topic", b"%d" % i) for i in range(5)]
            await producer.commit_transaction()
            assert all(f.done() for f in delivered)
        consumer = aio.Consumer(bootstrap_servers=embedded_broker.bootstrap, group_id="tasks-group", auto_offset_reset="earliest", heartbeat_interval_ms=100)
        consumer.subscribe(["tasks-topic"])
        seen = []
        while len(seen) < 5:
            seen += await consumer.poll(1.0)
        assert consumer._heartbeat_task is not None and not consumer._heartbeat_task.done(), "it heartbeats in the background"
        consumer.commit_async()
        await consumer.close()
        # Closed in the middle of a rebalance: the join round is still out.
        late = aio.Consumer(bootstrap_servers=embedded_broker.bootstrap, group_id="tasks-group", auto_offset_reset="earliest")
        late.subscribe(["tasks-topic"])
        await late.poll(0)
        assert late._join_task is not None and not late._join_task.done()
        await late.close()

    asyncio.run(scenario())
