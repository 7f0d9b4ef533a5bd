"""Client-side partition assignment for classic consumer groups, without I/O:
the "consumer" protocol type's embedded bytes and the assignors that the
group leader runs.

The group leader receives every member's ``Subscription`` (topics, the
partitions it owns, its generation) inside JoinGroup and answers each member
with an ``Assignment`` inside SyncGroup. Both travel as Kafka's
ConsumerProtocolSubscription / ConsumerProtocolAssignment: an int16 version,
then the fields of that version in the classic (non-flexible) encoding. A
reader decodes a newer version by reading the fields it knows and ignoring
whatever follows, as Kafka's readers do.

Assignors share one interface, ``assign(partition_counts, subscriptions) ->
{member_id: Assignment}``; topics missing from ``partition_counts`` are
skipped and every member gets an entry, possibly empty.

- ``range`` (Kafka's RangeAssignor): per topic, the subscribed members in
  order (static members by group.instance.id first, then the rest by member
  id) take contiguous ranges, the first ``count % members`` one partition
  larger. EAGER only.
- ``cooperative-sticky`` (Kafka's CooperativeStickyAssignor, KIP-429):
  balanced as far as the subscriptions allow, sticky (members keep the
  partitions they validly own unless balance needs them elsewhere; of
  conflicting claims the newest generation wins), and cooperative: a
  partition moving to a new owner is left out of this round, so its old owner
  revokes it and rejoins, and the next round hands it over.
"""

from __future__ import annotations

import collections
import enum
import struct
from collections.abc import Iterable, Mapping
from typing import Protocol

import attrs

from protocol.errors import MalformedFrameError
from protocol.schema import BYTES, INT32, STRING, ArrayOf, Field, Message, Struct, decode, encode
from txn.types import TopicPartition

TopicPartitionPair = tuple[str, int]

SUBSCRIPTION_VERSION = 3
ASSIGNMENT_VERSION = 3
NO_GENERATION = -1


class RebalanceProtocol(enum.Enum):
    """How members hand partitions over (Kafka's ids)."""

    EAGER = 0  # revoke everything before rejoining
    COOPERATIVE = 1  # keep what you own, revoke only what moves (KIP-429)


class MalformedConsumerProtocolError(MalformedFrameError):
    """The embedded consumer-protocol bytes are not a valid message (the
    sender's fault)."""


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
# codec: our own tables for Kafka's ConsumerProtocolSubscription and
# ConsumerProtocolAssignment, run by the schema-driven codec of protocol/.


def _topic_partitions(versions) -> ArrayOf:
    return ArrayOf(Struct("TopicPartition", (
        Field("topic", STRING, versions),
        Field("partitions", ArrayOf(INT32), versions),
    )))


CONSUMER_PROTOCOL_SUBSCRIPTION = Message("ConsumerProtocolSubscription", valid=(0, 3), flexible=None, body=Struct("ConsumerProtocolSubscription", (
    Field("topics", ArrayOf(STRING), (0, None)),
    Field("user_data", BYTES, (0, None), nullable=(0, None), default=None),
    Field("owned_partitions", _topic_partitions((1, None)), (1, None), ignorable=True),
    Field("generation_id", INT32, (2, None), default=NO_GENERATION, ignorable=True),
    Field("rack_id", STRING, (3, None), nullable=(3, None), default=None, ignorable=True),
)))

CONSUMER_PROTOCOL_ASSIGNMENT = Message("ConsumerProtocolAssignment", valid=(0, 3), flexible=None, body=Struct("ConsumerProtocolAssignment", (
    Field("assigned_partitions", _topic_partitions((0, None)), (0, None)),
    Field("user_data", BYTES, (0, None), nullable=(0, None), default=None),
)))

_VERSION = struct.Struct(">h")


def _grouped_by_topic(pairs: Iterable[TopicPartitionPair]) -> list[dict]:
    by_topic: dict[str, list[int]] = collections.defaultdict(list)
    for topic, partition in sorted(pairs):
        by_topic[topic].append(partition)
    return [{"topic": topic, "partitions": partitions} for topic, partitions in by_topic.items()]


def _flattened(groups: list[dict]) -> list[TopicPartitionPair]:
    return [(group["topic"], partition) for group in groups for partition in group["partitions"]]


def _encode(message: Message, version: int, body: dict) -> bytes:
    if not message.supports(version):
        low, high = message.valid
        raise ValueError(f"{message.name} has versions {low}-{high}, not {version}")
    return _VERSION.pack(version) + encode(message, version, body)


def _decode(message: Message, data) -> tuple[int, dict]:
    """The version the sender wrote and the fields we know of it: a newer
    version is read as our newest, ignoring the bytes after what we know."""
    view = memoryview(data)
    if len(view) < _VERSION.size:
        raise MalformedConsumerProtocolError(f"{message.name}: {len(view)} bytes cannot hold the int16 version")
    (version,) = _VERSION.unpack_from(view)
    if version < 0:
        raise MalformedConsumerProtocolError(f"{message.name}: negative version {version}")
    readable = min(version, message.valid[1])
    try:
        body, _end = decode(message, readable, view, _VERSION.size, exact=False)
    except MalformedFrameError as error:
        sent_as = f" (sent as version {version})" if version != readable else ""
        raise MalformedConsumerProtocolError(f"{error}{sent_as}") from None
    return version, body


def encode_subscription(subscription: Subscription, version: int = SUBSCRIPTION_VERSION) -> bytes:
    """The JoinGroup protocol metadata for ``subscription``; fields the
    version lacks are left out, as Kafka leaves out ignorable fields."""
    return _encode(CONSUMER_PROTOCOL_SUBSCRIPTION, version, {
        "topics": list(subscription.topics),
        "user_data": subscription.user_data,
        "owned_partitions": _grouped_by_topic(subscription.owned_partitions),
        "generation_id": subscription.generation_id,
        "rack_id": subscription.rack_id,
    })


def decode_subscription(data: bytes) -> Subscription:
    """Raises ``MalformedConsumerProtocolError`` for bytes that do not decode."""
    _version, body = _decode(CONSUMER_PROTOCOL_SUBSCRIPTION, data)
    return Subscription(
        topics=body["topics"],
        user_data=body["user_data"],
        owned_partitions=_flattened(body.get("owned_partitions", [])),
        generation_id=body.get("generation_id", NO_GENERATION),
        rack_id=body.get("rack_id"),
    )


def encode_assignment(assignment: Assignment, version: int = ASSIGNMENT_VERSION) -> bytes:
    """The SyncGroup member assignment bytes for ``assignment``."""
    return _encode(CONSUMER_PROTOCOL_ASSIGNMENT, version, {
        "assigned_partitions": _grouped_by_topic(assignment.partitions),
        "user_data": assignment.user_data,
    })


def decode_assignment(data: bytes) -> Assignment:
    """Raises ``MalformedConsumerProtocolError`` for bytes that do not decode."""
    _version, body = _decode(CONSUMER_PROTOCOL_ASSIGNMENT, data)
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
        """Shift partitions along improving paths until there are none: then
        no member could take a partition, directly or through a chain of
        handovers, from a member holding two or more partitions more, which
        makes the loads as even as the subscriptions allow."""
        while (moves := self._cheapest_improving_path()) is not None:
            for tp, _giver, taker in moves:
                self.give(tp, taker)

    def _cheapest_improving_path(self) -> list[tuple[TopicPartitionPair, str, str]] | None:
        """The improving path that takes the fewest partitions from their
        previous owners, or None when the plan is balanced.

        An improving path runs from a member holding ``n`` partitions to one
        holding at most ``n - 2``; each step hands one partition to the next
        member, which may take it. Only the ends change their counts."""
        loads = {member: len(self.holdings[member]) for member, takeable in self.takeable.items() if takeable}
        if not loads:
            return None
        levels = sorted(set(loads.values()))
        best = None
        for level in levels:
            if level + 2 > levels[-1]:
                break
            found = self._path_down_to(level, loads)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
                if best[0] == 0:
                    break
        return None if best is None else best[1]

    def _path_down_to(self, level: int, loads: dict[str, int]):
        """(owned partitions moved, moves) of the cheapest improving path
        ending at a member holding at most ``level`` partitions: a 0-1
        breadth-first search backwards from those members, where handing over
        a partition costs 1 if the giver owned it and 0 if not."""
        cost: dict[str, int] = {}
        next_move: dict[str, tuple[TopicPartitionPair, str]] = {}  # giver -> (partition, taker) one step nearer the end
        queue: collections.deque[tuple[int, str]] = collections.deque()
        for member in sorted(loads):
            if loads[member] <= level:
                cost[member] = 0
                queue.append((0, member))
        while queue:
            taker_cost, taker = queue.popleft()
            if taker_cost != cost[taker]:
                continue  # a cheaper entry for this member came first
            for tp in self.takeable[taker]:
                giver = self.holder.get(tp)
                if giver is None or giver == taker:
                    continue
                step = 1 if self.owner.get(tp) == giver else 0
                if taker_cost + step < cost.get(giver, taker_cost + step + 1):
                    cost[giver] = taker_cost + step
                    next_move[giver] = (tp, taker)
                    if step:
                        queue.append((taker_cost + step, giver))
                    else:
                        queue.appendleft((taker_cost, giver))
        sources = [member for member in cost if loads[member] >= level + 2]
        if not sources:
            return None
        source = min(sources, key=lambda member: (cost[member], -loads[member], member))
        moves = []
        giver = source
        while giver in next_move:
            tp, taker = next_move[giver]
            moves.append((tp, giver, taker))
            giver = taker
        return cost[source], moves


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
    """Balanced, sticky, and cooperative (see the module docstring)."""

    name = "cooperative-sticky"
    rebalance_protocols = (RebalanceProtocol.COOPERATIVE, RebalanceProtocol.EAGER)

    def assign(self, partition_counts: Mapping[str, int], subscriptions: Mapping[str, Subscription]) -> dict[str, Assignment]:
        plan = _StickyPlan.start(partition_counts, subscriptions)
        plan.place_unowned()
        plan.balance()
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


ASSIGNORS: dict[str, PartitionAssignor] = {assignor.name: assignor for assignor in (RangeAssignor(), CooperativeStickyAssignor())}


def assignor_for(name: str) -> PartitionAssignor:
    try:
        return ASSIGNORS[name]
    except KeyError:
        raise UnknownAssignorError(f"unknown partition assignment strategy {name!r}; known: {', '.join(sorted(ASSIGNORS))}") from None
