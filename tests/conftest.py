"""Shared fixtures: brokers in-process and as real child processes."""

from __future__ import annotations

import pytest

try:  # Import hypothesis's lazily loaded parts now, before tests start threads:
    # CPython 3.11.7 can fail parsing ("AST constructor recursion depth
    # mismatch") when another thread compiles at the same time (gh-106905).
    import hypothesis.internal.lambda_sources  # noqa: F401
except ImportError:
    pass

from faults.process import REPO, BrokerProcess  # noqa: F401  (tests import both from here)


def pytest_addoption(parser):
    parser.addoption(
        "--index-budget",
        type=int,
        default=None,
        metavar="ENTRIES",
        help="index entries every IndexBudget made in this test process holds (1 drops and reads back "
        "indexes on nearly every use; in-process logs and brokers only)",
    )


def pytest_configure(config):
    entries = config.getoption("--index-budget", default=None)
    if entries is not None:
        import storage.index

        storage.index.DEFAULT_RESIDENT_ENTRIES = entries


@pytest.fixture
def broker_process(tmp_path):
    brokers = []

    def make(*config: str, env: dict | None = None) -> BrokerProcess:
        broker = BrokerProcess(str(tmp_path / f"broker{len(brokers)}"), "group.initial.rebalance.delay.ms=0", *config, env=env)
        brokers.append(broker)
        return broker.start()

    yield make
    for broker in brokers:
        broker.kill()


@pytest.fixture
def embedded_broker(tmp_path):
    from broker.broker import EmbeddedBroker

    with EmbeddedBroker(str(tmp_path / "data"), group_initial_rebalance_delay_ms=0) as broker:
        yield broker
