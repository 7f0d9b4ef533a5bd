"""Workloads the chaos runner drives, each a process that records what it
did to a history file (JSON lines, one event per line, flushed as written so
a SIGKILL leaves a readable file; ``faults.history`` defines the format).

    python -m faults.workloads copier --bootstrap H:P --history F --process copier-0 ...

Every event: ``time`` (wall clock, so processes merge), ``process``,
``type`` (invoke / ok / fail / info = outcome unknown, as Jepsen has it),
``op`` and ``value``. Values are lists of micro-ops; a partition is named
``"topic-partition"``:

    ["send", "out-0", "17", 1234]          value 17 went to out-0 at offset 1234
    ["poll", {"in-0": [[5, "17"], ...]}]   a poll read these (offset, value) pairs

Workloads:

- ``copier`` (our client) and ``copier-confluent`` (confluent-kafka): the
  transactional copier of Kafka's system test. Each transaction's polls and
  sends are one ``txn`` op; ok when committed, fail when aborted, info when
  the commit's outcome is unknown (the process died or the answer was lost).
  ``copier-confluent`` turns librdkafka's re-bootstrap off
  (``metadata.recovery.strategy=none``); ``copier-librdkafka`` is the same
  copier as a new user writes it (issue 28): librdkafka's defaults, each batch
  flushed before its offsets are sent. After a broker restart re-bootstrap
  leaves librdkafka 2.16 waiting on a stale group coordinator unless the
  broker wakes it (``broker.offset_commit_watch``).
  ``--client-debug`` passes librdkafka's ``debug`` contexts (to stderr).
- ``producer``: an idempotent producer sending numbered values; each send an
  op, ok with its offset once acknowledged.
- ``bank``: accounts in a one-partition ledger; each transfer a transaction
  of two records (debit, credit); ``balances`` ops read the ledger up to its
  last stable offset and report every balance, whose sum must never change.
- ``reader``: a read_committed reader recording every poll (the final read
  phase, and the bank's auditor); with ``--with-keys`` each read value is
  recorded as ``output_text(key, value)`` (the streaming workload's check).
- ``streaming``: one instance of a user's ``streaming.App``, from the module
  given with ``--app`` (a file path or a module name), on its own
  ``--state-dir``, its identity ``ONCEFLOW_INSTANCE_ID`` when the harness
  gives one; it records nothing itself: the harness seeds the input,
  reads the output and checks it against what the module says it must be
  (and reads the runner's INFO lines in its log for the restores' times).

The streaming workload's module convention (``onceflow chaos --workload
streaming --app my_app.py``; ``examples/word_count.py`` and
``examples/enrichment.py`` follow it):

| name in the module | what it is |
| --- | --- |
| ``build_app(bootstrap_servers, state_dir)`` | the ``streaming.App``, pointed at the harness's broker, with its own state directory per instance |
| ``CHAOS_TOPICS`` | ``{topic: partitions}`` the harness creates (inputs and outputs) |
| ``CHAOS_OUTPUT`` | the topic whose records are checked |
| ``chaos_input(count, seed)`` | a list of phases, each a list of ``(topic, key, value, timestamp_ms, partition)`` (key, value: str, bytes or None; timestamp, partition: None for the default). A phase is fed once the app's committed offsets cover every record fed before it, so an app whose output depends on input order across partitions (a table before the events it enriches, a late record that closes windows) still has one right answer |
| ``expected(records)`` | every ``(key, value)`` the output topic must hold, given the input in feeding order: each exactly once (a value that is not a str is compared as JSON) |

The check is exactly-once delivery of that multiset: an expected record
missing (``copy-missing``), there twice (``copy-duplicate``), or an output
record nobody expected (``copy-unexpected``).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import random
import signal
import sys
import time

from faults.history import HistoryWriter
from faults.points import point as crash_point  # armed by ONCEFLOW_CRASH_POINTS in this process's environment


def _stopping() -> list:
    stop: list = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    return stop


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "replace")


# -- copier ---------------------------------------------------------------------------------------


def run_copier(args, recorder: HistoryWriter) -> int:
    recorder.event("ok", "start", {"pid": os.getpid()})  # before the client imports: a restart's cost is readable from the history
    from txn import Consumer, Producer
    from txn.errors import CommitOutcomeUnknownError, KafkaError, ProducerFencedError

    rng = random.Random(args.seed)
    stop = _stopping()
    # A static member (its transactional id as its instance id): a restarted
    # copier takes its partitions back at once, where a new dynamic member
    # would wait out the dead one's session in a rebalance (about 10 s here).
    consumer = Consumer(bootstrap_servers=args.bootstrap, group_id=args.group, group_instance_id=args.transactional_id, session_timeout_ms=6000, heartbeat_interval_ms=500,
                        max_poll_records=args.records_per_txn, request_timeout_ms=5000)
    producer = Producer(
        bootstrap_servers=args.bootstrap,
        transactional_id=args.transactional_id,
        transaction_timeout_ms=10_000,
        request_timeout_ms=5000,
        delivery_timeout_ms=20_000,
        crash_point=crash_point,
    )
    producer.init_transactions()
    recorder.event("ok", "init", {"producer_id": producer.producer_id})

    class RecordAssignments:
        def on_partitions_assigned(self, partitions):
            recorder.event("ok", "assign", [str(tp) for tp in partitions])

        def on_partitions_revoked(self, partitions):
            pass

    consumer.subscribe([args.input], listener=RecordAssignments())

    def rewind():
        assignment = consumer.assignment()
        committed = consumer.committed(assignment, timeout=30)
        starts = consumer.beginning_offsets([tp for tp in assignment if committed.get(tp) is None])
        for tp in assignment:
            consumer.seek(tp, committed[tp].offset if committed.get(tp) else starts[tp])
        recorder.event("ok", "seek", [str(tp) for tp in assignment])

    while not stop:
        try:
            records = consumer.poll(0.5)
        except (KafkaError, OSError):
            time.sleep(0.5)
            continue
        if not records:
            continue
        reads: dict[str, list] = {}
        for record in records:
            reads.setdefault(f"{record.topic}-{record.partition}", []).append([record.offset, _text(record.value)])
        micro = [["poll", reads]]
        producer.begin_transaction()
        try:
            futures = [(record.value, producer.send(args.output, record.value, key=record.key)) for record in records]
            positions = {tp: consumer.position(tp) for tp in consumer.assignment()}
            producer.send_offsets_to_transaction(positions, consumer.group_metadata())
            producer.flush()
            sends = [["send", f"{args.output}-{f.result(1).partition}", _text(v), f.result(1).offset] for v, f in futures]
            recorder.event("invoke", "txn", micro + [["send", s[1], s[2], None] for s in sends])
            if rng.random() < args.abort_ratio:
                producer.abort_transaction()
                recorder.event("fail", "txn", micro + sends)
                rewind()
                continue
            producer.commit_transaction()
            recorder.event("ok", "txn", micro + sends)
        except CommitOutcomeUnknownError:
            recorder.event("info", "txn", micro)
            return 3  # the supervisor restarts us; init_transactions resolves the outcome
        except ProducerFencedError:
            return 4
        except (KafkaError, OSError) as error:  # abortable, commit failed, retriable, a lost connection
            recorder.event("fail", "txn", micro + [["error", str(error)[:200]]])
            try:
                producer.abort_transaction()
                rewind()
            except Exception:
                return 5  # let the supervisor start a fresh instance
    consumer.close()
    producer.close(timeout=10)
    return 0


def run_confluent_copier(args, recorder: HistoryWriter, *, as_users_write_it: bool = False) -> int:
    """``as_users_write_it``: librdkafka's defaults (re-bootstrap on) and each
    batch flushed before its offsets are sent, as issue 28's user's copier
    did (``copier-librdkafka``)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

    rng = random.Random(args.seed)
    stop = _stopping()
    client = {} if as_users_write_it else {"metadata.recovery.strategy": "none"}
    if args.client_debug:
        client["debug"] = args.client_debug
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group, "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "session.timeout.ms": args.session_timeout_ms, "group.instance.id": args.transactional_id, **client})
    producer = Producer({"bootstrap.servers": args.bootstrap, "transactional.id": args.transactional_id, "linger.ms": 5, "transaction.timeout.ms": 10_000, **client})
    producer.init_transactions(60)
    consumer.subscribe([args.input], on_assign=lambda c, partitions: recorder.event("ok", "assign", [f"{p.topic}-{p.partition}" for p in partitions]))

    def rewind():
        assignment = consumer.assignment()
        for partition in consumer.committed(assignment, timeout=30):
            consumer.seek(TopicPartition(partition.topic, partition.partition, partition.offset if partition.offset >= 0 else OFFSET_BEGINNING))
        recorder.event("ok", "seek", [f"{p.topic}-{p.partition}" for p in assignment])

    while not stop:
        messages = [m for m in consumer.consume(args.records_per_txn, timeout=0.5) if m.error() is None]
        if not messages:
            continue
        reads: dict[str, list] = {}
        for message in messages:
            reads.setdefault(f"{message.topic()}-{message.partition()}", []).append([message.offset(), _text(message.value())])
        micro = [["poll", reads]]
        delivered: list = []
        producer.begin_transaction()
        try:
            for message in messages:
                producer.produce(args.output, value=message.value(), key=message.key(), on_delivery=lambda err, msg: delivered.append(msg) if err is None else None)
            if as_users_write_it:
                producer.flush(30)
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30)
            producer.flush(30)
            sends = [["send", f"{m.topic()}-{m.partition()}", _text(m.value()), m.offset()] for m in delivered]
            recorder.event("invoke", "txn", micro + [["send", s[1], s[2], None] for s in sends])
            if rng.random() < args.abort_ratio:
                producer.abort_transaction(30)
                recorder.event("fail", "txn", micro + sends)
                rewind()
                continue
            producer.commit_transaction(30)
            recorder.event("ok", "txn", micro + sends)
        except KafkaException as exc:
            error = exc.args[0]
            if error.txn_requires_abort() or error.retriable():
                recorder.event("fail", "txn", micro)
                producer.abort_transaction(30)
                rewind()
                continue
            recorder.event("info", "txn", micro)
            return 4
    consumer.close()
    return 0


# -- idempotent producer -----------------------------------------------------------------------


def run_producer(args, recorder: HistoryWriter) -> int:
    from txn import Producer

    stop = _stopping()
    producer = Producer(bootstrap_servers=args.bootstrap, linger_ms=2, delivery_timeout_ms=60_000, request_timeout_ms=5000, retry_backoff_max_ms=500)
    number = args.start
    pending = []

    def settle(block: bool):
        while pending and (block or pending[0][1].done()):
            value, future = pending.pop(0)
            try:
                metadata = future.result(120)
                recorder.event("ok", "send", [["send", f"{metadata.topic}-{metadata.partition}", value, metadata.offset]])
            except Exception as error:
                recorder.event("info", "send", [["send", f"{args.output}-?", value, None], ["error", str(error)[:200]]])

    while not stop and (args.count is None or number < args.start + args.count):
        value = f"{recorder.process}:{number}"  # a restarted process sends new values
        recorder.event("invoke", "send", [["send", f"{args.output}-?", value, None]])
        pending.append((value, producer.send(args.output, value.encode(), key=value.encode())))
        number += 1
        if number % 100 == 0:
            settle(block=False)
            time.sleep(0.01)
    producer.flush(120)
    settle(block=True)
    producer.close()
    return 0


# -- bank ---------------------------------------------------------------------------------------------


def run_bank(args, recorder: HistoryWriter) -> int:
    """Transfers between accounts; with --seed-accounts, first opens them."""
    from txn import Producer
    from txn.errors import CommitOutcomeUnknownError, KafkaError, ProducerFencedError

    rng = random.Random(args.seed)
    stop = _stopping()
    producer = Producer(
        bootstrap_servers=args.bootstrap,
        transactional_id=args.transactional_id,
        transaction_timeout_ms=10_000,
        request_timeout_ms=5000,
        delivery_timeout_ms=20_000,
        crash_point=crash_point,
    )
    producer.init_transactions()
    accounts = [f"acct-{i}" for i in range(args.accounts)]
    if args.open_accounts:
        with producer.transaction():
            futures = [(a, producer.send(args.output, f"{a}:{args.initial}".encode(), key=a.encode(), partition=0)) for a in accounts]
        recorder.event("ok", "txn", [["send", f"{args.output}-0", f"{a}:{args.initial}", f.result(10).offset] for a, f in futures])
        return 0
    while not stop:
        source, target = rng.sample(accounts, 2)
        amount = rng.randint(1, 20)
        entries = [f"{source}:-{amount}", f"{target}:{amount}"]
        producer.begin_transaction()
        try:
            futures = [(e, producer.send(args.output, e.encode(), key=e.split(":")[0].encode(), partition=0)) for e in entries]
            producer.flush()
            sends = [["send", f"{args.output}-0", e, f.result(1).offset] for e, f in futures]
            recorder.event("invoke", "txn", [["send", s[1], s[2], None] for s in sends])
            if rng.random() < args.abort_ratio:
                producer.abort_transaction()
                recorder.event("fail", "txn", sends)
                continue
            producer.commit_transaction()
            recorder.event("ok", "txn", sends)
        except CommitOutcomeUnknownError:
            recorder.event("info", "txn", [["send", f"{args.output}-0", e, None] for e in entries])
            return 3
        except ProducerFencedError:
            return 4
        except (KafkaError, OSError) as error:
            recorder.event("fail", "txn", [["send", f"{args.output}-0", e, None] for e in entries] + [["error", str(error)[:200]]])
            try:
                producer.abort_transaction()
            except Exception:
                return 5
        time.sleep(0.005)
    producer.close(timeout=10)
    return 0


# -- reader ---------------------------------------------------------------------------------------------


def run_reader(args, recorder: HistoryWriter) -> int:
    """Read ``--output`` read_committed from the start, recording every poll;
    with --balances, also report the ledger's balances whenever the reader
    stands at the last stable offset; with --until-idle S, stop after S
    seconds without a new record."""
    from txn import Consumer, TopicPartition
    from txn.errors import KafkaError

    stop = _stopping()
    consumer = Consumer(bootstrap_servers=args.bootstrap, request_timeout_ms=5000, isolation_level=args.isolation)
    probe = consumer
    partitions = [TopicPartition(args.output, p) for p in range(args.partitions)]
    consumer.assign(partitions)
    balances: dict[str, int] = {}
    last_new = time.monotonic()
    while not stop:
        try:
            records = consumer.poll(0.5)
        except (KafkaError, OSError):
            time.sleep(0.5)
            continue
        if records:
            last_new = time.monotonic()
            reads: dict[str, list] = {}
            for record in records:
                value = output_text(record.key, record.value) if args.with_keys else _text(record.value)
                reads.setdefault(f"{record.topic}-{record.partition}", []).append([record.offset, value])
                if args.balances:
                    account, _, delta = _text(record.value).partition(":")
                    balances[account] = balances.get(account, 0) + int(delta)
            recorder.event("ok", "poll", [["poll", reads]])
        if args.balances and balances:
            try:
                ends = probe.end_offsets(partitions)
            except (KafkaError, OSError):
                continue
            if all(consumer.position(tp) >= ends[tp] for tp in partitions):
                recorder.event("ok", "balances", {"balances": dict(balances), "total": sum(balances.values()), "offset": consumer.position(partitions[0])})
        if args.until_idle is not None and time.monotonic() - last_new > args.until_idle:
            break
    consumer.close()
    return 0


# -- streaming: a user's streaming.App --------------------------------------------------------------


def load_app_module(spec: str):
    """The module a streaming workload runs: a file path or an importable name."""
    import importlib
    import importlib.util

    if spec.endswith(".py") or os.path.sep in spec:
        path = os.path.abspath(spec)
        directory = os.path.dirname(path)
        if directory not in sys.path:
            sys.path.insert(0, directory)  # its own imports work as under `python app.py`
        loaded = importlib.util.spec_from_file_location("__onceflow_chaos_app__", path)
        if loaded is None:
            raise FileNotFoundError(f"no such app module: {spec}")
        module = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(module)
    else:
        module = importlib.import_module(spec)
    missing = [name for name in ("build_app", "CHAOS_TOPICS", "CHAOS_OUTPUT", "chaos_input", "expected") if not hasattr(module, name)]
    if missing:
        raise LookupError(f"{spec} lacks {', '.join(missing)} (see faults.workloads: the streaming workload's module convention)")
    return module


def _json_or_text(value):
    if value is None or not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def output_text(key, value) -> str:
    """One output record as the checker compares it: canonical JSON of
    [key, value], where text that parses as JSON counts as that JSON (so
    ``{"a":1,"b":2}`` and ``{"b": 2, "a": 1}`` are one value)."""
    def normal(part):
        if isinstance(part, (bytes, bytearray)):
            part = part.decode("utf-8", "replace")
        return _json_or_text(part)

    return json.dumps([normal(key), normal(value)], sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def run_streaming(args, recorder: HistoryWriter) -> int:
    from streaming.errors import StreamingError

    # The runner's INFO lines (its assignments, each store's restore and how
    # long it took) go to this process's log: the harness reads the restores.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    module = load_app_module(args.app)
    app = module.build_app(args.bootstrap, args.state_dir)
    recorder.event("ok", "start", {"instance": app.instance_id, "application": app.application_id})
    try:
        app.run()  # SIGTERM: commit the open transaction, close the stores, return
    except StreamingError as error:
        print(f"streaming workload: {error}", file=sys.stderr, flush=True)
        return error.exit_code
    return 0


WORKLOADS = {
    "streaming": run_streaming,
    "copier": run_copier,
    "copier-confluent": run_confluent_copier,
    "copier-librdkafka": functools.partial(run_confluent_copier, as_users_write_it=True),
    "producer": run_producer,
    "bank": run_bank,
    "reader": run_reader,
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="a chaos workload process (see faults.workloads)")
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--history", required=True)
    parser.add_argument("--process", required=True)
    parser.add_argument("--input", default="input")
    parser.add_argument("--output", default="output")
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--group", default="copiers")
    parser.add_argument("--transactional-id", default=None)
    parser.add_argument("--records-per-txn", type=int, default=200)
    parser.add_argument("--abort-ratio", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--count", type=int, default=None)
    parser.add_argument("--accounts", type=int, default=10)
    parser.add_argument("--initial", type=int, default=100)
    parser.add_argument("--open-accounts", action="store_true")
    parser.add_argument("--balances", action="store_true")
    parser.add_argument("--until-idle", type=float, default=None)
    parser.add_argument("--isolation", default="read_committed", choices=["read_committed", "read_uncommitted"])
    parser.add_argument("--with-keys", action="store_true", help="(reader) record each read as output_text(key, value)")
    parser.add_argument("--app", default=None, help="(streaming) the app module: a .py path or a module name")
    parser.add_argument("--state-dir", default=None, help="(streaming) this instance's state directory")
    parser.add_argument("--session-timeout-ms", type=int, default=6000, help="(copier-confluent, copier-librdkafka) the consumer's session.timeout.ms")
    parser.add_argument("--client-debug", default=None, help="(copier-confluent, copier-librdkafka) librdkafka debug contexts, e.g. eos,cgrp,broker,protocol")
    args = parser.parse_args(argv)
    recorder = HistoryWriter(args.history, f"{args.process}/{os.getpid()}")  # a restart is a new process
    try:
        return WORKLOADS[args.workload](args, recorder)
    finally:
        recorder.close()


if __name__ == "__main__":
    sys.exit(main())
