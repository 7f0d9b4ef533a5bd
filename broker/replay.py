"""Reading a whole partition log back in offset order, batch by batch: how the
coordinators rebuild their state at start (and how the demo checks its log).
Internal topics are replayed to their log end, beyond the high watermark:
whatever recovery kept is what the coordinator wrote before the crash."""

from __future__ import annotations

from typing import Iterator

from protocol.records import RecordBatch, decode_batch, iter_batches

READ_CHUNK = 1 << 24


def replay(partition_log) -> Iterator[RecordBatch]:
    offset = partition_log.log_start_offset
    while offset < partition_log.log_end_offset:
        data = partition_log.read(offset, READ_CHUNK, max_offset=partition_log.log_end_offset)
        if not data:
            return
        for position, header in iter_batches(data):
            offset = header.next_offset
            yield decode_batch(data, position)
