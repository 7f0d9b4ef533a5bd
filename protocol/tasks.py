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

Why it lives in ``protocol``: clients (``txn``), coordinators, the broker and
the fault harness all stop tasks, and ``protocol`` is the one room each of
them may import (DESIGN.md's table). It is not wire format; like
``protocol.clock`` it is a runtime primitive the whole house shares.
"""

from __future__ import annotations

import asyncio


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
