"""The sink's crash point hook for queries on the test cluster
(test_spark_cluster.py): it records which process passes the executor's
crash point, and can hold one task there, mid-write, until the test kills
its worker.

The session names a folder in ``CLUSTER_HOOK_DIR`` (``spark.executorEnv``,
which Spark hands to every Python worker of the query). At
``spark_sink.task_before_handle`` (rows sent, transaction open, no handle
returned) every pass appends ``pid role python`` to ``passes``, the role
being the cluster's mark (``worker-1``...; empty outside the cluster). When
the folder holds ``armed``, the first task to pass claims ``held``, waits a
second (its rows reach the broker, uncommitted), writes its pid and role
there and sleeps: the test then SIGKILLs its worker. Later passes go on.
"""

from __future__ import annotations

import os
import sys
import time

HOOK_DIR = "CLUSTER_HOOK_DIR"
ROLE = "ONCEFLOW_SPARK_CLUSTER_ROLE"  # streaming.spark.cluster.ROLE_VARIABLE (not imported: a worker imports only this)
POINT = "spark_sink.task_before_handle"
HOLD_SECONDS = 300


def hold_first_task(name: str) -> None:
    folder = os.environ.get(HOOK_DIR)
    if name != POINT or not folder:
        return
    role = os.environ.get(ROLE, "")
    with open(os.path.join(folder, "passes"), "a") as file:
        file.write(f"{os.getpid()} {role} {sys.executable}\n")
    if not os.path.exists(os.path.join(folder, "armed")):
        return
    try:
        claim = os.open(os.path.join(folder, "held.claim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(claim)
    time.sleep(1.0)  # the producer sends what it was given meanwhile
    with open(os.path.join(folder, "held.tmp"), "w") as file:
        file.write(f"{os.getpid()} {role}\n")
    os.replace(os.path.join(folder, "held.tmp"), os.path.join(folder, "held"))
    time.sleep(HOLD_SECONDS)
