"""Which record the runner processes next when several topics meet in one
store: co-partitioned inputs in timestamp order, without I/O.

**Co-partitioned inputs.** Topics whose partition N must be processed
together, by one instance, against one shard of a store: the sources of a
processor that has stores, and the sources of processors that share a store
(a table's topic and every stream joined with it). ``copartition_groups``
finds them (connected through the stores); the runner checks at start that
the topics of a group have one partition count and keeps the ``range``
assignor, which gives partition N of every subscribed topic to one member.

**Timestamp order** (Kafka Streams' stream time per task, with
``max.task.idle.ms``). The records of a group's topics at partition N form
one task. ``RecordPicker`` buffers what the consumer hands out and, for a
task, takes the record with the lowest timestamp among the heads of its
partitions (a table's record first at equal timestamps, so an update and a
payment of the same millisecond meet in that order). A record's timestamp
here is the one its processors see: what the source's
``timestamp_extractor`` gives from the payload when it has one (the caller
passes that as ``timestamp_of``, ``streaming.task.Task.order_time``), else
its CreateTime. While one of the
task's partitions has nothing buffered, a record with a later timestamp may
still be on its way there, so the task waits, up to ``max_idle_ms`` from
when that partition was found empty; after that it goes on with what it
has ("enforced processing") until every partition has records again. So a
table update with an earlier timestamp than a payment is applied before the
payment even when it arrives later, if it arrives within the bound; later
than that, the payment has met the table as it was. ``max_idle_ms=0``
orders what is buffered and never waits.

Records of topics in no group go through in the order they came.

Memory: ``take`` hands out at most a poll's worth, and the runner polls
nothing more while records ready to go are left (``backlog``). The
consumer has no pause(), so while a task waits (up to ``max_idle_ms``) what
is fetched of its other partitions is held here.
"""

from __future__ import annotations

import collections
from typing import Callable, Iterable

Partition = tuple[str, int]  # (topic, partition)


def copartition_groups(app) -> list[tuple[str, ...]]:
    """The groups of two or more topics that must be co-partitioned, each
    sorted with table topics first; from the app's processors and stores."""
    parent: dict = {}

    def find(node):
        while parent.setdefault(node, node) != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for processor in app.processors:
        if not processor.stores:
            continue
        anchor = ("store", processor.stores[0])
        for node in [("store", store) for store in processor.stores] + [("topic", topic) for topic in processor.sources]:
            parent[find(node)] = find(anchor)
    members: dict = collections.defaultdict(set)
    for node in list(parent):
        if node[0] == "topic":
            members[find(node)].add(node[1])
    tables = table_topics(app)
    return sorted(tuple(sorted(topics, key=lambda topic: (topic not in tables, topic))) for topics in members.values() if len(topics) > 1)


def table_topics(app) -> set[str]:
    return {table.topic for table in getattr(app, "tables", {}).values()}


class RecordPicker:
    """Buffers records and hands them out in the order described in the
    module doc: ``add`` what was polled, ``take(now_ms)`` what may go now."""

    def __init__(self, groups: Iterable[tuple[str, ...]], max_idle_ms: int, tables: set[str] = frozenset(),
                 timestamp_of: Callable[[object], int] | None = None):
        self.timestamp_of = timestamp_of or (lambda raw: raw.timestamp)
        self.groups = [tuple(group) for group in groups]
        self.group_of = {topic: index for index, group in enumerate(self.groups) for topic in group}
        self.rank = {topic: (0 if topic in tables else 1) for topic in self.group_of}
        self.max_idle_ms = max_idle_ms
        self.queues: dict[Partition, collections.deque] = {}  # (its timestamp, the record), in arrival order
        self.assigned: set[Partition] = set()
        self.passing: list = []  # records of topics in no group, in arrival order
        self.backlog = False  # the last take stopped at its limit: more may go at once
        self.empty_since: dict[Partition, int] = {}  # an assigned partition of a task with records -> when it was found with none

    def __len__(self) -> int:
        return len(self.passing) + sum(map(len, self.queues.values()))

    def assign(self, partitions: Iterable[Partition]) -> None:
        self.assigned.update(partitions)

    def revoke(self, partitions: Iterable[Partition]) -> None:
        partitions = set(partitions)
        self.drop(partitions)
        self.assigned -= partitions

    def drop(self, partitions: Iterable[Partition] | None = None) -> None:
        """Forget what is buffered of ``partitions`` (all if None): the consumer reads them again (a rewind)."""
        if partitions is None:
            self.queues.clear()
            self.passing.clear()
            self.empty_since.clear()
            return
        partitions = set(partitions)
        for where in partitions:
            self.queues.pop(where, None)
        self.passing = [raw for raw in self.passing if (raw.topic, raw.partition) not in partitions]
        for where in partitions:
            self.empty_since.pop(where, None)

    def add(self, records: Iterable) -> None:
        group_of, queues, timestamp_of = self.group_of, self.queues, self.timestamp_of
        for raw in records:
            if raw.topic in group_of:
                where = (raw.topic, raw.partition)
                queue = queues.get(where)
                if queue is None:
                    queue = queues[where] = collections.deque()
                queue.append((timestamp_of(raw), raw))
            else:
                self.passing.append(raw)

    def take(self, now_ms: int, limit: int | None = None) -> list:
        """The records that may be processed now, in order, at most ``limit``
        (the rest stay buffered; ``backlog`` says whether some of them could go now)."""
        limit = limit or len(self)
        out, self.passing = self.passing[:limit], self.passing[limit:]
        tasks = {(self.group_of[topic], partition) for (topic, partition), queue in self.queues.items() if queue}
        self.backlog = bool(self.passing)
        for task in sorted(tasks):
            while (raw := self._next_of(task, now_ms)) is not None:
                out.append(raw)
                if len(out) >= limit:
                    self.backlog = True
                    return out
        return out

    def _next_of(self, task: tuple[int, int], now_ms: int):
        group, partition = task
        heads = []
        waiting = False
        empty_since = self.empty_since
        for topic in self.groups[group]:
            where = (topic, partition)
            queue = self.queues.get(where)
            if queue:
                heads.append((queue[0][0], self.rank[topic], topic, queue))
                if where in empty_since:
                    del empty_since[where]
            elif where in self.assigned:
                since = empty_since.setdefault(where, now_ms)
                if now_ms - since < self.max_idle_ms:
                    waiting = True
        if not heads or waiting:
            return None
        return min(heads, key=lambda head: head[:3])[3].popleft()[1]

    def wait_ms(self, now_ms: int) -> int | None:
        """How long until a task waiting with records buffered may go on (None: none is)."""
        waits = [since + self.max_idle_ms - now_ms for (topic, partition), since in self.empty_since.items()
                 if any(self.queues.get((other, partition)) for other in self.groups[self.group_of[topic]])]
        return max(0, min(waits)) if waits else None


def order_key(raw, rank: dict[str, int], timestamp_of: Callable[[object], int] | None = None) -> tuple:
    """How heads of one task compare: timestamp (``timestamp_of(raw)``, the
    CreateTime by default), then a table's record first."""
    return (raw.timestamp if timestamp_of is None else timestamp_of(raw)), rank.get(raw.topic, 1), raw.topic
