"""The sink through ``format("onceflow")`` in a Spark session (local mode)
against a broker process: the optional columns (topic, partition, headers)
reach Kafka, at_least_once writes without transactions, and a query whose
columns do not fit fails with Spark's message, and a source and sink whose
Kafka settings say SASL_SSL with SCRAM reach a broker that requires it;
batch writes (``df.write``) exactly once per job, and per version with
``txnAppId``/``txnVersion`` (foreachBatch's pattern)."""

from __future__ import annotations

import time

import pytest

from tests.helpers import read_all
from txn import Admin, Consumer, Producer, TopicPartition

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def broker(module_broker):
    process = module_broker
    with Admin(process.bootstrap) as admin:
        admin.create_topics({"in": 2, "routed": 3, "plain": 1, "batch": 2, "versions": 1})
    with Producer(process.bootstrap, linger_ms=0) as producer:
        for i in range(10):
            producer.send("in", f"v{i}".encode(), key=f"k{i}".encode(), partition=i % 2, headers=[("h", f"x{i}".encode())])
        producer.flush()
    return process


def source(spark, broker):
    return (
        spark.readStream.format("onceflow").option("kafka.bootstrap.servers", broker.bootstrap).option("subscribe", "in")
        .option("startingOffsets", "earliest").option("includeHeaders", "true").load()
    )


def test_topic_partition_and_headers_columns(spark, broker, tmp_path):
    query = (
        source(spark, broker).selectExpr("key", "value", "headers", "'routed' AS topic", "CAST(2 AS INT) AS partition")
        .writeStream.format("onceflow").option("kafka.bootstrap.servers", broker.bootstrap).option("transactionalIdPrefix", "columns")
        .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    records = read_all(broker.bootstrap, "routed", 3, to_end=True)
    assert sorted(r.value for r in records) == sorted(f"v{i}".encode() for i in range(10))
    assert {r.partition for r in records} == {2}
    assert all(r.headers == (("h", b"x" + r.value[1:]),) and r.key == b"k" + r.value[1:] for r in records)


def test_at_least_once(spark, broker, tmp_path):
    query = (
        source(spark, broker).selectExpr("CAST(value AS STRING) AS value").writeStream.format("onceflow")
        .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", "plain").option("deliveryGuarantee", "at_least_once")
        .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert sorted(r.value for r in read_all(broker.bootstrap, "plain", 1, to_end=True)) == sorted(f"v{i}".encode() for i in range(10))
    with Admin(broker.bootstrap) as admin:
        assert [t for t in admin.list_transactions() if t.transactional_id.startswith("onceflow")] == []


def test_columns_that_do_not_fit_fail_the_query_with_sparks_message(spark, broker, tmp_path):
    query = (
        source(spark, broker).selectExpr("key").writeStream.format("onceflow").option("kafka.bootstrap.servers", broker.bootstrap)
        .option("topic", "plain").option("transactionalIdPrefix", "nocolumns").option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True).start()
    )
    with pytest.raises(Exception, match="Required attribute 'value' not found"):
        query.awaitTermination(120)


def test_commit_offsets_to_group_in_the_batch_transactions(spark, broker, tmp_path):
    """The source's end offsets of each batch go to the consumer group with the
    batch's decision, so lag tools see the pipeline's position."""
    query = (
        source(spark, broker).selectExpr("key", "value").writeStream.format("onceflow").option("kafka.bootstrap.servers", broker.bootstrap)
        .option("topic", "plain").option("transactionalIdPrefix", "withoffsets").option("commitOffsetsToGroup", "payments-pipeline")
        .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    with Admin(broker.bootstrap) as admin:
        committed = admin.list_group_offsets("payments-pipeline")
    assert {tp: o.offset for tp, o in committed.items()} == {TopicPartition("in", 0): 5, TopicPartition("in", 1): 5}


def test_source_and_sink_over_sasl_ssl(spark, tmp_path):
    """Spark job settings as written for Kafka's connector (SASL_SSL, a SCRAM
    JAAS config, a PEM trust store) reach every client: the driver's and the
    executors' pickled readers and writers."""
    from broker.broker import EmbeddedBroker
    from broker.security.credentials import CredentialStore, make
    from tests.helpers import TestCA

    ca = TestCA(tmp_path / "ca")
    data_dir = str(tmp_path / "secure")
    CredentialStore(data_dir).load().upsert("spark", "SCRAM-SHA-512", make("SCRAM-SHA-512", "spark-pw-123"))
    with EmbeddedBroker(data_dir, properties={"listeners": "SASL_SSL://127.0.0.1:0"}, ssl_certfile=ca.certfile, ssl_keyfile=ca.keyfile) as secure:
        bootstrap = secure.bootstrap_for("SASL_SSL")
        ours = {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "spark", "sasl_password": "spark-pw-123", "ssl_cafile": ca.cafile}
        with Admin(bootstrap, **ours) as admin:
            admin.create_topics({"secure-in": 2, "secure-out": 1})
        with Producer(bootstrap, **ours) as producer:
            for i in range(10):
                producer.send("secure-in", f"s{i}".encode(), partition=i % 2)
        kafka = {
            "kafka.bootstrap.servers": bootstrap,
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="spark" password="spark-pw-123";',
            "kafka.ssl.truststore.location": ca.cafile,
            "kafka.ssl.truststore.type": "PEM",
        }
        query = (
            spark.readStream.format("onceflow").options(**kafka).option("subscribe", "secure-in").option("startingOffsets", "earliest").load()
            .selectExpr("key", "value").writeStream.format("onceflow").options(**kafka).option("topic", "secure-out")
            .option("transactionalIdPrefix", "secure").option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start()
        )
        query.awaitTermination(180)
        assert query.exception() is None
        with Consumer(bootstrap, isolation_level="read_committed", **ours) as consumer:
            consumer.assign([TopicPartition("secure-out", 0)])
            values = []
            deadline = time.monotonic() + 30
            while len(values) < 10 and time.monotonic() < deadline:
                values += [r.value for r in consumer.poll(0.5)]
        assert sorted(values) == sorted(f"s{i}".encode() for i in range(10))


def open_transactions(bootstrap, prefix):
    with Admin(bootstrap) as admin:
        return [t.transactional_id for t in admin.list_transactions(states=["Ongoing"]) if t.transactional_id.startswith(prefix)]


def test_batch_write_is_exactly_once_for_the_job(spark, broker):
    """df.write.format("onceflow").mode("append"): one transaction per task,
    committed by the driver; a job whose task fails leaves nothing visible."""
    frame = spark.createDataFrame([(f"k{i}", f"b{i}") for i in range(20)], "key string, value string").repartition(3)
    writer = frame.write.format("onceflow").option("kafka.bootstrap.servers", broker.bootstrap).option("topic", "batch")
    writer.mode("append").save()
    assert sorted(r.value for r in read_all(broker.bootstrap, "batch", 2, to_end=True)) == sorted(f"b{i}".encode() for i in range(20))
    with pytest.raises(Exception, match="cannot be overwritten"):
        writer.mode("overwrite").save()
    failing = spark.createDataFrame([("k", "bad", "batch" if i else None) for i in range(10)], "key string, value string, topic string").repartition(2)
    with pytest.raises(Exception, match="null topic present in the data"):
        failing.write.format("onceflow").mode("append").option("kafka.bootstrap.servers", broker.bootstrap).save()
    assert sorted(r.value for r in read_all(broker.bootstrap, "batch", 2, to_end=True)) == sorted(f"b{i}".encode() for i in range(20))
    assert open_transactions(broker.bootstrap, "onceflow-batch") == []


def test_batch_writes_with_txn_app_id_write_each_version_once(spark, broker):
    """foreachBatch's exactly-once pattern: each write names the application
    and its version (the batch id); a version written before (a replayed
    foreachBatch after a crash) or older is not written again."""

    def write(values, version):
        frame = spark.createDataFrame([(v,) for v in values], "value string").repartition(2)
        (frame.write.format("onceflow").mode("append").option("kafka.bootstrap.servers", broker.bootstrap).option("topic", "versions")
         .option("txnAppId", "totals").option("txnVersion", version).save())

    write(["a", "b"], 0)
    write(["a", "b"], 0)  # replayed
    write(["c"], 1)
    write(["a", "b"], 0)  # older
    assert sorted(r.value for r in read_all(broker.bootstrap, "versions", 1, to_end=True)) == [b"a", b"b", b"c"]
    assert open_transactions(broker.bootstrap, "onceflow-") == []
