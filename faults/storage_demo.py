"""``onceflow demo --storage``: the crash safety of one partition log, shown
without a broker.

What it does (each step visible as it runs):

1. A writer process appends batches of payment events to a partition log on
   disk with the default durability (group commit) and prints each offset
   once it is acknowledged (durable).
2. The demo SIGKILLs the writer at random moments, several times; once it
   also tears the log's tail at a random byte, as a power cut mid-write would.
3. After each kill it reopens the log (crash recovery) and checks that every
   acknowledged record is there exactly once, in order, and that nothing
   half-written survived; then a new writer continues where the log ends.
4. It prints a report and exits non-zero if any check failed.

The main demo, ``onceflow demo`` (``faults.demo``), runs the whole
exactly-once pipeline through broker and pipeline kills.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from broker.replay import replay
from faults.disk import cut_zeros_ahead
from protocol.records import encode_batch
from storage.config import LogConfig
from storage.log import PartitionLog

RECORDS_PER_BATCH = 20
DEMO_CONFIG = LogConfig(segment_bytes=256 * 1024, flush_policy="group", flush_interval_ms=5)


def _event(index: int, rng: random.Random) -> tuple[bytes, bytes]:
    account = f"acct-{rng.randrange(50):03d}"
    amount = rng.randrange(1, 10_000)
    value = json.dumps({"seq": index, "account": account, "amount_cents": amount}).encode()
    return account.encode(), value


def writer_main(directory: str, start_seq: int, total: int, seed: int) -> None:
    """The child: append until ``total`` records, printing "ack <first> <last> <first_seq>"."""
    rng = random.Random(seed)
    partition_log = PartitionLog.open(directory, DEMO_CONFIG)

    async def run():
        seq = start_seq
        pending = []
        while seq < total:
            count = min(RECORDS_PER_BATCH, total - seq)
            rows = [(*_event(seq + i, rng), (), int(time.time() * 1000)) for i in range(count)]
            info = partition_log.append(encode_batch(rows))
            pending.append((partition_log.wait_durable(info.last_offset), info, seq))
            seq += count
            # Keep a few appends in flight, like a producer with pipelining.
            while len(pending) > 4 or (pending and pending[0][0].done()):
                waiter, acked, first_seq = pending.pop(0)
                await waiter
                print(f"ack {acked.first_offset} {acked.last_offset} {first_seq}", flush=True)
            await asyncio.sleep(0)
        for waiter, acked, first_seq in pending:
            await waiter
            print(f"ack {acked.first_offset} {acked.last_offset} {first_seq}", flush=True)

    asyncio.run(run())
    partition_log.close()
    print("done", flush=True)


def _read_all(directory: str) -> tuple[list[int], list[str]]:
    partition_log = PartitionLog.open(directory, DEMO_CONFIG)
    report = list(partition_log.recovery_report)
    sequences = [json.loads(record.value)["seq"] for batch in replay(partition_log) for record in batch.records]
    partition_log.close()
    return sequences, report


def _tear_tail(directory: str, rng: random.Random) -> int:
    logs = sorted(name for name in os.listdir(directory) if name.endswith(".log"))
    path = os.path.join(directory, logs[-1])
    size = cut_zeros_ahead(path)  # the torn write lands at the data's end
    if size < 2:
        return 0
    # Append garbage as a torn, half-written batch would leave.
    torn = rng.randrange(1, 200)
    with open(path, "ab") as file:
        file.write(os.urandom(torn))
    return torn


def run_demo(*, records: int = 20_000, seed: int | None = None, keep_data: str | None = None, kills: int = 4) -> int:
    seed = random.randrange(1 << 30) if seed is None else seed
    rng = random.Random(seed)
    directory = keep_data or tempfile.mkdtemp(prefix="onceflow-demo-")
    partition_dir = os.path.join(directory, "payments-0")
    if os.path.exists(partition_dir):
        shutil.rmtree(partition_dir)
    started = time.monotonic()
    print(f"onceflow demo: {records} payment events into a crash-safe log at {partition_dir} (seed {seed})")
    acknowledged_through = 0  # every seq below this was acknowledged
    failures = []
    kills_done = 0
    torn_bytes = 0
    truncations = 0
    round_number = 0
    while True:
        round_number += 1
        command = [sys.executable, "-m", "faults.storage_demo", "--child", partition_dir, str(acknowledged_through), str(records), str(seed + round_number)]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        round_start = acknowledged_through
        kill_at = round_start + rng.randrange(records // (kills * 4) + 1, records // (kills + 1) + 2) if kills_done < kills else None
        finished = False
        for line in process.stdout:
            if line.startswith("ack "):
                _first, _last, first_seq = map(int, line.split()[1:])
                acknowledged_through = max(acknowledged_through, first_seq + _last - _first + 1)
                if kill_at is not None and acknowledged_through >= min(records - 1, kill_at):
                    process.send_signal(signal.SIGKILL)
                    break
            elif line.startswith("done"):
                finished = True
        process.wait()
        if not finished:
            kills_done += 1
            message = f"  round {round_number}: SIGKILLed the writer after {acknowledged_through} acknowledged records"
            if kills_done == 2:
                torn = _tear_tail(partition_dir, rng)
                torn_bytes += torn
                message += f", then tore the log tail ({torn} garbage bytes)"
            print(message, flush=True)
        sequences, report = _read_all(partition_dir)
        truncations += len(report)
        for line in report:
            print(f"    recovery: {line.split(': ', 1)[-1]}", flush=True)
        # Check: everything acknowledged is present exactly once, in order;
        # the log is a gap-free prefix of the event sequence.
        if sequences != list(range(len(sequences))):
            failures.append(f"round {round_number}: the log is not the sequence 0..{len(sequences) - 1} in order")
        if len(sequences) < acknowledged_through:
            failures.append(f"round {round_number}: {acknowledged_through - len(sequences)} acknowledged records lost")
        print(f"    check: {len(sequences)} records on disk, {acknowledged_through} acknowledged, "
              f"{'ok' if not failures else 'FAILED'}", flush=True)
        acknowledged_through = len(sequences)  # the next writer continues from the durable end
        if finished or failures:
            break
    elapsed = time.monotonic() - started
    sequences, _ = _read_all(partition_dir)
    duplicates = len(sequences) - len(set(sequences))
    lost = records - len(set(sequences))
    print()
    print("onceflow demo report")
    print(f"  records written      {records}")
    print(f"  records in the log   {len(sequences)}")
    print(f"  duplicates           {duplicates}")
    print(f"  lost                 {lost}")
    print(f"  writer kills         {kills_done} (SIGKILL)")
    print(f"  torn-tail bytes      {torn_bytes}")
    print(f"  recovery truncations {truncations}")
    print(f"  time                 {elapsed:.1f} s")
    print(f"  data                 {partition_dir}{'' if keep_data else ' (deleted)'}")
    if failures or duplicates or lost:
        for failure in failures:
            print(f"  FAILED: {failure}")
        return 1
    print("  result               every acknowledged record survived every crash, exactly once")
    if not keep_data:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    # Only the writer child starts here; the demo itself is `onceflow demo --storage`.
    if len(sys.argv) != 6 or sys.argv[1] != "--child":
        print("usage: python -m faults.storage_demo --child DIR START_SEQ TOTAL SEED (the demo's writer; the demo is `onceflow demo --storage`)", file=sys.stderr)
        sys.exit(2)
    writer_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
