"""A power cut that loses a segment's index writes (``.index``,
``.timeindex``, ``.txnindex``), against a real broker process under the
power-cut model (``faults.disk``: the fsync journal, then every byte no
fsync covered lost):

- the active segment's offset and time index entries are written only at a
  roll or a clean close (a SIGKILL loses them with the process), its
  ``.txnindex`` entries at each abort but fsynced only at a roll or a clean
  close, so a cut loses them; recovery rebuilds them all from the log (the
  offset and time indexes by its scan, the aborted transactions by the
  producer-state replay), and reads by offset, by time and with
  read_committed give what they gave before the cut;
- what recovery rebuilt it fsynced, through the same ``DiskIO`` as the log,
  so the journal covers it: a second cut after the broker trusted the
  rebuilt files (its open marked the log clean) loses none of them. When
  the index files bypassed the seam, the journal never saw those fsyncs: the
  second cut emptied all three trusted files and a read by time found
  nothing (the ``.txnindex`` came back only because no producer snapshot
  covered its markers, so the replay indexed them again).
"""

from __future__ import annotations

import glob
import os
import time

import pytest

from faults.disk import FSYNC_JOURNAL_VARIABLE, lose_unsynced
from storage.txn_index import ENTRY_SIZE as TXN_ENTRY_SIZE
from tests.helpers import read_values
from txn import Admin, Producer, TopicPartition

TOPIC = "indexed"
TRANSACTIONS, RECORDS_EACH = 6, 3
INDEX_SUFFIXES = (".index", ".timeindex", ".txnindex")


def index_files(data_dir: str) -> list[str]:
    return sorted(path for suffix in INDEX_SUFFIXES for path in glob.glob(os.path.join(data_dir, f"{TOPIC}-0", "*" + suffix)))


def offsets_for_times(bootstrap: str, timestamps: list[int]) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "times", "enable.auto.commit": False})
    try:
        found = consumer.offsets_for_times([TopicPartition(TOPIC, 0, timestamp) for timestamp in timestamps], 10)
        return [tp.offset for tp in found]
    finally:
        consumer.close()


def read_from(bootstrap: str, offset: int, expect: int) -> list[bytes]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "from", "isolation.level": "read_uncommitted", "enable.auto.commit": False})
    consumer.assign([TopicPartition(TOPIC, 0, offset)])
    values: list[bytes] = []
    try:
        for _ in range(100):
            for message in consumer.consume(expect, 0.2):
                assert message.error() is None, message.error()
                values.append(message.value())
            if len(values) >= expect:
                break
        return values
    finally:
        consumer.close()


@pytest.mark.slow
def test_index_writes_a_power_cut_lost_are_rebuilt_and_what_recovery_rebuilt_survives_the_next_cut(broker_process, tmp_path):
    broker = broker_process(env={FSYNC_JOURNAL_VARIABLE: str(tmp_path / "first.journal")})
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({TOPIC: 1}, configs={TOPIC: {"index.interval.bytes": "1"}})  # an offset-index entry per batch
    producer = Producer(bootstrap_servers=broker.bootstrap, transactional_id="indexed-writer", linger_ms=0)
    producer.init_transactions()
    written, committed, timestamps = [], [], {}
    future = int(time.time() * 1000) + 3_600_000  # above the markers' (the broker's clock): a lookup by time finds a record
    for k in range(TRANSACTIONS):
        producer.begin_transaction()
        values = [b"t%d-%d" % (k, j) for j in range(RECORDS_EACH)]
        for value in values:
            timestamp = future + 1_000 * len(written)
            offset = producer.send(TOPIC, value, partition=0, timestamp=timestamp).result(10).offset  # a batch each
            timestamps[offset] = timestamp
            written.append(value)
        if k % 2:
            producer.abort_transaction()
        else:
            producer.commit_transaction()
            committed += values
    producer.close()
    # EndTxn is answered once the decision is durable; the markers (and the
    # aborts' .txnindex entries) follow: the cut comes once every one is written.
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        partition = TopicPartition(TOPIC, 0)
        deadline = time.monotonic() + 30
        while admin.list_offsets({partition: "latest"})[partition].offset < admin.list_offsets({partition: "latest"}, isolation_level="read_uncommitted")[partition].offset:
            assert time.monotonic() < deadline, "the last transaction's marker was not written in 30 s"
            time.sleep(0.05)
    middle = sorted(timestamps)[len(timestamps) // 2]

    def reads_as_before(when: str) -> None:
        assert read_values(broker.bootstrap, TOPIC, partitions=1, expect=len(committed)) == committed, f"read_committed {when}"
        assert read_values(broker.bootstrap, TOPIC, partitions=1, isolation="read_uncommitted", expect=len(written)) == written, f"everything {when}"
        assert read_from(broker.bootstrap, middle, len(timestamps) - len(timestamps) // 2)[0] == written[len(timestamps) // 2], f"a read from an offset {when}"
        assert offsets_for_times(broker.bootstrap, [timestamps[middle]]) == [middle], f"a read by time {when}"

    # The first cut: the .txnindex entries were written, never fsynced, and are lost whole.
    broker.kill()
    damage = lose_unsynced(str(tmp_path / "first.journal"), index_files(broker.data_dir))
    assert [(os.path.splitext(d.path)[1], d.size_before, d.size_after) for d in damage] == [(".txnindex", TRANSACTIONS // 2 * TXN_ENTRY_SIZE, 0)]
    broker.env = {FSYNC_JOURNAL_VARIABLE: str(tmp_path / "second.journal")}  # one journal per run
    broker.start()
    reads_as_before("after recovery rebuilt the indexes")
    sizes = {os.path.splitext(path)[1]: os.path.getsize(path) for path in index_files(broker.data_dir)}
    assert all(sizes.get(suffix) for suffix in INDEX_SUFFIXES), f"recovery wrote every index: {sizes}"

    # The second cut: the broker now trusts the rebuilt files, which recovery fsynced.
    broker.kill()
    damage = lose_unsynced(str(tmp_path / "second.journal"), index_files(broker.data_dir))
    broker.env = None
    broker.start()
    reads_as_before(f"after a second cut (it cut {[(os.path.basename(d.path), d.size_before, d.size_after) for d in damage]})")
    assert not damage, "what recovery rebuilt was durable"
