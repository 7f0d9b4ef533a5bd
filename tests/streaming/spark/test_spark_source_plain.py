"""The onceflow source's pieces without a Spark session: pickling (Spark
ships the data source, readers and partitions to other processes), the
reader's planning against a real broker, Arrow batches, rate limits."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time

import pytest

from streaming.spark.datasource import OnceflowDataSource
from streaming.spark.source import OffsetRange, rate_limit, read_range, split_ranges
from txn import Admin, Producer, TopicPartition

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def test_importing_streaming_never_imports_pyspark():
    code = "import sys, streaming, streaming.spark, streaming.spark.options; print('pyspark' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_rate_limit_is_proportional_and_starves_no_partition():
    start = {A0: 0, A1: 100, B0: 0}
    latest = {A0: 1000, A1: 101, B0: 99}
    limited = rate_limit(start, latest, 100)
    assert limited[A1] == 101, "a backlog of 1 still moves (its share rounds up to one offset)"
    assert limited[A0] == 90 and limited[B0] == 9  # floor(100 * 1000/1100), 100 * 99/1100
    assert rate_limit(start, latest, 10_000) == latest
    assert rate_limit({A0: 5}, {A0: 5}, 3) == {A0: 5}


def test_split_ranges_for_min_partitions_and_max_records():
    ranges = [OffsetRange("a", 0, 0, 90), OffsetRange("a", 1, 10, 20)]
    split = split_ranges(ranges, 4, None)
    assert len(split) >= 4
    for whole in ranges:
        pieces = sorted((r for r in split if r.partition == whole.partition), key=lambda r: r.from_offset)
        assert pieces[0].from_offset == whole.from_offset and pieces[-1].until_offset == whole.until_offset
        assert all(a.until_offset == b.from_offset for a, b in zip(pieces, pieces[1:]))
    assert max(r.size for r in split_ranges(ranges, None, 25)) <= 25
    assert split_ranges(ranges, None, None) == ranges


def write(bootstrap: str, topic: str, count: int, partition: int = 0, commit: bool = True) -> None:
    producer = Producer(bootstrap_servers=bootstrap, transactional_id=f"plain-{topic}-{partition}")
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(count):
        producer.send(topic, b"v%d" % i, key=b"k%d" % i, partition=partition, headers=[("n", b"%d" % i)])
    producer.flush()
    producer.commit_transaction() if commit else producer.abort_transaction()
    producer.close()


def source_options(bootstrap: str, **extra) -> dict:
    return {"kafka.bootstrap.servers": bootstrap, "subscribe": "plain", "startingOffsets": "earliest", **extra}


def test_data_source_reader_and_partitions_pickle_before_and_after_use(embedded_broker):
    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"plain": 2})
    write(embedded_broker.bootstrap, "plain", 3, partition=0)
    write(embedded_broker.bootstrap, "plain", 2, partition=1, commit=False)
    source = OnceflowDataSource(source_options(embedded_broker.bootstrap, includeHeaders="true"))
    source = pickle.loads(pickle.dumps(source))
    schema = source.schema()
    reader = source.streamReader(schema)
    reader = pickle.loads(pickle.dumps(reader))
    start = reader.initialOffset()  # opens the driver's admin client
    assert start == {"plain": {"0": -2, "1": -2}}, "earliest stays Spark's marker until batch 0 is planned"
    copy = pickle.loads(pickle.dumps(reader))  # as Spark ships it to executors: no connection inside
    assert copy.planner._admin is None
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"plain": {"0": 4, "1": 3}}, "3 records + COMMIT; 2 aborted records + ABORT"
    partitions = pickle.loads(pickle.dumps(reader.partitions(start, end)))
    assert partitions == [OffsetRange("plain", 0, 0, 4), OffsetRange("plain", 1, 0, 3)]
    assert reader.partitions(end, end) == []
    batches = [b for p in partitions for b in copy.read(p)]
    from pyspark.sql.pandas.types import to_arrow_schema

    assert all(b.schema.equals(to_arrow_schema(schema, timezone="UTC")) for b in batches)
    table = [row for b in batches for row in b.to_pylist()]
    assert [(r["partition"], r["offset"], r["key"], r["value"]) for r in table] == [(0, i, b"k%d" % i, b"v%d" % i) for i in range(3)]
    assert table[1]["headers"] == [{"key": "n", "value": b"1"}]
    reader.stop()
    batch_reader = pickle.loads(pickle.dumps(source.reader(schema)))
    assert pickle.loads(pickle.dumps(batch_reader.partitions())) == [OffsetRange("plain", 0, 0, 4), OffsetRange("plain", 1, 0, 3)]


def test_min_offsets_per_trigger_waits_at_most_max_trigger_delay(embedded_broker):
    from pyspark.sql.streaming.datasource import ReadMinRows

    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"plain-min": 1})
    options = source_options(embedded_broker.bootstrap, subscribe="plain-min", minOffsetsPerTrigger=6, maxTriggerDelay="2s")
    source = OnceflowDataSource(options)
    reader = source.streamReader(source.schema())
    assert reader.getDefaultReadLimit() == ReadMinRows(6)
    start = reader.initialOffset()
    write(embedded_broker.bootstrap, "plain-min", 2)  # 3 offsets with the marker
    begun = time.monotonic()
    first = reader.latestOffset(start, ReadMinRows(6))
    assert first == {"plain-min": {"0": 0}}, "3 new offsets < 6: wait (an empty batch 0 at the resolved start, never a marker)"
    assert reader.latestOffset(first, ReadMinRows(6)) == first
    deadline = begun + 60
    while (end := reader.latestOffset(first, ReadMinRows(6))) == first:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert time.monotonic() - begun >= 1.5, "released by maxTriggerDelay, not earlier"
    assert end == {"plain-min": {"0": 3}}
    write(embedded_broker.bootstrap, "plain-min", 5)  # 6 more offsets: enough at once
    assert reader.latestOffset(end, ReadMinRows(6)) == {"plain-min": {"0": 9}}
    reader.stop()


def test_read_range_reads_past_a_wholly_aborted_tail_quickly(embedded_broker):
    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"plain-aborted": 1})
    write(embedded_broker.bootstrap, "plain-aborted", 2)  # 0, 1, COMMIT 2
    write(embedded_broker.bootstrap, "plain-aborted", 500, commit=False)  # 3..502, ABORT 503
    source = OnceflowDataSource(source_options(embedded_broker.bootstrap, subscribe="plain-aborted"))
    reader = source.streamReader(source.schema())
    begun = time.process_time()
    assert list(read_range(reader.source, OffsetRange("plain-aborted", 0, 3, 504), reader.schema)) == []
    assert time.process_time() - begun < 5
    rows = [r for b in read_range(reader.source, OffsetRange("plain-aborted", 0, 0, 400), reader.schema) for r in b.to_pylist()]
    assert [r["value"] for r in rows] == [b"v0", b"v1"]


def test_timestamp_type_follows_the_topic(embedded_broker):
    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"plain-append": 1}, configs={"plain-append": {"message.timestamp.type": "LogAppendTime"}})
    write(embedded_broker.bootstrap, "plain-append", 2)
    source = OnceflowDataSource(source_options(embedded_broker.bootstrap, subscribe="plain-append"))
    reader = source.streamReader(source.schema())
    rows = [r for b in read_range(reader.source, OffsetRange("plain-append", 0, 0, 3), reader.schema) for r in b.to_pylist()]
    assert [r["timestampType"] for r in rows] == [1, 1]
    assert all(abs(r["timestamp"].timestamp() - time.time()) < 600 for r in rows)


def test_executor_finds_data_loss_when_records_vanish_after_planning(embedded_broker):
    from streaming.spark.source import DataLossError

    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"plain-loss": 1})
        write(embedded_broker.bootstrap, "plain-loss", 6)  # 0..5, COMMIT 6
        admin.delete_records({TopicPartition("plain-loss", 0): 4})  # after the driver planned [0, 7)
    planned = OffsetRange("plain-loss", 0, 0, 7)
    strict = OnceflowDataSource(source_options(embedded_broker.bootstrap, subscribe="plain-loss"))
    reader = strict.streamReader(strict.schema())
    with pytest.raises(DataLossError, match="Cannot fetch offset 0 of plain-loss-0: the earliest offset available is now 4"):
        list(read_range(reader.source, planned, reader.schema))
    lenient = OnceflowDataSource(source_options(embedded_broker.bootstrap, subscribe="plain-loss", failOnDataLoss="false"))
    reader = lenient.streamReader(lenient.schema())
    rows = [r for b in read_range(reader.source, planned, reader.schema) for r in b.to_pylist()]
    assert [r["offset"] for r in rows] == [4, 5], "what is left of the range"
    beyond = OffsetRange("plain-loss", 0, 50, 60)  # the log ends below the range (a recreated topic)
    assert list(read_range(reader.source, beyond, reader.schema)) == []


def test_initial_offset_is_the_same_at_every_call_and_after_a_restart(embedded_broker):
    """Spark asks for the initial offset to plan batch 0, again to run it, and
    again after a restart before commits/0: a start resolved at each call
    would drift while records arrive."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"plain-start": 2})
    write(embedded_broker.bootstrap, "plain-start", 3)  # 0..2, COMMIT 3
    source = OnceflowDataSource(source_options(embedded_broker.bootstrap, subscribe="plain-start", startingOffsets="latest"))
    reader = source.streamReader(source.schema())
    start = reader.initialOffset()
    write(embedded_broker.bootstrap, "plain-start", 2)  # 4, 5, COMMIT 6: arrives between Spark's calls
    assert reader.initialOffset() == start == {"plain-start": {"0": -1, "1": -1}}
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"plain-start": {"0": 7, "1": 0}}, "batch 0 of a latest start ends at the offsets it resolves"
    write(embedded_broker.bootstrap, "plain-start", 1)  # 7, COMMIT 8
    assert reader.partitions(reader.initialOffset(), end) == [], "batch 0 is empty: it ends where the query starts"
    restarted = source.streamReader(source.schema())  # the driver died before commits/0: batch 0 is run again
    assert restarted.partitions(restarted.initialOffset(), end) == []
    assert restarted.partitions(end, restarted.latestOffset(end, ReadAllAvailable())) == [OffsetRange("plain-start", 0, 7, 9)], "batch 1 begins at batch 0's end"
    earliest = OnceflowDataSource(source_options(embedded_broker.bootstrap, subscribe="plain-start")).streamReader(source.schema())
    assert earliest.initialOffset() == {"plain-start": {"0": -2, "1": -2}}
    batch_0 = earliest.latestOffset(earliest.initialOffset(), ReadAllAvailable())
    assert earliest.partitions(earliest.initialOffset(), batch_0) == [OffsetRange("plain-start", 0, 0, 9)]
    no_match = source_options(embedded_broker.bootstrap, subscribe="plain-start", startingTimestamp=9_000_000_000_000, startingOffsetsByTimestampStrategy="latest")
    assert OnceflowDataSource(no_match).streamReader(source.schema()).initialOffset() == {"plain-start": {"0": -1, "1": -1}}
    for each in (reader, restarted, earliest):
        each.stop()


def test_a_batch_larger_than_the_fetch_size_names_the_source_option(tmp_path):
    """Through a proxy that slices fetches at partition_max_bytes (as Kafka
    did before KIP-74), a first batch larger than the fetch size is an option
    error naming kafka.max.partition.fetch.bytes, at once (issue 27, item 8)."""
    from streaming.spark.options import OptionError
    from tests.helpers import broker_behind_proxy

    with broker_behind_proxy(str(tmp_path / "data"), seed=3) as (proxy, broker):
        with Admin(bootstrap_servers=broker.bootstrap) as admin:
            admin.create_topics({"plain-big": 1})
        with Producer(bootstrap_servers=broker.bootstrap, linger_ms=50) as producer:
            for _ in range(20):
                producer.send("plain-big", b"v" * 200, partition=0)
        proxy.cut_fetches("partition_max_bytes")
        source = OnceflowDataSource(source_options(proxy.address, subscribe="plain-big", **{"kafka.max.partition.fetch.bytes": "1024"}))
        reader = source.streamReader(source.schema())
        begun = time.monotonic()
        with pytest.raises(OptionError, match="raise max.partition.fetch.bytes .* the option kafka.max.partition.fetch.bytes"):
            list(read_range(reader.source, OffsetRange("plain-big", 0, 0, 20), reader.schema))
        assert time.monotonic() - begun < 10


def test_a_read_stopped_early_stops_its_fetching_thread_and_consumer(embedded_broker):
    """Spark may stop reading a range before its end (a LIMIT, a failed
    task): the thread fetching ahead stops and its consumer closes."""
    import threading

    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"plain-early": 1})
    write(embedded_broker.bootstrap, "plain-early", 2000)
    source = OnceflowDataSource(source_options(embedded_broker.bootstrap, subscribe="plain-early", **{"kafka.max.partition.fetch.bytes": "2048"}))
    reader = source.streamReader(source.schema())

    def ours() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith(("onceflow-source-", "onceflow-consumer"))]

    before = ours()
    batches = read_range(reader.source, OffsetRange("plain-early", 0, 0, 2000), reader.schema)
    first = next(batches)
    assert first.column("offset").to_pylist()[0] == 0 and first.num_rows < 2000
    assert len(ours()) > len(before), "fetching runs on threads of its own"
    batches.close()
    assert ours() == before
