"""Which interpreter Spark's Python workers get from ``register`` (issue 35);
the end-to-end run is ``tests/test_readme.py::test_spark_quickstart_query``."""

from __future__ import annotations

import sys

import attrs
import pytest

from streaming.spark.interpreter import WorkerPythonError, choose_worker_python


@attrs.define
class Context:  # the two attributes of a SparkContext that choose_worker_python reads and writes
    master: str
    pythonExec: str


def test_local_mode_without_pyspark_python_runs_workers_on_this_interpreter(monkeypatch):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    context = Context("local[2]", "python3")
    assert choose_worker_python(context) == sys.executable
    assert context.pythonExec == sys.executable


def test_a_chosen_interpreter_that_cannot_import_onceflow_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("PYSPARK_PYTHON", sys._base_executable)  # the base interpreter: no onceflow, no pyspark
    context = Context("local[*]", sys._base_executable)
    with pytest.raises(WorkerPythonError) as raised:
        choose_worker_python(context)
    message = str(raised.value)
    assert "\n" not in message and "cannot import onceflow: set PYSPARK_PYTHON" in message and sys.executable in message
    assert context.pythonExec == sys._base_executable


def test_a_chosen_interpreter_that_imports_onceflow_is_kept(monkeypatch):
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    context = Context("local[2]", sys.executable)
    assert choose_worker_python(context) == sys.executable


def test_a_cluster_master_is_left_alone(monkeypatch):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    context = Context("spark://127.0.0.1:7077", "python3")
    assert choose_worker_python(context) == "python3"  # executors may be elsewhere: the driver's path means nothing there
