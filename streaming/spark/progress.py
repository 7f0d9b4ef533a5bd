"""``streaming.spark.describe(query)``: one line about a streaming query that
reads or writes through the ``onceflow`` data source.

    payments [active, batch 12] source payments-0@1200 (lag 0) payments-1@1180 (lag 20), lag 20; output totals: 1 open transaction (totals-job-3f2a9c1e-0 Ongoing)

- Offsets: where the last batch ended (Spark's progress report).
- Lag: how far the last stable offset is ahead of that end, per partition
  (asked of the broker when the source's options can be read from the query's
  plan, else the latest offsets the source reported at its last trigger).
- Open transactions: those whose transactional id starts with the onceflow
  sink's ``transactionalIdPrefix`` and a dash and are not complete; an open one holds the
  output's last stable offset, so read_committed readers wait for it.

The query's options are read from its logical plan through Spark's JVM
gateway (classic Spark); where that is not possible the line says so and
shows what the progress report holds.
"""

from __future__ import annotations

import json

from streaming.spark import options as opts
from txn.types import TopicPartition

OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")


def describe_query(query) -> str:
    progress = _as_dict(query.lastProgress)
    name = query.name or str(query.id)
    state = "active" if query.isActive else "stopped"
    if progress is None:
        return f"{name} [{state}] no batch yet"
    parts = [f"{name} [{state}, batch {progress.get('batchId')}]"]
    source_options, sink_options = _plan_options(query)
    for index, source in enumerate(progress.get("sources") or []):
        end = _offsets(source.get("endOffset"))
        if end is None:
            continue
        latest = _live_latest(source_options[index] if index < len(source_options) else None, end) or _offsets(source.get("latestOffset")) or end
        parts.append(_source_text(end, latest))
    if sink_options is not None:
        parts.append(_sink_text(sink_options))
    return " ".join(parts)


def _as_dict(progress) -> dict | None:
    if progress is None:
        return None
    if isinstance(progress, dict):
        return dict(progress)
    return json.loads(progress.json)


def _offsets(text) -> dict[TopicPartition, int] | None:
    if not text or text == "null":
        return None
    value = json.loads(text) if isinstance(text, str) else text
    try:
        return opts.offsets_from_json(value)
    except (AttributeError, TypeError, ValueError):
        return None  # not a onceflow (Kafka-shaped) source


def _source_text(end: dict[TopicPartition, int], latest: dict[TopicPartition, int]) -> str:
    lags = {tp: max(0, latest.get(tp, offset) - offset) for tp, offset in end.items()}
    shown = " ".join(f"{tp}@{offset} (lag {lags[tp]})" for tp, offset in sorted(end.items()))
    return f"source {shown}, lag {sum(lags.values())};"


def _live_latest(options: dict | None, end: dict[TopicPartition, int]) -> dict[TopicPartition, int] | None:
    if not options:
        return None
    from txn import Admin

    params = opts.kafka_params(options)
    isolation = params.get("isolation.level", "read_committed")
    with Admin(config=opts.client_config(opts.AdminConfig, params, only_known=True)) as admin:
        listed = admin.list_offsets({tp: "latest" for tp in end}, isolation_level=isolation)
    return {tp: found.offset for tp, found in listed.items()}


def _sink_text(options: dict) -> str:
    options = opts.lowercase(options)
    topic = options.get("topic", "(topic column)")
    prefix = options.get("transactionalidprefix")
    params = opts.kafka_params(options)
    if not prefix or "bootstrap.servers" not in params:
        return f"output {topic}: at least once, no transactions"
    open_ids = open_transactions(opts.client_config(opts.AdminConfig, params, only_known=True), prefix)
    count = len(open_ids)
    listed = ", ".join(f"{tid} {state}" for tid, state in open_ids[:5]) + (" ..." if count > 5 else "")
    return f"output {topic}: {count} open transaction{'s' if count != 1 else ''}" + (f" ({listed})" if count else "")


def open_transactions(admin_config, prefix: str) -> list[tuple[str, str]]:
    """(transactional id, state) of every incomplete transaction under ``prefix``."""
    from txn import Admin

    with Admin(config=admin_config) as admin:
        listed = admin.list_transactions(states=list(OPEN_STATES))
    return [(t.transactional_id, t.state) for t in listed if t.transactional_id.startswith(prefix + "-")]


def _plan_options(query) -> tuple[list[dict | None], dict | None]:
    """The options of the query's onceflow sources (in plan order; None for
    other sources) and of its onceflow sink, read from the JVM plan; ([], None)
    where there is no JVM plan to read (Spark Connect)."""
    from py4j.protocol import Py4JError

    unreadable = (Py4JError, AttributeError)  # no JVM query here, or a plan node of another shape
    try:
        plan = query._jsq.streamingQuery().logicalPlan()
        leaves = plan.collectLeaves()
    except unreadable:
        return [], None
    sources: list[dict | None] = []
    for index in range(leaves.size()):
        try:
            relation = leaves.apply(index).relation()
            onceflow = relation.table().name() == "onceflow"
            sources.append(dict(relation.options().asCaseSensitiveMap()) if onceflow else None)
        except unreadable:
            sources.append(None)
    sink = None
    try:
        if plan.table().name() == "onceflow":
            written = plan.writeOptions()
            sink = {key: written.apply(key) for key in _scala_keys(written)}
    except unreadable:
        sink = None
    return sources, sink


def _scala_keys(scala_map) -> list[str]:
    keys = scala_map.keys().toList()
    return [keys.apply(i) for i in range(keys.size())]
