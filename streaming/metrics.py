"""The streaming runner's Prometheus metrics (``onceflow run --metrics HOST:PORT``,
``App.run(metrics_address=...)``).

The runner itself only counts (``app.metrics``: plain numbers, aborts by
cause, commit times handed to observers) and keeps its state (assigned
partitions, their lag, restores under way); this module turns that into
Prometheus metrics, in one ``CollectorRegistry`` per app (never the global
one), and serves them on the runner's own loop (``protocol.metrics_http``),
so a scrape reads the runner between two steps of its loop.

Names: ``onceflow_runner_`` prefix, base units, ``_total`` on counters. The
counters a processor keeps with ``ctx.count(name)`` appear as
``onceflow_runner_app_counter_total{counter=...}`` (their names are the app's
code's, so bounded); ``process_*`` are ``prometheus_client``'s.
"""

from __future__ import annotations

import attrs
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from protocol.metrics_http import MetricsEndpoint

COMMIT_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# app.metrics name -> (metric name without _total, help)
COUNTERS = {
    "records_in": ("onceflow_runner_records_in", "Input records processed (each once per successful pass; a rewind reads some again)"),
    "records_out": ("onceflow_runner_records_out", "Records emitted by processors in committed transactions"),
    "commits": ("onceflow_runner_commits", "Transactions committed"),
    "commits_unknown": ("onceflow_runner_commits_outcome_unknown", "Commits whose outcome was unknown (settled by a new producer, then rewound)"),
    "rebalances": ("onceflow_runner_rebalances", "Partition assignments received (one per rebalance this instance took part in)"),
    "restored_records": ("onceflow_runner_restored_records", "Changelog records applied to stores while restoring"),
    "store_rebuilds": ("onceflow_runner_store_rebuilds", "Store files thrown away and rebuilt from their changelog"),
    "dead_letters": ("onceflow_runner_dead_letters", "Records that failed and went to the dead-letter topic (counted when their transaction commits)"),
    "late_records_dropped": ("onceflow_runner_late_records_dropped", "Records dropped by windows because they came after the window closed (grace included), counted when their transaction commits"),
    "errors": ("onceflow_runner_processing_errors", "Records that failed with on_error='stop' (the run stopped)"),
}
NOT_APP_COUNTERS = set(COUNTERS) | {"aborts"}


class RunnerMetrics:
    """One app's metrics: the registry, the commit-time histogram fed by
    ``app.metrics``' observers, and a collector reading the runner."""

    def __init__(self, app, runner):
        # A ``_created`` series beside every counter and histogram child would
        # double what Prometheus stores for nothing a dashboard uses (the
        # setting is the library's, process-wide).
        disable_created_metrics()
        registry = self.registry = CollectorRegistry(auto_describe=False)
        self.commit_seconds = Histogram(
            "onceflow_runner_commit_duration_seconds",
            "Time to commit one transaction: flush its records, send its offsets, EndTxn",
            buckets=COMMIT_SECONDS_BUCKETS, registry=registry,
        )
        self._app = app
        app.metrics.observers.append(self._observed)
        registry.register(RunnerCollector(app, runner))
        ProcessCollector(registry=registry)

    def _observed(self, name: str, value: float) -> None:
        if name == "commit_seconds":
            self.commit_seconds.observe(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def serve(self, host: str, port: int) -> MetricsEndpoint:
        """Start serving ``/metrics`` on ``host:port`` (this loop);
        ``MetricsListenError`` (an OSError) if it cannot bind."""
        endpoint = MetricsEndpoint(self.render, host=host, port=port, content_type=CONTENT_TYPE_LATEST)
        try:
            await endpoint.start()
        except OSError:
            self.close()
            raise
        return endpoint

    def close(self) -> None:
        """Stop taking the app's observations (its run is over)."""
        if self._observed in self._app.metrics.observers:
            self._app.metrics.observers.remove(self._observed)


@attrs.define(eq=False)
class RunnerCollector:
    """Reads ``app.metrics`` and the runner's state at scrape time."""

    app: object  # streaming.App
    runner: object  # streaming.runner.Runner

    def collect(self):
        app, runner = self.app, self.runner
        counts = dict(app.metrics)
        info = GaugeMetricFamily("onceflow_runner_info", "This app instance (always 1)", labels=["application", "instance", "transactional_id"])
        info.add_metric([app.application_id, app.instance_id, app.transactional_id], 1)
        yield info
        for key, (name, help_text) in COUNTERS.items():
            yield CounterMetricFamily(name, help_text, value=counts.get(key, 0))
        aborts = CounterMetricFamily("onceflow_runner_aborts", "Transactions aborted, by cause", labels=["cause"])
        for cause, count in sorted(app.metrics.aborts_by_cause.items()):
            aborts.add_metric([cause], count)
        yield aborts
        custom = CounterMetricFamily("onceflow_runner_app_counter", "Counters the app's processors keep (ctx.count), counted when their transaction commits", labels=["counter"])
        for key, count in sorted(counts.items()):
            if key not in NOT_APP_COUNTERS and isinstance(count, (int, float)):
                custom.add_metric([key], count)
        yield custom
        assigned = GaugeMetricFamily("onceflow_runner_assigned_partitions", "Input partitions assigned to this instance")
        assigned.add_metric([], len(runner.assigned))
        yield assigned
        lag = GaugeMetricFamily("onceflow_runner_lag", "Records behind the partition's last stable offset (asked for about every second)", labels=["topic", "partition"])
        for tp, behind in sorted(runner.lag.items()):
            if tp in runner.assigned:
                lag.add_metric([tp.topic, str(tp.partition)], behind)
        yield lag
        open_txn = GaugeMetricFamily("onceflow_runner_transaction_open", "1 while a transaction is open")
        open_txn.add_metric([], 1 if runner.txn_open else 0)
        yield open_txn
        position = GaugeMetricFamily("onceflow_runner_restore_position", "Changelog offset a store shard being restored has reached", labels=["store", "partition"])
        remaining = GaugeMetricFamily("onceflow_runner_restore_remaining_offsets", "Changelog offsets a store shard being restored has still to read", labels=["store", "partition"])
        for (store, partition), (reached, end) in sorted(runner.restoring.items()):
            position.add_metric([store, str(partition)], reached)
            remaining.add_metric([store, str(partition)], max(0, end - reached))
        yield position
        yield remaining


__all__ = ["RunnerCollector", "RunnerMetrics"]
