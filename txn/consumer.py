"""onceflow's consumer: read_committed by default, assigned partitions or a
consumer group.

``AsyncConsumer`` (also ``txn.aio.Consumer``) is the core; ``Consumer`` is
the synchronous facade (a ``txn.sync_client.SyncClient``), which runs
rebalance-listener callbacks on the caller's thread (inside ``poll``), so a
callback may call the consumer.

This module owns the consumer's API and its offsets: ``assign`` takes
partitions directly; ``subscribe`` joins ``group_id``; ``poll`` returns up to
``max_poll_records`` records; ``commit``/``commit_async``/auto-commit and
``committed`` (OffsetFetch with require_stable, KIP-447: a commit pending in
an open transaction makes the broker answer UNSTABLE_OFFSET_COMMIT, and the
consumer waits); ``group_metadata()`` is what
``Producer.send_offsets_to_transaction`` needs (group id, generation, member
id, instance id). Its two other jobs live beside it:

- ``txn.fetcher``: Fetch per leader, the read_committed filter (aborted
  transactions' records and control batches dropped), handing records out
  and moving positions as they go;
- ``txn.group_driver``: group membership through the classic protocol
  (JoinGroup/SyncGroup/Heartbeat/LeaveGroup, the state table in
  ``txn.membership``, the assignors of ``txn.assignors``), the rebalance
  listener's callbacks.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import inspect
import queue as queue_module
import time

from protocol.constants import CoordinatorType, OffsetSpec
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.tasks import cancel_and_wait
from txn import assignors
from txn.cluster import Cluster
from txn.config import ConsumerConfig, build
from txn.errors import GROUP_FENCING, CommitFailedError, FatalError, classify
from txn.fetcher import Fetcher
from txn.group_driver import GroupDriver, supports_cooperative
from txn.membership import GroupMember, MemberState, RebalanceStep
from txn.sync_client import SyncClient, properties_first, rebuild
from txn.types import ConsumerRecord, GroupMetadata, OffsetAndMetadata, TopicPartition, as_topic_partition


class AsyncConsumer(Fetcher, GroupDriver):
    """The asyncio consumer. Fetching (``txn.fetcher.Fetcher``) and group
    membership (``txn.group_driver.GroupDriver``) are its base classes; the
    state they share is set here."""

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
        self._column_buffers: dict = {}  # TopicPartition -> (rows not yet handed out, the fetch's end): poll_columns(max_records=...)
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
        return (rebuild, (type(self), self.config))

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
        self._drop_buffers(self._buffered() - set(partitions))

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
            cooperative = all(supports_cooperative(a) for a in protocols)
            self._member = GroupMember(self.group_id, cooperative, self.config.group_instance_id)
        self._rejoin_needed = True

    def subscription(self) -> list[str]:
        return list(self._subscription)

    async def unsubscribe(self) -> None:
        if self._member is not None and self._member.state != MemberState.UNJOINED:
            await self._leave_group()
        self._subscription = ()
        self._positions = {}
        self._drop_buffers(self._buffered())

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
                        if code in GROUP_FENCING or code == ErrorCode.REBALANCE_IN_PROGRESS:
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

    def enforce_rebalance(self, group_error: int | None = None, generation_id: int | None = None) -> None:
        """Rejoin the group at the next ``poll`` (Kafka's ``enforceRebalance``).

        ``group_error``: the group's answer that showed this member's
        generation is over before a heartbeat did, e.g. the producer's
        TxnOffsetCommit refused with UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION or
        FENCED_INSTANCE_ID: the next poll then reports the partitions lost
        (``on_partitions_lost``: they may be someone else's already), not
        revoked. Without one (or with REBALANCE_IN_PROGRESS) the member
        revokes and rejoins as itself.

        ``generation_id``: the generation the refused request carried (from
        the ``group_metadata()`` it was sent with). When the member has
        joined another generation since (a round completed while the answer
        was on its way), the answer is about a generation this member has
        already left behind, and nothing happens: that round told the
        listener what changed, and what the member owns now is its own."""
        if self._member is None:
            raise FatalError(message="enforce_rebalance() needs subscribe()")
        if group_error is not None and group_error != ErrorCode.REBALANCE_IN_PROGRESS and group_error not in GROUP_FENCING:
            raise FatalError(message=f"enforce_rebalance: {group_error!r} is not a group error that ends a generation ({', '.join(sorted(ErrorCode(c).name for c in GROUP_FENCING))} or REBALANCE_IN_PROGRESS)")
        if generation_id is not None and generation_id != self._member.generation_id:
            return
        if group_error is None or group_error == ErrorCode.REBALANCE_IN_PROGRESS:
            self._rejoin_needed = True
        else:
            self._note_group_error(group_error)

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


class Consumer(SyncClient):
    """The synchronous consumer (``AsyncConsumer`` on its own loop thread).

    ``Consumer(bootstrap_servers="host:9092", group_id=None,
    isolation_level="read_committed", **config)``. Rebalance callbacks run
    on the thread that calls ``poll`` (or ``close``)."""

    thread_name = "onceflow-consumer"

    def __init__(self, bootstrap_servers=None, group_id: str | None = None, isolation_level: str | None = None, config: dict | ConsumerConfig | None = None, **options):
        bootstrap_servers, config = properties_first(bootstrap_servers, config)
        super().__init__(lambda: AsyncConsumer(bootstrap_servers, group_id, isolation_level, config, **options))
        self._callbacks: queue_module.SimpleQueue | None = None
        self._async._run_callback = self._callback_on_caller_thread

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

    def poll_columns(self, timeout: float = 1.0, max_records: int | None = None) -> dict:
        """``{TopicPartition: pyarrow.RecordBatch}`` of visible records
        (``AsyncConsumer.poll_columns``, ``txn.fetcher``)."""
        return self._call(self._async.poll_columns(timeout, max_records))

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

    def enforce_rebalance(self, group_error: int | None = None, generation_id: int | None = None) -> None:
        """Rejoin the group at the next ``poll`` (see ``AsyncConsumer.enforce_rebalance``)."""
        self._thread.run(self._async.enforce_rebalance, group_error, generation_id)


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
