"""The processor API as the dataflow layer and users lean on it: several
source topics, named sinks, sink formats apart from source formats, custom
formats, ``ctx`` fields and counters, ``Store.items()`` inside a running app,
``app.stop()`` from another thread; ``onceflow run``'s module convention and
the settings the App refuses."""

from __future__ import annotations

import json
import threading

import pytest

import streaming
from streaming.cli import load_app
from tests.helpers import read_all, wait_for
from tests.streaming.runner_support import BROKER_CONFIG
from txn import Admin, ConfigError, Producer


@pytest.mark.slow
def test_two_sources_named_sinks_formats_counters_and_items(broker_process, tmp_path):
    broker = broker_process(*BROKER_CONFIG)
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({"clicks": 2, "views": 2, "totals": 2, "audit": 1})
    producer = Producer(bootstrap_servers=broker.bootstrap)
    for i in range(60):
        producer.send("clicks" if i % 3 else "views", json.dumps({"n": i}).encode(), key=f"user-{i % 4}".encode(), timestamp=1_700_000_000_000 + i)
    producer.flush()
    producer.close()

    upper = (lambda text: text.upper().encode(), lambda data: data.decode().lower())
    app = streaming.App(broker.bootstrap, "api", str(tmp_path / "state"), session_timeout_ms=3000, heartbeat_interval_ms=300, commit_records=7)
    seen_positions = []
    snapshots = []

    @app.processor(source=["clicks", "views"], sink="totals", stores=["totals"], key_format=upper, value_format="json", sink_value_format="str", name="tally",
                   outputs=["audit"])
    def tally(record, ctx):
        assert (ctx.topic, ctx.partition, ctx.offset, ctx.timestamp) == (record.topic, record.partition, record.offset, record.timestamp)
        seen_positions.append((record.topic, record.partition, record.offset))
        totals = ctx.store("totals")
        total = totals.get((record.key, record.topic), 0) + record.value["n"]
        totals.put((record.key, record.topic), total)
        ctx.emit(record.key, f"{record.topic}:{total}")
        ctx.count(f"{record.topic}_seen")
        if record.value["n"] == 59:
            ctx.emit(record.key, "the end", topic="audit", headers=[("why", b"the last one")], timestamp=42)
            snapshots.append(list(totals.items()))

    all_in = []

    def stop_once_all_are_in():
        try:
            all_in.append(wait_for(lambda: app.metrics.get("records_in", 0) >= 60, 60, "the app to take in 60 records"))
        finally:
            app.stop()  # also after the wait failed: app.run() returns and the test fails below

    stopper = threading.Thread(target=stop_once_all_are_in)
    stopper.start()
    app.run()
    stopper.join(10)
    assert all_in, "the app never took in the 60 records within 60 s"
    assert app.metrics["records_in"] == 60 and app.metrics["clicks_seen"] == 40 and app.metrics["views_seen"] == 20
    assert len(set(seen_positions)) == 60
    totals = read_all(broker.bootstrap, "totals", 2, expect=60)
    assert len(totals) == 60 and all(r.key.startswith(b"USER-") for r in totals), "keys went out through the pair's serializer"
    expected_last = {}
    for i in range(60):
        topic = "clicks" if i % 3 else "views"
        expected_last[(f"user-{i % 4}", topic)] = expected_last.get((f"user-{i % 4}", topic), 0) + i
    finals = {}
    for record in totals:
        topic, total = record.value.decode().split(":")
        finals[(record.key.decode().lower(), topic)] = max(finals.get((record.key.decode().lower(), topic), -10**9), int(total))
    assert finals == expected_last
    (audit,) = read_all(broker.bootstrap, "audit", 1, expect=1)
    assert (audit.key, audit.value) == (b"USER-3", b"the end")
    assert dict(audit.headers) == {"why": b"the last one"} and audit.timestamp == 42
    # items(): in key order (tuples element by element), everything visible at that moment
    (snapshot,) = snapshots
    keys = [key for key, _value in snapshot]
    assert keys == sorted(keys) and all(isinstance(k, tuple) for k in keys)


def test_the_app_refuses_settings_it_cannot_honour(tmp_path):
    with pytest.raises(ConfigError, match="on_error"):
        streaming.App("h:1", "a", str(tmp_path), on_error="skip")
    with pytest.raises(ConfigError, match="transaction_timeout_ms"):
        streaming.App("h:1", "a", str(tmp_path), commit_interval_ms=20_000)
    with pytest.raises(ConfigError, match="set by the runner"):
        streaming.App("h:1", "a", str(tmp_path), group_id="mine")
    with pytest.raises(ConfigError, match="unknown client option"):
        streaming.App("h:1", "a", str(tmp_path), lingerms=5)
    with pytest.raises(ConfigError, match="application_id"):
        streaming.App("h:1", "a b", str(tmp_path))
    app = streaming.App("h:1", "a", str(tmp_path), linger_ms=1, max_poll_records=10, request_timeout_ms=1000)
    assert app.producer_options == {"linger_ms": 1, "request_timeout_ms": 1000}
    assert app.consumer_options == {"max_poll_records": 10, "request_timeout_ms": 1000}
    with pytest.raises(ConfigError, match="no processors"):
        app.run()


def test_names_that_compose_an_illegal_topic_name_are_refused(tmp_path):
    # A trailing newline passes a "^...$" regex used with match; the broker's
    # rule (protocol.names) refuses it, so the app refuses it before the runner
    # would create a topic the broker rejects.
    with pytest.raises(ConfigError, match="application_id"):
        streaming.App("h:1", "balances\n", str(tmp_path))
    with pytest.raises(ConfigError, match="dead_letter_topic"):
        streaming.App("h:1", "a", str(tmp_path), dead_letter_topic="dead\n")
    with pytest.raises(ConfigError, match="application_id"):
        streaming.App("h:1", "a" * 240, str(tmp_path))  # its changelog and dead-letter topics would pass 249 characters
    app = streaming.App("h:1", "a", str(tmp_path))
    with pytest.raises(ConfigError, match=r"store 'totals\\n'"):
        app.processor("in", stores=["totals\n"])
    app.processor("in", stores=["totals"], name="legal")(lambda record, ctx: None)
    app.processor("in", name="ticks\n")(lambda record, ctx: None)
    with pytest.raises(ConfigError, match="cannot have timers"):
        app.schedule("ticks\n", every=1000)(lambda ctx: None)
    assert app.changelog_topic("totals") == "a-totals-changelog"


def test_instance_id_is_kept_and_the_state_dir_is_locked(tmp_path, monkeypatch):
    monkeypatch.delenv("ONCEFLOW_INSTANCE_ID", raising=False)
    first = streaming.App("h:1", "a", str(tmp_path))
    assert streaming.App("h:1", "a", str(tmp_path)).instance_id == first.instance_id
    assert streaming.App("h:1", "a", str(tmp_path / "other")).instance_id != first.instance_id
    assert first.transactional_id == f"a-{first.instance_id}"
    lock = first.lock_state_dir()
    with pytest.raises(streaming.StateDirInUseError):
        streaming.App("h:1", "a", str(tmp_path)).lock_state_dir()
    lock.close()
    streaming.App("h:1", "a", str(tmp_path)).lock_state_dir().close()


def test_an_instance_id_from_outside_survives_the_state_dir(tmp_path, monkeypatch):
    # An orchestrator's name for the replica (ONCEFLOW_INSTANCE_ID) outlives
    # its disk; one given to App outranks it; neither is written to the disk.
    monkeypatch.setenv("ONCEFLOW_INSTANCE_ID", "pod-2")
    app = streaming.App("h:1", "a", str(tmp_path / "state"))
    assert (app.instance_id, app.transactional_id) == ("pod-2", "a-pod-2")
    assert not (tmp_path / "state" / "instance-id").exists()
    assert streaming.App("h:1", "a", str(tmp_path / "fresh")).instance_id == "pod-2"
    assert streaming.App("h:1", "a", str(tmp_path / "state"), instance_id="given").instance_id == "given"
    monkeypatch.setenv("ONCEFLOW_INSTANCE_ID", "pod 2")
    with pytest.raises(ConfigError, match="ONCEFLOW_INSTANCE_ID 'pod 2'.*illegal characters ' '"):
        streaming.App("h:1", "a", str(tmp_path / "state")).instance_id
    with pytest.raises(ConfigError, match="instance_id must be a non-empty string"):
        streaming.App("h:1", "a", str(tmp_path / "state"), instance_id="")
    monkeypatch.setenv("ONCEFLOW_INSTANCE_ID", "")  # empty: as if unset, the state directory's
    assert streaming.App("h:1", "a", str(tmp_path / "state")).instance_id not in ("", "pod-2")


def test_onceflow_run_finds_the_app_of_a_module(tmp_path):
    module = tmp_path / "my_app.py"
    module.write_text(
        "import streaming\n"
        "app = streaming.App('h:1', 'mine', 'state')\n"
        "other = streaming.App('h:1', 'other', 'state2')\n"
        "if __name__ == '__main__':\n"
        "    raise SystemExit('onceflow run must not run the main block')\n"
    )
    assert load_app(str(module)).application_id == "mine"
    assert load_app(str(module), "other").application_id == "other"
    lonely = tmp_path / "lonely.py"
    lonely.write_text("import streaming\nthe_app = streaming.App('h:1', 'solo', 'state')\n")
    assert load_app(str(lonely)).application_id == "solo"
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(LookupError, match="must define an App"):
        load_app(str(empty))
