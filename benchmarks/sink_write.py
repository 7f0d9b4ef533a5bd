"""The exactly-once Spark sink's own path, without a Spark session: one
task's ``write_task`` of ``rows`` rows of 100 B (Arrow batches of 10,000
rows, as Spark hands them over; null keys, as the Spark bench's source
gives) into a topic of two partitions made as the Spark bench makes its
output topic, then the driver's commit of the
handle; rows/s over both, the output counted by a read_committed reader.
What Spark adds around it is in ``benchmarks.spark_source``.

``python -m benchmarks.sink_write [rows]``
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import uuid

ARROW_ROWS = 10_000


def measure(bootstrap: str, rows: int) -> tuple[float, float]:
    """(seconds writing, seconds committing)."""
    import pyarrow as pa
    from pyspark.sql.types import BinaryType, StructField, StructType

    from benchmarks.spark_source import committed_records, create_topic
    from streaming.spark.sink import make_stream_writer, validate_schema
    from streaming.spark.sink_task import TaskIdentity, write_task

    topic = create_topic(bootstrap)
    schema = StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])
    writer = make_stream_writer({"kafka.bootstrap.servers": bootstrap, "topic": topic, "transactionalIdPrefix": f"bench-{uuid.uuid4().hex[:6]}"}, schema)
    columns = validate_schema(schema, topic)
    batch = pa.RecordBatch.from_pydict({"key": pa.nulls(ARROW_ROWS, pa.binary()), "value": pa.array([b"s" * 100] * ARROW_ROWS)})
    query, run = str(uuid.uuid4()), str(uuid.uuid4())
    warm = write_task(writer.options, columns, iter([batch]), TaskIdentity(query, run, 0, 0, 0))
    writer.commit([warm], 0)
    began = time.perf_counter()
    message = write_task(writer.options, columns, iter([batch] * (rows // ARROW_ROWS)), TaskIdentity(query, run, 1, 0, 0))
    written = time.perf_counter()
    writer.commit([message], 1)
    committed = time.perf_counter()
    count = committed_records(bootstrap, topic)
    expected = ARROW_ROWS + rows // ARROW_ROWS * ARROW_ROWS
    if count != expected:
        raise RuntimeError(f"{count} committed records, not {expected}")
    return written - began, committed - written


if __name__ == "__main__":
    from faults.process import BrokerProcess

    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 500_000
    data = tempfile.mkdtemp(prefix="onceflow-bench-sink-")
    broker = BrokerProcess(os.path.join(data, "broker")).start()
    try:
        write, commit = measure(broker.bootstrap, rows)
        print(f"sink task: {rows} rows written in {write:.2f} s, committed in {commit:.2f} s: {rows / (write + commit):,.0f} rows/s")
    finally:
        broker.kill()
        shutil.rmtree(data, ignore_errors=True)
