"""How the runner tries again after the broker failed it (a poll, a rewind,
a store restore): ``retry`` is its one retry loop, ``RetryDelay`` the wait
between tries, short at first, so a broker that is back is picked up within
tens of milliseconds, doubling up to a cap, so a broker that stays down is
not asked in a busy loop. The clients' own retries (``txn.cluster``) follow
the same shape: 20 ms doubling, 250 ms for connections."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, TypeVar

import attrs

from txn.errors import TRANSIENT_ERRORS

T = TypeVar("T")


@attrs.define
class RetryDelay:
    """The delay before the next try of one operation: ``first`` seconds after
    a first failure, doubled after each further failure up to ``cap``, back to
    ``first`` after a success (``reset``)."""

    first: float = 0.02
    cap: float = 0.25
    failures: int = 0

    def next(self) -> float:
        """The delay to wait now that the operation failed (again)."""
        delay = min(self.first * 2**self.failures, self.cap)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0


async def retry(operation: Callable[[], Awaitable[T]], *, what: str, stopping: Callable[[], bool], log: logging.Logger, delay: RetryDelay | None = None) -> T:
    """``await operation()`` until it returns, waiting ``delay`` after each
    try that fails with a ``txn.errors.TRANSIENT_ERRORS`` error; if ``stopping()`` after that
    wait, the error is raised instead (the poll passes ``lambda: True``: its
    caller's loop checks commits, progress and idleness between tries).
    Logged at WARNING once per outage (then DEBUG: a broker that stays down
    would otherwise fill the log)."""
    delay = delay if delay is not None else RetryDelay()
    while True:
        try:
            result = await operation()
        except TRANSIENT_ERRORS as error:
            (log.warning if not delay.failures else log.debug)("%s failed (%s); trying again", what, error)
            await asyncio.sleep(delay.next())
            if stopping():
                raise
            continue
        delay.reset()
        return result
