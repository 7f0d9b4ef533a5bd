"""``onceflow bench``: every benchmark scenario against our broker and
beside Tansu, with the machine's limits, in one run (``benchmarks.suite``).

The benchmarks are not part of the installed package (users do not import
them): they run from a checkout of the repository (``pip install -e
'.[bench]'``), found beside this ``onceflow`` package when the import path
does not have them. Installed from a wheel, the command says so in one line
and exits 2.
"""

from __future__ import annotations

import importlib
import os
import sys

# The checkout this onceflow package sits in, if it sits in one.
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def add_arguments(parser) -> None:
    parser.add_argument("--rounds", type=int, default=3, metavar="N", help="rounds per broker; the table shows medians (default 3)")
    parser.add_argument("--records", type=int, default=1_000_000, metavar="N",
                        help="records per produce/consume scenario (1 KiB scenarios use a quarter); at 200,000 a round lasted about 0.2 s, short enough for one stall of a loaded machine to halve it (default 1000000)")
    parser.add_argument("--seconds", type=float, default=3.0, metavar="S", help="length of the timed scenarios (transactions, latency) (default 3)")
    parser.add_argument("--copier-records", type=int, default=50_000, metavar="N", help="records through the exactly-once copier (default 50000)")
    parser.add_argument("--latency-rate", type=int, default=2_000, metavar="N", help="records/s for the end-to-end latency scenario (default 2000)")
    parser.add_argument("--only", default=None, metavar="PREFIX;...",
                        help='semicolon-separated scenario name prefixes (names hold commas), e.g. "produce 100 B, acks=all;consume"')
    parser.add_argument("--no-peer", action="store_true", help="skip Tansu")
    parser.add_argument("--work-dir", default=None, metavar="DIR", help="where our broker keeps its data (default: a temp dir)")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for our broker, e.g. flush.policy=os to see what the fsyncs cost (default: its defaults)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write settings, limits, medians and every round here")
    parser.add_argument("--png", default=None, metavar="FILE", help="also draw the table as a chart here (needs matplotlib)")
    parser.add_argument("--spark", action="store_true", help="also the Spark data source scenarios (a local Spark session each; minutes)")
    parser.add_argument("--spark-rows", type=int, default=1_000_000, metavar="N", help="rows of the Spark throughput scenarios (default 1000000)")
    parser.add_argument("--metrics-cost", action="store_true", help="instead of the broker scenarios: produce throughput with the broker's Prometheus metrics off and on, alternating, and their ratio (benchmarks.metrics_cost)")
    restart = parser.add_argument_group("start, stop and topic creation as partitions grow (benchmarks.restart_bench)")
    restart.add_argument("--restart", action="store_true", help="instead of the broker scenarios: restart and topic-creation times and RSS at each --restart-partitions")
    restart.add_argument("--restart-partitions", default="100,1000,10000", metavar="N,...", help="partition counts, 10 per topic (default 100,1000,10000)")
    restart.add_argument("--baseline", default=None, metavar="DIR", help="another checkout measured in the same run, e.g. a git worktree of the code before a change")
    runner = parser.add_argument_group("the streaming runner beside Quix Streams 3 (benchmarks.runner_bench)")
    runner.add_argument("--runner", action="store_true", help="instead of the broker scenarios: onceflow's runner and Quix Streams, exactly once, the same apps on our broker")
    runner.add_argument("--runner-records", type=int, default=30_000, metavar="N", help="payments per throughput scenario (default 30000)")
    runner.add_argument("--runner-partitions", type=int, default=2, metavar="N", help="partitions of the throughput and latency scenarios' topics (default 2)")
    runner.add_argument("--runner-only", default=None, metavar="TEXT", help="only the scenarios whose name contains TEXT, e.g. '1 instance' (default all)")
    runner.add_argument("--runner-latency-rate", type=int, default=500, metavar="N", help="records/s fed in the latency scenario (default 500)")
    runner.add_argument("--runner-latency-seconds", type=float, default=5.0, metavar="S", help="length of the latency scenario (default 5)")
    runner.add_argument("--restore-keys", type=int, default=1_000_000, metavar="N", help="keys of the store restored from its changelog, 0 to skip (default 1000000)")
    recovery = parser.add_argument_group("recovery time after faults (benchmarks.recovery)")
    recovery.add_argument("--recovery", action="store_true", help="instead of the broker scenarios: how long each fault stops the exactly-once copier, beside the targets")
    recovery.add_argument("--recovery-faults", default=None, metavar="KIND,...", help="fault kinds (default: kill-client,kill-broker,pause-broker)")
    recovery.add_argument("--recovery-rounds", type=int, default=3, metavar="N", help="chaos runs per fault kind (default 3)")
    recovery.add_argument("--recovery-seconds", type=float, default=24.0, metavar="S", help="length of each run (about 4 faults each) (default 24)")
    recovery.add_argument("--recovery-workload", default="copier", choices=["copier", "copier-confluent", "copier-librdkafka", "streaming"],
                          help="the pipeline: the copier (our client; copier-confluent, copier-librdkafka: on confluent-kafka, see faults.workloads), or examples/enrichment.py on the streaming runner (default copier)")
    recovery.add_argument("--recovery-rate", type=int, default=300, metavar="N", help="input records/s (default 300)")
    recovery.add_argument("--recovery-identity", default="given", choices=["given", "state-dir"],
                          help="(streaming) each instance's identity: ONCEFLOW_INSTANCE_ID given by the harness, or kept in its state directory and lost with it (default given)")
    runner.add_argument("--commit-interval-ms", type=int, default=100, metavar="MS", help="both frameworks' commit interval (default 100, the runner's)")


def benchmark_suite():
    """``benchmarks.suite``, from the import path or else from the checkout; None if neither has it."""
    try:
        return importlib.import_module("benchmarks.suite")
    except ModuleNotFoundError as error:
        if error.name not in ("benchmarks", "benchmarks.suite"):
            raise
    if not os.path.isfile(os.path.join(CHECKOUT, "benchmarks", "suite.py")):
        return None
    # An editable install maps only the packaged packages; the benchmarks
    # live beside them in the checkout.
    sys.path.append(CHECKOUT)
    return importlib.import_module("benchmarks.suite")


def run(args) -> int:
    suite = benchmark_suite()
    if suite is None:
        print("onceflow bench: the benchmarks are not installed with onceflow; run it from a checkout of the repository (pip install -e '.[bench]')", file=sys.stderr)
        return 2
    return suite.run_suite(args)
