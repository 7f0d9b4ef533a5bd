"""Enrich a stream from a table, without a join operator: one processor
keeps a table in a state store and reads it for every event, exactly once.

    onceflow topics create account-regions --partitions 2 --config cleanup.policy=compact
    onceflow topics create payments --partitions 2
    onceflow run examples/enrichment.py --bootstrap-servers 127.0.0.1:9092   (or ONCEFLOW_BOOTSTRAP_SERVERS in the environment)
    python examples/enrichment.py --bootstrap-servers 127.0.0.1:9092 [--state-dir ./state/enrichment]

``account-regions`` is a table as a topic (key: account; value: its region;
a null value deletes the account); ``payments`` is the stream (key: account;
value: ``{"id", "account", "amount"}``). The processor reads both: a region
record updates the ``regions`` store, a payment is written to
``enriched-payments`` with the region the table holds for its account at
that moment (``"unknown"`` if none). The table's changes and the enriched
payments commit in the same transactions as the input offsets, so after any
crash the table and the output agree with what was read, once.

Both topics must be keyed by account and have the same number of partitions
(co-partitioned, as for a Kafka Streams stream-table join): an account's
region updates and payments then meet in the same partition, and so in the
same store shard. The runner checks the partition counts.

For ``onceflow chaos --workload streaming --app examples/enrichment.py`` the
module also says what input to feed it and what output that must give
(``CHAOS_TOPICS``, ``CHAOS_OUTPUT``, ``chaos_input``, ``expected``; see faults.workloads).
"""

from __future__ import annotations

import random

import streaming

TABLE, EVENTS, OUTPUT = "account-regions", "payments", "enriched-payments"
UNKNOWN = "unknown"


def build_app(bootstrap_servers: str | None = None, state_dir: str | None = None, **options) -> streaming.App:
    # Static membership (the runner's default) gives a restarted instance its
    # partitions back at once; a short session lets the others take over
    # quickly from one that died for good.
    options = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500, **options}
    app = streaming.App(bootstrap_servers=bootstrap_servers, application_id="enrichment", state_dir=state_dir, **options)

    @app.processor(source=[TABLE, EVENTS], sink=OUTPUT, stores=["regions"], key_format="str", value_format="bytes", sink_value_format="json")
    def enrich(record, ctx):
        regions = ctx.store("regions")
        if record.topic == TABLE:
            if record.value is None:
                regions.delete(record.key)
            else:
                regions.put(record.key, record.value.decode("utf-8"))
            return
        payment = streaming.resolve("json").deserialize(record.value)
        ctx.emit(record.key, {**payment, "region": regions.get(record.key, UNKNOWN)})

    return app


# Where it runs: onceflow run's --bootstrap-servers and --state-dir, else
# ONCEFLOW_BOOTSTRAP_SERVERS and ONCEFLOW_STATE_DIR (streaming.App).
app = build_app()


# -- what `onceflow chaos --workload streaming` feeds it and expects ----------------------------------

REGIONS = ("emea", "amer", "apac")


CHAOS_TOPICS = {TABLE: 2, EVENTS: 2, OUTPUT: 2}
CHAOS_OUTPUT = OUTPUT


def chaos_input(count: int, seed: int) -> list[list[tuple]]:
    """Four phases of (topic, key, value, timestamp, partition): the table (80 of 100
    accounts get a region, some twice, some deleted again), then half the
    payments, then a second version of the table and the other half, so
    each payment's region depends on which table phase preceded it."""
    rng = random.Random(seed)
    accounts = [f"acct-{i}" for i in range(100)]

    def table_phase() -> list[tuple]:
        changes = [(TABLE, account, rng.choice(REGIONS), None, None) for account in accounts[:80] for _ in range(rng.randint(1, 2))]
        changes += [(TABLE, account, None, None, None) for account in rng.sample(accounts[:80], 5)]
        return changes

    def payments(first: int, last: int) -> list[tuple]:
        out = []
        for number in range(first, last):
            account = rng.choice(accounts)
            out.append((EVENTS, account, f'{{"id":{number},"account":"{account}","amount":{rng.randint(1, 500)}}}', None, None))
        return out

    return [table_phase(), payments(0, count // 2), table_phase(), payments(count // 2, count)]


def expected(records: list[tuple]) -> list[tuple]:
    """(key, value) of every enriched payment: the table as of the payment's
    phase (a phase is fed only once the one before it is processed)."""
    import json

    regions: dict[str, str] = {}
    out = []
    for topic, key, value, _timestamp, _partition in records:
        if topic == TABLE:
            if value is None:
                regions.pop(key, None)
            else:
                regions[key] = value
        else:
            out.append((key, {**json.loads(value), "region": regions.get(key, UNKNOWN)}))
    return out


if __name__ == "__main__":
    from streaming.cli import main_of  # onceflow run's options, statuses and messages, for this app

    raise SystemExit(main_of(app))
