"""``Cluster.abandon``: a producer given up on without a flush (as the
runner replaces one after a failure) drops its connections at once and
leaves its open transaction to the next instance, whose init_transactions
ends it, against a real broker."""

from __future__ import annotations

import asyncio

from tests.helpers import create_topic, read_values


def test_an_abandoned_producer_leaves_its_open_transaction_to_the_next_instance(embedded_broker):
    from txn.aio import Producer

    bootstrap = embedded_broker.bootstrap
    create_topic(bootstrap, "abandoned", 1)

    async def scenario() -> None:
        first = Producer(bootstrap_servers=bootstrap, transactional_id="abandoned-tx")
        await first.init_transactions()
        first.begin_transaction()
        await (await first.send("abandoned", b"never committed", partition=0))
        connection = await first.cluster.any_broker()
        assert connection.connected
        await first.cluster.abandon()
        assert not connection.connected
        await first.cluster.abandon()  # twice is harmless
        async with Producer(bootstrap_servers=bootstrap, transactional_id="abandoned-tx") as second:
            await second.init_transactions()  # aborts what the first left open
            second.begin_transaction()
            await second.send("abandoned", b"committed", partition=0)
            await second.commit_transaction()

    asyncio.run(scenario())
    assert read_values(bootstrap, "abandoned", partitions=1, isolation="read_uncommitted", expect=2) == [b"never committed", b"committed"]
    assert read_values(bootstrap, "abandoned", partitions=1, expect=1) == [b"committed"]
