"""`onceflow bench --recovery`: how long each fault stops an exactly-once
pipeline, beside the targets (the README's "Availability under faults").

    onceflow bench --recovery [--recovery-rounds 3] [--recovery-seconds 24] [--recovery-workload copier|copier-confluent|copier-librdkafka|streaming] [--json FILE]
    onceflow bench --recovery --recovery-workload streaming --recovery-faults kill-client,lose-disk [--recovery-identity given|state-dir]

For each fault kind with a target, a chaos run (``faults.chaos``) of the
transactional copier (two processes, static members of one group, our
client's defaults) with only that fault, a few times a run, on input
arriving at a steady rate; ``faults.availability`` measures each fault's
recovery from the run's history. ``--recovery-workload copier-librdkafka``
runs the copier on confluent-kafka as a new user writes it (librdkafka's
defaults: after a broker restart it needs the broker's offset-commit watch,
issue 28), ``copier-confluent`` with librdkafka's re-bootstrap off. With ``--recovery-workload streaming``
the pipeline is ``examples/enrichment.py`` on the streaming runner (two
instances), whose commits are seen as its group's committed offsets moving
(sampled every 0.25 s, and not by instance: "after cleared" is then anyone's
first commit). For the streaming workload's client faults (``kill-client``:
state kept; ``lose-disk``: the instance's state directory deleted before its
restart) a second table measures per instance, from the group's committed
offsets per partition (``faults.availability``'s "per instance"): the
survivors' longest stall (aim 2 s) and the victim's time back, beside its
restore time as its log says (aim: restore + 2 s). ``--recovery-identity``
says where each instance's identity comes from: ``given``
(``ONCEFLOW_INSTANCE_ID``, as an orchestrator names its replicas; the
default) or ``state-dir`` (kept in the state directory, so lost with it: the
design before issue 31). Figures are medians and worsts over every
fault of the kind in every round; the machine is shared, so read them as
what this machine did in this run, not as constants.

| fault | measured | target |
| --- | --- | --- |
| kill-client | SIGKILL + restart of a copier -> first commit of the restarted instance | 2 s |
| kill-broker | broker ready again after SIGKILL + restart -> first commit | 2 s |
| pause-broker | broker continued (SIGCONT after 2 s) -> first commit | 1 s |
| (any) | longest stretch with no commit while no fault was in progress | 2 s |
"""

from __future__ import annotations

import io
import json
import os
import shutil
import statistics
import tempfile

TARGETS = {"kill-client": 2.0, "kill-broker": 2.0, "pause-broker": 1.0, "lose-disk": 2.0}
STALL_TARGET = max(TARGETS.values())
SURVIVOR_STALL_AIM = 2.0  # a client fault's cost to the other instances (streaming)
VICTIM_BACK_AIM = 2.0  # beyond the victim's own restore (streaming)


STREAMING_APP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "enrichment.py")


def measure_kind(kind: str, *, rounds: int, seconds: float, records_per_second: int, say, workload: str = "copier", instance_ids: str = "given") -> dict:
    from faults.chaos import ChaosRun, ChaosSettings

    after_clear, first_output, stalls, valid = [], [], [], True
    per_instance = []
    for round_number in range(rounds):
        report = tempfile.mkdtemp(prefix=f"onceflow-recovery-{kind}-")
        try:
            settings = ChaosSettings(workload=workload, faults=(kind,), duration=seconds, seed=round_number + 1, records=int(records_per_second * seconds),
                                     mean_fault_interval=seconds / 4, abort_ratio=0.0, app=STREAMING_APP if workload == "streaming" else "", instance_ids=instance_ids)
            run = ChaosRun(settings, report, out=io.StringIO())
            verdict = run.run()
            valid = valid and verdict.valid
            availability = run.availability
            per_instance += run.instance_recoveries
        finally:
            shutil.rmtree(report, ignore_errors=True)
        for recovery in availability.recoveries:
            after_clear.append(recovery.first_after_clear_s)
            first_output.append(recovery.first_output_s)
        if availability.longest_stall_outside_faults:
            stalls.append(availability.longest_stall_outside_faults.seconds)
        say(f"  {kind} round {round_number + 1}: {len(availability.recoveries)} faults, after cleared "
            + ", ".join("never" if r.first_after_clear_s is None else f"{r.first_after_clear_s:.2f} s" for r in availability.recoveries)
            + (f"; longest stall outside faults {stalls[-1]:.2f} s" if stalls else "") + ("" if verdict.valid else "; INVALID"))
    known = [value for value in after_clear if value is not None]
    return {
        "fault": kind, "faults": len(after_clear), "never": len(after_clear) - len(known), "target_s": TARGETS[kind],
        "median_after_clear_s": statistics.median(known) if known else None,
        "worst_after_clear_s": max(known) if known and len(known) == len(after_clear) else None,
        "median_first_output_s": statistics.median([v for v in first_output if v is not None]) if any(v is not None for v in first_output) else None,
        "worst_stall_outside_faults_s": max(stalls) if stalls else None,
        "valid": valid,
        "per_instance": [recovery.to_json() for recovery in per_instance],
    }


def instance_table(rows: list[dict]) -> list[str]:
    """The streaming workload's client faults per instance: the survivors'
    longest stall and the victim's time back beside its restore."""
    def seconds(value):
        return "never" if value is None else f"{value:.2f} s"

    lines = [f"{'fault':<14}{'n':>4}  {'survivors stall: median':>24}  {'worst':>8}  {'victim back: median':>20}  {'worst':>8}  {'restore: median':>16}  {'back - restore: worst':>22}"]
    for row in rows:
        faults = [f for f in row["per_instance"] if f["kind"] == row["fault"]]
        if not faults:
            continue
        stalls = [f["survivors_stall_s"] for f in faults if f["survivors_stall_s"] is not None]
        backs = [f["victim_back_s"] for f in faults]
        known = [b for b in backs if b is not None]
        restores = [f["restore_s"] for f in faults if f["restore_s"] is not None]
        beyond = [f["victim_back_s"] - (f["restore_s"] or 0.0) for f in faults if f["victim_back_s"] is not None]
        lines.append(f"{row['fault']:<14}{len(faults):>4}  {seconds(statistics.median(stalls) if stalls else None):>24}  {seconds(max(stalls) if stalls else None):>8}"
                     f"  {seconds(statistics.median(known) if known else None):>20}  {seconds(max(known) if known and len(known) == len(backs) else None):>8}"
                     f"  {seconds(statistics.median(restores) if restores else None):>16}  {seconds(max(beyond) if beyond and len(known) == len(backs) else None):>22}")
    lines.append(f"aims: survivors' longest stall {SURVIVOR_STALL_AIM:.0f} s; victim back within its restore + {VICTIM_BACK_AIM:.0f} s")
    return lines


def table(rows: list[dict]) -> list[str]:
    def seconds(value):
        return "never" if value is None else f"{value:.2f} s"

    lines = [f"{'fault':<14}{'n':>4}  {'after cleared: median':>22}  {'worst':>8}  {'target':>7}  {'met':>4}  {'first output: median':>21}  {'stall w/o fault':>15}"]
    for row in rows:
        met = row["worst_after_clear_s"] is not None and row["worst_after_clear_s"] <= row["target_s"]
        lines.append(f"{row['fault']:<14}{row['faults']:>4}  {seconds(row['median_after_clear_s']):>22}  {seconds(row['worst_after_clear_s']):>8}  {row['target_s']:>5.1f} s  {'yes' if met else 'NO':>4}"
                     f"  {seconds(row['median_first_output_s']):>21}  {seconds(row['worst_stall_outside_faults_s']):>15}")
    worst_stall = max((row["worst_stall_outside_faults_s"] or 0.0 for row in rows), default=0.0)
    lines.append(f"longest stall with no fault in progress: {worst_stall:.2f} s (target {STALL_TARGET:.1f} s: {'met' if worst_stall <= STALL_TARGET else 'NOT met'})")
    return lines


def run_from_args(args) -> int:
    def say(line: str) -> None:
        print(line, flush=True)

    kinds = [kind.strip() for kind in (args.recovery_faults or ",".join(TARGETS)).split(",") if kind.strip()]
    unknown = [kind for kind in kinds if kind not in TARGETS]
    if unknown:
        say(f"onceflow bench --recovery: no target for {', '.join(unknown)}; known: {', '.join(TARGETS)}")
        return 2
    workload = getattr(args, "recovery_workload", "copier")
    instance_ids = getattr(args, "recovery_identity", "given")
    if "lose-disk" in kinds and workload != "streaming":
        say("onceflow bench --recovery: lose-disk needs --recovery-workload streaming (app instances with state directories)")
        return 2
    pipeline = {"copier": "copier", "copier-confluent": "copier on confluent-kafka (re-bootstrap off)", "copier-librdkafka": "copier on confluent-kafka (librdkafka's defaults)"}
    streaming = f"streaming runner (examples/enrichment.py, two instances, identity {'ONCEFLOW_INSTANCE_ID' if instance_ids == 'given' else 'in the state directory'})"
    say(f"recovery after faults: the {pipeline.get(workload, streaming)}, {args.recovery_rounds} rounds of {args.recovery_seconds:.0f} s per fault kind, input at {args.recovery_rate}/s")
    rows = [measure_kind(kind, rounds=args.recovery_rounds, seconds=args.recovery_seconds, records_per_second=args.recovery_rate, say=say, workload=workload, instance_ids=instance_ids)
            for kind in kinds]
    for line in table(rows):
        say(line)
    if any(row["per_instance"] for row in rows):
        for line in instance_table(rows):
            say(line)
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"settings": {"workload": workload, "instance_ids": instance_ids, "rounds": args.recovery_rounds, "seconds": args.recovery_seconds, "rate": args.recovery_rate, "cpus": os.cpu_count()}, "rows": rows}, file, indent=2)
    return 0 if all(row["valid"] for row in rows) else 1
