"""The exactly-once checker: reads a history (``faults.history``) and reports
every anomaly it finds, with examples, plus counts.

Anomalies (named as Jepsen's Kafka queue checker names them, where it has
them):

| anomaly | meaning |
| --- | --- |
| lost-write | a committed write at an offset that reads went past, but nobody read |
| unseen | a committed write never read, with a final read phase in the history |
| duplicate | one value at more than one offset of a topic |
| aborted-read | a read saw a record of a transaction that aborted (G1a) |
| inconsistent-offsets | two reads or acks saw different values at one offset |
| nonmonotonic-poll | a process's next poll of a partition starts at or before its last one (no seek, assign or restart between) |
| int-nonmonotonic-poll | offsets go backwards inside one poll |
| poll-skip | between two polls a process skipped a committed record |
| int-poll-skip | inside one poll, a committed record was skipped |
| nonmonotonic-send | a process's acknowledged sends to a partition got decreasing offsets |
| copy-missing | (copier) an input record has no committed copy in the output; (streaming) an expected output record is missing |
| copy-duplicate | (copier) an input record has more than one committed copy; (streaming) an expected output record is there more often than expected |
| copy-unexpected | (copier) an output record that is no input record; (streaming) an output record nobody expected |
| bank-total | (bank) an audit saw balances that do not add up to the total |
| idle-fault | (chaos harness) a fault hit while no input was waiting: the workload had finished (or not begun), so the fault proved nothing |

A history without a final read phase (no process named ``final-reader``)
reports ``unseen`` as a count only: it may simply have ended first.

    python -m faults.checker history.jsonl|folder [--workload copier] [--json verdict.json]

exits 1 on any anomaly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter, defaultdict

import attrs

from faults.history import polls, read_histories, read_history, sends

EXAMPLES = 8
ERRORS = (
    "lost-write", "unseen", "duplicate", "aborted-read", "inconsistent-offsets", "nonmonotonic-poll", "int-nonmonotonic-poll",
    "poll-skip", "int-poll-skip", "nonmonotonic-send", "copy-missing", "copy-duplicate", "copy-unexpected", "bank-total",
    "idle-fault",
)


@attrs.define
class Verdict:
    anomalies: dict[str, list] = attrs.field(factory=dict)
    anomaly_counts: dict[str, int] = attrs.field(factory=dict)
    counts: dict[str, int] = attrs.field(factory=dict)

    @property
    def valid(self) -> bool:
        return not self.anomaly_counts

    def add(self, kind: str, example: dict) -> None:
        self.anomaly_counts[kind] = self.anomaly_counts.get(kind, 0) + 1
        examples = self.anomalies.setdefault(kind, [])
        if len(examples) < EXAMPLES:
            examples.append(example)

    def to_json(self) -> dict:
        return {"valid": self.valid, "anomaly_counts": self.anomaly_counts, "anomalies": self.anomalies, "counts": self.counts}

    def summary(self) -> str:
        lines = ["VALID: no anomaly found" if self.valid else f"INVALID: {sum(self.anomaly_counts.values())} anomalies"]
        lines.append("counts: " + ", ".join(f"{k} {v}" for k, v in self.counts.items()))
        for kind in ERRORS:
            if kind in self.anomaly_counts:
                lines.append(f"{kind}: {self.anomaly_counts[kind]}")
                for example in self.anomalies[kind][:3]:
                    lines.append(f"    e.g. {json.dumps(example, sort_keys=True)}")
        return "\n".join(lines)


def _topic(partition: str) -> str:
    return partition.rsplit("-", 1)[0]


def check(history: list[dict], *, input_topic: str | None = None, output_topic: str | None = None, bank_total: int | None = None, unique_values: bool = True, transform=None,
          expected_outputs: Counter | None = None) -> Verdict:
    """Check a merged history. ``input_topic``/``output_topic`` turn on the
    copier's exactly-once check; ``bank_total`` the bank's audit check;
    ``unique_values=False`` (the bank's ledger repeats values) turns off
    the duplicate check; ``transform`` maps an input value to the output
    value the copy check expects (identity by default).
    ``expected_outputs`` (with ``output_topic``): the multiset of values the
    output topic must hold, each exactly as often (a streaming app's
    ``expected``), checked with the same copy-* anomalies."""
    verdict = Verdict()
    history = sorted(history, key=lambda e: e["time"])
    # Writes with known offsets: (partition, offset) -> (value, status, process)
    writes: dict[tuple[str, int], tuple[str, str, str]] = {}
    committed: dict[tuple[str, int], str] = {}
    sent = acknowledged = aborted = unknown = 0
    for event in history:
        kind, op = event["type"], event["op"]
        if op not in ("txn", "send"):
            continue
        micro = sends(event)
        if kind == "invoke":
            sent += len(micro)
            continue
        if kind == "ok":
            acknowledged += len(micro)
        elif kind == "fail":
            aborted += len(micro)
        else:
            unknown += len(micro)
        for partition, value, offset in micro:
            if offset is None or offset < 0:
                continue
            key = (partition, offset)
            previous = writes.get(key)
            if previous is not None and previous[0] != value:
                verdict.add("inconsistent-offsets", {"partition": partition, "offset": offset, "values": [previous[0], value], "processes": [previous[2], event["process"]]})
            if previous is None or kind == "ok":
                writes[key] = (value, kind, event["process"])
            if kind == "ok":
                committed[key] = value

    # Reads: (partition, offset) -> value, and per-process poll sequences.
    read_at: dict[tuple[str, int], str] = {}
    read_by_value: dict[tuple[str, str], set] = defaultdict(set)  # (topic, value) -> {(partition, offset)}
    highest_read: dict[str, int] = {}
    sequences: dict[tuple[str, str], list] = defaultdict(list)  # (process, partition) -> [("poll", [offsets]) | ("reset",)]
    for event in history:
        if event["type"] != "ok":
            continue
        if event["op"] in ("assign", "seek"):
            for partition in event.get("value") or []:
                sequences[(event["process"], partition)].append(("reset",))
            continue
        for poll in polls(event):
            for partition, pairs in poll.items():
                offsets = []
                for offset, value in pairs:
                    offsets.append(offset)
                    key = (partition, offset)
                    previous = read_at.get(key)
                    if previous is not None and previous != value:
                        verdict.add("inconsistent-offsets", {"partition": partition, "offset": offset, "values": [previous, value], "process": event["process"]})
                    read_at[key] = value
                    known = writes.get(key)
                    if known is not None and known[0] != value:
                        verdict.add("inconsistent-offsets", {"partition": partition, "offset": offset, "written": known[0], "read": value, "process": event["process"]})
                    if known is not None and known[1] == "fail" and known[0] == value:
                        verdict.add("aborted-read", {"partition": partition, "offset": offset, "value": value, "reader": event["process"], "writer": known[2]})
                    read_by_value[(_topic(partition), value)].add(key)
                    highest_read[partition] = max(highest_read.get(partition, -1), offset)
                sequences[(event["process"], partition)].append(("poll", offsets))

    visible = set(read_at) | set(committed)
    by_partition: dict[str, list[int]] = defaultdict(list)
    for partition, offset in visible:
        by_partition[partition].append(offset)
    for offsets in by_partition.values():
        offsets.sort()

    def visible_between(partition: str, low: int, high: int) -> list[int]:
        """Visible offsets strictly between low and high."""
        import bisect

        offsets = by_partition.get(partition, [])
        return offsets[bisect.bisect_right(offsets, low) : bisect.bisect_left(offsets, high)]

    for (process, partition), steps in sequences.items():
        last = None
        for step in steps:
            if step[0] == "reset":
                last = None
                continue
            offsets = step[1]
            for a, b in zip(offsets, offsets[1:]):
                if b <= a:
                    verdict.add("int-nonmonotonic-poll", {"process": process, "partition": partition, "offsets": [a, b]})
                elif visible_between(partition, a, b):
                    verdict.add("int-poll-skip", {"process": process, "partition": partition, "from": a, "to": b, "skipped": visible_between(partition, a, b)[:5]})
            if offsets and last is not None:
                if offsets[0] <= last:
                    verdict.add("nonmonotonic-poll", {"process": process, "partition": partition, "previous_last": last, "next_first": offsets[0]})
                elif visible_between(partition, last, offsets[0]):
                    verdict.add("poll-skip", {"process": process, "partition": partition, "from": last, "to": offsets[0], "skipped": visible_between(partition, last, offsets[0])[:5]})
            if offsets:
                last = offsets[-1]

    # Sends per process and partition must get increasing offsets.
    last_sent: dict[tuple[str, str], int] = {}
    for event in history:
        if event["type"] != "ok" or event["op"] not in ("txn", "send"):
            continue
        for partition, value, offset in sends(event):
            if offset is None or offset < 0:
                continue
            key = (event["process"], partition)
            if key in last_sent and offset <= last_sent[key]:
                verdict.add("nonmonotonic-send", {"process": event["process"], "partition": partition, "previous": last_sent[key], "offset": offset, "value": value})
            last_sent[key] = offset

    # Committed writes nobody read.
    has_final_read = any(e["process"].startswith("final-reader") for e in history)
    lost = unseen = 0
    for (partition, offset), value in sorted(committed.items()):
        if (partition, offset) in read_at or (input_topic and _topic(partition) == input_topic):
            continue  # the copy check speaks for the input: it needs its copy in the output, not a read
        if offset < highest_read.get(partition, -1):
            lost += 1
            verdict.add("lost-write", {"partition": partition, "offset": offset, "value": value, "highest_read": highest_read[partition]})
        else:
            unseen += 1
            if has_final_read:
                verdict.add("unseen", {"partition": partition, "offset": offset, "value": value})

    # One value at several offsets of a topic.
    duplicated = 0
    for (topic, value), places in read_by_value.items():
        if unique_values and len(places) > 1 and topic != input_topic:
            duplicated += 1
            verdict.add("duplicate", {"topic": topic, "value": value, "at": sorted(places)[:5]})

    if input_topic and output_topic:
        expected = transform or (lambda value: value)
        inputs = Counter(expected(value) for (partition, _offset), value in committed.items() if _topic(partition) == input_topic)
        copies = Counter()
        for (topic, value), places in read_by_value.items():
            if topic == output_topic:
                copies[value] += len(places)
        for value in inputs:
            if copies[value] == 0:
                verdict.add("copy-missing", {"value": value})
            elif copies[value] > inputs[value]:
                verdict.add("copy-duplicate", {"value": value, "copies": copies[value]})
        for value in copies:
            if value not in inputs:
                verdict.add("copy-unexpected", {"value": value})

    if expected_outputs is not None and output_topic:
        copies = Counter()
        for (topic, value), places in read_by_value.items():
            if topic == output_topic:
                copies[value] += len(places)
        for value, wanted in expected_outputs.items():
            if copies[value] < wanted:
                verdict.add("copy-missing", {"value": value, "expected": wanted, "read": copies[value]})
            elif copies[value] > wanted:
                verdict.add("copy-duplicate", {"value": value, "expected": wanted, "copies": copies[value]})
        for value in copies:
            if value not in expected_outputs:
                verdict.add("copy-unexpected", {"value": value})

    audits = 0
    if bank_total is not None:
        for event in history:
            if event["type"] == "ok" and event["op"] == "balances":
                audits += 1
                total = sum(event["value"]["balances"].values())
                if total != bank_total:
                    verdict.add("bank-total", {"process": event["process"], "time": event["time"], "total": total, "expected": bank_total})

    verdict.counts = {
        "sent": sent, "acknowledged": acknowledged, "committed": len(committed), "aborted": aborted, "unknown": unknown,
        "read": len(read_at), "lost": lost, "duplicated": duplicated, "unseen": unseen,
    }
    if bank_total is not None:
        verdict.counts["audits"] = audits
    return verdict


def check_workload(workload: str, history: list[dict], *, total: int | None = None, transform=None, expected_outputs: Counter | None = None, output_topic: str | None = None) -> Verdict:
    """The checks a chaos workload calls for."""
    if workload in ("streaming", "spark"):
        # Outputs may legitimately repeat a value: the multiset check counts them.
        return check(history, output_topic=output_topic, expected_outputs=expected_outputs, unique_values=False)
    if workload.startswith("copier") or workload == "processor":
        return check(history, input_topic="input", output_topic="output", transform=transform)
    if workload == "bank":
        return check(history, bank_total=total, unique_values=False)
    return check(history)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faults.checker", description="check a history for exactly-once anomalies")
    parser.add_argument("history", help="a history .jsonl file or a folder of them")
    parser.add_argument("--workload", default="producer", help="copier, copier-confluent, producer or bank")
    parser.add_argument("--bank-total", type=int, default=1000)
    parser.add_argument("--json", default=None, help="also write the verdict here")
    args = parser.parse_args(argv)
    history = read_histories(args.history) if os.path.isdir(args.history) else read_history(args.history)
    verdict = check_workload(args.workload, history, total=args.bank_total)
    print(verdict.summary())
    if args.json:
        with open(args.json, "w") as file:
            json.dump(verdict.to_json(), file, indent=2, sort_keys=True)
    return 0 if verdict.valid else 1


if __name__ == "__main__":
    sys.exit(main())
