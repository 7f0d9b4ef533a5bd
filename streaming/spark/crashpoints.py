"""The sink's named crash points and how a query names the hook that
receives them (the ``crashPointHook`` option).

Crash points are a seam, never an import of ``faults``: the process that
composes the query names a ``module:function`` in the ``crashPointHook``
option, and the sink calls it with each point's name in whichever Spark
process passes there (the test driver's hook arms points from the
environment with ``faults.points``' syntax and SIGKILLs the driver's process
group). Without the option the points cost one call to a no-op.
"""

from __future__ import annotations

import importlib

from streaming.spark.decision import SinkError

TASK_BEFORE_HANDLE = "spark_sink.task_before_handle"  # executor: rows sent, transaction open, no handle returned
BEFORE_DECISION = "spark_sink.before_decision"  # driver: tasks done, nothing decided
AFTER_DECISION = "spark_sink.after_decision"  # driver: decision durable, nothing committed
AFTER_COMMIT = "spark_sink.after_commit"  # driver: after each decided transaction's commit (a batch's hit 1 or 2: exactly that many of n committed; the rest commit side by side, so hit k >= 3: at least k)
AFTER_ALL_COMMITS = "spark_sink.after_all_commits"  # driver: all committed, Spark's commit log not yet written
CRASH_POINTS = (TASK_BEFORE_HANDLE, BEFORE_DECISION, AFTER_DECISION, AFTER_COMMIT, AFTER_ALL_COMMITS)


def resolve_hook(spec: str | None):
    """``module:function`` -> the function; None -> a no-op."""
    if not spec:
        return no_crash
    module, _, name = spec.partition(":")
    if not module or not name:
        raise SinkError(f"crashPointHook must be module:function, not {spec!r}")
    return getattr(importlib.import_module(module), name)


def no_crash(name: str) -> None:
    pass


