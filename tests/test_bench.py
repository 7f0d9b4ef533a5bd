"""The bench's arithmetic (the whole command runs in
tests/test_readme.py::test_bench_command_runs_every_scenario)."""

import os

import pytest

from benchmarks.suite import SCENARIOS, fraction_of_limit, medians, select_scenarios


def test_medians_and_limits_are_computed_from_the_rounds():
    results = {"produce 1 KiB, acks=all": {"records/s": [10.0, 30.0, 20.0], "MB/s": [1.0, 3.0, 2.0], "_unit:MB/s": "MB/s"}}
    assert medians(results) == {"produce 1 KiB, acks=all": {"records/s": 20.0, "MB/s": 2.0}}
    limits = {"disk_write_16k_mb_per_s": 300.0, "disk_write_1m_mb_per_s": 400.0, "loopback_mb_per_s": 1000.0, "fsyncs_per_s": 100.0}
    produce = next(s for s in SCENARIOS if s.name == "produce 1 KiB, acks=all")
    assert fraction_of_limit(produce, {"records/s": 20.0, "MB/s": 200.0}, limits).startswith("0.500 of 400 MB/s")
    commits = next(s for s in SCENARIOS if s.name == "transactions of 1 record")
    assert fraction_of_limit(commits, {"transactions/s": 25.0}, limits).startswith("0.250 of 100 fsyncs/s")


def test_the_concurrency_chart_plots_records_per_second_against_clients(tmp_path):
    from benchmarks import concurrency

    rows = [{"scenario": "concurrency: idempotent producers", "metric": f"records/s, N={n}", "onceflow": 1000.0 * n, "peer": 900.0 * n}
            for n in concurrency.CONCURRENCY]
    rows.append({"scenario": "produce 100 B, acks=all", "metric": "records/s", "onceflow": 1.0, "peer": 1.0})
    path = tmp_path / "concurrency.png"
    assert concurrency.chart(rows, {"fsyncs_per_s": 5000.0}, str(path))
    assert path.stat().st_size > 0
    assert not concurrency.chart(rows[-1:], {"fsyncs_per_s": 5000.0}, str(tmp_path / "none.png")), "no concurrency rows, no chart"


@pytest.mark.slow
def test_restart_bench_times_every_step_of_a_small_broker(tmp_path):
    from benchmarks import restart_bench
    from benchmarks.suite import REPO

    lines = []
    rows = restart_bench.run([20], {"here": REPO}, lines.append, work_dir=str(tmp_path))
    assert [row["partitions"] for row in rows] == [0, 20] and not any("error" in row for row in rows), lines
    steps = ["create", "clean stop", "restart after clean stop", "restart after SIGKILL", "restart after SIGKILL, all written"]
    assert all(rows[1][step] > 0 for step in steps)
    assert 10 < rows[1]["RSS after clean restart, MiB"] < 1000
    restart_bench.report(rows, ["here"], lines.append)
    assert any(line.startswith("| restart after SIGKILL s | ") for line in lines)


def test_only_selects_by_semicolon_separated_prefixes_of_names_that_hold_commas():
    chosen = select_scenarios(SCENARIOS, "produce 100 B, acks=all; consume")
    assert [s.name for s in chosen] == ["produce 100 B, acks=all", "consume read_uncommitted", "consume read_committed"]
    with pytest.raises(SystemExit, match="no scenario starts with produce 100 B, acks=none"):
        select_scenarios(SCENARIOS, "produce 100 B, acks=none;consume")


def test_a_row_below_the_peer_names_what_holds_it_with_the_runs_figures():
    from benchmarks.suite import what_holds

    limits = {"fsyncs_per_s": 4000.0}
    one_record = next(s for s in SCENARIOS if s.name == "transactions of 1 record")
    held = what_holds(one_record, "transactions/s", {"transactions/s": 250.0}, {"transactions/s": 400.0}, limits)
    # 4.00 ms against 2.50 ms; two rounds (the Produce's, PrepareCommit's) at 0.25 ms are 0.50 ms of the 1.50 ms.
    assert held.startswith("fsync latency: 2 rounds in a row x 0.25 ms = 0.50 ms, of the 1.50 ms a transaction takes longer")
    produce = next(s for s in SCENARIOS if s.name == "produce 100 B, acks=all")
    assert what_holds(produce, "records/s", {"client loop": 0.97, "broker CPU": 0.3, "client CPU": 1.2}, {"client loop": 0.98}, limits).startswith(
        "the client's Python loop: 0.97 of a core")
    busy = {"client loop": 0.6, "broker CPU": 0.9, "client CPU": 0.9}
    assert what_holds(produce, "records/s", busy, {}, limits).startswith("the machine's CPU: broker 0.90 + client 0.90") == (os.cpu_count() == 2)
    idle = {"client loop": 0.3, "broker CPU": 0.2, "client CPU": 0.4}
    assert what_holds(produce, "records/s", idle, {}, limits).startswith("not the client's loop")


def test_with_the_same_runs_figures_without_fsync_the_note_says_what_the_fsyncs_cost():
    from benchmarks.suite import what_holds

    one_record = next(s for s in SCENARIOS if s.name == "transactions of 1 record")
    held = what_holds(one_record, "transactions/s", {"transactions/s": 250.0}, {"transactions/s": 500.0}, {"fsyncs_per_s": 4000.0},
                      {"transactions/s": 400.0})
    # 4.00 ms, Tansu 2.00 ms, without fsync 2.50 ms (0.80x Tansu): the rounds cost 1.50 ms.
    assert held == ("fsync: 4.00 ms per transaction against Tansu's 2.00 (in memory); with no fsync (flush.policy=os, same run)"
                    " 2.50 ms, 0.80x Tansu: 2 rounds in a row cost 1.50 ms (the machine: 0.25 ms per fsync)")


def test_rounds_take_turns_between_brokers_and_a_row_whose_rounds_disagree_says_so():
    """Round i of every contender runs before round i + 1 of any, on a fresh
    target each; a row below the peer whose rounds are not all below says so
    with each round's ratio."""
    from benchmarks.suite import Contender, Metric, Scenario, ScenarioSettings, paired_ratios, report, run_rounds

    order = []

    class Target:
        def __init__(self, name):
            self.name, self.pid, self.bootstrap = name, os.getpid(), name

        def __enter__(self):
            order.append(("start", self.name))
            return self

        def __exit__(self, *exc):
            order.append(("stop", self.name))

    figures = {"ours": iter([90.0, 120.0, 80.0]), "peer": iter([100.0, 100.0, 100.0])}
    scenario = Scenario("produce", lambda bootstrap, settings: {"records/s": Metric(next(figures[bootstrap]), "records/s")})
    contenders = [Contender(name, lambda name=name: Target(name), (scenario,)) for name in ("ours", "peer")]
    results = run_rounds(contenders, ScenarioSettings(), 3, lambda line: None)
    assert order == [("start", "ours"), ("stop", "ours"), ("start", "peer"), ("stop", "peer")] * 3
    assert results["ours"]["produce"]["records/s"] == [90.0, 120.0, 80.0]
    assert paired_ratios([90.0, 120.0, 80.0], [100.0, 100.0, 100.0]) == [0.9, 1.2, 0.8]
    lines = []
    rows = report({"produce": {"records/s": 90.0}}, {"produce": {"records/s": 100.0}}, {}, [scenario], lines.append, None,
                  (results["ours"], results["peer"]))
    assert rows[0]["rounds"] == [0.9, 1.2, 0.8]
    assert rows[0]["holds"].startswith("no limit: the rounds disagree") and "0.90, 1.20, 0.80" in rows[0]["holds"]
    figures = {"ours": iter([90.0, 95.0, 80.0]), "peer": iter([100.0, 100.0, 100.0])}
    results = run_rounds(contenders, ScenarioSettings(), 3, lambda line: None)
    rows = report({"produce": {"records/s": 90.0}}, {"produce": {"records/s": 100.0}}, {}, [scenario], lines.append, None,
                  (results["ours"], results["peer"]))
    assert rows[0]["holds"].startswith("not the client's loop") and "0.90, 0.95, 0.80" in rows[0]["holds"]


def test_a_round_that_failed_keeps_its_place_so_the_rounds_beside_the_peers_stay_paired():
    from benchmarks.suite import Contender, Metric, Scenario, ScenarioSettings, medians, paired_ratios, run_rounds

    class Target:
        def __init__(self, name):
            self.name, self.pid, self.bootstrap = name, os.getpid(), name

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    figures = {"ours": iter([RuntimeError("stall"), 120.0, 80.0]), "peer": iter([100.0, 150.0, 200.0])}

    def run(bootstrap, settings):
        figure = next(figures[bootstrap])
        if isinstance(figure, Exception):
            raise figure
        return {"records/s": Metric(figure, "records/s")}

    scenario = Scenario("produce", run)
    contenders = [Contender(name, lambda name=name: Target(name), (scenario,)) for name in ("ours", "peer")]
    results = run_rounds(contenders, ScenarioSettings(), 3, lambda line: None)
    assert results["ours"]["produce"]["records/s"] == [None, 120.0, 80.0]
    assert results["ours"]["produce"]["error"] == ["RuntimeError: stall"]
    # Round 2 beside round 2 (0.8), round 3 beside round 3 (0.4); not 120/100 and 80/150.
    assert paired_ratios(results["ours"]["produce"]["records/s"], results["peer"]["produce"]["records/s"]) == [0.8, 0.4]
    assert medians(results["ours"])["produce"]["records/s"] == 100.0


def test_a_stream_row_without_a_chain_says_whether_its_bytes_waiting_for_the_disk_hold_it():
    from benchmarks.suite import what_holds

    stream = next(s for s in SCENARIOS if s.name == "produce 1 KiB, idempotent")
    held = what_holds(stream, "records/s", {"records/s": 100_000.0}, {"records/s": 150_000.0}, {}, {"records/s": 180_000.0})
    assert held == ("fsync (every acknowledged byte waits for the disk): 100,000 records/s with it, 180,000 with no fsync"
                    " (flush.policy=os, same run), 1.20x Tansu")
    held = what_holds(stream, "records/s", {"records/s": 100_000.0}, {"records/s": 150_000.0}, {}, {"records/s": 95_000.0})
    assert held.startswith("not fsync: with no fsync (flush.policy=os, same run) 95,000 records/s, no more than 100,000")
    idle = {"records/s": 100_000.0, "client loop": 0.3, "broker CPU": 0.2, "client CPU": 0.4}
    assert what_holds(stream, "records/s", idle, {"records/s": 150_000.0}, {"fsyncs_per_s": 4000.0}).startswith("not the client's loop")


def test_a_chain_counted_live_is_said_with_the_count_not_the_declared_steps():
    from benchmarks.suite import what_holds

    one_record = next(s for s in SCENARIOS if s.name == "transactions of 1 record")
    ours = {"transactions/s": 250.0, "fsync rounds per transaction": 3.0}
    held = what_holds(one_record, "transactions/s", ours, {"transactions/s": 400.0}, {"fsyncs_per_s": 4000.0})
    assert held.startswith("fsync latency: 3.00 rounds (counted) in a row x 0.25 ms = 0.75 ms, of the 1.50 ms")
    copiers = next(s for s in SCENARIOS if s.name.startswith("concurrency: transactional copiers"))
    ours = {"records/s, N=4": 4000.0, "fsync rounds per transaction, N=4": 2.5}
    held = what_holds(copiers, "records/s, N=4", ours, {"records/s, N=4": 8000.0}, {"fsyncs_per_s": 4000.0})
    assert "2.50 rounds (counted) in a row" in held


@pytest.mark.slow
def test_the_bench_counts_the_fsync_rounds_of_a_transaction_in_our_broker(tmp_path):
    """The bench reads our broker's ``onceflow_requests_waited_fsync_total``
    around a scenario's timed part: librdkafka's one-record transactions
    wait for two rounds each (Produce, EndTxn's decision); with no fsync
    (flush.policy=os) for none."""
    from benchmarks.suite import ROUNDS, OnceflowTarget, ScenarioSettings, probing, transactions_scenario

    counted = {}
    for name, settings in (("fsync", ()), ("no fsync", ("flush.policy=os",))):
        with OnceflowTarget(str(tmp_path), settings) as target, probing(target):
            transactions_scenario(1)(target.bootstrap, ScenarioSettings(seconds=1.0))
            counted[name] = ROUNDS.last.per_operation, ROUNDS.last.operation
    assert counted["fsync"][1] == "transaction" and 1.9 <= counted["fsync"][0] <= 2.1, counted
    assert counted["no fsync"] == (0.0, "transaction"), counted


@pytest.mark.slow
def test_txn_cpu_reads_the_brokers_cpu_for_each_workload(capsys):
    """benchmarks.txn_cpu against this checkout and itself as the baseline:
    every workload gets a CPU figure from the broker's /proc entry, and the
    table has a ratio per row."""
    from benchmarks import txn_cpu
    from benchmarks.suite import REPO

    assert txn_cpu.main(["--baseline", REPO, "--rounds", "1", "--transactions", "20", "--rows", "100000"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "CPU" in line]
    assert [line.split(" | ")[0] for line in table] == ["| librdkafka, 1-record txns: CPU ms/txn", "| txn, 1-record txns: CPU ms/txn", "| txn, 1 MiB batches: CPU s/MB"]
    for line in table:
        this, baseline = (float(cell) for cell in line.split(" | ")[1:3])
        assert this > 0 and baseline > 0, line


@pytest.mark.slow
def test_loop_turns_counts_each_checkout(capsys):
    """benchmarks.loop_turns against this checkout and itself as the
    baseline (run from there in a fresh interpreter): both columns count
    turns, callbacks and tasks of every transaction."""
    from benchmarks import loop_turns
    from benchmarks.suite import REPO

    assert loop_turns.main(["--baseline", REPO, "--transactions", "20"]) == 0
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:3] for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and not line.startswith("| count")}
    for name in ("turns", "callbacks", "tasks"):
        this, baseline = (float(cell.strip(" |")) for cell in rows[name])
        assert this > 0 and baseline > 0, (name, rows[name])
