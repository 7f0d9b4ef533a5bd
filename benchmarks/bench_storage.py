"""Storage append throughput against raw sequential writes, per durability setting.

    .venv/bin/python -m benchmarks.bench_storage [--seconds 3]

Appends 16 KiB batches of 1 KiB records to a PartitionLog for a few seconds
under each flush policy and, in the same run, writes the same bytes with
plain sequential ``os.write`` (plus ``fsync`` on the same schedule the policy
uses). Prints MB/s and our/raw ratio; the figures go in the README as ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time

from protocol.records import encode_batch
from storage.config import LogConfig
from storage.log import PartitionLog

RECORD = b"x" * 1024
BATCH = encode_batch([(b"key-%d" % i, RECORD, (), 1_700_000_000_000) for i in range(16)])


def raw_rate(directory: str, seconds: float, fsync_every_s: float | None, fsync_each: bool) -> float:
    path = os.path.join(directory, "raw.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
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
    """Append continuously (as a busy broker does), letting the group committer
    run between appends; the clock stops when the last append is durable."""
    path = os.path.join(directory, f"log-{policy}")
    partition_log = PartitionLog.open(path, LogConfig(flush_policy=policy, segment_bytes=256 * 1024 * 1024))

    async def run() -> float:
        written = 0
        start = time.perf_counter()
        deadline = start + seconds
        last = None
        while time.perf_counter() < deadline:
            info = partition_log.append(BATCH)
            last = partition_log.wait_durable(info.last_offset)
            written += len(BATCH)
            await asyncio.sleep(0)  # the fsync completions run here
        await last
        return written / (time.perf_counter() - start) / 1e6

    try:
        return asyncio.run(run())
    finally:
        partition_log.close()
        shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="onceflow-bench-", dir=os.environ.get("BENCH_DIR"))
    rows = []
    try:
        for policy, raw_args in [("os", (None, False)), ("group", (0.005, False)), ("always", (None, True))]:
            ours = log_rate(directory, args.seconds, policy)
            raw = raw_rate(directory, args.seconds, *raw_args)
            rows.append({"policy": policy, "onceflow_MBps": round(ours, 1), "raw_MBps": round(raw, 1), "ratio": round(ours / raw, 2)})
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"{'flush.policy':<14}{'onceflow MB/s':>15}{'raw MB/s':>12}{'ratio':>8}")
    for row in rows:
        print(f"{row['policy']:<14}{row['onceflow_MBps']:>15}{row['raw_MBps']:>12}{row['ratio']:>8}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=1)


if __name__ == "__main__":
    main()
