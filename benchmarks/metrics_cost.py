"""`onceflow bench --metrics-cost`: what the broker's Prometheus metrics cost
on the produce path, as a ratio measured in one run.

    onceflow bench --metrics-cost [--rounds 3] [--records 200000] [--json FILE]
    python -m benchmarks.metrics_cost ...        (the same)

Two brokers (processes, fresh data directories, default durability: group
commit, acks=all waits for the fsync) run side by side: one plain, one with
``--metrics`` (every request counted and timed by ``MeasuredDispatch``,
every fsync round observed, connections counted) and a scraper (a process of
its own) reading its ``/metrics`` every second while it is loaded, more
often than a Prometheus server would. The same confluent-kafka producer
(idempotent, acks=all, 100-byte records) fills a fresh topic on each in
turn, off and on alternating round after round so that drift on a shared
machine falls on both (after one uncounted warm-up fill of each); on/off is
the median of the rounds' ratios (1.0 means free, the aim is above 0.97).
Two shapes: large batches (1 MiB, linger 5 ms: few requests, the per-record
path) and small ones (16 KiB, linger 1 ms: many requests, where a
per-request cost shows).

On a shared machine the end-to-end ratio moves by more than the cost it
looks for, so the same run also measures the cost directly, as the share of
the broker's loop the metrics take at the rates the "on" broker served (from
its own counters): the time ``MeasuredDispatch`` adds to one Produce request
(a real request body of 100 records and its response, many calls on one
loop, with and without the layer) times Produce requests/s, plus the time
the fsync observer takes per round times fsync rounds/s, plus the time the
broker's loop spends rendering one scrape (its own
``onceflow_metrics_scrape_seconds_total``) every 15 s (Prometheus' default)
or every second.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from benchmarks.suite import fill, new_topic
from faults.process import BrokerProcess, restartable_port

SHAPES = {"large batches": (1 << 20, 5, 1), "small batches": (16 << 10, 1, 2)}  # batch bytes, linger ms, records divisor
RECORD_BYTES = 100


class BrokerUnderTest:
    """``onceflow broker`` as a child process, with or without ``--metrics``."""

    def __init__(self, work: str, name: str, *, metrics: bool):
        self.metrics_port = restartable_port() if metrics else None
        args = ("--metrics", f"127.0.0.1:{self.metrics_port}") if metrics else ()
        self.broker = BrokerProcess(os.path.join(work, name), args=args)

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    def __enter__(self) -> "BrokerUnderTest":
        self.broker.start()
        return self

    def __exit__(self, *exc) -> None:
        self.broker.kill()


# The scraper runs as a process of its own: a thread in this process would
# contend for the GIL with the producing loop and slow the "on" rounds by
# itself (each of its socket reads hands the GIL back and forth).
SCRAPER = """
import sys, time, urllib.request
url, interval = sys.argv[1], float(sys.argv[2])
while True:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as response:
        response.read()
    print(time.perf_counter() - started, flush=True)
    time.sleep(interval)
"""


class Scraper:
    """Reads ``/metrics`` every ``interval`` seconds (from a child process)
    until stopped, timing each scrape."""

    def __init__(self, port: int, interval: float = 1.0):
        self.command = [sys.executable, "-c", SCRAPER, f"http://127.0.0.1:{port}/metrics", str(interval)]
        self.seconds: list[float] = []
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "Scraper":
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        output, _ = self.process.communicate(timeout=30)
        self.seconds = [float(line) for line in output.split()]


def served(port: int) -> tuple[float, float, float, float]:
    """(Produce requests, fsync rounds, scrapes rendered, seconds spent
    rendering them) a broker has counted (its /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {"onceflow_log_fsync_duration_seconds_count": 0.0, "onceflow_metrics_scrapes_total": 0.0, "onceflow_metrics_scrape_seconds_total": 0.0}
    requests = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "onceflow_requests_total" and sample.labels.get("api") == "Produce":
                requests += sample.value
            elif sample.name in values:
                values[sample.name] += sample.value
    return requests, *values.values()


def flush_observer_seconds(calls: int = 200_000) -> float:
    """Seconds the broker's FlushObserver takes per fsync round reported."""
    from broker.metrics import BrokerMetrics

    metrics = BrokerMetrics()
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(calls):
            metrics.flushed(0.002, 65536, 40)
        best = min(best, (time.perf_counter() - started) / calls)
    return best


def dispatch_overhead_seconds(calls: int = 200_000) -> float:
    """Seconds ``MeasuredDispatch`` adds to one Produce request (a 100-record
    batch and its answer), best of three, against the same dispatcher bare."""
    import asyncio

    from broker.metrics import BrokerMetrics, MeasuredDispatch
    from broker.security.session import Session
    from protocol.framing import DecodedRequest
    from protocol.records import encode_batch

    batch = encode_batch([(None, b"m" * RECORD_BYTES, (), 0) for _ in range(100)])
    request = DecodedRequest(api_key=0, api_version=9, correlation_id=1, client_id="bench", flexible=True,
                             body={"acks": -1, "timeout_ms": 30000, "topic_data": [{"name": "bench", "partition_data": [{"index": 0, "records": batch}]}]})
    response = {"responses": [{"name": "bench", "partition_responses": [{"index": 0, "error_code": 0, "base_offset": 0, "log_append_time_ms": -1, "log_start_offset": 0}]}], "throttle_time_ms": 0}

    async def handler(_request, _session):
        return response

    measured = MeasuredDispatch(handler, BrokerMetrics(), dict)
    session = Session()

    async def timed(dispatch) -> float:
        started = time.perf_counter()
        for _ in range(calls):
            await dispatch(request, session)
        return (time.perf_counter() - started) / calls

    async def best() -> float:
        bare = min([await timed(handler) for _ in range(3)])
        wrapped = min([await timed(measured) for _ in range(3)])
        return max(0.0, wrapped - bare)

    return asyncio.run(best())


def run_rounds(off: BrokerUnderTest, on: BrokerUnderTest, rounds: int, records: int, results: dict, load: dict, say) -> None:
    """The timed fills, off and on alternating; the "on" broker's counters
    before and after each of its fills give the rates it served."""
    for round_number in range(rounds):
        for shape, (batch_bytes, linger_ms, divisor) in SHAPES.items():
            count = records // divisor
            # Alternate which goes first, so neither always meets a warmer page cache.
            order = ((off, "off"), (on, "on")) if round_number % 2 == 0 else ((on, "on"), (off, "off"))
            for broker, label in order:
                topic = new_topic(broker.bootstrap)
                if label == "on":
                    before = served(broker.metrics_port)
                    rate = fill(broker.bootstrap, topic, b"m" * RECORD_BYTES, count, idempotent=True, batch_bytes=batch_bytes, linger_ms=linger_ms)
                    after = served(broker.metrics_port)
                    duration = count / rate
                    load[shape].append(((after[0] - before[0]) / duration, (after[1] - before[1]) / duration))
                else:
                    rate = fill(broker.bootstrap, topic, b"m" * RECORD_BYTES, count, idempotent=True, batch_bytes=batch_bytes, linger_ms=linger_ms)
                results[shape][label].append(rate)
                say(f"  round {round_number + 1}, {shape}, metrics {label}: {rate:,.0f} records/s")


def run(records: int, rounds: int, say, work_dir: str | None = None) -> dict:
    """Medians of produce records/s, off and on, per shape and their ratio,
    and the loop share the metrics take at the rates the "on" broker served."""
    work = tempfile.mkdtemp(prefix="onceflow-metrics-cost-", dir=work_dir)
    results: dict[str, dict[str, list[float]]] = {shape: {"off": [], "on": []} for shape in SHAPES}
    load: dict[str, list[tuple[float, float]]] = {shape: [] for shape in SHAPES}  # (Produce requests/s, fsync rounds/s)
    scrape_seconds: list[float] = []  # at the scraper
    rendered = (0.0, 0.0)  # (scrapes, seconds) the "on" broker's loop spent rendering
    try:
        with BrokerUnderTest(work, "off", metrics=False) as off, BrokerUnderTest(work, "on", metrics=True) as on:
            # A first, uncounted fill of each: the first topic, connections and
            # caches of a fresh process are no part of either figure.
            for broker in (off, on):
                for batch_bytes, linger_ms, divisor in SHAPES.values():
                    fill(broker.bootstrap, new_topic(broker.bootstrap), b"w" * RECORD_BYTES, max(1000, records // divisor // 10), idempotent=True, batch_bytes=batch_bytes, linger_ms=linger_ms)
            first = served(on.metrics_port)
            # One scraper for the whole run, during the "off" rounds too: its
            # own CPU (a Python process) then weighs on both alike, and only
            # the rendering falls on the "on" broker alone.
            with Scraper(on.metrics_port) as scraper:
                run_rounds(off, on, rounds, records, results, load, say)
            scrape_seconds = scraper.seconds
            last = served(on.metrics_port)
            rendered = (last[2] - first[2], last[3] - first[3])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    per_request = dispatch_overhead_seconds()
    per_round = flush_observer_seconds()
    # The broker's own account of its rendering time (the scraper's clock
    # also counts the HTTP round trip and its own process's scheduling).
    per_scrape = rendered[1] / rendered[0] if rendered[0] else 0.0
    summary = {
        "seconds added per Produce request": per_request,
        "seconds per fsync round observed": per_round,
        "seconds per scrape": per_scrape,
        "seconds per scrape at the scraper": statistics.median(scrape_seconds) if scrape_seconds else 0.0,
        "scrapes": rendered[0],
    }
    for shape, rates in results.items():
        off_median, on_median = statistics.median(rates["off"]), statistics.median(rates["on"])
        # Each round's two runs are neighbours in time: their ratio, then the
        # median of those, is steadier than a ratio of medians from different rounds.
        paired = statistics.median(on / off for on, off in zip(rates["on"], rates["off"]))
        requests_per_second = statistics.median(r for r, _ in load[shape])
        rounds_per_second = statistics.median(f for _, f in load[shape])
        request_path = per_request * requests_per_second + per_round * rounds_per_second
        summary[shape] = {
            "off records/s": off_median, "on records/s": on_median, "on/off": paired, "rounds": rates,
            "Produce requests/s": requests_per_second, "fsync rounds/s": rounds_per_second,
            # The share of the loop's time the metrics take: the request path,
            # plus scrapes every 15 s (Prometheus' default) or every second.
            "metrics share, scrape every 15 s": request_path + per_scrape / 15,
            "metrics share, scrape every 1 s": request_path + per_scrape,
        }
    return summary


def report(summary: dict, say) -> None:
    say(f"{'produce, 100 B records, acks=all':<26}{'metrics off':>12}{'metrics on':>12}{'on/off':>8}{'Produce/s':>11}{'fsyncs/s':>10}{'share @15s':>12}{'share @1s':>11}")
    for shape in SHAPES:
        row = summary[shape]
        say(f"{shape:<26}{row['off records/s']:>12,.0f}{row['on records/s']:>12,.0f}{row['on/off']:>8.3f}{row['Produce requests/s']:>11,.0f}"
            f"{row['fsync rounds/s']:>10,.0f}{row['metrics share, scrape every 15 s']:>12.2%}{row['metrics share, scrape every 1 s']:>11.2%}")
    say(f"per Produce request {summary['seconds added per Produce request'] * 1e6:.1f} us, per fsync round {summary['seconds per fsync round observed'] * 1e6:.1f} us, "
        f"per scrape {summary['seconds per scrape'] * 1e3:.1f} ms on the broker's loop ({summary['scrapes']:.0f} scrapes; "
        f"{summary['seconds per scrape at the scraper'] * 1e3:.1f} ms median at the scraper); share = those times the rates the \"on\" broker served. "
        "The aim: under 3%. on/off is end to end and moves with the machine's other load.")


def run_from_args(args) -> int:
    """``onceflow bench --metrics-cost`` (``onceflow.commands.bench`` owns the options)."""
    def say(line: str) -> None:
        print(line, flush=True)

    say(f"the cost of the broker's metrics on produce: {args.rounds} rounds, {args.records:,} records (small batches: half)")
    summary = run(args.records, args.rounds, say, work_dir=args.work_dir)
    report(summary, say)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(summary, file, indent=2)
    return 0


if __name__ == "__main__":
    from onceflow.cli import main

    sys.exit(main(["bench", "--metrics-cost", *sys.argv[1:]]))
