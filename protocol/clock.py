"""The one clock: what time it is, for every room, replaceable in tests and
by the fault harness.

Two readings, because they answer different questions:

- ``wall_ms()``: Unix time in milliseconds, for times that are written down
  and compared after a restart or across processes (a transaction's start
  and last update in ``__transaction_state``, offset commit timestamps and
  their retention, a group's state timestamp, record batch timestamps);
- ``monotonic()``: seconds that never go back, for deadlines that live only
  in memory (session and rebalance timeouts), so that setting the machine's
  clock cannot expire every member at once.

The composition root (the broker) makes one ``Clock`` and passes it to the
coordinators; tests pass a ``ManualClock`` and move time themselves instead
of sleeping.

Why it lives in ``protocol``: the coordinators, the group coordinator, the
clients and the fault harness all need it, and ``protocol`` is the one room
every other room may import (DESIGN.md's table). Anywhere higher, one of
them would import upward. It is not wire format; like the task helper
(``protocol.tasks``) it is a runtime primitive the whole house shares.
"""

from __future__ import annotations

import time

import attrs


@attrs.define
class Clock:
    """The machine's clocks."""

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


@attrs.define
class ManualClock(Clock):
    """A clock that moves only when told to (``advance``); both readings
    move together."""

    wall_time_ms: int = 1_700_000_000_000
    monotonic_time: float = 1000.0

    def wall_ms(self) -> int:
        return self.wall_time_ms

    def monotonic(self) -> float:
        return self.monotonic_time

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        self.monotonic_time += seconds
        self.wall_time_ms += round(seconds * 1000)
