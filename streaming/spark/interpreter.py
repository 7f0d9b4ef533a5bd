"""Which Python interpreter Spark's Python workers run, and making it one
that can import onceflow.

Spark starts its Python workers (the data source's planner on the driver,
the readers and writers on executors) with the interpreter the driver's
``SparkContext.pythonExec`` names: ``PYSPARK_PYTHON`` as it was when the
context started, else ``python3`` from PATH. A user who runs a script with
a virtualenv's python by path (``.venv/bin/python quick.py``) without
activating the venv gets a ``python3`` that cannot import onceflow, and the
query dies deep inside a Java and Python traceback.

``choose_worker_python`` runs in ``register`` (before the data source is
handed to Spark, which records the interpreter with it):

- local mode with no interpreter chosen (``PYSPARK_PYTHON`` unset): the
  workers run on this machine, so they get ``sys.executable``, the
  interpreter that already imports onceflow;
- local mode with an interpreter chosen: it is checked once (a short
  subprocess) and one line names what to set when it cannot import
  onceflow;
- any other master: executors may live elsewhere, where the driver's path
  means nothing; nothing is changed (set ``PYSPARK_PYTHON`` before the
  session starts to an interpreter with onceflow installed there).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys

log = logging.getLogger(__name__)

SPARK_DEFAULT_PYTHON = "python3"  # pyspark/core/context.py, when PYSPARK_PYTHON is unset


class WorkerPythonError(RuntimeError):
    """Spark's Python workers would run an interpreter that cannot import onceflow."""


def choose_worker_python(spark_context) -> str:
    """Point ``spark_context``'s Python workers at an interpreter that can
    import onceflow (see the module's docstring); returns the one chosen."""
    current = spark_context.pythonExec
    if not str(spark_context.master).startswith("local"):
        return current
    if not os.environ.get("PYSPARK_PYTHON") and current == SPARK_DEFAULT_PYTHON:
        if _where(current) != os.path.abspath(sys.executable):
            log.info("Spark's Python workers will run %s (PYSPARK_PYTHON is unset, and python3 on PATH is %s)", sys.executable, _where(current))
        spark_context.pythonExec = sys.executable
        return sys.executable
    if _where(current) != os.path.abspath(sys.executable) and not imports_onceflow(current):
        raise WorkerPythonError(
            f"Spark's Python workers run {current!r} (PYSPARK_PYTHON), which cannot import onceflow: set PYSPARK_PYTHON "
            f"to an interpreter where onceflow is installed, e.g. {sys.executable}, before the SparkSession starts"
        )
    return current


def _where(command: str) -> str:
    """The path a command names, as the workers' launcher finds it (symlinks
    kept: a virtualenv's python is a link to the base interpreter, and only
    the link's location makes it the virtualenv's)."""
    return os.path.abspath(command if os.sep in command else shutil.which(command) or command)


@functools.lru_cache(maxsize=8)
def imports_onceflow(interpreter: str) -> bool:
    """Whether ``interpreter`` can import the data source (a subprocess, once per interpreter)."""
    try:
        result = subprocess.run([interpreter, "-c", "import streaming.spark.datasource"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0
