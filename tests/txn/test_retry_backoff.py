"""The clients' retry backoff (txn.cluster.Cluster.retrying, under
protocol.retry's client policies): a coordinator
that is busy for a moment (CONCURRENT_TRANSACTIONS, COORDINATOR_LOAD_IN_PROGRESS)
is asked again after 20 ms, doubling; other retriable errors wait
retry_backoff_ms, doubling; both up to retry_backoff_max_ms, and a failed
connection up to 250 ms. Over a real
broker, a restarted instance's InitProducerId over the transaction its
predecessor left open gets CONCURRENT_TRANSACTIONS once and its retry works."""

from __future__ import annotations

import pytest

from protocol.errors import ErrorCode
from txn.cluster import Cluster
from txn.config import ProducerConfig
from txn.errors import RetriableError


def waits(code: int | None, attempts: int, **config) -> list[float]:
    cluster = Cluster(ProducerConfig(bootstrap_servers=["127.0.0.1:9"], **config))
    error = ConnectionRefusedError("the broker is down") if code is None else RetriableError(code, "test")
    return [cluster.wait_policy_after(error).delay(n) for n in range(1, attempts + 1)]


def test_a_busy_coordinator_is_asked_again_soon_and_other_errors_back_off_as_configured():
    assert waits(ErrorCode.CONCURRENT_TRANSACTIONS, 4) == pytest.approx([0.02, 0.04, 0.08, 0.16])
    assert waits(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, 8) == pytest.approx([0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0])
    assert waits(ErrorCode.REQUEST_TIMED_OUT, 5) == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0])
    assert waits(ErrorCode.REQUEST_TIMED_OUT, 3, retry_backoff_ms=50, retry_backoff_max_ms=120) == pytest.approx([0.05, 0.1, 0.12])
    # A broker that refuses connections is tried again at least every 250 ms.
    assert waits(None, 4) == pytest.approx([0.1, 0.2, 0.25, 0.25])
    assert waits(None, 3, retry_backoff_ms=10, retry_backoff_max_ms=30) == pytest.approx([0.01, 0.02, 0.03])


def test_init_over_a_transaction_left_open_retries_its_concurrent_transactions_answer(tmp_path, monkeypatch):
    from broker.broker import EmbeddedBroker
    from txn import Admin, Producer

    seen: list[float] = []
    real = Cluster.wait_policy_after

    def noting(self, error):
        policy = real(self, error)
        seen.append((getattr(error, "code", None), policy.delay(1)))
        return policy

    monkeypatch.setattr(Cluster, "wait_policy_after", noting)
    with EmbeddedBroker(str(tmp_path / "data"), group_initial_rebalance_delay_ms=0) as broker:
        bootstrap = f"127.0.0.1:{broker.port}"
        with Admin(bootstrap_servers=bootstrap) as admin:
            admin.create_topics({"left-open": 3})
        dead = Producer(bootstrap_servers=bootstrap, transactional_id="left-open")
        dead.init_transactions()
        dead.begin_transaction()
        for partition in range(3):
            dead.send("left-open", b"never committed", partition=partition).result(10)
        restarted = Producer(bootstrap_servers=bootstrap, transactional_id="left-open")
        restarted.init_transactions()  # fences the first and aborts its transaction
        assert restarted.producer_epoch > dead.producer_epoch
        restarted.close()
        dead.close(timeout=1)
    busy = [wait for code, wait in seen if code == ErrorCode.CONCURRENT_TRANSACTIONS]
    assert busy and busy[0] == pytest.approx(0.02), seen
