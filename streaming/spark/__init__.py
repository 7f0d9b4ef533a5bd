"""The ``onceflow`` Spark data source: a Structured Streaming source that
reads committed records only, and an exactly-once sink through Kafka
transactions, built on PySpark's Python Data Source API (no JVM jar).

    import streaming.spark
    streaming.spark.register(spark)       # format("onceflow") in this session
    events = spark.readStream.format("onceflow").option("kafka.bootstrap.servers", "127.0.0.1:9092").option("subscribe", "payments").load()

Importing this package does not import pyspark or start Spark: the data
source class (``streaming.spark.datasource``) is loaded by ``register``.
The option names are those of Spark's Kafka connector (``options``).
"""

from __future__ import annotations


def register(spark) -> None:
    """Register the ``onceflow`` data source with ``spark`` (a SparkSession)."""
    from streaming.spark.datasource import OnceflowDataSource

    spark.dataSource.register(OnceflowDataSource)


def describe(query) -> str:
    """One line about a running (or stopped) streaming query: the offsets
    its onceflow source reached, the last-stable-offset lag per partition,
    and the open transactions on its onceflow output topic."""
    from streaming.spark.progress import describe_query

    return describe_query(query)
