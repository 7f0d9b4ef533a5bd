"""Logs as a user's log shipper sees them: one line per event, JSON objects
with ``--log-format json``; every transaction- and group-coordinator state
change at DEBUG with its ids; a one-line INFO summary per log kind when a
broker recovers after a kill (a tail truncated by hand, a transaction
left open, a commit decided but not completed)."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading

import pytest

from faults.disk import cut_zeros_ahead
from faults.process import READY, restartable_port
from onceflow import logs
from protocol.partitioning import partition_for
from tests.conftest import REPO
from tests.helpers import create_topic, raw_request, wait_for


def _record(message: str, *args, exc_info=None, **fields) -> logging.LogRecord:
    record = logging.LogRecord("coordinator.coordinator", logging.DEBUG, __file__, 1, message, args, exc_info)
    record.__dict__.update(fields)
    return record


def _exception_info():
    try:
        raise ValueError("first line\nsecond line")
    except ValueError:
        return sys.exc_info()


def test_a_json_line_holds_the_fields_and_the_exception_on_one_line():
    record = _record("transaction %s: %s", "tx-1", "Ongoing -> PrepareCommit", exc_info=_exception_info(), transactional_id="tx-1", producer_id=7, partitions=["a-0", "b-1"])
    line = logs.JsonFormatter().format(record)
    assert "\n" not in line
    event = json.loads(line)
    assert list(event)[:4] == ["time", "level", "logger", "message"]
    assert event["level"] == "DEBUG" and event["logger"] == "coordinator.coordinator"
    assert event["message"] == "transaction tx-1: Ongoing -> PrepareCommit"
    assert (event["transactional_id"], event["producer_id"], event["partitions"]) == ("tx-1", 7, ["a-0", "b-1"])
    assert event["time"].endswith("Z") and event["time"][10] == "T"
    assert "Traceback" in event["exception"] and "ValueError: first line\nsecond line" in event["exception"]


def test_a_text_line_is_one_line_with_its_fields():
    record = _record("two\nlines", exc_info=_exception_info(), group_id="g 1", generation=3)
    line = logs.TextFormatter().format(record)
    assert "\n" not in line
    assert " DEBUG coordinator.coordinator: two\\nlines" in line
    assert 'group_id="g 1"' in line and "generation=3" in line
    assert "exception=" in line and "Traceback" in line


def test_configure_routes_every_logger_and_announce_follows_the_format():
    stream, out = io.StringIO(), io.StringIO()
    saved = logging.root.handlers[:], logging.root.level, sys.excepthook, threading.excepthook
    try:
        logs.configure("DEBUG", "json", stream=stream)
        logging.getLogger("groupcoord.coordinator").debug("moved", extra={"group_id": "g"})
        logging.getLogger("some.library").warning("careful")
        logs.announce("onceflow broker ready on 127.0.0.1:9", stream=out, port=9)
        events = [json.loads(line) for line in stream.getvalue().splitlines()]
        assert [(e["logger"], e["message"]) for e in events] == [("groupcoord.coordinator", "moved"), ("some.library", "careful")]
        assert events[0]["group_id"] == "g"
        announced = json.loads(out.getvalue())
        assert announced["port"] == 9 and READY.search(out.getvalue()).groups() == ("127.0.0.1", "9")
        logs.configure("INFO", "text", stream=stream)
        out = io.StringIO()
        logs.announce("onceflow broker ready on 127.0.0.1:9", stream=out, port=9)
        assert out.getvalue() == "onceflow broker ready on 127.0.0.1:9\n"
    finally:
        logging.root.handlers[:], sys.excepthook, threading.excepthook = saved[0], saved[2], saved[3]
        logging.root.setLevel(saved[1])
        logging.captureWarnings(False)


# -- the coordinators' state-change lines, without a socket ---------------------------


def _changes(caplog, event: str) -> list[dict]:
    return [{key: getattr(r, key) for key in ("transactional_id", "group_id", "producer_id", "producer_epoch", "generation", "member_id", "old_state", "new_state") if hasattr(r, key)}
            for r in caplog.records if getattr(r, "event", None) == event and r.levelno == logging.DEBUG]


def test_a_timed_out_transaction_its_fence_and_its_expiry_are_logged_once_each(caplog):
    import asyncio

    from coordinator.metadata import TopicPartition
    from tests.helpers import make_txn_coordinator

    partition = TopicPartition("t", 0)

    async def scenario():
        coordinator, clock = make_txn_coordinator(transactional_id_expiration_ms=1000)
        init = await coordinator.init_producer_id("tx", 5000)
        await coordinator.add_partitions("tx", init.producer_id, 0, [partition])
        coordinator.txn_log.fail = True
        assert await coordinator.end_transaction("tx", init.producer_id, 0, True) != 0, "a failed write changes nothing"
        coordinator.txn_log.fail = False
        clock.advance(6.0)
        assert await coordinator.abort_timed_out() == ["tx"]
        await coordinator.wait_idle()
        clock.advance(2.0)
        assert await coordinator.expire_transactional_ids() == ["tx"]
        return init.producer_id

    with caplog.at_level(logging.DEBUG, logger="coordinator.coordinator"):
        producer_id = asyncio.run(scenario())
    assert _changes(caplog, "transaction_state_change") == [
        {"transactional_id": "tx", "producer_id": producer_id, "producer_epoch": 0, "old_state": "none", "new_state": "Empty"},
        {"transactional_id": "tx", "producer_id": producer_id, "producer_epoch": 0, "old_state": "Empty", "new_state": "Ongoing"},
        {"transactional_id": "tx", "producer_id": producer_id, "producer_epoch": 1, "old_state": "Ongoing", "new_state": "PrepareAbort"},
        {"transactional_id": "tx", "producer_id": producer_id, "producer_epoch": 1, "old_state": "PrepareAbort", "new_state": "CompleteAbort"},
        {"transactional_id": "tx", "producer_id": producer_id, "producer_epoch": 1, "old_state": "CompleteAbort", "new_state": "Dead"},
    ]


def test_a_silent_members_removal_and_a_delete_are_logged_with_the_member(caplog):
    import asyncio

    from tests.helpers import join_group, join_two, make_group_coordinator

    async def scenario():
        coordinator, clock = make_group_coordinator()
        a, b = await join_two(coordinator)
        leader = a if a["members"] else b
        await asyncio.gather(*(
            coordinator.sync_group(group_id="g", generation_id=1, member_id=m["member_id"], group_instance_id=None, assignments=[(a["member_id"], b"1"), (b["member_id"], b"2")] if m is leader else [])
            for m in (a, b)
        ))
        clock.advance(0.6)
        await coordinator.heartbeat(group_id="g", generation_id=1, member_id=a["member_id"], group_instance_id=None)
        clock.advance(0.6)  # b has been silent longer than its session
        await coordinator.check_timeouts()
        rejoined = await asyncio.wait_for(join_group(coordinator, a["member_id"]), 5)
        await coordinator.leave_group(group_id="g", members=[(rejoined["member_id"], None)])
        assert await coordinator.delete_group("g") == 0
        await coordinator.stop()
        return a["member_id"], b["member_id"], leader["member_id"]

    with caplog.at_level(logging.DEBUG, logger="groupcoord.coordinator"):
        kept, silent, leader = asyncio.run(scenario())
    steps = [(c["old_state"], c["new_state"], c["generation"], c["member_id"]) for c in _changes(caplog, "group_state_change")]
    assert steps[0][:3] == ("Empty", "PreparingRebalance", 0)
    assert steps[1:] == [
        ("PreparingRebalance", "CompletingRebalance", 1, leader),
        ("CompletingRebalance", "Stable", 1, leader),
        ("Stable", "PreparingRebalance", 1, silent),
        ("PreparingRebalance", "CompletingRebalance", 2, kept),
        ("CompletingRebalance", "Empty", 3, None),
        ("Empty", "Dead", 3, None),
    ]


# -- a real broker process ------------------------------------------------------------


class JsonLoggingBroker:
    """``onceflow --log-format json --log-level DEBUG broker``, its stdout and
    stderr kept in files (every start appends)."""

    def __init__(self, tmp_path):
        self.data_dir = str(tmp_path / "data")
        self.stdout_path = str(tmp_path / "stdout.log")
        self.stderr_path = str(tmp_path / "stderr.log")
        self.port = restartable_port()
        self.process = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, env: dict | None = None) -> list[dict]:
        """Start and wait for the ready line; the events logged up to it."""
        already = len(self.events())
        command = [sys.executable, "-m", "onceflow", "--log-format", "json", "--log-level", "DEBUG", "broker", "--data-dir", self.data_dir,
                   "--listen", f"127.0.0.1:{self.port}", "--config", "group.initial.rebalance.delay.ms=0"]
        environment = {key: value for key, value in os.environ.items() if key != "ONCEFLOW_CRASH_POINTS"}
        environment.update(env or {})
        with open(self.stdout_path, "ab") as stdout, open(self.stderr_path, "ab") as stderr:
            self.process = subprocess.Popen(command, cwd=REPO, stdout=stdout, stderr=stderr, env=environment)

        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"the broker exited with {self.process.returncode}: {self.lines()[-5:]}")
            with open(self.stdout_path) as file:
                return sum(1 for line in file if READY.search(line)) > self.starts
        self.starts = getattr(self, "starts", 0)
        wait_for(ready, timeout=60, what="the broker's ready line")
        self.starts += 1
        return self.events()[already:]

    def lines(self) -> list[str]:
        lines = []
        for path in (self.stdout_path, self.stderr_path):
            if os.path.exists(path):
                with open(path, encoding="utf-8") as file:
                    lines += file.read().splitlines()
        return lines

    def events(self) -> list[dict]:
        """Every line of both streams as JSON (fails the test on a line that is not)."""
        events = []
        for line in self.lines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                raise AssertionError(f"not a JSON line: {line!r}") from None
        return events

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(60)


@pytest.fixture
def json_broker(tmp_path):
    broker = JsonLoggingBroker(tmp_path)
    yield broker
    broker.kill()


def _one(events: list[dict], event_name: str) -> dict:
    found = [e for e in events if e.get("event") == event_name]
    assert len(found) == 1, f"{len(found)} {event_name} lines: {found}"
    return found[0]


@pytest.mark.slow
def test_json_logs_of_a_transaction_a_group_and_recovery_after_a_kill(json_broker):
    from txn import Consumer, Producer

    json_broker.start()
    create_topic(json_broker.bootstrap, "logged", 1)

    committed = Producer(bootstrap_servers=json_broker.bootstrap, transactional_id="logged-tx")
    committed.init_transactions()
    committed.begin_transaction()
    for i in range(5):
        committed.send("logged", b"v%d" % i, partition=0)
    committed.commit_transaction()
    committed.close()

    consumer = Consumer(bootstrap_servers=json_broker.bootstrap, group_id="logged-group", auto_offset_reset="earliest", isolation_level="read_committed", enable_auto_commit=False)
    consumer.subscribe(["logged"])
    seen = []
    wait_for(lambda: seen.extend(consumer.poll(0.5)) or len(seen) >= 5, timeout=60, what="the group's consumer to read the committed records")
    consumer.commit()
    consumer.close()

    # Left open through the kill: it holds the partition's LSO, and the
    # coordinator finds it Ongoing (its timeout is far away).
    left_open = Producer(bootstrap_servers=json_broker.bootstrap, transactional_id="open-tx", transaction_timeout_ms=600_000)
    left_open.init_transactions()
    left_open.begin_transaction()
    left_open.send("logged", b"open", partition=0)
    left_open.flush()

    def state_changes(kind: str) -> list[dict]:
        return [e for e in json_broker.events() if e.get("event") == kind]

    transaction_steps = lambda: [(e["old_state"], e["new_state"]) for e in state_changes("transaction_state_change") if e["transactional_id"] == "logged-tx"]
    wait_for(lambda: ("PrepareCommit", "CompleteCommit") in transaction_steps(), timeout=30, what="the commit's completion to be logged")
    assert transaction_steps() == [("none", "Empty"), ("Empty", "Ongoing"), ("Ongoing", "PrepareCommit"), ("PrepareCommit", "CompleteCommit")]
    for change in state_changes("transaction_state_change"):
        assert change["level"] == "DEBUG" and change["logger"] == "coordinator.coordinator"
        assert isinstance(change["producer_id"], int) and change["producer_id"] >= 0 and change["producer_epoch"] >= 0
    ongoing = [e for e in state_changes("transaction_state_change") if e["transactional_id"] == "logged-tx" and e["new_state"] == "Ongoing"]
    assert ongoing[0]["partitions"] == ["logged-0"]
    assert any(e["transactional_id"] == "open-tx" and e["new_state"] == "Ongoing" for e in state_changes("transaction_state_change"))

    group_changes = [e for e in state_changes("group_state_change") if e["group_id"] == "logged-group"]
    steps = [(e["old_state"], e["new_state"]) for e in group_changes]
    assert steps[:3] == [("Empty", "PreparingRebalance"), ("PreparingRebalance", "CompletingRebalance"), ("CompletingRebalance", "Stable")], steps
    joined, balanced, stable = group_changes[:3]
    assert joined["member_id"] and joined["cause"] == "member_join" and stable["cause"] == "leader_sync"
    assert balanced["generation"] == stable["generation"] == 1 and stable["member_id"] == joined["member_id"] == balanced["member_id"]
    assert stable["members"] == [joined["member_id"]]
    assert ("Stable", "PreparingRebalance") in steps or ("Stable", "Empty") in steps, "the consumer's leave is logged"

    # SIGKILL, then a torn tail added by hand to the topic's only segment.
    json_broker.kill()
    left_open.close()
    segment = os.path.join(json_broker.data_dir, "logged-0", "00000000000000000000.log")
    with open(segment, "rb") as file:
        head = file.read(40)
    cut_zeros_ahead(segment)  # the torn write lands at the data's end
    with open(segment, "ab") as file:
        file.write(head[:29])  # a batch's first 29 bytes: its header is cut short
    started = json_broker.start(env={"ONCEFLOW_CRASH_POINTS": "coordinator.after_prepare_commit@1:exit"})
    # Opened at start: the partitions changed since they were last whole
    # (the topic, and those of __consumer_offsets and __transaction_state the
    # group and the transactions wrote); the others open when first used.
    changed = {("logged", 0), ("__consumer_offsets", partition_for("logged-group", 50))} | {("__transaction_state", partition_for(t, 50)) for t in ("logged-tx", "open-tx")}
    storage = _one(started, "log_recovery")
    assert storage["level"] == "INFO" and storage["logger"] == "storage.recovery"
    partitions = len(changed)
    assert (storage["partitions"], storage["unclean"], storage["segments_checked"], storage["segments_scanned"]) == (partitions, partitions, partitions, partitions)
    assert storage["bytes_truncated"] == 29 and storage["segments_deleted"] == 0
    assert storage["producer_states"] == 2, "logged-tx and open-tx wrote to the topic"
    assert storage["open_transactions"] == 1, "open-tx's transaction in the topic"
    transactions = _one(started, "transaction_recovery")
    assert (transactions["transactional_ids"], transactions["ongoing"], transactions["completing_commit"], transactions["completing_abort"]) == (2, 1, 0, 0)
    groups = _one(started, "group_recovery")
    assert (groups["groups"], groups["committed_offsets"], groups["pending_transactional_offsets"]) == (1, 1, 0)

    # A commit decided (PrepareCommit durable) when the broker dies: the next
    # start completes it, and says so.
    init = raw_request(json_broker.port, 22, 4, {"transactional_id": "decided-tx", "transaction_timeout_ms": 60000})
    raw_request(json_broker.port, 24, 3, {"v3_and_below_transactional_id": "decided-tx", "v3_and_below_producer_id": init["producer_id"], "v3_and_below_producer_epoch": init["producer_epoch"], "v3_and_below_topics": [{"name": "logged", "partitions": [0]}]})
    with pytest.raises(ConnectionError):
        raw_request(json_broker.port, 26, 3, {"transactional_id": "decided-tx", "producer_id": init["producer_id"], "producer_epoch": init["producer_epoch"], "committed": True})
    assert json_broker.process.wait(30) == 86, "the crash point ended the broker"
    started = json_broker.start()
    transactions = _one(started, "transaction_recovery")
    assert (transactions["transactional_ids"], transactions["ongoing"], transactions["completing_commit"], transactions["completing_abort"]) == (3, 1, 1, 0)
    storage = _one(started, "log_recovery")
    assert storage["bytes_truncated"] == 0 and storage["unclean"] == storage["partitions"] == 1, "only decided-tx's __transaction_state partition changed"
    wait_for(lambda: any(e.get("transactional_id") == "decided-tx" and e.get("new_state") == "CompleteCommit" for e in json_broker.events()), timeout=30, what="the decided commit's completion")
    assert json_broker.stop() == 0
    events = json_broker.events()  # every line of every start, both streams, is JSON
    assert [e["crash_point"] for e in events if "crash_point" in e] == ["coordinator.after_prepare_commit"]
    assert [e["message"] for e in events if e["logger"] == "onceflow" and "stopped" in e["message"]] == ["broker stopped cleanly"]


def test_a_broker_that_cannot_start_says_so_in_one_json_line(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "onceflow", "--log-format", "json", "broker", "--data-dir", str(tmp_path / "data"), "--listen", f"127.0.0.1:{port}"],
                                cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2 and result.stdout == ""
    events = [json.loads(line) for line in result.stderr.splitlines()]
    [refusal] = [e for e in events if e["level"] == "ERROR"]
    assert refusal["message"].startswith(f"onceflow broker: cannot listen on PLAINTEXT://127.0.0.1:{port}:") and refusal["logger"] == "onceflow"
