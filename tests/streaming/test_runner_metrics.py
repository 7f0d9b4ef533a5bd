"""The streaming runner's Prometheus endpoint during real runs: an app in this
process (``App.run(metrics_address=...)``) and ``onceflow run --metrics`` as a
child process, against a real broker, scraped over HTTP and read with
``prometheus_client``'s parser. The counters say exactly what the app did
(records in, dead letters, late records, restores), commits are timed, the
lag of every assigned partition drains to zero."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import streaming
from streaming.app import Metrics
from streaming.windows import tumbling
from tests.helpers import read_all, wait_for
from tests.streaming.runner_support import (
    APP_ID,
    BALANCES_APP,
    BROKER_CONFIG,
    create_topics,
    payments,
    send_payments,
)
from txn import Admin, Producer
from txn.errors import CommitFailedError, RetriableError, TransactionAbortableError


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples, metric: str, default: float | None = None, **labels) -> float:
    key = (metric, frozenset((k, str(v)) for k, v in labels.items()))
    if key not in samples and default is not None:
        return default
    return samples[key]


def matching(samples, name: str) -> dict[frozenset, float]:
    return {labels: v for (sample, labels), v in samples.items() if sample == name}


def build(bootstrap: str, state_dir: str) -> streaming.App:
    app = streaming.App(bootstrap, "metered", state_dir, on_error="dead-letter", session_timeout_ms=3000, heartbeat_interval_ms=300, commit_records=20)

    @app.processor(source="words", sink="counts", stores=["counts"], key_format="str", value_format="str")
    def count(record, ctx):
        if record.value == "boom":
            raise ValueError("a bad word")
        counts = ctx.store("counts")
        counts.put(record.key, counts.get(record.key, 0) + 1)
        ctx.emit(record.key, str(counts.get(record.key)))
        ctx.count("words_counted")

    app.stream("clicks", key_format="str").window(tumbling(10_000), grace=2_000).count().to("per-window", value_format="json")
    return app


def run_in_thread(app: streaming.App) -> tuple[threading.Thread, list]:
    failures: list = []

    def target():
        try:
            app.run(metrics_address=("127.0.0.1", 0))
        except BaseException as error:  # reported by the test
            failures.append(error)

    thread = threading.Thread(target=target, name="app under test")
    thread.start()
    return thread, failures


@pytest.mark.slow
def test_the_runners_endpoint_counts_what_a_real_run_did(broker_process, tmp_path):
    broker = broker_process(*BROKER_CONFIG)
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({"words": 2, "counts": 2, "clicks": 1, "per-window": 1})
    producer = Producer(bootstrap_servers=broker.bootstrap)
    words = [("boom" if index in (17, 61) else f"w{index % 7}", f"k{index % 11}") for index in range(100)]
    for text, key in words:
        producer.send("words", text.encode(), key=key.encode())
    # 9.5 s comes after stream time 12 s closed [0, 10 s) (grace 2 s): one late record.
    for timestamp in (1_000, 9_000, 11_000, 5_000, 12_000, 9_500, 25_000):
        producer.send("clicks", b"", key=b"u", timestamp=timestamp)
    producer.flush()
    producer.close()

    state = tmp_path / "state"
    app = build(broker.bootstrap, str(state))
    thread, failures = run_in_thread(app)
    try:
        wait_for(lambda: app.metrics_url or failures, 60, "the runner's endpoint")
        assert not failures, failures
        url = app.metrics_url

        def settled():
            samples = scrape(url)
            done = value(samples, "onceflow_runner_records_in_total") == 107 and not value(samples, "onceflow_runner_transaction_open")
            lags = matching(samples, "onceflow_runner_lag")
            return samples if done and len(lags) == 3 and not any(lags.values()) else None

        samples = wait_for(settled, 90, "all 107 records processed, committed and the lag at zero")
        assert value(samples, "onceflow_runner_dead_letters_total") == 2
        assert value(samples, "onceflow_runner_late_records_dropped_total") == 1
        assert value(samples, "onceflow_runner_app_counter_total", counter="words_counted") == 98
        commits = value(samples, "onceflow_runner_commits_total")
        assert commits >= 100 // 20
        assert value(samples, "onceflow_runner_commit_duration_seconds_count") == commits, "every commit is timed"
        assert value(samples, "onceflow_runner_commit_duration_seconds_sum") > 0
        assert value(samples, "onceflow_runner_records_out_total") >= 98 + 2  # counts, dead letters, windows
        assert value(samples, "onceflow_runner_rebalances_total") >= 1
        assert value(samples, "onceflow_runner_assigned_partitions") == 3
        assert {dict(labels)["topic"] for labels in matching(samples, "onceflow_runner_lag")} == {"words", "clicks"}
        assert matching(samples, "onceflow_runner_aborts_total") == {}
        assert value(samples, "onceflow_runner_info", application="metered", instance=app.instance_id, transactional_id=app.transactional_id) == 1
        assert matching(samples, "onceflow_runner_restore_remaining_offsets") == {}, "nothing is being restored"
        assert value(samples, "process_resident_memory_bytes") > 0
    finally:
        app.stop()
        thread.join(60)
    assert not failures, failures
    assert app.metrics_url is None, "the endpoint stops with the run"

    # The same instance without its SQLite files restores them from the changelogs.
    shutil.rmtree(state / "stores")
    again = build(broker.bootstrap, str(state))
    thread, failures = run_in_thread(again)
    try:
        def restored():
            if failures:
                return True
            samples = scrape(again.metrics_url) if again.metrics_url else {}
            done = samples and value(samples, "onceflow_runner_restored_records_total") > 0 and not matching(samples, "onceflow_runner_restore_remaining_offsets")
            return done and value(samples, "onceflow_runner_assigned_partitions") == 3 and samples

        wait_for(restored, 90, "the stores restored from their changelogs")
        assert not failures, failures
        # A record is processed only once the assignment (every restore) is done.
        producer = Producer(bootstrap_servers=broker.bootstrap)
        producer.send("words", b"after", key=b"k0")
        producer.flush()
        producer.close()
        samples = wait_for(lambda: (s := scrape(again.metrics_url)) and value(s, "onceflow_runner_records_in_total") == 1 and s, 60, "the record after the restore")
        assert value(samples, "onceflow_runner_restored_records_total") == again.metrics["restored_records"] > 0
        assert matching(samples, "onceflow_runner_restore_remaining_offsets") == {}
    finally:
        again.stop()
        thread.join(60)
    assert not failures, failures


@pytest.mark.slow
def test_onceflow_run_serves_metrics_while_it_runs(broker_process, tmp_path):
    broker = broker_process(*BROKER_CONFIG)
    create_topics(broker.bootstrap)
    events = payments(300, seed=7)
    send_payments(broker.bootstrap, events)
    log_path = tmp_path / "app.log"
    environment = {**os.environ, "RUNNER_TEST_BOOTSTRAP": broker.bootstrap, "RUNNER_TEST_STATE_DIR": str(tmp_path / "state")}
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "onceflow", "run", BALANCES_APP, "--metrics", "127.0.0.1:0", "--progress-interval", "0"],
            stdout=log_file, stderr=log_file, env=environment,
        )
    try:
        def announced():
            match = re.search(r"serving metrics on (http://\S+)", log_path.read_text())
            assert process.poll() is None, log_path.read_text()
            return match and match.group(1)

        url = wait_for(announced, 60, "the metrics URL in the log")
        def drained():
            samples = scrape(url)
            lags = matching(samples, "onceflow_runner_lag")
            committed = value(samples, "onceflow_runner_records_out_total") == 300
            return samples if committed and len(lags) == 3 and not any(lags.values()) else None

        samples = wait_for(drained, 90, "300 records out, committed, and no lag")
        assert value(samples, "onceflow_runner_records_in_total") == 300
        assert value(samples, "onceflow_runner_commits_total") == value(samples, "onceflow_runner_commit_duration_seconds_count") >= 1
        (info,) = matching(samples, "onceflow_runner_info")
        assert dict(info)["application"] == APP_ID and dict(info)["transactional_id"] == f"{APP_ID}-{dict(info)['instance']}"
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(60)
    assert code == 0, log_path.read_text()[-3000:]


# --------------------------------------------------------------------------- without a broker


class FakeRunner:
    """What the collector reads of a runner."""

    def __init__(self):
        from txn.types import TopicPartition

        self.assigned = {TopicPartition("in", 0)}
        self.lag = {TopicPartition("in", 0): 5, TopicPartition("gone", 1): 9}
        self.txn_open = True
        self.restoring = {("counts", 0): (40, 100)}


def test_aborts_by_cause_restore_progress_and_lag_render_from_the_runners_state(tmp_path):
    from streaming.metrics import RunnerMetrics
    from streaming.runner import abort_cause

    app = streaming.App("127.0.0.1:9", "unit", str(tmp_path / "state"), instance_id="one")
    assert isinstance(app.metrics, Metrics)
    for error in (CommitFailedError(message="x"), TransactionAbortableError(message="x"), RetriableError(message="x"), ConnectionError("x"), TimeoutError("x")):
        app.metrics.aborted(abort_cause(error))
    app.metrics.aborted("partitions_lost")
    exported = RunnerMetrics(app, FakeRunner())
    app.metrics.observe("commit_seconds", 0.02)
    text = exported.render().decode()
    samples = {(s.name, frozenset(s.labels.items())): s.value for family in text_string_to_metric_families(text) for s in family.samples}
    causes = {dict(labels)["cause"]: v for labels, v in matching(samples, "onceflow_runner_aborts_total").items()}
    assert causes == {"commit_failed": 1, "transaction_abortable": 1, "retries_exhausted": 1, "connection": 1, "timeout": 1, "partitions_lost": 1}
    assert sum(causes.values()) == app.metrics["aborts"]
    assert value(samples, "onceflow_runner_lag", topic="in", partition=0) == 5
    assert len(matching(samples, "onceflow_runner_lag")) == 1, "a partition no longer assigned has no lag"
    assert value(samples, "onceflow_runner_restore_position", store="counts", partition=0) == 40
    assert value(samples, "onceflow_runner_restore_remaining_offsets", store="counts", partition=0) == 60
    assert value(samples, "onceflow_runner_commit_duration_seconds_count") == 1
    assert value(samples, "onceflow_runner_transaction_open") == 1
    exported.close()
    app.metrics.observe("commit_seconds", 0.02)
    assert b"onceflow_runner_commit_duration_seconds_count 1.0" in exported.render(), "a closed exporter takes no more observations"
    assert json.dumps(dict(app.metrics))  # still a plain dict of numbers


@pytest.mark.slow
def test_an_abort_in_a_real_run_is_counted_with_its_cause(broker_process, tmp_path):
    """A processor that stalls the loop past the session timeout once: the
    group moves on, the runner aborts (and says why), rejoins, and the output
    is still every record exactly once. Record r5 fails before the abort and
    again after the rewind: it went to the dead-letter topic once, so it is
    counted once (as records_out counts only committed records)."""
    broker = broker_process(*BROKER_CONFIG)
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({"slow-in": 1, "slow-out": 1, "stalling-dead-letters": 1})
    producer = Producer(bootstrap_servers=broker.bootstrap)
    for index in range(30):
        producer.send("slow-in", f"r{index}".encode(), key=b"k")
    producer.flush()
    producer.close()
    app = streaming.App(broker.bootstrap, "stalling", str(tmp_path / "state"), session_timeout_ms=2000, heartbeat_interval_ms=200, commit_records=40, on_error="dead-letter")
    stalled = []

    @app.processor(source="slow-in", sink="slow-out")
    def copy(record, ctx):
        ctx.count("copied")
        if record.value == b"r5":
            raise ValueError("poison")
        if record.value == b"r10" and not stalled:
            stalled.append(True)
            time.sleep(4)  # the loop (and its heartbeats) stops past the 2 s session
        ctx.emit(record.key, record.value)

    thread, failures = run_in_thread(app)
    try:
        wait_for(lambda: app.metrics_url or failures, 60, "the runner's endpoint")
        assert not failures, failures

        def recovered():
            samples = scrape(app.metrics_url)
            aborts = matching(samples, "onceflow_runner_aborts_total")
            return samples if aborts and value(samples, "onceflow_runner_records_out_total") == 30 else None

        samples = wait_for(recovered, 90, "an abort, then all 30 records out")
    finally:
        app.stop()
        thread.join(60)
    assert not failures, failures
    causes = {dict(labels)["cause"]: count for labels, count in matching(samples, "onceflow_runner_aborts_total").items()}
    assert set(causes) <= {"group_fenced", "partitions_lost", "commit_failed"}, causes
    assert sum(causes.values()) == app.metrics["aborts"] >= 1
    assert value(samples, "onceflow_runner_rebalances_total") >= 2, "it joined again"
    out = read_all(broker.bootstrap, "slow-out", 1, expect=29)
    assert sorted(record.value for record in out) == sorted(f"r{index}".encode() for index in range(30) if index != 5), "exactly once through the abort"
    assert [record.value for record in read_all(broker.bootstrap, "stalling-dead-letters", 1, expect=1)] == [b"r5"]
    assert value(samples, "onceflow_runner_dead_letters_total") == 1, "the dead letter of the aborted transaction is not counted"
    assert value(samples, "onceflow_runner_app_counter_total", counter="copied") == 30, "a processor's count, once per committed record"


def test_a_busy_metrics_address_is_an_error_naming_it_and_nothing_stays_attached(tmp_path):
    import asyncio
    import socket

    from protocol.metrics_http import MetricsListenError
    from streaming.metrics import RunnerMetrics

    app = streaming.App("127.0.0.1:9", "unit", str(tmp_path / "state"), instance_id="one")
    exported = RunnerMetrics(app, FakeRunner())
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(MetricsListenError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            asyncio.run(exported.serve("127.0.0.1", port))
    assert app.metrics.observers == [], "the failed exporter takes no observations"


@pytest.mark.slow
@pytest.mark.parametrize("outcome", ["committed", "aborted"])
def test_a_commit_of_unknown_outcome_counts_its_records_once(broker_process, tmp_path, monkeypatch, outcome):
    """The first EndTxn's answer is lost, after the transaction committed
    (or was aborted): the runner settles it with a new producer and
    rewinds. What that transaction did is counted once if it committed,
    never if it did not, and the next transaction starts from nothing
    (outputs, counters, offsets)."""
    from txn.errors import CommitOutcomeUnknownError
    from txn.producer import AsyncProducer

    broker = broker_process(*BROKER_CONFIG)
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics({"unsure-in": 1, "unsure-out": 1})
    producer = Producer(bootstrap_servers=broker.bootstrap)
    for index in range(20):
        producer.send("unsure-in", f"r{index}".encode(), key=b"k")
    producer.flush()
    producer.close()
    real_commit = AsyncProducer.commit_transaction
    lost = []

    async def commit_then_lose_the_answer(self, *args, **kwargs):
        if lost:
            return await real_commit(self, *args, **kwargs)
        lost.append(True)
        if outcome == "committed":
            await real_commit(self, *args, **kwargs)
        else:
            await self.abort_transaction()
        raise CommitOutcomeUnknownError(message="the EndTxn answer was lost (test)")

    monkeypatch.setattr(AsyncProducer, "commit_transaction", commit_then_lose_the_answer)
    app = streaming.App(broker.bootstrap, f"unsure-{outcome}", str(tmp_path / "state"), commit_records=5)

    @app.processor(source="unsure-in", sink="unsure-out")
    def copy(record, ctx):
        ctx.count("copied")
        ctx.emit(record.key, record.value)

    thread, failures = run_in_thread(app)
    try:
        wait_for(lambda: app.metrics_url or failures, 60, "the runner's endpoint")
        assert not failures, failures

        def settled():
            samples = scrape(app.metrics_url)
            done = value(samples, "onceflow_runner_records_in_total") >= 20 and not value(samples, "onceflow_runner_transaction_open")
            return samples if done and value(samples, "onceflow_runner_commits_outcome_unknown_total") == 1 else None

        samples = wait_for(settled, 90, "all 20 records processed and committed after the lost answer")
    finally:
        app.stop()
        thread.join(60)
    assert not failures, failures
    out = read_all(broker.bootstrap, "unsure-out", 1, expect=20)
    assert sorted(record.value for record in out) == sorted(f"r{index}".encode() for index in range(20))
    assert value(samples, "onceflow_runner_records_out_total") == 20
    assert value(samples, "onceflow_runner_app_counter_total", counter="copied") == 20
