"""Records/s per core of the record codecs alone: the columnar one against ``protocol/records.py``.

    .venv/bin/python -m benchmarks.bench_codec [--seconds 1] [--rounds 3] [--runner]

Decoding: one partition's fetched section of 1 MiB (batches of 16 KiB or
1 MiB, as producers with those batch sizes write them), CRCs checked once
each, into Arrow columns (``protocol.columnar.decode_fetched``) or into
``Record`` objects (``records.decode_batch`` per batch, as the per-record
consumer does before its own objects). Encoding: the same records, given as
Arrow columns (``protocol.columnar.encode_columns``) or as (key, value,
headers, timestamp) tuples (``records.encode_batch``), into batches of that
size. Inputs are built before the clock starts.

``--runner``: the streaming runner's paths around the codecs instead, for
the first scenario's fetch. Intake: the fetch decoded into columns and the
columns into one ``streaming.task.FetchedRecord`` per record, against
``records.decode_batch`` and a ``ConsumerRecord`` per record (the
per-record consumer the runner read through before). Emits: (topic, key,
value, headers, timestamp) tuples as the processors leave them, gathered
into columns and encoded (``streaming.transaction``'s way, through
``binary_array``/``int64_array`` and ``encode_records``, in runs of 2,000
as the runner sends them), against ``records.encode_batch`` of the same
tuples in 16 KiB batches (the per-record producer's default).

Each figure is records over the CPU time of this process (one thread: one
core), the best of ``--rounds`` rounds, ours and theirs alternating within
each round, so a busy machine slows both alike. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import pyarrow as pa

from protocol import records
from protocol.columnar import HEADERS_TYPE, decode_fetched, encode_columns, encode_records
from protocol.compression import Compression
from protocol.records import decode_batch, encode_batch, iter_batches

FETCH_BYTES = 1 << 20
TIMESTAMP = 1_700_000_000_000


def workload(values: str, headers: bool, seed: int = 7):
    """Records of about 100 B: fixed 100 B values, or 50-150 B ones; 10 B keys."""
    rng = random.Random(seed)

    def record(index: int):
        size = 100 if values == "fixed" else rng.randint(50, 150)
        found = [("trace", b"%016x" % index), ("source", b"bench")] if headers else []
        return (b"key-%06d" % (index % 1_000_000), rng.randbytes(size), found, TIMESTAMP + index // 100)

    return record


def scenario(values: str, headers: bool, batch_bytes: int, compression: Compression):
    """The batches of one fetch (as bytes), and their records as tuples and as columns."""
    make = workload(values, headers)
    batches_tuples, batches_columns, section = [], [], bytearray()
    index = 0
    while len(section) < FETCH_BYTES:
        chunk, size = [], 0
        while size < batch_bytes and len(section) + size < FETCH_BYTES:
            item = make(index)
            chunk.append(item)
            size += len(item[0]) + len(item[1]) + 10 + sum(len(k) + len(v) + 2 for k, v in item[2])
            index += 1
        base = index - len(chunk)
        section += encode_batch(chunk, base_offset=base, compression=compression)
        batches_tuples.append((base, chunk))
        batches_columns.append((base, {
            "key": pa.array([r[0] for r in chunk], pa.binary()),
            "value": pa.array([r[1] for r in chunk], pa.binary()),
            "headers": pa.array([[{"key": k, "value": v} for k, v in r[2]] for r in chunk], HEADERS_TYPE) if headers else None,
            "timestamp": pa.array([r[3] for r in chunk], pa.int64()),
        }))
    return bytes(section), index, batches_tuples, batches_columns, compression


def rate(work, count: int, seconds: float) -> float:
    """Records per CPU second of ``work`` (which handles ``count`` records), repeated for ``seconds``."""
    work()  # warm
    runs = 0
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    while time.perf_counter() - wall_start < seconds or runs == 0:
        work()
        runs += 1
    return runs * count / (time.process_time() - cpu_start)


def measure(section, count, batches_tuples, batches_columns, compression, seconds: float, rounds: int) -> dict:
    def decode_columnar():
        assert decode_fetched(section, [], start_offset=0).columns.num_rows == count

    def decode_records():
        got = 0
        for position, _header in iter_batches(section):
            got += len(decode_batch(section, position, verify_crc=False).records)
        assert got == count

    def encode_columnar():
        for base, columns in batches_columns:
            encode_columns(**columns, base_offset=base, compression=compression)

    def encode_records():
        for base, chunk in batches_tuples:
            encode_batch(chunk, base_offset=base, compression=compression)

    best = {"decode columnar": 0.0, "decode records.py": 0.0, "encode columnar": 0.0, "encode records.py": 0.0}
    for _round in range(rounds):
        best["decode columnar"] = max(best["decode columnar"], rate(decode_columnar, count, seconds))
        best["decode records.py"] = max(best["decode records.py"], rate(decode_records, count, seconds))
        best["encode columnar"] = max(best["encode columnar"], rate(encode_columnar, count, seconds))
        best["encode records.py"] = max(best["encode records.py"], rate(encode_records, count, seconds))
    return best


def runner_paths(seconds: float, rounds: int) -> dict:
    from streaming.task import fetched_records
    from txn.column_batches import binary_array, int64_array
    from txn.types import ConsumerRecord

    section, count, batches_tuples, _columns, _codec = scenario("fixed", False, 16 << 10, Compression.NONE)
    emits = [("out", key, value, (), timestamp, None) for _base, chunk in batches_tuples for key, value, _headers, timestamp in chunk]

    def intake_columnar():
        records_out = fetched_records("in", 0, decode_fetched(section, [], start_offset=0).columns)
        assert len(records_out) == count

    def intake_records():
        got = []
        for position, _header in iter_batches(section):
            got += [ConsumerRecord("in", 0, r.offset, r.timestamp, r.key, r.value, ()) for r in decode_batch(section, position, verify_crc=False).records]
        assert len(got) == count

    def emits_columnar():
        for start in range(0, count, 2000):
            _topics, keys, values, _headers, timestamps, _processors = zip(*emits[start : start + 2000])
            encode_records(key=binary_array(keys), value=binary_array(values), timestamp=int64_array(timestamps))

    def emits_records():
        chunk, size = [], 0
        for _topic, key, value, headers, timestamp, _processor in emits:
            chunk.append((key, value, headers, timestamp))
            size += len(key) + len(value) + 20
            if size >= 16 << 10:
                encode_batch(chunk, base_offset=0)
                chunk, size = [], 0
        if chunk:
            encode_batch(chunk, base_offset=0)

    best = {"intake columnar": 0.0, "intake records.py": 0.0, "emits columnar": 0.0, "emits records.py": 0.0}
    for _round in range(rounds):
        best["intake columnar"] = max(best["intake columnar"], rate(intake_columnar, count, seconds))
        best["intake records.py"] = max(best["intake records.py"], rate(intake_records, count, seconds))
        best["emits columnar"] = max(best["emits columnar"], rate(emits_columnar, count, seconds))
        best["emits records.py"] = max(best["emits records.py"], rate(emits_records, count, seconds))
    return {"records": count, **{key: round(value) for key, value in best.items()}}


SCENARIOS = [
    # (name, values, headers, batch bytes, compression)
    ("100 B values, 16 KiB batches", "fixed", False, 16 << 10, Compression.NONE),
    ("100 B values, 1 MiB batch", "fixed", False, 1 << 20, Compression.NONE),
    ("50-150 B values, 16 KiB batches", "varied", False, 16 << 10, Compression.NONE),
    ("50-150 B values, 1 MiB batch", "varied", False, 1 << 20, Compression.NONE),
    ("50-150 B values, 2 headers, 1 MiB batch", "varied", True, 1 << 20, Compression.NONE),
    ("50-150 B values, lz4, 1 MiB batch", "varied", False, 1 << 20, Compression.LZ4),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=None, help="scenarios whose name contains this")
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--runner", action="store_true", help="the streaming runner's intake and emit paths instead (see above)")
    args = parser.parse_args()
    if args.runner:
        row = runner_paths(args.seconds, args.rounds)
        print(f"records/s per core (CPU time of one thread), {row['records']:,} records of 100 B from one fetch of {FETCH_BYTES >> 20} MiB, best of {args.rounds} rounds")
        print(f"{'path':<10}{'columnar':>12}{'records.py':>12}{'ratio':>7}")
        for path in ("intake", "emits"):
            print(f"{path:<10}{row[path + ' columnar']:>12,}{row[path + ' records.py']:>12,}{row[path + ' columnar'] / row[path + ' records.py']:>7.1f}")
        if args.json:
            with open(args.json, "w") as file:
                json.dump(row, file, indent=1)
        return
    rows = []
    for name, values, headers, batch_bytes, compression in SCENARIOS:
        if args.only and args.only not in name:
            continue
        section, count, batches_tuples, batches_columns, codec = scenario(values, headers, batch_bytes, compression)
        best = measure(section, count, batches_tuples, batches_columns, codec, args.seconds, args.rounds)
        rows.append({"scenario": name, "records": count, **{key: round(value) for key, value in best.items()}})
    crc = "crc32c (hardware)" if records.HARDWARE_CRC else "crcmod (install crc32c for speed)"
    print(f"records/s per core (CPU time of one thread), one fetch of {FETCH_BYTES >> 20} MiB, best of {args.rounds} rounds; CRC-32C via {crc}")
    print(f"{'scenario':<42}{'decode col':>12}{'records.py':>12}{'ratio':>7}{'encode col':>12}{'records.py':>12}{'ratio':>7}")
    for row in rows:
        decode_ratio = row["decode columnar"] / row["decode records.py"]
        encode_ratio = row["encode columnar"] / row["encode records.py"]
        print(f"{row['scenario']:<42}{row['decode columnar']:>12,}{row['decode records.py']:>12,}{decode_ratio:>7.1f}"
              f"{row['encode columnar']:>12,}{row['encode records.py']:>12,}{encode_ratio:>7.1f}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=1)


if __name__ == "__main__":
    main()
