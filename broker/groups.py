"""Wires the group coordinator to the broker: the ``__consumer_offsets`` log,
loading at start, timers, and the request handlers of the group APIs
(FindCoordinator is shared with transactions in ``broker.txn_apis``).

``OffsetsLogWriter`` appends a group's records to its ``__consumer_offsets``
partition (``abs(java_hash(group)) % offsets.topic.num.partitions``), as a
transactional batch of the producer for TxnOffsetCommit, and waits until they
are durable (a TxnOffsetCommit also until its producer's AddOffsetsToTxn
record is: the transaction coordinator answered that once appended);
with ``transaction.durable.at.end`` a TxnOffsetCommit's records are
appended without an fsync round and answered at once (EndTxn(commit) makes
them durable in its decision's round). Loading replays every partition in order: offset commits, group metadata,
transactional commits kept pending until their marker.
"""

from __future__ import annotations

import logging
from typing import Callable

from coordinator.metadata import TRANSACTION_VERSION_2
from coordinator.metadata import TopicPartition as TxnPartition
from groupcoord.coordinator import GroupCoordinator, GroupSettings
from groupcoord.records import OFFSETS_TOPIC, OffsetAndMetadata
from protocol.clock import Clock
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.partitioning import partition_for
from broker.apis import REQUEST_CONNECTION_GONE, REQUEST_ORIGIN
from broker.client_rounds import note_durability_wait
from broker.replay import replay
from protocol.records import ControlType, decode_control_record, encode_batch
from protocol.tasks import every

log = logging.getLogger(__name__)


class OffsetsLogWriter:
    def __init__(self, replicas, partitions: int, clock: Clock):
        self.replicas = replicas
        self.partitions = partitions
        self.clock = clock
        # ``transaction.durable.at.end``: a TxnOffsetCommit is answered once
        # appended; EndTxn(commit) makes it durable in its decision's round.
        self.transactional_durable_at_end = False
        # Whether this producer's TxnOffsetCommit is answered once appended (its transaction not sealed).
        self.answers_once_appended: Callable[[int], bool] = lambda producer_id: True

    async def append(self, group_id: str, records, *, producer_id: int = -1, producer_epoch: int = -1) -> None:
        partition = partition_for(group_id, self.partitions)
        partition_log = self.replicas.get_log(OFFSETS_TOPIC, partition)
        if partition_log is None:
            raise RuntimeError(f"{OFFSETS_TOPIC}-{partition} is not open")
        now = self.clock.wall_ms()
        batch = encode_batch(
            [(key, value, (), now) for key, value in records],
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            is_transactional=producer_id >= 0,
        )
        if producer_id >= 0 and self.transactional_durable_at_end and self.answers_once_appended(producer_id):
            partition_log.append(batch, flush=False)  # EndTxn(commit) asks for its fsync
            return
        info = partition_log.append(batch)
        # Only its own records: a transactional commit's AddOffsetsToTxn
        # record is made durable by EndTxn's round (a power cut that takes it
        # back and keeps these ends the producer's transaction at start).
        durable = partition_log.wait_durable(info.last_offset)
        note_durability_wait(durable)
        await durable


class GroupManager:
    def __init__(self, *, replicas, config, clock: Clock | None = None):
        self.replicas = replicas
        self.partitions = config.offsets_topic_partitions
        self.clock = clock or Clock()
        self.offsets_log = OffsetsLogWriter(replicas, self.partitions, self.clock)
        self.offsets_log.transactional_durable_at_end = config.transaction_durable_at_end
        self.coordinator = GroupCoordinator(
            offsets_log=self.offsets_log,
            settings=GroupSettings(
                initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
                min_session_timeout_ms=config.group_min_session_timeout_ms,
                max_session_timeout_ms=config.group_max_session_timeout_ms,
                offsets_retention_ms=config.offsets_retention_minutes * 60_000,
            ),
            clock=self.clock,
            partition_count=self._partition_count,
        )
        self.retention_check_interval_ms = config.offsets_retention_check_interval_ms

    def _partition_count(self, topic: str) -> int:
        info = self.replicas.topics.get(topic)
        return info.partitions if info is not None else 0

    def owns(self, partition: int):
        return lambda group_id: partition_for(group_id, self.partitions) == partition

    def load(self) -> None:
        for partition, partition_log in self.replicas.logs_to_replay(OFFSETS_TOPIC):
            for batch in replay(partition_log):
                header = batch.header
                if header.is_control:
                    marker = decode_control_record(batch.records[0])
                    self.coordinator.on_marker(header.producer_id, marker.type == ControlType.COMMIT, self.owns(partition))
                    continue
                for record in batch.records:
                    try:
                        self.coordinator.load_record(record.key, record.value, producer_id=header.producer_id, transactional=header.is_transactional)
                    except (ValueError, TypeError) as error:
                        log.error("skipping an unreadable %s record at offset %d: %s", OFFSETS_TOPIC, record.offset, error)
        self.coordinator.log_loaded()

    def on_marker(self, topic: str, partition: int, producer_id: int, commit: bool) -> None:
        if topic == OFFSETS_TOPIC:
            self.coordinator.on_marker(producer_id, commit, self.owns(partition))

    async def start(self) -> None:
        self.load()

    def background(self) -> dict:
        """The loops the broker runs in its TaskGroup while it serves (by name)."""
        return {"group timers": self.coordinator.run_timers(), "offset retention": self._expire_offsets()}

    async def _expire_offsets(self) -> None:
        await every(self.retention_check_interval_ms / 1000.0, self.coordinator.expire_offsets, "offset retention")

    async def stop(self) -> None:
        """After the broker has stopped ``background()`` and its listener."""
        await self.coordinator.stop()


class GroupApis:
    def __init__(self, *, groups: GroupManager, transactions, replicas, crash_point: Callable[[str], None] = lambda name: None):
        self.groups = groups
        # The fault harness's seam, passed in by the broker's composition.
        self.crash_point = crash_point
        self.coordinator = groups.coordinator
        self.transactions = transactions
        self.replicas = replicas

    def handlers(self) -> dict:
        return {
            ApiKey.OFFSET_COMMIT: self.handle_offset_commit,
            ApiKey.OFFSET_FETCH: self.handle_offset_fetch,
            ApiKey.JOIN_GROUP: self.handle_join_group,
            ApiKey.HEARTBEAT: self.handle_heartbeat,
            ApiKey.LEAVE_GROUP: self.handle_leave_group,
            ApiKey.SYNC_GROUP: self.handle_sync_group,
            ApiKey.DESCRIBE_GROUPS: self.handle_describe_groups,
            ApiKey.LIST_GROUPS: self.handle_list_groups,
            ApiKey.TXN_OFFSET_COMMIT: self.handle_txn_offset_commit,
            ApiKey.DELETE_GROUPS: self.handle_delete_groups,
            ApiKey.OFFSET_DELETE: self.handle_offset_delete,
        }

    async def handle_join_group(self, version: int, body: dict) -> dict:
        client_id, client_host = REQUEST_ORIGIN.get()
        result = await self.coordinator.join_group(
            group_id=body.get("group_id", ""),
            member_id=body.get("member_id", ""),
            group_instance_id=body.get("group_instance_id"),
            client_id=client_id,
            client_host=client_host,
            session_timeout_ms=body.get("session_timeout_ms", 10_000),
            rebalance_timeout_ms=body.get("rebalance_timeout_ms", -1),
            protocol_type=body.get("protocol_type", ""),
            protocols=[(p["name"], p["metadata"]) for p in body.get("protocols", [])],
            require_known_member_id=version >= 4,
            skip_assignment_supported=version >= 9,
            requester_gone=REQUEST_CONNECTION_GONE.get(),
        )
        response = {"throttle_time_ms": 0, "generation_id": -1, "protocol_name": "" if version < 7 else None, "leader": "", "members": []}
        response.update(result)
        if version < 7 and response.get("protocol_name") is None:
            response["protocol_name"] = ""
        return response

    async def handle_sync_group(self, version: int, body: dict) -> dict:
        result = await self.coordinator.sync_group(
            group_id=body.get("group_id", ""),
            generation_id=body.get("generation_id", -1),
            member_id=body.get("member_id", ""),
            group_instance_id=body.get("group_instance_id"),
            assignments=[(a["member_id"], a["assignment"]) for a in body.get("assignments", [])],
        )
        return {"throttle_time_ms": 0, **result}

    async def handle_heartbeat(self, version: int, body: dict) -> dict:
        error = await self.coordinator.heartbeat(
            group_id=body.get("group_id", ""), generation_id=body.get("generation_id", -1), member_id=body.get("member_id", ""), group_instance_id=body.get("group_instance_id")
        )
        return {"throttle_time_ms": 0, "error_code": error}

    async def handle_leave_group(self, version: int, body: dict) -> dict:
        if version <= 2:
            members = [(body.get("member_id", ""), None)]
        else:
            members = [(m.get("member_id", ""), m.get("group_instance_id")) for m in body.get("members", [])]
        error, results = await self.coordinator.leave_group(group_id=body.get("group_id", ""), members=members)
        return {"throttle_time_ms": 0, "error_code": error if version <= 2 else ErrorCode.NONE, "members": results}

    async def handle_offset_commit(self, version: int, body: dict) -> dict:
        now = self.groups.clock.wall_ms()
        offsets = {}
        for topic in body.get("topics", []):
            for partition in topic.get("partitions", []):
                offsets[(topic["name"], partition["partition_index"])] = OffsetAndMetadata(
                    partition["committed_offset"], partition.get("committed_leader_epoch", -1), partition.get("committed_metadata") or "", now
                )
        unknown = {key for key in offsets if not self.replicas.has_partition(*key)}
        error = ErrorCode.NONE
        known = {k: v for k, v in offsets.items() if k not in unknown}
        if known:
            error = await self.coordinator.commit_offsets(
                group_id=body.get("group_id", ""),
                generation_id=body.get("generation_id_or_member_epoch", -1),
                member_id=body.get("member_id", ""),
                group_instance_id=body.get("group_instance_id"),
                offsets=known,
            )
        return {
            "throttle_time_ms": 0,
            "topics": [
                {
                    "name": topic["name"],
                    "partitions": [
                        {"partition_index": p["partition_index"], "error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if (topic["name"], p["partition_index"]) in unknown else error}
                        for p in topic.get("partitions", [])
                    ],
                }
                for topic in body.get("topics", [])
            ],
        }

    def _fetch_group(self, group_id: str, topics, require_stable: bool) -> list[dict]:
        partitions = None if topics is None else [(t["name"], p) for t in topics for p in t["partition_indexes"]]
        fetched = self.coordinator.fetch_offsets(group_id, partitions, require_stable)
        by_topic: dict[str, list] = {}
        for (topic, partition), (value, error) in fetched.items():
            by_topic.setdefault(topic, []).append(
                {
                    "partition_index": partition,
                    "committed_offset": value.offset if value else -1,
                    "committed_leader_epoch": value.leader_epoch if value else -1,
                    "metadata": value.metadata if value else "",
                    "error_code": error,
                }
            )
        return [{"name": name, "partitions": partitions} for name, partitions in by_topic.items()]

    async def handle_offset_fetch(self, version: int, body: dict) -> dict:
        require_stable = body.get("require_stable", False)
        if version >= 8:
            groups = [
                {"group_id": g["group_id"], "topics": self._fetch_group(g["group_id"], g.get("topics"), require_stable), "error_code": ErrorCode.NONE}
                for g in body.get("groups", [])
            ]
            return {"throttle_time_ms": 0, "groups": groups}
        topics = body.get("topics")
        if version < 2 and topics is None:
            topics = []
        return {"throttle_time_ms": 0, "topics": self._fetch_group(body.get("group_id", ""), topics, require_stable), "error_code": ErrorCode.NONE}

    async def handle_txn_offset_commit(self, version: int, body: dict) -> dict:
        group_id = body.get("group_id", "")
        producer_id = body.get("producer_id", -1)
        producer_epoch = body.get("producer_epoch", -1)
        offsets = {}
        now = self.groups.clock.wall_ms()
        for topic in body.get("topics", []):
            for partition in topic.get("partitions", []):
                offsets[(topic["name"], partition["partition_index"])] = OffsetAndMetadata(
                    partition["committed_offset"], partition.get("committed_leader_epoch", -1), partition.get("committed_metadata") or "", now
                )
        offsets_partition = TxnPartition(OFFSETS_TOPIC, partition_for(group_id, self.groups.partitions))
        error = ErrorCode.NONE
        if version >= 5:
            # KIP-890 part 2: the commit adds the group's offsets partition to
            # the transaction itself (the client sent no AddOffsetsToTxn).
            error = await self.transactions.coordinator.add_partitions(
                body.get("transactional_id"), producer_id, producer_epoch, [offsets_partition], transaction_version=TRANSACTION_VERSION_2
            )
        if error == ErrorCode.NONE:
            error = self.transactions.coordinator.verify_transactional_produce(producer_id, producer_epoch, offsets_partition)
        if error == ErrorCode.INVALID_PRODUCER_EPOCH and version >= 2:
            error = ErrorCode.PRODUCER_FENCED
        if error == ErrorCode.NONE:
            error = await self.coordinator.txn_commit_offsets(
                group_id=group_id,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                generation_id=body.get("generation_id", -1),
                member_id=body.get("member_id", ""),
                group_instance_id=body.get("group_instance_id"),
                offsets=offsets,
            )
            if error == ErrorCode.NONE:
                self.crash_point("groupcoord.after_pending_offsets")
        return {
            "throttle_time_ms": 0,
            "topics": [
                {"name": topic["name"], "partitions": [{"partition_index": p["partition_index"], "error_code": error} for p in topic.get("partitions", [])]}
                for topic in body.get("topics", [])
            ],
        }

    async def handle_describe_groups(self, version: int, body: dict) -> dict:
        return {"throttle_time_ms": 0, "groups": [self.coordinator.describe(group_id) for group_id in body.get("groups", [])]}

    async def handle_list_groups(self, version: int, body: dict) -> dict:
        return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "groups": self.coordinator.list_groups(body.get("states_filter") or None)}

    async def handle_delete_groups(self, version: int, body: dict) -> dict:
        results = []
        for group_id in body.get("groups_names", []):
            results.append({"group_id": group_id, "error_code": await self.coordinator.delete_group(group_id)})
        return {"throttle_time_ms": 0, "results": results}

    async def handle_offset_delete(self, version: int, body: dict) -> dict:
        partitions = [(t["name"], p["partition_index"]) for t in body.get("topics", []) for p in t.get("partitions", [])]
        error, results = await self.coordinator.delete_offsets(body.get("group_id", ""), partitions)
        return {
            "error_code": error,
            "throttle_time_ms": 0,
            "topics": [
                {"name": t["name"], "partitions": [{"partition_index": p["partition_index"], "error_code": results.get((t["name"], p["partition_index"]), error)} for p in t.get("partitions", [])]}
                for t in body.get("topics", [])
            ],
        }
