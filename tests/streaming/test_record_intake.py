"""The runner's input records: what ``streaming.task.fetched_records`` makes
of the column batches its consumer polls is what the per-record consumer
handed out before (every field, headers, null keys and values, empty
bytes, a batch with and without headers), and the processors see the same
records through every format."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from faults.process import REPO
from streaming import App
from streaming.task import FetchedRecord, Task, fetched_records
from txn import Admin, Producer, TopicPartition
from txn.aio import Consumer as AsyncConsumer

FIELDS = ("topic", "partition", "offset", "timestamp", "key", "value", "headers")


def write_inputs(bootstrap: str) -> None:
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics({"in": 2})
    with Producer(bootstrap_servers=bootstrap, linger_ms=5) as producer:
        for n in range(60):
            key = None if n % 5 == 0 else (b"" if n % 7 == 0 else b"k%d" % n)
            value = None if n % 6 == 0 else (b"" if n % 11 == 0 else json.dumps({"n": n, "text": "\u00e9" * (n % 3)}).encode())
            # partition 1 carries no headers at all (the batch's headers column is empty)
            headers = [("h", b"%d" % n), ("none", None)] if n % 3 == 0 and n % 2 == 0 else None
            producer.send("in", value, key=key, partition=n % 2, headers=headers, timestamp=1_700_000_000_000 + n)


async def read(bootstrap: str, columnar: bool) -> list:
    partitions = [TopicPartition("in", 0), TopicPartition("in", 1)]
    consumer = AsyncConsumer(bootstrap_servers=bootstrap, max_poll_records=7)
    consumer.assign(partitions)
    for tp in partitions:
        consumer.seek(tp, 0)
    records: list = []
    try:
        while len(records) < 60:
            if columnar:
                for tp, columns in (await consumer.poll_columns(1.0, 7)).items():
                    records += fetched_records(tp.topic, tp.partition, columns)
            else:
                records += await consumer.poll(1.0)
    finally:
        await consumer.close()
    return sorted(records, key=lambda r: (r.partition, r.offset))


def test_fetched_records_hold_what_the_consumer_handed_out(embedded_broker, tmp_path):
    write_inputs(embedded_broker.bootstrap)
    before = asyncio.run(read(embedded_broker.bootstrap, columnar=False))
    after = asyncio.run(read(embedded_broker.bootstrap, columnar=True))
    assert all(isinstance(record, FetchedRecord) for record in after)
    assert [tuple(getattr(r, f) for f in FIELDS) for r in after] == [tuple(getattr(r, f) for f in FIELDS) for r in before]
    assert any(r.key is None for r in after) and any(r.value is None for r in after) and any(r.key == b"" for r in after)
    assert any(r.headers == (("h", b"0"), ("none", None)) for r in after)
    assert all(r.headers == () for r in after if r.partition == 1)
    assert all(type(r.key) in (bytes, type(None)) and type(r.value) in (bytes, type(None)) for r in after)
    assert "FetchedRecord(topic='in'" in repr(after[0])

    # Processors see the same records through every format, dead letters included.
    app = App(bootstrap_servers=embedded_broker.bootstrap, application_id="intake", state_dir=str(tmp_path), on_error="dead-letter")
    seen: list = []
    for name, fmt in (("as_bytes", "bytes"), ("as_str", "str"), ("as_json", "json"), ("as_auto", "auto")):
        def remember(record, ctx, name=name):
            seen.append((name, record.key, record.value, record.topic, record.partition, record.offset, record.timestamp, record.headers))
            ctx.emit(record.key, record.value)

        app.processor(source="in", sink="out", name=name, key_format=fmt if fmt != "json" else "bytes", value_format=fmt)(remember)
    task = Task(app, lambda name, partition: None)

    def through_task(records) -> tuple[list, list]:
        seen.clear()
        outputs = [task.process(record) for record in records]
        return list(seen), outputs

    seen_before, outputs_before = through_task(before)
    seen_after, outputs_after = through_task(after)
    assert seen_after == seen_before and outputs_after == outputs_before
    assert len(seen_before) > 3 * 60  # bytes, str and auto saw every record, json those of JSON (or null) values
    assert any(output[0] == app.dead_letter_topic for outputs in outputs_after for output in outputs)


PANDAS_FREE = """
import sys
import numpy as np
from protocol.columnar import decode_fetched, encode_columns, encode_records
from streaming.runner import load_columnar
from streaming.task import fetched_records
from txn.column_batches import binary_array, int64_array, murmur2_partitions, present_mask
load_columnar()
key, value = binary_array([None, b"k", b""]), binary_array([b"v", None, b"w"])
encode_records(key=key, value=value, timestamp=int64_array([1, 2, 3]))
section = encode_columns(key=key, value=value, timestamp=np.array([1, 2, 3]), base_offset=0)
records = fetched_records("t", 0, decode_fetched(section, [], start_offset=0).columns)
assert [(r.key, r.value) for r in records] == [(None, b"v"), (b"k", None), (b"", b"w")]
murmur2_partitions(key, 4)[~present_mask(key)]
assert "pandas" not in sys.modules, "pandas was imported"
"""


def test_the_runners_columns_never_import_pandas():
    """``pyarrow.array`` and ``to_numpy`` import pandas (when installed) on
    their first call, a second of every instance's start-up: the runner's
    columnar path (decode, records, emits' columns, encode, partitions)
    builds its arrays from buffers instead."""
    pytest.importorskip("pandas")
    subprocess.run([sys.executable, "-c", PANDAS_FREE], check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, timeout=120)
