"""Makes ``format("onceflow")`` work in any Spark session without
``streaming.spark.register(spark)``: PySpark 4 registers the ``DefaultSource``
of every importable top-level module named ``pyspark_*`` when a session
first looks a Python data source up (``pyspark/sql/worker/lookup_data_sources.py``).

That lookup runs in a Python worker Spark starts with ``PYSPARK_PYTHON`` (else
``python3`` from PATH), so that interpreter must have onceflow installed;
``register`` additionally points local-mode workers at the driver's own
interpreter (``streaming.spark.interpreter``).
"""

from streaming.spark.datasource import OnceflowDataSource as DefaultSource

__all__ = ["DefaultSource"]
