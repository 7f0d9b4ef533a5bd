"""The history a workload records: what each process asked for and what it
got, one JSON object per line (JSONL), flushed as written, so a process
killed with SIGKILL leaves a readable file (a torn last line is skipped).

An event::

    {"time": 1700000000.123, "process": "copier-0/4242", "type": "ok",
     "op": "txn", "value": [["poll", {"input-0": [[5, "17"]]}],
                            ["send", "output-2", "17", 1234]]}

- ``time``: wall-clock seconds (processes on one machine merge by it).
- ``process``: who; a restarted process gets a new name (name/pid), so its
  polls start a fresh sequence, as Jepsen gives a crashed process a new id.
- ``type``: ``invoke`` (about to do it), ``ok`` (done: a transaction
  committed, a send acknowledged, a poll returned), ``fail`` (did not
  happen: a transaction aborted), ``info`` (may or may not have happened: a
  commit whose answer was lost, a send whose process died).
- ``op``: ``txn`` (micro-ops, committed together), ``send`` (one
  non-transactional send), ``poll`` (a read), ``assign``/``seek`` (the
  consumer's positions moved on purpose: a rebalance, a rewind after an
  abort), ``balances`` (the bank's audit: {"balances": {...}, "total": n}).
- micro-ops: ``["send", "topic-partition", value, offset or null]`` and
  ``["poll", {"topic-partition": [[offset, value], ...]}]``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator


class HistoryWriter:
    """Appends events to a history file, one flushed line each."""

    def __init__(self, path: str, process: str):
        self.file = open(path, "a", buffering=1)
        self.process = process

    def event(self, type_: str, op: str, value) -> None:
        line = json.dumps({"time": time.time(), "process": self.process, "type": type_, "op": op, "value": value}, separators=(",", ":"))
        self.file.write(line + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def iter_history(path: str) -> Iterator[dict]:
    """Events of one history file; a torn (unparseable, last) line is skipped."""
    with open(path, encoding="utf-8", errors="replace") as file:
        for line in file:
            line = line.strip()
            if not line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut by a SIGKILL mid-write
            if isinstance(event, dict) and {"time", "process", "type", "op"} <= event.keys():
                yield event


def read_history(path: str) -> list[dict]:
    return list(iter_history(path))


def read_histories(folder: str) -> list[dict]:
    """Every ``*.jsonl`` in ``folder``, merged in time order."""
    events: list[dict] = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".jsonl"):
            events.extend(iter_history(os.path.join(folder, name)))
    events.sort(key=lambda e: e["time"])
    return events


def sends(event: dict) -> list[tuple[str, str, int | None]]:
    """(partition, value, offset) of every send micro-op of an event."""
    value = event.get("value")
    if not isinstance(value, list):
        return []
    return [(m[1], m[2], m[3]) for m in value if isinstance(m, list) and len(m) >= 4 and m[0] == "send"]


def polls(event: dict) -> list[dict[str, list]]:
    """The {partition: [[offset, value], ...]} of every poll micro-op of an event."""
    value = event.get("value")
    if not isinstance(value, list):
        return []
    return [m[1] for m in value if isinstance(m, list) and len(m) >= 2 and m[0] == "poll" and isinstance(m[1], dict)]
