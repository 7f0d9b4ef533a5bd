"""The network-fault part of the harness: a TCP proxy between Kafka clients and
a broker that forwards bytes both ways and misbehaves on command.

This module owns:

- ``FaultProxy``: the asyncio proxy. Faults are set with plain methods called
  on the proxy's event loop and take effect at once, for existing and new
  connections alike:

  * ``cut()``: reset every current connection (SO_LINGER 0, so both peers see
    a TCP RST rather than an orderly FIN);
  * ``refuse(on)``: new connections are accepted and reset at once (the
    listener stays bound, so the port cannot be taken by anyone else);
  * ``blackhole(direction, on)``: bytes are read and dropped, the connection
    stays open;
  * ``delay(direction, seconds, jitter)``: every chunk is delivered after a
    delay; jitter never reorders, since a chunk waits for the one before it;
  * ``hold(direction)`` / ``release(direction)``: buffer everything (without
    bound), deliver it in order on release;
  * ``delay_connection(match, seconds)``: delay only the connections picked by
    accept index or by a predicate on their first request, so that one
    connection falls behind while the others flow. Over TCP this is the only
    reordering there is: bytes within one connection never overtake each other;
  * ``delay_requests(api_key, seconds)`` / ``drop_requests(api_key)``: with
    Kafka framing on (the default), the client-to-broker stream is cut into
    whole request frames (int32 size, then int16 api_key, int16 api_version,
    int32 correlation_id) and a rule acts on whole frames. TCP semantics hold:
    a delayed request holds back every later request of the same connection,
    and a dropped request is simply never seen by the broker (the client
    waits for its response until its request timeout);
  * ``cut_fetches(mode, times)``: with Kafka framing on, Fetch responses
    end inside a record batch, as Apache Kafka's do (it slices its log by
    bytes): the proxy holds each Fetch response whole, shortens the records
    of its partitions and re-frames it (``faults.proxy_state.cut_fetch_response``
    says how each mode cuts). Clients must ignore the partial tail and fetch
    it again.

  Directions are ``"upstream"`` (client to broker), ``"downstream"`` (broker to
  client) or ``"both"``. A delay is stamped on a chunk when the proxy reads it;
  changing or clearing a delay does not move chunks already waiting. Hold and
  blackhole are decided when a chunk is due for delivery, so a chunk that
  comes due while its direction is blackholed is dropped.

- Counters of what was forwarded and dropped per direction, and an event log
  (``ProxyEvent``: time, kind, detail) of faults applied and cleared and of
  connections and requests affected, for the harness's timeline.
- ``ThreadedFaultProxy``: the same proxy served by a
  ``protocol.loop_thread.LoopThread``, with a blocking API (each of the
  proxy's public methods, run on its loop), for sync tests and the chaos
  runner.

Beside it: ``faults.proxy_state`` (the sans-I/O part: fault settings,
counters, events, the request framer over ``protocol.framing``) and
``faults.proxy_schedule`` (seeded fault schedules and their players). Their
public names are importable from here too.

Kafka clients learn broker addresses from Metadata and FindCoordinator
responses, so the broker must advertise the proxy's address (``advertised_host``
/ ``advertised_port``), or clients bypass the proxy after bootstrapping.
``retarget()`` lets a proxy be started before its broker for that reason.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import functools
import itertools
import logging
import random
import socket
import struct
import time
from typing import Callable

import attrs

from faults.proxy_schedule import (
    SCHEDULE_ACTIONS,
    SCHEDULE_KINDS,
    ScheduledAction,
    random_schedule,
    run_schedule,
    run_schedule_async,
)
from faults.proxy_state import (
    BOTH,
    DIRECTIONS,
    DOWNSTREAM,
    FAULT_EVENT_KINDS,
    FETCH_CUT_MODES,
    UPSTREAM,
    ConnectionDelay,
    DirectionFaults,
    FetchCutRule,
    FetchRequestSeen,
    KafkaRequestFramer,
    ProxyCounters,
    ProxyEvent,
    RequestRule,
    ResponseFramer,
    client_id_is,
    cut_fetch_response,
    directions,
)
from protocol.errors import MalformedFrameError, UnsupportedRequestError
from protocol.framing import RequestHeader
from protocol.loop_thread import LoopThread
from protocol.messages import ApiKey
from protocol.records import CorruptRecordError
from protocol.tasks import cancel_and_wait

log = logging.getLogger(__name__)

READ_CHUNK_BYTES = 64 * 1024
# How much of a connection's first request is kept for delay_connection predicates.
FIRST_REQUEST_KEEP_BYTES = 64 * 1024
CONNECT_TIMEOUT_SECONDS = 10.0
EVENT_LOG_LIMIT = 100_000

_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 seconds: close() sends RST


# ------------------------------------------------------------------ connections


@attrs.define
class Delivery:
    deliver_at: float  # event-loop time
    data: bytes | None  # None: end of stream


@attrs.define(eq=False)
class Pipe:
    """One direction of one proxied connection: read from ``source``, queue,
    write to ``destination`` when due."""

    direction: str
    source: asyncio.StreamReader
    destination: asyncio.StreamWriter
    framer: KafkaRequestFramer | None = None
    responses: ResponseFramer | None = None  # downstream, with Kafka framing: holds the Fetch responses to cut
    queue: asyncio.Queue = attrs.field(factory=asyncio.Queue)
    last_deliver_at: float = 0.0
    pending_bytes: int = 0
    pending_chunks: int = 0


@attrs.define(eq=False)
class ProxiedConnection:
    index: int
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    first_request: bytes | None = None
    task: asyncio.Task | None = None
    pipes: list[Pipe] = attrs.field(factory=list)

    def reset(self) -> None:
        """Close both sockets at once with RST."""
        for writer in (self.client, self.upstream):
            _reset_transport(writer.transport)


def _reset_transport(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        except OSError:  # already closed by the peer or the kernel
            pass
    transport.abort()


def _reset_socket(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    except OSError:
        pass
    sock.close()


# ------------------------------------------------------------------ the proxy


class FaultProxy:
    """An asyncio TCP proxy to ``target_host:target_port`` with injectable faults.

    Not thread-safe: call every method on the loop that ran ``start()`` (use
    ``ThreadedFaultProxy`` from other threads). Pass ``kafka_framing=False``
    for traffic that is not Kafka requests: framing waits for a whole frame
    before forwarding it. ``seed`` makes delay jitter reproducible.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        *,
        kafka_framing: bool = True,
        clock: Callable[[], float] = time.time,
        seed: int | str | None = None,
    ):
        self.target_host = target_host
        self.target_port = target_port
        self.listen_host = listen_host
        self.listen_port = listen_port
        self.kafka_framing = kafka_framing
        self.clock = clock
        self._jitter_random = random.Random(seed)
        self._faults = {direction: DirectionFaults() for direction in DIRECTIONS}
        self._refusing = False
        self._connection_delays: list[ConnectionDelay] = []
        self._request_rules: dict[int, RequestRule] = {}
        self._fetch_cut: FetchCutRule | None = None
        self._cut_random = random.Random(seed)
        self._counters = ProxyCounters()
        self._events: collections.deque[ProxyEvent] = collections.deque(maxlen=EVENT_LOG_LIMIT)
        self._connections: set[ProxiedConnection] = set()
        self._accept_index = itertools.count()
        self._fault_change = asyncio.Event()
        self._listener: socket.socket | None = None
        self._serve_task: asyncio.Task | None = None
        self.port: int | None = None

    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self.port}"

    # -------------------------------------------------------------- lifecycle

    async def start(self) -> "FaultProxy":
        """Bind and listen; a bind failure raises here. Returns once accepting."""
        listener = socket.create_server((self.listen_host, self.listen_port))
        listener.setblocking(False)
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._serve_task = asyncio.get_running_loop().create_task(self._serve(listener))
        self._log("started", listen=self.address, target=f"{self.target_host}:{self.target_port}")
        return self

    async def stop(self) -> None:
        """Stop accepting and close every connection (queued bytes are dropped)."""
        await cancel_and_wait(self._serve_task)
        self._serve_task = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        # Let the transports' connection_lost callbacks run before the loop may close.
        await asyncio.sleep(0)
        self._log("stopped")

    async def __aenter__(self) -> "FaultProxy":
        return await self.start()

    async def __aexit__(self, *exc_info) -> None:
        await self.stop()

    def retarget(self, target_host: str, target_port: int) -> None:
        """Send new connections to another address (existing ones stay where they are)."""
        self.target_host, self.target_port = target_host, target_port
        self._log("retarget", target=f"{target_host}:{target_port}")

    # -------------------------------------------------------------- faults

    def cut(self) -> int:
        """Reset every current connection; returns how many were cut."""
        connections = list(self._connections)
        for connection in connections:
            connection.reset()
            if connection.task is not None:
                connection.task.cancel()
        self._counters.connections_cut += len(connections)
        self._log("cut", connections=len(connections))
        return len(connections)

    def refuse(self, on: bool = True) -> None:
        self._refusing = on
        self._log("refuse" if on else "refuse_cleared")

    def blackhole(self, direction: str = BOTH, on: bool = True) -> None:
        for name in directions(direction):
            self._faults[name].blackholed = on
        self._log("blackhole" if on else "blackhole_cleared", direction=direction)
        self._announce_change()

    def delay(self, direction: str = BOTH, seconds: float = 0.0, jitter: float = 0.0) -> None:
        """Delay every chunk by ``seconds`` plus up to ``jitter``; 0 clears."""
        if seconds < 0 or jitter < 0:
            raise ValueError("delay and jitter must be >= 0")
        for name in directions(direction):
            self._faults[name].delay_seconds = seconds
            self._faults[name].jitter_seconds = jitter
        if seconds or jitter:
            self._log("delay", direction=direction, seconds=seconds, jitter=jitter)
        else:
            self._log("delay_cleared", direction=direction)

    def hold(self, direction: str = BOTH) -> None:
        for name in directions(direction):
            self._faults[name].held = True
        self._log("hold", direction=direction)
        self._announce_change()

    def release(self, direction: str = BOTH) -> None:
        for name in directions(direction):
            self._faults[name].held = False
        self._log("release", direction=direction)
        self._announce_change()

    def delay_connection(self, match: int | Callable[[bytes], bool], seconds: float, direction: str = BOTH) -> None:
        """Delay the traffic of the connections ``match`` picks (see ``ConnectionDelay``)."""
        directions(direction)
        if isinstance(match, bool) or not (isinstance(match, int) or callable(match)):
            raise TypeError("match is an accept index (int) or a predicate on the first request")
        if seconds < 0:
            raise ValueError("delay must be >= 0")
        self._connection_delays.append(ConnectionDelay(match, seconds, direction))
        self._log("delay_connection", match=match if isinstance(match, int) else getattr(match, "__name__", repr(match)), seconds=seconds, direction=direction)

    def clear_connection_delays(self) -> None:
        self._connection_delays.clear()
        self._log("connection_delays_cleared")

    def delay_requests(self, api_key: int, seconds: float, times: int | None = None) -> None:
        """Hold back every request with ``api_key`` (the next ``times`` of them,
        or all until cleared) by ``seconds``; later requests on the same
        connection wait behind it, as they would on a slow TCP path."""
        if seconds < 0:
            raise ValueError("delay must be >= 0")
        self._set_request_rule(RequestRule(api_key, "delay", seconds, times))
        self._log("delay_requests", api_key=api_key, seconds=seconds, times=times)

    def drop_requests(self, api_key: int, times: int | None = None) -> None:
        """Swallow requests with ``api_key`` (the next ``times``, or all until cleared)."""
        self._set_request_rule(RequestRule(api_key, "drop", 0.0, times))
        self._log("drop_requests", api_key=api_key, times=times)

    def clear_requests(self, api_key: int | None = None) -> None:
        """Remove the request rule for ``api_key``, or every rule."""
        if api_key is None:
            self._request_rules.clear()
        else:
            self._request_rules.pop(api_key, None)
        self._log("requests_cleared", api_key=api_key)

    def cut_fetches(self, mode: str = "tail", times: int | None = None) -> None:
        """End the next ``times`` Fetch responses (or all until cleared) inside
        a record batch: ``"tail"`` cuts inside the last batch of every
        partition answered with two or more, at a random byte (seeded by the
        proxy's ``seed``); ``"partition_max_bytes"`` slices every partition's
        records at the limit its request asked for, exactly. Applies to Fetch
        requests sent from now on."""
        if not self.kafka_framing:
            raise ValueError("cutting fetches needs Kafka framing (FaultProxy(..., kafka_framing=True))")
        if mode not in FETCH_CUT_MODES:
            raise ValueError(f"mode must be one of {', '.join(FETCH_CUT_MODES)}, not {mode!r}")
        if times is not None and times < 1:
            raise ValueError("times counts from 1 (None: until cleared)")
        self._fetch_cut = FetchCutRule(mode, times)
        self._log("cut_fetches", mode=mode, times=times)

    def clear_fetch_cuts(self) -> None:
        self._fetch_cut = None
        self._log("fetch_cuts_cleared")

    def heal(self) -> None:
        """Clear every fault: refusal, blackholes, delays, holds, connection
        and request rules, fetch cuts."""
        self._refusing = False
        self._fetch_cut = None
        for faults in self._faults.values():
            faults.blackholed = faults.held = False
            faults.delay_seconds = faults.jitter_seconds = 0.0
        self._connection_delays.clear()
        self._request_rules.clear()
        self._log("heal")
        self._announce_change()

    def _set_request_rule(self, rule: RequestRule) -> None:
        if not self.kafka_framing:
            raise ValueError("request rules need Kafka framing (FaultProxy(..., kafka_framing=True))")
        if rule.remaining is not None and rule.remaining < 1:
            raise ValueError("times counts from 1 (None: until cleared)")
        self._request_rules[rule.api_key] = rule

    # -------------------------------------------------------------- observation

    def counters(self) -> ProxyCounters:
        """A snapshot of the counters."""
        return copy.deepcopy(self._counters)

    def events(self, *, faults_only: bool = False) -> list[ProxyEvent]:
        return [event for event in self._events if event.is_fault or not faults_only]

    def connection_count(self) -> int:
        return len(self._connections)

    def faults_in_effect(self) -> dict:
        """What is set now, as plain data (equal to a fresh proxy's when healed)."""
        return {
            "refusing": self._refusing,
            **{name: attrs.asdict(faults) for name, faults in self._faults.items()},
            "connection_delays": [(rule.match, rule.seconds, rule.direction) for rule in self._connection_delays],
            "request_rules": [attrs.asdict(rule) for rule in self._request_rules.values()],
            "fetch_cut": attrs.asdict(self._fetch_cut) if self._fetch_cut is not None else None,
        }

    def _log(self, kind: str, **detail) -> None:
        self._events.append(ProxyEvent(self.clock(), kind, detail))

    def _announce_change(self) -> None:
        """Wake every writer waiting on a hold, then arm a fresh event for the next change."""
        self._fault_change.set()
        self._fault_change = asyncio.Event()

    # -------------------------------------------------------------- serving

    async def _serve(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        async with asyncio.TaskGroup() as connections:
            while True:
                try:
                    client_socket, _address = await loop.sock_accept(listener)
                except OSError as error:  # out of file descriptors, say: keep serving the rest
                    self._log("accept_failed", error=repr(error))
                    await asyncio.sleep(0.1)
                    continue
                connections.create_task(self._serve_connection(client_socket))

    async def _serve_connection(self, client_socket: socket.socket) -> None:
        index = next(self._accept_index)
        self._counters.connections_accepted += 1
        if self._refusing:
            self._counters.connections_refused += 1
            self._log("connection_refused", index=index)
            _reset_socket(client_socket)
            return
        target = (self.target_host, self.target_port)
        upstream_writer = None
        try:
            # Without NODELAY, Nagle's algorithm would add delays of its own.
            client_socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                upstream_reader, upstream_writer = await asyncio.open_connection(*target)
            upstream_writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client_reader, client_writer = await asyncio.open_connection(sock=client_socket, limit=READ_CHUNK_BYTES)
        except (OSError, TimeoutError) as error:  # the target is down, or the client already left
            self._counters.connections_failed += 1
            self._log("connection_failed", index=index, target=f"{target[0]}:{target[1]}", error=repr(error))
            if upstream_writer is not None:
                upstream_writer.transport.abort()
            _reset_socket(client_socket)
            return
        connection = ProxiedConnection(index, client_writer, upstream_writer, task=asyncio.current_task())
        connection.pipes = [
            Pipe(UPSTREAM, client_reader, upstream_writer, KafkaRequestFramer() if self.kafka_framing else None),
            Pipe(DOWNSTREAM, upstream_reader, client_writer, responses=ResponseFramer() if self.kafka_framing else None),
        ]
        self._connections.add(connection)
        self._log("connection_opened", index=index, target=f"{target[0]}:{target[1]}")
        outcome = "cut or stopped"  # what is left if this task is cancelled
        try:
            async with asyncio.TaskGroup() as pipes:
                for pipe in connection.pipes:
                    pipes.create_task(self._read_into(pipe, connection))
                    pipes.create_task(self._deliver_from(pipe))
            outcome = "closed"
        except* (OSError, EOFError) as errors:
            outcome = f"reset: {errors.exceptions[0]!r}"
        except* Exception as errors:  # a bug here must not take the whole proxy down
            outcome = f"error: {errors.exceptions[0]!r}"
            log.error("fault proxy connection %d failed", index, exc_info=errors)
        finally:
            self._connections.discard(connection)
            for pipe in connection.pipes:
                counters = self._counters.direction(pipe.direction)
                counters.bytes_dropped += pipe.pending_bytes
                counters.chunks_dropped += pipe.pending_chunks
            if outcome == "closed":
                client_writer.close()
                upstream_writer.close()
            else:
                connection.reset()
            self._log("connection_closed", index=index, outcome=outcome)

    async def _read_into(self, pipe: Pipe, connection: ProxiedConnection) -> None:
        """Read the source until end of stream, queueing each chunk (or whole
        request frame) with the time it is due."""
        while True:
            data = await pipe.source.read(READ_CHUNK_BYTES)
            if not data:
                break
            self._counters.direction(pipe.direction).bytes_read += len(data)
            if pipe.responses is not None:
                for held, piece in pipe.responses.feed(data):
                    self._admit(pipe, connection, piece if held is None else self._cut_fetch(connection, held, piece), None)
                continue
            if pipe.framer is None:
                self._admit(pipe, connection, data, None)
                continue
            was_lost = pipe.framer.framing_lost
            for header, piece in pipe.framer.feed(data):
                self._admit(pipe, connection, piece, header)
            if pipe.framer.framing_lost and not was_lost:
                self._log("framing_lost", index=connection.index)
        if pipe.framer is not None or pipe.responses is not None:
            partial = (pipe.framer or pipe.responses).take_partial()
            if partial:
                self._admit(pipe, connection, partial, None)
        self._enqueue(pipe, None, self._due_time(pipe, connection, 0.0))

    def _admit(self, pipe: Pipe, connection: ProxiedConnection, data: bytes, header: RequestHeader | None) -> None:
        if pipe.direction == UPSTREAM and connection.first_request is None:
            connection.first_request = data[:FIRST_REQUEST_KEEP_BYTES]
        extra_delay = 0.0
        if header is not None and header.api_key == ApiKey.FETCH and self._fetch_cut is not None:
            data = self._hold_fetch_response(connection, header, data)
        if header is not None:
            self._counters.requests_seen += 1
            rule = self._request_rules.get(header.api_key)
            if rule is not None:
                if rule.remaining is not None:
                    rule.remaining -= 1
                    if rule.remaining == 0:
                        del self._request_rules[header.api_key]
                detail = dict(index=connection.index, api_key=header.api_key, api_version=header.api_version, correlation_id=header.correlation_id)
                if rule.action == "drop":
                    self._counters.requests_dropped += 1
                    counters = self._counters.upstream
                    counters.bytes_dropped += len(data)
                    counters.chunks_dropped += 1
                    self._log("request_dropped", **detail)
                    return
                self._counters.requests_delayed += 1
                self._log("request_delayed", seconds=rule.seconds, **detail)
                extra_delay = rule.seconds
        self._enqueue(pipe, data, self._due_time(pipe, connection, extra_delay))

    def _hold_fetch_response(self, connection: ProxiedConnection, header: RequestHeader, frame: bytes) -> bytes:
        """Have the answer to this Fetch held whole, for ``_cut_fetch``; the
        request frame to send on (widened in ``"partition_max_bytes"`` mode)."""
        try:
            request = FetchRequestSeen.from_frame(frame, self._fetch_cut.mode)
        except (MalformedFrameError, UnsupportedRequestError, ValueError) as error:
            self._log("fetch_cut_skipped", index=connection.index, correlation_id=header.correlation_id, error=repr(error))
            return frame
        for pipe in connection.pipes:
            if pipe.responses is not None:
                pipe.responses.hold(header.correlation_id, request)
        return request.widened or frame

    def _cut_fetch(self, connection: ProxiedConnection, request: FetchRequestSeen, frame: bytes) -> bytes:
        """Cut the held answer as its request's mode says (a widened request
        is always cut back to what the client asked for)."""
        rule = self._fetch_cut
        if rule is None and request.widened is None:
            return frame
        try:
            frame, cuts = cut_fetch_response(frame, request, self._cut_random)
        except (MalformedFrameError, CorruptRecordError, ValueError) as error:
            self._log("fetch_cut_skipped", index=connection.index, error=repr(error))
            return frame
        if cuts:
            self._counters.fetch_responses_cut += 1
            self._counters.fetch_bytes_cut += sum(cut["dropped"] for cut in cuts)
            self._log("fetch_cut", index=connection.index, partitions=cuts)
            if rule is not None and rule.remaining is not None:
                rule.remaining -= 1
                if rule.remaining == 0:
                    self._fetch_cut = None
        return frame

    def _due_time(self, pipe: Pipe, connection: ProxiedConnection, extra_delay: float) -> float:
        faults = self._faults[pipe.direction]
        delay = faults.delay_seconds + extra_delay
        if faults.jitter_seconds:
            delay += self._jitter_random.uniform(0.0, faults.jitter_seconds)
        for rule in self._connection_delays:
            if pipe.direction in directions(rule.direction) and rule.matches(connection):
                delay += rule.seconds
        # Never before the chunk ahead of it: TCP keeps order within a connection.
        due = max(asyncio.get_running_loop().time() + delay, pipe.last_deliver_at)
        pipe.last_deliver_at = due
        return due

    def _enqueue(self, pipe: Pipe, data: bytes | None, due: float) -> None:
        if data is not None:
            pipe.pending_bytes += len(data)
            pipe.pending_chunks += 1
        pipe.queue.put_nowait(Delivery(due, data))

    async def _deliver_from(self, pipe: Pipe) -> None:
        loop = asyncio.get_running_loop()
        faults = self._faults[pipe.direction]
        counters = self._counters.direction(pipe.direction)
        while True:
            delivery = await pipe.queue.get()
            wait = delivery.deliver_at - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            while True:
                change = self._fault_change
                if not faults.held:
                    break
                await change.wait()
            if delivery.data is None:
                if not faults.blackholed and pipe.destination.can_write_eof():
                    pipe.destination.write_eof()
                return
            size = len(delivery.data)
            if faults.blackholed:
                counters.bytes_dropped += size
                counters.chunks_dropped += 1
            else:
                pipe.destination.write(delivery.data)
                await pipe.destination.drain()
                counters.bytes_forwarded += size
                counters.chunks_forwarded += 1
            pipe.pending_bytes -= size
            pipe.pending_chunks -= 1


# ------------------------------------------------------------------ blocking wrapper


class ThreadedFaultProxy:
    """``FaultProxy`` on its own thread and event loop, driven from sync code:
    every public method of ``FaultProxy`` named in ``BLOCKING_METHODS`` is
    available here, run on the proxy's loop, returning its result.

    >>> with ThreadedFaultProxy("127.0.0.1", broker_port) as proxy:
    ...     proxy.delay_requests(ApiKey.END_TXN, 1.5)
    """

    # What a sync caller may call: every fault, its clearing, and observation.
    BLOCKING_METHODS = frozenset({
        "retarget", "cut", "refuse", "blackhole", "delay", "hold", "release",
        "delay_connection", "clear_connection_delays", "delay_requests", "drop_requests",
        "clear_requests", "cut_fetches", "clear_fetch_cuts", "heal", "counters", "events", "connection_count", "faults_in_effect",
    })

    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1", listen_port: int = 0, **options):
        self._options = (target_host, target_port, listen_host, listen_port, options)
        self.proxy: FaultProxy | None = None
        self._thread: LoopThread | None = None

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def address(self) -> str:
        return self.proxy.address

    def start(self) -> "ThreadedFaultProxy":
        target_host, target_port, listen_host, listen_port, options = self._options
        thread = LoopThread("onceflow-fault-proxy")
        try:
            self.proxy = thread.run(FaultProxy, target_host, target_port, listen_host, listen_port, **options)
            thread.serve(self.proxy.start, self.proxy.stop)
        except BaseException:
            thread.stop()
            raise
        self._thread = thread
        return self

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.stop()

    def __enter__(self) -> "ThreadedFaultProxy":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __getattr__(self, name: str):
        if name not in ThreadedFaultProxy.BLOCKING_METHODS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        method = getattr(FaultProxy, name)

        @functools.wraps(method)
        def blocking(*args, **kwargs):
            return self._thread.run(method, self.proxy, *args, **kwargs)

        return blocking


__all__ = [
    "BOTH", "DOWNSTREAM", "FAULT_EVENT_KINDS", "FaultProxy", "KafkaRequestFramer",
    "ProxyCounters", "ProxyEvent", "RequestHeader", "SCHEDULE_ACTIONS", "SCHEDULE_KINDS",
    "ScheduledAction", "ThreadedFaultProxy", "UPSTREAM", "client_id_is", "random_schedule",
    "run_schedule", "run_schedule_async",
]
