"""`onceflow bench --restart`: what a broker's start, stop and topic creation
cost as the number of partitions grows, for this checkout and, in the same
run, for another one (``--baseline DIR``, e.g. a ``git worktree`` of the code
before a change), so the figures compare as ratios on a noisy machine.

    onceflow bench --restart [--restart-partitions 100,1000,10000] [--baseline DIR] [--json FILE]
    python -m benchmarks.restart_bench ...        (the same)

For each partition count N, each checkout runs a broker process (``python
-m onceflow broker`` from that checkout, on a fresh data directory, default
settings) through what an operator does, timing each step from outside:

- create: N/10 topics of 10 partitions in one CreateTopics call (confluent-kafka's
  AdminClient), until every topic is answered;
- one small record to every partition (acks=all), then a clean stop (SIGTERM
  until the process has exited: ``clean stop``);
- ``restart after clean stop``: from starting the process to its ready line;
- one record to 10 partitions, SIGKILL, and ``restart after SIGKILL``: the
  other partitions are idle since the clean stop;
- one record to every partition, SIGKILL, and ``restart after SIGKILL, all
  written``: every partition changed since it was last whole, the worst case;
- the broker's RSS (VmRSS) right after each of those restarts.

A start is timed from ``Popen`` to the ready line, so it includes starting
the interpreter and importing the broker: the ``start, no topics`` row is
that floor (a fresh data directory, only the internal topics).

The broker processes import from compiled bytecode, as an installed
package does (pip compiles a wheel's modules when it installs them): each
checkout's start-up is compiled once, by one untimed start, into a cache of
the run's own (``PYTHONPYCACHEPREFIX`` in the work directory; nothing is
written into the checkouts). Without it, in an environment that sets
``PYTHONDONTWRITEBYTECODE`` (as ours does), every start compiled all of the
broker's modules from source again.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

from benchmarks.memory import ProcessMemory
from benchmarks.suite import REPO
from faults.process import BrokerProcess

PER_TOPIC = 10
TOUCHED = 10  # partitions written between the clean restart and the SIGKILL
START_TIMEOUT_S = 600


class Broker:
    """One broker process of one checkout on one data directory
    (``faults.process.BrokerProcess``), its starts and stops timed."""

    def __init__(self, checkout: str, data_dir: str, log_path: str, env: dict[str, str | None] | None = None):
        self.checkout = checkout
        self.process = BrokerProcess(data_dir, checkout=checkout, log_path=log_path, env=env)

    @property
    def bootstrap(self) -> str:
        return self.process.bootstrap

    def start(self) -> float:
        """Start and wait for the ready line; seconds it took."""
        began = time.perf_counter()
        self.process.start(timeout=START_TIMEOUT_S)
        return time.perf_counter() - began

    def rss_mib(self) -> float:
        return ProcessMemory.of(self.process.process.pid).rss / 2**20

    def stop(self) -> float:
        """SIGTERM and wait for the exit; seconds it took."""
        began = time.perf_counter()
        code = self.process.terminate(START_TIMEOUT_S)
        if code != 0:
            raise RuntimeError(f"clean stop of the broker of {self.checkout} exited {code} (see {self.process.log_path})")
        return time.perf_counter() - began

    def kill(self) -> None:
        self.process.kill()


def create_topics(bootstrap: str, topics: int) -> float:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 300_000})
    began = time.perf_counter()
    futures = admin.create_topics([NewTopic(f"t{index}", PER_TOPIC, 1) for index in range(topics)], operation_timeout=300, request_timeout=300)
    for future in futures.values():
        future.result(600)
    return time.perf_counter() - began


def write_one_each(bootstrap: str, partitions: list[tuple[str, int]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for topic, partition in partitions:
        while True:
            try:
                producer.produce(topic, b"x" * 100, partition=partition)
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(600) != 0:
        raise RuntimeError("records were not acknowledged")


def bytecode_env(cache_dir: str) -> dict[str, str | None]:
    """The changes to this process's environment that have bytecode read
    from and written to ``cache_dir``, as an installed package has it
    compiled (None: the variable is removed)."""
    return {"PYTHONDONTWRITEBYTECODE": None, "PYTHONPYCACHEPREFIX": cache_dir}


def measure(checkout: str, partitions: int, work: str, say, env: dict[str, str] | None = None) -> dict[str, float]:
    data_dir = os.path.join(work, "data")
    broker = Broker(checkout, data_dir, os.path.join(work, "broker.log"), env)
    figures: dict[str, float] = {}
    try:
        broker.start()
        topics = partitions // PER_TOPIC
        every = [(f"t{index}", partition) for index in range(topics) for partition in range(PER_TOPIC)]
        figures["create"] = create_topics(broker.bootstrap, topics)
        write_one_each(broker.bootstrap, every)
        figures["clean stop"] = broker.stop()
        figures["restart after clean stop"] = broker.start()
        figures["RSS after clean restart, MiB"] = broker.rss_mib()
        write_one_each(broker.bootstrap, every[:TOUCHED])
        broker.kill()
        figures["restart after SIGKILL"] = broker.start()
        figures["RSS after SIGKILL restart, MiB"] = broker.rss_mib()
        write_one_each(broker.bootstrap, every)
        broker.kill()
        figures["restart after SIGKILL, all written"] = broker.start()
        figures["RSS after SIGKILL restart, all written, MiB"] = broker.rss_mib()
        broker.stop()
    finally:
        broker.kill()
    say("    " + ", ".join(f"{name} {value:.2f}" for name, value in figures.items()))
    return figures


def floor(checkout: str, work: str, env: dict[str, str] | None = None) -> float:
    """Start to ready on a fresh data directory: the interpreter, the imports
    and the internal topics."""
    broker = Broker(checkout, os.path.join(work, "empty"), os.path.join(work, "empty.log"), env)
    try:
        elapsed = broker.start()
        broker.stop()
    finally:
        broker.kill()
    return elapsed


def run(counts: list[int], checkouts: dict[str, str], say, work_dir: str | None = None) -> list[dict]:
    """Every size for every checkout, the checkouts taking turns at each size
    (so that a change in the machine's load falls on both alike)."""
    rows = []
    work = tempfile.mkdtemp(prefix="onceflow-restart-", dir=work_dir)
    env = bytecode_env(os.path.join(work, "bytecode"))
    try:
        for label, checkout in checkouts.items():  # compile what a start imports, untimed
            warm_dir = os.path.join(work, f"{label.replace(' ', '-')}-warm")
            os.makedirs(warm_dir)
            try:
                floor(checkout, warm_dir, env)
            except Exception as error:  # its timed runs will fail and say so; the other checkout's go on
                say(f"  {label}: the untimed first start failed: {error}")
            finally:
                shutil.rmtree(warm_dir, ignore_errors=True)
        for count in [0, *counts]:
            for label, checkout in checkouts.items():
                run_dir = os.path.join(work, f"{label.replace(' ', '-')}-{count}")
                os.makedirs(run_dir)
                try:
                    if count == 0:
                        figures = {"start, no topics": floor(checkout, run_dir, env)}
                        say(f"  {label}: start, no topics {figures['start, no topics']:.2f} s")
                    else:
                        say(f"  {label}: {count} partitions ...")
                        figures = measure(checkout, count, run_dir, say, env)
                    rows.append({"checkout": label, "partitions": count, **figures})
                except Exception as error:  # one failed size must not hide the others
                    say(f"  {label}: {count} partitions failed: {error}")
                    rows.append({"checkout": label, "partitions": count, "error": str(error)})
                finally:
                    shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def report(rows: list[dict], checkouts: list[str], say) -> None:
    """One table per partition count: each step, each checkout, and this
    checkout's figure over the first other one's."""
    say("")
    ours = checkouts[0]
    other = checkouts[1] if len(checkouts) > 1 else None
    for count in sorted({row["partitions"] for row in rows}):
        by_checkout = {row["checkout"]: row for row in rows if row["partitions"] == count}
        names = [name for name in by_checkout.get(ours, {}) if name not in ("checkout", "partitions", "error")]
        if not names:
            continue
        header = f"{count} partitions" if count else "no topics"
        say(f"| {header} | " + " | ".join(checkouts) + (f" | {ours} / {other} |" if other else " |"))
        say("| --- " * (len(checkouts) + 1 + (1 if other else 0)) + "|")
        for name in names:
            values = [by_checkout.get(label, {}).get(name) for label in checkouts]
            cells = [f"{value:.2f}" if isinstance(value, float) else "n/a" for value in values]
            ratio = ""
            if other:
                mine, theirs = values[0], values[1]
                ratio = f" | {mine / theirs:.2f}" if isinstance(mine, float) and isinstance(theirs, float) and theirs > 0 else " | n/a"
            unit = "" if "MiB" in name else " s"
            say(f"| {name}{unit} | " + " | ".join(cells) + ratio + " |")
        say("")


def run_from_args(args) -> int:
    """``onceflow bench --restart`` (``onceflow.commands.bench`` owns the options)."""
    def say(line: str) -> None:
        print(line, flush=True)

    counts = [int(part) for part in args.restart_partitions.split(",") if part.strip()]
    checkouts = {"this checkout": REPO}
    if args.baseline:
        checkouts["baseline"] = os.path.abspath(args.baseline)
    rows = run(counts, checkouts, say, work_dir=args.work_dir)
    report(rows, list(checkouts), say)
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"counts": counts, "checkouts": checkouts, "rows": rows}, file, indent=2)
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    from onceflow.cli import main

    sys.exit(main(["bench", "--restart", *sys.argv[1:]]))
