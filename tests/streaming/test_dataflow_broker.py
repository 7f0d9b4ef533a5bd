"""The dataflow layer on the runner against a real broker process: event-time
windows (out of order within grace counted, later dropped and counted),
results equal to a plain recomputation, across a restart and a lost state
directory (stream time and window state come back from the changelog), and
windows of an idle partition closed by the wall clock (close_when_idle)."""

from __future__ import annotations

import json
import random
import shutil

import pytest

import streaming
from streaming.dataflow import LATE_METRIC
from streaming.windows import hopping, tumbling
from tests.helpers import read_all, recompute_windowed_sums

pytestmark = pytest.mark.slow


def produce(bootstrap: str, topic: str, records: list[tuple]) -> None:
    """(key, value, timestamp) records, in this order, to partition 0."""
    from txn import Producer

    producer = Producer(bootstrap_servers=bootstrap, linger_ms=5)
    for key, value, timestamp in records:
        producer.send(topic, value.encode(), key=key.encode(), partition=0, timestamp=timestamp)
    producer.flush()
    producer.close()


def windowed_sum_app(bootstrap: str, state_dir: str, *, rekey: bool, windows, grace: float) -> streaming.App:
    # One instance id throughout: a lost state directory does not make it a new group member.
    app = streaming.App(bootstrap_servers=bootstrap, application_id="window-sums", state_dir=state_dir, instance_id="only")
    stream = app.stream("events", key_format="str", value_format="json")
    if rekey:  # the same key again, but through the repartition topic
        stream = stream.key_by(lambda value: value["user"])
    stream.window(windows, grace=grace).aggregate(0, lambda total, value: total + value["n"]).to("sums", value_format="json")
    return app


def events(seed: int, count: int) -> list[tuple]:
    """Out-of-order events: mostly moving forward, some a little late, a few very late."""
    rng = random.Random(seed)
    out, clock = [], 1_000_000
    for number in range(count):
        clock += rng.randint(0, 300)
        jitter = rng.choice([0, 0, 0, -rng.randint(1, 900), -rng.randint(2_000, 5_000)])
        user = rng.choice("abc")
        out.append((user, json.dumps({"user": user, "n": number % 7 + 1}), max(0, clock + jitter)))
    return out


@pytest.mark.parametrize("rekey", [False, True], ids=["by-input-key", "through-repartition"])
def test_window_results_and_late_counts_equal_a_recomputation_across_restarts(broker_process, tmp_path, rekey):
    from txn import Admin

    broker = broker_process()
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({"events": 1, "sums": 1})
    windows, grace = hopping(2_000, 1_000), 1_000
    records = events(seed=5, count=240)
    state_dir = str(tmp_path / "state")
    late_seen = 0
    # Three runs over three slices of the input: a clean stop, then the
    # state directory deleted (stores and stream time rebuilt from the changelogs).
    for number, part in enumerate((records[:80], records[80:160], records[160:])):
        produce(broker.bootstrap, "events", part)
        app = windowed_sum_app(broker.bootstrap, state_dir, rekey=rekey, windows=windows, grace=grace)
        app.run(until_idle=2.0)
        late_seen += app.metrics.get(LATE_METRIC, 0)
        if number == 1:
            shutil.rmtree(state_dir)
    output = read_all(broker.bootstrap, "sums", 1, idle=2.0)
    got = {}
    for record in output:
        value = json.loads(record.value)
        key = (record.key.decode(), value["start"])
        assert key not in got, f"window {key} emitted twice"
        assert value["end"] - value["start"] == windows.size_ms
        got[key] = value["value"]
    finals, _still_open, late = recompute_windowed_sums([(user, ts, json.loads(v)["n"]) for user, v, ts in records], windows.size_ms, windows.advance_ms, 1000)
    assert got == {key: total for key, (total, _at) in finals.items()}
    assert late_seen == late > 0  # late records were there, dropped and counted
    assert len(got) > 100


def test_out_of_order_within_grace_counts_and_later_is_dropped(broker_process, tmp_path):
    from txn import Admin

    broker = broker_process()
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({"clicks": 1, "per-window": 1})
    app = streaming.App(bootstrap_servers=broker.bootstrap, application_id="clicks", state_dir=str(tmp_path / "state"))
    app.stream("clicks", key_format="str").window(tumbling(10_000), grace=2_000).count().to("per-window", value_format="json")
    # 5 s arrives after 11 s but within grace; 9.5 s arrives after stream time 12 s closed [0, 10 s).
    timeline = [1_000, 9_000, 11_000, 5_000, 12_000, 9_500, 25_000]
    produce(broker.bootstrap, "clicks", [("u", "", ts) for ts in timeline])
    app.run(until_idle=2.0)
    results = [(r.key.decode(), json.loads(r.value), r.timestamp) for r in read_all(broker.bootstrap, "per-window", 1, idle=2.0)]
    assert results == [
        ("u", {"start": 0, "end": 10_000, "value": 3}, 9_000),
        ("u", {"start": 10_000, "end": 20_000, "value": 2}, 12_000),
    ]
    assert app.metrics[LATE_METRIC] == 1


def test_an_idle_partitions_windows_close_by_the_wall_clock_in_the_runner(broker_process, tmp_path):
    """close_when_idle on the runner: records stamped now, then nothing; the
    window is emitted once the wall clock passes its end + grace, with no
    record to move stream time (the twin window without the option is not)."""
    import threading
    import time

    from txn import Admin

    broker = broker_process()
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({"clicks": 1, "idle-closed": 1, "by-records": 1})
    app = streaming.App(bootstrap_servers=broker.bootstrap, application_id="idle-clicks", state_dir=str(tmp_path / "state"))
    app.stream("clicks", key_format="str").window(tumbling(1_000), grace=200, close_when_idle=300).count().to("idle-closed", value_format="json")
    app.stream("clicks", key_format="str").window(tumbling(1_000), grace=200).count(store="by-records").to("by-records", value_format="json")
    now = int(time.time() * 1000)
    produce(broker.bootstrap, "clicks", [("u", "", now), ("u", "", now)])
    runner = threading.Thread(target=app.run)
    runner.start()
    try:
        (closed,) = read_all(broker.bootstrap, "idle-closed", 1, expect=1, timeout=30.0, idle=1.0)
    finally:
        app.stop()
        runner.join(30)
    assert json.loads(closed.value) == {"start": now - now % 1_000, "end": now - now % 1_000 + 1_000, "value": 2}
    assert read_all(broker.bootstrap, "by-records", 1, idle=0.5) == []
    assert not runner.is_alive()
