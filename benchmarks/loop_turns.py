"""Turns of the broker's event loop, callbacks run and tasks created per
one-record librdkafka transaction: the loop's own share of the broker's CPU
per transaction (issue 32), counted rather than timed, so that a change can
be judged on a shared machine where CPU time moves from run to run.

    python -m benchmarks.loop_turns [--baseline DIR] [--transactions 300] [--config KEY=VALUE ...] [--calls]

The broker runs in this process (``EmbeddedBroker``) on asyncio's own loop,
whose ``_run_once`` (one turn) and ``create_task`` are wrapped with counters
before it starts; confluent-kafka (librdkafka, its own C threads) runs
begin, produce, flush, commit against it, 20 transactions to warm up, then
``--transactions`` counted ones. Tasks are also counted by the coroutine
they run; ``--calls`` adds the Python and C calls the broker's threads
make (a profile hook counts them: as exact as the turns, and it weighs
the Python work the loop's counts leave out). ``--baseline DIR`` runs the same in a fresh interpreter from
another checkout (a copy of the code before a change) and prints both.
Counts depend on timing only a little (a client's request arriving before
or after a round ends), so a few transactions' worth of difference is noise.
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.base_events
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import uuid

from benchmarks.suite import REPO


def count_transactions(transactions: int, config: list[str], calls: bool = False) -> dict[str, float]:
    """Per transaction: loop turns, callbacks run, tasks created (and by
    coroutine); with ``calls``, also the Python function calls (a
    coroutine's resumption counts as one) and calls into C functions made
    by the broker's threads, counted by a profile hook (which slows them
    several times over)."""
    counts: collections.Counter = collections.Counter()
    if calls:
        def count_call(_frame, event, _arg):
            if event == "call" or event == "c_call":
                counts[f"{event.replace('_', ' ')}s (--calls)"] += 1

        threading.setprofile(count_call)  # the threads started from here on: the broker's
    loop_class = asyncio.base_events.BaseEventLoop
    run_once, create_task = loop_class._run_once, loop_class.create_task

    def counted_run_once(loop):
        counts["turns"] += 1
        counts["callbacks"] += len(loop._ready)
        return run_once(loop)

    def counted_create_task(loop, coroutine, **options):
        counts["tasks"] += 1
        name = getattr(coroutine, "__qualname__", None) or getattr(coroutine, "__name__", type(coroutine).__name__)
        counts[f"tasks running {name}"] += 1
        return create_task(loop, coroutine, **options)

    loop_class._run_once, loop_class.create_task = counted_run_once, counted_create_task
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from broker.broker import EmbeddedBroker

    properties = {"group.initial.rebalance.delay.ms": "0", **dict(setting.split("=", 1) for setting in config)}
    with tempfile.TemporaryDirectory(prefix="onceflow-loop-turns-") as data_dir, EmbeddedBroker(data_dir, properties=properties) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # held: a client collected mid-call fails the call
        admin.create_topics([NewTopic("turns", 1, 1)])["turns"].result(15)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"turns-{uuid.uuid4().hex[:8]}", "linger.ms": 1})
        producer.init_transactions(30)

        def run(count: int) -> None:
            for _ in range(count):
                producer.begin_transaction()
                producer.produce("turns", b"t" * 100, partition=0)
                producer.flush(30)
                producer.commit_transaction(30)

        run(20)
        before = collections.Counter(counts)
        run(transactions)
        measured = counts - before
    threading.setprofile(None)
    if not measured["turns"]:
        raise SystemExit("no loop turns counted: the broker's loop is not asyncio's own (uvloop?); this count needs asyncio's loop")
    return {name: round(value / transactions, 2) for name, value in sorted(measured.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", metavar="DIR", help="another checkout, counted the same way in a fresh interpreter")
    parser.add_argument("--transactions", type=int, default=300)
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help="a broker setting (repeatable)")
    parser.add_argument("--calls", action="store_true", help="also count Python and C calls on the broker's threads (slow)")
    parser.add_argument("--json", action="store_true", help="print the counts of this checkout as JSON only")
    args = parser.parse_args(argv)
    this = count_transactions(args.transactions, args.config, args.calls)
    if args.json:
        print(json.dumps(this))
        return 0
    columns = {"this": this}
    if args.baseline:
        checkout = os.path.abspath(args.baseline)
        # This file, run as a script from there: the baseline need not have it.
        command = [sys.executable, os.path.abspath(__file__), "--json", "--transactions", str(args.transactions)]
        command += [option for setting in args.config for option in ("--config", setting)] + (["--calls"] if args.calls else [])
        environment = dict(os.environ, PYTHONPATH=checkout)
        output = subprocess.run(command, cwd=checkout, env=environment, check=True, capture_output=True, text=True).stdout
        columns["baseline"] = json.loads(output.strip().splitlines()[-1])
    names = sorted(set().union(*columns.values()), key=lambda name: (name.startswith("tasks running"), name))
    print(f"per one-record librdkafka transaction ({args.transactions} counted; {REPO if not args.baseline else 'this / ' + args.baseline})")
    print("| count | " + " | ".join(columns) + " |")
    print("| --- " * (len(columns) + 1) + "|")
    for name in names:
        print(f"| {name} | " + " | ".join(f"{column.get(name, 0):g}" for column in columns.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
