"""The fault-injection harness: how users (and we) test crash and recovery.

- ``points``: named crash points; the broker and our producer call a
  crash-point callable they are given, and whoever composes them passes
  ``points.point`` (``broker.broker.FaultSeams``, the harness's workloads);
- ``process``: broker and client processes to SIGKILL, SIGTERM, SIGSTOP/SIGCONT and restart;
- ``proxy``: a TCP proxy that cuts, refuses, blackholes, delays, holds and
  delays or drops chosen Kafka requests (EndTxn, say);
- ``disk``: torn tails and flipped bytes on a stopped broker, failing writes
  and fsyncs on a running one;
- ``workloads`` and ``history``: processes that do work and record it;
- ``spark``: a user's Spark query as a driver process to SIGKILL (JVM and
  Python workers) and restart from its checkpoint, and the query module
  convention of ``onceflow chaos --workload spark``;
- ``checker``: the exactly-once checker over a history;
- ``chaos`` and ``report``: ``run_chaos`` (``onceflow chaos``), a seeded
  schedule of faults over a workload, with a report folder;
- ``demo`` and ``storage_demo``: ``onceflow demo`` (the pipeline on the
  runner and a Spark query after it, under kills) and ``onceflow demo --storage`` (one log under kills).

This package imports nothing at import time, so ``faults.points`` costs a
composition root nothing but itself.
"""
