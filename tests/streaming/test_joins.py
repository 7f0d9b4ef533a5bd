"""Tables, global tables and stream-table joins (streaming.tables,
streaming.dataflow's join steps) through the TestDriver, and the picker
that puts co-partitioned inputs in timestamp order (streaming.picking).
The same app under a real broker and SIGKILLs: test_joins_broker.py."""

from __future__ import annotations

import datetime
import random

import pytest

import streaming
from streaming.picking import RecordPicker, copartition_groups
from txn.types import ConsumerRecord
from streaming.testing import TestDriver
from txn.errors import ConfigError


def enrichment_app(tmp_path, **options) -> streaming.App:
    app = streaming.App("127.0.0.1:1", application_id="enrich", state_dir=str(tmp_path / "state"), **options)
    regions = app.table("regions", key_format="str", value_format="str")
    owners = app.global_table("owners", key_format="str", value_format="json")
    payments = app.stream("payments", key_format="str", value_format="json")
    payments.join(regions, lambda payment, region: {**payment, "region": region}).to("joined")
    payments.left_join(regions, lambda payment, region: {**payment, "region": region}).to("left-joined")
    (payments.left_join(owners, lambda payment, owner: {**payment, "owner": owner and owner["name"]}, on=lambda payment: payment["owner_id"])
        .to("with-owner"))
    return app


def test_a_join_meets_the_tables_value_at_the_time_and_a_left_join_keeps_misses(tmp_path):
    driver = TestDriver(enrichment_app(tmp_path), partitions=2)
    driver.pipe("regions", "acct-1", "emea", timestamp=1)
    driver.pipe("owners", "o-1", {"name": "Ada"}, timestamp=1)
    driver.pipe("payments", "acct-1", {"id": 1, "owner_id": "o-1"}, timestamp=2)
    driver.pipe("payments", "acct-2", {"id": 2, "owner_id": "o-9"}, timestamp=3)
    driver.pipe("regions", "acct-1", "apac", timestamp=4)
    driver.pipe("payments", "acct-1", {"id": 3, "owner_id": "o-1"}, timestamp=5)
    driver.pipe("regions", "acct-1", None, timestamp=6)  # a tombstone deletes the account
    driver.pipe("payments", "acct-1", {"id": 4, "owner_id": "o-1"}, timestamp=7)

    assert driver.read("joined") == [("acct-1", {"id": 1, "owner_id": "o-1", "region": "emea"}), ("acct-1", {"id": 3, "owner_id": "o-1", "region": "apac"})]
    assert [(key, value["id"], value["region"]) for key, value in driver.read("left-joined")] == [
        ("acct-1", 1, "emea"), ("acct-2", 2, None), ("acct-1", 3, "apac"), ("acct-1", 4, None)]
    assert [(value["id"], value["owner"]) for _key, value in driver.read("with-owner")] == [(1, "Ada"), (2, None), (3, "Ada"), (4, "Ada")]
    assert driver.store("regions-table") == {}
    assert driver.changelog("regions-table", 0) == driver.changelog("regions-table", 1) == {}


def test_table_records_arriving_after_a_later_payment_in_one_poll_are_applied_first(tmp_path):
    """The same records, in every arrival order within one poll: timestamp
    order across the table and the stream decides each payment's region."""
    table = [("regions", "a", "emea", 10), ("regions", "a", "amer", 20), ("regions", "a", "apac", 25)]
    stream = [("payments", "a", {"id": 3, "owner_id": "-"}, 5), ("payments", "a", {"id": 1, "owner_id": "-"}, 15), ("payments", "a", {"id": 2, "owner_id": "-"}, 25)]
    seen, arrivals = set(), set()
    for seed in range(20):
        # one interleaving of the two topics, each in its own (offset) order
        rng = random.Random(seed)
        firsts = sorted(rng.sample(range(6), 3))
        table_left, stream_left = list(table), list(stream)
        arrival = [table_left.pop(0) if i in firsts else stream_left.pop(0) for i in range(6)]
        arrivals.add(tuple(record[0] for record in arrival))
        driver = TestDriver(enrichment_app(tmp_path / str(seed)))
        driver.pipe_together(arrival)
        seen.add(tuple((value["id"], value["region"]) for _key, value in driver.read("left-joined")))
    assert len(arrivals) > 5
    # payment 3 (5 ms) precedes every update; at 25 ms the update goes first.
    assert seen == {((3, None), (1, "emea"), (2, "apac"))}


def test_co_partitioned_inputs_go_in_the_order_of_the_sources_timestamp_extractor(tmp_path):
    """A stream whose event time is in its payload (``timestamp_extractor``)
    meets the table in that time's order, not its records' CreateTime's."""
    app = streaming.App("127.0.0.1:1", application_id="enrich", state_dir=str(tmp_path / "state"))
    regions = app.table("regions", key_format="str", value_format="str")
    (app.stream("payments", key_format="str", value_format="json", timestamp_extractor=lambda record: record.value["at"])
        .left_join(regions, lambda payment, region: {**payment, "region": region}).to("left-joined"))
    driver = TestDriver(app)
    # Stamped 1 and 2 by their producer, the payments happened at 20 and 12.
    driver.pipe_together([("regions", "a", "emea", 10), ("payments", "a", {"id": 1, "at": 20}, 1), ("payments", "a", {"id": 2, "at": 12}, 2),
                          ("regions", "a", "apac", 15)])
    # A partition's own order stands (offsets): payment 2, at 12, comes
    # after payment 1, at 20, so after the update at 15 as well.
    assert [(value["id"], value["region"]) for _key, value in driver.read("left-joined")] == [(1, "apac"), (2, "apac")]
    # Stamped 30, happened at 12: it meets the table as it was at 12.
    driver = TestDriver(app)
    driver.pipe_together([("payments", "a", {"id": 3, "at": 12}, 30), ("regions", "a", "emea", 10), ("regions", "a", "apac", 15)])
    assert [(value["id"], value["region"]) for _key, value in driver.read("left-joined")] == [(3, "emea")]


def test_a_crash_rebuilds_tables_from_their_changelog_and_global_tables_from_their_topic(tmp_path):
    driver = TestDriver(enrichment_app(tmp_path), commit_every=None)
    driver.pipe("regions", "a", "emea")
    driver.pipe("owners", "o-1", {"name": "Ada"})
    driver.commit()
    driver.pipe("regions", "a", "amer")  # not committed: lost with the crash, then read again
    driver.crash()
    driver.pipe("payments", "a", {"id": 1, "owner_id": "o-1"})
    driver.commit()
    assert driver.read("with-owner") == [("a", {"id": 1, "owner_id": "o-1", "owner": "Ada"})]
    assert driver.read("joined") == [("a", {"id": 1, "owner_id": "o-1", "region": "amer"})]


def test_a_rekeyed_stream_is_repartitioned_before_its_table_join(tmp_path):
    app = streaming.App("127.0.0.1:1", application_id="rekey", state_dir=str(tmp_path / "state"))
    regions = app.table("regions", value_format="str")
    (app.stream("payments", key_format="str", value_format="json")
        .key_by(lambda payment: payment["account"])
        .join(regions, lambda payment, region: region)
        .to("regions-of-payments"))
    assert [name for name in app.internal_topics] == ["rekey-payments-to-regions-of-payments-repartition-0"]
    assert copartition_groups(app) == [("regions", "rekey-payments-to-regions-of-payments-repartition-0")]
    driver = TestDriver(app, partitions=3)
    driver.pipe_many("regions", [("a", "emea"), ("b", "amer")])
    driver.pipe_many("payments", [("p1", {"account": "a"}), ("p2", {"account": "b"}), ("p3", {"account": "c"})])
    assert sorted(driver.read("regions-of-payments")) == [("a", "emea"), ("b", "amer")]


def test_tables_and_joins_are_declared_clearly_or_refused(tmp_path):
    app = streaming.App("127.0.0.1:1", application_id="bad", state_dir=str(tmp_path / "state"))
    regions = app.table("regions")
    with pytest.raises(ConfigError, match="already keeps store 'regions-table'"):
        app.table("regions")
    other = app.table("regions", store="regions-again")
    assert other.store == "regions-again"
    stream = app.stream("payments")
    with pytest.raises(TypeError, match="takes a table"):
        stream.join("regions", lambda a, b: a)
    with pytest.raises(ValueError, match="co-partitioned with the stream"):
        stream.join(regions, lambda a, b: a, on=lambda value: value)
    app.global_table("owners")
    with pytest.raises(ConfigError, match="already a global table"):
        app.global_table("owners")
    with pytest.raises(ValueError, match="no processor of the app reads 'nothing'"):
        TestDriver(app).pipe("nothing", "k", "v")


def test_table_records_without_a_key_are_skipped_and_counted(tmp_path):
    app = enrichment_app(tmp_path)
    driver = TestDriver(app)
    driver.pipe("regions", None, "emea")
    assert driver.store("regions-table") == {} and app.metrics["table_records_skipped"] == 1


def raw(topic, partition, offset, timestamp):
    return ConsumerRecord(topic, partition, offset, timestamp, b"k", b"v")


def test_the_picker_waits_for_an_empty_input_up_to_the_bound_then_goes_on():
    picker = RecordPicker([("table", "stream")], max_idle_ms=100, tables={"table"})
    picker.assign([("table", 0), ("stream", 0), ("table", 1), ("stream", 1)])
    picker.add([raw("stream", 0, 0, 50), raw("stream", 0, 1, 60)])
    assert picker.take(now_ms=1000) == [] and picker.wait_ms(1000) == 100
    picker.add([raw("table", 0, 0, 55)])  # arrives later, stamped earlier than the second payment
    assert [(r.topic, r.offset) for r in picker.take(now_ms=1050)] == [("stream", 0), ("table", 0)]
    # the table partition is empty again: the second payment waits its 100 ms
    assert picker.take(now_ms=1100) == [] and picker.wait_ms(1100) == 50
    assert [(r.topic, r.offset) for r in picker.take(now_ms=1150)] == [("stream", 1)]
    # then it goes on without waiting while the table stays empty (enforced processing)
    picker.add([raw("stream", 0, 2, 70)])
    assert [(r.topic, r.offset) for r in picker.take(now_ms=1151)] == [("stream", 2)]
    # a partition not assigned here is not waited for; records of topics in no group pass at once
    picker.revoke([("table", 1)])
    picker.add([raw("stream", 1, 0, 1), raw("other", 0, 0, 99)])
    assert [(r.topic, r.partition) for r in picker.take(now_ms=1152)] == [("other", 0), ("stream", 1)]
    picker.add([raw("stream", 0, 3, 80)])
    picker.drop([("stream", 0)])
    assert len(picker) == 0 and picker.take(now_ms=2000) == []


def test_the_picker_orders_by_timestamp_and_a_table_record_first_at_equal_ones():
    picker = RecordPicker([("table", "stream")], max_idle_ms=0, tables={"table"})
    picker.assign([("table", 0), ("stream", 0)])
    picker.add([raw("stream", 0, 0, 5), raw("stream", 0, 1, 9), raw("table", 0, 0, 1), raw("table", 0, 1, 9)])
    assert [(r.topic, r.timestamp) for r in picker.take(now_ms=0)] == [("table", 1), ("stream", 5), ("table", 9), ("stream", 9)]


def test_the_picker_orders_by_the_timestamp_it_is_given_for_a_record():
    # The runner passes Task.order_time: a source's timestamp_extractor's time.
    event_time = {("stream", 0): 30, ("stream", 1): 2}
    picker = RecordPicker([("table", "stream")], max_idle_ms=0, tables={"table"},
                          timestamp_of=lambda r: event_time.get((r.topic, r.offset), r.timestamp))
    picker.assign([("table", 0), ("stream", 0)])
    picker.add([raw("stream", 0, 0, 5), raw("stream", 0, 1, 6), raw("table", 0, 0, 20)])
    assert [(r.topic, r.offset) for r in picker.take(now_ms=0)] == [("table", 0), ("stream", 0), ("stream", 1)]


def test_the_enrichment_example_equals_its_recomputation_through_the_driver(tmp_path):
    import json
    import os
    import sys

    from faults.process import REPO

    sys.path.insert(0, os.path.join(REPO, "examples"))
    import enrichment

    records = [record for phase in enrichment.chaos_input(300, seed=4) for record in phase]
    driver = TestDriver(enrichment.build_app("127.0.0.1:1", str(tmp_path / "state")), partitions=2, commit_every=7)
    for topic, key, value, timestamp, _partition in records:
        driver.pipe(topic, key, value if topic == enrichment.TABLE else json.loads(value), timestamp=timestamp)
        if random.Random(timestamp).random() < 0.02:
            driver.crash()
    driver.commit()
    got = sorted(json.dumps(pair, sort_keys=True) for pair in driver.read(enrichment.OUTPUT))
    assert got == sorted(json.dumps(list(pair), sort_keys=True) for pair in enrichment.expected(records))


def clicks_app(tmp_path, *, left: bool, grace=0) -> streaming.App:
    app = streaming.App("127.0.0.1:1", application_id="ads", state_dir=str(tmp_path / "state"))
    impressions = app.stream("impressions", key_format="str", value_format="json")
    clicks = app.stream("clicks", key_format="str", value_format="str").map(str.upper)
    join = impressions.left_join if left else impressions.join
    join(clicks, lambda impression, click: {"ad": impression["ad"], "click": click}, within=datetime.timedelta(seconds=5), grace=grace).to("attributed")
    return app


def recompute_pairs(records, within_ms: int) -> list:
    """Every (key, ad, click) pair of records of one key at most within_ms apart."""
    impressions = [(k, v, t) for topic, k, v, t in records if topic == "impressions"]
    clicks = [(k, v, t) for topic, k, v, t in records if topic == "clicks"]
    return sorted((k, v["ad"], c.upper()) for k, v, t in impressions for k2, c, t2 in clicks if k == k2 and abs(t - t2) <= within_ms)


def test_a_windowed_stream_stream_join_pairs_records_within_the_window_in_any_arrival_order(tmp_path):
    rng = random.Random(7)
    records = []
    for number in range(120):
        user = f"u{rng.randrange(6)}"
        records.append(("impressions", user, {"ad": f"ad-{number}"}, number * 1_000))
        if rng.random() < 0.6:
            records.append(("clicks", user, f"c-{number}", number * 1_000 + rng.randrange(-4_000, 9_000)))
    records.sort(key=lambda record: record[3])
    driver = TestDriver(clicks_app(tmp_path, left=False, grace=60_000), partitions=2, commit_every=5)
    driver.pipe_together([r for r in records if r[0] == "clicks"] + [r for r in records if r[0] == "impressions"])  # every click first
    driver.commit()
    got = sorted((key, value["ad"], value["click"]) for key, value in driver.read("attributed"))
    assert got == recompute_pairs(records, 5_000) and len(got) > 20


def test_a_left_stream_join_emits_unmatched_records_once_no_partner_can_come(tmp_path):
    driver = TestDriver(clicks_app(tmp_path, left=True))
    driver.pipe("impressions", "u1", {"ad": "a"}, timestamp=10_000)
    driver.pipe("impressions", "u2", {"ad": "b"}, timestamp=11_000)
    driver.pipe("clicks", "u1", "x", timestamp=13_000)
    assert driver.read("attributed") == [("u1", {"ad": "a", "click": "X"})]
    driver.pipe("clicks", "u3", "y", timestamp=21_000)  # u2's partner could still come until 11 s + 5 s, and be on time until 16 s + 5 s
    assert driver.read("attributed") == []
    driver.pipe("clicks", "u3", "z", timestamp=30_000)
    assert driver.read("attributed") == [("u2", {"ad": "b", "click": None})]
    driver.pipe("clicks", "u2", "late", timestamp=11_500)  # later than any window it could join: dropped, counted
    assert driver.read("attributed") == [] and driver.app.metrics["late_records_dropped"] == 1
    assert copartition_groups(driver.app) == [("clicks", "impressions")]


def test_the_picker_hands_out_at_most_a_limit_per_take_and_says_more_is_ready():
    picker = RecordPicker([("table", "stream")], max_idle_ms=0, tables={"table"})
    picker.assign([("table", 0), ("stream", 0)])
    picker.add([raw("stream", 0, offset, offset) for offset in range(5)] + [raw("other", 0, 0, 0)])
    first = picker.take(now_ms=0, limit=4)
    assert [(r.topic, r.offset) for r in first] == [("other", 0), ("stream", 0), ("stream", 1), ("stream", 2)] and picker.backlog
    assert [r.offset for r in picker.take(now_ms=0, limit=4)] == [3, 4] and not picker.backlog
