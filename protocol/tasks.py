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

Why it lives in ``protocol``: clients (``txn``), coordinators, the broker and
the fault harness all stop tasks, and ``protocol`` is the one room each of
them may import (DESIGN.md's table). It is not wire format; like
``protocol.clock`` it is a runtime primitive the whole house shares.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Coroutine, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


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
