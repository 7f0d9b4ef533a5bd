"""A Spark query from topic to topic through the onceflow source and the
exactly-once sink, run as its own process group by the sink's crash tests
(test_spark_sink_crash.py), and the crash point hook its Python workers call.

    python spark_sink_driver.py BOOTSTRAP CHECKPOINT PREFIX PARTITIONS [key=value sink options...]

reads topic ``input`` from the earliest offset, 20 offsets per microbatch,
repartitions to PARTITIONS tasks (so a restart can change the partitioning)
and writes key and value to topic ``output``; exits 0 once everything
available is written, 1 when the query fails.

The crash points are chosen by the composing process, this one, as the
architecture wants: ``SPARK_SINK_CRASH="point@hit:action"`` (faults.points'
syntax) is read by ``crash_point``, which the sink calls through its
``crashPointHook`` option. Passes are counted in files under
``SPARK_SINK_CRASH_DIR``, so the hit count is global across Spark's Python
workers (a commit and a task run in different processes). Actions: ``kill``
SIGKILLs this driver's whole process group (the JVM, its Python workers)
and the caller's own group (the worker daemon's); ``exit`` ends only the
calling Python worker (a task dies mid-write and Spark retries it);
``raise`` makes the sink's call raise (a commit that fails: Spark calls
``abort`` and stops the query).
"""

from __future__ import annotations

import json
import os
import signal
import sys

CRASH = "SPARK_SINK_CRASH"
CRASH_DIR = "SPARK_SINK_CRASH_DIR"
DRIVER_GROUP = "SPARK_SINK_DRIVER_PGID"


def crash_point(name: str) -> None:
    from faults.points import parse

    armed = parse(os.environ.get(CRASH, "")).get(name)
    if armed is None:
        return
    hit, action = armed
    folder = os.environ[CRASH_DIR]
    counter = os.path.join(folder, name + ".passes")
    with open(counter, "a") as file:
        file.write(f"{os.getpid()}\n")
    with open(counter) as file:
        passes = sum(1 for _ in file)
    if passes != hit:
        return
    with open(os.path.join(folder, "fired"), "a") as file:
        file.write(f"{name}@{hit}:{action}\n")
    if action == "kill":
        os.killpg(int(os.environ[DRIVER_GROUP]), signal.SIGKILL)
        os.killpg(os.getpgid(0), signal.SIGKILL)
    if action == "raise":
        from faults.points import CrashPointReached

        raise CrashPointReached(name)
    os._exit(86)


def main(argv: list[str]) -> int:
    bootstrap, checkpoint, prefix, partitions, *extra = argv
    os.environ[DRIVER_GROUP] = str(os.getpgid(0))

    import streaming.spark

    # Up to 4 attempts per task in local mode: a task that died is retried. SPARK_SINK_MASTER and
    # SPARK_SINK_CONFIG (JSON) run the query on a cluster instead (test_spark_cluster_driver.py).
    master = os.environ.get("SPARK_SINK_MASTER", "local[2,4]")
    spark = streaming.spark.local_session("onceflow-sink-crash", master=master, config=json.loads(os.environ.get("SPARK_SINK_CONFIG", "{}")))
    events = (
        spark.readStream.format("onceflow")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", "input")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 20)
        .load()
    )
    writer = (
        events.selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value")
        .repartition(int(partitions))
        .writeStream.format("onceflow")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", "output")
        .option("transactionalIdPrefix", prefix)
        .option("crashPointHook", "spark_sink_driver:crash_point")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
    )
    for item in extra:
        key, _, value = item.partition("=")
        writer = writer.option(key, value)
    query = writer.start()
    try:
        query.processAllAvailable()
    except Exception as error:
        print(f"QUERY FAILED: {error}", flush=True)
        return 1
    finally:
        query.stop()
    print(f"DONE {query.lastProgress and query.lastProgress.get('batchId')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
