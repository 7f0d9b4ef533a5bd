"""streaming.testing.TestDriver: an app's processors, dataflow chains,
stores, windows and dead letters driven without a broker, through the
runner's own per-record code (streaming.task); the broker tests of the same
behaviours are test_runner_*.py and test_dataflow_broker.py."""

from __future__ import annotations

import datetime
import json
import random

import pytest

import streaming
from streaming.errors import ProcessingError
from streaming.testing import TestDriver
from streaming.windows import tumbling


def balances_app(tmp_path, **options) -> streaming.App:
    app = streaming.App("127.0.0.1:1", application_id="balances", state_dir=str(tmp_path / "state"), **options)

    @app.processor(source="payments", sink="balances", stores=["balances"], key_format="str", value_format="json")
    def running_balance(record, ctx):
        store = ctx.store("balances")
        balance = store.get(record.key, 0) + record.value["amount"]
        store.put(record.key, balance)
        ctx.emit(record.key, {"account": record.key, "balance": balance})

    return app


def test_the_issues_example_pipes_reads_and_looks_into_the_store(tmp_path):
    driver = TestDriver(balances_app(tmp_path))
    driver.pipe("payments", "acct-1", {"amount": 5}, timestamp=1_000)
    assert driver.read("balances") == [("acct-1", {"account": "acct-1", "balance": 5})]
    assert driver.store("balances")["acct-1"] == 5
    driver.pipe_many("payments", [("acct-1", {"amount": 2}), ("acct-2", {"amount": 7}, 2_000)])
    assert driver.read("balances") == [("acct-1", {"account": "acct-1", "balance": 7}), ("acct-2", {"account": "acct-2", "balance": 7})]
    assert driver.read("balances") == [], "read hands each record out once"
    assert driver.store("balances") == {"acct-1": 7, "acct-2": 7}
    assert driver.app.metrics["records_in"] == 3 and driver.app.metrics["records_out"] == 3
    driver.advance_wall_clock(datetime.timedelta(minutes=1))
    driver.pipe("payments", "acct-3", {"amount": 1})
    (record,) = driver.read_records("balances")
    assert record.timestamp == 60_000, "a record piped without a timestamp carries the wall clock"


def test_records_carry_timestamps_and_headers_and_land_on_the_producers_partition(tmp_path):
    app = streaming.App("127.0.0.1:1", application_id="echo", state_dir=str(tmp_path / "state"))

    @app.processor(source="in", sink="out", key_format="str", value_format="str")
    def echo(record, ctx):
        ctx.emit(record.key, record.value.upper(), headers=record.headers + (("seen-at", str(record.partition).encode()),), timestamp=record.timestamp + 1)

    driver = TestDriver(app, partitions={"in": 4, "out": 4})
    from protocol.partitioning import default_partition

    driver.pipe("in", "k", "v", timestamp=10, headers=(("trace", b"1"),))
    (record,) = driver.read_records("out")
    expected_partition = default_partition(b"k", 4, None)
    assert (record.key, record.value, record.timestamp, record.partition) == ("k", "V", 11, expected_partition)
    assert record.headers == (("trace", b"1"), ("seen-at", str(expected_partition).encode()))


def test_a_failing_record_goes_to_the_dead_letters_with_why_and_leaves_no_trace(tmp_path):
    app = balances_app(tmp_path, on_error="dead-letter")
    driver = TestDriver(app)
    driver.pipe("payments", "acct-1", {"amount": 5}, timestamp=1)
    driver.pipe("payments", "acct-1", {"no-amount": 1}, timestamp=2)  # KeyError in the processor
    driver.pipe_bytes("payments", b"acct-1", b"{not json", timestamp=3)
    driver.pipe("payments", "acct-1", {"amount": 1}, timestamp=4)
    assert [value["balance"] for _key, value in driver.read("balances")] == [5, 6]
    first, second = driver.dead_letters()
    assert (first.stage, first.processor, first.offset, first.key, json.loads(first.value)) == ("processing", "running_balance", 1, b"acct-1", {"no-amount": 1})
    assert first.error.startswith("KeyError")
    assert (second.stage, second.offset, second.value) == ("deserializing", 2, b"{not json")
    assert driver.store("balances") == {"acct-1": 6}
    assert app.metrics["dead_letters"] == 2


def test_under_on_error_stop_pipe_raises_and_the_record_stays_first_in_line(tmp_path):
    driver = TestDriver(balances_app(tmp_path), commit_every=None)
    driver.pipe("payments", "acct-1", {"amount": 5})
    with pytest.raises(ProcessingError, match="payments-0@1"):
        driver.pipe("payments", "acct-1", {"amount": "five"})
    assert driver.read("balances") == [], "the open transaction (the first record's output) was aborted"
    assert driver.store("balances") == {}
    # Like a restarted runner: from the last commit (nothing yet), @0 again, then @1 fails again.
    with pytest.raises(ProcessingError, match="payments-0@1"):
        driver.pipe("payments", "acct-2", {"amount": 1})
    assert driver.app.metrics["records_in"] == 2, "@0 twice, the failing one never"


def test_a_dataflow_chain_repartitions_and_windows_through_the_same_code(tmp_path):
    app = streaming.App("127.0.0.1:1", application_id="words", state_dir=str(tmp_path / "state"))
    (app.stream("lines", value_format="str")
        .flat_map(str.split)
        .key_by(lambda word: word)
        .window(tumbling(datetime.timedelta(minutes=1)), grace=10_000)
        .count(store="counts")
        .to("word-counts", key_format="str", value_format="json"))
    driver = TestDriver(app, partitions={"lines": 2})
    driver.pipe("lines", None, "a b a", timestamp=1_000)
    driver.pipe("lines", None, "b", timestamp=59_000)
    assert driver.read("word-counts") == [], "nothing closes before stream time passes end + grace"
    assert driver.partitions("words-lines-to-word-counts-repartition-0") == 2
    driver.pipe("lines", None, "c", timestamp=71_000)  # stream time 71 s on the partition(s) it reaches
    driver.pipe("lines", None, "a b c", timestamp=200_000)  # every word's partition passes 70 s
    closed = sorted(driver.read("word-counts"))
    assert closed == [("a", {"start": 0, "end": 60_000, "value": 2}), ("b", {"start": 0, "end": 60_000, "value": 2}),
                      ("c", {"start": 60_000, "end": 120_000, "value": 1})]
    driver.pipe("lines", None, "a", timestamp=5_000)  # 195 s late
    assert app.metrics["late_records_dropped"] == 1


def test_uncommitted_output_is_invisible_and_commit_shows_it(tmp_path):
    driver = TestDriver(balances_app(tmp_path), commit_every=None)
    driver.pipe("payments", "acct-1", {"amount": 5})
    assert driver.read("balances") == []
    assert driver.store("balances") == {"acct-1": 5}, "a processor sees its own pending writes"
    assert driver.changelog("balances") == {}
    driver.commit()
    assert driver.read("balances") == [("acct-1", {"account": "acct-1", "balance": 5})]
    assert driver.changelog("balances") == {"acct-1": 5}


def crashing_balances(tmp_path, crash_after: list[int], remember_outside: bool):
    """The balances app, but with ``remember_outside`` it keeps the balances
    in a dict of its own as well as its store (the bug a crash test finds)."""
    app = streaming.App("127.0.0.1:1", application_id="balances", state_dir=str(tmp_path / "state"))
    outside: dict = {}

    @app.processor(source="payments", sink="balances", stores=["balances"], key_format="str", value_format="json")
    def running_balance(record, ctx):
        store = ctx.store("balances")
        balance = (outside.get(record.key, 0) if remember_outside else store.get(record.key, 0)) + record.value["amount"]
        outside[record.key] = balance
        store.put(record.key, balance)
        ctx.emit(record.key, balance)

    return app


@pytest.mark.parametrize("remember_outside", [False, True])
def test_a_crash_replays_from_the_last_commit_and_finds_state_kept_outside_the_stores(tmp_path, remember_outside):
    payments = [(f"acct-{random.Random(seed).randrange(3)}", {"amount": seed}) for seed in range(20)]
    straight = TestDriver(crashing_balances(tmp_path / "a", [], remember_outside), commit_every=3)
    straight.pipe_many("payments", payments)
    straight.commit()
    crashed = TestDriver(crashing_balances(tmp_path / "b", [], remember_outside), commit_every=3)
    for index, (key, value) in enumerate(payments):
        crashed.pipe("payments", key, value)
        if index in (4, 11, 16):
            crashed.crash()  # 1 or 2 uncommitted records are lost and processed again
    crashed.commit()
    expected = straight.read("balances")
    if remember_outside:
        assert crashed.read("balances") != expected, "a replay double-counts what the dict kept"
    else:
        assert crashed.read("balances") == expected
        assert crashed.store("balances") == straight.store("balances")
        assert crashed.app.metrics["records_in"] > straight.app.metrics["records_in"], "records were processed again"


def test_bad_arguments_are_refused_clearly(tmp_path):
    driver = TestDriver(balances_app(tmp_path))
    with pytest.raises(ValueError, match="no processor of the app reads 'nope'"):
        driver.pipe("nope", "k", {})
    with pytest.raises(KeyError, match="no store 'nope'"):
        driver.store("nope")
    with pytest.raises(ValueError, match="only moves forward"):
        driver.advance_wall_clock(-1)
    with pytest.raises(TypeError, match="timedelta or a number of milliseconds"):
        driver.advance_wall_clock("1s")
    with pytest.raises(ValueError, match="has 1 partition"):
        driver.pipe("payments", "k", {"amount": 1}, partition=3)


# -- time: timers, event time -------------------------------------------------------------------


def sessions_app(tmp_path, kind: str, every=datetime.timedelta(minutes=1)) -> streaming.App:
    """Counts clicks per user; a timer emits and forgets the users idle for a minute."""
    app = streaming.App("127.0.0.1:1", application_id="idle", state_dir=str(tmp_path / "state"))

    @app.processor(source="clicks", sink="idle-users", stores=["last-click"], key_format="str", value_format="json")
    def track(record, ctx):
        ctx.store("last-click").put(record.key, record.timestamp)

    @app.schedule("track", every=every, kind=kind)
    def expire(ctx):
        store = ctx.store("last-click")
        for user, last in list(store.items()):
            if ctx.timestamp - last >= 60_000:
                store.delete(user)
                ctx.emit(user, {"idle-since": last})

    return app


def test_a_wall_clock_timer_fires_on_an_idle_partition_and_writes_in_the_transaction(tmp_path):
    driver = TestDriver(sessions_app(tmp_path, "wall_clock"), commit_every=None)
    driver.pipe("clicks", "ann", {}, timestamp=0)
    driver.pipe("clicks", "bob", {}, timestamp=30_000)
    driver.commit()
    driver.advance_wall_clock(59_999)
    assert driver.read("idle-users") == [], "not due before the first multiple of the interval"
    driver.advance_wall_clock(1)  # 60 s: the timer runs (for ctx.timestamp 60 000) without any record
    driver.commit()
    assert driver.read_records("idle-users")[0].timestamp == 60_000
    assert driver.store("last-click") == {"bob": 30_000}
    driver.advance_wall_clock(datetime.timedelta(minutes=5))  # several intervals late: fires once, for 360 s
    driver.commit()
    assert driver.read("idle-users") == [("bob", {"idle-since": 30_000})]


def test_a_timers_writes_are_lost_with_the_transaction_and_redone_after_a_crash(tmp_path):
    driver = TestDriver(sessions_app(tmp_path, "wall_clock"), commit_every=None)
    driver.pipe("clicks", "ann", {}, timestamp=0)
    driver.commit()
    driver.advance_wall_clock(60_000)  # fires: deletes ann, emits; not committed
    assert driver.store("last-click") == {}
    driver.crash()
    assert driver.store("last-click") == {"ann": 0}, "the timer's delete was in the lost transaction"
    assert driver.read("idle-users") == []
    driver.advance_wall_clock(60_000)
    driver.commit()
    assert driver.read("idle-users") == [("ann", {"idle-since": 0})]
    driver.advance_wall_clock(60_000)
    driver.commit()
    assert driver.read("idle-users") == [], "the committed next fire time keeps it from firing twice for one slot"


def test_a_stream_time_timer_follows_the_records_event_time_not_the_clock(tmp_path):
    driver = TestDriver(sessions_app(tmp_path, "stream_time"))
    driver.pipe("clicks", "ann", {}, timestamp=10_000)
    driver.pipe("clicks", "bob", {}, timestamp=50_000)
    driver.advance_wall_clock(datetime.timedelta(hours=1))
    assert driver.read("idle-users") == [], "the wall clock does not move stream time"
    driver.pipe("clicks", "bob", {}, timestamp=75_000)  # stream time passes 60 s: fires for 60 000
    assert driver.read("idle-users") == []  # ann's last click is 50 s before 60 000
    driver.pipe("clicks", "cid", {}, timestamp=70_000)  # out of order: stream time stays 75 s
    driver.pipe("clicks", "cid", {}, timestamp=125_000)  # fires for 120 000: ann idle since 10 000
    assert driver.read("idle-users") == [("ann", {"idle-since": 10_000})]
    assert driver.store("track-timers") == {"stream-time": 125_000, ("next", "expire"): 180_000}


def test_a_timestamp_extractor_gives_event_time_from_the_payload(tmp_path):
    app = streaming.App("127.0.0.1:1", application_id="et", state_dir=str(tmp_path / "state"), on_error="dead-letter")

    @app.processor(source="events", sink="out", key_format="str", value_format="json", timestamp_extractor=lambda record: record.value["at"])
    def stamp(record, ctx):
        ctx.emit(record.key, {"seen": record.timestamp, "ctx": ctx.timestamp})

    (app.stream("events", key_format="str", value_format="json", timestamp_extractor=lambda record: record.value["at"])
        .window(tumbling(1_000)).count().to("per-second", value_format="json"))
    driver = TestDriver(app)
    driver.pipe("events", "a", {"at": 5_500}, timestamp=1)
    (record,) = driver.read_records("out")
    assert record.value == {"seen": 5_500, "ctx": 5_500} and record.timestamp == 5_500
    driver.pipe("events", "a", {"at": 7_000}, timestamp=2)
    assert driver.read("per-second") == [("a", {"start": 5_000, "end": 6_000, "value": 1})]
    driver.pipe("events", "a", {"at": "soon"}, timestamp=3)
    letters = driver.dead_letters()
    assert [letter.stage for letter in letters] == ["extracting the timestamp"] * 2


def test_timers_are_refused_clearly_when_misdeclared(tmp_path):
    from txn.errors import ConfigError

    app = balances_app(tmp_path)
    with pytest.raises(ConfigError, match="no processor is named 'nope'"):
        app.schedule("nope", every=1_000)(lambda ctx: None)
    with pytest.raises(ConfigError, match="kind"):
        app.schedule("running_balance", every=1_000, kind="cpu_time")
    with pytest.raises(ValueError, match="positive"):
        app.schedule("running_balance", every=0)


def test_session_windows_merge_close_after_gap_plus_grace_and_route_late_records(tmp_path):
    from streaming.windows import session

    late: list = []
    app = streaming.App("127.0.0.1:1", application_id="visits", state_dir=str(tmp_path / "state"))
    (app.stream("clicks", key_format="str", value_format="json")
        .window(session(datetime.timedelta(seconds=30)), grace=datetime.timedelta(seconds=15), on_late="late-clicks")
        .count(store="visits")
        .to("visits", value_format="json"))
    (app.stream("clicks", key_format="str", value_format="json")
        .window(session(30_000), on_late=lambda key, value, timestamp: late.append((key, timestamp)))
        .aggregate(0, lambda total, click: total + click["n"], merge=lambda a, b: a + b, store="totals")
        .to("totals", value_format="json"))
    driver = TestDriver(app)
    for t in (0, 20_000, 60_000, 45_000):  # 45 s bridges [0 s, 20 s] and [60 s]: one session of four, 0..60 s
        driver.pipe("clicks", "ann", {"n": 1}, timestamp=t)
    driver.pipe("clicks", "ann", {"n": 1}, timestamp=95_000)  # a new session; stream time 95 s
    # Without grace, [0 s, 20 s] closed when 60 s came (20 + 30 <= 60): 45 s merged only with 60 s.
    assert driver.read("totals") == [("ann", {"start": 0, "end": 20_000, "value": 2}), ("ann", {"start": 45_000, "end": 60_000, "value": 2})]
    assert driver.read("visits") == [], "with 15 s of grace, 45 s came in time to merge; it closes at 60 + 30 + 15 s"
    driver.pipe("clicks", "ann", {"n": 1}, timestamp=105_000)
    assert driver.read("visits") == [("ann", {"start": 0, "end": 60_000, "value": 4})]
    driver.pipe("clicks", "ann", {"n": 7}, timestamp=5_000)  # its session is gone: late for both
    assert driver.read("late-clicks") == [("ann", {"n": 7})]
    assert late == [("ann", 5_000)]
    assert driver.app.metrics["late_records_dropped"] == 2
    driver.pipe("clicks", "ann", {"n": 1}, timestamp=200_000)
    assert driver.read("totals") == [("ann", {"start": 95_000, "end": 105_000, "value": 2})]


def test_session_aggregates_need_a_merge(tmp_path):
    from streaming.windows import session

    app = streaming.App("127.0.0.1:1", application_id="visits", state_dir=str(tmp_path / "state"))
    with pytest.raises(ValueError, match="merge="):
        app.stream("clicks").window(session(1_000)).aggregate(0, lambda a, v: a + 1)


@pytest.mark.parametrize("crashes", [False, True])
def test_the_sessions_example_gives_its_recomputed_output_crashes_or_not(tmp_path, crashes):
    """examples/sessions.py (session and sliding windows, a stream-time timer, event time
    from the payload) against the output its module recomputes from the
    input alone; with crashes every few records (the open transaction lost,
    stores rebuilt from their changelogs, input read again from the commit)."""
    import importlib.util
    import os
    from collections import Counter

    from faults.process import REPO
    from faults.workloads import output_text

    spec = importlib.util.spec_from_file_location("sessions_example", os.path.join(REPO, "examples", "sessions.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    driver = TestDriver(module.build_app("127.0.0.1:1", str(tmp_path / "state")), partitions=module.CHAOS_TOPICS, commit_every=7)
    fed = []
    rng = random.Random(5)
    for phase in module.chaos_input(600, seed=11):
        for index, (topic, key, value, timestamp, partition) in enumerate(phase):
            driver.pipe_bytes(topic, key.encode(), value.encode(), timestamp=timestamp, partition=partition)
            if crashes and rng.random() < 0.05:
                driver.crash()
        driver.commit()
        fed += phase
    got = Counter(output_text(key, json.dumps(value)) for key, value in driver.read(module.CHAOS_OUTPUT))
    want = Counter(output_text(key, json.dumps(value)) for key, value in module.expected(fed))
    assert got == want
    kinds = Counter(value["kind"] for _key, value in module.expected(fed))
    assert kinds["session"] > 20 and kinds["tick"] > 20 and kinds["burst"] > 20, kinds


# -- friendlier edges -------------------------------------------------------------------------------


def test_a_sinks_format_follows_what_is_emitted_not_the_source(tmp_path):
    app = streaming.App("127.0.0.1:1", application_id="shapes", state_dir=str(tmp_path / "state"))

    @app.processor(source="lines", sink="parsed", key_format="str", value_format="str")
    def parse(record, ctx):  # reads text, emits a dict: the sink writes JSON (it used to try "str" and fail)
        word, count = record.value.split("=")
        ctx.emit(record.key, {"word": word, "count": int(count)})

    app.stream("lines", key_format="str", value_format="str").map(str.encode).to("raw")  # bytes stay bytes
    driver = TestDriver(app)
    driver.pipe("lines", "k", "fox=3")
    assert driver.read("parsed") == [("k", {"word": "fox", "count": 3})]
    assert driver.read_records("raw")[0].value == "fox=3", "bytes as they are (read back as text by the auto format)"


def test_to_returns_the_stream_so_a_chain_goes_on(tmp_path):
    app = streaming.App("127.0.0.1:1", application_id="chain", state_dir=str(tmp_path / "state"))
    (app.stream("in", key_format="str", value_format="json")
        .map(lambda v: v["n"]).to("numbers")
        .map(lambda n: n * 10).to("tens"))
    driver = TestDriver(app)
    driver.pipe("in", "k", {"n": 4})
    assert driver.read("numbers") == [("k", 4)] and driver.read("tens") == [("k", 40)]


def test_run_async_runs_inside_a_running_event_loop(embedded_broker, tmp_path):
    import asyncio

    from txn import Admin, Producer

    with Admin(bootstrap_servers=embedded_broker.bootstrap) as admin:
        admin.create_topics({"payments": 1, "balances": 1})
    with Producer(bootstrap_servers=embedded_broker.bootstrap) as producer:
        producer.send("payments", b'{"amount": 5}', key=b"acct-1")
    app = balances_app(tmp_path)
    app.bootstrap_servers = embedded_broker.bootstrap

    async def main():  # as in Jupyter or an async server: a loop is already running
        other_work = asyncio.create_task(asyncio.sleep(0.01, result="ran alongside"))
        await app.run_async(until_idle=1.0)
        return await other_work

    assert asyncio.run(main()) == "ran alongside"
    assert app.metrics["records_in"] == 1 and app.metrics["commits"] >= 1


def test_sliding_windows_emit_on_close_or_on_update_and_route_late_records(tmp_path):
    from streaming.windows import sliding

    app = streaming.App("127.0.0.1:1", application_id="bursts", state_dir=str(tmp_path / "state"))
    (app.stream("clicks", key_format="str", value_format="json")
        .window(sliding(datetime.timedelta(seconds=10)), grace=15_000, on_late="late-clicks")
        .count(store="bursts")
        .to("bursts", value_format="json"))
    (app.stream("clicks", key_format="str", value_format="json")
        .window(sliding(10_000), emit="update")
        .aggregate(0, lambda total, click: total + click["n"], store="totals")
        .to("totals", value_format="json"))
    driver = TestDriver(app)
    for t in (10_000, 15_000, 30_000):
        driver.pipe("clicks", "ann", {"n": 1}, timestamp=t)
    assert driver.read("bursts") == [("ann", {"start": 0, "end": 10_000, "value": 1})], "10 s + 15 s of grace is past; 15 s + 15 s is not"
    assert driver.read("totals") == [
        ("ann", {"start": 0, "end": 10_000, "value": 1}),
        ("ann", {"start": 5_000, "end": 15_000, "value": 2}), ("ann", {"start": 10_001, "end": 20_001, "value": 1}),  # 15 s fell in 10 s's right window
        ("ann", {"start": 20_000, "end": 30_000, "value": 1}),
    ]
    driver.pipe("clicks", "ann", {"n": 1}, timestamp=20_000)  # in time for grace 15 s, late for grace 0
    driver.pipe("clicks", "ann", {"n": 1}, timestamp=14_000)  # late for both
    assert driver.read("late-clicks") == [("ann", {"n": 1})]
    assert driver.app.metrics["late_records_dropped"] == 3
    driver.pipe("clicks", "ann", {"n": 1}, timestamp=100_000)
    assert driver.read("bursts") == [
        ("ann", {"start": 5_000, "end": 15_000, "value": 2}), ("ann", {"start": 10_000, "end": 20_000, "value": 3}),
        ("ann", {"start": 10_001, "end": 20_001, "value": 2}), ("ann", {"start": 15_001, "end": 25_001, "value": 1}),
        ("ann", {"start": 20_000, "end": 30_000, "value": 2}), ("ann", {"start": 20_001, "end": 30_001, "value": 1}),
    ]
    assert driver.read("totals") == [("ann", {"start": 90_000, "end": 100_000, "value": 1})]


@pytest.mark.parametrize("windows", ["tumbling", "session", "sliding"])
def test_windows_of_an_idle_partition_close_by_the_wall_clock_when_asked(tmp_path, windows):
    from streaming.windows import session, sliding

    definition = {"tumbling": tumbling(10_000), "session": session(5_000), "sliding": sliding(5_000)}[windows]
    app = streaming.App("127.0.0.1:1", application_id="idle-windows", state_dir=str(tmp_path / "state"))
    (app.stream("clicks", key_format="str", value_format="json")
        .window(definition, grace=1_000, close_when_idle=datetime.timedelta(seconds=3))
        .count(store="idle-closed")
        .to("idle-closed", value_format="json"))
    (app.stream("clicks", key_format="str", value_format="json")
        .window(definition, grace=1_000)
        .count(store="by-records")
        .to("by-records", value_format="json"))
    driver = TestDriver(app, partitions=2, commit_every=None)
    driver.pipe("clicks", "ann", {}, timestamp=4_000, partition=0)
    driver.pipe("clicks", "bob", {}, timestamp=4_000, partition=1)
    driver.commit()
    driver.advance_wall_clock(3_000)  # the first check: both partitions had a record since the start
    driver.pipe("clicks", "bob", {}, timestamp=4_500, partition=1)  # partition 1 stays busy
    driver.advance_wall_clock(9_000)  # 12 s: partition 0 was idle for a whole check, its clock is past every window's end + grace
    assert driver.read("idle-closed") == [], "emitted in the open transaction"
    driver.commit()
    (closed,) = driver.read("idle-closed")
    assert closed[0] == "ann" and closed[1]["value"] == 1
    assert driver.read("by-records") == [], "without the option only records move stream time"
    driver.pipe("clicks", "ann", {}, timestamp=4_000, partition=0)  # stream time is the clock's 12 s now: late
    driver.commit()
    assert driver.app.metrics["late_records_dropped"] == 1
    driver.advance_wall_clock(3_000)
    driver.commit()
    assert {key for key, _value in driver.read("idle-closed")} == {"bob"}, "partition 1 idle since its last record"
