"""onceflow's own producer (txn) against the broker, checked with confluent-kafka."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.partitioning import default_partition, murmur2
from tests.helpers import create_topic, raw_request, read_values
from txn.errors import InvalidProducerEpochError, TransactionAbortableError
from txn.producer import AsyncProducer, Producer, ProducerFencedError, _first_error


def test_partitioner_matches_kafkas_murmur2():
    from kafka.partitioner.default import murmur2 as reference

    for key in [b"", b"a", b"ab", b"abc", b"abcd", b"order-17", bytes(range(200))]:
        assert murmur2(key) & 0xFFFFFFFF == reference(key) & 0xFFFFFFFF
        # kafka-python's (and the Java client's) default partition for a key
        assert default_partition(key, 12, None) == (reference(key) & 0x7FFFFFFF) % 12
        # again (now from the cache of repeated keys), and for a bytearray (not cacheable)
        assert default_partition(key, 12, None) == default_partition(bytearray(key), 12, None) == (reference(key) & 0x7FFFFFFF) % 12


def test_idempotent_producer_keeps_order_per_key(embedded_broker):
    create_topic(embedded_broker.bootstrap, "own", 3)
    producer = Producer(embedded_broker.bootstrap, linger_ms=2)
    futures = [producer.send("own", b"%d" % i, key=b"key-%d" % (i % 5)) for i in range(2000)]
    producer.flush()
    results = [f.result(10) for f in futures]
    producer.close()
    assert producer.producer_id >= 0
    by_key = {}
    for i, metadata in enumerate(results):
        by_key.setdefault(i % 5, []).append(metadata)
    for key, metadatas in by_key.items():
        assert len({m.partition for m in metadatas}) == 1, "one partition per key"
        assert [m.offset for m in metadatas] == sorted(m.offset for m in metadatas), "send order kept"
    values = read_values(embedded_broker.bootstrap, "own", isolation="read_uncommitted", partitions=3, expect=2000)
    assert sorted(values, key=int) == [b"%d" % i for i in range(2000)], "each record exactly once"


def test_transactions_commit_abort_and_offsets(embedded_broker):
    create_topic(embedded_broker.bootstrap, "own-txn", 2)
    create_topic(embedded_broker.bootstrap, "own-in", 1)
    producer = Producer(embedded_broker.bootstrap, transactional_id=f"own-{uuid.uuid4()}")
    producer.init_transactions()
    with producer.transaction():
        for i in range(20):
            producer.send("own-txn", b"kept-%d" % i)
        producer.send_offsets_to_transaction({("own-in", 0): 5}, {"group_id": "own-group"})
    producer.begin_transaction()
    for i in range(20):
        producer.send("own-txn", b"dropped-%d" % i)
    producer.send_offsets_to_transaction({("own-in", 0): 99}, {"group_id": "own-group"})
    producer.flush()
    producer.abort_transaction()
    with pytest.raises(RuntimeError):
        with producer.transaction():
            producer.send("own-txn", b"aborted-by-exception")
            raise RuntimeError("processing failed")
    producer.close()
    values = read_values(embedded_broker.bootstrap, "own-txn", isolation="read_committed", partitions=2, expect=20)
    assert sorted(values) == sorted(b"kept-%d" % i for i in range(20))
    committed = raw_request(embedded_broker.port, ApiKey.OFFSET_FETCH, 7, {"group_id": "own-group", "topics": None, "require_stable": True})
    assert committed["topics"][0]["partitions"][0]["committed_offset"] == 5, "offsets commit with the transaction, not the aborted one"


def test_a_second_instance_fences_the_first(embedded_broker):
    create_topic(embedded_broker.bootstrap, "own-fence", 1)
    first = Producer(embedded_broker.bootstrap, transactional_id="own-fenced")
    first.init_transactions()
    first.begin_transaction()
    first.send("own-fence", b"zombie")
    first.flush()
    second = Producer(embedded_broker.bootstrap, transactional_id="own-fenced")
    deadline = time.monotonic() + 10
    while True:  # CONCURRENT_TRANSACTIONS while the zombie's transaction is aborted
        try:
            second.init_transactions()
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with second.transaction():
        second.send("own-fence", b"successor")
    # The broker refuses the zombie's produce (INVALID_PRODUCER_EPOCH) or, had
    # it gone through, its commit (PRODUCER_FENCED): either way it learns.
    with pytest.raises((InvalidProducerEpochError, ProducerFencedError)):
        first.send("own-fence", b"late").result(10)
        first.commit_transaction()
    second.close()
    assert read_values(embedded_broker.bootstrap, "own-fence", isolation="read_committed", partitions=1, expect=1) == [b"successor"]


def test_transaction_version_2_adds_partitions_by_produce_and_bumps_the_epoch_at_each_end(embedded_broker):
    """KIP-890 part 2 against our broker: no AddPartitionsToTxn or
    AddOffsetsToTxn is sent (Produce v12 and TxnOffsetCommit v5 add their
    partitions), every EndTxn v5 answers with the next epoch, which the next
    transaction uses (its sequences from 0), and records and offsets commit
    or abort as before."""
    create_topic(embedded_broker.bootstrap, "v2-wide", 6)
    requests = []
    epochs = []

    async def main():
        producer = AsyncProducer(embedded_broker.bootstrap, transactional_id=f"v2-{uuid.uuid4()}", linger_ms=0)
        original = producer.cluster.coordinator_request

        async def recording(key, key_type, api_key, body, **options):
            response = await original(key, key_type, api_key, body, **options)
            requests.append(api_key)
            return response

        producer.cluster.coordinator_request = recording
        await producer.init_transactions()
        epochs.append(producer.producer_epoch)
        for round_number in range(3):
            producer.begin_transaction()
            for i in range(30):
                await producer.send("v2-wide", b"%d-%d" % (round_number, i), partition=i % 6)
            await asyncio.gather(producer.flush(), producer.send_offsets_to_transaction({("v2-wide-in", 0): 5 + round_number}, "v2-wide-group"))
            await (producer.abort_transaction() if round_number == 1 else producer.commit_transaction())
            epochs.append(producer.producer_epoch)
        await producer.close()

    asyncio.run(main())
    assert ApiKey.ADD_PARTITIONS_TO_TXN not in requests and ApiKey.ADD_OFFSETS_TO_TXN not in requests
    assert requests.count(ApiKey.END_TXN) == 3
    assert epochs == [epochs[0] + n for n in range(4)], f"one epoch per transaction: {epochs}"
    values = read_values(embedded_broker.bootstrap, "v2-wide", isolation="read_committed", partitions=6, expect=60)
    assert sorted(values) == sorted(b"%d-%d" % (r, i) for r in (0, 2) for i in range(30))
    committed = raw_request(embedded_broker.port, ApiKey.OFFSET_FETCH, 7, {"group_id": "v2-wide-group", "topics": None, "require_stable": True})
    assert committed["topics"][0]["partitions"][0]["committed_offset"] == 7


def test_a_transactions_partitions_and_offsets_take_turns_at_the_coordinator(embedded_broker):
    """The coordinator takes one change of a transactional id at a time and
    answers another meanwhile CONCURRENT_TRANSACTIONS (a retry after a
    backoff): partitions waiting to be added go in one AddPartitionsToTxn,
    and AddOffsetsToTxn waits its turn, so no request is turned away, even
    with offsets sent while the records flush (as the runner does)."""
    create_topic(embedded_broker.bootstrap, "own-wide", 6)
    create_topic(embedded_broker.bootstrap, "own-wide-in", 1)
    answers = []

    async def main():
        # The classic protocol (transaction version 1), as with Tansu or an older Kafka.
        producer = AsyncProducer(embedded_broker.bootstrap, transactional_id=f"own-{uuid.uuid4()}", linger_ms=0, transaction_version=1)
        original = producer.cluster.coordinator_request

        async def recording(key, key_type, api_key, body, **options):
            response = await original(key, key_type, api_key, body, **options)
            if api_key in (ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN):
                answers.append((api_key, _first_error(response)))
            return response

        producer.cluster.coordinator_request = recording
        await producer.init_transactions()
        for round_number in range(2):
            producer.begin_transaction()
            for i in range(60):
                await producer.send("own-wide", b"%d-%d" % (round_number, i), partition=i % 6)
            await asyncio.gather(producer.flush(), producer.send_offsets_to_transaction({("own-wide-in", 0): 5 + round_number}, "own-wide-group"))
            await producer.commit_transaction()
        await producer.close()

    asyncio.run(main())
    assert [code for _api, code in answers if code] == [], "no AddPartitionsToTxn/AddOffsetsToTxn was turned away"
    adds = [api for api, _code in answers if api == ApiKey.ADD_PARTITIONS_TO_TXN]
    assert 2 <= len(adds) <= 4, f"six partitions per transaction went in {len(adds)} AddPartitionsToTxn requests over two transactions"
    values = read_values(embedded_broker.bootstrap, "own-wide", isolation="read_committed", partitions=6, expect=120)
    assert sorted(values) == sorted(b"%d-%d" % (r, i) for r in range(2) for i in range(60))
    committed = raw_request(embedded_broker.port, ApiKey.OFFSET_FETCH, 7, {"group_id": "own-wide-group", "topics": None, "require_stable": True})
    assert committed["topics"][0]["partitions"][0]["committed_offset"] == 6


def test_a_partition_the_broker_does_not_know_fails_its_transaction_with_its_own_error(embedded_broker):
    """Partitions added together fail together (as Kafka answers: the unknown
    one UNKNOWN_TOPIC_OR_PARTITION, the rest OPERATION_NOT_ATTEMPTED); the
    error the records carry is the one that says why. (The classic protocol:
    with transaction version 2 no AddPartitionsToTxn joins them.)"""
    create_topic(embedded_broker.bootstrap, "own-narrow", 1)

    async def main():
        producer = AsyncProducer(embedded_broker.bootstrap, transactional_id=f"own-{uuid.uuid4()}", linger_ms=0, delivery_timeout_ms=2000, transaction_version=1)
        await producer.init_transactions()
        producer.begin_transaction()
        known = producer.append("own-narrow", 0, b"fine")
        unknown = producer.append("own-narrow", 5, b"nowhere")
        outcomes = await asyncio.gather(known, unknown, return_exceptions=True)
        with pytest.raises(TransactionAbortableError):
            await producer.commit_transaction()
        await producer.abort_transaction()
        await producer.close()
        return outcomes

    outcomes = asyncio.run(main())
    assert [getattr(outcome, "code", None) for outcome in outcomes] == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION] * 2
