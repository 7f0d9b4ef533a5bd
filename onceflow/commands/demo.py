"""``onceflow demo``: the main job end to end, a stateful exactly-once
pipeline on the runner and a Spark query after it, under kills of the
broker, the pipeline's instances and the Spark driver, checked
(``faults.demo``); ``--no-spark``: the pipeline alone; ``--storage``: the
storage crash demo, one log whose writer is killed and whose tail is torn
(``faults.storage_demo``).
"""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--records", type=int, default=20_000, metavar="N", help="payment events to stream in (default 20000)")
    parser.add_argument("--seed", type=int, default=None, metavar="S", help="replay a run: the same seed gives the same events and kills (default: random, printed)")
    parser.add_argument("--keep-data", default=None, metavar="DIR", help="keep the data directory, logs and histories here (default: a temporary one, deleted)")
    parser.add_argument("--faults", type=int, default=6, metavar="N", help="how many SIGKILLs of a pipeline instance, the broker or the Spark driver (default 6)")
    parser.add_argument("--no-spark", action="store_true", help="the pipeline alone, without the Spark query (no Java needed)")
    parser.add_argument("--report", default=None, metavar="DIR", help="where report.txt, verdict.json and timeline.png go (default: report/ in the data directory, or demo-report/ when the data is deleted)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--spark-master", default=None, metavar="spark://HOST:PORT", help="run the Spark query's executors on this standalone cluster (default: local mode in the driver's JVM)")
    where.add_argument("--spark-cluster", action="store_true", help="start a Spark standalone cluster for the run (a master and two workers, from the pyspark package), run the query on it, stop it after")
    parser.add_argument("--storage", action="store_true", help="the storage crash demo instead: one log, its writer killed, its tail torn")


def run(args) -> int:
    if args.storage:
        from faults.storage_demo import run_demo

        return run_demo(records=args.records, seed=args.seed, keep_data=args.keep_data)
    from faults.demo import run_demo

    report = args.report or (None if args.keep_data else "demo-report")
    if (args.spark_master or args.spark_cluster) and args.no_spark:
        parser_error = "--spark-master and --spark-cluster run the Spark query: they do not go with --no-spark"
        import sys

        print(f"onceflow demo: {parser_error}", file=sys.stderr)
        return 2
    return run_demo(records=args.records, seed=args.seed, keep_data=args.keep_data, faults=args.faults, spark=not args.no_spark, report_dir=report,
                    spark_master=args.spark_master, spark_cluster=args.spark_cluster)
