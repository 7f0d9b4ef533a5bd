"""The onceflow source's driver and executor halves against a third-party
Kafka-protocol broker (Tansu), without Spark: it talks Kafka, not our dialect."""

from __future__ import annotations

import pickle

from tests.thirdparty.conftest import tansu_broker  # noqa: F401  (the session's Tansu process)
from streaming.spark.datasource import OnceflowDataSource
from streaming.spark.source import OffsetRange
from txn import Admin, Producer


def test_plan_and_read_committed_records_from_tansu(tansu_broker):  # noqa: F811
    bootstrap = tansu_broker.bootstrap
    topic = "spark-source-on-tansu"
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics({topic: 2}, exist_ok=True)
    producer = Producer(bootstrap_servers=bootstrap, transactional_id="spark-source-on-tansu", linger_ms=0)
    producer.init_transactions()
    for partition in (0, 1):
        for i in range(3):  # one record per transaction and batch
            producer.begin_transaction()
            producer.send(topic, b"%d-%d" % (partition, i), partition=partition).result(30)
            producer.commit_transaction()
    producer.close()
    source = OnceflowDataSource({"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "startingOffsets": "earliest"})
    reader = pickle.loads(pickle.dumps(source.streamReader(source.schema())))
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    ranges = reader.partitions(start, end)
    assert [(r.partition, r.from_offset) for r in ranges] == [(0, 0), (1, 0)]
    values = sorted(row["value"] for r in ranges for batch in reader.read(pickle.loads(pickle.dumps(r))) for row in batch.to_pylist())
    assert values == sorted(b"%d-%d" % (p, i) for p in (0, 1) for i in range(3))
    reader.stop()
    assert isinstance(ranges[0], OffsetRange)
