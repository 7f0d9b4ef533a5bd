"""Storage append throughput against raw sequential writes, per durability setting.

    .venv/bin/python -m benchmarks.bench_storage [--seconds 3] [--rounds 2]

Appends ~16 KiB batches of 1 KiB records to a PartitionLog for a few seconds
under each flush policy and, in the same run, writes the same bytes with
plain sequential ``os.write`` plus ``fsync`` on the schedule the policy uses
("always": after every write; "group": every ``flush.interval.ms``; "os":
never). Prints MB/s and the our/raw ratio (not a test: nothing is asserted).

The log is driven the way a busy broker drives it: appends on one event loop,
each acknowledged only when ``wait_durable`` completes (acks=all), with many
of them in flight so that group commit shares fsyncs between them. Every
append verifies the batch CRC and patches offsets in place, as in the broker.
Each measurement starts after ``os.sync()`` so that write-back of the
previous one does not slow it; ours and raw alternate for ``--rounds``
rounds and the best of each is kept.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import tempfile
import time

from protocol import records
from protocol.records import encode_batch
from storage.config import LogConfig
from storage.log import PartitionLog

RECORD = b"x" * 1024
BATCH = encode_batch([(b"key-%d" % i, RECORD, (), 1_700_000_000_000) for i in range(16)])
WINDOW = 512  # appends awaiting durability at once (8 MiB)
GROUP_INTERVAL_MS = 5


def raw_rate(directory: str, seconds: float, fsync_every_s: float | None, fsync_each: bool) -> float:
    path = os.path.join(directory, "raw.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    written = 0
    start = time.perf_counter()
    last_sync = start
    try:
        while True:
            now = time.perf_counter()
            if now - start >= seconds:
                break
            os.write(fd, BATCH)
            written += len(BATCH)
            if fsync_each:
                os.fsync(fd)
            elif fsync_every_s is not None and now - last_sync >= fsync_every_s:
                os.fsync(fd)
                last_sync = now
        if fsync_every_s is not None or fsync_each:
            os.fsync(fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        os.remove(path)
    return written / elapsed / 1e6


def log_rate(directory: str, seconds: float, policy: str) -> float:
    """A pipelined producer: appends back to back, yielding to the event loop
    after each one, with up to ``WINDOW`` appends awaiting their fsync (as a
    broker sees many partitions' requests in flight); the clock stops when
    the last append is durable."""
    path = os.path.join(directory, f"log-{policy}")
    config = LogConfig(flush_policy=policy, flush_interval_ms=GROUP_INTERVAL_MS, segment_bytes=256 * 1024 * 1024)
    partition_log = PartitionLog.open(path, config)

    async def run() -> float:
        written = 0
        in_flight: collections.deque = collections.deque()
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            info = partition_log.append(BATCH)
            written += len(BATCH)
            in_flight.append(partition_log.wait_durable(info.last_offset))
            while in_flight and in_flight[0].done():
                in_flight.popleft().result()
            if len(in_flight) >= WINDOW:
                await in_flight.popleft()
            await asyncio.sleep(0)  # what serving the next request costs at least
        for waiter in in_flight:
            await waiter
        return written / (time.perf_counter() - start) / 1e6

    try:
        return asyncio.run(run())
    finally:
        partition_log.close()
        shutil.rmtree(path, ignore_errors=True)


RAW_SCHEDULE = {"os": (None, False), "group": (GROUP_INTERVAL_MS / 1000, False), "always": (None, True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--crcmod", action="store_true", help="verify CRCs with crcmod even if crc32c is installed")
    args = parser.parse_args()
    if args.crcmod:
        import crcmod.predefined

        records.crc32c = crcmod.predefined.mkCrcFun("crc-32c")
        records.HARDWARE_CRC = False
    directory = tempfile.mkdtemp(prefix="onceflow-bench-", dir=os.environ.get("BENCH_DIR"))
    rows = []
    try:
        for policy, raw_args in RAW_SCHEDULE.items():
            ours = raw = 0.0
            for _round in range(args.rounds):
                os.sync()
                ours = max(ours, log_rate(directory, args.seconds, policy))
                os.sync()
                raw = max(raw, raw_rate(directory, args.seconds, *raw_args))
            rows.append({"policy": policy, "onceflow_MBps": round(ours, 1), "raw_MBps": round(raw, 1), "ratio": round(ours / raw, 2)})
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    crc = "crc32c (hardware)" if records.HARDWARE_CRC else "crcmod (install crc32c for speed)"
    print(f"batch {len(BATCH)} bytes, up to {WINDOW} appends in flight, CRC-32C via {crc}")
    print(f"{'flush.policy':<14}{'onceflow MB/s':>15}{'raw MB/s':>12}{'ratio':>8}")
    for row in rows:
        print(f"{row['policy']:<14}{row['onceflow_MBps']:>15}{row['raw_MBps']:>12}{row['ratio']:>8}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=1)


if __name__ == "__main__":
    main()
