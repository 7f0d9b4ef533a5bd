"""How long the runner waits before trying again after the broker failed it
(a poll, a rewind, a store restore): short at first, so a broker that is back
is picked up within tens of milliseconds, doubling up to a cap, so a broker
that stays down is not asked in a busy loop. The clients' own retries
(``txn.cluster``) follow the same shape: 20 ms doubling, 250 ms for
connections."""

from __future__ import annotations

import attrs


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
