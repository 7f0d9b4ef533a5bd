"""The runner against a real broker process: exactly-once output and state
across restarts, a lost state directory, a SQLite file ahead of its
changelog, the crash between the Kafka commit and the SQLite apply, dead
letters, stop-on-error and a poison record in the middle of a transaction."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import sys
from collections import Counter

import pytest

import streaming
from faults.points import CRASH_EXIT_CODE
from faults.process import REPO
from streaming.store import encode_key, encode_value
from tests.helpers import read_all
from tests.streaming.runner_support import (
    BROKER_CONFIG, CHANGELOG, app_process, changelog_state, create_topics, expected, log_text, payments, send_payments, sqlite_state,
)
from txn import Admin, TopicPartition

sys.path.insert(0, os.path.join(REPO, "examples"))
from payments_pipeline import build_app  # noqa: E402

pytestmark = pytest.mark.slow  # each runs the app against a broker process for 6-20 s

FAST = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 300, "transaction_timeout_ms": 6000}


def outputs_of(bootstrap: str, partitions: int = 3, expect: int | None = None) -> Counter:
    return Counter(r.value.decode() for r in read_all(bootstrap, "balances", partitions, expect=expect))


def assert_store_files_match(state_dir: str, balances: dict, bootstrap: str) -> None:
    """Every SQLite file is at its changelog's end (the offset after our last
    record there; only the transaction's COMMIT marker may follow) and together
    they hold exactly the balances."""
    files = sqlite_state(state_dir)
    assert files, "no store files"
    with Admin(bootstrap_servers=bootstrap) as admin:
        ends = admin.list_offsets({TopicPartition(CHANGELOG, p): "latest" for p in files})
    in_files = {}
    for partition, (offset, contents) in files.items():
        end = ends[TopicPartition(CHANGELOG, partition)].offset
        assert end - 1 <= offset <= end, f"file {partition} at {offset}, changelog end {end}"
        in_files.update(contents)
    assert in_files == balances


@pytest.fixture
def payments_broker(broker_process):
    """A broker of the test's own (each counts everything in its topics)
    with the payments and balances topics."""
    broker = broker_process(*BROKER_CONFIG)
    create_topics(broker.bootstrap)
    return broker


def test_balances_exactly_once_across_restarts_and_a_lost_state_dir(payments_broker, tmp_path):
    broker = payments_broker
    state_dir = str(tmp_path / "state")
    events = payments(900, seed=1)
    send_payments(broker.bootstrap, events)
    app = build_app(broker.bootstrap, state_dir, commit_records=40, **FAST)
    app.run(until_idle=1.5)
    outputs, balances = expected(events)
    assert app.metrics["records_in"] == 900 and app.metrics["commits"] >= 900 // 40
    assert outputs_of(broker.bootstrap, expect=900) == Counter(outputs.values())
    assert changelog_state(broker.bootstrap) == balances
    assert_store_files_match(state_dir, balances, broker.bootstrap)
    instance = app.instance_id

    more = payments(400, seed=2, start=900)
    send_payments(broker.bootstrap, more)
    again = build_app(broker.bootstrap, state_dir, **FAST)
    again.run(until_idle=1.5)
    outputs, balances = expected(events + more)
    assert again.instance_id == instance, "the instance id is kept in the state dir"
    assert again.metrics.get("restored_records", 0) == 0, "the SQLite files were current: nothing to restore"
    assert again.metrics["records_in"] == 400
    assert outputs_of(broker.bootstrap, expect=1300) == Counter(outputs.values())
    assert_store_files_match(state_dir, balances, broker.bootstrap)

    shutil.rmtree(state_dir)
    last = payments(300, seed=3, start=1300)
    send_payments(broker.bootstrap, last)
    rebuilt = build_app(broker.bootstrap, state_dir, **FAST)
    rebuilt.run(until_idle=1.5)
    outputs, balances = expected(events + more + last)
    assert rebuilt.instance_id != instance
    assert rebuilt.metrics["restored_records"] > 0 and rebuilt.metrics["records_in"] == 300
    assert outputs_of(broker.bootstrap, expect=1600) == Counter(outputs.values())
    assert_store_files_match(state_dir, balances, broker.bootstrap)


def test_a_sqlite_file_ahead_of_its_changelog_is_rebuilt_not_trusted(payments_broker, tmp_path):
    broker = payments_broker
    state_dir = str(tmp_path / "state")
    events = payments(300, seed=4)
    send_payments(broker.bootstrap, events)
    build_app(broker.bootstrap, state_dir, **FAST).run(until_idle=1.0)
    # A file claiming a position the changelog never reached, with a wrong balance:
    # what a state dir from another cluster, or a recreated changelog, looks like.
    account = events[0][0]
    for partition, (_offset, contents) in sqlite_state(state_dir).items():
        path = os.path.join(state_dir, "stores", f"balances-{partition}.sqlite")
        db = sqlite3.connect(path)
        with db:
            db.execute("UPDATE position SET next_offset = 1000000")
            if account in contents:
                db.execute("UPDATE entries SET value = ? WHERE key = ?", (encode_value(10**9), encode_key(account)))
        db.close()
    more = payments(200, seed=5, start=300)
    send_payments(broker.bootstrap, more)
    app = build_app(broker.bootstrap, state_dir, **FAST)
    app.run(until_idle=1.5)
    outputs, balances = expected(events + more)
    assert app.metrics["store_rebuilds"] == 3
    assert outputs_of(broker.bootstrap, expect=500) == Counter(outputs.values())
    assert_store_files_match(state_dir, balances, broker.bootstrap)


def test_a_sqlite_file_behind_the_changelogs_start_is_rebuilt(payments_broker, tmp_path):
    """Records the file lacks were deleted from the changelog (DeleteRecords
    here; retention on a misconfigured topic alike): catching up from the file
    would miss them, so it is thrown away and rebuilt from what is left."""
    broker = payments_broker
    state_dir, old_copy = str(tmp_path / "state"), str(tmp_path / "old-state")
    events = payments(200, seed=9)
    send_payments(broker.bootstrap, events[:100])
    build_app(broker.bootstrap, state_dir, **FAST).run(until_idle=1.0)
    shutil.copytree(state_dir, old_copy)
    send_payments(broker.bootstrap, events[100:])
    build_app(broker.bootstrap, state_dir, **FAST).run(until_idle=1.0)
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        ends = admin.list_offsets({TopicPartition(CHANGELOG, p): "latest" for p in range(3)})
        admin.delete_records({tp: listed.offset for tp, listed in ends.items()})
    shutil.rmtree(state_dir)
    shutil.copytree(old_copy, state_dir)  # files from before the deleted records
    app = build_app(broker.bootstrap, state_dir, **FAST)
    app.run(until_idle=1.0)
    assert app.metrics["store_rebuilds"] == 3
    assert all(contents == {} for _offset, contents in sqlite_state(state_dir).values()), "nothing is left to rebuild from"


def test_crash_between_the_kafka_commit_and_the_sqlite_apply(payments_broker, tmp_path):
    broker = payments_broker
    state_dir = str(tmp_path / "state")
    events = payments(600, seed=6)
    send_payments(broker.bootstrap, events)
    crashing = app_process("crashing", broker.bootstrap, state_dir, str(tmp_path), until_idle=3, extra={"commit_records": 50},
                           env={"ONCEFLOW_CRASH_POINTS": "streaming.after_commit_before_store_apply@4:exit"}).start()
    assert crashing.wait_exit(120) == CRASH_EXIT_CODE, log_text(crashing)
    # Four transactions committed; the files hold at most three of them.
    files = sqlite_state(state_dir)
    committed = changelog_state(broker.bootstrap)
    assert sum(len(contents) for _offset, contents in files.values()) <= len(committed)
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        ends = admin.list_offsets({TopicPartition(CHANGELOG, p): "latest" for p in range(3)})
    assert any(files.get(p, (0, {}))[0] < ends[TopicPartition(CHANGELOG, p)].offset for p in range(3)), "some file must be behind"
    resumed = app_process("resumed", broker.bootstrap, state_dir, str(tmp_path), until_idle=2, progress=0.5).start()
    assert resumed.wait_exit(120) == 0, log_text(resumed)
    assert "restored" in log_text(resumed)
    assert re.search(r"payments-pipeline/\w+: in [\d,]+/s out [\d,]+/s, \d+ commits, \d+ aborts; lag payments-0:\d+ payments-1:\d+ payments-2:\d+", log_text(resumed)), "the progress line"
    outputs, balances = expected(events)
    assert outputs_of(broker.bootstrap, expect=600) == Counter(outputs.values())
    assert_store_files_match(state_dir, balances, broker.bootstrap)


def poison_app(bootstrap: str, state_dir: str, **options) -> streaming.App:
    """Balances where a payment of amount "BOOM" raises after writing the store."""
    app = streaming.App(bootstrap, "poison", state_dir, **{**FAST, **options})

    @app.processor(source="payments", sink="balances", stores=["balances"], key_format="str", value_format="str")
    def running_balance(record, ctx):
        payment_id, account, amount = record.value.split(":")
        balances = ctx.store("balances")
        balances.put(account, 10**9)  # must vanish with a failed record (a good one overwrites it)
        if amount == "BOOM":
            ctx.emit(account, "must not appear")
        balance = balances.get("real:" + account, 0) + int(amount)
        balances.put(account, balance)
        balances.put("real:" + account, balance)
        ctx.emit(account, f"{payment_id}:{account}:{balance}")

    return app


def test_dead_letters_in_the_same_transaction_lose_nothing_else(broker_process, tmp_path):
    broker = broker_process(*BROKER_CONFIG)
    create_topics(broker.bootstrap, partitions=1)
    events = payments(300, seed=7)
    poison = [(events[100][0], f"p9000001:{events[100][0]}:BOOM"), (events[200][0], b"\xff\xfe not utf-8")]
    stream = events[:100] + [poison[0]] + events[100:200] + [poison[1]] + events[200:]
    from txn import Producer

    producer = Producer(bootstrap_servers=broker.bootstrap)
    for account, value in stream:
        producer.send("payments", value if isinstance(value, bytes) else value.encode(), key=account.encode(), headers=[("trace", b"t1")])
    producer.flush()
    producer.close()
    app = poison_app(broker.bootstrap, str(tmp_path / "state"), on_error="dead-letter", commit_records=1000, commit_interval_ms=4000)
    app.run(until_idle=1.5)
    assert app.metrics["dead_letters"] == 2 and app.metrics["records_in"] == 302
    outputs, balances = expected(events)
    assert outputs_of(broker.bootstrap, partitions=1, expect=300) == Counter(outputs.values())
    dead = read_all(broker.bootstrap, "poison-dead-letters", 1, expect=2)
    assert [(r.key, r.value) for r in dead] == [(poison[0][0].encode(), poison[0][1].encode()), (poison[1][0].encode(), poison[1][1])]
    first, second = (dict(r.headers) for r in dead)
    assert first["trace"] == b"t1" and first["onceflow.source.topic"] == b"payments" and first["onceflow.source.offset"] == b"100"
    assert first["onceflow.error"].startswith(b"ValueError") and first["onceflow.error.stage"] == b"processing"
    assert first["onceflow.processor"] == b"running_balance" and first["onceflow.source.partition"] == b"0"
    assert second["onceflow.source.offset"] == b"201" and second["onceflow.error.stage"] == b"deserializing"
    state = {k: v for k, v in changelog_state_of(broker.bootstrap, "poison-balances-changelog").items() if not k.startswith("real:")}
    assert state == balances, "the failed records' store writes were dropped"


def changelog_state_of(bootstrap: str, topic: str) -> dict:
    from streaming.store import decode_key, decode_value

    state = {}
    for record in read_all(bootstrap, topic, 1):
        state[decode_key(record.key)] = decode_value(record.value)
    return state


def test_stop_on_error_names_the_record_and_commits_nothing_of_its_transaction(broker_process, tmp_path):
    broker = broker_process(*BROKER_CONFIG)
    create_topics(broker.bootstrap, partitions=1)
    events = payments(200, seed=8)
    stream = events[:150] + [(events[0][0], f"p9000001:{events[0][0]}:BOOM")] + events[150:]
    send_payments(broker.bootstrap, stream)
    for attempt in range(2):  # a restart meets the same record again: never a silent skip
        app = poison_app(broker.bootstrap, str(tmp_path / "state"), commit_records=100, commit_interval_ms=4000)
        with pytest.raises(streaming.ProcessingError) as failure:
            app.run(until_idle=5)
        assert (failure.value.topic, failure.value.partition, failure.value.offset) == ("payments", 0, 150)
        assert "payments-0@150" in str(failure.value) and "ValueError" in str(failure.value)
        outputs, _ = expected(events[:100])
        assert outputs_of(broker.bootstrap, partitions=1) == Counter(outputs.values()), "the first 100 committed, the next 50 aborted with the failure"


def test_until_idle_stops_an_app_whose_wall_clock_timer_fires_more_often(broker_process, tmp_path):
    """A wall-clock timer every 100 ms commits what it wrote, but it is not
    input: ``until_idle`` still stops the app once no record has come for its
    span (before, each timer's commit counted as activity and it never stopped)."""
    import threading

    broker = broker_process()
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({"beats-in": 1, "beats": 1})
    app = streaming.App(bootstrap_servers=broker.bootstrap, application_id="beating", state_dir=str(tmp_path / "state"), commit_interval_ms=50)

    @app.processor(source="beats-in", sink="beats", stores=["seen"], key_format="str", value_format="json")
    def remember(record, ctx):
        ctx.store("seen").put(record.key, record.value)

    @app.schedule("remember", every=100, kind="wall_clock")
    def beat(ctx):
        ctx.emit("beat", {"at": ctx.timestamp})

    runner = threading.Thread(target=app.run, kwargs={"until_idle": 1.5})
    runner.start()
    runner.join(40)
    stopped = not runner.is_alive()
    if not stopped:
        app.stop()
        runner.join(30)
    assert stopped, "until_idle did not stop the app while its timer kept firing"
    assert read_all(broker.bootstrap, "beats", 1, idle=0.5), "the timer never fired (the test would show nothing)"


def test_a_stop_asked_before_the_run_ends_it_without_processing_and_the_next_run_starts_afresh(broker_process, tmp_path):
    """``stop()`` (SIGTERM through ``onceflow run``) between loading the app and
    its run: the run returns without processing, and a later run processes."""
    broker = broker_process()
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({"words": 1, "upper": 1})
    app = streaming.App(bootstrap_servers=broker.bootstrap, application_id="shouting", state_dir=str(tmp_path / "state"))
    app.stream("words", key_format="str", value_format="str").map(str.upper).to("upper", value_format="str")
    from txn import Producer

    with Producer(bootstrap_servers=broker.bootstrap) as producer:
        producer.send("words", b"hello", key=b"w").result(30)
    app.stop()
    app.run()  # no until_idle: before, the stop was forgotten and this ran until the test's timeout
    assert read_all(broker.bootstrap, "upper", 1, idle=0.5) == []
    app.run(until_idle=1.5)
    assert [r.value for r in read_all(broker.bootstrap, "upper", 1, expect=1)] == [b"HELLO"]
