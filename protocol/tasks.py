"""Stopping background tasks: one way, used by broker, coordinators, clients
and the fault harness.

Every task has one owner, which stops it before it stops itself (trio's
rule: nothing is left pending when its owner closes). The broker's owner is
an ``asyncio.TaskGroup``; an object with ``start()``/``close()`` rather than
a scope (a client, a coordinator) keeps its tasks and, on close, calls
``cancel_and_wait`` on them. Three rules hold here, so they hold everywhere:

- the tasks are cancelled and waited for until each has finished (cleanup
  in their ``finally`` blocks has run);
- their own ``CancelledError`` ends here, but the caller's never does: if
  the caller is cancelled while it waits, that cancellation propagates (the
  tasks were told to stop and finish on their own);
- a task that had failed (before it saw the cancellation) raises its error
  here, in the owner: one failure as itself, several as an ExceptionGroup.
  An owner that expects failures says so where it calls.

``OwnedWork`` is the owner such an object keeps for work that must run to
its end once started whoever asked for it: a coordinator's state change
(write a record, then apply it) is started by a request, but a request
whose connection dies is cancelled, and a change cut between its write and
its apply leaves memory behind the disk. The request awaits the work
through ``asyncio.shield``: cancelled, it loses only its answer.

``ConnectionServer`` is the owner for a TCP listener's connections: each
connection is a task of ``asyncio.start_server``'s (or, for a server whose
connections are read in place, ``protocol.frame_stream.FrameReceiver``'s,
made by ``new_receiver``), which the server keeps and ``stop()`` cancels and
waits for. A stopping server aborts its
connections (no goodbyes), and a closing one waits at most
``CLOSE_TIMEOUT`` for the peer (a TLS close waits for its close_notify,
30 s by asyncio's default).

Why it lives in ``protocol``: clients (``txn``), coordinators, the broker and
the fault harness all stop tasks, and ``protocol`` is the one room each of
them may import (DESIGN.md's table). It is not wire format; like
``protocol.clock`` it is a runtime primitive the whole house shares.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


async def every(interval: float, step: Callable[[], Awaitable[Any]], name: str) -> None:
    """Await ``step()`` every ``interval`` seconds (the first after one
    interval) until cancelled: the periodic loop of the house, run by an
    owner that cancels it (the broker's TaskGroup). A step that fails is
    logged as ``<name> failed`` and the next one still runs on time."""
    while True:
        await asyncio.sleep(interval)
        try:
            await step()
        except Exception:
            log.exception("%s failed", name)


async def cancel_and_wait(*tasks: asyncio.Future | None) -> None:
    """Cancel ``tasks`` (None entries are skipped) and wait until all have finished."""
    pending = [task for task in tasks if task is not None]
    if not pending:
        return
    for task in pending:
        task.cancel()
    # asyncio.wait never raises the tasks' outcomes, so a CancelledError out
    # of it can only be the caller's own: it propagates.
    await asyncio.wait(pending)
    failures = [task.exception() for task in pending if not task.cancelled() and task.exception() is not None]
    if len(failures) == 1:
        raise failures[0]
    if failures:
        raise BaseExceptionGroup("background tasks failed", failures)


class OwnedWork:
    """The tasks one object owns (it has ``close()``, not a scope): each is
    started here, runs to its end unless the owner closes, and is waited for
    by ``close()`` (``cancel_and_wait``)."""

    def __init__(self, owner: str):
        self._owner = owner  # named in the log when a task fails unseen
        self._tasks: set[asyncio.Task] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, work: Coroutine[Any, Any, T]) -> "asyncio.Task[T]":
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    async def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Start ``work`` and wait for its result. A caller cancelled while
        it waits loses only the result: the work goes on to its end."""
        return await asyncio.shield(self.start(work))

    def _finished(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        # Whoever started it may be gone (cancelled): a failure is logged
        # here so that it is never lost.
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: owned task failed", self._owner, exc_info=task.exception())

    async def wait(self) -> None:
        """Until every task started so far, and any they started, has finished."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def close(self) -> None:
        await cancel_and_wait(*self._tasks)


# How long a closing connection may wait for its peer (a TLS close_notify).
CLOSE_TIMEOUT = 2.0


# Connections the kernel holds for a listener not accepting yet (asyncio's default).
LISTEN_BACKLOG = 100


def listening_socket(host: str, port: int) -> socket.socket | None:
    """A TCP socket bound to ``host:port`` and listening, for a
    ``ConnectionServer`` to serve later (``sock=``): a process can listen
    before its slow start-up (imports, recovery), and connections made
    meanwhile wait in the backlog. None when ``host`` resolves to more than
    one address (the server binds each itself). A bind failure raises OSError."""
    found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    addresses = {(family, address) for family, _type, _proto, _name, address in found}
    if len(addresses) != 1:
        return None
    [(family, address)] = addresses
    # IPPROTO_TCP, not 0: asyncio turns Nagle off (TCP_NODELAY) only on
    # accepted sockets whose protocol says TCP, as its own binds do.
    listening = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            listening.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        listening.bind(address)
        listening.listen(LISTEN_BACKLOG)
        listening.setblocking(False)
    except OSError:
        listening.close()
        raise
    return listening


class ConnectionServer:
    """A TCP listener that owns the task of every connection it accepts:
    ``start()`` binds and listens (a bind failure raises to the caller;
    ``listen()`` does that part alone, earlier),
    ``stop()`` stops listening, then cancels every connection and waits
    until each has closed. ``serve(reader, writer)`` is the caller's: one
    connection from start to end (peer errors are its to handle); the
    writer is closed here once it returns. With ``new_receiver`` each
    connection is that protocol (``new_receiver(on_connected)`` makes one
    that calls ``on_connected(receiver, writer)`` as its connection is
    made), and ``serve`` gets it in the reader's place."""

    def __init__(
        self, serve: Callable[[Any, asyncio.StreamWriter], Awaitable[None]], *, host: str, port: int, limit: int, name: str,
        sock: socket.socket | None = None,
        new_receiver: Callable[[Callable[[Any, asyncio.StreamWriter], None]], asyncio.BaseProtocol] | None = None,
    ):
        self._serve = serve
        self._new_receiver = new_receiver
        self._sock = sock  # already bound and listening (``listening_socket``): used instead of host and port
        self._host = host
        self._port = port
        self._limit = limit  # the StreamReader's buffer: the longest line or frame head it reads
        self._name = name  # named in the log when serving a connection fails
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task] = set()
        self.bound_port: int | None = None

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    async def listen(self) -> int:
        """Bind and listen without accepting yet: a connection that arrives
        meanwhile is established by the kernel and waits in the backlog,
        with whatever it sends, until ``start()`` (where a port that is not
        listening would refuse it). Returns the bound port."""
        if self._server is None:
            where = {"sock": self._sock} if self._sock is not None else {"host": self._host, "port": self._port, "reuse_address": True}
            if self._new_receiver is not None:
                self._server = await asyncio.get_running_loop().create_server(
                    lambda: self._new_receiver(self._connected), **where, backlog=LISTEN_BACKLOG, start_serving=False
                )
            else:
                self._server = await asyncio.start_server(self._accept, **where, limit=self._limit, backlog=LISTEN_BACKLOG, start_serving=False)
            for bound in self._server.sockets:
                # asyncio listens only when it starts serving; listen now
                # (through a duplicate of the socket's descriptor).
                with socket.fromfd(bound.fileno(), bound.family, bound.type) as listening:
                    listening.listen(LISTEN_BACKLOG)
            self.bound_port = self._server.sockets[0].getsockname()[1]
        return self.bound_port

    async def start(self) -> int:
        """Accept and serve (binding first unless ``listen()`` did)."""
        await self.listen()
        await self._server.start_serving()
        return self.bound_port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await cancel_and_wait(*self._connections)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def _connected(self, receiver, writer: asyncio.StreamWriter) -> None:
        self._connections.add(asyncio.get_running_loop().create_task(self._accept(receiver, writer)))

    async def _accept(self, reader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        stopping = False
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            # stop() cancelled this connection. This is the top of the task
            # (nobody above waits to be cancelled) and it must end normally:
            # start_server's done-callback calls task.exception(), which
            # raises on a cancelled task and is logged as an error.
            stopping = True
        except Exception:  # a bug on our side: log it, lose only this connection
            log.exception("%s: serving %s failed", self._name, writer.get_extra_info("peername"))
        finally:
            self._connections.discard(task)
            if stopping:
                writer.transport.abort()  # the server stops: no goodbyes
            writer.close()
            try:
                # A peer that never answers a TLS close must not hold up stop().
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await writer.wait_closed()
            except TimeoutError:
                writer.transport.abort()
            except (OSError, asyncio.CancelledError):
                pass  # the same top of the task: closing is all that is left
