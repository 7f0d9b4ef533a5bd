"""The group half of ``txn.consumer.AsyncConsumer``: membership of a consumer
group through the classic protocol (JoinGroup/SyncGroup/Heartbeat/LeaveGroup).

The member's states and what each event does to them are the table in
``txn.membership`` (``GroupMember``); this module sends the requests and
drives that table: a join round (JoinGroup, then SyncGroup, with the leader
computing the assignment through ``txn.assignors``) runs in a background
task, since the broker holds JoinGroup until every member rejoins; the
rebalance listener's ``on_partitions_revoked``, ``on_partitions_assigned``
and ``on_partitions_lost`` run inside ``poll``; heartbeats run in a
background task while the member is stable, and a member that stopped
polling for ``max_poll_interval_ms`` leaves (as Kafka's does). A SyncGroup
that fails on the coordinator (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE
when its ``__consumer_offsets`` write failed, a lost connection) is Kafka's
case too: the coordinator is forgotten (looked up again), and after the
retry backoff the member rejoins (SYNCING -> JOINING in the table); a round
that fails otherwise leaves the member JOINING as well, so the next poll
starts a legal round.

``GroupDriver`` is a base class of ``AsyncConsumer``, whose ``__init__``
sets the state it works on: ``_member``, ``_subscription``, ``_listener``,
``_rejoin_needed``, ``_fenced_code``, ``_pending_lost``, ``_join_task``,
``_heartbeat_task``, ``_last_poll``, ``_closed``, and the positions it
keeps in step with the assignment.
"""

from __future__ import annotations

import asyncio
import inspect
import time

import attrs

from protocol.constants import CoordinatorType
from protocol.errors import ErrorCode
from protocol.messages import ApiKey
from protocol.retry import client_request
from protocol.tasks import cancel_and_wait
from txn import assignors
from txn.errors import GROUP_FENCING, CommitFailedError, KafkaError, RetriableError, classify, is_retriable
from txn.membership import MemberState, RebalanceStep
from txn.types import TopicPartition

class GroupDriver:
    def _note_group_error(self, code: int) -> None:
        if code in GROUP_FENCING:
            self._fenced_code = code
        self._rejoin_needed = True

    async def _ensure_membership(self, deadline: float) -> bool:
        """Drive the member towards STABLE; False if the deadline came first.

        JoinGroup and SyncGroup run in a background task (the broker holds
        JoinGroup until every member rejoins, which may outlast this poll);
        listener callbacks run here, in the poll, before and after it. A
        cooperative member keeps what it owns through the round (KIP-429),
        so while the round is out it goes on fetching that (True) rather
        than wait: a round held up, by a dead static member's session or a
        slow member, does not stop it."""
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
            if member.cooperative and member.owned and not self._join_task.done():
                await asyncio.sleep(0)  # the round's requests go out first
                if not self._join_task.done():
                    return True
            remaining = deadline - time.monotonic()
            done, _pending = await asyncio.wait({self._join_task}, timeout=max(0.0, remaining))
            if not done:
                return False
            task, self._join_task = self._join_task, None
            try:
                outcome = task.result()
            except BaseException:
                if member.state == MemberState.SYNCING:
                    member.rebalance()  # the next round starts from JoinGroup
                raise
            await self._after_round(outcome)
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
        self._drop_buffers(self._buffered() - owned)
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
                response = await self.cluster.coordinator_request(self.group_id, CoordinatorType.GROUP, ApiKey.JOIN_GROUP, body, timeout=join_timeout, held=True)
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
        try:
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
            response = await self.cluster.coordinator_request(self.group_id, CoordinatorType.GROUP, ApiKey.SYNC_GROUP, sync, timeout=join_timeout, held=True)
            code = response["error_code"]
            if code and code != ErrorCode.REBALANCE_IN_PROGRESS and code not in GROUP_FENCING:
                raise classify(code, "SyncGroup")
        except (KafkaError, OSError) as error:
            if not (is_retriable(error) or isinstance(error, OSError)):
                raise
            # The leader's Metadata request or the SyncGroup failed (a broker
            # restarting closes the connection under either): coordinator_request
            # has forgotten a coordinator that moved or failed; a new round
            # finds it again (SyncGroup alone cannot be retried: the
            # generation may be gone by then).
            self.cluster.forget_coordinator(self.group_id, CoordinatorType.GROUP)
            await asyncio.sleep(client_request(self.config.retry_backoff_ms, self.config.retry_backoff_max_ms).delay(1))
            return ("rebalance", None)
        if code == ErrorCode.REBALANCE_IN_PROGRESS:
            return ("rebalance", None)
        if code in GROUP_FENCING:
            return ("fenced", code)
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
            except (KafkaError, OSError):
                continue  # the session timeout gives us room; the next beat tries again
            code = response["error_code"]
            if code in GROUP_FENCING or code == ErrorCode.REBALANCE_IN_PROGRESS:
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
            except (KafkaError, OSError):
                pass  # the session timeout removes us anyway


def supports_cooperative(assignor) -> bool:
    return any("COOPERATIVE" in str(getattr(p, "name", p)).upper() for p in assignor.rebalance_protocols)
