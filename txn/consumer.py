"""onceflow's consumer: read_committed by default, with assigned partitions.

``AsyncConsumer`` fetches from the partitions it is given (``assign``), from
the earliest offset unless told otherwise (``seek``), and returns records in
offset order per partition. With ``isolation_level="read_committed"`` the
broker stops at the last stable offset and lists the aborted transactions in
range; this consumer drops their records and every control batch, as the
Java consumer does:

    for each batch, in offset order:
        aborted transactions whose first offset <= the batch's last offset
            make their producer "aborted";
        an ABORT marker of an aborted producer ends that;
        a transactional batch of an aborted producer is skipped;
        control batches are never returned.

Consumer groups (subscribe, rebalance callbacks) come in a later slice; so
do offset commits beyond the simple ``commit`` to a group with no members.
``Consumer`` is the synchronous facade.
"""

from __future__ import annotations

import asyncio
import heapq
import threading

import attrs

from protocol.errors import ErrorCode
from protocol.records import ControlType, decode_batch, decode_control_record, iter_batches
from txn.connection import BrokerClient
from txn.producer import KafkaError

FETCH, LIST_OFFSETS, METADATA, OFFSET_COMMIT, OFFSET_FETCH = 1, 2, 3, 8, 9
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


@attrs.frozen
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple = ()


def committed_records(data, aborted: list[dict], *, read_committed: bool, start_offset: int):
    """Records of a fetched partition that a consumer may see (see module doc)."""
    heap = [(entry["first_offset"], entry["producer_id"]) for entry in (aborted or [])] if read_committed else []
    heapq.heapify(heap)
    aborted_producers: set[int] = set()
    out = []
    for position, header in iter_batches(data):
        while heap and heap[0][0] <= header.last_offset:
            aborted_producers.add(heapq.heappop(heap)[1])
        batch = decode_batch(data, position)
        if header.is_control:
            if read_committed and batch.records:
                marker = decode_control_record(batch.records[0])
                if marker.type == ControlType.ABORT:
                    aborted_producers.discard(header.producer_id)
            continue
        if read_committed and header.is_transactional and header.producer_id in aborted_producers:
            continue
        out.extend(record for record in batch.records if record.offset >= start_offset)
    return out


class AsyncConsumer:
    def __init__(self, bootstrap: str, *, group_id: str | None = None, isolation_level: str = "read_committed", max_wait_ms: int = 500, fetch_max_bytes: int = 50 * 1024 * 1024, client_id: str = "onceflow-consumer"):
        host, _, port = bootstrap.rpartition(":")
        self.client = BrokerClient(host or "127.0.0.1", int(port), client_id=client_id)
        self.group_id = group_id
        self.read_committed = isolation_level == "read_committed"
        self.max_wait_ms = max_wait_ms
        self.fetch_max_bytes = fetch_max_bytes
        self.positions: dict[tuple[str, int], int | None] = {}

    def assign(self, partitions: list[tuple[str, int]]) -> None:
        self.positions = {tp: self.positions.get(tp) for tp in partitions}

    def assignment(self) -> list[tuple[str, int]]:
        return list(self.positions)

    def seek(self, partition: tuple[str, int], offset: int) -> None:
        self.positions[partition] = offset

    async def position(self, partition: tuple[str, int]) -> int:
        if self.positions.get(partition) is None:
            self.positions[partition] = await self._list_offset(partition, -2)
        return self.positions[partition]

    async def _list_offset(self, partition: tuple[str, int], timestamp: int) -> int:
        body = {"replica_id": -1, "isolation_level": READ_COMMITTED if self.read_committed else READ_UNCOMMITTED,
                "topics": [{"name": partition[0], "partitions": [{"partition_index": partition[1], "timestamp": timestamp}]}]}
        response = await self.client.request(LIST_OFFSETS, body)
        answer = response["topics"][0]["partitions"][0]
        if answer["error_code"]:
            raise KafkaError(answer["error_code"], f"ListOffsets {partition[0]}-{partition[1]}")
        return answer["offset"]

    async def seek_to_end(self, partition: tuple[str, int]) -> None:
        self.positions[partition] = await self._list_offset(partition, -1)

    async def poll(self, timeout_ms: int | None = None) -> list[ConsumerRecord]:
        for partition in self.positions:
            await self.position(partition)
        by_topic: dict[str, list] = {}
        for (topic, partition), offset in self.positions.items():
            by_topic.setdefault(topic, []).append({"partition": partition, "fetch_offset": offset, "partition_max_bytes": self.fetch_max_bytes, "log_start_offset": -1})
        if not self.client.connected:
            await self.client.connect()
        version = min(self.client.version_for(FETCH), 12)  # 13+ addresses topics by id
        body = {
            "replica_id": -1,
            "max_wait_ms": self.max_wait_ms if timeout_ms is None else timeout_ms,
            "min_bytes": 1,
            "max_bytes": self.fetch_max_bytes,
            "isolation_level": READ_COMMITTED if self.read_committed else READ_UNCOMMITTED,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": partitions} for topic, partitions in by_topic.items()],
        }
        response = await self.client.request(FETCH, body, version=version)
        records = []
        for topic in response["responses"]:
            for answer in topic["partitions"]:
                key = (topic["topic"], answer["partition_index"])
                if answer["error_code"] == ErrorCode.OFFSET_OUT_OF_RANGE:
                    self.positions[key] = None  # start over from the earliest available
                    continue
                if answer["error_code"]:
                    raise KafkaError(answer["error_code"], f"Fetch {key[0]}-{key[1]}")
                data = bytes(answer["records"] or b"")
                if not data:
                    continue
                start = self.positions[key]
                visible = committed_records(data, answer.get("aborted_transactions"), read_committed=self.read_committed, start_offset=start)
                last_offset = start
                for _position, header in iter_batches(data):
                    last_offset = max(last_offset, header.next_offset)
                self.positions[key] = last_offset
                records.extend(ConsumerRecord(key[0], key[1], r.offset, r.timestamp, r.key, r.value, tuple((h.key, h.value) for h in r.headers)) for r in visible)
        return records

    async def commit(self, offsets: dict[tuple[str, int], int] | None = None) -> None:
        """Commit positions to ``group_id`` (a group with no members: assign-mode consumers)."""
        if self.group_id is None:
            raise RuntimeError("commit needs a group_id")
        offsets = offsets if offsets is not None else {tp: o for tp, o in self.positions.items() if o is not None}
        by_topic: dict[str, list] = {}
        for (topic, partition), offset in offsets.items():
            by_topic.setdefault(topic, []).append({"partition_index": partition, "committed_offset": offset, "committed_metadata": ""})
        body = {"group_id": self.group_id, "generation_id_or_member_epoch": -1, "member_id": "", "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()]}
        response = await self.client.request(OFFSET_COMMIT, body, version=min(self.client.version_for(OFFSET_COMMIT), 8))
        for topic in response["topics"]:
            for answer in topic["partitions"]:
                if answer["error_code"]:
                    raise KafkaError(answer["error_code"], "OffsetCommit")

    def group_metadata(self) -> dict:
        return {"group_id": self.group_id, "generation_id": -1, "member_id": "", "group_instance_id": None}

    async def close(self) -> None:
        await self.client.close()


class Consumer:
    """The synchronous facade of AsyncConsumer, on its own loop thread."""

    def __init__(self, bootstrap: str, **options):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="onceflow-consumer", daemon=True)
        self._thread.start()
        self._async = AsyncConsumer(bootstrap, **options)

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def assign(self, partitions):
        self._async.assign(partitions)

    def seek(self, partition, offset):
        self._async.seek(partition, offset)

    def position(self, partition) -> int:
        return self._call(self._async.position(partition))

    def poll(self, timeout_ms: int | None = None) -> list[ConsumerRecord]:
        return self._call(self._async.poll(timeout_ms))

    def commit(self, offsets=None) -> None:
        self._call(self._async.commit(offsets))

    def group_metadata(self) -> dict:
        return self._async.group_metadata()

    def close(self) -> None:
        try:
            self._call(self._async.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
