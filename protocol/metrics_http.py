"""A tiny HTTP/1.1 responder for a Prometheus scrape endpoint, on the caller's
event loop.

The broker and the streaming runner each serve ``GET /metrics`` with it
(``--metrics HOST:PORT``). It runs on the loop that owns the state the
metrics read, so a scrape reads that state between two steps of the loop,
never in the middle of one (no lock, no race with a request being handled).
What to send is the caller's: ``render()`` returns the exposition body
(``prometheus_client.generate_latest(registry)``); this module knows nothing
of Prometheus and imports only the standard library.

One request per connection (``Connection: close``). Peer input never breaks
the server: a request line or header block that is malformed, too long or
not finished within ``REQUEST_TIMEOUT`` gets 400 (or just a close), a method
other than GET/HEAD gets 405, any other path 404; an exception inside
``render`` is logged and answered 500. Every connection is a task of this
server's (``protocol.tasks.ConnectionServer``), cancelled and awaited by
``stop()``.

Why it lives in ``protocol``: the broker and the streaming runner both serve
it, and ``protocol`` is the one room both may import (DESIGN.md's table);
like ``protocol.tasks`` it is a runtime primitive, not wire format.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from protocol.tasks import ConnectionServer

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 16 * 1024
REQUEST_TIMEOUT = 10.0  # seconds for the whole request head
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error"}


class MetricsListenError(OSError):
    """The metrics endpoint could not bind its address."""


class MetricsEndpoint:
    """Serves ``render()`` at ``path`` on ``host:port`` (0: a free port)."""

    def __init__(self, render: Callable[[], bytes], *, host: str, port: int, content_type: str, path: str = "/metrics"):
        self._render = render
        self._content_type = content_type
        self._path = path
        self._address = f"{host}:{port}"
        self._server = ConnectionServer(self._serve_scraper, host=host, port=port, limit=MAX_HEADER_BYTES, name="metrics endpoint")

    @property
    def bound_port(self) -> int | None:
        return self._server.bound_port

    async def start(self) -> int:
        """Bind and listen; a bind failure raises ``MetricsListenError``
        here, to the caller, naming the address."""
        try:
            return await self._server.start()
        except OSError as error:
            raise MetricsListenError(error.errno, f"cannot serve metrics on {self._address}: {error.strerror or error}") from None

    async def stop(self) -> None:
        """Stop listening; every scrape under way is cancelled and closed."""
        await self._server.stop()

    async def _serve_scraper(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve(reader, writer)
        except (ConnectionError, OSError):
            pass  # the scraper went away

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            await self._respond(writer, 400, b"bad request: the request head must end with an empty line within 16 KiB and 10 s\n")
            return
        request_line = head.split(b"\r\n", 1)[0]
        parts = request_line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            await self._respond(writer, 400, b"bad request: expected 'METHOD /path HTTP/1.x'\n")
            return
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            await self._respond(writer, 405, b"only GET\n", extra=b"Allow: GET, HEAD\r\n")
            return
        if target != self._path.encode():
            await self._respond(writer, 404, f"not found: metrics are at {self._path}\n".encode(), head_only=method == b"HEAD")
            return
        try:
            body = self._render()
        except Exception:
            log.exception("metrics endpoint: rendering the metrics failed")
            await self._respond(writer, 500, b"rendering the metrics failed (see the log)\n")
            return
        await self._respond(writer, 200, body, content_type=self._content_type, head_only=method == b"HEAD")

    async def _respond(self, writer, status: int, body: bytes, *, content_type: str = "text/plain; charset=utf-8", extra: bytes = b"", head_only: bool = False) -> None:
        head = (
            f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n"
        ).encode() + extra + b"\r\n"
        writer.write(head if head_only else head + body)
        await writer.drain()


__all__ = ["MetricsEndpoint", "MetricsListenError"]
