"""onceflow's consumer: read_committed by default, assigned partitions or a
consumer group.

``AsyncConsumer`` (also ``txn.aio.Consumer``) is the core; ``Consumer`` is
the synchronous facade, which runs rebalance-listener callbacks on the
caller's thread (inside ``poll``), so a callback may call the consumer.

- ``assign`` takes partitions directly; ``subscribe`` joins ``group_id``
  through the classic protocol (JoinGroup/SyncGroup/Heartbeat, the state
  table in ``txn.membership``), with the assignors of ``txn.assignors``
  (range, cooperative-sticky). The listener's ``on_partitions_revoked``,
  ``on_partitions_assigned`` and ``on_partitions_lost`` run inside ``poll``.
- A new partition starts at the group's committed offset (OffsetFetch with
  require_stable, KIP-447: a commit pending in an open transaction makes the
  broker answer UNSTABLE_OFFSET_COMMIT, and the consumer waits) or by
  ``auto_offset_reset``.
- With ``isolation_level="read_committed"`` the broker stops at the last
  stable offset and lists the aborted transactions in range; the consumer
  drops their records and every control batch, as the Java consumer does:

      for each batch, in offset order:
          aborted transactions whose first offset <= the batch's last offset
              make their producer "aborted";
          an ABORT marker of an aborted producer ends that;
          a transactional batch of an aborted producer is skipped;
          control batches are never returned.

- Positions move as records are handed out (``max_poll_records`` at a
  time), so ``position()`` and ``commit()`` never run ahead of the caller.
- ``group_metadata()`` is what ``Producer.send_offsets_to_transaction``
  needs: group id, generation, member id, instance id.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import heapq
import inspect
import queue as queue_module
import time

import attrs

from protocol.constants import CoordinatorType, IsolationLevel, OffsetSpec
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.records import ControlType, TimestampType, decode_batch, decode_control_record, iter_batches
from protocol.tasks import cancel_and_wait
from txn import assignors
from txn.cluster import Cluster
from txn.config import ConsumerConfig, build
from txn.errors import CommitFailedError, FatalError, KafkaError, RetriableError, classify
from txn.loop_thread import LoopThread
from txn.membership import GroupMember, MemberState, RebalanceStep
from txn.types import ConsumerRecord, GroupMetadata, OffsetAndMetadata, TopicPartition, as_topic_partition

LOG_APPEND_TIME = int(TimestampType.LOG_APPEND_TIME)
FENCING = {ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION, ErrorCode.FENCED_INSTANCE_ID}


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


class AsyncConsumer:
    def __init__(self, bootstrap_servers=None, group_id: str | None = None, isolation_level: str | None = None, config: dict | ConsumerConfig | None = None, **options):
        for name, value in (("bootstrap_servers", bootstrap_servers), ("group_id", group_id), ("isolation_level", isolation_level)):
            if value is not None:
                options[name] = value
        self.config = build(ConsumerConfig, config, **options)
        self.group_id = self.config.group_id
        self.cluster = Cluster(self.config)
        self._positions: dict[TopicPartition, int | None] = {}
        self._buffers: dict[TopicPartition, collections.deque] = {}
        self._buffer_ends: dict[TopicPartition, int] = {}
        self._subscription: tuple[str, ...] = ()
        self._listener = None
        self._member: GroupMember | None = None
        self._rejoin_needed = False
        self._fenced_code: int | None = None
        # Background tasks, each owned here and stopped by close():
        self._heartbeat_task: asyncio.Task | None = None
        self._join_task: asyncio.Task | None = None  # a JoinGroup+SyncGroup round
        self._commits: set[asyncio.Task] = set()  # commit_async; close() waits for them
        self._last_poll = time.monotonic()
        self._last_auto_commit = time.monotonic()
        self._pending_lost: frozenset = frozenset()  # given up behind the caller's back (max.poll.interval.ms)
        self._closed = False

    def __reduce__(self):
        return (_rebuild, (type(self), self.config))

    async def __aenter__(self) -> "AsyncConsumer":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- what to read ---------------------------------------------------------------------------

    def assign(self, partitions) -> None:
        """Read exactly these partitions (no group membership)."""
        if self._subscription:
            raise FatalError(message="assign() after subscribe(): call unsubscribe() first")
        partitions = [as_topic_partition(p) for p in partitions]
        self._positions = {tp: self._positions.get(tp) for tp in partitions}
        self._drop_buffers(set(self._buffers) - set(partitions))

    def assignment(self) -> list[TopicPartition]:
        return sorted(self._positions)

    def subscribe(self, topics, listener=None) -> None:
        """Join ``group_id`` and read what the group assigns from ``topics``.

        ``listener`` may define ``on_partitions_revoked(partitions)``,
        ``on_partitions_assigned(partitions)`` and ``on_partitions_lost(partitions)``
        (plain or async functions); they run inside ``poll``."""
        if self.group_id is None:
            raise FatalError(message="subscribe() needs a group_id")
        if isinstance(topics, str):
            topics = [topics]
        if self._positions and not self._subscription:
            raise FatalError(message="subscribe() after assign(): call unsubscribe() first")
        self._subscription = tuple(sorted(set(topics)))
        self._listener = listener
        if self._member is None:
            protocols = [assignors.assignor_for(name) for name in self.config.partition_assignment_strategy]
            cooperative = all(_supports_cooperative(a) for a in protocols)
            self._member = GroupMember(self.group_id, cooperative, self.config.group_instance_id)
        self._rejoin_needed = True

    def subscription(self) -> list[str]:
        return list(self._subscription)

    async def unsubscribe(self) -> None:
        if self._member is not None and self._member.state != MemberState.UNJOINED:
            await self._leave_group()
        self._subscription = ()
        self._positions = {}
        self._drop_buffers(set(self._buffers))

    def seek(self, partition, offset: int) -> None:
        tp = as_topic_partition(partition)
        if tp not in self._positions:
            raise FatalError(message=f"{tp} is not assigned to this consumer")
        self._positions[tp] = offset
        self._drop_buffers({tp})

    async def seek_to_beginning(self, partitions=None) -> None:
        for tp in [as_topic_partition(p) for p in (partitions or self._positions)]:
            self.seek(tp, await self._list_offset(tp, OffsetSpec.EARLIEST))

    async def seek_to_end(self, partitions=None) -> None:
        for tp in [as_topic_partition(p) for p in (partitions or self._positions)]:
            self.seek(tp, await self._list_offset(tp, OffsetSpec.LATEST))

    async def position(self, partition) -> int:
        tp = as_topic_partition(partition)
        if tp not in self._positions:
            raise FatalError(message=f"{tp} is not assigned to this consumer")
        if self._positions[tp] is None:
            await self._initialize_positions()
        return self._positions[tp]

    async def end_offsets(self, partitions) -> dict[TopicPartition, int]:
        """The offset a read_committed consumer reads up to (the last stable
        offset), or the high watermark for read_uncommitted."""
        return {tp: await self._list_offset(tp, OffsetSpec.LATEST) for tp in map(as_topic_partition, partitions)}

    async def beginning_offsets(self, partitions) -> dict[TopicPartition, int]:
        return {tp: await self._list_offset(tp, OffsetSpec.EARLIEST) for tp in map(as_topic_partition, partitions)}

    def _drop_buffers(self, partitions) -> None:
        for tp in partitions:
            self._buffers.pop(tp, None)
            self._buffer_ends.pop(tp, None)

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

    # -- polling ----------------------------------------------------------------------------------

    async def poll(self, timeout: float = 1.0) -> list[ConsumerRecord]:
        """Up to ``max_poll_records`` records, waiting up to ``timeout`` seconds for some."""
        self._last_poll = time.monotonic()
        deadline = self._last_poll + timeout
        while True:
            if self._subscription and not await self._ensure_membership(deadline):
                return []  # the rebalance goes on; the next poll picks it up
            await self._maybe_auto_commit()
            if any(self._buffers.values()):
                return self._hand_out()
            await self._initialize_positions()
            remaining = deadline - time.monotonic()
            if not self._positions:
                if remaining <= 0:
                    return []
                await asyncio.sleep(min(remaining, 0.1))
                continue
            await self._fetch(max(0.0, min(self.config.fetch_max_wait_ms / 1000, remaining)))
            if any(self._buffers.values()) or time.monotonic() >= deadline:
                return self._hand_out()

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

    async def _fetch(self, max_wait: float) -> None:
        wanted = [tp for tp, offset in self._positions.items() if offset is not None and tp not in self._buffers]
        by_leader: dict[int, list[TopicPartition]] = collections.defaultdict(list)
        for tp in wanted:
            if (tp.topic, tp.partition) not in self.cluster.leaders:
                await self.cluster.refresh([tp.topic])
            by_leader[self.cluster.leaders.get((tp.topic, tp.partition), -1)].append(tp)
        results = await asyncio.gather(*(self._fetch_from(node, tps, max_wait) for node, tps in by_leader.items()), return_exceptions=True)
        for result in results:
            if isinstance(result, (ConnectionError, OSError, TimeoutError, RetriableError)):
                await asyncio.sleep(self.config.retry_backoff_ms / 1000)
            elif isinstance(result, BaseException):
                raise result

    async def _fetch_from(self, node: int, partitions: list[TopicPartition], max_wait: float) -> None:
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
                if tp not in self._positions or self._positions[tp] != requested.get(tp) or tp in self._buffers:
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
                end = start
                for _position, header in iter_batches(data):
                    end = max(end, header.next_offset)
                log_append_offsets: set[int] = set()
                visible = committed_records(data, answer.get("aborted_transactions"), read_committed=self.config.read_committed, start_offset=start, log_append_offsets=log_append_offsets)
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

    # -- offsets ----------------------------------------------------------------------------------

    async def committed(self, partitions, timeout: float | None = None) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets; waits while a transaction holds one pending."""
        if self.group_id is None:
            raise FatalError(message="committed() needs a group_id")
        partitions = [as_topic_partition(p) for p in partitions]
        by_topic: dict[str, list[int]] = collections.defaultdict(list)
        for tp in partitions:
            by_topic[tp.topic].append(tp.partition)
        body = {"group_id": self.group_id, "topics": [{"name": t, "partition_indexes": p} for t, p in by_topic.items()], "require_stable": True}
        out: dict[TopicPartition, OffsetAndMetadata | None] = {}
        async for attempt in self.cluster.retrying(timeout or self.config.request_timeout_ms / 1000):
            with attempt:
                response = await self.cluster.coordinator_request(self.group_id, CoordinatorType.GROUP, ApiKey.OFFSET_FETCH, body, max_version=7)
                if response.get("error_code"):
                    raise classify(response["error_code"], "OffsetFetch")
                for topic in response["topics"]:
                    for answer in topic["partitions"]:
                        if answer["error_code"]:
                            raise classify(answer["error_code"], f"OffsetFetch {topic['name']}-{answer['partition_index']}")
                        offset = answer["committed_offset"]
                        out[TopicPartition(topic["name"], answer["partition_index"])] = OffsetAndMetadata(offset, answer["metadata"] or "") if offset >= 0 else None
        return out

    def _consumed_offsets(self) -> dict[TopicPartition, int]:
        return {tp: offset for tp, offset in self._positions.items() if offset is not None}

    async def commit(self, offsets=None) -> None:
        """Commit ``offsets`` ({partition: next offset to read}), or every position."""
        if self.group_id is None:
            raise FatalError(message="commit() needs a group_id")
        offsets = self._consumed_offsets() if offsets is None else {as_topic_partition(tp): o for tp, o in offsets.items()}
        if not offsets:
            return
        by_topic: dict[str, list] = collections.defaultdict(list)
        for tp, offset in offsets.items():
            offset, metadata = (offset.offset, offset.metadata) if isinstance(offset, OffsetAndMetadata) else (offset, "")
            by_topic[tp.topic].append({"partition_index": tp.partition, "committed_offset": offset, "committed_leader_epoch": -1, "committed_metadata": metadata})
        member = self._member if self._subscription else None
        body = {
            "group_id": self.group_id,
            "generation_id_or_member_epoch": member.generation_id if member else -1,
            "member_id": member.member_id if member else "",
            "group_instance_id": self.config.group_instance_id if member else None,
            "retention_time_ms": -1,
            "topics": [{"name": t, "partitions": p} for t, p in by_topic.items()],
        }
        async for attempt in self.cluster.retrying(self.config.request_timeout_ms / 1000):
            with attempt:
                response = await self.cluster.coordinator_request(self.group_id, CoordinatorType.GROUP, ApiKey.OFFSET_COMMIT, body, max_version=8)
                for topic in response["topics"]:
                    for answer in topic["partitions"]:
                        code = answer["error_code"]
                        if code in FENCING or code == ErrorCode.REBALANCE_IN_PROGRESS:
                            self._note_group_error(code)
                            raise CommitFailedError(code, "OffsetCommit (the group has moved on; poll to rejoin)")
                        if code in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE):
                            self.cluster.forget_coordinator(self.group_id, CoordinatorType.GROUP)
                        if code:
                            raise classify(code, f"OffsetCommit {topic['name']}-{answer['partition_index']}")

    def commit_async(self, offsets=None, callback=None) -> asyncio.Task:
        """Commit in the background; ``callback(error, offsets)`` when done."""
        offsets = self._consumed_offsets() if offsets is None else dict(offsets)
        task = asyncio.get_running_loop().create_task(self.commit(offsets))
        self._commits.add(task)
        task.add_done_callback(self._commits.discard)
        if callback is not None:
            task.add_done_callback(lambda t: callback(_outcome_error(t), offsets))
        else:
            task.add_done_callback(_outcome_error)  # retrieved: the caller chose not to hear
        return task

    async def _maybe_auto_commit(self, *, now: bool = False) -> None:
        if not self.config.enable_auto_commit or self.group_id is None:
            return
        if now or time.monotonic() - self._last_auto_commit >= self.config.auto_commit_interval_ms / 1000:
            self._last_auto_commit = time.monotonic()
            try:
                await self.commit()
            except CommitFailedError:
                pass  # the rebalance that follows decides; the next interval tries again

    def group_metadata(self) -> GroupMetadata:
        if self.group_id is None:
            raise FatalError(message="group_metadata() needs a group_id")
        member = self._member if self._subscription else None
        return GroupMetadata(self.group_id, member.generation_id if member else -1, member.member_id if member else "", self.config.group_instance_id)

    # -- group membership -----------------------------------------------------------------------

    def _note_group_error(self, code: int) -> None:
        if code in FENCING:
            self._fenced_code = code
        self._rejoin_needed = True

    async def _ensure_membership(self, deadline: float) -> bool:
        """Drive the member towards STABLE; False if the deadline came first.

        JoinGroup and SyncGroup run in a background task (the broker holds
        JoinGroup until every member rejoins, which may outlast this poll);
        listener callbacks run here, in the poll, before and after it."""
        member = self._member
        if self._fenced_code is not None:
            code, self._fenced_code = self._fenced_code, None
            if member.state != MemberState.UNJOINED and self._join_task is None:
                await self._after_round(("fenced", code))
        if self._pending_lost:
            lost, self._pending_lost = self._pending_lost, frozenset()
            await self._tell_listener(RebalanceStep(lost=lost))
            self._sync_positions_with(member.owned)
        while self._join_task is not None or self._rejoin_needed or member.state != MemberState.STABLE:
            if self._join_task is None:
                self._rejoin_needed = False
                if member.state != MemberState.JOINING:
                    if not member.cooperative:
                        await self._maybe_auto_commit(now=True)
                    await self._tell_listener(member.start_join())
                    self._sync_positions_with(member.owned)
                self._join_task = asyncio.get_running_loop().create_task(self._join_and_sync())
            remaining = deadline - time.monotonic()
            done, _pending = await asyncio.wait({self._join_task}, timeout=max(0.0, remaining))
            if not done:
                return False
            task, self._join_task = self._join_task, None
            await self._after_round(task.result())
        self._start_heartbeats()
        return True

    async def _after_round(self, outcome: tuple) -> None:
        """Tell the listener what a join round changed."""
        member = self._member
        kind, detail = outcome
        if kind == "rebalance":
            member.rebalance()
            return
        if kind == "fenced":
            step = member.fenced(forget_member_id=detail != ErrorCode.ILLEGAL_GENERATION)
        else:
            step = member.synced(detail)
        await self._tell_listener(step)
        self._sync_positions_with(member.owned)
        if step.rejoin:
            self._rejoin_needed = True

    def _sync_positions_with(self, owned) -> None:
        owned = set(owned)
        for tp in list(self._positions):
            if tp not in owned:
                del self._positions[tp]
        self._drop_buffers(set(self._buffers) - owned)
        for tp in owned:
            self._positions.setdefault(tp, None)

    async def _tell_listener(self, step: RebalanceStep) -> None:
        for name, partitions in (("on_partitions_revoked", step.revoked), ("on_partitions_lost", step.lost), ("on_partitions_assigned", step.assigned)):
            if name == "on_partitions_revoked" and partitions and self.config.enable_auto_commit:
                try:
                    await self.commit({tp: o for tp, o in self._consumed_offsets().items() if tp in partitions})
                except CommitFailedError:
                    pass
            if not partitions and not (name == "on_partitions_assigned" and step.completes_rebalance):
                continue
            callback = getattr(self._listener, name, None)
            if callback is None and name == "on_partitions_lost":
                callback = getattr(self._listener, "on_partitions_revoked", None)
            if callback is not None:
                await self._run_callback(callback, sorted(partitions))

    async def _run_callback(self, callback, partitions) -> None:
        result = callback(partitions)
        if inspect.isawaitable(result):
            await result

    def _subscription_metadata(self, assignor) -> bytes:
        member = self._member
        owned = sorted((tp.topic, tp.partition) for tp in member.owned) if member.cooperative else []
        return assignors.encode_subscription(assignors.Subscription(list(self._subscription), owned_partitions=owned, generation_id=member.generation_id))

    async def _join_and_sync(self) -> tuple:
        """One JoinGroup + SyncGroup round, requests only: ("synced", my
        partitions), ("rebalance", None) or ("fenced", error code)."""
        member = self._member
        strategies = [assignors.assignor_for(name) for name in self.config.partition_assignment_strategy]
        join_timeout = self.config.max_poll_interval_ms / 1000 + 5
        body = {
            "group_id": self.group_id,
            "session_timeout_ms": self.config.session_timeout_ms,
            "rebalance_timeout_ms": self.config.max_poll_interval_ms,
            "member_id": member.member_id,
            "group_instance_id": self.config.group_instance_id,
            "protocol_type": "consumer",
            "protocols": [{"name": a.name, "metadata": self._subscription_metadata(a)} for a in strategies],
            "reason": None,
        }
        async for attempt in self.cluster.retrying(join_timeout):
            with attempt:
                response = await self.cluster.coordinator_request(self.group_id, CoordinatorType.GROUP, ApiKey.JOIN_GROUP, body, timeout=join_timeout)
                code = response["error_code"]
                if code == ErrorCode.MEMBER_ID_REQUIRED:
                    member.member_id = body["member_id"] = response["member_id"]
                    raise RetriableError(code, "JoinGroup")
                if code == ErrorCode.UNKNOWN_MEMBER_ID:
                    member.member_id = body["member_id"] = ""
                    raise RetriableError(code, "JoinGroup")
                if code == ErrorCode.REBALANCE_IN_PROGRESS:
                    raise RetriableError(code, "JoinGroup")
                if code:
                    raise classify(code, "JoinGroup")
        member.joined(response["member_id"], response["generation_id"])
        protocol_name = response["protocol_name"]
        assignments = []
        if response["leader"] == member.member_id and not response.get("skip_assignment"):
            assignments = await self._assign_as_leader(protocol_name, response["members"])
        sync = {
            "group_id": self.group_id,
            "generation_id": member.generation_id,
            "member_id": member.member_id,
            "group_instance_id": self.config.group_instance_id,
            "protocol_type": "consumer",
            "protocol_name": protocol_name,
            "assignments": assignments,
        }
        response = await self.cluster.coordinator_request(self.group_id, CoordinatorType.GROUP, ApiKey.SYNC_GROUP, sync, timeout=join_timeout)
        code = response["error_code"]
        if code == ErrorCode.REBALANCE_IN_PROGRESS:
            return ("rebalance", None)
        if code in FENCING:
            return ("fenced", code)
        if code:
            raise classify(code, "SyncGroup")
        assignment = assignors.decode_assignment(response["assignment"]) if response["assignment"] else assignors.Assignment([])
        return ("synced", [TopicPartition(topic, partition) for topic, partition in assignment.partitions if topic in self._subscription])

    async def _assign_as_leader(self, protocol_name: str, members: list[dict]) -> list[dict]:
        assignor = assignors.assignor_for(protocol_name)
        subscriptions = {m["member_id"]: attrs.evolve(assignors.decode_subscription(m["metadata"]), group_instance_id=m.get("group_instance_id")) for m in members}
        topics = sorted({t for s in subscriptions.values() for t in s.topics})
        await self.cluster.refresh(topics, allow_auto_create=False)
        metadata = {t: self.cluster.partition_counts[t] for t in topics if t in self.cluster.partition_counts}
        result = assignor.assign(metadata, subscriptions)
        return [{"member_id": member_id, "assignment": assignors.encode_assignment(assignment)} for member_id, assignment in result.items()]

    def _start_heartbeats(self) -> None:
        previous = self._heartbeat_task
        if previous is not None and not previous.done():
            return
        self._heartbeat_task = None
        if previous is not None and not previous.cancelled() and previous.exception() is not None:
            raise previous.exception()  # a bug in the heartbeat loop: poll says so
        self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeat_loop())

    async def _heartbeat_loop(self) -> None:
        member = self._member
        while not self._closed and member.state == MemberState.STABLE and not self._rejoin_needed:
            await asyncio.sleep(self.config.heartbeat_interval_ms / 1000)
            if member.state != MemberState.STABLE or self._closed:
                return
            if time.monotonic() - self._last_poll > self.config.max_poll_interval_ms / 1000:
                # The application stopped polling: leave so the group can move on (as Kafka does).
                await self._leave_group(lost=True)
                return
            body = {"group_id": self.group_id, "generation_id": member.generation_id, "member_id": member.member_id, "group_instance_id": self.config.group_instance_id}
            try:
                response = await self.cluster.coordinator_request(self.group_id, CoordinatorType.GROUP, ApiKey.HEARTBEAT, body)
            except (KafkaError, ConnectionError, OSError, TimeoutError):
                continue  # the session timeout gives us room; the next beat tries again
            code = response["error_code"]
            if code in FENCING or code == ErrorCode.REBALANCE_IN_PROGRESS:
                self._note_group_error(code)
                return

    async def _leave_group(self, *, lost: bool = False) -> None:
        member = self._member
        join_task, self._join_task = self._join_task, None
        try:
            await cancel_and_wait(join_task)
        except Exception:
            pass  # that round's outcome, error or not, is moot: the member is leaving
        if member.state == MemberState.UNJOINED:
            return
        member_id = member.member_id
        step = member.leave()
        if lost:
            self._fenced_code = None
            self._rejoin_needed = True
            self._pending_lost = step.revoked
        if self.config.group_instance_id is None and member_id:
            body = {"group_id": self.group_id, "member_id": member_id, "members": [{"member_id": member_id, "group_instance_id": None, "reason": "the consumer is leaving"}]}
            try:
                await self.cluster.coordinator_request(self.group_id, CoordinatorType.GROUP, ApiKey.LEAVE_GROUP, body)
            except (KafkaError, ConnectionError, OSError, TimeoutError):
                pass  # the session timeout removes us anyway

    async def close(self) -> None:
        """Leave the group (after revoking, with auto-commit's last commit) and disconnect."""
        if self._closed:
            return
        try:
            if self._commits:  # asynchronous commits finish first, as in Kafka
                await asyncio.wait(set(self._commits))
            if self._member is not None and self._member.state == MemberState.STABLE and self._subscription:
                await self._maybe_auto_commit(now=True)
                await self._tell_listener(RebalanceStep(revoked=self._member.owned))
            if self._member is not None:
                await self._leave_group()
        finally:
            self._closed = True
            heartbeat, join, self._heartbeat_task, self._join_task = self._heartbeat_task, self._join_task, None, None
            try:
                await cancel_and_wait(heartbeat, join, *self._commits)
            finally:
                await self.cluster.close()


def _outcome_error(task: asyncio.Task) -> BaseException | None:
    """The error a finished task ended with (its cancellation included), marking it retrieved."""
    return asyncio.CancelledError() if task.cancelled() else task.exception()


def _supports_cooperative(assignor) -> bool:
    return any("COOPERATIVE" in str(getattr(p, "name", p)).upper() for p in assignor.rebalance_protocols)


def _rebuild(cls, config):
    return cls(config=config)


class Consumer:
    """The synchronous consumer (``AsyncConsumer`` on its own loop thread).

    ``Consumer(bootstrap_servers="host:9092", group_id=None,
    isolation_level="read_committed", **config)``. Rebalance callbacks run
    on the thread that calls ``poll`` (or ``close``)."""

    def __init__(self, bootstrap_servers=None, group_id: str | None = None, isolation_level: str | None = None, config: dict | ConsumerConfig | None = None, **options):
        if isinstance(bootstrap_servers, dict):
            config, bootstrap_servers = bootstrap_servers, None
        self._thread = LoopThread("onceflow-consumer")
        try:
            self._async = self._thread.run(lambda: AsyncConsumer(bootstrap_servers, group_id, isolation_level, config, **options))
        except BaseException:
            self._thread.stop()
            raise
        self._callbacks: queue_module.SimpleQueue | None = None
        self._async._run_callback = self._callback_on_caller_thread

    def __reduce__(self):
        return (_rebuild, (type(self), self._async.config))

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def config(self) -> ConsumerConfig:
        return self._async.config

    async def _callback_on_caller_thread(self, callback, partitions) -> None:
        if self._callbacks is None:  # not inside a blocking call: run here
            result = callback(partitions)
            if inspect.isawaitable(result):
                await result
            return
        reply = asyncio.get_running_loop().create_future()
        self._callbacks.put((callback, partitions, reply))
        await reply

    def _call(self, coroutine, timeout: float | None = None):
        """Run on the loop, serving listener callbacks on this thread meanwhile."""
        callbacks = self._callbacks = queue_module.SimpleQueue()
        future = self._thread.submit(coroutine)
        future.add_done_callback(lambda _f: callbacks.put(None))
        try:
            while True:
                item = callbacks.get(timeout=timeout)
                if item is None:
                    return future.result()
                callback, partitions, reply = item
                try:
                    callback(partitions)
                except BaseException as error:  # handed to poll's caller, as Kafka does
                    self._thread.loop.call_soon_threadsafe(_settle, reply, error)
                else:
                    self._thread.loop.call_soon_threadsafe(_settle, reply, None)
        except queue_module.Empty:
            future.cancel()
            raise TimeoutError(f"no result within {timeout} s") from None
        finally:
            self._callbacks = None

    def assign(self, partitions) -> None:
        self._thread.run(self._async.assign, partitions)

    def assignment(self) -> list[TopicPartition]:
        return self._thread.run(self._async.assignment)

    def subscribe(self, topics, listener=None) -> None:
        self._thread.run(self._async.subscribe, topics, listener)

    def unsubscribe(self) -> None:
        self._call(self._async.unsubscribe())

    def poll(self, timeout: float = 1.0) -> list[ConsumerRecord]:
        return self._call(self._async.poll(timeout))

    def seek(self, partition, offset: int) -> None:
        self._thread.run(self._async.seek, partition, offset)

    def seek_to_beginning(self, partitions=None) -> None:
        self._call(self._async.seek_to_beginning(partitions))

    def seek_to_end(self, partitions=None) -> None:
        self._call(self._async.seek_to_end(partitions))

    def position(self, partition) -> int:
        return self._call(self._async.position(partition))

    def committed(self, partitions, timeout: float | None = None) -> dict:
        return self._call(self._async.committed(partitions, timeout))

    def end_offsets(self, partitions) -> dict:
        return self._call(self._async.end_offsets(partitions))

    def beginning_offsets(self, partitions) -> dict:
        return self._call(self._async.beginning_offsets(partitions))

    def commit(self, offsets=None, asynchronous: bool = False):
        """Commit (blocking), or with ``asynchronous=True`` return a future."""
        if asynchronous:
            outcome: concurrent.futures.Future = concurrent.futures.Future()

            def start() -> None:  # on the loop: the task is the consumer's, so close() finishes it
                if not outcome.set_running_or_notify_cancel():
                    return  # cancelled before it started
                task = self._async.commit_async(offsets)
                task.add_done_callback(lambda t: _settle_outcome(outcome, t))

            self._thread.loop.call_soon_threadsafe(start)
            return outcome
        return self._call(self._async.commit(offsets))

    def group_metadata(self) -> GroupMetadata:
        return self._thread.run(self._async.group_metadata)

    def close(self) -> None:
        try:
            self._call(self._async.close(), 60)
        finally:
            self._thread.stop()


def _settle_outcome(outcome: concurrent.futures.Future, task: asyncio.Task) -> None:
    error = _outcome_error(task)
    if error is None:
        outcome.set_result(task.result())
    else:
        outcome.set_exception(error)


def _settle(reply: asyncio.Future, error: BaseException | None) -> None:
    if reply.done():
        return
    if error is None:
        reply.set_result(None)
    else:
        reply.set_exception(error)
