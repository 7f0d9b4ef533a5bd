"""Transactions and idempotence with real clients over real sockets, and
their crash behaviour with a real broker process."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from tests.helpers import create_topic, raw_request, read_values, wait_for

TOPIC_PARTITIONS = 3
SMALL_TXN_CONFIG = ("transaction.abort.timed.out.transaction.cleanup.interval.ms=200",)


# ----------------------------------------------------------------- per client producers


def run_confluent(bootstrap, topic, plan):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-confluent-{uuid.uuid4()}", "linger.ms": 1})
    producer.init_transactions(20)
    for commit, values in plan:
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, key=value, value=value)
        producer.flush(20)
        (producer.commit_transaction if commit else producer.abort_transaction)(20)


def run_kafka_python(bootstrap, topic, plan):
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"tx-kp-{uuid.uuid4()}", linger_ms=1)
    producer.init_transactions()
    for commit, values in plan:
        producer.begin_transaction()
        for value in values:
            producer.send(topic, key=value, value=value)
        producer.flush()
        (producer.commit_transaction if commit else producer.abort_transaction)()
    producer.close()


def run_aiokafka(bootstrap, topic, plan):
    from aiokafka import AIOKafkaProducer

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"tx-aio-{uuid.uuid4()}", linger_ms=1)
        await producer.start()
        try:
            for commit, values in plan:
                await producer.begin_transaction()
                for value in values:
                    await producer.send(topic, key=value, value=value)
                await producer.flush()
                if commit:
                    await producer.commit_transaction()
                else:
                    await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(run())


CLIENTS = {"confluent-kafka": run_confluent, "kafka-python": run_kafka_python, "aiokafka": run_aiokafka}


def client_read_committed(client, bootstrap, topic, expect):
    """Read back with the same client's own read_committed consumer."""
    if client == "kafka-python":
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", consumer_timeout_ms=3000)
        partitions = [TopicPartition(topic, p) for p in range(TOPIC_PARTITIONS)]
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        values = [m.value for m in consumer]
        consumer.close()
        return values
    if client == "aiokafka":
        from aiokafka import AIOKafkaConsumer, TopicPartition

        async def run():
            consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", auto_offset_reset="earliest")
            await consumer.start()
            try:
                partitions = [TopicPartition(topic, p) for p in range(TOPIC_PARTITIONS)]
                consumer.assign(partitions)
                await consumer.seek_to_beginning(*partitions)
                values = []
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline and len(values) < expect:
                    batches = await consumer.getmany(timeout_ms=300)
                    values.extend(m.value for ms in batches.values() for m in ms)
                await asyncio.sleep(0.5)
                batches = await consumer.getmany(timeout_ms=300)
                values.extend(m.value for ms in batches.values() for m in ms)
                return values
            finally:
                await consumer.stop()

        return asyncio.run(run())
    return read_values(bootstrap, topic, isolation="read_committed", partitions=TOPIC_PARTITIONS, expect=expect)


@pytest.mark.parametrize("client", list(CLIENTS))
def test_commit_abort_commit(client, embedded_broker):
    topic = f"txn-{client}"
    create_topic(embedded_broker.bootstrap, topic)
    first = [b"c1-%d" % i for i in range(30)]
    aborted = [b"a-%d" % i for i in range(30)]
    second = [b"c2-%d" % i for i in range(30)]
    CLIENTS[client](embedded_broker.bootstrap, topic, [(True, first), (False, aborted), (True, second)])
    committed = read_values(embedded_broker.bootstrap, topic, isolation="read_committed", partitions=TOPIC_PARTITIONS, expect=60)
    assert sorted(committed) == sorted(first + second), "exactly the committed records"
    everything = read_values(embedded_broker.bootstrap, topic, isolation="read_uncommitted", partitions=TOPIC_PARTITIONS, expect=90)
    assert sorted(everything) == sorted(first + aborted + second), "read_uncommitted sees all, and no control records"
    own = client_read_committed(client, embedded_broker.bootstrap, topic, 60)
    assert sorted(own) == sorted(first + second), f"{client}'s own read_committed consumer"


def test_open_transaction_holds_read_committed_until_it_ends(embedded_broker):
    from confluent_kafka import Producer

    topic = "lso"
    create_topic(embedded_broker.bootstrap, topic, 1)
    plain = Producer({"bootstrap.servers": embedded_broker.bootstrap})
    plain.produce(topic, value=b"before")
    plain.flush(10)
    producer = Producer({"bootstrap.servers": embedded_broker.bootstrap, "transactional.id": "lso-tx"})
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(topic, value=b"in-txn")
    producer.flush(10)
    plain.produce(topic, value=b"after")  # behind the open transaction
    plain.flush(10)
    assert read_values(embedded_broker.bootstrap, topic, isolation="read_committed", partitions=1) == [b"before"]

    def latest(isolation):
        body = {"replica_id": -1, "isolation_level": isolation, "topics": [{"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}]}
        return raw_request(embedded_broker.port, ApiKey.LIST_OFFSETS, 5, body)["topics"][0]["partitions"][0]["offset"]

    assert (latest(0), latest(1)) == (3, 1), "ListOffsets: high watermark vs last stable offset"
    assert read_values(embedded_broker.bootstrap, topic, isolation="read_uncommitted", partitions=1, expect=3) == [b"before", b"in-txn", b"after"]
    producer.commit_transaction(10)
    assert read_values(embedded_broker.bootstrap, topic, isolation="read_committed", partitions=1, expect=3) == [b"before", b"in-txn", b"after"]


def test_zombie_is_fenced_and_nothing_it_sent_becomes_visible(embedded_broker):
    from confluent_kafka import KafkaException, Producer

    topic = "zombies"
    create_topic(embedded_broker.bootstrap, topic)
    zombie = Producer({"bootstrap.servers": embedded_broker.bootstrap, "transactional.id": "same-id", "linger.ms": 1})
    zombie.init_transactions(10)
    zombie.begin_transaction()
    for i in range(20):
        zombie.produce(topic, value=b"zombie-%d" % i)
    zombie.flush(10)
    successor = Producer({"bootstrap.servers": embedded_broker.bootstrap, "transactional.id": "same-id"})
    successor.init_transactions(20)  # fences the zombie and aborts its transaction
    successor.begin_transaction()
    successor.produce(topic, value=b"successor")
    successor.commit_transaction(10)
    with pytest.raises(KafkaException) as info:
        zombie.produce(topic, value=b"zombie-late")
        zombie.flush(5)
        zombie.commit_transaction(10)
    error = info.value.args[0]
    assert error.fatal() or "fenced" in error.str().lower() or error.code() in (47, 90), error
    assert read_values(embedded_broker.bootstrap, topic, isolation="read_committed", partitions=TOPIC_PARTITIONS, expect=1) == [b"successor"]


@pytest.mark.slow
def test_timed_out_transaction_is_aborted_and_producer_fenced(broker_process):
    from confluent_kafka import KafkaException, Producer

    broker = broker_process(*SMALL_TXN_CONFIG)
    topic = "timeouts"
    create_topic(broker.bootstrap, topic)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "slow", "transaction.timeout.ms": 1000, "linger.ms": 1})
    producer.init_transactions(10)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=b"slow-%d" % i)
    producer.flush(10)

    def state():
        return raw_request(broker.port, ApiKey.DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": ["slow"]})["transaction_states"][0]["transaction_state"]

    wait_for(lambda: state() == "CompleteAbort", 30, "the coordinator to abort the timed-out transaction")
    with pytest.raises(KafkaException):
        producer.commit_transaction(10)
    assert read_values(broker.bootstrap, topic, isolation="read_committed", partitions=TOPIC_PARTITIONS, idle=1.0) == []
    everything = read_values(broker.bootstrap, topic, isolation="read_uncommitted", partitions=TOPIC_PARTITIONS, expect=10)
    assert len(everything) == 10, "the records are there, aborted"


def test_duplicates_and_out_of_order_batches_on_the_wire(embedded_broker):
    from protocol.records import encode_batch

    create_topic(embedded_broker.bootstrap, "idem", 1)
    init = raw_request(embedded_broker.port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout_ms": 0})
    pid, epoch = init["producer_id"], init["producer_epoch"]
    assert init["error_code"] == 0 and pid >= 0

    def produce(sequence, values):
        batch = encode_batch([(None, v, (), 1) for v in values], producer_id=pid, producer_epoch=epoch, base_sequence=sequence)
        body = {"acks": -1, "timeout_ms": 5000, "topic_data": [{"name": "idem", "partition_data": [{"index": 0, "records": batch}]}]}
        return raw_request(embedded_broker.port, ApiKey.PRODUCE, 9, body)["responses"][0]["partition_responses"][0]

    first = produce(0, [b"a", b"b"])
    assert (first["error_code"], first["base_offset"]) == (0, 0)
    again = produce(0, [b"a", b"b"])  # a retry after a lost response
    assert (again["error_code"], again["base_offset"]) == (0, 0)
    gap = produce(5, [b"c"])
    assert gap["error_code"] == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER
    assert produce(2, [b"c"])["base_offset"] == 2
    assert read_values(embedded_broker.bootstrap, "idem", isolation="read_uncommitted", partitions=1, expect=3) == [b"a", b"b", b"c"]


def test_transactional_batch_outside_the_transaction_is_rejected(embedded_broker):
    from protocol.records import encode_batch

    create_topic(embedded_broker.bootstrap, "kip890", 2)
    init = raw_request(embedded_broker.port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": "raw-tx", "transaction_timeout_ms": 60000})
    pid, epoch = init["producer_id"], init["producer_epoch"]
    add = raw_request(embedded_broker.port, ApiKey.ADD_PARTITIONS_TO_TXN, 3, {"v3_and_below_transactional_id": "raw-tx", "v3_and_below_producer_id": pid, "v3_and_below_producer_epoch": epoch, "v3_and_below_topics": [{"name": "kip890", "partitions": [0]}]})
    assert add["results_by_topic_v3_and_below"][0]["results_by_partition"][0]["partition_error_code"] == 0
    batch = encode_batch([(None, b"x", (), 1)], producer_id=pid, producer_epoch=epoch, base_sequence=0, is_transactional=True)
    body = lambda p: {"transactional_id": "raw-tx", "acks": -1, "timeout_ms": 5000, "topic_data": [{"name": "kip890", "partition_data": [{"index": p, "records": batch}]}]}  # noqa: E731
    assert raw_request(embedded_broker.port, ApiKey.PRODUCE, 9, body(0))["responses"][0]["partition_responses"][0]["error_code"] == 0
    late = raw_request(embedded_broker.port, ApiKey.PRODUCE, 9, body(1))["responses"][0]["partition_responses"][0]
    assert late["error_code"] == 48  # INVALID_TXN_STATE: partition 1 was never added
    listed = raw_request(embedded_broker.port, ApiKey.LIST_TRANSACTIONS, 1, {"state_filters": ["Ongoing"], "producer_id_filters": []})
    assert [t["transactional_id"] for t in listed["transaction_states"]] == ["raw-tx"]
    described = raw_request(embedded_broker.port, ApiKey.DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": ["raw-tx", "nope"]})
    states = described["transaction_states"]
    assert states[0]["transaction_state"] == "Ongoing" and states[0]["topics"] == [{"topic": "kip890", "partitions": [0]}]
    assert states[1]["error_code"] == 105  # TRANSACTIONAL_ID_NOT_FOUND
    producers = raw_request(embedded_broker.port, ApiKey.DESCRIBE_PRODUCERS, 0, {"topics": [{"name": "kip890", "partition_indexes": [0]}]})
    [active] = producers["topics"][0]["partitions"][0]["active_producers"]
    assert active["producer_id"] == pid and active["current_txn_start_offset"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("decision", ["commit", "abort"])
def test_broker_killed_after_the_decision_finishes_it_on_restart(decision, broker_process):
    from confluent_kafka import Producer

    point = "coordinator.after_prepare_commit" if decision == "commit" else "coordinator.after_prepare_abort"
    broker = broker_process(env={"ONCEFLOW_CRASH_POINTS": f"{point}@1:exit"})
    topic = f"crash-{decision}"
    create_topic(broker.bootstrap, topic)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"crash-{decision}", "linger.ms": 1, "message.timeout.ms": 5000})
    producer.init_transactions(10)
    producer.begin_transaction()
    values = [b"%s-%d" % (decision.encode(), i) for i in range(30)]
    for value in values:
        producer.produce(topic, key=value, value=value)
    producer.flush(10)
    try:
        (producer.commit_transaction if decision == "commit" else producer.abort_transaction)(5)
    except Exception:
        pass  # the broker died under the client; what counts is what recovery does
    assert broker.wait_exit(30) == 86, "the crash point fired"
    del producer
    broker.restart(clean=False, env={})
    committed = read_values(broker.bootstrap, topic, isolation="read_committed", partitions=TOPIC_PARTITIONS, expect=30 if decision == "commit" else None)
    assert sorted(committed) == (sorted(values) if decision == "commit" else [])
    # Every partition got its marker: the LSO is not held back anywhere.
    from confluent_kafka import Producer as Plain

    plain = Plain({"bootstrap.servers": broker.bootstrap})
    for partition in range(TOPIC_PARTITIONS):
        plain.produce(topic, value=b"later-%d" % partition, partition=partition)
    plain.flush(10)
    after = read_values(broker.bootstrap, topic, isolation="read_committed", partitions=TOPIC_PARTITIONS, expect=len(committed) + TOPIC_PARTITIONS)
    assert sorted(v for v in after if v.startswith(b"later")) == [b"later-%d" % p for p in range(TOPIC_PARTITIONS)]
    described = raw_request(broker.port, ApiKey.DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [f"crash-{decision}"]})
    assert described["transaction_states"][0]["transaction_state"] == ("CompleteCommit" if decision == "commit" else "CompleteAbort")


@pytest.mark.slow
def test_idempotent_stream_through_broker_kills_has_no_duplicates(broker_process):
    import threading

    from confluent_kafka import Producer

    broker = broker_process()
    create_topic(broker.bootstrap, "stream", 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 2, "message.timeout.ms": 60000, "retry.backoff.ms": 50})
    delivered = []
    failed = []

    def on_delivery(error, message):
        (failed if error else delivered).append(message.value())

    stop = threading.Event()

    def chaos():
        for _ in range(2):
            time.sleep(0.7)
            broker.restart(clean=False)
        stop.set()

    killer = threading.Thread(target=chaos)
    killer.start()
    sent = 0
    while not stop.is_set() or sent < 3000:
        producer.produce("stream", value=b"%d" % sent, on_delivery=on_delivery)
        sent += 1
        producer.poll(0)
        if sent % 500 == 0:
            time.sleep(0.05)
    killer.join()
    assert producer.flush(60) == 0
    assert not failed, failed[:3]
    values = read_values(broker.bootstrap, "stream", isolation="read_uncommitted", partitions=2, expect=sent)
    assert len(values) == len(set(values)), "no duplicates"
    assert sorted(values, key=int) == [b"%d" % i for i in range(sent)], "every acknowledged record"


def test_producer_ids_and_epochs_survive_restart(broker_process):
    broker = broker_process()
    first = raw_request(broker.port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": "keeper", "transaction_timeout_ms": 60000})
    idempotent = raw_request(broker.port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout_ms": 0})
    broker.restart(clean=False)
    again = raw_request(broker.port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": "keeper", "transaction_timeout_ms": 60000})
    assert again["producer_id"] == first["producer_id"] and again["producer_epoch"] == first["producer_epoch"] + 1
    fresh = raw_request(broker.port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout_ms": 0})
    assert fresh["producer_id"] not in (first["producer_id"], idempotent["producer_id"])
    assert fresh["producer_id"] > idempotent["producer_id"]


@pytest.mark.slow
def test_a_tool_aborting_a_hanging_offset_commit_drops_the_pending_offsets(embedded_broker):
    """KIP-664's abort (WriteTxnMarkers from a tool) on the group's
    ``__consumer_offsets`` partition ends the pending transactional offset
    commit there and then, as the coordinator's own ABORT marker would: the
    offsets are dropped and require_stable fetches answer again."""
    from txn import Admin, Producer

    bootstrap = embedded_broker.bootstrap
    create_topic(bootstrap, "hanging-in", 1)
    group = f"hanging-{uuid.uuid4()}"
    producer = Producer(bootstrap_servers=bootstrap, transactional_id=f"hang-{uuid.uuid4()}")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send_offsets_to_transaction({("hanging-in", 0): 7}, group)  # pending in __consumer_offsets, never ended

    def stable_fetch() -> int:
        answer = raw_request(embedded_broker.port, ApiKey.OFFSET_FETCH, 7, {"group_id": group, "topics": [{"name": "hanging-in", "partition_indexes": [0]}], "require_stable": True})
        return answer["topics"][0]["partitions"][0]["error_code"]

    assert stable_fetch() == ErrorCode.UNSTABLE_OFFSET_COMMIT
    with Admin(bootstrap_servers=bootstrap) as admin:
        offsets_partitions = embedded_broker.config.offsets_topic_partitions
        holders = [
            (tp, description)
            for tp, descriptions in admin.describe_producers_of([("__consumer_offsets", p) for p in range(offsets_partitions)]).items()
            for description in descriptions
            if description.current_txn_start_offset >= 0
        ]
        assert len(holders) == 1, holders
        (partition, description), = holders
        admin.abort_transaction(partition, description.producer_id, description.producer_epoch)
    assert stable_fetch() == ErrorCode.NONE
    answer = raw_request(embedded_broker.port, ApiKey.OFFSET_FETCH, 7, {"group_id": group, "topics": [{"name": "hanging-in", "partition_indexes": [0]}], "require_stable": True})
    assert answer["topics"][0]["partitions"][0]["committed_offset"] == -1, "the aborted offsets are not applied"
    producer.close(timeout=5)


def test_endtxn_is_answered_before_the_markers_fsync_runs_on_the_loop(tmp_path):
    """EndTxn is answered once PrepareCommit is durable; the markers follow.
    Their round is small, so its fsync runs on the broker's loop, and the
    loop must have written EndTxn's answer before it: here the markers'
    fsync of the data partition holds the loop until the client has its
    answer (up to 3 s). Started ahead of the answer, that fsync would hold
    the answer back and time out."""
    import os
    import threading

    from confluent_kafka import Producer

    from broker.broker import EmbeddedBroker, FaultSeams
    from storage.segment import DiskIO

    answered = threading.Event()
    armed = threading.Event()
    seen: list[bool] = []

    class MarkerFsyncWaitsForTheAnswer(DiskIO):
        def fsync(self, fd):
            if armed.is_set() and os.path.basename(os.path.dirname(os.readlink(f"/proc/self/fd/{fd}"))) == "order-0":
                seen.append(answered.wait(3))
                armed.clear()
            super().fsync(fd)

    with EmbeddedBroker(str(tmp_path / "data"), seams=FaultSeams(disk_io=MarkerFsyncWaitsForTheAnswer()), group_initial_rebalance_delay_ms=0) as broker:
        create_topic(broker.bootstrap, "order", 1)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "order", "linger.ms": 1})
        producer.init_transactions(20)
        for _ in range(3):
            answered.clear()
            producer.begin_transaction()
            producer.produce("order", b"x", partition=0)
            producer.flush(10)  # the Produce's own fsync is done
            armed.set()
            producer.commit_transaction(10)
            answered.set()
            wait_for(lambda: not armed.is_set(), 10, "the markers' fsync")
        assert seen == [True, True, True], "EndTxn's answer waited for the markers' fsync"


# ----------------------------------------------------------------- transaction version 2 (KIP-890 part 2)


def _api_versions(port: int) -> tuple[dict, dict]:
    answer = raw_request(port, ApiKey.API_VERSIONS, 3, {"client_software_name": "test", "client_software_version": "0"})
    versions = {entry["api_key"]: entry["max_version"] for entry in answer["api_keys"]}
    features = {entry["name"]: entry["max_version_level"] for entry in answer["finalized_features"] or []}
    return versions, features


def test_transaction_version_is_a_finalized_feature_and_below_2_its_versions_are_not_offered(tmp_path):
    """ApiVersions finalizes ``transaction.version`` (2 by default) and offers
    Produce v12, TxnOffsetCommit v5 and EndTxn v5 only at 2; our producer
    then follows the broker: at 1, the classic protocol (the epoch stays
    from one transaction to the next), at 2 an epoch per transaction."""
    from broker.broker import EmbeddedBroker
    from txn import Producer

    epochs = {}
    for level in (2, 1):
        with EmbeddedBroker(str(tmp_path / f"level-{level}"), group_initial_rebalance_delay_ms=0, transaction_version=level) as broker:
            versions, features = _api_versions(broker.port)
            assert features == {"transaction.version": level}
            expected = (12, 5, 5) if level == 2 else (11, 4, 4)
            assert (versions[ApiKey.PRODUCE], versions[ApiKey.TXN_OFFSET_COMMIT], versions[ApiKey.END_TXN]) == expected
            create_topic(broker.bootstrap, "levels", 1)
            producer = Producer(broker.bootstrap, transactional_id="levels", linger_ms=0)
            producer.init_transactions()
            seen = [producer.producer_epoch]
            for n in range(2):
                with producer.transaction():
                    producer.send("levels", b"%d" % n)
                seen.append(producer.producer_epoch)
            producer.close()
            assert read_values(broker.bootstrap, "levels", isolation="read_committed", partitions=1, expect=2) == [b"0", b"1"]
            epochs[level] = seen
    assert epochs[2] == [0, 1, 2] and epochs[1] == [0, 0, 0]


def test_features_are_answered_as_kafka_does_for_each_api_versions_version(tmp_path):
    """As Kafka (KAFKA-17492): ``transaction.version``'s supported range
    starts at 0, so it is left out below ApiVersions v4 (clients before v4
    may fail to parse it) and sent from v4 on; a level finalized at 0 is not
    sent at all. Before, both were always sent. kafka-python's
    ``describe_features`` (it asks v4) sees what it would of Kafka."""
    from kafka.admin import KafkaAdminClient

    from broker.broker import EmbeddedBroker

    def features(port: int, version: int) -> tuple[list, list]:
        answer = raw_request(port, ApiKey.API_VERSIONS, version, {"client_software_name": "test", "client_software_version": "0"})
        return answer["supported_features"], answer["finalized_features"]

    seen = {}
    for level in (2, 0):
        with EmbeddedBroker(str(tmp_path / f"level-{level}"), group_initial_rebalance_delay_ms=0, transaction_version=level) as broker:
            supported_v3, finalized_v3 = features(broker.port, 3)
            supported_v4, finalized_v4 = features(broker.port, 4)
            assert supported_v3 == []
            assert supported_v4 == [{"name": "transaction.version", "min_version": 0, "max_version": 2}]
            assert finalized_v3 == finalized_v4
            admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
            try:
                seen[level] = admin.describe_features()
            finally:
                admin.close()
    assert seen[2] == {"transaction.version": {"supported": (0, 2), "finalized": (2, 2), "finalized_epoch": 1}}
    assert seen[0] == {"transaction.version": {"supported": (0, 2)}}


def test_a_produce_v12_of_an_ended_transaction_arriving_late_is_fenced(embedded_broker):
    """With version 2 the EndTxn's new epoch fences what of the transaction
    is still on its way: a Produce v12 of the old epoch is refused and
    appends nothing, where the classic protocol (same epoch) would have
    opened a new transaction with it."""
    from protocol.records import encode_batch

    create_topic(embedded_broker.bootstrap, "late-v2", 2)
    init = raw_request(embedded_broker.port, ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": "late-v2", "transaction_timeout_ms": 60000})
    pid, epoch = init["producer_id"], init["producer_epoch"]

    def produce(partition, sequence, producer_epoch):
        batch = encode_batch([(None, b"x", (), 1)], producer_id=pid, producer_epoch=producer_epoch, base_sequence=sequence, is_transactional=True)
        body = {"transactional_id": "late-v2", "acks": -1, "timeout_ms": 5000, "topic_data": [{"name": "late-v2", "partition_data": [{"index": partition, "records": batch}]}]}
        return raw_request(embedded_broker.port, ApiKey.PRODUCE, 12, body)["responses"][0]["partition_responses"][0]["error_code"]

    assert produce(0, 0, epoch) == ErrorCode.NONE
    described = raw_request(embedded_broker.port, ApiKey.DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": ["late-v2"]})["transaction_states"][0]
    assert described["transaction_state"] == "Ongoing" and described["topics"] == [{"topic": "late-v2", "partitions": [0]}], "the Produce added its partition"
    ended = raw_request(embedded_broker.port, ApiKey.END_TXN, 5, {"transactional_id": "late-v2", "producer_id": pid, "producer_epoch": epoch, "committed": True})
    assert (ended["error_code"], ended["producer_id"], ended["producer_epoch"]) == (ErrorCode.NONE, pid, epoch + 1)
    assert produce(1, 0, epoch) == ErrorCode.INVALID_PRODUCER_EPOCH
    offsets = raw_request(embedded_broker.port, ApiKey.LIST_OFFSETS, 4, {"replica_id": -1, "isolation_level": 0, "topics": [{"name": "late-v2", "partitions": [{"partition_index": 1, "timestamp": -1}]}]})
    assert offsets["topics"][0]["partitions"][0]["offset"] == 0, "nothing of the late Produce was appended"
    assert produce(1, 0, epoch + 1) == ErrorCode.NONE, "the next transaction runs at the new epoch"
