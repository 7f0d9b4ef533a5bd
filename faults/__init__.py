"""The fault-injection harness: how users (and we) test crash and recovery.

- ``points``: named crash points; the broker and our producer call a
  crash-point callable they are given, and whoever composes them passes
  ``points.point`` (``broker.broker.FaultSeams``, the harness's workloads);
- ``process``: broker and client processes to SIGKILL, SIGTERM, SIGSTOP/SIGCONT
  and restart (``BrokerProcess``: the one broker launcher, the tests' and the
  benchmarks' too);
- ``proxy``: a TCP proxy that cuts, refuses, blackholes, delays, holds and
  delays or drops chosen Kafka requests (EndTxn, say); ``proxy_state`` is
  its sans-I/O part, ``proxy_schedule`` its seeded schedules of faults;
- ``disk``: torn tails and flipped bytes on a stopped broker, failing writes
  and fsyncs on a running one;
- ``workloads`` and ``history``: processes that do work and record it;
  ``watcher``: threads that sample a running pipeline's progress;
- ``spark``: a user's Spark query as a driver process to SIGKILL (JVM and
  Python workers) and restart from its checkpoint, and the query module
  convention of ``onceflow chaos --workload spark``;
- ``checker``: the exactly-once checker over a history; ``availability``:
  how long each fault stopped the pipeline;
- ``chaos`` and ``report``: ``run_chaos`` (``onceflow chaos``), a seeded
  schedule of faults over a workload, with a report folder;
- ``demo`` and ``storage_demo``: ``onceflow demo`` (the pipeline on the
  runner and a Spark query after it, under kills) and ``onceflow demo --storage`` (one log under kills);
- ``certificates``: a throw-away CA for TLS runs (tests, the TLS benchmark).

This package imports nothing at import time, so ``faults.points`` costs a
composition root nothing but itself.
"""
