"""Client-side partition assignment for classic consumer groups: the
"consumer" protocol's embedded bytes and the assignors, without I/O.

The group leader receives every member's ``Subscription`` (topics, the
partitions it owns, its generation) inside JoinGroup and answers each with an
``Assignment`` inside SyncGroup. Both travel as Kafka's
ConsumerProtocolSubscription / ConsumerProtocolAssignment (versions 0-3,
classic encoding: int16 version first; readers of an older version read the
fields they know and ignore the rest).

Assignors (``assign(partition_counts, subscriptions) -> {member: Assignment}``):

- ``range``: per topic, the subscribed members sorted by member id split the
  partitions in contiguous ranges, the first ``count % members`` one larger
  (Kafka's RangeAssignor). Eager only.
- ``cooperative-sticky``: balanced (no partition can move to an eligible
  member holding two fewer), sticky (members keep what they validly own as
  far as balance allows; of two claims on a partition the newer generation
  wins), and cooperative (KIP-429): a partition that changes owner is left
  out of this round, so its old owner revokes it, rejoins, and the next round
  hands it over.
"""

from __future__ import annotations

import struct
from collections import defaultdict

import attrs

EAGER, COOPERATIVE = "EAGER", "COOPERATIVE"
SUBSCRIPTION_VERSION = 3
ASSIGNMENT_VERSION = 3


class MalformedConsumerProtocolError(ValueError):
    """The embedded consumer-protocol bytes are not a valid message."""


@attrs.frozen
class Subscription:
    topics: tuple = attrs.field(converter=tuple)
    user_data: bytes | None = None
    owned_partitions: tuple = attrs.field(default=(), converter=lambda v: tuple((t, int(p)) for t, p in v))
    generation_id: int = -1
    rack_id: str | None = None


@attrs.frozen
class Assignment:
    partitions: tuple = attrs.field(converter=lambda v: tuple((t, int(p)) for t, p in v))
    user_data: bytes | None = None


# -- codec ----------------------------------------------------------------------------------


class _Writer:
    def __init__(self):
        self.parts: list[bytes] = []

    def int16(self, value: int) -> None:
        self.parts.append(struct.pack(">h", value))

    def int32(self, value: int) -> None:
        self.parts.append(struct.pack(">i", value))

    def string(self, value: str | None) -> None:
        if value is None:
            self.int16(-1)
            return
        data = value.encode()
        self.int16(len(data))
        self.parts.append(data)

    def bytes_(self, value: bytes | None) -> None:
        if value is None:
            self.int32(-1)
            return
        self.int32(len(value))
        self.parts.append(bytes(value))

    def topic_partitions(self, pairs) -> None:
        by_topic: dict[str, list[int]] = defaultdict(list)
        for topic, partition in pairs:
            by_topic[topic].append(partition)
        self.int32(len(by_topic))
        for topic in sorted(by_topic):
            self.string(topic)
            self.int32(len(by_topic[topic]))
            for partition in sorted(by_topic[topic]):
                self.int32(partition)

    def value(self) -> bytes:
        return b"".join(self.parts)


class _Reader:
    def __init__(self, data: bytes, what: str):
        self.data = memoryview(bytes(data))
        self.position = 0
        self.what = what

    def _take(self, size: int) -> memoryview:
        if size < 0 or self.position + size > len(self.data):
            raise MalformedConsumerProtocolError(f"{self.what}: needs {size} bytes at {self.position}, has {len(self.data) - self.position}")
        chunk = self.data[self.position : self.position + size]
        self.position += size
        return chunk

    def at_end(self) -> bool:
        return self.position >= len(self.data)

    def int16(self) -> int:
        return struct.unpack(">h", self._take(2))[0]

    def int32(self) -> int:
        return struct.unpack(">i", self._take(4))[0]

    def string(self, nullable: bool = False) -> str | None:
        size = self.int16()
        if size == -1 and nullable:
            return None
        if size < 0:
            raise MalformedConsumerProtocolError(f"{self.what}: negative string length {size}")
        try:
            return bytes(self._take(size)).decode()
        except UnicodeDecodeError as error:
            raise MalformedConsumerProtocolError(f"{self.what}: string is not UTF-8") from error

    def bytes_(self) -> bytes | None:
        size = self.int32()
        if size == -1:
            return None
        return bytes(self._take(size))

    def count(self) -> int:
        size = self.int32()
        if size < 0 or size > len(self.data):
            raise MalformedConsumerProtocolError(f"{self.what}: bad array length {size}")
        return size

    def topic_partitions(self) -> list[tuple[str, int]]:
        out = []
        for _ in range(self.count()):
            topic = self.string()
            out += [(topic, self.int32()) for _ in range(self.count())]
        return out


def encode_subscription(subscription: Subscription, version: int = SUBSCRIPTION_VERSION) -> bytes:
    writer = _Writer()
    writer.int16(version)
    writer.int32(len(subscription.topics))
    for topic in subscription.topics:
        writer.string(topic)
    writer.bytes_(subscription.user_data)
    if version >= 1:
        writer.topic_partitions(subscription.owned_partitions)
    if version >= 2:
        writer.int32(subscription.generation_id)
    if version >= 3:
        writer.string(subscription.rack_id)
    return writer.value()


def decode_subscription(data: bytes) -> Subscription:
    reader = _Reader(data, "consumer subscription")
    version = reader.int16()
    if version < 0:
        raise MalformedConsumerProtocolError(f"consumer subscription: negative version {version}")
    topics = [reader.string() for _ in range(reader.count())]
    user_data = reader.bytes_()
    owned, generation, rack = [], -1, None
    if version >= 1 and not reader.at_end():
        owned = reader.topic_partitions()
    if version >= 2 and not reader.at_end():
        generation = reader.int32()
    if version >= 3 and not reader.at_end():
        rack = reader.string(nullable=True)
    return Subscription(topics, user_data, owned, generation, rack)


def encode_assignment(assignment: Assignment, version: int = ASSIGNMENT_VERSION) -> bytes:
    writer = _Writer()
    writer.int16(version)
    writer.topic_partitions(assignment.partitions)
    writer.bytes_(assignment.user_data)
    return writer.value()


def decode_assignment(data: bytes) -> Assignment:
    reader = _Reader(data, "consumer assignment")
    version = reader.int16()
    if version < 0:
        raise MalformedConsumerProtocolError(f"consumer assignment: negative version {version}")
    partitions = reader.topic_partitions()
    user_data = reader.bytes_() if not reader.at_end() else None
    return Assignment(partitions, user_data)


# -- assignors -------------------------------------------------------------------------------


class RangeAssignor:
    name = "range"
    rebalance_protocols = (EAGER,)

    def assign(self, partition_counts: dict[str, int], subscriptions: dict[str, Subscription]) -> dict[str, Assignment]:
        assigned: dict[str, list] = {member: [] for member in subscriptions}
        members_by_topic: dict[str, list[str]] = defaultdict(list)
        for member, subscription in subscriptions.items():
            for topic in set(subscription.topics):
                if topic in partition_counts:
                    members_by_topic[topic].append(member)
        for topic, members in members_by_topic.items():
            members.sort()
            count = partition_counts[topic]
            per_member, extra = divmod(count, len(members))
            start = 0
            for index, member in enumerate(members):
                size = per_member + (1 if index < extra else 0)
                assigned[member] += [(topic, p) for p in range(start, start + size)]
                start += size
        return {member: Assignment(partitions) for member, partitions in assigned.items()}


class CooperativeStickyAssignor:
    name = "cooperative-sticky"
    rebalance_protocols = (COOPERATIVE, EAGER)

    def assign(self, partition_counts: dict[str, int], subscriptions: dict[str, Subscription]) -> dict[str, Assignment]:
        eligible: dict[tuple[str, int], list[str]] = {}
        for member in sorted(subscriptions):
            for topic in sorted(set(subscriptions[member].topics)):
                for partition in range(partition_counts.get(topic, 0)):
                    eligible.setdefault((topic, partition), []).append(member)
        owners = self._valid_owners(subscriptions, eligible)
        target = self._balanced(subscriptions, eligible, owners)
        # Cooperative: a partition moving between members is held back one round.
        result: dict[str, list] = {member: [] for member in subscriptions}
        for member, partitions in target.items():
            for tp in partitions:
                previous = owners.get(tp)
                if previous is None or previous == member:
                    result[member].append(tp)
        return {member: Assignment(sorted(partitions)) for member, partitions in result.items()}

    @staticmethod
    def _valid_owners(subscriptions, eligible) -> dict[tuple[str, int], str]:
        """Who owns each partition now: claims the member may still hold, the
        newest generation first (a stale claim from an older one loses)."""
        claims = []
        for member, subscription in subscriptions.items():
            for tp in subscription.owned_partitions:
                if member in eligible.get(tp, ()):
                    claims.append((-subscription.generation_id, member, tp))
        owners: dict[tuple[str, int], str] = {}
        for _generation, member, tp in sorted(claims):
            owners.setdefault(tp, member)
        return owners

    @staticmethod
    def _balanced(subscriptions, eligible, owners) -> dict[str, set]:
        assignment: dict[str, set] = {member: set() for member in subscriptions}
        for tp, member in owners.items():
            assignment[member].add(tp)
        # Members with equal subscriptions and more than their fair share give back the excess.
        for tp in sorted(eligible):
            if tp not in owners:
                target = min(eligible[tp], key=lambda m: (len(assignment[m]), m))
                assignment[target].add(tp)
        changed = True
        while changed:
            changed = False
            for giver in sorted(assignment, key=lambda m: (-len(assignment[m]), m)):
                for tp in sorted(assignment[giver], key=lambda tp: (tp not in owners or owners[tp] != giver, tp), reverse=True):
                    receivers = [m for m in eligible[tp] if len(assignment[m]) + 1 < len(assignment[giver])]
                    if receivers:
                        receiver = min(receivers, key=lambda m: (len(assignment[m]), m))
                        assignment[giver].discard(tp)
                        assignment[receiver].add(tp)
                        changed = True
                        break
                if changed:
                    break
        return assignment


ASSIGNORS = {assignor.name: assignor for assignor in (RangeAssignor(), CooperativeStickyAssignor())}


class UnknownAssignorError(ValueError):
    pass


def assignor_for(name: str):
    try:
        return ASSIGNORS[name]
    except KeyError:
        raise UnknownAssignorError(f"unknown partition assignment strategy {name!r}; known: {', '.join(ASSIGNORS)}") from None
