"""The Spark sink driver's per-batch commit time: ``handles`` open task
transactions (written by the sink's own task half, no Spark session), then
the driver's ``commit`` of the batch (open-check, decision, EndTxn of
every handle, leftovers), timed on kept clients as Spark's long-lived
commit worker runs it. The first batch warms up (decision topic, clients).

``python -m benchmarks.sink_commit [handles] [batches]``
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid


def measure(bootstrap: str, handles: int, batches: int) -> list[float]:
    import pyarrow as pa
    from pyspark.sql.types import StringType, StructField, StructType

    from streaming.spark.sink import make_stream_writer, validate_schema
    from streaming.spark.sink_task import TaskIdentity, write_task
    from txn import Admin

    with Admin(bootstrap) as admin:
        admin.create_topics({"out": 4})
    schema = StructType([StructField("key", StringType()), StructField("value", StringType())])
    writer = make_stream_writer({"kafka.bootstrap.servers": bootstrap, "topic": "out", "transactionalIdPrefix": f"bench-{uuid.uuid4().hex[:6]}"}, schema)
    columns = validate_schema(schema, "out")
    query, run = str(uuid.uuid4()), str(uuid.uuid4())
    seconds = []
    for batch in range(batches + 1):
        rows = pa.RecordBatch.from_pydict({"key": [f"k{i}" for i in range(10)], "value": [f"v{i}" for i in range(10)]})
        messages = [write_task(writer.options, columns, iter([rows]), TaskIdentity(query, run, batch, p, 0)) for p in range(handles)]
        began = time.perf_counter()
        writer.commit(messages, batch)
        if batch:  # batch 0 warms up
            seconds.append(time.perf_counter() - began)
    return seconds


if __name__ == "__main__":
    from faults.process import BrokerProcess

    handles = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    batches = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    data = tempfile.mkdtemp(prefix="onceflow-bench-commit-")
    broker = BrokerProcess(os.path.join(data, "broker")).start()
    try:
        seconds = measure(broker.bootstrap, handles, batches)
        print(f"driver commit of {handles} handles: median {statistics.median(seconds) * 1000:.0f} ms over {batches} batches ({', '.join(f'{s * 1000:.0f}' for s in seconds)} ms)")
    finally:
        broker.kill()
        shutil.rmtree(data, ignore_errors=True)
