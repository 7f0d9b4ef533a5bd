"""The ``onceflow`` source and sink through Spark Connect: a Connect server
started from what the pyspark wheel ships (``sbin/start-connect-server.sh
--wait``, local mode, a free port), a client session from
``SparkSession.builder.remote(...)``, the data source registered from the
client (its class travels to the server pickled; the server's Python
workers import onceflow), a batch read and a streaming query from topic to
topic through the exactly-once sink, read back read_committed.

Needs pyspark's Connect client (``pip install pyspark[connect]``: grpcio,
pandas); skipped without it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.helpers import free_port, wait_for


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    pytest.importorskip("grpc")
    pytest.importorskip("pandas")
    import pyspark

    home = os.path.dirname(pyspark.__file__)
    folder = tmp_path_factory.mktemp("spark-connect")
    port = free_port()
    environment = dict(os.environ, SPARK_HOME=home, PYSPARK_PYTHON=sys.executable, SPARK_LOG_DIR=str(folder / "logs"), SPARK_PID_DIR=str(folder),
                       PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    command = [os.path.join(home, "sbin", "start-connect-server.sh"), "--wait", "--master", "local[2]",
               "--conf", f"spark.connect.grpc.binding.port={port}", "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
               "--conf", "spark.ui.enabled=false", "--conf", f"spark.pyspark.python={sys.executable}",
               "--conf", "spark.driver.extraJavaOptions=-XX:+UseSerialGC -XX:TieredStopAtLevel=1"]
    with open(folder / "server.log", "wb") as log:
        server = subprocess.Popen(command, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def listening() -> bool:
            assert server.poll() is None, (folder / "server.log").read_text()[-3000:]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

        wait_for(listening, timeout=300, what="the Spark Connect server to listen")
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(30)


@pytest.fixture
def connect_client_leaves_no_trace():
    """``builder.remote()`` sets SPARK_CONNECT_MODE_ENABLED in os.environ and
    ``spark.remote`` in the builder PySpark shares per process, which turn
    every later SparkSession of this xdist worker, and of each process it
    starts, into a Connect client ("CONNECT_URL_NOT_SET"): both go back to
    what they were."""
    from pyspark.sql import SparkSession

    names = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
    before = {name: os.environ.get(name) for name in names}
    remote = SparkSession.builder._options.get("spark.remote")
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if remote is None:
            SparkSession.builder._options.pop("spark.remote", None)


@pytest.mark.slow
def test_source_and_sink_through_spark_connect(connect_server, connect_client_leaves_no_trace, broker_process, tmp_path):
    from pyspark.sql import SparkSession

    from streaming.spark.datasource import OnceflowDataSource
    from tests.helpers import read_values
    from txn import Admin, Producer

    broker = broker_process()
    with Admin(broker.bootstrap) as admin:
        admin.create_topics({"connect-in": 2, "connect-out": 2})
    with Producer(bootstrap_servers=broker.bootstrap) as producer:
        for number in range(40):
            producer.send("connect-in", f"v{number}".encode(), key=f"k{number}".encode())
        producer.flush()
    spark = SparkSession.builder.remote(connect_server).getOrCreate()
    try:
        spark.dataSource.register(OnceflowDataSource)  # streaming.spark.register needs a SparkContext, which Connect has not
        read = spark.read.format("onceflow").option("kafka.bootstrap.servers", broker.bootstrap).option("subscribe", "connect-in").load()
        assert read.count() == 40
        query = (
            spark.readStream.format("onceflow").option("kafka.bootstrap.servers", broker.bootstrap).option("subscribe", "connect-in")
            .option("startingOffsets", "earliest").load()
            .selectExpr("CAST(key AS STRING) AS key", "upper(CAST(value AS STRING)) AS value")
            .writeStream.format("onceflow").option("kafka.bootstrap.servers", broker.bootstrap).option("topic", "connect-out")
            .option("transactionalIdPrefix", "connect").option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True).start()
        )
        query.awaitTermination(300)
        assert query.exception() is None
    finally:
        spark.stop()
    values = read_values(broker.bootstrap, "connect-out", partitions=2, expect=40)
    assert sorted(values) == sorted(f"V{number}".encode() for number in range(40))
