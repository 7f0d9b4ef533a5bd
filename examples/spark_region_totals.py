"""A Spark Structured Streaming query on onceflow, exactly once: per-minute
event-time totals per region of the balances the payments pipeline writes
(``examples/payments_pipeline.py``), the Spark half of ``onceflow demo``.

    onceflow chaos --workload spark --query examples/spark_region_totals.py --faults kill-driver,kill-broker

It reads the topic ``balances`` (values ``payment-id:account:balance``, the
record's timestamp is the payment's event time) through the ``onceflow``
source (read_committed: records of aborted transactions never reach Spark),
derives each account's region from its number, and counts the payments and
sums the balances they left per one-minute event-time window and region,
with a one-minute watermark, in append mode: each (window, region) row is
written once, when the watermark passes the window, through the exactly-once
sink to ``region-minutes`` (key ``region@window-start-ms``, a JSON value).
A batch reads at most ``MAX_RECORDS_PER_BATCH`` records, so a backlog (the
query starts after its input, or restarts after a kill) is worked off in
several batches, each closing the windows the watermark passed.
Killed at any moment and restarted from its checkpoint, it writes every row
once.

The module follows the Spark query convention of ``onceflow chaos
--workload spark`` (``faults.spark``): ``build(spark, bootstrap,
checkpoint)`` starts the query; ``CHAOS_TOPICS``, ``CHAOS_OUTPUT``,
``chaos_input(count, seed)`` and ``expected(records)`` say what to feed it
and what it must write.
"""

from __future__ import annotations

import random

REGIONS = ("amer", "apac", "emea", "latam")
WINDOW_MS = 60_000
WATERMARK = "1 minute"
WATERMARK_MS = 60_000
MAX_RECORDS_PER_BATCH = 4000
SOURCE, SINK = "balances", "region-minutes"
EPOCH_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: event times of the chaos input start here

CHAOS_TOPICS = {SOURCE: 3, SINK: 2}
CHAOS_OUTPUT = SINK


def region_of(account: str) -> str:
    """``acct-017`` -> the region of account number 17 (Spark computes the same)."""
    return REGIONS[int(account.rsplit("-", 1)[1]) % len(REGIONS)]


def build(spark, bootstrap: str, checkpoint: str, *, source: str = SOURCE, sink: str = SINK, prefix: str = "region-minutes", sink_options: dict | None = None):
    """Start the query on ``spark``; returns the StreamingQuery.
    ``sink_options`` adds options to the sink (the fault harness passes its
    ``crashPointHook`` this way)."""
    from pyspark.sql import functions as F

    import streaming.spark

    streaming.spark.register(spark)
    balances = (
        spark.readStream.format("onceflow")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", MAX_RECORDS_PER_BATCH)
        .load()
    )
    fields = F.split(F.col("value").cast("string"), ":")
    number = F.substring_index(fields[1], "-", -1).cast("int")
    rows = balances.select(
        F.col("timestamp").alias("event_time"),
        F.element_at(F.array(*[F.lit(r) for r in REGIONS]), number % len(REGIONS) + 1).alias("region"),
        fields[2].cast("long").alias("balance"),
    )
    totals = (
        rows.withWatermark("event_time", WATERMARK)
        .groupBy(F.window("event_time", "1 minute"), "region")
        .agg(F.count("*").alias("payments"), F.sum("balance").alias("balance_total"), F.min("balance").alias("lowest_balance"))
    )
    window_start = F.unix_millis(F.col("window.start"))
    out = totals.select(
        F.concat_ws("@", "region", window_start.cast("string")).alias("key"),
        F.to_json(F.struct("region", window_start.alias("window_start"), "payments", "balance_total", "lowest_balance")).alias("value"),
    )
    writer = (
        out.writeStream.format("onceflow")
        .outputMode("append")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("transactionalIdPrefix", prefix)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="1 second")
    )
    for name, value in (sink_options or {}).items():
        writer = writer.option(name, value)
    return writer.start()


def totals_of(balances) -> dict[str, dict]:
    """The rows the query must write for these balance records: ``[(value
    "payment-id:account:balance", timestamp_ms), ...]`` -> ``{key: value}``,
    recomputed in plain Python."""
    groups: dict[tuple[str, int], list[int]] = {}
    for value, timestamp in balances:
        _payment, account, balance = value.split(":")
        window_start = timestamp - timestamp % WINDOW_MS
        groups.setdefault((region_of(account), window_start), []).append(int(balance))
    return {
        f"{region}@{start}": {"region": region, "window_start": start, "payments": len(values), "balance_total": sum(values), "lowest_balance": min(values)}
        for (region, start), values in groups.items()
    }


def chaos_input(count: int, seed: int) -> list[list[tuple]]:
    """Balance records with event times 30 ms apart (so ``count`` records span
    count * 30 ms of event time), then, once those are processed, one record
    an hour later whose only job is to move the watermark past every window."""
    rng = random.Random(seed)
    balances: dict[str, int] = {}
    records = []
    for number in range(count):
        account = f"acct-{rng.randrange(200):03d}"
        balances[account] = balances.get(account, 0) + rng.choice([-1, 1]) * rng.randrange(1, 5000)
        records.append((SOURCE, account, f"p{number:07d}:{account}:{balances[account]}", EPOCH_MS + number * 30, None))
    closing = (SOURCE, "acct-000", f"p{count:07d}:acct-000:{balances.get('acct-000', 0)}", EPOCH_MS + count * 30 + 3_600_000, None)
    return [records, [closing]]


def expected(records) -> list[tuple[str, dict]]:
    """Every (key, value) ``region-minutes`` must hold once, given the input
    in feeding order (topic, key, value, timestamp_ms, partition): every
    window the watermark has passed (the window of the latest record stays
    open)."""
    if not records:
        return []
    watermark = max(r[3] for r in records) - WATERMARK_MS
    rows = totals_of([(r[2], r[3]) for r in records])
    return [(key, value) for key, value in rows.items() if value["window_start"] + WINDOW_MS <= watermark]

