"""The availability measure on hand-made histories: faults at known times,
committed outputs at known times, known numbers out (faults.availability)."""

from __future__ import annotations

import attrs
import pytest

from faults.availability import FaultEvent, Output, PartitionSample, instance_recoveries, measure


def steady(start: float, end: float, *, per_tenth: int = 10, process: str = "copier-0/1", skip=()) -> list[Output]:
    """``per_tenth`` records every 0.1 s in [start, end), none inside the ``skip`` (low, high) ranges."""
    outputs = []
    for tenth in range(round(start * 10), round(end * 10)):
        at = tenth / 10
        if not any(low <= at < high for low, high in skip):
            outputs.append(Output(at, per_tenth, process))
    return outputs


def test_a_stall_after_a_fault_gives_its_first_output_rate_back_and_longest_stall():
    outputs = steady(0, 30, skip=[(10, 13)])  # 100 records/s, nothing from 10.0 to 13.0
    result = measure(outputs, [FaultEvent(10.0, "kill-broker", cleared=12.5)], start=0, end=30)
    (recovery,) = result.recoveries
    assert recovery.level == 100
    assert recovery.first_output_s == pytest.approx(3.0)
    assert recovery.first_after_clear_s == pytest.approx(0.5)
    assert recovery.rate_back_s == pytest.approx(3.0)  # the window [13, 14] holds 110 records
    assert result.longest_stall.start == pytest.approx(9.9) and result.longest_stall.end == pytest.approx(13.0)
    # Inside [10, 12.5] the fault was in progress: 9.9..10 and 12.5..13 remain.
    assert result.longest_stall_outside_faults.seconds == pytest.approx(0.5)
    assert result.longest_stall_outside_faults.start == pytest.approx(12.5)


def test_a_fault_that_changed_nothing_has_zero_rate_back():
    result = measure(steady(0, 20), [FaultEvent(10.05, "proxy-cut")], start=0, end=20)
    (recovery,) = result.recoveries
    assert recovery.rate_back_s == 0
    assert recovery.first_output_s == pytest.approx(0.05)
    assert result.longest_stall.seconds == pytest.approx(0.1)


def test_a_slow_return_counts_from_the_first_window_at_eighty_percent():
    # 100/s, then from the fault at 10 only 50/s until 14, then 100/s again.
    outputs = steady(0, 10) + steady(10, 14, per_tenth=5) + steady(14, 20)
    result = measure(outputs, [FaultEvent(10.0, "pause-broker", cleared=12.0)], start=0, end=20)
    (recovery,) = result.recoveries
    assert recovery.first_output_s == pytest.approx(0.1)  # output never stopped (one at 10.0 itself is not "after")
    # [s, s+1] reaches 80 when it holds 4 tenths at 5 and 6+ at 10 (s = 13.4: 13.4..13.9 at 5 = 30, 14.0..14.4 at 10 = 50).
    assert recovery.rate_back_s == pytest.approx(3.4)


def test_a_client_kill_waits_for_the_victims_restarted_instance():
    survivor = steady(0, 20, per_tenth=5, process="copier-1/2")
    victim = steady(0, 10, per_tenth=5, process="copier-0/1") + steady(12.4, 20, per_tenth=5, process="copier-0/3")
    fault = FaultEvent(10.0, "kill-client", cleared=10.2, victim="copier-0")
    (recovery,) = measure(survivor + victim, [fault], start=0, end=20).recoveries
    assert recovery.first_output_s == pytest.approx(0.1)  # the other copier went on
    assert recovery.first_after_clear_s == pytest.approx(2.2)  # the restarted one's first commit at 12.4
    # Outputs seen by a watcher do not say who committed them: the first after the restart counts.
    anonymous = [Output(o.at, o.records) for o in survivor + victim]
    (recovery,) = measure(anonymous, [fault], start=0, end=20).recoveries
    assert recovery.first_after_clear_s == pytest.approx(0.1)  # copier-1 at 10.3 (one at the restart itself is not after it)


def test_per_kind_median_and_worst_and_a_fault_never_recovered_from():
    outputs = steady(0, 40, skip=[(5, 6), (15, 17), (25, 29), (35, 40)])
    faults = [FaultEvent(5.0, "kill-broker"), FaultEvent(15.0, "kill-broker"), FaultEvent(25.0, "kill-broker"), FaultEvent(35.0, "proxy-cut")]
    result = measure(outputs, faults, start=0, end=40)
    kinds = {summary.kind: summary for summary in result.kinds}
    broker = kinds["kill-broker"]
    assert broker.count == 3 and broker.never == 0
    assert broker.median_first_output_s == pytest.approx(2.0) and broker.worst_first_output_s == pytest.approx(4.0)
    cut = kinds["proxy-cut"]
    assert cut.never == 1 and cut.worst_first_output_s is None and cut.median_first_output_s is None
    assert result.longest_stall.start == pytest.approx(34.9) and result.longest_stall.end == 40  # to the end of the run
    text = "\n".join(result.lines())
    assert "never" in text and "kill-broker" in text and "longest stretch with no committed output: 5.1 s" in text


def test_the_level_before_is_the_median_and_falls_back_to_the_run_when_stalled():
    # A stall from 3 to 9 (an earlier fault), a second fault at 8: the 5 s before hold nothing,
    # so the level is the run's median rate (100/s), not 0.
    outputs = steady(0, 30, skip=[(3, 9)])
    first, second = measure(outputs, [FaultEvent(3.0, "kill-broker", cleared=8.0), FaultEvent(8.0, "kill-client")], start=0, end=30).recoveries
    assert first.level == 100 and second.level == 100
    assert second.first_output_s == pytest.approx(1.0) and second.rate_back_s == pytest.approx(1.0)
    # One slow second among five does not move the median.
    outputs = steady(0, 5) + steady(5, 6, per_tenth=1) + steady(6, 20)
    (recovery,) = measure(outputs, [FaultEvent(10.0, "proxy-cut")], start=0, end=20).recoveries
    assert recovery.level == 100


def test_in_flight_compares_input_acknowledged_with_input_consumed():
    inputs = [(t / 10, 10) for t in range(100)]  # 100/s for 10 s
    consumed = [(t / 10 + 0.3, 10) for t in range(100)]  # each record consumed 0.3 s later
    faults = [FaultEvent(5.0, "kill-client"), FaultEvent(12.0, "kill-client")]  # the second after the input ended
    result = measure(steady(0, 11), faults, start=0, end=15, inputs=inputs, consumed=consumed)
    assert [r.in_flight for r in result.recoveries] == [True, False]
    assert result.faults_in_flight == 1 and result.faults_idle == 1
    # Input that stopped arriving 1.5 s before the fault but still waits to be consumed: in flight.
    waiting = measure(steady(0, 11), [FaultEvent(11.5, "kill-client")], start=0, end=15, inputs=inputs, consumed=[(1.0, 500)])
    assert waiting.recoveries[0].in_flight is True
    # A pipeline that keeps up (nothing waiting at the instant) on a live stream: in flight, the stream arriving.
    caught_up = measure(steady(0, 11), [FaultEvent(5.0, "kill-client")], start=0, end=15, inputs=inputs, consumed=[(t, n) for t, n in inputs])
    assert caught_up.recoveries[0].in_flight is True
    unknown = measure(steady(0, 11), faults, start=0, end=15)
    assert [r.in_flight for r in unknown.recoveries] == [None, None] and unknown.faults_idle == 0
    # Input held up by the fault before (sent at 3.5 s, the broker recovering
    # until 8 s): a fault at 6.5 s, nothing acknowledged within 1 s of it and
    # nothing waiting, hits records in flight all the same.
    held_inputs, held_consumed = [(t / 10, 10) for t in range(35)] + [(8.0, 50)], [(t / 10, 10) for t in range(35)] + [(8.3, 50)]
    held_fault = [FaultEvent(6.5, "torn-tail")]
    assert measure(steady(0, 11), held_fault, start=0, end=15, inputs=held_inputs, consumed=held_consumed).recoveries[0].in_flight is False
    held = measure(steady(0, 11), held_fault, start=0, end=15, inputs=held_inputs, consumed=held_consumed, sending=[(3.5, 8.0)])
    assert held.recoveries[0].in_flight is True and held.faults_idle == 0


def test_no_output_at_all_is_one_stall_over_the_run():
    result = measure([], [FaultEvent(2.0, "kill-broker", cleared=3.0)], start=0, end=10)
    assert result.longest_stall.seconds == 10
    assert result.longest_stall_outside_faults.seconds == 7  # 3..10
    (recovery,) = result.recoveries
    assert recovery.first_output_s is None and recovery.rate_back_s is None
    json_form = result.to_json()
    assert json_form["per_kind"]["kill-broker"]["never"] == 1 and json_form["longest_stall"]["seconds"] == 10


def sampled(start: float, end: float, stopped: dict[str, tuple[float, float]], *, fed_until: float = 99) -> list[PartitionSample]:
    """in-0, in-1, in-2 sampled every 0.25 s: 10 records arrive on each per
    sample until ``fed_until``, and each partition's committed offset
    follows its end except inside its ``stopped`` (low, high) range, where
    it stands (then catches up at once)."""
    ends = {"in-0": 0, "in-1": 0, "in-2": 0}
    committed = dict(ends)
    samples = []
    for quarter in range(round(start * 4), round(end * 4)):
        at = quarter / 4
        for partition in ends:
            if at < fed_until:
                ends[partition] += 10
            low, high = stopped.get(partition, (-1, -1))
            if not low <= at < high:
                committed[partition] = ends[partition] - (10 if at < fed_until else 0)  # a commit a sample behind
        samples.append(PartitionSample(at, dict(committed), dict(ends)))
    return samples


def test_per_instance_the_survivors_stall_and_the_victims_time_back():
    # The victim held in-0 and in-1 (killed at 10, restarted at once, first
    # commit at 12.5); the survivor's in-2 stopped from 10.5 to 13.0.
    samples = sampled(0, 30, {"in-0": (10, 12.5), "in-1": (10, 12.5), "in-2": (10.5, 13.0)})
    fault = FaultEvent(10.0, "lose-disk", cleared=10.1, victim="app-0", victim_partitions=("in-0", "in-1"))
    (recovery,) = instance_recoveries(samples, [fault, FaultEvent(20.0, "kill-broker")], end=30)
    assert recovery.survivors_stall_s == pytest.approx(13.0 - 10.25)  # its last advance before the stop, to its first after
    assert recovery.victim_back_s == pytest.approx(12.5 - 10.1)
    assert recovery.victim_partitions == ("in-0", "in-1")
    # A fault whose victim's partitions are unknown is not measured per instance;
    # a victim that never commits again has no time back.
    assert instance_recoveries(samples, [FaultEvent(10.0, "kill-client")], end=30) == []
    (never,) = instance_recoveries(sampled(0, 30, {"in-0": (10, 99)}), [attrs.evolve(fault, victim_partitions=("in-0",))], end=30)
    assert never.victim_back_s is None and never.survivors_stall_s == pytest.approx(0.25)


def test_per_instance_survivors_with_nothing_to_do_are_not_stalled():
    # The input stops at 11 (a workload fed in phases waits for the victim):
    # the survivor's in-2, caught up, has nothing waiting, and no stall.
    samples = sampled(0, 30, {"in-0": (10, 20)}, fed_until=11)
    fault = FaultEvent(10.0, "lose-disk", victim="app-0", victim_partitions=("in-0",))
    (recovery,) = instance_recoveries(samples, [fault], end=30)
    assert recovery.survivors_stall_s == pytest.approx(0.25)
    assert recovery.victim_back_s == pytest.approx(20.0 - 10.0)


def stopping(end: float, stops: dict[str, list[tuple[float, float]]]) -> list[PartitionSample]:
    """in-0, in-1, in-2 sampled every 0.25 s from 0 to ``end``, 10 records
    arriving on each per sample; each partition's committed offset follows
    its end a sample behind, except inside each of its ``stops`` (low,
    high), where it stands."""
    ends = {"in-0": 0, "in-1": 0, "in-2": 0}
    committed = dict(ends)
    samples = []
    for quarter in range(round(end * 4)):
        at = quarter / 4
        for partition in ends:
            ends[partition] += 10
            if not any(low <= at < high for low, high in stops.get(partition, [])):
                committed[partition] = ends[partition] - 10
        samples.append(PartitionSample(at, dict(committed), dict(ends)))
    return samples


def test_per_instance_a_survivors_stall_is_clipped_to_its_faults_window():
    # app-0 (in-0, in-1) is killed at 10, 16 and 22. The survivor's in-2
    # stood from 8.5 (some earlier trouble) to 10.75, from 16 to 17, and
    # from 21.5 to 23.5: its stretches with no advance run from the sample
    # before each, 8.25..10.75, 15.75..17 and 21.25..23.5. Each fault is
    # charged only the part inside its window [at, next fault): 0.75 s,
    # 1.0 s and 1.5 s. The rule before charged each the longest stretch
    # touching its window whole: 2.5, 2.25 and 2.25 s.
    victim = [(10, 11), (16, 17), (22, 23)]
    samples = stopping(30, {"in-0": victim, "in-1": victim, "in-2": [(8.5, 10.75), (16, 17), (21.5, 23.5)]})
    faults = [FaultEvent(at, "kill-client", cleared=at + 0.1, victim="app-0", victim_partitions=("in-0", "in-1")) for at in (10.0, 16.0, 22.0)]
    first, second, third = instance_recoveries(samples, faults, end=28)
    assert first.survivors_stall_s == pytest.approx(10.75 - 10.0)
    assert second.survivors_stall_s == pytest.approx(17.0 - 16.0)
    assert third.survivors_stall_s == pytest.approx(23.5 - 22.0)
    # The last fault's window ends with the faulted run.
    (last,) = instance_recoveries(samples, faults[2:], end=22.5)
    assert last.survivors_stall_s == pytest.approx(0.5)
