"""``onceflow demo``: the main job, a stateful exactly-once pipeline under
broker and pipeline kills, checked (``faults.demo``); ``--storage``: the
storage crash demo, one log whose writer is killed and whose tail is torn
(``faults.storage_demo``).
"""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--records", type=int, default=20_000, metavar="N", help="payment events to stream in (default 20000)")
    parser.add_argument("--seed", type=int, default=None, metavar="S", help="replay a run: the same seed gives the same events and kills (default: random, printed)")
    parser.add_argument("--keep-data", default=None, metavar="DIR", help="keep the data directory, logs and histories here (default: a temporary one, deleted)")
    parser.add_argument("--faults", type=int, default=6, metavar="N", help="how many kills of the pipeline or the broker (default 6)")
    parser.add_argument("--storage", action="store_true", help="the storage crash demo instead: one log, its writer killed, its tail torn")


def run(args) -> int:
    if args.storage:
        from faults.storage_demo import run_demo

        return run_demo(records=args.records, seed=args.seed, keep_data=args.keep_data)
    from faults.demo import run_pipeline_demo

    return run_pipeline_demo(records=args.records, seed=args.seed, keep_data=args.keep_data, faults=args.faults)
