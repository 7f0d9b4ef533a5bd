"""Client-side partition assignment for classic consumer groups, without I/O:
the "consumer" protocol type's embedded bytes and the assignors that the
group leader runs.

The group leader receives every member's ``Subscription`` (topics, the
partitions it owns, its generation) inside JoinGroup and answers each member
with an ``Assignment`` inside SyncGroup. Both travel as Kafka's
ConsumerProtocolSubscription / ConsumerProtocolAssignment, whose tables and
version handling live in ``protocol.consumer_protocol`` (the group
coordinator reads them too); this module turns them into typed values.

Assignors share one interface, ``assign(partition_counts, subscriptions) ->
{member_id: Assignment}``; topics missing from ``partition_counts`` are
skipped and every member gets an entry, possibly empty.

- ``range`` (Kafka's RangeAssignor): per topic, the subscribed members in
  order (static members by group.instance.id first, then the rest by member
  id) take contiguous ranges, the first ``count % members`` one partition
  larger. EAGER only.
- ``cooperative-sticky`` (Kafka's CooperativeStickyAssignor, KIP-429):
  balanced (counts as even as the subscriptions allow: equal subscriptions
  differ by at most one), sticky (of all assignments that balanced, one that
  keeps the most partitions with their valid previous owners: of conflicting
  claims the newest generation wins, two claims in the same generation
  cancel), and cooperative: a partition moving to a member that does not own
  it is left out while another member still owns it, so its owner revokes it
  and rejoins, and the next round hands it over. Members of an EAGER group
  own nothing when they join, so nothing is held back there.

  How: unowned partitions go to the least loaded members; partitions then
  move along improving paths (a chain of handovers from a member to one
  holding two fewer) until there are none, which makes the counts optimal;
  last, cycles of handovers that return more partitions to their owners
  than they take are applied until none is left (negative cycles, found
  with Bellman-Ford). Unlike Kafka's heuristic, both optima are exact.
- ``copartitioned-sticky`` (ours; the streaming runner's): cooperative-sticky
  over partition numbers rather than partitions, so partition N of every
  subscribed topic stays on one member (co-partitioned inputs meet in one
  store shard, as Kafka Streams' tasks do). Partition number N is one unit
  ("task"): a member owns it if it owns any partition N; the units are
  assigned by the cooperative-sticky rules (balanced, sticky, held back
  while another member still owns them), then each member gets partition N
  of every topic it subscribes to that has one. Meant for members with one
  subscription (every instance of one app): a topic only some members
  subscribe to may leave a partition unassigned.
"""

from __future__ import annotations

import collections
import enum
import heapq
import struct
from collections.abc import Iterable, Mapping
from typing import Protocol

import attrs

from protocol.consumer_protocol import (
    CONSUMER_PROTOCOL_ASSIGNMENT,
    CONSUMER_PROTOCOL_SUBSCRIPTION,
    NO_GENERATION,
    MalformedConsumerProtocolError,
    decode_embedded,
    encode_embedded,
)
from txn.types import TopicPartition

TopicPartitionPair = tuple[str, int]

SUBSCRIPTION_VERSION = 3
ASSIGNMENT_VERSION = 3


class RebalanceProtocol(enum.Enum):
    """How members hand partitions over (Kafka's ids)."""

    EAGER = 0  # revoke everything before rejoining
    COOPERATIVE = 1  # keep what you own, revoke only what moves (KIP-429)


class UnknownAssignorError(ValueError):
    """No assignor is registered under the requested name."""


# ---------------------------------------------------------------------------
# values


def _topic_names(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)):
        raise TypeError(f"topics must be a collection of names, not {type(value).__name__} {value!r}")
    return tuple(value)


def _partition_pair(item) -> TopicPartitionPair:
    if isinstance(item, TopicPartition):
        return item.topic, item.partition
    topic, partition = item
    return topic, int(partition)


def _sorted_partitions(value: Iterable) -> tuple[TopicPartitionPair, ...]:
    # Sorted, so that a value survives encoding (which groups by topic) unchanged.
    return tuple(sorted(_partition_pair(item) for item in value))


@attrs.frozen
class Subscription:
    """What one member tells the group leader when it joins."""

    topics: tuple[str, ...] = attrs.field(converter=_topic_names)
    user_data: bytes | None = None
    owned_partitions: tuple[TopicPartitionPair, ...] = attrs.field(default=(), converter=_sorted_partitions)
    generation_id: int = NO_GENERATION
    rack_id: str | None = None
    # Not part of the embedded bytes: the leader fills it in from JoinGroup's
    # member list, and the range assignor orders static members by it.
    group_instance_id: str | None = None


@attrs.frozen
class Assignment:
    """What the group leader hands one member in SyncGroup."""

    partitions: tuple[TopicPartitionPair, ...] = attrs.field(converter=_sorted_partitions)
    user_data: bytes | None = None


# ---------------------------------------------------------------------------
# codec: the typed values to and from ``protocol.consumer_protocol``'s tables.


def _grouped_by_topic(pairs: Iterable[TopicPartitionPair]) -> list[dict]:
    by_topic: dict[str, list[int]] = collections.defaultdict(list)
    for topic, partition in sorted(pairs):
        by_topic[topic].append(partition)
    return [{"topic": topic, "partitions": partitions} for topic, partitions in by_topic.items()]


def _flattened(groups: list[dict]) -> list[TopicPartitionPair]:
    return [(group["topic"], partition) for group in groups for partition in group["partitions"]]


def encode_subscription(subscription: Subscription, version: int = SUBSCRIPTION_VERSION) -> bytes:
    """The JoinGroup protocol metadata for ``subscription``; fields the
    version lacks are left out, as Kafka leaves out ignorable fields."""
    return encode_embedded(CONSUMER_PROTOCOL_SUBSCRIPTION, version, {
        "topics": list(subscription.topics),
        "user_data": subscription.user_data,
        "owned_partitions": _grouped_by_topic(subscription.owned_partitions),
        "generation_id": subscription.generation_id,
        "rack_id": subscription.rack_id,
    })


def decode_subscription(data: bytes) -> Subscription:
    """Raises ``MalformedConsumerProtocolError`` for bytes that do not decode."""
    _version, body = decode_embedded(CONSUMER_PROTOCOL_SUBSCRIPTION, data)
    return Subscription(
        topics=body["topics"],
        user_data=body["user_data"],
        owned_partitions=_flattened(body.get("owned_partitions", [])),
        generation_id=body.get("generation_id", NO_GENERATION),
        rack_id=body.get("rack_id"),
    )


def encode_assignment(assignment: Assignment, version: int = ASSIGNMENT_VERSION) -> bytes:
    """The SyncGroup member assignment bytes for ``assignment``."""
    return encode_embedded(CONSUMER_PROTOCOL_ASSIGNMENT, version, {
        "assigned_partitions": _grouped_by_topic(assignment.partitions),
        "user_data": assignment.user_data,
    })


def decode_assignment(data: bytes) -> Assignment:
    """Raises ``MalformedConsumerProtocolError`` for bytes that do not decode."""
    _version, body = decode_embedded(CONSUMER_PROTOCOL_ASSIGNMENT, data)
    return Assignment(_flattened(body["assigned_partitions"]), body["user_data"])


# ---------------------------------------------------------------------------
# assignors


class PartitionAssignor(Protocol):
    name: str
    rebalance_protocols: tuple[RebalanceProtocol, ...]

    def assign(self, partition_counts: Mapping[str, int], subscriptions: Mapping[str, Subscription]) -> dict[str, Assignment]: ...


def _java_string_order(text: str) -> bytes:
    # Java compares strings by UTF-16 code unit; big-endian UTF-16 bytes sort the same way.
    return text.encode("utf-16-be", "surrogatepass")


def _range_order(member_id: str, subscription: Subscription) -> tuple:
    """Kafka's member order: static members (by group.instance.id) before
    dynamic ones (by member id)."""
    if subscription.group_instance_id is not None:
        return (0, _java_string_order(subscription.group_instance_id))
    return (1, _java_string_order(member_id))


class RangeAssignor:
    """Per topic, contiguous ranges of partitions to the subscribed members in
    order, the first ``count % members`` members one partition more."""

    name = "range"
    rebalance_protocols = (RebalanceProtocol.EAGER,)

    def assign(self, partition_counts: Mapping[str, int], subscriptions: Mapping[str, Subscription]) -> dict[str, Assignment]:
        assigned: dict[str, list[TopicPartitionPair]] = {member: [] for member in subscriptions}
        members_by_topic: dict[str, list[str]] = collections.defaultdict(list)
        for member, subscription in subscriptions.items():
            for topic in set(subscription.topics):
                if topic in partition_counts:
                    members_by_topic[topic].append(member)
        for topic, members in members_by_topic.items():
            members.sort(key=lambda member: _range_order(member, subscriptions[member]))
            per_member, members_with_extra = divmod(partition_counts[topic], len(members))
            start = 0
            for index, member in enumerate(members):
                size = per_member + (1 if index < members_with_extra else 0)
                assigned[member].extend((topic, partition) for partition in range(start, start + size))
                start += size
        return {member: Assignment(partitions) for member, partitions in assigned.items()}


def member_generation(subscription: Subscription) -> int:
    """The generation a member's owned partitions are from: the subscription
    field (version 2+), else the int32 that cooperative-sticky members of
    version 0/1 put in their user data, else unknown (-1)."""
    if subscription.generation_id >= 0:
        return subscription.generation_id
    user_data = subscription.user_data
    if user_data is not None and len(user_data) == 4:
        return struct.unpack(">i", user_data)[0]
    return NO_GENERATION


@attrs.define
class _StickyPlan:
    """The cooperative-sticky assignor's working state for one ``assign``."""

    candidates: dict[TopicPartitionPair, tuple[str, ...]]  # partition -> members that may take it, sorted
    takeable: dict[str, list[TopicPartitionPair]]  # member -> partitions it may take, sorted
    owner: dict[TopicPartitionPair, str]  # the valid previous owner of a partition, if any
    holder: dict[TopicPartitionPair, str] = attrs.Factory(dict)  # who holds a partition in the plan
    holdings: dict[str, set[TopicPartitionPair]] = attrs.Factory(dict)

    @classmethod
    def start(cls, partition_counts: Mapping[str, int], subscriptions: Mapping[str, Subscription]) -> _StickyPlan:
        candidates: dict[TopicPartitionPair, list[str]] = {}
        takeable: dict[str, list[TopicPartitionPair]] = {}
        for member in sorted(subscriptions):
            topics = sorted(topic for topic in set(subscriptions[member].topics) if topic in partition_counts)
            takeable[member] = [(topic, partition) for topic in topics for partition in range(partition_counts[topic])]
            for tp in takeable[member]:
                candidates.setdefault(tp, []).append(member)
        plan = cls({tp: tuple(members) for tp, members in candidates.items()}, takeable, _valid_owners(subscriptions, candidates))
        plan.holdings = {member: set() for member in subscriptions}
        for tp, member in plan.owner.items():
            plan.give(tp, member)
        return plan

    def give(self, tp: TopicPartitionPair, member: str) -> None:
        previous = self.holder.get(tp)
        if previous is not None:
            self.holdings[previous].discard(tp)
        self.holder[tp] = member
        self.holdings[member].add(tp)

    def place_unowned(self) -> None:
        """Each partition without a valid owner to the least loaded member
        that may take it, the most constrained partitions first."""
        unowned = sorted((tp for tp in self.candidates if tp not in self.owner), key=lambda tp: (len(self.candidates[tp]), tp))
        for tp in unowned:
            self.give(tp, min(self.candidates[tp], key=lambda member: (len(self.holdings[member]), member)))

    def balance(self) -> None:
        """Move partitions until no member could take one, directly or
        through a chain of handovers, from a member holding two or more
        more: then the counts are as even as the subscriptions allow (an
        optimal semi-matching has no such "improving path").

        Partitions their holder did not own move first; only when that is
        not enough do owned ones move. So when a balanced assignment exists
        that keeps every owned partition in place, this finds one, and the
        round after a cooperative handover moves nothing that was kept."""
        for may_move_owned in (False, True):
            self._hand_over_directly(may_move_owned)
            while (moves := self._improving_path(may_move_owned)) is not None:
                for tp, taker in moves:
                    self.give(tp, taker)

    def _movable(self, tp: TopicPartitionPair, may_move_owned: bool) -> bool:
        return may_move_owned or self.owner.get(tp) != self.holder[tp]

    def _preference(self, tp: TopicPartitionPair, taker: str) -> int:
        """Which partitions to hand over first: back to their previous
        owner, then ones nobody owned, then ones the giver owned."""
        previous_owner = self.owner.get(tp)
        if previous_owner == taker:
            return 0
        return 2 if previous_owner == self.holder[tp] else 1

    def _hand_over_directly(self, may_move_owned: bool) -> None:
        """The bulk of balancing, cheaply: the most loaded member hands a
        partition to the least loaded member that may take one from it,
        while that one holds at least two fewer. Lazy heaps track the loads:
        an entry whose load is no longer the member's is skipped."""
        topics_of = {member: {topic for topic, _partition in takeable} for member, takeable in self.takeable.items()}
        lightest: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)  # topic -> its takers by load
        heaviest: list[tuple[int, str]] = []  # (-load, member)

        def note_load(member: str) -> None:
            load = len(self.holdings[member])
            heapq.heappush(heaviest, (-load, member))
            for topic in topics_of[member]:
                heapq.heappush(lightest[topic], (load, member))

        for member in sorted(self.takeable):
            note_load(member)
        while heaviest:
            negative_load, giver = heapq.heappop(heaviest)
            load = len(self.holdings[giver])
            if -negative_load != load:
                continue
            best: tuple[int, str, str] | None = None  # (load, taker, topic)
            for topic in sorted({tp[0] for tp in self.holdings[giver] if self._movable(tp, may_move_owned)}):
                takers = lightest[topic]
                while takers and takers[0][0] != len(self.holdings[takers[0][1]]):
                    heapq.heappop(takers)
                if takers and takers[0][1] != giver and (best is None or takers[0] < best[:2]):
                    best = (*takers[0], topic)
            if best is None or best[0] + 2 > load:
                continue  # nobody it could hand to directly: chains are left to _improving_path
            _taker_load, taker, topic = best
            movable = (tp for tp in self.holdings[giver] if tp[0] == topic and self._movable(tp, may_move_owned))
            tp = min(movable, key=lambda tp: (self._preference(tp, taker), tp))
            self.give(tp, taker)
            note_load(giver)
            note_load(taker)

    def _improving_path(self, may_move_owned: bool) -> list[tuple[TopicPartitionPair, str]] | None:
        """Handovers ``[(partition, taker), ...]`` from a member holding
        ``n`` partitions to one holding at most ``n - 2`` along a chain of
        members, each taking a partition from the one before; or None.

        A breadth-first search backwards from the least loaded members; the
        threshold rises level by level and the search goes on from where it
        was, since what a lower level reaches stays reachable."""
        loads = {member: len(self.holdings[member]) for member, takeable in self.takeable.items() if takeable}
        if not loads:
            return None
        members_at: dict[int, list[str]] = collections.defaultdict(list)
        for member in sorted(loads):
            members_at[loads[member]].append(member)
        heaviest_load = max(loads.values())
        next_move: dict[str, tuple[TopicPartitionPair, str]] = {}  # giver -> (partition, taker) one step nearer the end
        reached: set[str] = set()
        queue: collections.deque[str] = collections.deque()
        heaviest_reached = None
        for level in sorted(members_at):
            if level + 2 > heaviest_load:
                return None
            for member in members_at[level]:
                if member not in reached:
                    reached.add(member)
                    queue.append(member)
            while queue:
                taker = queue.popleft()
                # Partitions the giver did not own first, so that chains move those.
                for giver_owned in (False, True) if may_move_owned else (False,):
                    for tp in self.takeable[taker]:
                        giver = self.holder[tp]
                        if giver in reached or (self.owner.get(tp) == giver) != giver_owned:
                            continue
                        reached.add(giver)
                        next_move[giver] = (tp, taker)
                        queue.append(giver)
                        if heaviest_reached is None or (loads[giver], giver) > (loads[heaviest_reached], heaviest_reached):
                            heaviest_reached = giver
            if heaviest_reached is not None and loads[heaviest_reached] >= level + 2:
                moves, giver = [], heaviest_reached
                while giver in next_move:
                    tp, taker = next_move[giver]
                    moves.append((tp, taker))
                    giver = taker
                return moves
        return None

    def return_to_owners(self) -> None:
        """Give partitions back to their previous owners along cycles of
        handovers that leave the multiset of counts as it is, until none
        returns more partitions than it takes: then no assignment as balanced
        as this one keeps more partitions where they were."""
        while (moves := self._cycle_returning_partitions()) is not None:
            for tp, _giver, taker in moves:
                self.give(tp, taker)

    def _cycle_returning_partitions(self) -> list[tuple[TopicPartitionPair, str, str]] | None:
        """A cycle of handovers that returns more partitions to their owners
        than it takes from them, found as a negative cycle (Bellman-Ford).

        Nodes are the members plus one node per count ``n``. A handover edge
        runs from the giver to the taker and costs +1 if the giver owned the
        partition, -1 if the taker did. Through the node for ``n`` a cycle
        may let a member holding ``n - 1`` end with one more and a member
        holding ``n`` end with one less: a swap of counts, balance unchanged."""
        if all(self.holder[tp] == owner for tp, owner in self.owner.items()):
            return None  # every owned partition is where it was
        loads = {member: len(self.holdings[member]) for member, takeable in self.takeable.items() if takeable}
        cheapest: dict[tuple[str, str], tuple[int, TopicPartitionPair]] = {}
        for taker in sorted(loads):
            for tp in self.takeable[taker]:
                giver = self.holder[tp]
                if giver == taker:
                    continue
                previous_owner = self.owner.get(tp)
                cost = (previous_owner == giver) - (previous_owner == taker)
                if (giver, taker) not in cheapest or cost < cheapest[giver, taker][0]:
                    cheapest[giver, taker] = (cost, tp)
        if not any(cost < 0 for cost, _tp in cheapest.values()):
            return None
        edges: list[tuple[object, object, int, tuple | None]] = [
            (giver, taker, cost, (tp, giver, taker)) for (giver, taker), (cost, tp) in cheapest.items()
        ]
        for member, load in loads.items():
            edges.append((member, ("count", load + 1), 0, None))  # member ends with one more
            edges.append((("count", load), member, 0, None))  # member ends with one less
        nodes = {node for giver, taker, _cost, _move in edges for node in (giver, taker)}
        distance = dict.fromkeys(nodes, 0)
        reached_by: dict[object, tuple[object, tuple | None]] = {}
        relaxed = None
        for _round in range(len(nodes)):
            relaxed = None
            for giver, taker, cost, move in edges:
                if distance[giver] + cost < distance[taker]:
                    distance[taker] = distance[giver] + cost
                    reached_by[taker] = (giver, move)
                    relaxed = taker
            if relaxed is None:
                return None
        # Still relaxing after |nodes| rounds: walking back |nodes| steps lands on a negative cycle.
        node = relaxed
        for _step in range(len(nodes)):
            node = reached_by[node][0]
        moves, current = [], node
        while True:
            current, move = reached_by[current]
            if move is not None:
                moves.append(move)
            if current == node:
                return moves


def _valid_owners(subscriptions: Mapping[str, Subscription], candidates: Mapping[TopicPartitionPair, list[str]]) -> dict[TopicPartitionPair, str]:
    """Who owns each partition for stickiness: the claimant of the newest
    generation, if it may still take the partition. A claim from an older
    generation than another claim on the same partition is stale and
    ignored; two claims in the same newest generation cancel out."""
    newest: dict[TopicPartitionPair, tuple[int, list[str]]] = {}
    for member, subscription in subscriptions.items():
        generation = member_generation(subscription)
        for tp in set(subscription.owned_partitions):
            current = newest.get(tp)
            if current is None or generation > current[0]:
                newest[tp] = (generation, [member])
            elif generation == current[0]:
                current[1].append(member)
    return {
        tp: claimants[0]
        for tp, (_generation, claimants) in newest.items()
        if len(claimants) == 1 and claimants[0] in candidates.get(tp, ())
    }


class CooperativeStickyAssignor:
    """Balanced, sticky, and cooperative (see the module docstring).

    Unlike Kafka, a claim from an older generation that nobody contests
    still counts (Kafka drops every claim of a member behind the newest
    generation when all subscriptions are equal): keeping it is sticky and,
    with the cooperative hold-back, never puts a partition in two hands."""

    name = "cooperative-sticky"
    rebalance_protocols = (RebalanceProtocol.COOPERATIVE, RebalanceProtocol.EAGER)

    def assign(self, partition_counts: Mapping[str, int], subscriptions: Mapping[str, Subscription]) -> dict[str, Assignment]:
        plan = _StickyPlan.start(partition_counts, subscriptions)
        plan.place_unowned()
        plan.balance()
        plan.return_to_owners()
        claimants: dict[TopicPartitionPair, set[str]] = collections.defaultdict(set)
        for member, subscription in subscriptions.items():
            for tp in subscription.owned_partitions:
                claimants[tp].add(member)
        # KIP-429: a partition goes to a member that does not own it only
        # once no other member owns it; until then it stays out, its owner
        # revokes it, rejoins, and the next round hands it over.
        return {
            member: Assignment(tp for tp in plan.holdings[member] if member in claimants[tp] or not claimants[tp])
            for member in subscriptions
        }

    @staticmethod
    def subscription_user_data(generation: int) -> bytes:
        """The user data Kafka's cooperative-sticky members send: their
        generation as an int32, for leaders that read subscriptions older
        than version 2."""
        return struct.pack(">i", generation)


TASKS_TOPIC = ""  # the one "topic" partition numbers are assigned as (no real topic has an empty name)


class CopartitionedStickyAssignor:
    """Cooperative-sticky over partition numbers (see the module docstring)."""

    name = "copartitioned-sticky"
    rebalance_protocols = (RebalanceProtocol.COOPERATIVE, RebalanceProtocol.EAGER)

    def assign(self, partition_counts: Mapping[str, int], subscriptions: Mapping[str, Subscription]) -> dict[str, Assignment]:
        tasks = max((partition_counts[topic] for subscription in subscriptions.values() for topic in subscription.topics if topic in partition_counts), default=0)
        as_tasks = {
            member: attrs.evolve(subscription, topics=(TASKS_TOPIC,) if any(t in partition_counts for t in subscription.topics) else (),
                                 owned_partitions={(TASKS_TOPIC, partition) for _topic, partition in subscription.owned_partitions if partition < tasks})
            for member, subscription in subscriptions.items()
        }
        by_task = CooperativeStickyAssignor().assign({TASKS_TOPIC: tasks}, as_tasks)
        return {
            member: Assignment((topic, task) for _tasks, task in by_task[member].partitions
                               for topic in sorted(set(subscriptions[member].topics)) if task < partition_counts.get(topic, 0))
            for member in subscriptions
        }


ASSIGNORS: dict[str, PartitionAssignor] = {assignor.name: assignor for assignor in (RangeAssignor(), CooperativeStickyAssignor(), CopartitionedStickyAssignor())}


def assignor_for(name: str) -> PartitionAssignor:
    try:
        return ASSIGNORS[name]
    except KeyError:
        raise UnknownAssignorError(f"unknown partition assignment strategy {name!r}; known: {', '.join(sorted(ASSIGNORS))}") from None
