"""The topics an app needs and the check, at start, of what the cluster has
against them. Sans I/O: the runner asks the broker (topics, their configs,
the groups) and creates what this module plans; nothing here opens a socket.

| topic | partitions | when missing | when present |
| --- | --- | --- | --- |
| a source | | the app refuses to start | |
| repartition ``{application_id}-{chain}-repartition-{n}`` | its chain's source's | created | must have exactly that many |
| changelog ``{application_id}-{store}-changelog`` | the most of its processor's sources' | created, ``cleanup.policy=compact`` | at least that many, and compacted |
| dead letters (``on_error="dead-letter"``) | 1 | created | |
| a sink (a processor's ``sink`` or ``outputs``, a window's ``on_late`` topic) | the most of its processor's sources' | created | |
| an output given a count (``outputs={topic: n}``) | ``n`` | created | must have exactly ``n`` |

Everything created gets the app's ``replication_factor`` and, when set,
``min_insync_replicas``: no topic the app writes to is left to the
broker's auto-creation (and its defaults): a processor declares every
topic it writes with ``ctx.emit(topic=...)`` (``outputs``), and emitting to
one it did not declare fails. A sink the app also reads with a table or a
store is checked with its co-partitioned group (the runner's check).

Orphaned state: a changelog or repartition topic of this application id
that the topology no longer names holds state (or records in flight) that
a renamed chain, processor or store would silently leave behind, so the
app refuses to start and names it (``orphaned``). A topic is the app's when
its name is ``{application_id}-...-changelog`` or
``{application_id}-...-repartition-{n}`` (and, for a changelog, it is
compacted, as every changelog the runner makes), unless it starts with the
application id of another app the cluster knows (a group whose id
extends ours: ``words`` does not claim ``words-v2``'s topics).
"""

from __future__ import annotations

import re
from typing import Iterable

import attrs

from streaming.errors import TopicsMismatchError

REPARTITION = re.compile(r"-repartition-[0-9]+")
CHANGELOG_SUFFIX = "-changelog"


@attrs.frozen
class Need:
    """One topic the app needs, with how many partitions."""

    topic: str
    kind: str  # "repartition", "changelog", "dead-letter", "sink" or "output" (a count the app asked for)
    partitions: int
    compacted: bool = False


def needs(app, existing: dict[str, int]) -> list[Need]:
    """The internal and sink topics of ``app`` given the cluster's topics
    (``{topic: partitions}``): repartition topics first (later counts
    depend on them). Raises ``TopicsMismatchError`` for a missing source and for
    a stateful processor whose sources are not co-partitioned."""
    found: list[Need] = []
    counts = dict(existing)
    for topic, like in app.internal_topics.items():
        if like in existing:
            found.append(Need(topic, "repartition", existing[like]))
            counts.setdefault(topic, existing[like])
    sources = sorted({t for processor in app.processors for t in processor.sources})
    missing = [t for t in sources if t not in counts]
    if missing:
        raise TopicsMismatchError(f"source topic(s) {', '.join(missing)} do not exist: create them first")
    changelogs: dict[str, int] = {}
    sinks: dict[str, int] = {}
    exact: dict[str, int] = {}  # outputs given a partition count
    for processor in app.processors:
        source_counts = {counts[t] for t in processor.sources}
        if processor.stores and len(source_counts) > 1:
            raise TopicsMismatchError(f"processor {processor.name} has stores, so its sources must have one partition count (co-partitioned), not {sorted(source_counts)}")
        for store in processor.stores:
            topic = app.changelog_topic(store)
            changelogs[topic] = max(changelogs.get(topic, 0), max(source_counts))
        if processor.sink is not None and processor.sink not in app.internal_topics:
            sinks[processor.sink] = max(sinks.get(processor.sink, 0), max(source_counts))
        for topic, partitions in processor.outputs:
            if partitions is not None:
                if exact.setdefault(topic, partitions) != partitions:
                    raise TopicsMismatchError(f"output {topic} is declared with {exact[topic]} and {partitions} partitions")
            elif topic not in app.internal_topics:
                sinks[topic] = max(sinks.get(topic, 0), max(source_counts))
    for topic, like in app.sink_topics.items():
        if like in counts:
            sinks[topic] = max(sinks.get(topic, 0), counts[like])
    found += [Need(topic, "changelog", count, compacted=True) for topic, count in sorted(changelogs.items())]
    if app.on_error == "dead-letter":
        found.append(Need(app.dead_letter_topic, "dead-letter", 1))
    taken = set(changelogs) | {app.dead_letter_topic}
    found += [Need(topic, "output", count) for topic, count in sorted(exact.items()) if topic not in taken]
    found += [Need(topic, "sink", count) for topic, count in sorted(sinks.items()) if topic not in taken and topic not in exact]
    return found


def problems(wanted: list[Need], existing: dict[str, int], configs: dict[str, dict[str, str]]) -> list[str]:
    """What is wrong with the topics of ``wanted`` that exist (``configs``:
    the topic configs of the compacted ones)."""
    found = []
    for need in wanted:
        if need.topic not in existing:
            continue
        have = existing[need.topic]
        if need.kind == "repartition" and have != need.partitions:
            found.append(f"repartition topic {need.topic} has {have} partitions, not its source's {need.partitions}")
        elif need.kind == "changelog" and have < need.partitions:
            found.append(f"changelog {need.topic} has {have} partitions, fewer than its sources' {need.partitions}")
        elif need.kind == "output" and have != need.partitions:
            found.append(f"output {need.topic} has {have} partitions, not the {need.partitions} the app declares (outputs=)")
        if need.compacted and need.topic in configs:
            policy = configs[need.topic].get("cleanup.policy", "delete")
            if "compact" not in policy.split(","):
                found.append(f"changelog {need.topic} has cleanup.policy={policy}: a store's changelog must be compacted (cleanup.policy=compact), or its older keys are deleted with their segments")
    return found


def named_by(app) -> set[str]:
    """The changelog and repartition topics the topology names."""
    stores = {store for processor in app.processors for store in processor.stores}
    return {app.changelog_topic(store) for store in stores} | set(app.internal_topics)


@attrs.frozen
class Orphan:
    """A topic of this application's state that the topology does not name."""

    topic: str
    kind: str  # "changelog" or "repartition"
    name: str  # the store's, or the chain's

    def describe(self) -> str:
        if self.kind == "changelog":
            return f"store {self.name!r} (changelog {self.topic})"
        return f"the records in flight of chain {self.name!r} (repartition topic {self.topic})"


def orphaned(app, existing: Iterable[str], group_ids: Iterable[str]) -> list[Orphan]:
    """The topics of this application's state its topology no longer names
    (by name alone: ``compacted_only`` then drops the changelog-named
    topics that are no store's)."""
    prefix = f"{app.application_id}-"
    others = [f"{group}-" for group in group_ids if group.startswith(prefix)]
    named = named_by(app)
    found = []
    for topic in sorted(existing):
        if not topic.startswith(prefix) or topic in named or any(topic.startswith(other) for other in others):
            continue
        middle = topic[len(prefix):]
        if middle.endswith(CHANGELOG_SUFFIX) and len(middle) > len(CHANGELOG_SUFFIX):
            found.append(Orphan(topic, "changelog", middle[: -len(CHANGELOG_SUFFIX)]))
        elif (match := REPARTITION.search(middle)) is not None and match.end() == len(middle) and match.start() > 0:
            found.append(Orphan(topic, "repartition", middle[:match.start()]))
    return found


def compacted_only(orphans: list[Orphan], configs: dict[str, dict[str, str]]) -> list[Orphan]:
    """``orphans`` without the changelog-named topics that are not compacted
    (``configs``: their topic configs): the runner makes every changelog
    compacted, so such a topic is a user's own, not a store's."""
    return [orphan for orphan in orphans if orphan.kind != "changelog" or "compact" in configs.get(orphan.topic, {}).get("cleanup.policy", "compact").split(",")]


def orphaned_message(app, orphans: list[Orphan]) -> str:
    return (
        f"application {app.application_id!r} has state its topology no longer names: {'; '.join(orphan.describe() for orphan in orphans)}. "
        "A renamed output topic, processor, chain or store would leave it behind. To keep it, give the "
        "chain its old name (.to(..., name=...)) or the store (store=...); to drop it, delete the topic"
    )
