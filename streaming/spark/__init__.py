"""The ``onceflow`` Spark data source: a Structured Streaming source that
reads committed records only, and an exactly-once sink through Kafka
transactions, built on PySpark's Python Data Source API (no JVM jar).

    import streaming.spark
    streaming.spark.register(spark)       # format("onceflow") in this session
    events = spark.readStream.format("onceflow").option("kafka.bootstrap.servers", "127.0.0.1:9092").option("subscribe", "payments").load()

Importing this package does not import pyspark or start Spark: the data
source class (``streaming.spark.datasource``) is loaded by ``register``.
Without ``register``, PySpark 4 finds the data source by itself through the
installed ``pyspark_onceflow`` module (a regular install; its lookup worker
must run an interpreter with onceflow, see ``streaming.spark.interpreter``).
``local_session`` starts a lean local session with the data source
registered (for scripts, tests, the demo and the benchmarks).
The option names are those of Spark's Kafka connector (``options``).
"""

from __future__ import annotations

import os
import sys

# A small local session starts in a few seconds less and uses less memory
# with these: no UI, no adaptive execution, the serial collector and the
# JIT's first tier only (measured in ../shared/notes/spark-datasource.md).
LEAN_LOCAL_CONFIG = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
}


def register(spark) -> None:
    """Register the ``onceflow`` data source with ``spark`` (a SparkSession).

    In local mode Spark's Python workers are pointed at this interpreter
    when ``PYSPARK_PYTHON`` is unset (Spark would start ``python3`` from
    PATH, which may not have onceflow); an interpreter that was set and
    cannot import onceflow is refused with one line saying what to set
    (``streaming.spark.interpreter``)."""
    from streaming.spark.datasource import OnceflowDataSource
    from streaming.spark.interpreter import choose_worker_python

    choose_worker_python(spark.sparkContext)  # before register: Spark records the interpreter with the data source
    spark.dataSource.register(OnceflowDataSource)


def describe(query) -> str:
    """One line about a running (or stopped) streaming query: the offsets
    its onceflow source reached, the last-stable-offset lag per partition,
    and the open transactions on its onceflow output topic."""
    from streaming.spark.progress import describe_query

    return describe_query(query)


def local_session(app_name: str = "onceflow", *, master: str = "local[2]", shuffle_partitions: int = 2, config: dict | None = None):
    """A lean local SparkSession (``LEAN_LOCAL_CONFIG``, Spark's Python
    workers on this interpreter) with the ``onceflow`` data source
    registered. ``config`` adds or overrides settings."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {**LEAN_LOCAL_CONFIG, "spark.sql.shuffle.partitions": str(shuffle_partitions), **(config or {})}
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
