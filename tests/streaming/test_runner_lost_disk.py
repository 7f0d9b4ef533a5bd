"""An instance that comes back without its disk (issue 31): SIGKILLed, its
state directory deleted, started again, as a container rescheduled onto a
fresh disk is. Real processes (``onceflow run`` of the payments example),
the input arriving at a steady rate, the group's committed offsets sampled
per partition to see who stalled and for how long.

With its identity given from outside the state directory
(``ONCEFLOW_INSTANCE_ID``, as an orchestrator hands each replica its name),
the instance takes its old place in the group at once (KIP-345's static
member replacement) and only its own partitions wait, for the restart and
the restore of their stores from the changelog. With its identity kept in
the lost directory it comes back as a new member, and the group's round
waits for the dead one's session (30 s here) to end: its partitions wait
that long, but the other instance, a cooperative member (KIP-429), goes on
processing its own through the round. Before, both cases stopped every
partition for the session (the round was eager, and the identity always
lived in the state directory). Exactly once all along (checker, changelog,
SQLite files).
"""

from __future__ import annotations

import re
import shutil
import threading
import time

import pytest

from tests.helpers import read_all
from tests.streaming.runner_support import (
    APP_ID, BROKER_CONFIG, app_process, check_state, create_topics, expected, log_text, payments, read_into_history, send_payments, verdict_of,
)
from txn import Admin

pytestmark = pytest.mark.slow

PARTITIONS = 4
SESSION_MS = 30_000  # what a dead member's place is held for: the stall this test tells apart
RECORDS, RATE = 5000, 200.0


class OffsetSampler(threading.Thread):
    """The group's committed input offset per partition, every 0.2 s:
    (when it was asked for, {partition: offset})."""

    def __init__(self, bootstrap: str):
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.samples: list[tuple[float, dict[int, int]]] = []
        self.done = threading.Event()

    def run(self) -> None:
        with Admin(bootstrap_servers=self.bootstrap, request_timeout_ms=2000) as admin:
            while not self.done.is_set():
                asked = time.monotonic()
                try:
                    committed = admin.list_group_offsets(APP_ID)
                except Exception:  # noqa: BLE001 - the broker is busy: the next sample
                    committed = None
                if committed is not None:
                    self.samples.append((asked, {tp.partition: o.offset for tp, o in committed.items() if o is not None and tp.topic == "payments"}))
                self.done.wait(0.2)

    def first_beyond(self, partition: int, since: float) -> tuple[float, int]:
        """The first sample asked for after ``since`` holding an offset for the partition: (when, offset)."""
        return next((at, offsets[partition]) for at, offsets in self.samples if at > since and partition in offsets)

    def advances(self, partition: int) -> list[float]:
        """When the partition's committed offset was seen to move."""
        times, last = [], None
        for at, offsets in self.samples:
            offset = offsets.get(partition)
            if offset is not None and last is not None and offset > last:
                times.append(at)
            if offset is not None:
                last = offset
        return times


def owned_by(bootstrap: str, instance: str) -> set[int] | None:
    """The payments partitions the group's member ``instance`` holds, once the group is stable with every partition given out."""
    with Admin(bootstrap_servers=bootstrap) as admin:
        (group,) = admin.describe_groups([APP_ID])
    given = [tp.partition for member in group.members for tp in member.assignment if tp.topic == "payments"]
    if group.state != "Stable" or sorted(given) != list(range(PARTITIONS)):
        return None
    return {tp.partition for member in group.members if member.group_instance_id == instance for tp in member.assignment if tp.topic == "payments"}


@pytest.mark.parametrize("identity", ["given", "state-dir"])
def test_an_instance_back_on_an_empty_disk_stops_nobody_else(broker_process, tmp_path, identity):
    broker = broker_process(*BROKER_CONFIG)
    create_topics(broker.bootstrap, PARTITIONS)
    history_dir = str(tmp_path / "history")
    state_dirs = [str(tmp_path / f"state-{i}") for i in range(2)]
    options = {"session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": 500}
    env = [{"ONCEFLOW_INSTANCE_ID": f"replica-{i}" if identity == "given" else ""} for i in range(2)]
    apps = [app_process(f"app-{i}", broker.bootstrap, state_dirs[i], str(tmp_path), env=env[i], extra=options).start() for i in range(2)]
    events = payments(RECORDS, seed=31)
    outputs, balances = expected(events)
    sender = threading.Thread(target=send_payments, args=(broker.bootstrap, events, history_dir), kwargs={"rate": RATE}, daemon=True)
    sampler = OffsetSampler(broker.bootstrap)
    try:
        sender.start()
        sampler.start()
        deadline = time.monotonic() + 60
        victim_partitions = None
        # Until both instances hold partitions (on a loaded machine the second
        # may join after the first has run alone, Stable with all four, for a while).
        while not (victim_partitions and len(victim_partitions) < PARTITIONS) or not all(sampler.advances(p) for p in range(PARTITIONS)):
            assert time.monotonic() < deadline, "the two instances never shared the partitions: " + " | ".join(log_text(a)[-1500:] for a in apps)
            time.sleep(0.3)
            started_as = re.search(r"starting \(transactional id (\S+)\)", log_text(apps[0]))
            victim_partitions = owned_by(broker.bootstrap, started_as.group(1)) if started_as else None
        assert victim_partitions and len(victim_partitions) < PARTITIONS, victim_partitions
        survivors = sorted(set(range(PARTITIONS)) - victim_partitions)

        killed = time.monotonic()
        apps[0].kill()
        shutil.rmtree(state_dirs[0])  # the lost disk: SQLite files, instance-id file, everything
        apps[0].start()
        restarted = time.monotonic()
        sender.join(120)
        read_all(broker.bootstrap, "balances", PARTITIONS, expect=RECORDS, idle=0.5, timeout=180)
        sampler.done.set()
        sampler.join(10)
        codes = [app.terminate(60) for app in apps]
        read_into_history(broker.bootstrap, "balances", PARTITIONS, history_dir, idle=1.5)
        verdict = verdict_of(history_dir, outputs)
        assert verdict.valid, verdict.summary()
        assert codes == [0, 0], (codes, [log_text(a)[-2000:] for a in apps])
        check_state(broker.bootstrap, PARTITIONS, balances, state_dirs)

        # The survivor's partitions: the longest gap between two advances from just before the kill on.
        stalls = {}
        for partition in survivors:
            moves = [killed - 0.5] + [at for at in sampler.advances(partition) if at > killed - 0.5]
            stalls[partition] = max(later - earlier for earlier, later in zip(moves, moves[1:]))
        # The victim's: from its restart to the first sample beyond where its
        # partitions stood once it was dead (asked for 0.3 s after the kill:
        # whatever its last commit was, it is in by then, and a new process
        # has not committed yet).
        victim_back = 0.0
        for partition in victim_partitions:
            _at, dead_at = sampler.first_beyond(partition, killed + 0.3)
            back = next(at for at, offsets in sampler.samples if at > killed + 0.3 and offsets.get(partition, -1) > dead_at)
            victim_back = max(victim_back, back - restarted)
        report = f"survivor partitions {survivors}: longest stall {stalls}; victim's {sorted(victim_partitions)} back {victim_back:.1f} s after its restart"
        print(report)
        assert max(stalls.values()) < SESSION_MS / 1000 / 3, report
        if identity == "given":
            assert victim_back < SESSION_MS / 1000 / 2, report
        else:  # a new member: the dead one's place is its until its session ends
            assert victim_back > SESSION_MS / 1000 / 2, report
        assert "restored" in log_text(apps[0]), "the wiped instance restored its stores from the changelog"
    finally:
        sampler.done.set()
        for app in apps:
            if app.alive:
                app.kill()
