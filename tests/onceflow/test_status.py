"""``onceflow status`` against our broker in a known state: topics with
records, a group with committed offsets and known lag, an open transaction
holding the LSO (then committed), a hanging transaction written straight
into the log. The JSON is checked field by field, the text for its key
facts; ``--watch`` redraws until SIGINT; an unreachable broker is one line
and exit status 2, as for the other client commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from onceflow.cli import build_parser, main
from onceflow.client_commands import client_options
from onceflow.commands import status as status_command
from protocol.records import encode_batch
from tests.conftest import REPO
from tests.helpers import create_topic, wait_for


def onceflow_status(capsys, *args: str) -> tuple[int, str]:
    code = main(["status", *args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.out


def rows_of(text: str, section: str) -> list[list[str]]:
    """The whitespace-split rows of one section of the text screen (up to the blank line)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(section))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), len(lines))
    return [line.split() for line in lines[start + 1 : end]]


@pytest.fixture
def known_state(embedded_broker):
    """orders-0: records 0-5, an open transaction's record at 6, a plain
    record at 7 (HW 8, LSO 6). orders-1: records 0-3, a committed
    transaction's three records at 4-6 and its marker at 7 (HW = LSO = 8).
    Group "pipeline" (one member, client id "worker-1") committed 2 and 5."""
    from txn import Consumer, Producer, TopicPartition
    from txn.types import OffsetAndMetadata

    bootstrap = embedded_broker.bootstrap
    create_topic(bootstrap, "orders", 2)
    create_topic(bootstrap, "other", 1)
    plain = Producer(bootstrap_servers=bootstrap)
    for i in range(6):
        plain.send("orders", b"p0-%d" % i, partition=0)
    for i in range(4):
        plain.send("orders", b"p1-%d" % i, partition=1)
    plain.flush()
    done = Producer(bootstrap_servers=bootstrap, transactional_id="done-tx")
    done.init_transactions()
    done.begin_transaction()
    for i in range(3):
        done.send("orders", b"t-%d" % i, partition=1)
    done.commit_transaction()
    done.close()
    consumer = Consumer(bootstrap_servers=bootstrap, group_id="pipeline", client_id="worker-1")
    consumer.subscribe(["orders"])
    wait_for(lambda: consumer.poll(0.2) is not None and len(consumer.assignment()) == 2, timeout=60, what="the consumer's assignment")
    consumer.commit({TopicPartition("orders", 0): OffsetAndMetadata(2, ""), TopicPartition("orders", 1): OffsetAndMetadata(5, "")})
    open_transaction = Producer(bootstrap_servers=bootstrap, transactional_id="open-tx", transaction_timeout_ms=120_000)
    open_transaction.init_transactions()
    open_transaction.begin_transaction()
    open_transaction.send("orders", b"open", partition=0)
    open_transaction.flush()
    plain.send("orders", b"after", partition=0)
    plain.flush()
    plain.close()
    try:
        yield embedded_broker, consumer, open_transaction
    finally:
        open_transaction.close()
        consumer.close()


def test_json_field_by_field_then_commit_and_a_hanging_transaction(known_state, capsys):
    embedded_broker, _consumer, open_transaction = known_state
    bootstrap = embedded_broker.bootstrap
    before_ms = int(time.time() * 1000)
    code, out = onceflow_status(capsys, "--bootstrap-server", bootstrap, "--json")
    assert code == 0
    document = json.loads(out)
    assert list(document) == ["bootstrap_server", "time_ms", "topics", "groups", "transactions", "transactional_id_states", "hanging", "unavailable"]
    assert document["bootstrap_server"] == bootstrap and document["time_ms"] >= before_ms
    assert document["topics"] == [
        {"name": "orders", "internal": False, "partitions": [
            {"partition": 0, "log_start_offset": 0, "high_watermark": 8, "last_stable_offset": 6},
            {"partition": 1, "log_start_offset": 0, "high_watermark": 8, "last_stable_offset": 8},
        ]},
        {"name": "other", "internal": False, "partitions": [{"partition": 0, "log_start_offset": 0, "high_watermark": 0, "last_stable_offset": 0}]},
    ], "internal topics are left out unless asked for"
    [group] = document["groups"]
    [member] = group["members"]
    assert member["client_id"] == "worker-1" and member["host"] == "/127.0.0.1" and member["group_instance_id"] is None
    assert member["member_id"].startswith("worker-1-")
    assert member["assignment"] == [{"topic": "orders", "partition": 0}, {"topic": "orders", "partition": 1}]
    assert {key: group[key] for key in ("group_id", "state", "protocol_type", "protocol", "lag")} == {"group_id": "pipeline", "state": "Stable", "protocol_type": "consumer", "protocol": "range", "lag": (6 - 2) + (8 - 5)}
    assert group["offsets"] == [
        {"topic": "orders", "partition": 0, "committed_offset": 2, "high_watermark": 8, "last_stable_offset": 6, "lag": 4, "lag_uncommitted": 6, "member_id": member["member_id"]},
        {"topic": "orders", "partition": 1, "committed_offset": 5, "high_watermark": 8, "last_stable_offset": 8, "lag": 3, "lag_uncommitted": 3, "member_id": member["member_id"]},
    ]
    [transaction] = document["transactions"]
    assert {key: transaction[key] for key in ("transactional_id", "producer_epoch", "state", "timeout_ms", "partitions")} == {
        "transactional_id": "open-tx", "producer_epoch": 0, "state": "Ongoing", "timeout_ms": 120_000, "partitions": [{"topic": "orders", "partition": 0}]}
    assert transaction["producer_id"] >= 0 and transaction["start_time_ms"] >= before_ms - 120_000
    assert 0 <= transaction["age_ms"] == document["time_ms"] - transaction["start_time_ms"] < 120_000
    assert document["transactional_id_states"] == {"CompleteCommit": 1, "Ongoing": 1}
    assert document["hanging"] == [] and document["unavailable"] == []

    # The same facts on the text screen.
    code, text = onceflow_status(capsys, "--bootstrap-server", bootstrap)
    assert code == 0
    assert ["orders", "0", "0", "8", "6", "2"] in rows_of(text, "TOPICS") and ["orders", "1", "0", "8", "8"] in rows_of(text, "TOPICS")
    group_rows = rows_of(text, "GROUPS")
    assert group_rows[0] == ["pipeline", "state", "Stable", "protocol", "consumer/range", "members", "1", "lag", "7"]
    assert [member["member_id"], "worker-1", "/127.0.0.1", "orders-0,orders-1"] in group_rows
    assert ["orders", "0", "2", "6", "8", "4", "6", member["member_id"]] in group_rows
    assert ["orders", "1", "5", "8", "8", "3", "3", member["member_id"]] in group_rows
    [open_row] = [row for row in rows_of(text, "OPEN TRANSACTIONS") if row[0] == "open-tx"]
    assert open_row[1:4] == [str(transaction["producer_id"]), "0", "Ongoing"] and open_row[-1] == "orders-0"
    assert "1 CompleteCommit, 1 Ongoing" in text
    assert rows_of(text, "HANGING") == [["none"]]

    # Committed: the LSO catches up with the end (the marker is one offset more).
    open_transaction.commit_transaction()  # answered once the decision is durable; the markers follow

    def completed() -> dict | None:
        document = json.loads(onceflow_status(capsys, "--bootstrap-server", bootstrap, "--json", "--topic", "orders", "--group", "pipeline")[1])
        return document if document["transactional_id_states"] == {"CompleteCommit": 2} else None
    document = wait_for(completed, timeout=30, what="the commit to complete")
    assert document["topics"][0]["partitions"][0] == {"partition": 0, "log_start_offset": 0, "high_watermark": 9, "last_stable_offset": 9}
    assert document["groups"][0]["offsets"][0]["lag"] == 9 - 2 and document["transactions"] == []

    # A transaction the coordinator does not know, written straight into the
    # log (as an old bug or a lost coordinator could leave): it holds orders-1's LSO.
    stuck = encode_batch([(None, b"stuck", (), 1)], producer_id=4242, producer_epoch=3, base_sequence=0, is_transactional=True)
    embedded_broker.call(lambda broker: broker.replicas.get_log("orders", 1).append(stuck))
    document = json.loads(onceflow_status(capsys, "--bootstrap-server", bootstrap, "--json")[1])
    assert document["topics"][0]["partitions"][1] == {"partition": 1, "log_start_offset": 0, "high_watermark": 9, "last_stable_offset": 8}
    [hanging] = document["hanging"]
    assert hanging == {"topic": "orders", "partition": 1, "producer_id": 4242, "producer_epoch": 3, "coordinator_epoch": hanging["coordinator_epoch"], "start_offset": 8, "last_timestamp": 1, "reason": "no_open_transaction"}
    code, text = onceflow_status(capsys, "--bootstrap-server", bootstrap)
    assert rows_of(text, "HANGING")[1][:5] == ["orders-1", "4242", "3", str(hanging["coordinator_epoch"]), "8"]
    assert "no open transaction of this producer" in text


def test_an_ongoing_transaction_past_its_timeout_is_a_candidate(known_state):
    """``gather`` with a clock past the open transaction's timeout (the
    coordinator would abort it within its check interval; until then it
    holds the LSO like a hanging one)."""
    from txn import Admin

    embedded_broker, _consumer, _open_transaction = known_state
    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        now = status_command.gather(admin)
        [transaction] = now.transactions
        assert now.hanging == ()
        later = status_command.gather(admin, now_ms=transaction.start_time_ms + transaction.timeout_ms + 1)
        [candidate] = later.hanging
        assert (candidate.topic, candidate.partition, candidate.producer_id, candidate.start_offset, candidate.reason) == ("orders", 0, transaction.producer_id, 6, "older_than_timeout")
        internal = status_command.gather(admin, include_internal=True, topics=(), groups=("pipeline",))
        assert {"__consumer_offsets", "__transaction_state", "orders"} <= {t.name for t in internal.topics}
        assert [g.group_id for g in internal.groups] == ["pipeline"]


def _default_sigint() -> None:
    """In the child before exec: SIGINT as a terminal would deliver it. A
    runner that started pytest in the background without job control (a
    shell's ``cmd &``) left SIGINT ignored, which the child inherits, and a
    Python started with it ignored never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_watch(bootstrap: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "onceflow", "status", "--bootstrap-server", bootstrap, "--watch", "0.3", *extra],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)


def _interrupt(process: subprocess.Popen) -> tuple[int, str]:
    process.send_signal(signal.SIGINT)
    try:
        _rest, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, err


@pytest.mark.slow
def test_watch_redraws_until_sigint(embedded_broker):
    create_topic(embedded_broker.bootstrap, "watched", 1)
    process = _start_watch(embedded_broker.bootstrap)
    headers = []
    deadline = time.monotonic() + 60
    while len(headers) < 2 and time.monotonic() < deadline:
        line = process.stdout.readline()
        assert line, f"status --watch ended: {process.stderr.read()}"
        if line.startswith("onceflow status of"):
            headers.append(line)
        else:
            assert not line.startswith("TOPICS") or headers, "every screen starts with its header"
    assert len(headers) == 2, "two screens drawn"
    code, err = _interrupt(process)
    assert code == 0 and "Traceback" not in err and "KeyboardInterrupt" not in err, err

    process = _start_watch(embedded_broker.bootstrap, "--json")
    documents = [json.loads(process.stdout.readline()) for _ in range(2)]
    assert [d["topics"][0]["name"] for d in documents] == ["watched", "watched"] and documents[1]["time_ms"] > documents[0]["time_ms"]
    code, err = _interrupt(process)
    assert code == 0 and "Traceback" not in err, err


@pytest.mark.slow
def test_an_unreachable_broker_is_one_line_and_exit_2_as_for_the_other_client_commands():
    result = subprocess.run([sys.executable, "-m", "onceflow", "status", "--bootstrap-server", "127.0.0.1:1"], cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("onceflow status: cannot reach a broker at 127.0.0.1:1"), result.stderr


def test_an_unknown_topic_is_refused(embedded_broker, capsys):
    code = main(["status", "--bootstrap-server", embedded_broker.bootstrap, "--topic", "missing"])
    captured = capsys.readouterr()
    assert code == 1 and captured.err == "onceflow status: unknown topic 'missing'\n" and captured.out == ""


def test_it_takes_the_client_commands_security_options(tmp_path, capsys):
    code = main(["status", "--bootstrap-server", "127.0.0.1:1", "--command-config", str(tmp_path / "missing.properties")])
    captured = capsys.readouterr()
    assert code == 1 and captured.err.startswith("onceflow status: cannot read --command-config") and captured.err.count("\n") == 1
    properties = tmp_path / "client.properties"
    properties.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n")
    args = build_parser().parse_args(["status", "--command-config", str(properties), "--sasl-username", "ops", "--sasl-password", "secret"])
    assert {key: client_options(args)[key] for key in ("security.protocol", "sasl.mechanism", "sasl.username")} == {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "ops"}


@pytest.mark.slow
def test_watch_outlives_the_broker_and_still_ends_on_sigint(broker_process, tmp_path):
    broker = broker_process()
    errors = tmp_path / "status.err"
    with open(errors, "w") as err_file:
        process = subprocess.Popen([sys.executable, "-m", "onceflow", "status", "--bootstrap-server", broker.bootstrap, "--watch", "0.3"],
                                   cwd=REPO, stdout=subprocess.PIPE, stderr=err_file, text=True, preexec_fn=_default_sigint)
    try:
        wait_for(lambda: process.stdout.readline().startswith("onceflow status of"), timeout=60, what="a first screen")
        broker.kill()
        wait_for(lambda: "retrying every 0.3s" in errors.read_text(), timeout=60, what="a failed refresh reported")
        assert process.poll() is None, "a failed refresh does not end --watch"
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    text = errors.read_text()
    assert "Traceback" not in text and all(line.startswith("onceflow status: ") for line in text.splitlines()), text


def test_a_group_committed_past_the_lso_has_no_lag_there_and_it_lowers_no_other():
    """A read_uncommitted consumer may commit past the LSO (an open
    transaction's records): a read_committed one has nothing left to read
    there (lag 0, not negative), and the group's total is not lowered by it."""
    from types import SimpleNamespace

    from txn.types import OffsetAndMetadata, TopicPartition

    ahead, behind = TopicPartition("t", 0), TopicPartition("t", 1)
    group = SimpleNamespace(group_id="g", state="Empty", protocol_type="consumer", protocol="", members=[])
    committed = {ahead: OffsetAndMetadata(9, ""), behind: OffsetAndMetadata(2, "")}
    offsets = {ahead: (0, 10, 6), behind: (0, 5, 5)}  # (log start, high watermark, LSO)
    status = status_command._group_status(group, committed, offsets, ())
    assert [(row.partition, row.lag, row.lag_uncommitted) for row in status.offsets] == [(0, 0, 1), (1, 3, 3)]
    assert status.lag == 3
