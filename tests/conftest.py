"""Shared fixtures (brokers in-process and as real child processes), and
how pytest-xdist shares the tests out (the README's test command:
``-n 4``, with ``--dist loadgroup --no-loadscope-reorder`` from pyproject.toml).

Every test is a unit of work of its own, except that each module under
``tests/streaming/spark/`` is one unit (its module-scoped Spark session starts
once), but for ``SPARK_DRIVER_MODULES``, whose tests start driver processes
of their own and are each a unit, and ``SPARKLESS_MODULES``, which start no
Spark. Units that start Spark (those modules and ``SPARK_DRIVER_TESTS``,
which start a driver process of their own) run at most ``SPARK_SLOTS`` at a
time: Spark gives a Python data-source worker a fixed 10 s to connect back
("Python worker failed to connect back", or "Timed out while waiting for
the Python worker to connect back": the suite reruns a test once for
either), which a 2-core machine running
four Spark queries misses. The scheduler hands out the Spark units first and the rest
meanwhile, each longest first (``MEASURED_SECONDS``, else a guess from the
``slow`` mark). Marking tests ``xdist_group`` would not do: with pytest 9.2
the mark no longer groups (pytest-xdist#1386). A serial run keeps the
collection order.
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
#: Modules of SPARK_DIR that share no Spark session (each test starts its own
#: driver processes): each test is a unit, so two lanes can share them out.
SPARK_DRIVER_MODULES = ("tests/streaming/spark/test_spark_sink_crash.py",)
#: Modules of SPARK_DIR that start no Spark (the source's and sink's pieces
#: without it): their tests are shared out like any other, not in a Spark lane.
SPARKLESS_MODULES = tuple(
    SPARK_DIR + name
    for name in (
        "test_decision_read.py",
        "test_spark_interpreter.py",
        "test_spark_sink.py",
        "test_spark_sink_decision.py",
        "test_spark_sink_driver_commit.py",
        "test_spark_source_options.py",
        "test_spark_source_plain.py",
        "test_spark_source_tansu.py",
        "test_spark_worker.py",
    )
)
#: Tests outside SPARK_DIR that start a Spark driver process.
SPARK_DRIVER_TESTS = (
    "tests/test_readme.py::test_spark_quickstart_query",
    "tests/test_readme.py::test_setup_demo_command_is_exactly_once_through_kills_on_a_fresh_copy",
    "tests/test_demo.py::test_demo_fails_when_the_spark_totals_are_wrong",
    "tests/faults/test_chaos_spark.py::test_users_spark_query_example_under_driver_and_broker_kills",
    "tests/faults/test_chaos_spark.py::test_a_wrong_expectation_of_the_spark_output_is_caught",
    "tests/faults/test_chaos_spark.py::test_executor_kills_on_a_cluster_started_for_the_run_lose_and_duplicate_nothing",
    "tests/test_bench_spark.py::test_the_stall_scenario_kills_its_query_at_a_decision_and_the_completer_finishes_it",
)
SPARK_SLOTS = 2
#: Seconds the longest tests took in a 4-worker run on the shared 2-core
#: machine (load 8-18), only to hand out the longest work first.
MEASURED_SECONDS = {
    "tests/streaming/spark/test_spark_sink_crash.py::test_driver_killed_before_at_and_after_its_decision_then_restarted": 425,
    "tests/streaming/spark/test_spark_sink_crash.py::test_driver_killed_amid_its_commits_then_a_failed_commit_and_a_dead_task": 425,
    "tests/test_readme.py::test_setup_demo_command_is_exactly_once_through_kills_on_a_fresh_copy": 420,
    "tests/test_readme.py::test_spark_quickstart_query": 330,
    "tests/broker/test_copier.py::test_copier_exactly_once_through_copier_kills[txn]": 260,
    "tests/faults/test_chaos_spark.py::test_users_spark_query_example_under_driver_and_broker_kills": 220,
    "tests/test_demo.py::test_demo_fails_when_the_spark_totals_are_wrong": 190,
    "tests/streaming/spark/test_spark_sink_session.py::test_topic_partition_and_headers_columns": 185,
    "tests/faults/test_chaos_spark.py::test_a_wrong_expectation_of_the_spark_output_is_caught": 170,
    "tests/streaming/test_dataflow_broker.py::test_window_results_and_late_counts_equal_a_recomputation_across_restarts[by-input-key]": 160,
    "tests/streaming/spark/test_spark_sink_session.py::test_source_and_sink_over_sasl_ssl": 155,
    "tests/streaming/spark/test_spark_sink_crash.py::test_decided_transactions_timed_out_before_the_restart[spark_sink.after_decision@1:kill-0]": 140,
    "tests/streaming/spark/test_spark_sink_crash.py::test_decided_transactions_timed_out_before_the_restart[spark_sink.after_commit@1:kill-1]": 140,
    "tests/streaming/spark/test_spark_sink_crash.py::test_the_completer_finishes_a_killed_drivers_decided_batch_before_spark_restarts": 120,
    "tests/broker/test_concurrent_durability.py::test_sigkill_under_many_clients_loses_no_acknowledged_record_and_leaves_no_transaction_hanging[1.2-True]": 135,
    "tests/test_readme.py::test_bench_command_runs_every_scenario": 125,
    "tests/broker/test_copier.py::test_copier_exactly_once_through_a_broker_kill[txn]": 105,
    "tests/test_readme.py::test_chaos_command_runs_and_reports": 90,
}


#: A test measured above this many seconds is marked ``soak`` (minutes long).
SOAK_SECONDS = 60


def spark_unit(nodeid: str) -> str | None:
    """The Spark unit of work a test belongs to, None if it starts no Spark."""
    path = nodeid.split("::")[0]
    if path in SPARKLESS_MODULES:
        return None
    if path in SPARK_DRIVER_MODULES:
        return "spark:" + nodeid
    if path.startswith(SPARK_DIR):
        return "spark:" + path
    if nodeid in SPARK_DRIVER_TESTS:
        return "spark:" + nodeid
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Marks the tiers, before ``-m`` selects: ``spark`` on every test that
    starts Spark (``spark_unit``), ``soak`` on every test measured above
    ``SOAK_SECONDS`` (``MEASURED_SECONDS``), so that ``-m "not spark and not
    soak"`` runs everything but the minutes-long ones.

    On an xdist worker, also orders them: the Spark units first, then the
    other tests, each longest first (every worker collects the same, so all
    agree on the order, which the scheduler keeps: --no-loadscope-reorder)."""
    for item in items:
        if item.nodeid.split("::")[0] in SPARKLESS_MODULES and {"spark", "spark_cluster"} & set(item.fixturenames):
            raise pytest.UsageError(f"{item.nodeid} starts Spark, but its module is listed in SPARKLESS_MODULES")
        if spark_unit(item.nodeid):
            item.add_marker(pytest.mark.spark)
        if MEASURED_SECONDS.get(item.nodeid, 0) > SOAK_SECONDS:
            item.add_marker(pytest.mark.soak)
    if not hasattr(config, "workerinput"):
        return

    def seconds(item):
        if item.nodeid in MEASURED_SECONDS:
            return MEASURED_SECONDS[item.nodeid]
        return 30.0 if item.get_closest_marker("slow") else 1.0

    unit_seconds: dict[str, float] = {}
    for item in items:
        unit = spark_unit(item.nodeid) or item.nodeid
        unit_seconds[unit] = unit_seconds.get(unit, 0.0) + seconds(item)
    position = {id(item): index for index, item in enumerate(items)}

    def order(item):
        unit = spark_unit(item.nodeid)
        return (unit is None, -unit_seconds[unit or item.nodeid], unit or "", position[id(item)])

    items.sort(key=order)


def pytest_xdist_make_scheduler(config, log):
    """With --dist loadgroup: the Spark units of ``spark_unit``, at most
    SPARK_SLOTS of them assigned at once; every other test a unit of its own."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class SparkSlotScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return spark_unit(nodeid) or super()._split_scope(nodeid)

        def _running_spark(self) -> set:
            """The workers holding a Spark unit not finished yet."""
            return {
                node
                for node, work in self.assigned_work.items()
                if any(scope.startswith("spark:") and not all(tests.values()) for scope, tests in work.items())
            }

        def _assign_work_unit(self, node) -> None:
            """The first unit in the queue, but a Spark unit only to a worker
            already running Spark or while fewer than SPARK_SLOTS do (one
            worker runs its units one after the other). A worker left with
            only Spark units it may not take is shut down: it runs what it
            holds and leaves."""
            running = self._running_spark()
            spark_allowed = node in running or len(running) < SPARK_SLOTS
            for scope in self.workqueue:
                if spark_allowed or not scope.startswith("spark:"):
                    break
            else:
                node.shutdown()
                return
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return SparkSlotScheduling(config, log)


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


@pytest.fixture(scope="module")
def module_broker(request, tmp_path_factory):
    """One broker process shared by the tests of a module: the one way to
    share a broker (each test makes its own topics, with
    ``tests.helpers.recreate_topics`` where a rerun may meet its first
    attempt's). A module adds settings with ``MODULE_BROKER_CONFIG =
    ("name=value", ...)``; a module that wants data in it first wraps it
    in a module fixture of its own that fills it."""
    config = getattr(request.module, "MODULE_BROKER_CONFIG", ())
    broker = BrokerProcess(str(tmp_path_factory.mktemp("module-broker") / "broker"), "group.initial.rebalance.delay.ms=0", *config).start()
    yield broker
    broker.kill()


@pytest.fixture
def embedded_broker(tmp_path):
    from broker.broker import EmbeddedBroker

    with EmbeddedBroker(str(tmp_path / "data"), group_initial_rebalance_delay_ms=0) as broker:
        yield broker

