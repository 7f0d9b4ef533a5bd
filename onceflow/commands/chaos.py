"""``onceflow chaos``: a workload under a seeded schedule of faults, then the
exactly-once checker and a report folder (``faults.chaos.run_chaos``); exit 1
on any anomaly, 2 on bad settings.
"""

from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    from faults.chaos import FAULT_KINDS, WORKLOAD_KINDS

    parser.add_argument("--workload", choices=WORKLOAD_KINDS, default="copier", help="what runs under the faults (default copier)")
    parser.add_argument("--faults", default="kill-broker,kill-client,proxy-cut", metavar="F,...", help=f"comma-separated fault kinds, from: {', '.join(FAULT_KINDS)} (default kill-broker,kill-client,proxy-cut)")
    parser.add_argument("--duration", type=float, default=60.0, metavar="S", help="seconds the workload runs under faults, then they heal (default 60)")
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="the same seed replays the same schedule (default 0)")
    parser.add_argument("--records", type=int, default=20_000, metavar="N", help="input records (copier), sends per producer process (producer) (default 20000)")
    parser.add_argument("--clients", type=int, default=2, metavar="N", help="workload processes (default 2)")
    parser.add_argument("--abort-ratio", type=float, default=0.1, metavar="R", help="share of transactions aborted on purpose (default 0.1)")
    parser.add_argument("--mean-fault-interval", type=float, default=5.0, metavar="S", help="mean seconds between faults (default 5)")
    parser.add_argument("--report", default="chaos-report", metavar="DIR", help="where the history, verdict, summary and timeline go (default chaos-report)")
    parser.add_argument("--app", default="", metavar="MODULE", help="(streaming) the app module, a .py path or a module name, following the convention in faults.workloads")
    parser.add_argument("--query", default="", metavar="MODULE", help="(spark) the module that builds the Spark query, a .py path or a module name, following the convention in faults.spark")
    parser.add_argument("--broker-config", action="append", default=[], metavar="KEY=VALUE", help="a setting for the broker under test, e.g. transaction.durable.at.end=true (repeatable)")


def run(args) -> int:
    from faults.chaos import ChaosSettings, run_chaos

    try:
        settings = ChaosSettings(workload=args.workload, faults=tuple(f for f in args.faults.split(",") if f), duration=args.duration, seed=args.seed,
                                 records=args.records, clients=args.clients, abort_ratio=args.abort_ratio, mean_fault_interval=args.mean_fault_interval,
                                 app=args.app, query=args.query, broker_config=tuple(args.broker_config))
    except ValueError as error:
        print(f"onceflow chaos: {error}", file=sys.stderr)
        return 2
    if settings.workload == "spark":
        from faults.spark import java_missing

        problem = java_missing()
        if problem:
            print(f"onceflow chaos: {problem}", file=sys.stderr)
            return 2
    verdict = run_chaos(settings, args.report)
    return 0 if verdict.valid else 1
