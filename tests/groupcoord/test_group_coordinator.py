"""The group coordinator's membership and offset rules, with an in-memory offsets log."""

from __future__ import annotations

import asyncio


from groupcoord.records import OffsetAndMetadata, assigned_partitions, decode_group_value, decode_key, decode_offset_value, group_key, offset_key, offset_value, subscribed_topics
from groupcoord.state import GroupState
from protocol.errors import ErrorCode
from tests.helpers import MemoryOffsetsLog, join_group, join_two, joined_together, make_group_coordinator


def test_two_members_join_sync_and_become_stable():
    async def scenario():
        coordinator, _ = make_group_coordinator()
        a, b = await join_two(coordinator)
        assert a["generation_id"] == b["generation_id"] == 1
        leader = a if a["members"] else b
        follower = b if leader is a else a
        assert leader["leader"] == leader["member_id"] and len(leader["members"]) == 2 and follower["members"] == []
        assignments = [(leader["member_id"], b"L"), (follower["member_id"], b"F")]
        synced = await asyncio.gather(
            coordinator.sync_group(group_id="g", generation_id=1, member_id=follower["member_id"], group_instance_id=None, assignments=[]),
            coordinator.sync_group(group_id="g", generation_id=1, member_id=leader["member_id"], group_instance_id=None, assignments=assignments),
        )
        assert [s["assignment"] for s in synced] == [b"F", b"L"]
        assert coordinator.groups["g"].state == GroupState.STABLE
        assert coordinator.offsets_log.batches[-1][1][0][0] == group_key("g"), "the assignment is written before anyone gets it"
        await coordinator.stop()

    asyncio.run(scenario())


def test_stale_generation_and_unknown_member_are_refused():
    async def scenario():
        coordinator, _ = make_group_coordinator()
        a, _b = await join_two(coordinator)
        await coordinator.stop()
        assert await coordinator.heartbeat(group_id="g", generation_id=0, member_id=a["member_id"], group_instance_id=None) == ErrorCode.ILLEGAL_GENERATION
        assert await coordinator.heartbeat(group_id="g", generation_id=1, member_id="ghost", group_instance_id=None) == ErrorCode.UNKNOWN_MEMBER_ID
        offsets = {("t", 0): OffsetAndMetadata(5)}
        assert await coordinator.commit_offsets(group_id="g", generation_id=0, member_id=a["member_id"], group_instance_id=None, offsets=offsets) == ErrorCode.ILLEGAL_GENERATION
        assert await coordinator.txn_commit_offsets(group_id="g", producer_id=7, producer_epoch=0, generation_id=0, member_id=a["member_id"], group_instance_id=None, offsets=offsets) == ErrorCode.ILLEGAL_GENERATION
        assert await coordinator.commit_offsets(group_id="g", generation_id=-1, member_id="", group_instance_id=None, offsets=offsets) == ErrorCode.UNKNOWN_MEMBER_ID, "no simple commits into a live group"

    asyncio.run(scenario())


def test_a_silent_member_is_removed_and_the_group_rebalances():
    async def scenario():
        coordinator, clock = make_group_coordinator()
        a, b = await join_two(coordinator)
        leader = a if a["members"] else b
        await asyncio.gather(*(
            coordinator.sync_group(group_id="g", generation_id=1, member_id=m["member_id"], group_instance_id=None, assignments=[(a["member_id"], b"1"), (b["member_id"], b"2")] if m is leader else [])
            for m in (a, b)
        ))
        clock.advance(0.6)
        await coordinator.heartbeat(group_id="g", generation_id=1, member_id=a["member_id"], group_instance_id=None)
        clock.advance(0.6)  # b has been silent for 1.2 s > its 1 s session
        await coordinator.check_timeouts()
        group = coordinator.groups["g"]
        assert set(group.members) == {a["member_id"]}
        assert group.state == GroupState.PREPARING_REBALANCE
        assert await coordinator.heartbeat(group_id="g", generation_id=1, member_id=a["member_id"], group_instance_id=None) == ErrorCode.REBALANCE_IN_PROGRESS
        rejoined = await asyncio.wait_for(join_group(coordinator, a["member_id"]), 5)
        assert rejoined["generation_id"] == 2 and rejoined["leader"] == a["member_id"]
        await coordinator.stop()

    asyncio.run(scenario())


def test_leave_group_empties_the_group():
    async def scenario():
        coordinator, _ = make_group_coordinator()
        first = await join_group(coordinator)
        [joined] = await joined_together(coordinator, join_group(coordinator, first["member_id"]))
        error, results = await coordinator.leave_group(group_id="g", members=[(joined["member_id"], None)])
        assert error == ErrorCode.NONE and results[0]["error_code"] == ErrorCode.NONE
        assert coordinator.groups["g"].state == GroupState.EMPTY
        assert await coordinator.delete_group("g") == ErrorCode.NONE
        assert "g" not in coordinator.groups
        assert await coordinator.delete_group("g") == ErrorCode.GROUP_ID_NOT_FOUND

    asyncio.run(scenario())


def test_transactional_offsets_count_only_after_commit_marker():
    async def scenario():
        coordinator, _ = make_group_coordinator()
        offsets = {("t", 0): OffsetAndMetadata(10)}
        assert await coordinator.txn_commit_offsets(group_id="g", producer_id=7, producer_epoch=0, generation_id=-1, member_id="", group_instance_id=None, offsets=offsets) == ErrorCode.NONE
        assert coordinator.fetch_offsets("g", [("t", 0)], False)[("t", 0)] == (None, ErrorCode.NONE)
        assert coordinator.fetch_offsets("g", [("t", 0)], True)[("t", 0)] == (None, ErrorCode.UNSTABLE_OFFSET_COMMIT)
        coordinator.on_marker(7, commit=False)
        assert coordinator.fetch_offsets("g", [("t", 0)], True)[("t", 0)] == (None, ErrorCode.NONE), "abort discards"
        await coordinator.txn_commit_offsets(group_id="g", producer_id=7, producer_epoch=1, generation_id=-1, member_id="", group_instance_id=None, offsets=offsets)
        coordinator.on_marker(7, commit=True)
        value, error = coordinator.fetch_offsets("g", [("t", 0)], True)[("t", 0)]
        assert error == ErrorCode.NONE and value.offset == 10

    asyncio.run(scenario())


def test_replay_rebuilds_offsets_and_pending_transactions():
    coordinator, _ = make_group_coordinator()
    coordinator.load_record(offset_key("g", "t", 0), offset_value(OffsetAndMetadata(3, metadata="m", commit_timestamp=1)))
    coordinator.load_record(offset_key("g", "t", 1), offset_value(OffsetAndMetadata(4)))
    coordinator.load_record(offset_key("g", "t", 1), None)
    coordinator.load_record(offset_key("g", "t", 2), offset_value(OffsetAndMetadata(9)), producer_id=5, transactional=True)
    group = coordinator.groups["g"]
    assert group.offsets == {("t", 0): OffsetAndMetadata(3, -1, "m", 1)}
    assert group.has_pending_txn(("t", 2))
    coordinator.on_marker(5, commit=True)
    assert group.offsets[("t", 2)].offset == 9
    key = decode_key(offset_key("g", "t", 0))
    assert (key.group, key.topic, key.partition) == ("g", "t", 0)
    assert decode_offset_value(offset_value(OffsetAndMetadata(1, 2, "x", 3))) == OffsetAndMetadata(1, 2, "x", 3)


def test_join_validates_session_timeout_and_protocols():
    async def scenario():
        coordinator, _ = make_group_coordinator(min_session_timeout_ms=1000)
        assert (await join_group(coordinator, session=10))["error_code"] == ErrorCode.INVALID_SESSION_TIMEOUT
        first = await join_group(coordinator)
        await joined_together(coordinator, join_group(coordinator, first["member_id"]))
        other = await join_group(coordinator, protocols=(("roundrobin-only", b""),))
        assert other["error_code"] == ErrorCode.INCONSISTENT_GROUP_PROTOCOL

    asyncio.run(scenario())


def test_static_member_keeps_its_member_id_and_fences_impostors():
    async def scenario():
        coordinator, _ = make_group_coordinator(initial_rebalance_delay_ms=0)
        first = await asyncio.wait_for(join_group(coordinator, instance="worker-1"), 5)
        assert first["error_code"] == ErrorCode.NONE, "static members need no MEMBER_ID_REQUIRED round trip"
        again = await asyncio.wait_for(join_group(coordinator, instance="worker-1"), 5)
        assert again["member_id"] == first["member_id"], "a restarted static member keeps its id"
        impostor = await join_group(coordinator, member_id="someone-else", instance="worker-1")
        assert impostor["error_code"] == ErrorCode.FENCED_INSTANCE_ID
        await coordinator.stop()

    asyncio.run(scenario())


def test_a_restarted_static_follower_gets_its_assignment_back_without_a_rebalance():
    """KIP-345: the follower's restart costs the group nothing (no member has
    to hear of a rebalance and rejoin); the leader's restart still rebalances."""
    async def scenario():
        coordinator, _ = make_group_coordinator()
        a, b = await joined_together(coordinator, join_group(coordinator, instance="w-1"), join_group(coordinator, instance="w-2"))
        leader = a if a["members"] else b
        follower = b if leader is a else a
        follower_instance = "w-2" if follower is b else "w-1"
        leader_instance = "w-1" if follower_instance == "w-2" else "w-2"
        assignments = [(leader["member_id"], b"L"), (follower["member_id"], b"F")]
        await asyncio.gather(
            coordinator.sync_group(group_id="g", generation_id=1, member_id=follower["member_id"], group_instance_id=follower_instance, assignments=[]),
            coordinator.sync_group(group_id="g", generation_id=1, member_id=leader["member_id"], group_instance_id=leader_instance, assignments=assignments),
        )
        # The follower's process dies and a new one starts: an empty member id, the same instance id.
        again = await asyncio.wait_for(join_group(coordinator, instance=follower_instance), 5)
        assert again["error_code"] == ErrorCode.NONE and again["generation_id"] == 1
        assert again["leader"] == leader["member_id"] and again["members"] == []
        assert coordinator.groups["g"].state == GroupState.STABLE
        # It took the old process's place under a member id of its own, written first:
        # the old one (a zombie, if it were alive) is fenced, with Kafka's answer.
        assert again["member_id"] != follower["member_id"]
        written = {m["member_id"] for m in decode_group_value(coordinator.offsets_log.batches[-1][1][0][1])["members"]}
        assert again["member_id"] in written and follower["member_id"] not in written
        offsets = {("t", 0): OffsetAndMetadata(1)}
        assert await coordinator.heartbeat(group_id="g", generation_id=1, member_id=follower["member_id"], group_instance_id=follower_instance) == ErrorCode.FENCED_INSTANCE_ID
        assert await coordinator.txn_commit_offsets(group_id="g", producer_id=7, producer_epoch=0, generation_id=1, member_id=follower["member_id"],
                                                    group_instance_id=follower_instance, offsets=offsets) == ErrorCode.FENCED_INSTANCE_ID
        synced = await coordinator.sync_group(group_id="g", generation_id=1, member_id=again["member_id"], group_instance_id=follower_instance, assignments=[])
        assert synced["error_code"] == ErrorCode.NONE and synced["assignment"] == b"F"
        assert await coordinator.heartbeat(group_id="g", generation_id=1, member_id=leader["member_id"], group_instance_id=leader_instance) == ErrorCode.NONE
        # Different protocols would change the group's choice: that rebalances.
        changed = asyncio.ensure_future(join_group(coordinator, member_id=again["member_id"], instance=follower_instance, protocols=(("roundrobin", b"meta"), ("range", b"meta"))))
        for _ in range(100):
            await asyncio.sleep(0)
        assert coordinator.groups["g"].state == GroupState.PREPARING_REBALANCE
        changed.cancel()
        await coordinator.stop()

    async def leader_restarts():
        coordinator, _ = make_group_coordinator()
        a, b = await joined_together(coordinator, join_group(coordinator, instance="w-1"), join_group(coordinator, instance="w-2"))
        leader = a if a["members"] else b
        leader_instance = "w-1" if leader is a else "w-2"
        follower = b if leader is a else a
        await asyncio.gather(
            coordinator.sync_group(group_id="g", generation_id=1, member_id=follower["member_id"], group_instance_id=None, assignments=[]),
            coordinator.sync_group(group_id="g", generation_id=1, member_id=leader["member_id"], group_instance_id=None, assignments=[(leader["member_id"], b"L"), (follower["member_id"], b"F")]),
        )
        # A client with JoinGroup v9 is told to skip the assignment (KIP-814): no rebalance.
        skipping = await asyncio.wait_for(join_group(coordinator, instance=leader_instance, skip_assignment_supported=True), 5)
        assert skipping["skip_assignment"] is True and skipping["generation_id"] == 1
        assert {m["member_id"] for m in skipping["members"]} == {skipping["member_id"], follower["member_id"]}
        assert coordinator.groups["g"].state == GroupState.STABLE
        synced = await coordinator.sync_group(group_id="g", generation_id=1, member_id=skipping["member_id"], group_instance_id=None, assignments=[])
        assert synced["assignment"] == b"L" and skipping["leader"] == skipping["member_id"]
        # An older client cannot be: the leader's restart rebalances.
        rejoin = asyncio.ensure_future(join_group(coordinator, instance=leader_instance))
        for _ in range(100):
            await asyncio.sleep(0)
        assert coordinator.groups["g"].state == GroupState.PREPARING_REBALANCE, "the leader's restart rebalances"
        rejoin.cancel()
        await coordinator.stop()

    asyncio.run(scenario())
    asyncio.run(leader_restarts())


def test_offsets_of_empty_groups_expire_after_retention():
    async def scenario():
        coordinator, clock = make_group_coordinator(offsets_retention_ms=1000)
        now = clock.wall_ms()
        await coordinator.commit_offsets(group_id="idle", generation_id=-1, member_id="", group_instance_id=None, offsets={("t", 0): OffsetAndMetadata(5, commit_timestamp=now - 5000)})
        await coordinator.commit_offsets(group_id="idle", generation_id=-1, member_id="", group_instance_id=None, offsets={("t", 1): OffsetAndMetadata(6, commit_timestamp=now)})
        assert await coordinator.expire_offsets() == 1
        assert set(coordinator.groups["idle"].offsets) == {("t", 1)}
        assert coordinator.offsets_log.batches[-1][1] == [(offset_key("idle", "t", 0), None)], "a tombstone is written"

    asyncio.run(scenario())


class FailingOffsetsLog(MemoryOffsetsLog):
    """An offsets log whose appends fail while ``failing`` is set (a full or
    broken disk under ``__consumer_offsets``)."""

    def __init__(self):
        super().__init__()
        self.failing = False

    async def append(self, group_id, records, *, producer_id=-1, producer_epoch=-1):
        if self.failing:
            raise OSError("No space left on device")
        await super().append(group_id, records, producer_id=producer_id, producer_epoch=producer_epoch)


def make_failing(**settings):
    coordinator, clock = make_group_coordinator(**settings)
    coordinator.offsets_log = FailingOffsetsLog()
    return coordinator, clock


async def stable_group(coordinator, members=2):
    """``members`` members joined and synced (generation 1); returns their ids, leader first."""
    if members == 1:
        first = await join_group(coordinator)
        joined = await joined_together(coordinator, join_group(coordinator, first["member_id"]))
    else:
        joined = list(await join_two(coordinator))
    joined.sort(key=lambda j: j["member_id"] != j["leader"])
    ids = [j["member_id"] for j in joined]
    assignments = [(member_id, member_id.encode()) for member_id in ids]
    await asyncio.gather(*(
        coordinator.sync_group(group_id="g", generation_id=1, member_id=member_id, group_instance_id=None, assignments=assignments if member_id == ids[0] else [])
        for member_id in ids
    ))
    assert coordinator.groups["g"].state == GroupState.STABLE
    return ids


def test_a_failed_assignment_write_leaves_the_group_as_it_was():
    async def scenario():
        coordinator, _ = make_failing()
        a, b = await join_two(coordinator)
        leader, follower = (a, b) if a["members"] else (b, a)
        group = coordinator.groups["g"]
        before = group.snapshot()
        assert before.state == GroupState.COMPLETING_REBALANCE and before.generation == 1
        coordinator.offsets_log.failing = True
        assignments = [(leader["member_id"], b"L"), (follower["member_id"], b"F")]
        answers = await asyncio.gather(
            coordinator.sync_group(group_id="g", generation_id=1, member_id=follower["member_id"], group_instance_id=None, assignments=[]),
            coordinator.sync_group(group_id="g", generation_id=1, member_id=leader["member_id"], group_instance_id=None, assignments=assignments),
        )
        assert [answer["error_code"] for answer in answers] == [ErrorCode.COORDINATOR_NOT_AVAILABLE] * 2
        assert group.snapshot() == before, "no assignment, state or generation of an unwritten record is applied"
        assert [m.assignment for m in group.members.values()] == [b"", b""]
        assert coordinator.offsets_log.batches == []

        coordinator.offsets_log.failing = False  # the leader retries and the write goes through
        answer = await coordinator.sync_group(group_id="g", generation_id=1, member_id=leader["member_id"], group_instance_id=None, assignments=assignments)
        assert answer["error_code"] == ErrorCode.NONE and answer["assignment"] == b"L"
        assert group.state == GroupState.STABLE
        written = coordinator.offsets_log.batches[-1][1][0]
        assert written == group.snapshot().to_record(), "what is in memory is what was written"
        follower_answer = await coordinator.sync_group(group_id="g", generation_id=1, member_id=follower["member_id"], group_instance_id=None, assignments=[])
        assert follower_answer["assignment"] == b"F"
        await coordinator.stop()

    asyncio.run(scenario())


def test_a_failed_write_keeps_the_last_member_until_its_group_can_be_emptied():
    async def scenario():
        coordinator, _ = make_failing()
        [only] = await stable_group(coordinator, members=1)
        group = coordinator.groups["g"]
        before = group.snapshot()
        coordinator.offsets_log.failing = True
        error, results = await coordinator.leave_group(group_id="g", members=[(only, None)])
        assert results[0]["error_code"] == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert group.snapshot() == before, "the member stays and the group stays Stable, generation 1"

        coordinator.offsets_log.failing = False
        error, results = await coordinator.leave_group(group_id="g", members=[(only, None)])
        assert results[0]["error_code"] == ErrorCode.NONE
        assert (group.state, group.generation, group.members) == (GroupState.EMPTY, 2, {})
        assert coordinator.offsets_log.batches[-1][1][0] == group.snapshot().to_record()

    asyncio.run(scenario())


def test_a_failed_write_when_nobody_rejoins_leaves_the_rebalance_waiting():
    async def scenario():
        coordinator, clock = make_failing()
        a, b = await stable_group(coordinator)
        group = coordinator.groups["g"]
        written = len(coordinator.offsets_log.batches)
        coordinator.offsets_log.failing = True
        clock.advance(1.5)  # both sessions (1 s) are over
        await coordinator.check_timeouts()
        # The first removal needs no write (a rebalance starts in memory); the
        # second would empty the group, and so would completing the join_group
        # nobody came to: both are writes, both failed, nothing moved.
        assert group.state == GroupState.PREPARING_REBALANCE and group.generation == 1
        assert len(group.members) == 1
        stuck = group.snapshot()
        clock.advance(5)  # past the rebalance deadline as well
        await coordinator.check_timeouts()
        assert group.snapshot() == stuck
        assert len(coordinator.offsets_log.batches) == written

        coordinator.offsets_log.failing = False
        await coordinator.check_timeouts()
        assert (group.state, group.generation, group.members, group.leader) == (GroupState.EMPTY, 2, {}, None)
        assert coordinator.offsets_log.batches[-1][1][0] == group.snapshot().to_record()

    asyncio.run(scenario())


def test_cancelled_commit_and_leave_requests_are_applied_all_the_same():
    """A request cancelled while its __consumer_offsets write is out (its
    connection died) loses only its answer: the offsets are cached, the
    last member's leave empties the group, as the log says."""

    async def scenario():
        coordinator, _clock = make_group_coordinator(initial_rebalance_delay_ms=0)
        gate = asyncio.Event()
        appended = coordinator.offsets_log.append

        async def slow_append(group_id, records, **kwargs):
            await gate.wait()
            await appended(group_id, records, **kwargs)

        coordinator.offsets_log.append = slow_append
        offsets = {("t", 0): OffsetAndMetadata(7, -1, "", 0)}
        commit = asyncio.create_task(coordinator.commit_offsets(group_id="simple", generation_id=-1, member_id="", group_instance_id=None, offsets=offsets))
        await asyncio.sleep(0.01)
        commit.cancel()
        gate.set()
        await coordinator.wait_idle()
        assert coordinator.fetch_offsets("simple", [("t", 0)], False) == {("t", 0): (offsets[("t", 0)], ErrorCode.NONE)}

        gate.clear()
        first = await join_group(coordinator)
        joined = await join_group(coordinator, first["member_id"])
        member = joined["member_id"]
        coordinator.offsets_log.append = appended
        sync = await coordinator.sync_group(group_id="g", generation_id=joined["generation_id"], member_id=member, group_instance_id=None, assignments=[(member, b"a")])
        assert sync["error_code"] == ErrorCode.NONE
        coordinator.offsets_log.append = slow_append
        leave = asyncio.create_task(coordinator.leave_group(group_id="g", members=[(member, None)]))
        await asyncio.sleep(0.01)
        leave.cancel()
        gate.set()
        await coordinator.wait_idle()
        group = coordinator.groups["g"]
        assert group.state == GroupState.EMPTY and not group.members
        await coordinator.stop()

    asyncio.run(scenario())


def test_the_coordinator_reads_what_clients_embed_in_the_consumer_protocol():
    """Subscriptions and assignments as our clients encode them (every version),
    and nothing (not an exception) for other protocol types or bytes that do not decode."""
    from txn.assignors import Assignment, Subscription, encode_assignment, encode_subscription

    for version in range(4):
        subscription = encode_subscription(Subscription(topics=("a", "b"), owned_partitions=[("a", 0)]), version)
        assert subscribed_topics("consumer", subscription) == {"a", "b"}
        assignment = encode_assignment(Assignment(partitions=[("a", 1), ("b", 0), ("b", 2)]), version)
        assert assigned_partitions("consumer", assignment) == {("a", 1), ("b", 0), ("b", 2)}
    assert subscribed_topics("connect", encode_subscription(Subscription(topics=("a",)))) == set()
    assert assigned_partitions("connect", encode_assignment(Assignment(partitions=[("a", 1)]))) is None
    for garbage in (b"", b"\x00", b"\xff\xff", b"\x00\x00\x00\x00\x00\x09ab"):
        assert subscribed_topics("consumer", garbage) == set()
        assert assigned_partitions("consumer", garbage) is None
