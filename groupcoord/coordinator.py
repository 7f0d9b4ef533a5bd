"""The group coordinator: classic consumer-group membership, offset commits,
and transactional offset commits (KIP-98, KIP-447), over injected I/O.

Membership follows the state table in ``groupcoord.state``: JoinGroup
requests wait until every known member has rejoined (or the rebalance
timeout, or for a new group ``group.initial.rebalance.delay.ms``, passes),
then all get the new generation and the leader gets the members'
subscriptions; SyncGroup requests wait for the leader's assignment, which is
written to ``__consumer_offsets`` before anyone gets it. Heartbeats keep a
member alive; a member silent past its session timeout is removed and the
group rebalances. Member ids are handed out with MEMBER_ID_REQUIRED
(KIP-394) so a retried JoinGroup cannot create ghosts; a static member
(``group.instance.id``) that rejoins replaces its old member id. A member
whose JoinGroup is held while its connection goes away (the process died)
still counts as joined, but does not lead the round: the caller says so
(``requester_gone``), and a member still connected leads, so the round
ends without waiting for the dead one's restart or session.

Offsets: an OffsetCommit from the current generation (or a "simple" commit
to a group with no members) is written, made durable, then cached. A
TxnOffsetCommit is written in a transactional batch of the producer and kept
pending per producer id; the COMMIT marker on the group's offsets partition
makes it the committed offset, ABORT discards it (``on_marker``). While an
offset is pending, OffsetFetch with require_stable answers
UNSTABLE_OFFSET_COMMIT for it. A TxnOffsetCommit carrying a generation is
fenced like a plain commit (KIP-447): a copier that lost its partitions in a
rebalance cannot commit offsets for them.

The durability rule is the transaction coordinator's, "write, then apply":
a change that ``__consumer_offsets`` records (the leader's assignment, a
group left empty) is computed as the next ``StoredGroup`` value
(``groupcoord.metadata``), written, and only once it is durable applied to
the live group; a write that fails leaves the group as it was. Offsets are
cached only after their write, too. A change that writes runs to its end
once started, as the coordinator's own task (``protocol.tasks.OwnedWork``,
awaited through ``asyncio.shield``): a request cancelled meanwhile (its
connection died) loses only its answer, never the apply after the write
nor the answers the other members wait for.

The coordinator never touches files; ``offsets_log`` appends records to the
group's ``__consumer_offsets`` partition and waits until they are durable.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Callable, Protocol

import attrs

from groupcoord.metadata import StoredGroup, StoredMember
from groupcoord.records import (
    GroupKey,
    OffsetAndMetadata,
    OffsetKey,
    assigned_partitions,
    decode_group_value,
    decode_key,
    decode_offset_value,
    group_key,
    offset_key,
    offset_value,
    subscribed_topics,
)
from groupcoord.state import GroupEvent, GroupState, transition
from protocol.clock import Clock
from protocol.errors import ErrorCode
from protocol.tasks import OwnedWork, every

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


class OffsetsLog(Protocol):
    async def append(self, group_id: str, records: list[tuple[bytes, bytes | None]], *, producer_id: int = -1, producer_epoch: int = -1) -> None: ...


@attrs.frozen
class GroupSettings:
    initial_rebalance_delay_ms: int = 3000
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    max_group_size: int = 2**31 - 1


@attrs.define(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    last_heartbeat: float = 0.0
    join_future: asyncio.Future | None = None
    sync_future: asyncio.Future | None = None
    # Whether the process that sent the pending JoinGroup is gone (its
    # connection closed or reset): it still counts as joined (its round need
    # not wait for it) but does not lead the round, whose assignment it
    # could never send.
    join_requester_gone: Callable[[], bool] = lambda: False

    def metadata_for(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""


@attrs.define(eq=False)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, Member] = attrs.field(factory=dict)
    pending_member_ids: set[str] = attrs.field(factory=set)
    static_members: dict[str, str] = attrs.field(factory=dict)
    offsets: dict[TopicPartition, OffsetAndMetadata] = attrs.field(factory=dict)
    pending_txn_offsets: dict[int, dict[TopicPartition, OffsetAndMetadata]] = attrs.field(factory=dict)
    join_deadline: float | None = None
    new_group_delay_until: float | None = None
    state_timestamp: int = -1

    def move(self, event: GroupEvent, now_ms: int, member_id: str | None = None) -> None:
        """A change that is not written to ``__consumer_offsets`` (a rebalance
        starts, every member has joined): the table decides, memory follows.
        ``member_id``: the member whose join or leave caused it, if one did."""
        old = self.state
        self.state = transition(self.state, event)
        self.state_timestamp = now_ms
        _log_change(self, old, event, member_id if member_id is not None else self.leader)

    def snapshot(self) -> StoredGroup:
        """The group as its GroupMetadata record would hold it now."""
        return StoredGroup(
            group_id=self.group_id,
            state=self.state,
            generation=self.generation,
            protocol_type=self.protocol_type,
            protocol_name=self.protocol_name,
            leader=self.leader,
            state_timestamp=self.state_timestamp,
            members=tuple(
                StoredMember(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    rebalance_timeout_ms=m.rebalance_timeout_ms,
                    session_timeout_ms=m.session_timeout_ms,
                    subscription=m.metadata_for(self.protocol_name or ""),
                    assignment=m.assignment,
                )
                for m in self.members.values()
            ),
        )

    def apply(self, stored: StoredGroup) -> None:
        """Make the live group what ``stored`` says, once it is durable:
        members it no longer lists leave, the others take their assignment."""
        kept = {m.member_id: m for m in stored.members}
        for member_id in [member_id for member_id in self.members if member_id not in kept]:
            gone = self.members.pop(member_id)
            if gone.group_instance_id and self.static_members.get(gone.group_instance_id) == member_id:
                del self.static_members[gone.group_instance_id]
        for member_id, member in self.members.items():
            member.assignment = kept[member_id].assignment
        old = self.state
        self.state = stored.state
        self.generation = stored.generation
        self.protocol_type = stored.protocol_type
        self.protocol_name = stored.protocol_name
        self.leader = stored.leader
        self.state_timestamp = stored.state_timestamp
        # A written change is the leader's assignment (to Stable) or the group left empty.
        _log_change(self, old, GroupEvent.LEADER_SYNC if stored.state == GroupState.STABLE else GroupEvent.ALL_MEMBERS_GONE, stored.leader)

    def has_pending_txn(self, partition: TopicPartition) -> bool:
        return any(partition in pending for pending in self.pending_txn_offsets.values())


STATE_NAMES = {s: s.value for s in GroupState}


def _log_change(group: Group, old: GroupState, event: GroupEvent, member_id: str | None) -> None:
    """One DEBUG line per state change of a group (``Group.move`` and
    ``Group.apply`` are the only places its state changes), ids as fields."""
    if not log.isEnabledFor(logging.DEBUG):
        return
    log.debug(
        "group %s: %s -> %s (generation %d, %s)", group.group_id, old.value, group.state.value, group.generation, event.name.lower(),
        extra={
            "event": "group_state_change",
            "group_id": group.group_id,
            "generation": group.generation,
            "member_id": member_id,
            "members": sorted(group.members),
            "old_state": old.value,
            "new_state": group.state.value,
            "cause": event.name.lower(),
        },
    )


class GroupCoordinator:
    def __init__(self, *, offsets_log: OffsetsLog, settings: GroupSettings = GroupSettings(), clock: Clock | None = None,
                 partition_count: Callable[[str], int] | None = None):
        self.offsets_log = offsets_log
        self.settings = settings
        # How many partitions a topic has now (0 if none): lets a static
        # member's restart tell whether the group's assignment still covers
        # every subscribed partition. None: not known (the check is skipped).
        self.partition_count = partition_count
        # Sessions and rebalance deadlines run on clock.monotonic(); what is
        # written (state timestamps) and offset retention on clock.wall_ms().
        self.clock = clock or Clock()
        self.groups: dict[str, Group] = {}
        # Every change that writes to __consumer_offsets runs as one of these.
        self._work = OwnedWork("group coordinator")

    # -- loading -------------------------------------------------------------------

    def load_record(self, key: bytes, value: bytes | None, *, producer_id: int = -1, transactional: bool = False) -> None:
        """Replay one ``__consumer_offsets`` record (log order)."""
        decoded = decode_key(key)
        if isinstance(decoded, OffsetKey):
            group = self.groups.get(decoded.group) or self.groups.setdefault(decoded.group, Group(decoded.group))
            partition = (decoded.topic, decoded.partition)
            offset = decode_offset_value(value)
            if transactional:
                if offset is not None:
                    group.pending_txn_offsets.setdefault(producer_id, {})[partition] = offset
            elif offset is None:
                group.offsets.pop(partition, None)
            else:
                group.offsets[partition] = offset
        elif isinstance(decoded, GroupKey):
            body = decode_group_value(value)
            if body is None:
                group = self.groups.get(decoded.group)
                if group is not None:
                    group.members.clear()
                    group.generation = 0
                    group.state = GroupState.EMPTY
                return
            group = self.groups.get(decoded.group) or self.groups.setdefault(decoded.group, Group(decoded.group))
            group.generation = body["generation"]
            group.protocol_type = body["protocol_type"] or None
            group.protocol_name = body["protocol"]
            group.leader = body["leader"]
            group.members.clear()
            group.static_members.clear()
            now = self.clock.monotonic()
            for entry in body["members"]:
                member = Member(
                    member_id=entry["member_id"],
                    group_instance_id=entry.get("group_instance_id"),
                    client_id=entry["client_id"],
                    client_host=entry["client_host"],
                    session_timeout_ms=entry["session_timeout"],
                    rebalance_timeout_ms=entry.get("rebalance_timeout", -1),
                    protocol_type=group.protocol_type or "",
                    protocols=[(group.protocol_name or "", entry["subscription"])],
                    assignment=entry["assignment"],
                    last_heartbeat=now,  # members get a fresh session after a restart
                )
                group.members[member.member_id] = member
                if member.group_instance_id:
                    group.static_members[member.group_instance_id] = member.member_id
            group.state = GroupState.STABLE if group.members else GroupState.EMPTY

    def log_loaded(self) -> dict:
        """One INFO line (counts as fields) of what replaying ``__consumer_offsets`` rebuilt."""
        states = [group.state for group in self.groups.values()]
        counts = {
            "groups": len(states),
            "stable": states.count(GroupState.STABLE),
            "empty": states.count(GroupState.EMPTY),
            "members": sum(len(group.members) for group in self.groups.values()),
            "committed_offsets": sum(len(group.offsets) for group in self.groups.values()),
            "pending_transactional_offsets": sum(len(pending) for group in self.groups.values() for pending in group.pending_txn_offsets.values()),
        }
        log.info(
            "recovery: loaded %(groups)d groups (%(stable)d stable, %(empty)d empty) with %(members)d members, "
            "%(committed_offsets)d committed offsets and %(pending_transactional_offsets)d transactional offsets awaiting their marker",
            counts,
            extra={"event": "group_recovery", **counts},
        )
        return counts

    # -- timers ---------------------------------------------------------------------

    async def run_timers(self, interval: float = 0.1) -> None:
        """Check session and rebalance timeouts every ``interval`` seconds
        until cancelled. The owner runs it (the broker, in its TaskGroup);
        tests call ``check_timeouts`` after moving a manual clock instead."""
        await every(interval, self.check_timeouts, "group timers")

    async def stop(self) -> None:
        """Stop the changes in flight (one cut between its write and its
        apply is rebuilt from the log by the next load) and cancel every
        JoinGroup and SyncGroup still waiting for an answer."""
        await self._work.close()
        for group in self.groups.values():
            for member in group.members.values():
                for future in (member.join_future, member.sync_future):
                    if future is not None and not future.done():
                        future.cancel()

    async def wait_idle(self) -> None:
        """Until every change in flight has been applied (tests)."""
        await self._work.wait()

    async def check_timeouts(self) -> None:
        now = self.clock.monotonic()
        for group in list(self.groups.values()):
            expired = [
                m for m in group.members.values()
                if (m.join_future is None or m.join_future.done()) and now - m.last_heartbeat > m.session_timeout_ms / 1000.0
            ]
            for member in expired:
                log.info("group %s: member %s missed its session timeout; removing it", group.group_id, member.member_id)
                await self._work.run(self._remove_member(group, member, ErrorCode.UNKNOWN_MEMBER_ID))
            if group.state == GroupState.PREPARING_REBALANCE:
                await self._work.run(self._maybe_complete_join(group))

    # -- JoinGroup ----------------------------------------------------------------------

    async def join_group(self, *, group_id: str, member_id: str, group_instance_id: str | None, client_id: str, client_host: str, session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str, protocols: list[tuple[str, bytes]], require_known_member_id: bool,
                         skip_assignment_supported: bool = False, requester_gone: Callable[[], bool] | None = None) -> dict:
        """KIP-394/345 JoinGroup; ``requester_gone()`` tells whether the
        connection the request came on is gone while it waits for its round."""
        if not group_id:
            return {"error_code": ErrorCode.INVALID_GROUP_ID, "member_id": member_id}
        if not self.settings.min_session_timeout_ms <= session_timeout_ms <= self.settings.max_session_timeout_ms:
            return {"error_code": ErrorCode.INVALID_SESSION_TIMEOUT, "member_id": member_id}
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        if group.state == GroupState.DEAD:
            return {"error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE, "member_id": member_id}
        if not protocols or (group.members and (protocol_type != group.protocol_type or not self._common_protocols(group, protocols))):
            return {"error_code": ErrorCode.INCONSISTENT_GROUP_PROTOCOL, "member_id": member_id}
        rebalance_timeout_ms = rebalance_timeout_ms if rebalance_timeout_ms > 0 else session_timeout_ms

        restarted = False  # a static member's new process (no member id yet) taking its place back
        if group_instance_id and group_instance_id in group.static_members:
            old_id = group.static_members[group_instance_id]
            if member_id and member_id != old_id:
                return {"error_code": ErrorCode.FENCED_INSTANCE_ID, "member_id": member_id}
            restarted = not member_id
            member_id = old_id
        elif not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if group_instance_id:
                group.static_members[group_instance_id] = member_id
            elif require_known_member_id:
                group.pending_member_ids.add(member_id)
                return {"error_code": ErrorCode.MEMBER_ID_REQUIRED, "member_id": member_id}
        elif member_id not in group.members and member_id not in group.pending_member_ids:
            return {"error_code": ErrorCode.UNKNOWN_MEMBER_ID, "member_id": member_id}
        group.pending_member_ids.discard(member_id)
        if member_id not in group.members and len(group.members) >= self.settings.max_group_size:
            return {"error_code": ErrorCode.GROUP_MAX_SIZE_REACHED, "member_id": member_id}

        member = group.members.get(member_id)
        if (member is not None and restarted and self._static_rejoin_keeps_assignment(group, member, protocol_type, protocols, skip_assignment_supported)
                and await self._work.run(self._replace_static_member(group, member, f"{client_id or 'member'}-{uuid.uuid4()}"))):
            # KIP-345: a static member back from a restart, in a stable group,
            # with protocols that leave the group's choice as it is, gets the
            # current generation and (at SyncGroup) its assignment back. A
            # rebalance here would stop every member until each had heard of
            # it at its next heartbeat (up to heartbeat.interval.ms: 3 s by
            # default) and rejoined. The leader is told to skip the
            # assignment (KIP-814, JoinGroup v9); a leader whose client asks
            # with an older version cannot be, and rebalances.
            # It has a member id of its own (written first): the process it
            # replaced, if still alive, is answered FENCED_INSTANCE_ID.
            member_id = member.member_id
            member.protocols = list(protocols)
            member.session_timeout_ms = session_timeout_ms
            member.rebalance_timeout_ms = rebalance_timeout_ms
            member.last_heartbeat = self.clock.monotonic()
            log.info("group %s: static member %s (%s) rejoined; generation %d kept, no rebalance", group.group_id, member_id, group_instance_id, group.generation)
            is_leader = member_id == group.leader
            members = [{"member_id": m.member_id, "group_instance_id": m.group_instance_id, "metadata": m.metadata_for(group.protocol_name)}
                       for m in group.members.values()] if is_leader else []
            return {"error_code": ErrorCode.NONE, "generation_id": group.generation, "protocol_type": group.protocol_type, "protocol_name": group.protocol_name,
                    "leader": group.leader, "member_id": member_id, "members": members, "skip_assignment": is_leader}
        if member is None:
            member = Member(member_id, group_instance_id, client_id, client_host, session_timeout_ms, rebalance_timeout_ms, protocol_type, list(protocols))
            group.members[member_id] = member
        else:
            member.protocols = list(protocols)
            member.session_timeout_ms = session_timeout_ms
            member.rebalance_timeout_ms = rebalance_timeout_ms
        member.last_heartbeat = self.clock.monotonic()
        if member.join_future is not None and not member.join_future.done():
            member.join_future.set_result({"error_code": ErrorCode.UNKNOWN_MEMBER_ID, "member_id": member_id})
        member.join_future = asyncio.get_running_loop().create_future()
        member.join_requester_gone = requester_gone or (lambda: False)
        group.protocol_type = protocol_type
        self._prepare_rebalance(group, member_id=member_id)
        await self._work.run(self._maybe_complete_join(group))
        return await member.join_future

    async def _replace_static_member(self, group: Group, member: Member, new_id: str) -> bool:
        """KIP-345's takeover: give a restarted static member a new member id,
        written to ``__consumer_offsets`` before it is used (a coordinator
        restart replays it). False if the write failed or the group changed
        meanwhile (the caller rebalances instead)."""
        old_id = member.member_id
        before = group.snapshot()
        after = attrs.evolve(before, leader=new_id if before.leader == old_id else before.leader,
                             members=tuple(attrs.evolve(m, member_id=new_id) if m.member_id == old_id else m for m in before.members))
        try:
            await self.offsets_log.append(group.group_id, [after.to_record()])
        except Exception as error:  # noqa: BLE001 - logged; the member rejoins through a rebalance instead
            log.error("group %s: could not write the takeover of %s: %s", group.group_id, member.group_instance_id, error)
            return False
        if group.snapshot() != before or self.groups.get(group.group_id) is not group or group.members.get(old_id) is not member:
            return False
        renamed = {(new_id if key == old_id else key): value for key, value in group.members.items()}
        group.members.clear()
        group.members.update(renamed)
        member.member_id = new_id
        group.static_members[member.group_instance_id] = new_id
        if group.leader == old_id:
            group.leader = new_id
        return True

    def _static_rejoin_keeps_assignment(self, group: Group, member: Member, protocol_type: str, protocols, skip_assignment_supported: bool) -> bool:
        """Kafka's rule (the group's protocol choice stays as it is), and the
        same subscribed topics (a changed subscription needs a new assignment),
        and an assignment that leaves no subscribed partition unowned."""
        chosen = group.protocol_name or ""
        new_metadata = dict(protocols).get(chosen, b"")
        if not (bool(member.group_instance_id) and group.state == GroupState.STABLE and (skip_assignment_supported or member.member_id != group.leader)
                and protocol_type == group.protocol_type and [name for name, _ in protocols] == [name for name, _ in member.protocols]
                and subscribed_topics(protocol_type, new_metadata) == subscribed_topics(protocol_type, member.metadata_for(chosen))):
            return False
        unowned = self._unowned_partitions(group)
        if unowned:
            log.info("group %s: static member %s rejoined while %d partition(s) are owned by no member (%s); rebalancing",
                     group.group_id, member.group_instance_id, len(unowned), ", ".join(f"{t}-{p}" for t, p in sorted(unowned)[:5]))
        return not unowned

    def _unowned_partitions(self, group: Group) -> set[tuple[str, int]]:
        """Partitions of the group's subscribed topics that no member's
        current assignment holds. A stable group can have some: a
        cooperative round (KIP-429) leaves a moving partition out until its
        old owner, having revoked it, rejoins for the round that hands it
        over. If that owner is killed before it rejoins and comes back as the
        same static member, keeping the stored assignments would orphan the
        partition for good (nobody is left with a reason to rejoin); the
        caller rebalances instead. An assignment that does not decode holds
        nothing."""
        if self.partition_count is None or group.protocol_type != "consumer":
            return set()
        protocol = group.protocol_name or ""
        subscribed: set[str] = set()
        owned: set[tuple[str, int]] = set()
        for member in group.members.values():
            subscribed |= subscribed_topics(group.protocol_type, member.metadata_for(protocol))
            owned |= assigned_partitions(group.protocol_type, member.assignment) or set()
        wanted = {(topic, partition) for topic in subscribed for partition in range(self.partition_count(topic))}
        return wanted - owned

    def _common_protocols(self, group: Group, protocols) -> list[str]:
        names = [name for name, _ in protocols]
        for member in group.members.values():
            supported = {name for name, _ in member.protocols}
            names = [n for n in names if n in supported]
        return names

    def _prepare_rebalance(self, group: Group, event: GroupEvent = GroupEvent.MEMBER_JOIN, member_id: str | None = None) -> None:
        if group.state == GroupState.PREPARING_REBALANCE:
            return
        was_empty = group.state == GroupState.EMPTY
        for member in group.members.values():
            if member.sync_future is not None and not member.sync_future.done():
                member.sync_future.set_result({"error_code": ErrorCode.REBALANCE_IN_PROGRESS, "assignment": b""})
        group.move(event, self.clock.wall_ms(), member_id)
        timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0) / 1000.0
        now = self.clock.monotonic()
        group.join_deadline = now + timeout
        group.new_group_delay_until = now + self.settings.initial_rebalance_delay_ms / 1000.0 if was_empty else None

    async def _maybe_complete_join(self, group: Group) -> None:
        if group.state != GroupState.PREPARING_REBALANCE:
            return
        now = self.clock.monotonic()
        all_joined = all(m.join_future is not None and not m.join_future.done() for m in group.members.values())
        in_initial_delay = group.new_group_delay_until is not None and now < group.new_group_delay_until
        timed_out = group.join_deadline is not None and now >= group.join_deadline
        if not (timed_out or (all_joined and not in_initial_delay)):
            return
        missing = [m for m in group.members.values() if m.join_future is None or m.join_future.done()]
        if len(missing) == len(group.members):
            # Nobody rejoined: the group ends empty, which is written before it is so.
            before = group.snapshot()
            emptied = before.emptied(self.clock.wall_ms())
            if await self._write_then_apply(group, before, emptied):
                log.info("group %s: no member rejoined in time; the group is empty", group.group_id)
            return
        for member in missing:
            log.info("group %s: member %s did not rejoin in time; removing it", group.group_id, member.member_id)
            del group.members[member.member_id]
            if member.group_instance_id:
                group.static_members.pop(member.group_instance_id, None)
        # The new generation lives in memory until the leader's assignment is
        # written (SyncGroup), as in Kafka: a crash before that replays the old one.
        group.generation += 1
        members = list(group.members.values())
        leader = group.members.get(group.leader)
        if leader is None or leader.join_requester_gone():
            # A leader that died in the round would never send the
            # assignment: the group would wait in CompletingRebalance for its
            # restart or its session's end. A member still there leads.
            alive = [m for m in members if not m.join_requester_gone()]
            group.leader = (alive[0] if alive else leader or members[0]).member_id
        leader = group.members[group.leader]
        candidates = self._common_protocols(group, leader.protocols)
        group.protocol_name = candidates[0] if candidates else leader.protocols[0][0]
        group.move(GroupEvent.JOIN_COMPLETE, self.clock.wall_ms())
        for member in members:
            response = {
                "error_code": ErrorCode.NONE,
                "generation_id": group.generation,
                "protocol_type": group.protocol_type,
                "protocol_name": group.protocol_name,
                "leader": group.leader,
                "member_id": member.member_id,
                "members": [
                    {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "metadata": m.metadata_for(group.protocol_name)}
                    for m in members
                ]
                if member.member_id == group.leader
                else [],
            }
            if member.join_future is not None and not member.join_future.done():
                member.join_future.set_result(response)

    # -- SyncGroup ----------------------------------------------------------------------

    async def sync_group(self, *, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None, assignments: list[tuple[str, bytes]]) -> dict:
        group = self.groups.get(group_id)
        error = self._check_member(group, member_id, generation_id, group_instance_id)
        if error:
            return {"error_code": error, "assignment": b""}
        member = group.members[member_id]
        member.last_heartbeat = self.clock.monotonic()
        if group.state == GroupState.PREPARING_REBALANCE:
            return {"error_code": ErrorCode.REBALANCE_IN_PROGRESS, "assignment": b""}
        if group.state == GroupState.STABLE:
            return self._sync_answer(group, member)
        member.sync_future = asyncio.get_running_loop().create_future()
        if member_id == group.leader:
            await self._work.run(self._store_assignment(group, member, generation_id, assignments))
        return await member.sync_future

    async def _store_assignment(self, group: Group, member: Member, generation_id: int, assignments: list[tuple[str, bytes]]) -> None:
        """The leader's SyncGroup: write the assignment, apply it, answer
        every member waiting (the leader's own answer included)."""
        before = group.snapshot()
        synced = before.synced(dict(assignments), self.clock.wall_ms())
        try:
            applied = await self._write_then_apply(group, before, synced, raise_on_failure=True)
        except Exception:
            # Nothing changed: the group still waits for an assignment
            # that is durable. Everyone waiting is told; a retried
            # SyncGroup writes again, a rejoin starts a new rebalance.
            for other in group.members.values():
                if other.sync_future is not None and not other.sync_future.done():
                    other.sync_future.set_result({"error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE, "assignment": b""})
            return
        if applied:
            for other in group.members.values():
                if other.sync_future is not None and not other.sync_future.done():
                    other.sync_future.set_result(self._sync_answer(group, other))
        elif not member.sync_future.done():
            # The group moved on while the assignment was written (a rebalance
            # started, or another SyncGroup of this leader got there first).
            same = group.state == GroupState.STABLE and group.generation == generation_id
            member.sync_future.set_result(self._sync_answer(group, member) if same else {"error_code": ErrorCode.REBALANCE_IN_PROGRESS, "assignment": b""})

    def _sync_answer(self, group: Group, member: Member) -> dict:
        return {"error_code": ErrorCode.NONE, "protocol_type": group.protocol_type, "protocol_name": group.protocol_name, "assignment": member.assignment}

    def _check_member(self, group: Group | None, member_id: str, generation_id: int, group_instance_id: str | None = None) -> ErrorCode:
        if group is None or group.state == GroupState.DEAD:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group_instance_id and group.static_members.get(group_instance_id) not in (None, member_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    # -- Heartbeat / LeaveGroup -------------------------------------------------------------

    async def heartbeat(self, *, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None) -> ErrorCode:
        group = self.groups.get(group_id)
        error = self._check_member(group, member_id, generation_id, group_instance_id)
        if error:
            return error
        group.members[member_id].last_heartbeat = self.clock.monotonic()
        if group.state == GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    async def leave_group(self, *, group_id: str, members: list[tuple[str, str | None]]) -> tuple[ErrorCode, list[dict]]:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.NONE, [{"member_id": m, "group_instance_id": i, "error_code": ErrorCode.UNKNOWN_MEMBER_ID} for m, i in members]
        results = []
        for member_id, instance_id in members:
            if instance_id and not member_id:
                member_id = group.static_members.get(instance_id, "")
            member = group.members.get(member_id)
            if member is None:
                results.append({"member_id": member_id, "group_instance_id": instance_id, "error_code": ErrorCode.UNKNOWN_MEMBER_ID})
                continue
            error = await self._work.run(self._remove_member(group, member, ErrorCode.UNKNOWN_MEMBER_ID))
            results.append({"member_id": member_id, "group_instance_id": instance_id, "error_code": error})
        top = results[0]["error_code"] if len(results) == 1 else ErrorCode.NONE
        return top, results

    async def _remove_member(self, group: Group, member: Member, error: ErrorCode) -> ErrorCode:
        """Take a member out (it left, or its session expired). The last one
        out empties the group, which is written first: if that write fails
        the member stays (a LeaveGroup is answered COORDINATOR_NOT_AVAILABLE,
        an expired session is tried again on the next tick)."""
        while group.members.get(member.member_id) is member:
            if group.state != GroupState.EMPTY and len(group.members) == 1:
                before = group.snapshot()
                emptied = before.emptied(self.clock.wall_ms())
                try:
                    applied = await self._write_then_apply(group, before, emptied, raise_on_failure=True)
                except Exception:
                    return ErrorCode.COORDINATOR_NOT_AVAILABLE
                if not applied:
                    continue  # the group changed during the write: decide again
                self._member_gone(group, member, error)
                return ErrorCode.NONE
            self._member_gone(group, member, error)
            if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
                self._prepare_rebalance(group, GroupEvent.MEMBER_LEAVE, member.member_id)
            await self._maybe_complete_join(group)
            return ErrorCode.NONE
        return ErrorCode.NONE

    def _member_gone(self, group: Group, member: Member, error: ErrorCode) -> None:
        """Forget a member (in memory) and answer whatever it still waits for."""
        if group.members.get(member.member_id) is member:
            del group.members[member.member_id]
        if member.group_instance_id and group.static_members.get(member.group_instance_id) == member.member_id:
            del group.static_members[member.group_instance_id]
        for future in (member.join_future, member.sync_future):
            if future is not None and not future.done():
                future.set_result({"error_code": error, "member_id": member.member_id, "assignment": b""})
        if group.leader == member.member_id:
            group.leader = None

    # -- offsets ------------------------------------------------------------------------------

    def _commit_allowed(self, group: Group | None, generation_id: int, member_id: str, group_instance_id: str | None) -> ErrorCode:
        if generation_id < 0 and not member_id:
            # A "simple" commit (assign() consumers, tools): only to a group with no members.
            if group is not None and group.members:
                return ErrorCode.UNKNOWN_MEMBER_ID
            return ErrorCode.NONE
        error = self._check_member(group, member_id, generation_id, group_instance_id)
        if error:
            return error
        if group.state == GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    async def commit_offsets(self, *, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None, offsets: dict[TopicPartition, OffsetAndMetadata]) -> ErrorCode:
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        group = self.groups.get(group_id)
        error = self._commit_allowed(group, generation_id, member_id, group_instance_id)
        if error:
            return error
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        return await self._work.run(self._write_offsets(group, offsets))

    async def _write_offsets(self, group: Group, offsets: dict[TopicPartition, OffsetAndMetadata]) -> ErrorCode:
        records = [(offset_key(group.group_id, t, p), offset_value(value)) for (t, p), value in offsets.items()]
        try:
            await self.offsets_log.append(group.group_id, records)
        except Exception as error:
            log.error("group %s: offset commit not written: %s", group.group_id, error)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        group.offsets.update(offsets)
        return ErrorCode.NONE

    async def txn_commit_offsets(self, *, group_id: str, producer_id: int, producer_epoch: int, generation_id: int, member_id: str, group_instance_id: str | None, offsets: dict[TopicPartition, OffsetAndMetadata]) -> ErrorCode:
        group = self.groups.get(group_id)
        if generation_id >= 0 or member_id:
            # KIP-447: the producer's consumer must still be a member of this generation.
            error = self._check_member(group, member_id, generation_id, group_instance_id)
            if error:
                return error
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        return await self._work.run(self._write_txn_offsets(group, producer_id, producer_epoch, offsets))

    async def _write_txn_offsets(self, group: Group, producer_id: int, producer_epoch: int, offsets: dict[TopicPartition, OffsetAndMetadata]) -> ErrorCode:
        records = [(offset_key(group.group_id, t, p), offset_value(value)) for (t, p), value in offsets.items()]
        try:
            await self.offsets_log.append(group.group_id, records, producer_id=producer_id, producer_epoch=producer_epoch)
        except Exception as error:
            code = getattr(ErrorCode, getattr(error, "error_name", ""), None)
            log.error("group %s: transactional offset commit not written: %s", group.group_id, error)
            return code if code is not None else ErrorCode.COORDINATOR_NOT_AVAILABLE
        group.pending_txn_offsets.setdefault(producer_id, {}).update(offsets)
        return ErrorCode.NONE

    def on_marker(self, producer_id: int, commit: bool, owns_group: Callable[[str], bool] = lambda g: True) -> None:
        """A COMMIT/ABORT marker reached an offsets partition: settle that
        producer's pending offsets of the groups in that partition."""
        for group in self.groups.values():
            if not owns_group(group.group_id):
                continue
            pending = group.pending_txn_offsets.pop(producer_id, None)
            if pending and commit:
                group.offsets.update(pending)

    def fetch_offsets(self, group_id: str, partitions: list[TopicPartition] | None, require_stable: bool) -> dict[TopicPartition, tuple[OffsetAndMetadata | None, ErrorCode]]:
        group = self.groups.get(group_id)
        if partitions is None:
            partitions = sorted(group.offsets) if group else []
        result = {}
        for partition in partitions:
            if group is not None and require_stable and group.has_pending_txn(partition):
                result[partition] = (None, ErrorCode.UNSTABLE_OFFSET_COMMIT)
            else:
                result[partition] = ((group.offsets.get(partition) if group else None), ErrorCode.NONE)
        return result

    # -- administration --------------------------------------------------------------------------

    def describe(self, group_id: str) -> dict:
        group = self.groups.get(group_id)
        if group is None:
            return {"error_code": ErrorCode.NONE, "group_id": group_id, "group_state": "Dead", "protocol_type": "", "protocol_data": "", "members": []}
        return {
            "error_code": ErrorCode.NONE,
            "group_id": group_id,
            "group_state": STATE_NAMES[group.state],
            "protocol_type": group.protocol_type or "",
            "protocol_data": group.protocol_name or "",
            "members": [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_metadata": m.metadata_for(group.protocol_name or ""),
                    "member_assignment": m.assignment,
                }
                for m in group.members.values()
            ],
        }

    def list_groups(self, states: list[str] | None = None) -> list[dict]:
        return [
            {"group_id": g.group_id, "protocol_type": g.protocol_type or "", "group_state": STATE_NAMES[g.state], "group_type": "classic"}
            for g in self.groups.values()
            if g.state != GroupState.DEAD and (not states or STATE_NAMES[g.state] in states)
        ]

    async def delete_group(self, group_id: str) -> ErrorCode:
        group = self.groups.get(group_id)
        if group is None or group.state == GroupState.DEAD:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if group.state != GroupState.EMPTY:
            return ErrorCode.NON_EMPTY_GROUP
        return await self._work.run(self._delete_group(group))

    async def _delete_group(self, group: Group) -> ErrorCode:
        group_id = group.group_id
        records = [(offset_key(group_id, t, p), None) for (t, p) in group.offsets] + [(group_key(group_id), None)]
        try:
            await self.offsets_log.append(group_id, records)
        except Exception:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        group.move(GroupEvent.DELETE, self.clock.wall_ms())
        if self.groups.get(group_id) is group:
            del self.groups[group_id]
        return ErrorCode.NONE

    async def delete_offsets(self, group_id: str, partitions: list[TopicPartition]) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND, {}
        subscribed = set()
        if group.state != GroupState.EMPTY:
            for member in group.members.values():
                subscribed |= subscribed_topics(group.protocol_type, member.metadata_for(group.protocol_name or ""))
        results = {}
        deletable = []
        for partition in partitions:
            if partition[0] in subscribed:
                results[partition] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
            else:
                results[partition] = ErrorCode.NONE
                deletable.append(partition)
        if deletable and not await self._work.run(self._delete_offsets(group, deletable)):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, {}
        return ErrorCode.NONE, results

    async def _delete_offsets(self, group: Group, partitions: list[TopicPartition]) -> bool:
        """Write tombstones for ``partitions`` of ``group``, then forget them; False if not written."""
        try:
            await self.offsets_log.append(group.group_id, [(offset_key(group.group_id, t, p), None) for t, p in partitions])
        except Exception:
            return False
        for partition in partitions:
            group.offsets.pop(partition, None)
        return True

    async def expire_offsets(self) -> int:
        """Offset retention (``offsets.retention.minutes``) for groups with no members."""
        now = self.clock.wall_ms()
        removed = 0
        for group in list(self.groups.values()):
            if group.state != GroupState.EMPTY:
                continue
            old = [p for p, v in group.offsets.items() if v.commit_timestamp >= 0 and now - v.commit_timestamp > self.settings.offsets_retention_ms]
            if old and await self._work.run(self._delete_offsets(group, old)):
                removed += len(old)
        return removed

    async def _write_then_apply(self, group: Group, before: StoredGroup, after: StoredGroup, *, raise_on_failure: bool = False) -> bool:
        """Write ``after`` (computed from ``before``) to ``__consumer_offsets``;
        once it is durable, apply it, unless the group changed while the
        write was out (then the caller decides again; the record written is
        superseded by the next one). False if not applied; a failed write
        changes nothing and is logged (and raised with ``raise_on_failure``)."""
        try:
            await self.offsets_log.append(group.group_id, [after.to_record()])
        except Exception as error:
            log.error("group %s: could not write %s generation %d: %s", group.group_id, after.state.value, after.generation, error)
            if raise_on_failure:
                raise
            return False
        if group.snapshot() != before or self.groups.get(group.group_id) is not group:
            return False
        group.apply(after)
        return True
