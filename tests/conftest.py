"""Shared fixtures (brokers in-process and as real child processes), and
how pytest-xdist shares the tests out (the README's test command:
``-n 4``, with ``--dist loadgroup --no-loadscope-reorder`` from pyproject.toml).

Every test is a unit of work of its own, except the tests that start Spark:
the modules under ``tests/streaming/spark/`` (one module at a time, so its
module-scoped session starts once) and ``SPARK_DRIVER_TESTS`` (a driver
process of their own) go to ``SPARK_LANES`` lanes, each run by one worker, so
at most that many Spark JVMs of this suite run at once. Spark gives a Python
data-source worker a fixed 10 s to connect back ("Python worker failed to
connect back"), which a 2-core machine running four Spark queries misses.

Workers run the lanes first, then the rest longest first
(``MEASURED_SECONDS``, else a guess from the ``slow`` mark). The lanes are
given to xdist by ``pytest_xdist_make_scheduler``: marking tests
``xdist_group`` no longer groups them with pytest 9.2 (pytest-xdist#1386).
A serial run keeps the collection order.
"""

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


SPARK_DIR = "tests/streaming/spark/"
#: Tests outside SPARK_DIR that start a Spark driver process.
SPARK_DRIVER_TESTS = (
    "tests/test_readme.py::test_spark_quickstart_query",
    "tests/test_readme.py::test_setup_demo_command_runs_on_a_fresh_copy",
    "tests/test_demo.py::test_default_demo_is_exactly_once_through_kills_of_pipeline_broker_and_spark",
    "tests/test_demo.py::test_demo_fails_when_the_spark_totals_are_wrong",
    "tests/faults/test_chaos_spark.py::test_users_spark_query_example_under_driver_and_broker_kills",
    "tests/faults/test_chaos_spark.py::test_a_wrong_expectation_of_the_spark_output_is_caught",
)
SPARK_LANES = 2
#: Seconds the longest tests took in a 4-worker run on the shared 2-core
#: machine (load 8-18), only to hand out the longest work first and to
#: balance the lanes; other Spark tests count SPARK_SECONDS.
MEASURED_SECONDS = {
    "tests/streaming/spark/test_spark_sink_crash.py::test_driver_killed_at_every_crash_point_then_restarted": 520,
    "tests/test_readme.py::test_spark_quickstart_query": 330,
    "tests/test_demo.py::test_default_demo_is_exactly_once_through_kills_of_pipeline_broker_and_spark": 285,
    "tests/broker/test_copier.py::test_copier_exactly_once_through_copier_kills[txn]": 260,
    "tests/test_readme.py::test_setup_demo_command_runs_on_a_fresh_copy": 230,
    "tests/faults/test_chaos_spark.py::test_users_spark_query_example_under_driver_and_broker_kills": 220,
    "tests/test_demo.py::test_demo_fails_when_the_spark_totals_are_wrong": 190,
    "tests/streaming/spark/test_spark_sink_session.py::test_topic_partition_and_headers_columns": 185,
    "tests/faults/test_chaos_spark.py::test_a_wrong_expectation_of_the_spark_output_is_caught": 170,
    "tests/streaming/test_dataflow_broker.py::test_window_results_and_late_counts_equal_a_recomputation_across_restarts[by-input-key]": 160,
    "tests/streaming/spark/test_spark_sink_session.py::test_source_and_sink_over_sasl_ssl": 155,
    "tests/broker/test_concurrent_durability.py::test_sigkill_under_many_clients_loses_no_acknowledged_record_and_leaves_no_transaction_hanging[1.2-True]": 135,
    "tests/test_readme.py::test_bench_command_runs_every_scenario": 125,
    "tests/streaming/spark/test_spark_sink_crash.py::test_decided_transactions_timed_out_before_the_restart_fail_the_query": 120,
    "tests/broker/test_copier.py::test_copier_exactly_once_through_a_broker_kill[txn]": 105,
    "tests/test_readme.py::test_chaos_command_runs_and_reports": 90,
}
SPARK_SECONDS = 20.0


def spark_lanes(nodeids) -> dict[str, str]:
    """The lane of each Spark test among ``nodeids`` (a module of SPARK_DIR
    stays in one lane): longest units first, each to the lightest lane. A
    function of the ids alone, so the workers and the controller agree."""
    units: dict[str, list[str]] = {}
    for nodeid in nodeids:
        path = nodeid.split("::")[0]
        if path.startswith(SPARK_DIR):
            units.setdefault(path, []).append(nodeid)
        elif nodeid in SPARK_DRIVER_TESTS:
            units.setdefault(nodeid, []).append(nodeid)

    def seconds(unit):
        return sum(MEASURED_SECONDS.get(nodeid, SPARK_SECONDS) for nodeid in units[unit])

    lane_seconds = [0.0] * SPARK_LANES
    lanes = {}
    for unit in sorted(units, key=lambda unit: (-seconds(unit), unit)):
        lane = lane_seconds.index(min(lane_seconds))
        lane_seconds[lane] += seconds(unit)
        lanes.update((nodeid, f"spark-lane-{lane}") for nodeid in units[unit])
    return lanes


def pytest_configure(config):
    entries = config.getoption("--index-budget", default=None)
    if entries is not None:
        import storage.index

        storage.index.DEFAULT_RESIDENT_ENTRIES = entries


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """On an xdist worker: the Spark lanes first, lane by lane, then the
    other tests longest first (every worker collects the same, so all agree
    on the order, which the scheduler keeps: --no-loadscope-reorder)."""
    if not hasattr(config, "workerinput"):
        return
    lanes = spark_lanes([item.nodeid for item in items])

    def seconds(item):
        if item.nodeid in MEASURED_SECONDS:
            return MEASURED_SECONDS[item.nodeid]
        return 30.0 if item.get_closest_marker("slow") else 1.0

    position = {id(item): index for index, item in enumerate(items)}
    items.sort(key=lambda item: (0, lanes[item.nodeid], position[id(item)]) if item.nodeid in lanes else (1, -seconds(item), position[id(item)]))


def pytest_xdist_make_scheduler(config, log):
    """With --dist loadgroup: each Spark lane is one unit of work, every other test its own."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class SparkLaneScheduling(LoadGroupScheduling):
        lanes: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.lanes is None and self.collection is not None:
                self.lanes = spark_lanes(self.collection)
            return (self.lanes or {}).get(nodeid) or super()._split_scope(nodeid)

    return SparkLaneScheduling(config, log)


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

