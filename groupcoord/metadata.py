"""What ``__consumer_offsets`` holds about a group, as a frozen value: the
value the group coordinator computes, writes, and only then applies.

``StoredGroup`` is Kafka's GroupMetadataValue (generation, protocol, leader,
every member with its subscription and assignment) plus the group state the
record puts the group in. As with ``coordinator.metadata``, a change is
``attrs.evolve`` of the current value, its state taken from the table in
``groupcoord.state``: the coordinator takes ``group.snapshot()``, computes
the next value (``synced(...)``, ``emptied(...)``), appends
``next.to_record()`` to the group's offsets partition, waits until it is
durable, and only then copies it into the live ``Group`` with
``group.apply(next)``. A write that fails leaves the live group as it was.

Members' futures, heartbeats and offered protocols are not part of the
value: they are the live group's business (``groupcoord.coordinator``).
"""

from __future__ import annotations

import attrs

from groupcoord.records import group_key, group_value
from groupcoord.state import GroupEvent, GroupState, transition


@attrs.frozen
class StoredMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@attrs.frozen
class StoredGroup:
    group_id: str
    state: GroupState
    generation: int
    protocol_type: str | None
    protocol_name: str | None
    leader: str | None
    state_timestamp: int
    members: tuple[StoredMember, ...] = ()

    # -- the next values: each goes through the state table; the caller writes it first --

    def _moved(self, event: GroupEvent, now_ms: int, **changes) -> "StoredGroup":
        return attrs.evolve(self, state=transition(self.state, event), state_timestamp=now_ms, **changes)

    def synced(self, assignments: dict[str, bytes], now_ms: int) -> "StoredGroup":
        """The leader's SyncGroup: every member gets its part (nothing if the
        leader gave it none) and the group becomes Stable."""
        members = tuple(attrs.evolve(m, assignment=assignments.get(m.member_id, b"")) for m in self.members)
        return self._moved(GroupEvent.LEADER_SYNC, now_ms, members=members)

    def emptied(self, now_ms: int) -> "StoredGroup":
        """The last member is gone: a new generation with nobody in it."""
        return self._moved(GroupEvent.ALL_MEMBERS_GONE, now_ms, generation=self.generation + 1, protocol_name=None, leader=None, members=())

    # -- serialization -----------------------------------------------------------------

    def to_record(self) -> tuple[bytes, bytes]:
        """The (key, value) of this group's GroupMetadata record."""
        body = {
            "protocol_type": self.protocol_type or "",
            "generation": self.generation,
            "protocol": self.protocol_name,
            "leader": self.leader,
            "current_state_timestamp": self.state_timestamp,
            "members": [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "rebalance_timeout": m.rebalance_timeout_ms,
                    "session_timeout": m.session_timeout_ms,
                    "subscription": m.subscription,
                    "assignment": m.assignment,
                }
                for m in self.members
            ],
        }
        return group_key(self.group_id), group_value(body)
