"""The checker on hand-made histories: each anomaly planted is found, clean
histories (aborts, unknown outcomes, rewinds, restarts) pass; history files
survive a torn last line; the command line exits non-zero on anomalies."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from faults.checker import check, check_workload, main
from faults.history import HistoryWriter, read_history


class History:
    """Builds events the way the workloads write them."""

    def __init__(self):
        self.events: list[dict] = []
        self.clock = 0.0

    def add(self, process, type_, op, value):
        self.clock += 1.0
        self.events.append({"time": self.clock, "process": process, "type": type_, "op": op, "value": value})
        return self

    def send(self, process, partition, value, offset, type_="ok"):
        return self.add(process, type_, "send", [["send", partition, value, offset]])

    def txn(self, process, sends, type_="ok", reads=None):
        micro = ([["poll", reads]] if reads else []) + [["send", p, v, o] for p, v, o in sends]
        return self.add(process, type_, "txn", micro)

    def poll(self, process, reads):
        return self.add(process, "ok", "poll", [["poll", reads]])


def clean_copier():
    h = History()
    for i in range(6):
        h.send("seeder", "input-0", str(i), i)
    h.txn("copier-0/1", [("output-0", "0", 0), ("output-0", "1", 1)], reads={"input-0": [[0, "0"], [1, "1"]]})
    # aborted on purpose: its records sit at offsets 3-4 (after the marker at 2), never visible
    h.txn("copier-0/1", [("output-0", "2", 3), ("output-0", "3", 4)], type_="fail", reads={"input-0": [[2, "2"], [3, "3"]]})
    h.add("copier-0/1", "ok", "seek", ["input-0"])
    h.txn("copier-0/1", [("output-0", "2", 6), ("output-0", "3", 7)], reads={"input-0": [[2, "2"], [3, "3"]]})
    # the process dies with its commit's outcome unknown; its successor re-does the work
    h.add("copier-0/1", "invoke", "txn", [["send", "output-0", "4", None]])
    h.txn("copier-0/2", [("output-0", "4", 9), ("output-0", "5", 10)], reads={"input-0": [[4, "4"], [5, "5"]]})
    h.poll("final-reader/3", {"output-0": [[0, "0"], [1, "1"], [6, "2"], [7, "3"]]})
    h.poll("final-reader/3", {"output-0": [[9, "4"], [10, "5"]]})
    return h


def kinds(verdict):
    return set(verdict.anomaly_counts)


def copier_check(h):
    return check(h.events, input_topic="input", output_topic="output")


def test_clean_copier_history_is_valid():
    verdict = copier_check(clean_copier())
    assert verdict.valid, verdict.summary()
    assert verdict.counts["committed"] == 6 + 6 and verdict.counts["aborted"] == 2 and verdict.counts["read"] == 12, "6 input reads by the copiers, 6 output reads"


@pytest.mark.parametrize(
    "plant, expected",
    [
        (lambda h: h.poll("final-reader/3", {"output-0": [[3, "2"]]}), "aborted-read"),
        (lambda h: h.txn("copier-9/9", [("output-0", "0", 12)]).poll("final-reader/3", {"output-0": [[12, "0"]]}), "copy-duplicate"),
        (lambda h: h.poll("other/4", {"output-0": [[0, "not-zero"]]}), "inconsistent-offsets"),
        (lambda h: h.txn("copier-9/9", [("output-0", "stray", 12)]).poll("final-reader/3", {"output-0": [[12, "stray"]]}), "copy-unexpected"),
        (lambda h: h.send("seeder", "input-0", "6", 6), "copy-missing"),
        (lambda h: h.poll("final-reader/3", {"output-0": [[6, "2"]]}), "nonmonotonic-poll"),
        (lambda h: h.poll("reader/5", {"output-0": [[1, "1"], [0, "0"]]}), "int-nonmonotonic-poll"),
        (lambda h: h.poll("reader/6", {"output-0": [[0, "0"], [6, "2"]]}), "int-poll-skip"),
        (lambda h: h.poll("reader/7", {"output-0": [[0, "0"]]}).poll("reader/7", {"output-0": [[7, "3"]]}), "poll-skip"),
        (lambda h: h.txn("copier-0/2", [("output-0", "5", 8)]), "nonmonotonic-send"),
    ],
)
def test_each_planted_anomaly_is_found(plant, expected):
    h = clean_copier()
    plant(h)
    verdict = copier_check(h)
    assert expected in kinds(verdict), verdict.summary()
    assert not verdict.valid


def test_lost_write_and_unseen_are_told_apart():
    h = History()
    h.send("producer-0/1", "out-0", "a", 0).send("producer-0/1", "out-0", "b", 1).send("producer-0/1", "out-0", "c", 2)
    h.poll("reader/2", {"out-0": [[0, "a"], [2, "c"]]})
    verdict = check(h.events)
    assert kinds(verdict) == {"lost-write", "int-poll-skip"}, verdict.summary()
    assert verdict.anomalies["lost-write"][0]["value"] == "b"

    h = History()
    h.send("producer-0/1", "out-0", "a", 0).send("producer-0/1", "out-0", "b", 1)
    h.poll("reader/2", {"out-0": [[0, "a"]]})
    assert check(h.events).valid, "no final read phase: unseen is only counted"
    assert check(h.events).counts["unseen"] == 1
    h.poll("final-reader/3", {"out-0": [[0, "a"]]})
    assert kinds(check(h.events)) == {"unseen"}


def test_duplicate_value_within_a_topic():
    h = History()
    h.send("p/1", "out-0", "x", 0).send("p/1", "out-1", "x", 0)
    h.poll("final-reader/2", {"out-0": [[0, "x"]], "out-1": [[0, "x"]]})
    assert kinds(check(h.events)) == {"duplicate"}


def test_seek_and_assign_reset_the_poll_order():
    h = History()
    h.send("p/1", "out-0", "a", 0).send("p/1", "out-0", "b", 1)
    h.poll("c/2", {"out-0": [[0, "a"], [1, "b"]]})
    h.add("c/2", "ok", "seek", ["out-0"])
    h.poll("c/2", {"out-0": [[0, "a"], [1, "b"]]})
    h.add("c/2", "ok", "assign", ["out-0"])
    h.poll("c/2", {"out-0": [[1, "b"]]})
    assert check(h.events).valid


def test_bank_total_must_hold_at_every_audit():
    h = History()
    h.txn("bank-open/1", [("ledger-0", "a:100", 0), ("ledger-0", "b:100", 1)])
    h.add("auditor/2", "ok", "balances", {"balances": {"a": 100, "b": 100}, "total": 200})
    h.add("auditor/2", "ok", "balances", {"balances": {"a": 95, "b": 100}, "total": 195})
    verdict = check_workload("bank", h.events, total=200)
    assert kinds(verdict) == {"bank-total"} and verdict.counts["audits"] == 2


def test_history_file_survives_a_torn_last_line(tmp_path):
    path = str(tmp_path / "h.jsonl")
    writer = HistoryWriter(path, "p/1")
    writer.event("ok", "send", [["send", "out-0", "a", 0]])
    writer.event("ok", "send", [["send", "out-0", "b", 1]])
    writer.close()
    with open(path, "a") as file:
        file.write('{"time": 3, "process": "p/1", "type": "ok", "op": "se')  # SIGKILL mid-line
    events = read_history(path)
    assert [e["value"][0][2] for e in events] == ["a", "b"]


def test_command_line_exit_codes(tmp_path, capsys):
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    h = clean_copier()
    good.write_text("".join(json.dumps(e) + "\n" for e in h.events))
    h.poll("final-reader/3", {"output-0": [[3, "2"]]})
    bad.write_text("".join(json.dumps(e) + "\n" for e in h.events))
    assert main([str(good), "--workload", "copier"]) == 0
    out = tmp_path / "verdict.json"
    assert main([str(bad), "--workload", "copier", "--json", str(out)]) == 1
    assert json.loads(out.read_text())["anomaly_counts"]["aborted-read"] == 1
    assert "aborted-read" in capsys.readouterr().out


@st.composite
def simulated_runs(draw):
    """A log of transactions (some aborted) on two partitions, and readers
    that read it in order, in random chunks, as a read_committed consumer would."""
    h = History()
    logs = {"out-0": [], "out-1": []}
    for number in range(draw(st.integers(1, 25))):
        partition = draw(st.sampled_from(sorted(logs)))
        log = logs[partition]
        committed = draw(st.booleans())
        offset = len(log)
        log.append((str(number), committed))
        log.append((None, None))  # the marker takes an offset too
        h.txn(f"w/{number % 3}", [(partition, str(number), offset)], type_="ok" if committed else "fail")
    for reader in range(draw(st.integers(1, 3))):
        for partition, log in logs.items():
            visible = [[offset, value] for offset, (value, committed) in enumerate(log) if committed]
            position = 0
            while position < len(visible):
                size = draw(st.integers(1, 4))
                h.poll(f"final-reader/{reader}", {partition: visible[position : position + size]})
                position += size
    return h, logs


@settings(max_examples=60, deadline=None)
@given(simulated_runs(), st.data())
def test_random_clean_histories_pass_and_one_mutation_is_caught(run, data):
    h, logs = run
    assert check(h.events).valid, check(h.events).summary()
    aborted = [(p, o, v) for p, log in logs.items() for o, (v, c) in enumerate(log) if c is False]
    committed = [(p, o, v) for p, log in logs.items() for o, (v, c) in enumerate(log) if c]
    mutation = data.draw(st.sampled_from(["aborted-read", "duplicate", "drop"]))
    if mutation == "aborted-read" and aborted:
        partition, offset, value = aborted[0]
        h.poll("late/9", {partition: [[offset, value]]})
        assert "aborted-read" in kinds(check(h.events))
    elif mutation == "duplicate" and committed:
        partition, offset, value = committed[0]
        other = "out-1" if partition == "out-0" else "out-0"
        h.poll("final-reader/8", {other: [[1000, value]]})
        assert "duplicate" in kinds(check(h.events))
    elif mutation == "drop" and committed:
        partition, offset, value = committed[0]
        for event in h.events:
            for micro in event["value"]:
                if micro[0] == "poll" and partition in micro[1]:
                    micro[1][partition] = [pair for pair in micro[1][partition] if pair[0] != offset]
        assert kinds(check(h.events)) & {"unseen", "lost-write", "int-poll-skip", "poll-skip"}
