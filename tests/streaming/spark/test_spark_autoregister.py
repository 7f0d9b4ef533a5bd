"""``format("onceflow")`` without ``streaming.spark.register``: PySpark 4
finds the installed ``pyspark_onceflow`` module's ``DefaultSource`` by
itself. A program of its own (a fresh JVM: Spark looks its static Python
data sources up once per JVM), with PYSPARK_PYTHON naming this interpreter
as the README says a plain SparkSession needs. PySpark finds the module by
scanning sys.path's folders (``pkgutil.iter_modules``), which a regular
install's site-packages is; setuptools' editable install (the README's
``pip install -e``) serves modules through an import hook that scan does not
see, so the repository is put on PYTHONPATH here, as a regular install
would put the module on the path."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from faults.process import REPO
from txn import Admin, Producer

pytestmark = pytest.mark.slow

PROGRAM = """
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
rows = (spark.read.format("onceflow").option("kafka.bootstrap.servers", sys.argv[1]).option("subscribe", "auto")
        .load().selectExpr("CAST(value AS STRING) AS v").collect())
print("VALUES", ",".join(sorted(r.v for r in rows)))
"""


def test_format_onceflow_works_without_register(broker_process, tmp_path):
    broker = broker_process()
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({"auto": 1})
    with Producer(bootstrap_servers=broker.bootstrap) as producer:
        for value in (b"a", b"b", b"c"):
            producer.send("auto", value)
    (tmp_path / "program.py").write_text(PROGRAM)
    environment = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONPATH=REPO)
    result = subprocess.run([sys.executable, "program.py", broker.bootstrap], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "VALUES a,b,c" in result.stdout
