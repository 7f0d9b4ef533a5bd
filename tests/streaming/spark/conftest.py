"""A SparkSession shared by the tests of one module (local[2], lean), with
the ``onceflow`` data source registered.

Spark's startup costs 5-10 s and about 1 GB, so each test module pays it once
(``spark`` is module-scoped) and stops the session at the end, so the next
module's session starts clean. Spark's Python workers run this interpreter.
"""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    pytest.importorskip("pyspark.sql")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    import streaming.spark

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = streaming.spark.local_session(
        "onceflow-tests", config={"spark.sql.warehouse.dir": str(warehouse), "spark.sql.streaming.stopTimeout": "30s"}
    )
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()
