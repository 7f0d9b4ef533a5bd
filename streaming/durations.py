"""Durations, in one unit: every duration the streaming API takes (window
sizes, advances, grace, session gaps, timer intervals, the test driver's
clock) is a ``datetime.timedelta`` or a number of **milliseconds**, the
unit of every record timestamp. ``milliseconds()`` turns either into an int."""

from __future__ import annotations

import datetime


def milliseconds(duration, what: str = "a duration", *, positive: bool = False) -> int:
    """``duration`` (a timedelta, or milliseconds) as whole milliseconds;
    ``positive`` refuses zero and below, else only below zero is refused."""
    if isinstance(duration, datetime.timedelta):
        ms = round(duration.total_seconds() * 1000)
    elif isinstance(duration, bool) or not isinstance(duration, (int, float)):
        raise TypeError(f"{what} is a timedelta or a number of milliseconds, not {duration!r}")
    else:
        ms = round(duration)
    if ms < 0 or (positive and ms == 0):
        raise ValueError(f"{what} must be {'positive' if positive else '>= 0'} (got {duration!r}, {ms} ms)")
    return ms
