"""CPU of the onceflow Spark source's reader alone, outside Spark, beside
the floor's reader: ``python -m benchmarks.spark_reader [ROWS] [--rounds N]``.

The reader is built as Spark builds it: the data source's stream reader
plans one AvailableNow batch of the bench topic (``spark_source.fill_topic``:
ROWS records of 100 B on two partitions) into offset ranges, and reader and
ranges are pickled as an executor gets them. Each range is read in turn in
this process and every Arrow batch it yields is written as an Arrow IPC
stream (to /dev/null), as Spark's Python worker writes them to the JVM.
The figure is the process's CPU seconds (every thread: the fetching and
decoding ones too) per 1M rows, the median over the rounds; the floor is
``spark_source``'s no-op reader (Arrow batches built once) read the same
way. Rounds alternate the two; the first of each is a warm-up (imports).
"""

from __future__ import annotations

import os
import pickle
import statistics
import time


def pickled_reader(reader, start: dict, end: dict) -> tuple[bytes, list[bytes]]:
    """The reader and its ranges for one batch, as Spark ships them to executors."""
    from pyspark import cloudpickle

    return cloudpickle.dumps(reader), [cloudpickle.dumps(partition) for partition in reader.partitions(start, end)]


def onceflow_reader(bootstrap: str, topic: str) -> tuple[bytes, list[bytes]]:
    from streaming.spark.datasource import OnceflowDataSource

    source = OnceflowDataSource({"kafka.bootstrap.servers": bootstrap, "subscribe": topic, "startingOffsets": "earliest"})
    reader = source.streamReader(source.schema())
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    try:
        return pickled_reader(reader, start, reader.latestOffset(start, reader.getDefaultReadLimit()))
    finally:
        reader.stop()


def floor_reader(rows: int) -> tuple[bytes, list[bytes]]:
    from benchmarks.spark_source import floor_source_class

    source = floor_source_class()({"rows": str(rows)})
    return pickled_reader(source.streamReader(source.schema()), {"offset": 0}, {"offset": rows})


def cpu_per_million_rows(shipped: tuple[bytes, list[bytes]]) -> float:
    """Read every range of ``shipped`` as an executor would; CPU s per 1M rows."""
    import pyarrow as pa

    reader_bytes, partitions = shipped
    rows = 0
    began = time.process_time()
    for partition in partitions:
        reader = pickle.loads(reader_bytes)
        with pa.OSFile(os.devnull, "wb") as sink:
            stream = None
            for batch in reader.read(pickle.loads(partition)):
                if stream is None:
                    stream = pa.ipc.new_stream(sink, batch.schema)
                stream.write_batch(batch)
                rows += batch.num_rows
            if stream is not None:
                stream.close()
    return (time.process_time() - began) / max(rows, 1) * 1e6


if __name__ == "__main__":
    import argparse
    import shutil
    import tempfile

    from benchmarks.spark_source import SPARK_ROWS, fill_topic
    from faults.process import BrokerProcess

    parser = argparse.ArgumentParser(prog="python -m benchmarks.spark_reader", description="The onceflow source's reader alone beside the floor's (see the module doc).")
    parser.add_argument("rows", nargs="?", type=int, default=SPARK_ROWS)
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds after the warm-up (default 3)")
    options = parser.parse_args()
    data = tempfile.mkdtemp(prefix="onceflow-bench-reader-")
    broker = BrokerProcess(os.path.join(data, "broker")).start()
    try:
        readers = {"onceflow": onceflow_reader(broker.bootstrap, fill_topic(broker.bootstrap, options.rows)), "floor": floor_reader(options.rows)}
        figures: dict[str, list[float]] = {name: [] for name in readers}
        for round_index in range(options.rounds + 1):
            for name, shipped in readers.items():
                cpu = cpu_per_million_rows(shipped)
                if round_index:
                    figures[name].append(cpu)
        for name, values in figures.items():
            print(f"{name:<10}{statistics.median(values):8.3f} s CPU per 1M rows (median of {len(values)}; {', '.join(f'{v:.3f}' for v in values)})")
    finally:
        broker.kill()
        shutil.rmtree(data, ignore_errors=True)
