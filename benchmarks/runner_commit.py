"""The runner's commit latency: what ``streaming.App`` observes as
``commit_seconds`` for each transaction (its output records flushed, the
input offsets sent, EndTxn), p50 and p99, for a small stateless app (one
``map`` to an output topic) fed at a steady rate, against a fresh broker
process (default durability: acknowledged after fsync).

    python -m benchmarks.runner_commit [--rate 2000] [--seconds 10] [--transaction-version 2]

The client code and the broker are this checkout's unless ``PYTHONPATH``
names another (its broker is then started from there too): how
docs/performance/runner.md measured the code before and after a change.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid


def measure(bootstrap: str, rate: int, seconds: float, state_dir: str, **options) -> list[float]:
    """Commit times (s) of an app fed ``rate`` records/s for ``seconds``."""
    import streaming
    from txn import Admin, Producer

    source, sink = f"commit-in-{uuid.uuid4().hex[:6]}", f"commit-out-{uuid.uuid4().hex[:6]}"
    with Admin(bootstrap) as admin:
        admin.create_topics({source: 1, sink: 1})
    app = streaming.App(bootstrap_servers=bootstrap, application_id=f"commit-{uuid.uuid4().hex[:6]}", state_dir=state_dir, **options)
    app.stream(source).map(lambda value: value).to(sink)
    commits: list[float] = []
    app.metrics.observers.append(lambda name, value: commits.append(value) if name == "commit_seconds" else None)

    def feed() -> None:
        producer = Producer(bootstrap, linger_ms=1)
        started = time.perf_counter()
        for index in range(int(rate * seconds)):
            pause = started + index / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            producer.send(source, b"%d" % index)
        producer.flush()
        producer.close()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    app.run(until_idle=2.0)
    feeder.join(30)
    return commits[1:]  # the first commit pays for the coordinator's and the group's first round trips


def main() -> None:
    from benchmarks.suite import percentile
    from faults.process import BrokerProcess

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--transaction-version", type=int, default=None, help="the producer's transaction_version (default: the client's own)")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help="a broker setting, e.g. transaction.durable.at.end=true")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="onceflow-bench-runner-commit-")
    broker = BrokerProcess(os.path.join(work, "broker"), "group.initial.rebalance.delay.ms=0", *args.config).start()
    try:
        options = {} if args.transaction_version is None else {"transaction_version": args.transaction_version}
        commits = measure(broker.bootstrap, args.rate, args.seconds, os.path.join(work, "state"), **options)
        print(f"runner commit over {len(commits)} transactions at {args.rate} records/s: p50 {percentile(commits, 50) * 1000:.2f} ms,"
              f" p99 {percentile(commits, 99) * 1000:.2f} ms, mean {statistics.mean(commits) * 1000:.2f} ms")
    finally:
        broker.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
