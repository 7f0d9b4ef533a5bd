"""One Kafka connection's asyncio protocol, on either side: the bytes the
socket reads land where the sans-I/O framing says (``ServerConnection`` or
``ClientConnection``'s ``receive_buffer``), a large frame straight into a
buffer of its own, allocated whole once its size is known, instead of being
read into a stream's buffer, copied out of it and gathered again. A task waits
in ``FrameReceiver.arrived`` and then takes whole frames from the framing.
Writes go through an ``asyncio.StreamWriter`` on the same protocol, with
asyncio's flow control (``drain``), and its ``start_tls`` upgrades the
connection in place (a broker's TLS listener).

What this module owns is the edge between asyncio's transport and the
framing: when to stop reading. A server's receiver (``pause_above``) stops
the transport once that many bytes wait uncut in the framing (requests read
ahead of a connection that is throttled or at its in-flight limit) and reads
again as soon as its task asks for more; a client's reads everything it is
sent (answers to its own requests).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol


class ReceivingFraming(Protocol):
    """What the receiver needs of the sans-I/O framing."""

    def receive_buffer(self) -> memoryview: ...

    def received(self, nbytes: int) -> None: ...

    @property
    def backlog_bytes(self) -> int: ...

    @property
    def has_whole_frame(self) -> bool: ...


class FrameReceiver(asyncio.BufferedProtocol):
    """One connection's protocol (see the module's doc).

    It keeps the writer's flow control itself (``pause_writing``,
    ``resume_writing``, ``_drain_helper``, as asyncio's ``FlowControlMixin``
    does): a class that is also an ``asyncio.Protocol``, as that mixin is,
    is fed through ``data_received`` by uvloop, not in place.

    ``on_connected(receiver, writer)``, when given, is called as the
    connection is made (a server's accepted connection: the writer is new);
    a client makes its writer itself from the transport and this receiver.
    ``server_side`` tells ``StreamWriter.start_tls`` which end of the
    handshake this is."""

    def __init__(
        self,
        framing: ReceivingFraming,
        *,
        pause_above: int | None = None,
        on_connected: Callable[["FrameReceiver", asyncio.StreamWriter], None] | None = None,
        server_side: bool = False,
        arriving: set | None = None,
    ):
        super().__init__()
        self.framing = framing
        # A set this receiver is in from a whole frame that came while its
        # task was waiting for bytes until the task has looked at them (a
        # broker's ``FsyncRounds.arriving``).
        self._arriving = arriving
        self._pause_above = pause_above
        self._on_connected = on_connected
        self._server_side = server_side
        # StreamWriter.start_tls reads this attribute (a StreamReaderProtocol's
        # callback) only to tell a server's end (not None) from a client's.
        self._client_connected_cb = on_connected if server_side else None
        self._transport: asyncio.BaseTransport | None = None
        self._over_tls = False
        self._paused_reading = False
        self._new_bytes = False
        self._ended = False
        self._waiter: asyncio.Future | None = None
        self._closed = asyncio.get_running_loop().create_future()
        self._writing_paused = False
        self._drain_waiters: list[asyncio.Future] = []
        self._lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        if self._on_connected is not None:
            loop = asyncio.get_running_loop()
            self._on_connected(self, asyncio.StreamWriter(transport, self, None, loop))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.framing.receive_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.framing.received(nbytes)
        self._new_bytes = True
        if self._arriving is not None and self._waiter is not None and not self._waiter.done() and self.framing.has_whole_frame:
            # A whole request, and its task waiting for it: taken at the
            # next turn. Part of a frame, or a task held elsewhere (a quota's
            # mute, the in-flight limit), is on its way to nothing soon.
            self._arriving.add(self)
        if self._pause_above is not None and not self._paused_reading and self.framing.backlog_bytes >= self._pause_above:
            self._paused_reading = True
            self._transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._ended = True
        self._wake()
        # A server answers what a peer sent before it closed its side (its
        # ConnectionServer closes the connection once they are answered);
        # TLS cannot stay half open, and a client has nothing left to say.
        return self._server_side and not self._over_tls

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._release_drains(None)

    async def _drain_helper(self) -> None:
        """What ``StreamWriter.drain`` waits for: room in the send buffer."""
        if self._lost:
            raise ConnectionResetError("Connection lost")
        if not self._writing_paused:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        try:
            await waiter
        finally:
            self._drain_waiters.remove(waiter)

    def _release_drains(self, exc: Exception | None) -> None:
        for waiter in self._drain_waiters:
            if not waiter.done():
                if exc is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._arriving is not None:
            self._arriving.discard(self)  # bytes its task will never look at
        if self._writing_paused:
            self._release_drains(exc)
        self._ended = True
        self._wake()
        if not self._closed.done():
            self._closed.set_result(None)

    def _get_close_waiter(self, stream) -> asyncio.Future:
        return self._closed  # StreamWriter.wait_closed

    def _replace_writer(self, writer: asyncio.StreamWriter) -> None:
        self._replace_transport(writer.transport)  # StreamWriter.start_tls (Python 3.11)

    def _replace_transport(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # StreamWriter.start_tls, from Python 3.12 on: reads now come through TLS
        self._over_tls = True

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def arrived(self) -> bool:
        """Once new bytes have come: True; False once the connection has
        ended. Asking means the caller has taken every whole frame it can:
        a paused transport reads again."""
        if self._paused_reading:
            self._paused_reading = False
            if not self._transport.is_closing():
                self._transport.resume_reading()
        while not self._new_bytes:
            if self._ended:
                return False
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        self._new_bytes = False
        if self._arriving is not None:
            self._arriving.discard(self)
        return True
