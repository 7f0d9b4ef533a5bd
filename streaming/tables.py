"""Tables: a topic read as its latest value per key (``app.table``), and
global tables (``app.global_table``) held whole by every instance. Without
I/O: the runner (``streaming.global_tables``) and the test driver feed them.

    accounts = app.table("accounts", key_format="str", value_format="json")
    currencies = app.global_table("currencies", key_format="str", value_format="json")
    (app.stream("payments", key_format="str", value_format="json")
        .join(accounts, lambda payment, account: {**payment, "owner": account["owner"]})
        .left_join(currencies, lambda payment, rate: {**payment, "rate": rate}, on=lambda payment: payment["currency"])
        .to("enriched"))

**A table** is materialized by a processor of its own (named after its
store, ``{topic}-table`` unless ``store=`` says otherwise) that puts each
record's value under its key and deletes the key on a tombstone (a null
value); records with a null key are skipped and counted
(``table_records_skipped``), as Kafka Streams does. The store is an ordinary
changelogged store, written in the same transaction as the offsets of the
table topic, so the table a join reads is exactly what was read of its
topic, crash or not. Kafka Streams can instead restore a source table from
its own topic (the "source-topic changelog" optimisation, no second copy);
onceflow keeps the changelog: a store is then restored the one way every
store is (the changelog's committed end), the table's topic need not be
compacted, and a table record that failed to deserialize is never replayed
into the store at restore. The cost is each table record written twice.

A stream joined with a table must be co-partitioned with it (same key, same
partition count: ``streaming.picking`` groups them, the runner checks the
counts at start and pins the ``range`` assignor so partition N of both stay
on one instance), and its records and the table's are processed in
timestamp order (``App(max_task_idle_ms=...)``, see ``streaming.picking``).

**A global table** is every partition of its topic on every instance, in
memory (small reference data: currencies, regions, feature flags). The
runner reads it to its end before processing anything, then keeps reading
it between polls, outside the transactions (it has no changelog and no
offsets in the group: a restarted instance reads it again from the start).
So a stream joined with it needs no co-partitioning and may join on any key
(``on=``), but, as with Kafka Streams' GlobalKTable, which version of a
global record a stream record meets depends on how far the global topic had
been read, not on timestamps.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs

from streaming.serde import Serde, resolve

log = logging.getLogger("streaming.tables")

SKIPPED_METRIC = "table_records_skipped"


@attrs.frozen(eq=False)
class Table:
    """A table (``app.table``) or a global table (``app.global_table``):
    what a stream joins with."""

    topic: str
    store: str  # the store (a table) or the name of the in-memory copy (a global table)
    key_serde: Serde
    value_serde: Serde
    is_global: bool = False


def materializer(store: str):
    """The processor ``fn(record, ctx)`` that keeps a table's store at its topic's latest values."""

    def materialize(record, ctx) -> None:
        if record.key is None:
            ctx.count(SKIPPED_METRIC)
            return
        state = ctx.store(store)
        if record.value is None:
            state.delete(record.key)
        else:
            state.put(record.key, record.value)

    materialize.__name__ = materialize.__qualname__ = store.replace("-", "_")
    return materialize


def table_store(topic: str) -> str:
    return f"{topic}-table"


def make_table(topic: str, key_format, value_format, store: str | None, *, is_global: bool) -> Table:
    return Table(topic, store or table_store(topic), resolve(key_format), resolve(value_format), is_global)


class GlobalStore:
    """The in-memory copy of a global table: ``get`` and ``in`` for the joins,
    ``apply`` for whoever reads its topic, ``next_offsets`` (per partition)
    for where to read on."""

    def __init__(self, table: Table):
        self.table = table
        self.contents: dict[Any, Any] = {}
        self.next_offsets: dict[int, int] = {}
        self.skipped = 0  # records that could not be read (bad bytes, a null key)

    def get(self, key, default=None):
        return self.contents.get(key, default)

    def __contains__(self, key) -> bool:
        return key in self.contents

    def __len__(self) -> int:
        return len(self.contents)

    def apply(self, raw) -> None:
        """One record of the table's topic (key and value still bytes)."""
        self.next_offsets[raw.partition] = raw.offset + 1
        try:
            key = self.table.key_serde.deserialize(raw.key)
            value = self.table.value_serde.deserialize(raw.value)
            hash(key)
        except Exception as error:
            self.skipped += 1
            log.warning("global table %s: skipping %s-%d@%d, unreadable: %s: %s", self.table.topic, raw.topic, raw.partition, raw.offset, type(error).__name__, error)
            return
        if key is None:
            self.skipped += 1
            return
        if value is None:
            self.contents.pop(key, None)
        else:
            self.contents[key] = value
