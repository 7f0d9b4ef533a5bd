"""Enrich a stream from a table with a stream-table join, exactly once.

    onceflow topics create account-regions --partitions 2 --config cleanup.policy=compact
    onceflow topics create payments --partitions 2
    onceflow run examples/enrichment.py --bootstrap-servers 127.0.0.1:9092   (or ONCEFLOW_BOOTSTRAP_SERVERS in the environment)
    python examples/enrichment.py --bootstrap-servers 127.0.0.1:9092 [--state-dir ./state/enrichment]

``account-regions`` is a table (``app.table``: key: account; value: its
region as text; a null value deletes the account); ``payments`` is the stream
(key: account; value: ``{"id", "account", "amount"}``). Each payment is
written to ``enriched-payments`` with the region the table holds for its
account at the payment's time (``"unknown"`` on a left join's miss). The
table's store and the enriched payments commit in the same transactions as
the input offsets, so after any crash the table and the output agree with
what was read, once.

Both topics must be keyed by account and have the same number of partitions
(co-partitioned): the runner refuses to start otherwise, naming them, and
keeps partition N of both on one instance. Their records are processed in
timestamp order across the two topics: a region update stamped before a
payment is applied first even when it arrives later, if it arrives within
``max_task_idle_ms`` (see ``streaming.picking``).

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
    regions = app.table(TABLE, key_format="str", value_format="str")
    (app.stream(EVENTS, key_format="str", value_format="json")
        .left_join(regions, lambda payment, region: {**payment, "region": region or UNKNOWN})
        .to(OUTPUT, value_format="json"))
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
    each payment's region depends on which table phase preceded it. Every
    record is stamped, in feeding order, from now on (a broker's time
    retention keeps recent records), so timestamp order is feeding order."""
    import itertools
    import time

    rng = random.Random(seed)
    accounts = [f"acct-{i}" for i in range(100)]
    clock = itertools.count(int(time.time() * 1000) - 60_000)

    def table_phase() -> list[tuple]:
        changes = [(TABLE, account, rng.choice(REGIONS), next(clock), None) for account in accounts[:80] for _ in range(rng.randint(1, 2))]
        changes += [(TABLE, account, None, next(clock), None) for account in rng.sample(accounts[:80], 5)]
        return changes

    def payments(first: int, last: int) -> list[tuple]:
        out = []
        for number in range(first, last):
            account = rng.choice(accounts)
            out.append((EVENTS, account, f'{{"id":{number},"account":"{account}","amount":{rng.randint(1, 500)}}}', next(clock), None))
        return out

    return [table_phase(), payments(0, count // 2), table_phase(), payments(count // 2, count)]


def expected(records: list[tuple]) -> list[tuple]:
    """(key, value) of every enriched payment, recomputed: the records in
    timestamp order (the join's order), each payment with the region its
    account had then."""
    import json

    regions: dict[str, str] = {}
    out = []
    for topic, key, value, _timestamp, _partition in sorted(records, key=lambda record: record[3]):
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
