"""The concurrency scenarios of `onceflow bench`: N clients at once, each
waiting for its own small acks=all requests, records/s against N.

- idempotent producers: N confluent-kafka producers (idempotent, acks=all),
  producer i writing to partition i of one N-partition topic; each sends a
  batch of ``BATCH_RECORDS`` records of 100 B and waits for its
  acknowledgement (``flush()``), again and again, so a broker that fsyncs
  each request on its own is held at (fsyncs/s x ``BATCH_RECORDS``) however
  large N is, and one that shares its fsyncs grows with N;
- transactional copiers: N transactional producers, each a transaction of
  ``BATCH_RECORDS`` records into its own output partition plus the input
  offsets of its own consumer group (what an exactly-once copier writes:
  AddPartitionsToTxn, Produce, AddOffsetsToTxn, TxnOffsetCommit, EndTxn,
  the markers in the output partition and in ``__consumer_offsets``), commit,
  again and again. The copier's read is left out: it is not on the durable
  path this scenario measures.

Every point runs for ``--seconds`` (at most ``POINT_SECONDS``), all N clients
started together; the figure is every acknowledged record over the
wall-clock time. ``chart`` draws records/s against N for both brokers with
the machine's fsync rate beside the producers (the ceiling of a broker that
fsyncs each request alone).
"""

from __future__ import annotations

import threading
import time
import uuid

CONCURRENCY = (1, 4, 16, 64)
BATCH_RECORDS = 10
VALUE = b"n" * 100
POINT_SECONDS = 3.0


def _run_clients(count: int, seconds: float, make_client, step) -> float:
    """``count`` threads each make a client (``make_client(i)``: connected
    and warmed up, in parallel), then, all started together, run
    ``step(client, i)`` (returning records acknowledged) until the time is
    up; returns records/s over the wall clock."""
    totals = [0] * count
    errors: list[BaseException] = []
    start_line = threading.Barrier(count + 1)
    stop = threading.Event()

    def work(index: int) -> None:
        try:
            client = make_client(index)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
            start_line.abort()
            return
        try:
            start_line.wait()
            while not stop.is_set():
                totals[index] += step(client, index)
        except threading.BrokenBarrierError:
            pass
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
            stop.set()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    try:
        start_line.wait(120)
    except threading.BrokenBarrierError:
        pass
    began = time.perf_counter()
    if not errors:
        stop.wait(seconds)
    stop.set()
    for thread in threads:
        thread.join(60)
    elapsed = time.perf_counter() - began
    if errors:
        raise RuntimeError(f"{len(errors)} of {count} clients failed: {errors[0]!r}")
    return sum(totals) / elapsed


def idempotent_producers(bootstrap: str, count: int, seconds: float) -> float:
    from confluent_kafka import Producer

    from benchmarks.suite import new_topic

    topic = new_topic(bootstrap, count)

    def make(index: int):
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                             "linger.ms": 1000})  # flush() sends at once: one request per batch
        producer.produce(topic, VALUE, partition=index)  # connect and get a producer id before the clock starts
        if producer.flush(30) != 0:
            raise RuntimeError("the warm-up record was not acknowledged")
        return producer

    def step(producer, index: int) -> int:
        for _ in range(BATCH_RECORDS):
            producer.produce(topic, VALUE, partition=index)
        if producer.flush(30) != 0:
            raise RuntimeError("records left unacknowledged")
        return BATCH_RECORDS

    return _run_clients(count, seconds, make, step)


def transactional_copiers(bootstrap: str, count: int, seconds: float) -> float:
    from confluent_kafka import Consumer, Producer, TopicPartition

    from benchmarks.suite import new_topic

    source, sink = new_topic(bootstrap, count), new_topic(bootstrap, count)
    run = uuid.uuid4().hex[:6]
    positions = [0] * count

    def make(index: int):
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"conc-{run}-{index}", "linger.ms": 1000})
        producer.init_transactions(30)
        group = Consumer({"bootstrap.servers": bootstrap, "group.id": f"conc-{run}-{index}", "enable.auto.commit": False})
        return producer, group.consumer_group_metadata(), group

    def step(client, index: int) -> int:
        producer, group_metadata, _group = client
        producer.begin_transaction()
        for _ in range(BATCH_RECORDS):
            producer.produce(sink, VALUE, partition=index)
        positions[index] += BATCH_RECORDS
        producer.send_offsets_to_transaction([TopicPartition(source, index, positions[index])], group_metadata, 30)
        producer.commit_transaction(30)
        return BATCH_RECORDS

    return _run_clients(count, seconds, make, step)


def concurrency_scenario(point):
    """A bench scenario (``benchmarks.suite.Scenario.run``): ``point`` at every N."""

    def run(bootstrap: str, settings) -> dict:
        from benchmarks.suite import ROUNDS, Metric, rounds_metrics

        seconds = min(settings.seconds, POINT_SECONDS)
        figures, counts = {}, {}
        for n in CONCURRENCY:
            with ROUNDS.window() as counted:
                figures[f"records/s, N={n}"] = Metric(point(bootstrap, n, seconds), "records/s")
            counts.update(rounds_metrics(counted, f", N={n}"))
        return {**figures, **counts}

    return run


def chart(rows: list[dict], limits: dict, path: str) -> bool:
    """records/s against N for each concurrency scenario, ours and the
    peer's, beside the ceiling of one fsync per request (the machine's
    fsync rate times the records a request carries)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    scenarios = sorted({row["scenario"] for row in rows if row["scenario"].startswith("concurrency")})
    if not scenarios:
        return False
    figure, axes = plt.subplots(1, len(scenarios), figsize=(6 * len(scenarios), 4.5), squeeze=False)
    for axis, scenario in zip(axes[0], scenarios):
        points = [row for row in rows if row["scenario"] == scenario]
        clients = [int(row["metric"].rsplit("=", 1)[1]) for row in points]
        axis.plot(clients, [row["onceflow"] for row in points], "o-", color="#2a7", label="onceflow (fsync before ack)")
        if all(row["peer"] for row in points):
            axis.plot(clients, [row["peer"] for row in points], "s--", color="#c54", label="Tansu (in memory)")
        if "producers" in scenario:  # a copier's transaction is several requests
            ceiling = limits["fsyncs_per_s"] * BATCH_RECORDS
            axis.axhline(ceiling, color="grey", linestyle=":", label=f"one fsync per request ({limits['fsyncs_per_s']:,.0f} fsyncs/s x {BATCH_RECORDS})")
        axis.set_xscale("log", base=2)
        axis.set_xticks(clients, [str(n) for n in clients])
        axis.set_xlabel("concurrent clients (N)")
        axis.set_ylabel("records/s")
        axis.set_title(scenario.split(": ", 1)[-1].replace(", ", ",\n", 1), fontsize=10)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True
