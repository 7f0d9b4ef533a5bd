"""``onceflow spark-cluster start|stop``: a Spark standalone cluster on this
machine from the pyspark wheel (``streaming.spark.cluster``).

    onceflow spark-cluster start [--dir DIR] [--workers 2] [--worker-cores 1] [--worker-memory 1g]
    onceflow spark-cluster stop [--dir DIR]

``start`` returns once every worker registered with the master, prints the
master's URL (for ``spark-submit --master`` or
``SparkSession.builder.master``), its web UI and where the logs are, and
leaves the cluster running with its state in DIR. ``stop`` ends every
process of the cluster in DIR (daemons, executors, their Python workers).
Exit 2 when the cluster cannot start (with the failing daemon's log tail)
or DIR holds no cluster's state.
"""

from __future__ import annotations

import sys

DEFAULT_DIRECTORY = "onceflow-spark-cluster"


def add_arguments(parser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser("start", help="start a master and its workers, print the master's URL", description="start a master and its workers, print the master's URL; the cluster keeps running")
    start.add_argument("--workers", type=int, default=2, help="how many workers (default 2)")
    start.add_argument("--worker-cores", type=int, default=1, help="cores each worker offers its executors (default 1)")
    start.add_argument("--worker-memory", default="1g", help="memory each worker offers its executors (default 1g)")
    start.add_argument("--host", default="127.0.0.1", help="the address every daemon binds and the driver must reach (default 127.0.0.1)")
    stop = actions.add_parser("stop", help="stop every process of the cluster", description="stop every process of the cluster: daemons, executors and their Python workers")
    for action in (start, stop):
        action.add_argument("--dir", default=DEFAULT_DIRECTORY, metavar="DIR", help=f"the cluster's state, logs and work directories (default ./{DEFAULT_DIRECTORY})")


def run(args) -> int:
    from streaming.spark import cluster

    try:
        if args.action == "start":
            if min(args.workers, args.worker_cores) < 1:
                raise cluster.ClusterError("--workers and --worker-cores must be at least 1")
            settings = cluster.ClusterSettings(workers=args.workers, worker_cores=args.worker_cores, worker_memory=args.worker_memory, host=args.host)
            started = cluster.start(args.dir, settings)
            print(f"onceflow spark-cluster: master {started.master_url}, web UI {started.web_ui}, {settings.workers} workers")
            print(f"logs in {started.logs}, executors' output in {started.directory}/work")
            print(f"stop it with: onceflow spark-cluster stop --dir {started.directory}")
            return 0
        cluster.load(args.dir)  # refuses a directory that never held a cluster
        stopped = cluster.stop(args.dir)
        print(f"onceflow spark-cluster: stopped {len(stopped)} processes of {args.dir}")
        return 0
    except cluster.ClusterError as error:
        print(f"onceflow spark-cluster: {error}", file=sys.stderr)
        return 2
