"""The fetching half of ``txn.consumer.AsyncConsumer``: Fetch requests per
leader, the read_committed filter, and handing records out.

With ``isolation_level="read_committed"`` the broker stops at the last
stable offset and lists the aborted transactions in range; the consumer
drops their records and every control batch, as the Java consumer does
(``committed_records``):

    for each batch, in offset order:
        aborted transactions whose first offset <= the batch's last offset
            make their producer "aborted";
        an ABORT marker of an aborted producer ends that;
        a transactional batch of an aborted producer is skipped;
        control batches are never returned.

A fetched records section may end with a partial batch (Apache Kafka
slices its log by bytes): only the whole batches before it count, and the
next fetch starts at the partial batch's offset. When not even the first
batch came whole, fetching again would bring back the same part:
``RecordBatchTooLargeError`` names ``max.partition.fetch.bytes`` and the
batch's size (``fetched_partition``).

A fetch whose data is wholly invisible moves the position past it at once.
Positions move as records are handed out (``max_poll_records`` at a time),
so ``position()`` and ``commit()`` never run ahead of the caller. A new
partition starts at the group's committed offset or by
``auto_offset_reset``.

``poll_columns`` is the columnar way out of the same fetches: each
partition's visible records as one Arrow record batch
(``protocol.columnar.FETCHED_SCHEMA``), decoded by ``protocol.columnar``
under the same rules, with no Python object per record. It hands out a
whole fetched partition at a time, so the position moves to the fetch's
end at once, as it does when ``poll`` has handed out a fetch's last record;
with ``max_records`` it hands out at most that many rows (slices of the
fetched batches, no copy), keeps the rest for the next call, and moves the
positions as ``poll`` does: past the last row handed out, to the fetch's
end with its last. A seek, a revocation or a new assignment drops what is
kept, as it drops ``poll``'s buffers. Partitions that still hold records
fetched by ``poll`` are left to ``poll``.

``Fetcher`` is a base class of ``AsyncConsumer``, whose ``__init__`` sets
the state it works on: ``_positions`` (partition -> next offset, None until
initialized), ``_buffers`` and ``_buffer_ends`` (fetched, not yet handed
out), ``_column_buffers`` (the same for ``poll_columns``), ``cluster`` and ``config``.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import time

import attrs

from protocol.constants import IsolationLevel, OffsetSpec
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.records import ControlType, TimestampType, decode_batch, decode_control_record, iter_batches, split_partial_tail
from protocol.retry import client_request
from txn.config import ConsumerConfig
from txn.errors import TRANSIENT_ERRORS, FatalError, RecordBatchTooLargeError, RetriableError, classify
from txn.types import ConsumerRecord, TopicPartition

LOG_APPEND_TIME = int(TimestampType.LOG_APPEND_TIME)


def committed_records(data, aborted: list[dict], *, read_committed: bool, start_offset: int, log_append_offsets: set | None = None):
    """Records of a fetched partition that a consumer may see (see module doc).

    A batch stamped with LogAppendTime gives its records the batch's time (as
    Kafka's consumer does); their offsets go into ``log_append_offsets`` when
    the caller passes a set."""
    heap = [(entry["first_offset"], entry["producer_id"]) for entry in (aborted or [])] if read_committed else []
    heapq.heapify(heap)
    aborted_producers: set[int] = set()
    out = []
    for position, header in iter_batches(data):
        while heap and heap[0][0] <= header.last_offset:
            aborted_producers.add(heapq.heappop(heap)[1])
        if header.is_control:
            if read_committed:
                batch = decode_batch(data, position)
                if batch.records and decode_control_record(batch.records[0]).type == ControlType.ABORT:
                    aborted_producers.discard(header.producer_id)
            continue
        if read_committed and header.is_transactional and header.producer_id in aborted_producers:
            continue
        batch = decode_batch(data, position)
        if header.timestamp_type == TimestampType.LOG_APPEND_TIME:
            appended = [attrs.evolve(record, timestamp=header.max_timestamp) for record in batch.records if record.offset >= start_offset]
            if log_append_offsets is not None:
                log_append_offsets.update(record.offset for record in appended)
            out.extend(appended)
        else:
            out.extend(record for record in batch.records if record.offset >= start_offset)
    return out


@attrs.frozen
class FetchedPartition:
    """What one partition's fetched records give the consumer."""

    records: list  # visible records at or after the fetch offset
    end: int  # where the next fetch starts: after the last whole batch
    log_append_offsets: frozenset  # offsets of ``records`` stamped with LogAppendTime


def fetched_partition(data, aborted: list[dict] | None, *, tp: TopicPartition, fetch_offset: int, config: ConsumerConfig) -> FetchedPartition:
    """The visible records of one partition's answer to a Fetch at
    ``fetch_offset``, without the partial batch it may end with (see the
    module doc). Raises ``RecordBatchTooLargeError`` when no batch came whole."""
    whole_end, partial = split_partial_tail(data)
    if whole_end == 0 and partial is not None:
        raise RecordBatchTooLargeError(message=too_large_message(tp, fetch_offset, partial, config))
    whole = memoryview(data)[:whole_end] if partial is not None else data
    end = fetch_offset
    for _position, header in iter_batches(whole):
        end = max(end, header.next_offset)
    log_append_offsets: set[int] = set()
    visible = committed_records(whole, aborted, read_committed=config.read_committed, start_offset=fetch_offset, log_append_offsets=log_append_offsets)
    return FetchedPartition(visible, end, frozenset(log_append_offsets))


def fetched_partition_columns(data, aborted: list[dict] | None, *, tp: TopicPartition, fetch_offset: int, config: ConsumerConfig):
    """``fetched_partition`` as columns: a ``protocol.columnar.FetchedColumns``
    (imported here, so that only a columnar consumer loads numpy and pyarrow)."""
    from protocol.columnar import decode_fetched

    fetched = decode_fetched(data, aborted, read_committed=config.read_committed, start_offset=fetch_offset)
    if fetched.partial is not None and fetched.partial.position == 0:  # nothing came whole
        raise RecordBatchTooLargeError(message=too_large_message(tp, fetch_offset, fetched.partial, config))
    return fetched


def too_large_message(tp: TopicPartition, fetch_offset: int, partial, config: ConsumerConfig) -> str:
    where = f"offset {partial.base_offset}" if partial.base_offset is not None else f"fetch offset {fetch_offset}"
    limit = config.max_partition_fetch_bytes
    if partial.size is None:
        size = f"larger than the {partial.available} bytes the broker sent of it"
        fix = f"raise max.partition.fetch.bytes (now {limit})"
    elif partial.size > limit:
        size = f"{partial.size} bytes, of which the broker sent {partial.available}"
        fix = f"raise max.partition.fetch.bytes (now {limit}) to at least {partial.size}"
    else:
        size = f"{partial.size} bytes, of which the broker sent {partial.available}"
        fix = f"max.partition.fetch.bytes={limit} would hold it, so the broker cut the answer shorter than asked"
        if partial.size > config.fetch_max_bytes:
            fix += f": raise fetch.max.bytes (now {config.fetch_max_bytes}) to at least {partial.size}"
        else:
            fix += " (a broker without KIP-74, before Kafka 0.10.1, or a proxy in the way)"
    return (f"Fetch {tp} at offset {fetch_offset}: the record batch at {where} is {size}; nothing whole fits in "
            f"one fetch, so this partition cannot go on: {fix}")


class Fetcher:
    def _drop_buffers(self, partitions) -> None:
        for tp in partitions:
            self._buffers.pop(tp, None)
            self._buffer_ends.pop(tp, None)
            self._column_buffers.pop(tp, None)

    def _buffered(self) -> set[TopicPartition]:
        """The partitions holding fetched records not yet handed out (by ``poll`` or ``poll_columns``)."""
        return set(self._buffers) | set(self._column_buffers)

    async def _list_offset(self, tp: TopicPartition, timestamp: int) -> int:
        body = {
            "replica_id": -1,
            "isolation_level": IsolationLevel.READ_COMMITTED if self.config.read_committed else IsolationLevel.READ_UNCOMMITTED,
            "topics": [{"name": tp.topic, "partitions": [{"partition_index": tp.partition, "timestamp": timestamp, "current_leader_epoch": -1}]}],
        }
        async for attempt in self.cluster.retrying(self.config.request_timeout_ms / 1000):
            with attempt:
                response = await (await self.cluster.leader(tp.topic, tp.partition)).request(ApiKey.LIST_OFFSETS, body)
                answer = response["topics"][0]["partitions"][0]
                if answer["error_code"]:
                    self.cluster.forget_leader(tp.topic, tp.partition)
                    raise classify(answer["error_code"], f"ListOffsets {tp}")
        return answer["offset"]

    async def _initialize_positions(self) -> None:
        missing = [tp for tp, offset in self._positions.items() if offset is None]
        if not missing:
            return
        committed = await self.committed(missing) if self.group_id is not None else {}
        for tp in missing:
            found = committed.get(tp)
            if found is not None:
                self._positions[tp] = found.offset
            elif self.config.auto_offset_reset == "none":
                raise FatalError(ErrorCode.OFFSET_OUT_OF_RANGE, f"no committed offset for {tp} and auto_offset_reset is none")
            else:
                self._positions[tp] = await self._list_offset(tp, OffsetSpec.EARLIEST if self.config.auto_offset_reset == "earliest" else OffsetSpec.LATEST)

    def _hand_out(self) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        for tp in list(self._buffers):
            records = self._buffers[tp]
            while records and len(out) < self.config.max_poll_records:
                out.append(records.popleft())
            if out and out[-1].topic_partition == tp:
                self._positions[tp] = out[-1].offset + 1
            if not records:
                self._positions[tp] = max(self._positions.get(tp) or 0, self._buffer_ends.pop(tp))
                del self._buffers[tp]
        return out

    async def poll_columns(self, timeout: float = 1.0, max_records: int | None = None) -> dict:
        """Each fetched partition's visible records as a ``pyarrow.RecordBatch``
        (``{TopicPartition: batch}``, only partitions with records), waiting up to
        ``timeout`` seconds for some; at most ``max_records`` rows in all when
        given, the rest kept for the next call (see the module doc)."""
        self._last_poll = time.monotonic()
        deadline = self._last_poll + timeout
        while True:
            if self._subscription and not await self._ensure_membership(deadline):
                return {}
            await self._maybe_auto_commit()
            if self._column_buffers:
                return self._hand_out_columns(max_records)
            await self._initialize_positions()
            remaining = deadline - time.monotonic()
            if not self._positions:
                if remaining <= 0:
                    return {}
                await asyncio.sleep(min(remaining, 0.1))
                continue
            columns: dict = {}
            await self._fetch(max(0.0, min(self.config.fetch_max_wait_ms / 1000, remaining)), columns=columns)
            self._column_buffers.update(columns)
            if columns or time.monotonic() >= deadline:
                return self._hand_out_columns(max_records)

    def _hand_out_columns(self, max_records: int | None) -> dict:
        """Up to ``max_records`` rows (all when None) of the kept fetched
        columns, the positions moved past them."""
        out: dict = {}
        room = max_records
        for tp in list(self._column_buffers):
            if room is not None and room <= 0:
                break
            batch, end = self._column_buffers[tp]
            if room is not None and batch.num_rows > room:
                out[tp] = batch.slice(0, room)
                self._column_buffers[tp] = (batch.slice(room), end)
                self._positions[tp] = out[tp].column(2)[room - 1].as_py() + 1  # the offset column
                room = 0
                continue
            out[tp] = batch
            del self._column_buffers[tp]
            self._positions[tp] = max(self._positions.get(tp) or 0, end)
            if room is not None:
                room -= batch.num_rows
        return out

    async def _fetch(self, max_wait: float, columns: dict | None = None) -> None:
        wanted = [tp for tp, offset in self._positions.items() if offset is not None and tp not in self._buffers and tp not in self._column_buffers]
        by_leader: dict[int, list[TopicPartition]] = collections.defaultdict(list)
        for tp in wanted:
            if (tp.topic, tp.partition) not in self.cluster.leaders:
                await self.cluster.refresh([tp.topic])
            by_leader[self.cluster.leaders.get((tp.topic, tp.partition), -1)].append(tp)
        results = await asyncio.gather(*(self._fetch_from(node, tps, max_wait, columns) for node, tps in by_leader.items()), return_exceptions=True)
        for result in results:
            if isinstance(result, TRANSIENT_ERRORS):
                # The poll's loop fetches again, after the client's first wait.
                await asyncio.sleep(client_request(self.config.retry_backoff_ms, self.config.retry_backoff_max_ms).delay(1))
            elif isinstance(result, BaseException):
                raise result

    async def _fetch_from(self, node: int, partitions: list[TopicPartition], max_wait: float, columns: dict | None = None) -> None:
        """One Fetch to ``node``: records into ``_buffers``, or, given
        ``columns``, each partition's record batch into it (``poll_columns``)."""
        if node not in self.cluster.brokers:
            await self.cluster.refresh([tp.topic for tp in partitions])
            raise RetriableError(ErrorCode.LEADER_NOT_AVAILABLE, f"no leader for {partitions}")
        client = await self.cluster.connection(self.cluster.brokers[node])
        by_topic: dict[str, list] = collections.defaultdict(list)
        for tp in partitions:
            by_topic[tp.topic].append({"partition": tp.partition, "fetch_offset": self._positions[tp], "partition_max_bytes": self.config.max_partition_fetch_bytes, "log_start_offset": -1, "current_leader_epoch": -1})
        version = min(client.version_for(ApiKey.FETCH), 12)  # 13+ names topics by id
        body = {
            "replica_id": -1,
            "max_wait_ms": int(max_wait * 1000),
            "min_bytes": self.config.fetch_min_bytes,
            "max_bytes": self.config.fetch_max_bytes,
            "isolation_level": IsolationLevel.READ_COMMITTED if self.config.read_committed else IsolationLevel.READ_UNCOMMITTED,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": entries} for topic, entries in by_topic.items()],
        }
        requested = {tp: self._positions[tp] for tp in partitions}
        response = await client.request(ApiKey.FETCH, body, version=version, timeout=max_wait + self.config.request_timeout_ms / 1000)
        if response.get("error_code"):
            raise classify(response["error_code"], "Fetch")
        for topic in response["responses"]:
            for answer in topic["partitions"]:
                tp = TopicPartition(topic["topic"], answer["partition_index"])
                if tp not in self._positions or self._positions[tp] != requested.get(tp) or tp in self._buffers or tp in self._column_buffers:
                    continue  # reassigned or sought while the fetch was out
                code = answer["error_code"]
                if code == ErrorCode.OFFSET_OUT_OF_RANGE:
                    if self.config.auto_offset_reset == "none":
                        raise FatalError(code, f"Fetch {tp} at {requested[tp]}")
                    self._positions[tp] = await self._list_offset(tp, OffsetSpec.EARLIEST if self.config.auto_offset_reset == "earliest" else OffsetSpec.LATEST)
                    continue
                if code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH):
                    self.cluster.forget_leader(tp.topic, tp.partition)
                    continue
                if code:
                    raise classify(code, f"Fetch {tp}")
                data = answer["records"]
                if not data:
                    continue
                start = requested[tp]
                if columns is not None:
                    fetched_columns = fetched_partition_columns(data, answer.get("aborted_transactions"), tp=tp, fetch_offset=start, config=self.config)
                    if fetched_columns.columns.num_rows:
                        # The position moves when the rows are handed out (_hand_out_columns).
                        columns[tp] = (fetched_columns.columns, max(start, fetched_columns.end))
                    else:
                        self._positions[tp] = max(start, fetched_columns.end)
                    continue
                fetched = fetched_partition(data, answer.get("aborted_transactions"), tp=tp, fetch_offset=start, config=self.config)
                visible, end, log_append_offsets = fetched.records, fetched.end, fetched.log_append_offsets
                if not visible:
                    # Wholly invisible (control batches, aborted data): move past it
                    # now. An empty buffer would hide the partition from the next
                    # fetch while poll() waited for it to fill, spinning until its
                    # timeout.
                    self._positions[tp] = max(start, end)
                elif end > start:
                    topic_name, index = tp.topic, tp.partition
                    self._buffers[tp] = collections.deque(
                        [ConsumerRecord(topic_name, index, r.offset, r.timestamp, r.key, r.value, tuple([(h.key, h.value) for h in r.headers]) if r.headers else ()) for r in visible]
                    )
                    if log_append_offsets:
                        self._buffers[tp] = collections.deque(r._replace(timestamp_type=LOG_APPEND_TIME) if r.offset in log_append_offsets else r for r in self._buffers[tp])
                    self._buffer_ends[tp] = end
