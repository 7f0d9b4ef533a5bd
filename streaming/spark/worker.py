"""What a Spark Python worker sets up at the start of each task that reads
or writes for onceflow: the process-wide policies of its memory.

Spark runs a data source's ``read`` and ``write`` in Python workers forked
from ``pyspark.daemon`` and reused from task to task; after every task the
daemon's loop calls ``gc.collect()``. A full collection walks every object
the garbage collector tracks, and a worker that has imported pyspark,
pyarrow, numpy and onceflow holds about 90,000 of them: measured on the
Spark sink's benchmark (``benchmarks.spark_source``), 40-55 ms of CPU per
collection, four per micro-batch (two source tasks, two sink tasks); with
them frozen out (below) the four workers' CPU per batch fell from 0.80 to
0.65 s (medians of 10 alternated batches; the batch's time did not
measurably change). Nearly all of those objects are modules, classes and
functions that live as long as the process.

``prepare_worker_process()`` runs at the start of each task (the source's
``read_range``, the sink's ``write_task``):

- ``protocol.allocator.keep_freed_buffers()`` (once per process): freed
  MiB-sized frames and batches stay in the heap for the next ones;
- ``gc.freeze()`` while the collector tracks more than
  ``FREEZE_ABOVE_TRACKED`` objects: what exists at that moment moves to the
  collector's permanent generation, which later collections do not walk.
  A task starts right after the daemon's collection, so what is tracked
  then is alive: the imports and pyspark's worker, and at the first tasks
  the modules they imported lazily (pyarrow.compute, pandas, onceflow's
  codec: measured, 56,000 objects at a worker's first task and 35,000 more
  at its second). Once those are frozen a task starts with a few thousand
  tracked objects and nothing more is frozen; the collections after each
  task then walk what that task made. Frozen objects are still freed when
  their last reference goes; only a reference cycle among them would stay
  (the task's own set-up objects at those first freezes, a bounded few).

Only inside a Spark task (``TaskContext``): a test or a script that calls
the reader or writer directly keeps its collector as it is.
"""

from __future__ import annotations

import gc

from protocol.allocator import keep_freed_buffers

# Fewer tracked objects than this at a task's start: the imports are frozen
# already (a task's start holds a few thousand once they are).
FREEZE_ABOVE_TRACKED = 10_000


def prepare_worker_process() -> None:
    """The set-up above, at a task's start."""
    keep_freed_buffers()
    if _in_spark_task():
        freeze_if_many_tracked()


def freeze_if_many_tracked(threshold: int = FREEZE_ABOVE_TRACKED) -> bool:
    """``gc.freeze()`` when the collector tracks more than ``threshold``
    objects (frozen ones are not counted); whether it froze."""
    if len(gc.get_objects()) <= threshold:
        return False
    gc.freeze()
    return True


def _in_spark_task() -> bool:
    try:
        from pyspark import TaskContext
    except ImportError:
        return False
    return TaskContext.get() is not None
