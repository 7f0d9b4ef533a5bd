"""The network edge: an asyncio TCP listener that feeds frames to the request
handlers and writes their responses back, in order, per connection.

Each connection owns one ``asyncio.TaskGroup``: a reader that turns bytes
into requests (through the sans-I/O ``protocol.framing.ServerConnection``),
one task per request so that a long-polling Fetch or a Produce waiting for its
fsync does not hold up decoding, and a writer that sends the responses in the
order the requests arrived (Kafka clients pipeline and match by order as well
as by correlation id). The number of requests in flight per connection is
bounded, so a client that never reads its responses stops being read from
instead of growing our memory.

No peer input crashes the process: a frame that cannot be decoded closes that
connection (logged), an unsupported ApiVersions version is answered with
UNSUPPORTED_VERSION as Kafka does, and an exception inside a handler is logged
and closes only that connection.

A response with ``throttle_time_ms`` > 0 (a client over its quota,
``broker.security.quotas``) mutes its connection for that long, as Kafka
does (KIP-219): no further request of it is read or started until then,
whether or not the client honours the field.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

import attrs

from broker.security.session import Session
from protocol import framing
from protocol.errors import MalformedFrameError
from protocol.tasks import cancel_and_wait

log = logging.getLogger(__name__)

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
    ):
        self._dispatch = dispatch
        self._host = host
        self._port = port
        self._max_frame_size = max_frame_size
        self._max_inflight = max_inflight_per_connection
        self._on_unsupported = on_unsupported
        # What ApiVersions advertises is all the framing lets through (None:
        # every version the schema tables know, for tests of the server alone).
        self._supported_versions = supported_versions
        self._on_connection = on_connection
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self.bound_port: int | None = None

    @property
    def open_connections(self) -> int:
        """Connections being served now (a closed one counts until its
        in-flight requests have been answered or cancelled)."""
        return len(self._connections)

    async def start(self) -> int:
        """Bind and listen; a bind failure raises here, to the caller."""
        self._server = await asyncio.start_server(
            self._accept, self._host, self._port, reuse_address=True, limit=1 << 20
        )
        self.bound_port = self._server.sockets[0].getsockname()[1]
        return self.bound_port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        # The connection tasks are asyncio.start_server's; this server owns them.
        await cancel_and_wait(*self._connections)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        try:
            await self._serve(reader, writer, peer)
        except asyncio.CancelledError:
            # stop() cancelled this connection. This is the top of the task
            # (nobody above waits to be cancelled) and it must end normally:
            # start_server's done-callback calls task.exception(), which
            # raises on a cancelled task and is logged as an error.
            pass
        except Exception:  # a bug on our side: log it, lose only this connection
            log.exception("connection from %s failed", peer)
        finally:
            self._connections.discard(task)
            writer.close()
            try:
                await writer.wait_closed()
            except (OSError, asyncio.CancelledError):
                pass  # the same top of the task: closing is all that is left

    async def _serve(self, reader, writer, peer) -> None:
        connection = framing.ServerConnection(max_frame_size=self._max_frame_size, supported_versions=self._supported_versions)
        session = Session(client_host=peer[0] if isinstance(peer, tuple) and peer else "")
        session_update = self._on_connection(session) if self._on_connection is not None else None
        pending: asyncio.Queue = asyncio.Queue(maxsize=self._max_inflight)
        mute = _Mute()
        try:
            async with asyncio.TaskGroup() as tasks:
                writer_task = tasks.create_task(self._write_responses(connection, pending, writer, peer))
                try:
                    await self._read_requests(connection, reader, pending, tasks, peer, session, mute)
                finally:
                    # Let the writer finish what was already accepted, then stop it.
                    if not writer_task.done():
                        await pending.put(None)
        except* _CloseConnection:
            pass
        except* (ConnectionError, OSError):
            pass
        finally:
            if session_update is not None:
                session_update(None)

    async def _read_requests(self, connection, reader, pending, tasks, peer, session, mute) -> None:
        while True:
            await mute.wait()
            try:
                data = await reader.read(256 * 1024)
            except (ConnectionError, OSError):
                return
            if not data:
                return
            try:
                connection.receive_data(data)
                while True:
                    try:
                        request = connection.next_request()
                    except framing.UnsupportedRequestError as error:
                        answer = self._on_unsupported(error) if self._on_unsupported else None
                        if answer is None:
                            log.warning("closing connection from %s: %s", peer, error)
                            raise _CloseConnection() from None
                        await pending.put(_ready(answer))
                        continue
                    if request is None:
                        break
                    await mute.wait()  # a request already read waits out a throttle too
                    await pending.put(tasks.create_task(self._answer(connection, request, peer, session, mute)))
            except MalformedFrameError as error:
                log.warning("closing connection from %s: malformed request: %s", peer, error)
                # Answer what came before the bad frame, then close.
                return

    async def _answer(self, connection, request, peer, session, mute) -> bytes | None:
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
        return connection.encode_response(request, body)

    async def _write_responses(self, connection, pending, writer, peer) -> None:
        while True:
            item = await pending.get()
            if item is None:
                return
            frame = await item
            item = None
            if frame is None:
                continue
            # A memoryview, so a partial send keeps the rest without slicing a
            # copy; no reference is held past the write, so a large Fetch
            # answer is freed as soon as the transport has sent it.
            writer.write(memoryview(frame))
            frame = None
            await writer.drain()


def _ready(frame: bytes) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    future.set_result(frame)
    return future
