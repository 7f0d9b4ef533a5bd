"""The machine's own limits, measured in-process: the ceilings any broker on
this machine works under, for putting beside the broker's figures.

    .venv/bin/python -m benchmarks.limits [--seconds 1.25] [--dir DIR] [--json FILE]

Eight measurements, each given ``--seconds`` (default 1.25, about 10 s in all):

- sequential write of 16 KiB and of 1 MiB chunks (``os.write``, no fsync
  until one at the end, which is inside the timing): MB/s;
- fsync rate: a 1 KiB append then ``os.fsync``, again and again: fsyncs/s and
  the latency (mean, p99);
- group commit: 16 KiB writes with an fsync whenever 5 ms have passed since
  the last one began (the broker's default durability): MB/s;
- loopback TCP: one connection, a reader thread draining it: MB/s; and small
  (100-byte) request/response ping-pong: round trips/s;
- CRC-32C over 1 MiB buffers with crcmod (protocol's fallback) and with the
  ``crc32c`` package (hardware CRC) when it is installed: MB/s.

``measure_limits(directory, seconds_each)`` returns a frozen
``MachineLimits``; ``as_dict()`` gives its figures for a table or JSON. Each
measurement is also a function of its own with a ``seconds`` budget. A
measurement can overrun its budget by the time of its last operation (the
final fsync of a disk write can take seconds when the page cache holds a lot).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import socket
import tempfile
import threading
import time
from typing import Callable, Iterator

import attrs

KIB = 1024
MIB = 1024 * 1024
GROUP_COMMIT_INTERVAL_S = 0.005
DEFAULT_SECONDS_EACH = 1.25


@attrs.frozen
class DiskWrite:
    """Sequential writes of ``chunk_bytes`` chunks, one fsync at the end (timed)."""

    chunk_bytes: int
    bytes_written: int
    mb_per_s: float
    final_fsync_ms: float


@attrs.frozen
class FsyncRate:
    """A small append then an fsync, repeated: how many per second and how long each took."""

    append_bytes: int
    fsyncs: int
    fsyncs_per_s: float
    mean_latency_ms: float
    p99_latency_ms: float


@attrs.frozen
class GroupCommitRate:
    """Writes with an fsync at most every ``interval_ms``: the group-commit ceiling."""

    chunk_bytes: int
    interval_ms: float
    mb_per_s: float
    fsyncs_per_s: float


@attrs.frozen
class RoundTripRate:
    message_bytes: int
    round_trips_per_s: float
    mean_latency_us: float


@attrs.frozen
class MachineLimits:
    """Every figure of one run, flat enough for a table."""

    directory: str
    cpus: int
    python: str
    seconds_each: float
    disk_write_16k_mb_per_s: float
    disk_write_1m_mb_per_s: float
    disk_write_16k_final_fsync_ms: float
    disk_write_1m_final_fsync_ms: float
    fsyncs_per_s: float
    fsync_mean_ms: float
    fsync_p99_ms: float
    group_commit_16k_mb_per_s: float
    group_commit_fsyncs_per_s: float
    loopback_mb_per_s: float
    loopback_round_trips_per_s: float
    loopback_round_trip_mean_us: float
    crc32c_crcmod_mb_per_s: float
    crcmod_uses_c_extension: bool
    # None when the crc32c package is not installed.
    crc32c_package_mb_per_s: float | None
    crc32c_package_hardware: bool | None

    def as_dict(self) -> dict:
        return attrs.asdict(self)


# ---------------------------------------------------------------------- disk


@contextlib.contextmanager
def _scratch_file(directory: str, name: str) -> Iterator[int]:
    """A new file in ``directory``, open for appending; removed afterwards."""
    path = os.path.join(directory, f".onceflow-limits-{os.getpid()}-{name}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        yield fd
    finally:
        os.close(fd)
        os.remove(path)


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view):]


def disk_write_rate(directory: str, chunk_bytes: int, seconds: float) -> DiskWrite:
    """Write ``chunk_bytes`` chunks for ``seconds``, then fsync once; both timed."""
    chunk = memoryview(os.urandom(chunk_bytes))
    written = 0
    with _scratch_file(directory, f"write-{chunk_bytes}") as fd:
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            # Several chunks between clock reads: a 16 KiB write takes only microseconds.
            for _ in range(max(1, MIB // chunk_bytes)):
                _write_all(fd, chunk)
            written += max(1, MIB // chunk_bytes) * chunk_bytes
        fsync_began = time.perf_counter()
        os.fsync(fd)
        end = time.perf_counter()
    return DiskWrite(chunk_bytes, written, written / (end - start) / 1e6, (end - fsync_began) * 1000)


def fsync_rate(directory: str, seconds: float, append_bytes: int = KIB) -> FsyncRate:
    """Append ``append_bytes`` and fsync, repeatedly, for ``seconds``."""
    record = memoryview(os.urandom(append_bytes))
    latencies: list[float] = []
    with _scratch_file(directory, "fsync") as fd:
        start = time.perf_counter()
        deadline = start + seconds
        now = start
        while now < deadline:
            _write_all(fd, record)
            os.fsync(fd)
            finished = time.perf_counter()
            latencies.append(finished - now)
            now = finished
        elapsed = now - start
    latencies.sort()
    return FsyncRate(
        append_bytes,
        len(latencies),
        len(latencies) / elapsed,
        sum(latencies) / len(latencies) * 1000,
        latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
    )


def group_commit_rate(directory: str, seconds: float, chunk_bytes: int = 16 * KIB, interval_s: float = GROUP_COMMIT_INTERVAL_S) -> GroupCommitRate:
    """Write ``chunk_bytes`` chunks as fast as one thread can, fsyncing whenever
    ``interval_s`` has passed since the previous fsync began; a final fsync
    makes everything durable and is timed."""
    chunk = memoryview(os.urandom(chunk_bytes))
    written = 0
    fsyncs = 0
    with _scratch_file(directory, "group-commit") as fd:
        start = time.perf_counter()
        deadline = start + seconds
        last_fsync = start
        now = start
        while now < deadline:
            _write_all(fd, chunk)
            written += chunk_bytes
            now = time.perf_counter()
            if now - last_fsync >= interval_s:
                last_fsync = now
                os.fsync(fd)
                fsyncs += 1
        os.fsync(fd)
        fsyncs += 1
        elapsed = time.perf_counter() - start
    return GroupCommitRate(chunk_bytes, interval_s * 1000, written / elapsed / 1e6, fsyncs / elapsed)


# ---------------------------------------------------------------------- network


@contextlib.contextmanager
def _loopback_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected (client, server) TCP pair on 127.0.0.1."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _address = listener.accept()
    try:
        yield client, server
    finally:
        client.close()
        server.close()


def loopback_throughput(seconds: float, write_bytes: int = 256 * KIB) -> float:
    """MB/s through one loopback TCP connection: this thread sends
    ``write_bytes`` writes for ``seconds``, a reader thread drains them; the
    clock stops when the reader has everything."""
    with _loopback_pair() as (sender, receiver):
        received = [0]

        def drain() -> None:
            buffer = memoryview(bytearray(MIB))
            while True:
                count = receiver.recv_into(buffer)
                if not count:
                    return
                received[0] += count

        reader = threading.Thread(target=drain, name="loopback-reader")
        chunk = memoryview(os.urandom(write_bytes))
        start = time.perf_counter()
        reader.start()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            sender.sendall(chunk)
        sender.shutdown(socket.SHUT_WR)
        reader.join()
        elapsed = time.perf_counter() - start
    return received[0] / elapsed / 1e6


def _receive_exactly(connection: socket.socket, buffer: memoryview) -> bool:
    """Fill ``buffer``; False when the peer closed first."""
    filled = 0
    while filled < len(buffer):
        count = connection.recv_into(buffer[filled:])
        if not count:
            return False
        filled += count
    return True


def loopback_round_trips(seconds: float, message_bytes: int = 100) -> RoundTripRate:
    """Request/response ping-pong of ``message_bytes`` each way over one
    loopback connection (TCP_NODELAY on both ends), an echo thread answering."""
    with _loopback_pair() as (client, server):
        for end in (client, server):
            end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def echo() -> None:
            buffer = memoryview(bytearray(message_bytes))
            while _receive_exactly(server, buffer):
                server.sendall(buffer)

        responder = threading.Thread(target=echo, name="loopback-echo")
        responder.start()
        request = os.urandom(message_bytes)
        response = memoryview(bytearray(message_bytes))
        round_trips = 0
        start = time.perf_counter()
        deadline = start + seconds
        now = start
        while now < deadline:
            client.sendall(request)
            if not _receive_exactly(client, response):
                raise ConnectionError("the echo thread closed the connection")
            round_trips += 1
            now = time.perf_counter()
        elapsed = now - start
        client.shutdown(socket.SHUT_WR)
        responder.join()
    return RoundTripRate(message_bytes, round_trips / elapsed, elapsed / round_trips * 1e6)


# ---------------------------------------------------------------------- CRC


def crcmod_crc32c() -> Callable[[bytes], int]:
    """CRC-32C as protocol.records builds its fallback."""
    import crcmod.predefined

    return crcmod.predefined.mkCrcFun("crc-32c")


def crcmod_uses_c_extension() -> bool:
    import sys

    import crcmod  # noqa: F401  (loads crcmod.crcmod)

    return bool(getattr(sys.modules.get("crcmod.crcmod"), "_usingExtension", False))


def crc32c_package() -> tuple[Callable[[bytes], int], bool] | None:
    """(function, uses the CPU's CRC instruction) of the crc32c package, or None."""
    try:
        import crc32c
    except ImportError:
        return None
    return crc32c.crc32c, bool(getattr(crc32c, "hardware_based", False))


def crc_rate(crc: Callable[[bytes], int], seconds: float, buffer_bytes: int = MIB) -> float:
    """MB/s of ``crc`` over ``buffer_bytes`` buffers for ``seconds``."""
    buffer = os.urandom(buffer_bytes)
    done = 0
    start = time.perf_counter()
    deadline = start + seconds
    now = start
    while now < deadline:
        crc(buffer)
        done += buffer_bytes
        now = time.perf_counter()
    return done / (now - start) / 1e6


# ---------------------------------------------------------------------- all of it


def measure_limits(directory: str | None = None, seconds_each: float = DEFAULT_SECONDS_EACH) -> MachineLimits:
    """Every measurement, ``seconds_each`` apiece, disk ones in ``directory``
    (a fresh temporary directory, removed afterwards, when None)."""
    if directory is None:
        scratch = tempfile.mkdtemp(prefix="onceflow-limits-", dir=os.environ.get("BENCH_DIR"))
        try:
            return measure_limits(scratch, seconds_each)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    small_writes = disk_write_rate(directory, 16 * KIB, seconds_each)
    large_writes = disk_write_rate(directory, MIB, seconds_each)
    fsyncs = fsync_rate(directory, seconds_each)
    group_commit = group_commit_rate(directory, seconds_each)
    loopback = loopback_throughput(seconds_each)
    round_trips = loopback_round_trips(seconds_each)
    fallback_crc = crcmod_crc32c()
    package = crc32c_package()
    probe = os.urandom(4096)
    if package is not None and package[0](probe) != fallback_crc(probe):
        raise AssertionError("crcmod and the crc32c package disagree on CRC-32C")
    return MachineLimits(
        directory=os.path.abspath(directory),
        cpus=os.cpu_count() or 1,
        python=platform.python_version(),
        seconds_each=seconds_each,
        disk_write_16k_mb_per_s=round(small_writes.mb_per_s, 1),
        disk_write_1m_mb_per_s=round(large_writes.mb_per_s, 1),
        disk_write_16k_final_fsync_ms=round(small_writes.final_fsync_ms, 1),
        disk_write_1m_final_fsync_ms=round(large_writes.final_fsync_ms, 1),
        fsyncs_per_s=round(fsyncs.fsyncs_per_s, 1),
        fsync_mean_ms=round(fsyncs.mean_latency_ms, 3),
        fsync_p99_ms=round(fsyncs.p99_latency_ms, 3),
        group_commit_16k_mb_per_s=round(group_commit.mb_per_s, 1),
        group_commit_fsyncs_per_s=round(group_commit.fsyncs_per_s, 1),
        loopback_mb_per_s=round(loopback, 1),
        loopback_round_trips_per_s=round(round_trips.round_trips_per_s),
        loopback_round_trip_mean_us=round(round_trips.mean_latency_us, 1),
        crc32c_crcmod_mb_per_s=round(crc_rate(fallback_crc, seconds_each), 1),
        crcmod_uses_c_extension=crcmod_uses_c_extension(),
        crc32c_package_mb_per_s=None if package is None else round(crc_rate(package[0], seconds_each), 1),
        crc32c_package_hardware=None if package is None else package[1],
    )


def table_rows(limits: MachineLimits) -> list[tuple[str, str]]:
    """(what, figure) pairs, for printing or for another module's table."""
    hardware = limits.crc32c_package_mb_per_s
    return [
        ("sequential write, 16 KiB chunks, one final fsync", f"{limits.disk_write_16k_mb_per_s} MB/s (final fsync {limits.disk_write_16k_final_fsync_ms} ms)"),
        ("sequential write, 1 MiB chunks, one final fsync", f"{limits.disk_write_1m_mb_per_s} MB/s (final fsync {limits.disk_write_1m_final_fsync_ms} ms)"),
        ("1 KiB append + fsync", f"{limits.fsyncs_per_s} /s (mean {limits.fsync_mean_ms} ms, p99 {limits.fsync_p99_ms} ms)"),
        ("16 KiB writes, fsync every 5 ms (group commit)", f"{limits.group_commit_16k_mb_per_s} MB/s ({limits.group_commit_fsyncs_per_s} fsyncs/s)"),
        ("loopback TCP, one connection", f"{limits.loopback_mb_per_s} MB/s"),
        ("loopback 100-byte ping-pong", f"{limits.loopback_round_trips_per_s} round trips/s (mean {limits.loopback_round_trip_mean_us} us)"),
        ("CRC-32C, crcmod, 1 MiB buffers", f"{limits.crc32c_crcmod_mb_per_s} MB/s" + ("" if limits.crcmod_uses_c_extension else " (pure Python: no C extension)")),
        ("CRC-32C, crc32c package, 1 MiB buffers", "not installed" if hardware is None else f"{hardware} MB/s" + (" (hardware)" if limits.crc32c_package_hardware else " (software)")),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS_EACH, help="budget of each of the 8 measurements (default %(default)s)")
    parser.add_argument("--dir", default=None, help="directory for the disk measurements (default: a new temporary directory)")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args()
    began = time.perf_counter()
    limits = measure_limits(args.dir, args.seconds)
    took = time.perf_counter() - began
    print(f"machine limits: {limits.cpus} CPUs, Python {limits.python}, disk in {limits.directory}, {limits.seconds_each} s each, {took:.1f} s in all")
    rows = table_rows(limits)
    width = max(len(what) for what, _ in rows)
    for what, figure in rows:
        print(f"  {what:<{width}}  {figure}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(limits.as_dict(), file, indent=1)


if __name__ == "__main__":
    main()
