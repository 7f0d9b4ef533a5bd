"""The sink driver ends a batch's transactions over the connections it
keeps (one per coordinator), not over a fresh client per handle: counted
by the broker's own connection metric, with every record committed once."""

from __future__ import annotations

import asyncio

import pytest

from broker.broker import EmbeddedBroker
from faults.disk import after_power_cut
from streaming.spark.sink import make_stream_writer
from streaming.spark.sink_driver import DriverCommit
from tests.helpers import new_query, open_sink_transactions, read_committed_values, run_sink_tasks, scrape, sink_kv_schema, spark_sink_options
from txn import Admin

HANDLES = 16


@pytest.fixture
def broker(tmp_path):
    with EmbeddedBroker(str(tmp_path / "data"), metrics_address=("127.0.0.1", 0), properties={"num.partitions": "3"}) as running:
        with Admin(running.bootstrap) as admin:
            admin.create_topics({"out": 3})
        yield running


def test_a_batch_of_handles_is_committed_over_kept_connections(broker):
    writer = make_stream_writer(spark_sink_options(broker.bootstrap), sink_kv_schema())
    query, run = new_query()
    messages = run_sink_tasks(writer.options, list(range(HANDLES * 3)), HANDLES, query, run, 0)
    assert len(open_sink_transactions(broker.bootstrap)) == HANDLES
    before = scrape(broker).value("onceflow_connections_opened_total", listener="PLAINTEXT")
    asyncio.run(DriverCommit(writer.options).commit(messages, 0))
    opened = scrape(broker).value("onceflow_connections_opened_total", listener="PLAINTEXT") - before
    # the driver's own clients (admin, decision reader and writer) and nothing per handle
    assert opened < HANDLES / 2, f"{opened} connections opened to commit {HANDLES} handles"
    assert open_sink_transactions(broker.bootstrap) == []
    assert sorted(read_committed_values(broker.bootstrap), key=int) == [str(v) for v in range(HANDLES * 3)]


@pytest.mark.slow
def test_a_batch_decided_before_an_unclean_broker_stop_commits_whole_with_durability_at_the_end(broker_process):
    """With ``transaction.durable.at.end`` an unclean stop in a new boot of
    the machine aborts the transactions it finds open; the sink's tasks seal
    theirs before the handover, so a broker killed between the tasks and the
    driver's commit and started as after a power cut keeps them open, and
    the driver commits every record once."""
    from txn import Admin

    broker = broker_process("transaction.durable.at.end=true")
    with Admin(broker.bootstrap) as admin:
        admin.create_topics({"out": 3})
    writer = make_stream_writer(spark_sink_options(broker.bootstrap), sink_kv_schema())
    query, run = new_query()
    messages = run_sink_tasks(writer.options, list(range(30)), 3, query, run, 0)
    assert len(open_sink_transactions(broker.bootstrap)) == 3
    broker.kill()
    broker.env = after_power_cut()
    broker.start()
    assert len(open_sink_transactions(broker.bootstrap)) == 3, "the sealed transactions were kept open"
    asyncio.run(DriverCommit(writer.options).commit(messages, 0))
    assert sorted(read_committed_values(broker.bootstrap), key=int) == [str(v) for v in range(30)]
