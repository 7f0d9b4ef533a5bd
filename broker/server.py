"""The network edge: an asyncio TCP listener that feeds frames to the request
handlers and writes their responses back, in order, per connection.

Each connection owns one ``asyncio.TaskGroup``: a reader that turns bytes
into requests (through the sans-I/O ``protocol.framing.ServerConnection``) and
one task per request, so that a long-polling Fetch or a Produce waiting for its
fsync does not hold up decoding. The answers go out in the order the requests
arrived (Kafka clients pipeline and match by order as well as by correlation
id): each answer is written from its task's completion as soon as every answer
before it is out (``_Answers``), with no writer task and no queue between them
(one turn of the loop fewer per request, and no queue hand-over).
The socket's bytes are read in place (``protocol.frame_stream``): a large
Produce request lands in a buffer of its own and its record batches are
appended to the log from there, with no copy on the way in. The number of
requests in flight per connection is bounded, and the reader stops while the
socket's send buffer is full, so a client that never reads its responses
stops being read from instead of growing our memory (the socket is not read
past ``READ_AHEAD_BYTES`` of requests waiting to start). Once the peer
is gone, the first answer that finds the connection closed cancels the
requests still in flight behind it.

No peer input crashes the process: a frame that cannot be decoded closes that
connection (logged), an unsupported ApiVersions version is answered with
UNSUPPORTED_VERSION as Kafka does, and an exception inside a handler is logged
and closes only that connection.

A response with ``throttle_time_ms`` > 0 (a client over its quota,
``broker.security.quotas``) mutes its connection for that long, as Kafka
does (KIP-219): no further request of it is read or started until then,
whether or not the client honours the field.

A connection whose reader was waiting when a whole request came (until the
reader takes it), and a request that appends (``APPENDING_APIS``) whose task
has not started, are on their way to an append: the server keeps them in the
broker's ``FsyncRounds.arriving`` for that long, and a round about to start
waits a turn or two for them (``storage.group_commit``).

Each connection's ``Session`` carries ``close_connection``: what lets the
broker drop one connection on purpose, as a network failure would (the
offset-commit watch, ``broker.offset_commit_watch``, wakes a stuck client so).

A server serves one listener (``broker.security.listeners``); the broker runs
one per listener. Its edge, in the order a connection meets it: the shared
``ConnectionLimiter`` (a connection over ``max.connections`` or
``max.connections.per.ip`` is closed at once, logged); TLS on SSL and
SASL_SSL listeners (``asyncio``'s ``start_tls`` on the accepted stream, so the
limit applies before the handshake costs anything); on SASL listeners the
connection's ``broker.security.sasl.SaslServer``, which sees every request
before the dispatcher, answers SaslHandshake/SaslAuthenticate itself and
replaces the connection's ``Session`` when it authenticates. Until then a
frame may be at most ``sasl.server.max.receive.size`` bytes, and a connection
that has not finished TLS and SASL within the authentication timeout is
closed.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import socket
import ssl
import struct
import time
from collections.abc import Awaitable, Callable

import attrs

from broker.security.limits import ConnectionLimiter
from broker.security.listeners import PLAINTEXT, SSL, Listener
from broker.security.sasl import SaslRefusal, SaslServer, SaslState
from broker.security.session import Session
from broker.security.tls import principal_from_certificate
from protocol import framing
from protocol.errors import MalformedFrameError
from protocol.frame_stream import FrameReceiver
from protocol.messages import ApiKey
from protocol.tasks import ConnectionServer

log = logging.getLogger(__name__)

# The requests whose handling appends to a log and waits for the round that
# makes it durable: while one of them is read but not yet started, a round
# about to begin waits for it a turn (``FsyncRounds.arriving``). Others (a
# Fetch, a heartbeat) hold a round back by no more than the turn their bytes
# take to be cut.
APPENDING_APIS = frozenset({
    ApiKey.PRODUCE, ApiKey.TXN_OFFSET_COMMIT, ApiKey.OFFSET_COMMIT, ApiKey.END_TXN, ApiKey.ADD_PARTITIONS_TO_TXN,
    ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.INIT_PRODUCER_ID, ApiKey.WRITE_TXN_MARKERS,
})

# The dispatcher gets the decoded request with the session of the connection it
# came on and returns the response body (a dict), or None when no response is
# due (Produce with acks=0).
Dispatch = Callable[[framing.DecodedRequest, Session], Awaitable[dict | None]]
# Told of every connection as it opens, with its first session; returns what
# the server calls with each later session of that connection (after it
# authenticates) and with None when it closes (the broker's metrics count
# connections per listener with it).
SessionUpdate = Callable[[Session | None], None]
OnConnection = Callable[[Session], SessionUpdate]


class _CloseConnection(Exception):
    """Raised inside a connection to end it after what was already answered."""


@attrs.define
class _Mute:
    """Until when (loop time) one connection is not read from: a throttled client's."""

    until: float = 0.0

    def throttled(self, body) -> None:
        throttle_ms = body.get("throttle_time_ms") if isinstance(body, dict) else None
        if throttle_ms and throttle_ms > 0:
            self.until = max(self.until, asyncio.get_running_loop().time() + throttle_ms / 1000)

    async def wait(self) -> None:
        delay = self.until - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)


class _Answers:
    """The answers of one connection, written in request order.

    An entry is a request's task (its result the encoded frame, or None when
    no answer is due) or a frame ready now. Whenever a task ends, the answers
    at the head that are complete are written at once, from its completion
    callback. A task that failed or was cancelled stops the writing (the
    TaskGroup closes the connection); a frame due on a connection already
    closing cancels the tasks behind it, whose answers could not go out."""

    def __init__(self, writer: asyncio.StreamWriter, limit: int):
        self._writer = writer
        self._limit = limit
        self._entries: collections.deque[asyncio.Task | bytes] = collections.deque()
        self._room: asyncio.Future | None = None  # what the reader waits on while the limit is reached
        self._stopped = False

    def add_task(self, task: asyncio.Task) -> None:
        if self._stopped:
            task.cancel()  # its answer could not go out
            return
        self._entries.append(task)
        task.add_done_callback(self._task_done)

    def add_frame(self, frame: bytes) -> None:
        self._entries.append(frame)
        self._write_complete()

    async def wait_for_room(self) -> None:
        """Returns once fewer than the limit of answers are outstanding and
        the socket is taking what was written (``drain``)."""
        while len(self._entries) >= self._limit:
            self._room = asyncio.get_running_loop().create_future()
            await self._room
        await self._writer.drain()

    def _task_done(self, _task: asyncio.Task) -> None:
        self._write_complete()

    def _write_complete(self) -> None:
        entries = self._entries
        while entries and not self._stopped:
            head = entries[0]
            if isinstance(head, asyncio.Task):
                if not head.done():
                    break
                if head.cancelled() or head.exception() is not None:
                    self._stop(cancel_the_rest=False)  # the TaskGroup ends the connection with it
                    break
                frame = head.result()
            else:
                frame = head
            entries.popleft()
            if frame is None:
                continue
            if not self._writer.transport.is_closing():
                # An answer is a list of buffers (``encode_response_parts``: a
                # Fetch answer's records as read from the segment, not copied
                # into one frame); a frame of its own is one buffer. Each
                # as a memoryview, so a partial send keeps the rest without
                # slicing a copy.
                for part in frame if isinstance(frame, list) else (frame,):
                    self._writer.write(memoryview(part))
            if self._writer.transport.is_closing():  # closed before, or the write found the peer gone
                self._stop(cancel_the_rest=True)
                break
        if self._room is not None and len(entries) < self._limit:
            if not self._room.done():
                self._room.set_result(None)
            self._room = None

    def _stop(self, *, cancel_the_rest: bool) -> None:
        self._stopped = True
        if cancel_the_rest:
            for entry in self._entries:
                if isinstance(entry, asyncio.Task):
                    entry.cancel()
        self._entries.clear()


@attrs.define(eq=False)
class _Connection:
    """What the tasks of one connection share: its current session (replaced
    when it authenticates) and its SASL machine (None on a listener without SASL)."""

    session: Session
    sasl: SaslServer | None
    authenticated: asyncio.Event = attrs.field(factory=asyncio.Event)
    session_update: Callable[[Session | None], None] | None = None  # the broker's on_connection hook
    raw_tokens: bool = False  # after a v0 SaslHandshake, until the login ends
    peer_gone: asyncio.Event = attrs.field(factory=asyncio.Event)  # set when the peer closed or reset its end


# How long a refused login's connection stays open for the peer to read the
# answer and close first.
_LINGER_AFTER_REFUSAL = 1.0
# Requests read ahead of a connection that is throttled or at its in-flight
# limit: past this many bytes waiting uncut, its socket is not read until
# the requests before them have been started.
READ_AHEAD_BYTES = 1 << 20
# A request up to this size is received straight into a buffer of its own,
# allocated whole once its size prefix is read (no copy of its bytes on the
# way); a larger one grows as its bytes arrive, so that a size prefix alone
# does not reserve up to ``socket.request.max.bytes``.
IN_PLACE_FRAME_BYTES = 16 << 20


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class KafkaServer:
    """Listens on one address and serves every connection with ``dispatch``."""

    def __init__(
        self,
        dispatch: Dispatch,
        *,
        host: str,
        port: int,
        max_frame_size: int,
        max_inflight_per_connection: int = 64,
        on_unsupported: Callable[[Exception], bytes | None] | None = None,
        supported_versions: dict[int, tuple[int, int]] | None = None,
        on_connection: OnConnection | None = None,
        listener: Listener | None = None,
        ssl_context: ssl.SSLContext | None = None,
        new_sasl_server: Callable[[], SaslServer] | None = None,
        limiter: ConnectionLimiter | None = None,
        authentication_timeout: float = 10.0,
        pre_authentication_max_frame_size: int = 524288,
        failed_authentication_delay: float = 0.1,
        sock: socket.socket | None = None,
        arriving: set | None = None,
    ):
        # Where a connection with a whole request its reader has yet to take
        # and an appending request whose task has not started are kept (the
        # broker's ``FsyncRounds.arriving``: a round waits a turn or two for them).
        self._arriving = arriving
        self.listener = listener or Listener(PLAINTEXT, PLAINTEXT, host, port)
        if self.listener.uses_tls and ssl_context is None:
            raise ValueError(f"listener {self.listener} needs a TLS context")
        if self.listener.uses_sasl and new_sasl_server is None:
            raise ValueError(f"listener {self.listener} needs SASL")
        self._ssl_context = ssl_context if self.listener.uses_tls else None
        self._new_sasl_server = new_sasl_server if self.listener.uses_sasl else None
        self._limiter = limiter
        self._password_checker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"onceflow-sasl-{self.listener.name}") if self._new_sasl_server else None
        self._authentication_timeout = authentication_timeout
        self._failed_authentication_delay = failed_authentication_delay
        self._pre_authentication_max_frame_size = min(pre_authentication_max_frame_size, max_frame_size)
        self._dispatch = dispatch
        self._max_frame_size = max_frame_size
        self._max_inflight = max_inflight_per_connection
        self._on_unsupported = on_unsupported
        # What ApiVersions advertises is all the framing lets through (None:
        # every version the schema tables know, for tests of the server alone).
        self._supported_versions = supported_versions
        self._on_connection = on_connection
        # The TCP listener owns every connection's task (stop() cancels and
        # waits for them; a bug loses one connection, logged).
        self._tcp = ConnectionServer(
            self._accept, host=host, port=port, limit=READ_AHEAD_BYTES, name=f"listener {self.listener}", sock=sock, new_receiver=self._new_receiver
        )
        self.bound_port: int | None = None

    @property
    def open_connections(self) -> int:
        """Connections being served now (a closed one counts until its
        in-flight requests have been answered or cancelled)."""
        return self._tcp.open_connections

    async def listen(self) -> int:
        """Bind and listen, not serving yet: connections wait, established,
        in the kernel's backlog until ``start()``. A bind failure raises
        here, to the caller."""
        self.bound_port = await self._tcp.listen()
        return self.bound_port

    async def start(self) -> int:
        """Serve (bind and listen first unless ``listen()`` did)."""
        self.bound_port = await self._tcp.start()
        return self.bound_port

    async def stop(self) -> None:
        await self._tcp.stop()
        if self._password_checker is not None:
            self._password_checker.shutdown(wait=False, cancel_futures=True)

    def _new_receiver(self, on_connected) -> FrameReceiver:
        """A connection's protocol, its framing ready for the first bytes
        (a SASL listener's frames are small until the login)."""
        max_frame_size = self._pre_authentication_max_frame_size if self._new_sasl_server is not None else self._max_frame_size
        framing_ = framing.ServerConnection(
            max_frame_size=max_frame_size, supported_versions=self._supported_versions, in_place_max_bytes=IN_PLACE_FRAME_BYTES
        )
        return FrameReceiver(framing_, pause_above=READ_AHEAD_BYTES, on_connected=on_connected, server_side=True, arriving=self._arriving)

    async def _accept(self, receiver: FrameReceiver, writer: asyncio.StreamWriter) -> None:
        """One connection, counted by the limiter for as long as it is served."""
        peer = writer.get_extra_info("peername")
        ip = peer[0] if isinstance(peer, tuple) and peer else ""
        refusal = self._limiter.try_open(ip) if self._limiter is not None else None
        if refusal is not None:
            log.warning("refusing connection from %s on %s: %s", peer, self.listener.name, refusal)
            writer.transport.abort()
            return
        try:
            await self._serve(receiver, writer, peer)
        finally:
            if self._limiter is not None:
                self._limiter.closed(ip)

    async def _serve(self, receiver: FrameReceiver, writer: asyncio.StreamWriter, peer) -> None:
        deadline = asyncio.get_running_loop().time() + self._authentication_timeout
        gone = asyncio.Event()  # the peer closed or reset its end (requests may still be in flight)
        session = Session(
            client_host=peer[0] if isinstance(peer, tuple) and peer else "",
            listener=self.listener.name,
            security_protocol=self.listener.security_protocol,
            close_connection=lambda reason: self._close(writer, peer, reason),
            connection_gone=gone.is_set,
        )
        if self._ssl_context is not None:
            try:
                async with asyncio.timeout_at(deadline):
                    await writer.start_tls(self._ssl_context)
            except TimeoutError:
                log.warning("closing connection from %s on %s: no TLS handshake within the authentication timeout", peer, self.listener.name)
                return
            except (ssl.SSLError, ConnectionError, OSError) as error:
                log.info("TLS handshake with %s on %s failed: %s", peer, self.listener.name, error)
                return
            if self.listener.security_protocol == SSL:
                certificate = writer.get_extra_info("peercert")
                session = attrs.evolve(session, principal=principal_from_certificate(certificate))
        state = _Connection(session, self._new_sasl_server() if self._new_sasl_server is not None else None, peer_gone=gone)
        connection = receiver.framing
        session_update = self._on_connection(session) if self._on_connection is not None else None
        state.session_update = session_update
        answers = _Answers(writer, self._max_inflight)
        mute = _Mute()
        try:
            async with asyncio.TaskGroup() as tasks:
                deadline_task = None
                if state.sasl is not None:
                    deadline_task = tasks.create_task(self._authentication_deadline(state, deadline, peer))
                try:
                    await self._read_requests(connection, receiver, answers, tasks, peer, state, mute)
                finally:
                    # The peer is gone or done: no deadline left to keep (it
                    # would hold the connection open until it passed). The
                    # requests already accepted are answered as they end.
                    if deadline_task is not None:
                        deadline_task.cancel()
        except* _CloseConnection:
            pass
        except* (ConnectionError, OSError):
            pass
        finally:
            gone.set()
            if session_update is not None:
                session_update(None)

    def _close(self, writer: asyncio.StreamWriter, peer, reason: str) -> None:
        """Close one connection now (``Session.close_connection``): reading
        stops, answers not yet written are dropped, and the connection's
        tasks end as when a peer goes away (the handlers in flight finish)."""
        if writer.transport.is_closing():
            return
        log.info("closing connection from %s on %s: %s", peer, self.listener.name, reason)
        writer.transport.close()

    async def _authentication_deadline(self, state: _Connection, deadline: float, peer) -> None:
        try:
            async with asyncio.timeout_at(deadline):
                await state.authenticated.wait()
        except TimeoutError:
            log.warning("closing connection from %s on %s: not authenticated within the authentication timeout", peer, self.listener.name)
            raise _CloseConnection() from None

    async def _read_requests(self, connection, receiver: FrameReceiver, answers: _Answers, tasks, peer, state: _Connection, mute: _Mute) -> None:
        while True:
            await mute.wait()
            if not await receiver.arrived():  # the peer closed, or the connection broke
                state.peer_gone.set()
                return
            try:
                while True:
                    if state.raw_tokens:
                        # After a v0 SaslHandshake the tokens come as bare
                        # size-prefixed frames, without request headers
                        # (clients from before Kafka 1.0).
                        frame = connection.next_frame()
                        if frame is None:
                            break
                        body = {"auth_bytes": bytes(frame)}
                        reply = await self._sasl_receive(state, ApiKey.SASL_AUTHENTICATE, 0, body, peer)
                        if reply is None or reply.close:
                            return  # a v0 client learns of a refusal by the close
                        answer = reply.body["auth_bytes"] or b""
                        answers.add_frame(struct.pack(">i", len(answer)) + answer)
                        self._after_sasl(state, connection, ApiKey.SASL_AUTHENTICATE, peer)
                        continue
                    try:
                        request = connection.next_request()
                    except framing.UnsupportedRequestError as error:
                        answer = self._on_unsupported(error) if self._on_unsupported else None
                        if answer is None:
                            log.warning("closing connection from %s: %s", peer, error)
                            return  # answer what came before it, then close (as for a malformed frame)
                        answers.add_frame(answer)
                        continue
                    if request is None:
                        break
                    if state.sasl is not None and request.api_key in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
                        reply = await self._sasl_receive(state, request.api_key, request.api_version, request.body, peer)
                        if reply is None:
                            return
                        answers.add_frame(connection.encode_response(request, reply.body))
                        if reply.close:
                            await _linger(receiver)
                            return
                        if reply.body["error_code"]:
                            continue  # refused without a close (ILLEGAL_SASL_STATE): nothing changed
                        if request.api_key == ApiKey.SASL_HANDSHAKE and request.api_version == 0:
                            state.raw_tokens = True
                        self._after_sasl(state, connection, request.api_key, peer)
                        continue
                    if state.sasl is not None:
                        try:
                            state.sasl.receive(request.api_key, request.api_version, request.body, _now_ms())
                        except SaslRefusal as refusal:
                            log.warning("closing connection from %s on %s: %s", peer, self.listener.name, refusal)
                            return
                    await mute.wait()  # a request already read waits out a throttle too
                    await answers.wait_for_room()
                    answers.add_task(self._on_its_way(tasks.create_task(self._answer(connection, request, peer, state.session, mute)), request.api_key))
            except MalformedFrameError as error:
                log.warning("closing connection from %s: malformed request: %s", peer, error)
                # Answer what came before the bad frame, then close.
                return

    async def _sasl_receive(self, state: _Connection, api_key: int, version: int, body: dict, peer):
        """The SASL machine's reply, or None when the connection must close
        without one (logged either way when it closes)."""
        try:
            if api_key == ApiKey.SASL_AUTHENTICATE and state.sasl.mechanism == "PLAIN":
                # Checking a PLAIN password is a PBKDF2 (milliseconds of CPU):
                # off the loop, one at a time, so a flood of logins slows
                # logins only.
                reply = await asyncio.get_running_loop().run_in_executor(
                    self._password_checker, state.sasl.receive, api_key, version, body, _now_ms()
                )
            else:
                reply = state.sasl.receive(api_key, version, body, _now_ms())
        except SaslRefusal as refusal:
            log.warning("closing connection from %s on %s: %s", peer, self.listener.name, refusal)
            return None
        if reply is not None and reply.close:
            log.warning(
                "closing connection from %s on %s: SASL %s refused (%s)",
                peer, self.listener.name, state.sasl.mechanism or "handshake", reply.body.get("error_message") or f"error {reply.body['error_code']}",
            )
            # Kafka's connection.failed.authentication.delay.ms: a guesser
            # waits for each refusal.
            await asyncio.sleep(self._failed_authentication_delay)
        return reply

    def _after_sasl(self, state: _Connection, connection, api_key: int, peer) -> None:
        """What an accepted SASL step changes: on a finished login, the
        session (and the frame limit, and the authentication deadline)."""
        if api_key != ApiKey.SASL_AUTHENTICATE or state.sasl.state is not SaslState.AUTHENTICATED:
            return
        state.raw_tokens = False
        if state.session.principal == state.sasl.principal:
            log.info("connection from %s on %s re-authenticated as %s", peer, self.listener.name, state.sasl.principal)
            return
        state.session = attrs.evolve(state.session, principal=state.sasl.principal)
        if state.session_update is not None:
            state.session_update(state.session)
        connection.max_frame_size = self._max_frame_size
        state.authenticated.set()
        log.info("connection from %s on %s authenticated as %s (%s)", peer, self.listener.name, state.sasl.principal, state.sasl.mechanism)

    def _on_its_way(self, task: asyncio.Task, api_key: int) -> asyncio.Task:
        """A request that appends is on its way until its task starts (or
        ends unstarted). (No name in the reader's loop keeps the task, and
        with it the request's frame, alive after it is answered: that held a
        MiB-sized frame per connection, and new memory for the next one.)"""
        if self._arriving is not None and api_key in APPENDING_APIS:
            self._arriving.add(task)
            task.add_done_callback(self._arriving.discard)
        return task

    async def _answer(self, connection, request, peer, session, mute) -> list | None:
        if self._arriving is not None and request.api_key in APPENDING_APIS:
            self._arriving.discard(asyncio.current_task())  # started: no longer on its way
        try:
            body = await self._dispatch(request, session)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "handler for api %s v%s (correlation %s) from %s failed; closing the connection",
                request.api_key,
                request.api_version,
                request.correlation_id,
                peer,
            )
            raise _CloseConnection() from None
        if body is None:
            return None
        mute.throttled(body)
        return connection.encode_response_parts(request, body)


async def _linger(receiver: FrameReceiver) -> None:
    """Give a refused peer a moment to read its answer and close first: some
    clients (kafka-python) drop an answer that arrives with our close."""
    try:
        async with asyncio.timeout(_LINGER_AFTER_REFUSAL):
            while await receiver.arrived():
                receiver.framing.discard_buffered()  # nothing it sends now is served
    except (TimeoutError, ConnectionError, OSError):
        pass

