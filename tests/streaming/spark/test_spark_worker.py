"""streaming.spark.worker: a Spark Python worker freezes its imports out of
the collector's walks at its first tasks, and only inside a Spark task.

Each case runs in a fresh interpreter: gc.freeze() is process-wide and
would otherwise reach into pytest's own objects."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pyspark = pytest.importorskip("pyspark")


def _run(body: str) -> dict:
    script = textwrap.dedent(
        """
        import gc, json, sys
        import pyarrow, pyspark.sql.datasource  # what a worker holds before its first task
        from streaming.spark import worker
        """
    ) + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _inside_a_task() -> str:
    return """
        import pyspark
        pyspark.TaskContext.get = staticmethod(lambda: object())  # as inside a Spark task
        """


def test_a_first_task_freezes_what_is_imported_and_later_collections_walk_little():
    seen = _run(
        _inside_a_task()
        + """
        tracked_before = len(gc.get_objects())
        worker.prepare_worker_process()
        frozen_first = gc.get_freeze_count()
        garbage = [[i] for i in range(5000)]  # a task's own objects
        del garbage
        gc.collect()  # what the daemon does after the task
        worker.prepare_worker_process()  # the next task
        print(json.dumps({"before": tracked_before, "frozen_first": frozen_first,
                          "frozen_second": gc.get_freeze_count(), "tracked_after": len(gc.get_objects())}))
        """
    )
    assert seen["before"] > 20_000  # pyspark and pyarrow alone are tens of thousands of objects
    assert seen["frozen_first"] >= seen["before"]
    assert seen["frozen_second"] == seen["frozen_first"]  # a task's start below the threshold freezes nothing more
    assert seen["tracked_after"] < 2_000


def test_a_task_after_lazy_imports_freezes_them_too():
    seen = _run(
        _inside_a_task()
        + """
        worker.prepare_worker_process()
        first = gc.get_freeze_count()
        import pandas, pyarrow.compute  # imported lazily during a first task
        gc.collect()
        worker.prepare_worker_process()
        print(json.dumps({"first": first, "second": gc.get_freeze_count(), "tracked": len(gc.get_objects())}))
        """
    )
    assert seen["second"] > seen["first"] + 10_000
    assert seen["tracked"] < 2_000


def test_outside_a_spark_task_nothing_is_frozen():
    seen = _run(
        """
        worker.prepare_worker_process()
        print(json.dumps({"frozen": gc.get_freeze_count()}))
        """
    )
    assert seen["frozen"] == 0


def test_frozen_objects_are_still_freed_by_their_last_reference():
    seen = _run(
        _inside_a_task()
        + """
        import weakref
        class Held: pass
        held = Held()
        alive = weakref.ref(held)
        worker.freeze_if_many_tracked(threshold=0)
        del held
        print(json.dumps({"alive": alive() is not None}))
        """
    )
    assert seen["alive"] is False


def test_the_source_and_the_sink_prepare_their_worker(monkeypatch):
    import streaming.spark.sink_task as sink_task
    import streaming.spark.worker as worker

    calls = []
    monkeypatch.setattr(worker, "prepare_worker_process", lambda: calls.append("source"))
    monkeypatch.setattr(sink_task, "prepare_worker_process", lambda: calls.append("sink"))
    from streaming.spark.options import SinkOptions, parse_source_options
    from streaming.spark.source import OffsetRange, kafka_schema, read_range

    source = parse_source_options({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}, streaming=True)
    assert list(read_range(source, OffsetRange("t", 0, 5, 5), kafka_schema(False))) == []  # an empty range: no fetch
    options = SinkOptions.parse({"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t", "checkpointLocation": "/nonexistent"})
    columns = sink_task.Columns(("value",), key=False, topic=False, partition=False, headers=False, timestamp=None)
    message = sink_task.write_task(options, columns, iter([]), sink_task.TaskIdentity("q", "r", 0, 0, 0))
    assert message.records == 0
    assert calls == ["source", "sink"]
