"""Event-time windows, sans I/O: which windows a timestamp falls in, when a
window closes, and a windowed aggregation that keeps its state in anything
store-shaped (``get``/``put``/``delete``/``items``), so the dataflow layer
runs it on a changelogged state store and the tests on a dict.

Windows are aligned to the epoch, in milliseconds, like Kafka Streams'
``TimeWindows`` (sizes are given as a ``timedelta`` or in milliseconds, see
``streaming.durations``): a window of ``size`` advancing by ``advance`` covers
``[start, start + size)`` for every ``start`` that is a multiple of
``advance`` (tumbling: ``advance == size``; hopping: ``advance < size``, so
a timestamp falls in ``ceil(size / advance)`` windows). Negative starts are
skipped. Session windows (``session``) and sliding windows (``sliding``,
placed by the records themselves) follow below, on the same stream time.

Time is stream time, never the wall clock: the highest event time seen so
far on the input partition (kept in the state under ``STREAM_TIME``, so a
restart or a rewind to the last commit gets the value that goes with the
rest of the state). A window closes when stream time reaches
``end + grace``; then its final result is emitted and its state deleted. A
record is added to each of its windows that is still open; a record that
misses at least one of its windows because it closed is *late* (the caller
counts it: ``late_records_dropped``).

State layout (keys are tuples or strings, values JSON):

| key | value |
| --- | --- |
| ``"stream-time"`` | the highest event time seen (ms) |
| ``"next-close"`` | the earliest close time (end + grace) of an open window, absent when none is open |
| ``("w", start, key)`` | ``[aggregate, highest timestamp of a record in the window]`` |

``next-close`` makes the common record cheap: only when stream time passes
it is the state scanned for the windows to close.
"""

from __future__ import annotations

import bisect
from typing import Any, Callable, Iterable, Protocol

import attrs

from streaming.durations import milliseconds

STREAM_TIME = "stream-time"
NEXT_CLOSE = "next-close"
WINDOW_TAG = "w"


class StateLike(Protocol):
    def get(self, key, default=None): ...
    def put(self, key, value) -> None: ...
    def delete(self, key) -> None: ...
    def items(self) -> Iterable[tuple[Any, Any]]: ...


@attrs.frozen
class Windows:
    """A window definition in milliseconds (build it with ``tumbling`` or ``hopping``)."""

    size_ms: int = attrs.field(validator=attrs.validators.gt(0))
    advance_ms: int = attrs.field(validator=attrs.validators.gt(0))

    def __attrs_post_init__(self) -> None:
        if self.advance_ms > self.size_ms:
            raise ValueError(f"a window cannot advance ({self.advance_ms} ms) by more than its size ({self.size_ms} ms): records would fall in no window")

    def starts_containing(self, timestamp: int) -> list[int]:
        """Starts of the windows ``[start, start + size)`` holding ``timestamp``, ascending."""
        if timestamp < 0:
            raise ValueError(f"event time must be >= 0 ms (got {timestamp})")
        last = timestamp - timestamp % self.advance_ms
        first = max(0, timestamp - self.size_ms + 1)
        # The smallest multiple of advance >= first.
        first = -(-first // self.advance_ms) * self.advance_ms
        return list(range(first, last + 1, self.advance_ms))

    def end(self, start: int) -> int:
        return start + self.size_ms


def tumbling(size) -> Windows:
    """Back-to-back windows of ``size`` (a timedelta or milliseconds): every record is in exactly one."""
    size_ms = milliseconds(size, "a window's size", positive=True)
    return Windows(size_ms, size_ms)


def hopping(size, advance) -> Windows:
    """Windows of ``size`` starting every ``advance`` (timedeltas or
    milliseconds), overlapping when advance < size."""
    return Windows(milliseconds(size, "a window's size", positive=True), milliseconds(advance, "a window's advance", positive=True))


def close_time(windows: Windows, grace_ms: int, start: int) -> int:
    """The stream time at which the window starting at ``start`` closes."""
    return windows.end(start) + grace_ms


def is_closed(windows: Windows, grace_ms: int, start: int, stream_time: int | None) -> bool:
    return stream_time is not None and stream_time >= close_time(windows, grace_ms, start)


@attrs.frozen
class WindowResult:
    """One window's aggregate for one key; ``timestamp`` is the highest event
    time of a record in it (what the emitted record carries)."""

    key: Any
    start: int
    end: int
    aggregate: Any
    timestamp: int

    def as_value(self) -> dict:
        """What the dataflow layer emits as the record's value."""
        return {"start": self.start, "end": self.end, "value": self.aggregate}


@attrs.frozen
class Update:
    """What one record did: the windows it changed, and whether it was late for any."""

    changed: tuple[WindowResult, ...]
    late: bool


FIRST_VALUE = None  # ``initial`` for a reduce: a window's first value is its aggregate


def _window_key(key) -> tuple | None:
    """(start, user key) if ``key`` is a window entry's key (tuples may come back as lists)."""
    if isinstance(key, (tuple, list)) and len(key) == 3 and key[0] == WINDOW_TAG:
        user_key = key[2]
        return key[1], tuple(user_key) if isinstance(user_key, list) else user_key
    return None


def _reaches_next_close(state: StateLike, timestamp: int) -> bool:
    """Stream time moves to ``timestamp`` if that is later; True when it
    reaches ``next-close`` (some window is due to close: scan for it)."""
    stream_time = state.get(STREAM_TIME)
    if stream_time is not None and timestamp <= stream_time:
        return False
    state.put(STREAM_TIME, timestamp)
    next_close = state.get(NEXT_CLOSE)
    return next_close is not None and timestamp >= next_close


def _keep_next_close(state: StateLike, next_close: int | None) -> None:
    if next_close is None:
        state.delete(NEXT_CLOSE)
    else:
        state.put(NEXT_CLOSE, next_close)


def _close_windows(state: StateLike, timestamp: int, closes_at: Callable[[int], int], end: Callable[[int], int]) -> list[WindowResult]:
    """Delete and return (in start order) the ``("w", start, key)`` windows
    that close at or before ``timestamp``; ``next-close`` becomes the
    earliest close of those left."""
    closed: list[WindowResult] = []
    remaining_next: int | None = None
    for key, entry in list(state.items()):
        window = _window_key(key)
        if window is None:
            continue
        start, user_key = window
        closing = closes_at(start)
        if closing <= timestamp:
            state.delete(key)
            closed.append(WindowResult(user_key, start, end(start), entry[0], entry[1]))
        elif remaining_next is None or closing < remaining_next:
            remaining_next = closing
    _keep_next_close(state, remaining_next)
    # Stable: keys of one start keep the store's (deterministic) order.
    return sorted(closed, key=lambda result: result.start)


@attrs.frozen
class WindowedAggregation:
    """Aggregate per (key, window) over event time; ``initial()`` starts a
    window's aggregate (``None``: the first value is the aggregate, as in a
    reduce) and ``add(aggregate, value)`` folds a value in."""

    windows: Windows
    grace_ms: int = attrs.field(validator=attrs.validators.ge(0))
    add: Callable[[Any, Any], Any]
    initial: Callable[[], Any] | None = FIRST_VALUE

    def advance(self, state: StateLike, timestamp: int) -> list[WindowResult]:
        """Stream time moves to ``timestamp`` if that is later; returns the
        windows this closes (in start order), whose state is deleted."""
        if not _reaches_next_close(state, timestamp):
            return []
        return _close_windows(state, timestamp, lambda start: close_time(self.windows, self.grace_ms, start), self.windows.end)

    def update(self, state: StateLike, key, value, timestamp: int) -> Update:
        """Fold one record into each of its windows still open (call
        ``advance`` with its timestamp first)."""
        stream_time = state.get(STREAM_TIME)
        changed: list[WindowResult] = []
        late = False
        next_close = state.get(NEXT_CLOSE)
        for start in self.windows.starts_containing(timestamp):
            if is_closed(self.windows, self.grace_ms, start, stream_time):
                late = True
                continue
            entry_key = (WINDOW_TAG, start, key)
            entry = state.get(entry_key)
            if entry is None:
                aggregate = value if self.initial is FIRST_VALUE else self.add(self.initial(), value)
                highest = timestamp
                closes_at = close_time(self.windows, self.grace_ms, start)
                if next_close is None or closes_at < next_close:
                    next_close = closes_at
                    state.put(NEXT_CLOSE, next_close)
            else:
                aggregate = self.add(entry[0], value)
                highest = max(entry[1], timestamp)
            state.put(entry_key, [aggregate, highest])
            changed.append(WindowResult(key, start, self.windows.end(start), aggregate, highest))
        return Update(tuple(changed), late)


# -- session windows -----------------------------------------------------------------------------------

SESSION_TAG = "s"


@attrs.frozen
class SessionWindows:
    """Sessions of activity per key: records less than ``gap_ms`` apart
    (in event time) belong to one session (build it with ``session``)."""

    gap_ms: int = attrs.field(validator=attrs.validators.gt(0))


def session(gap) -> SessionWindows:
    """Session windows that end after ``gap`` (a timedelta or milliseconds) without a record of the key."""
    return SessionWindows(milliseconds(gap, "a session's inactivity gap", positive=True))


def _session_key(key):
    """The user key if ``key`` is a session entry's key (tuples may come back as lists)."""
    if isinstance(key, (tuple, list)) and len(key) == 2 and key[0] == SESSION_TAG:
        user_key = key[1]
        return tuple(user_key) if isinstance(user_key, list) else user_key
    return None


@attrs.frozen
class SessionAggregation:
    """Aggregate per (key, session) over event time, like Kafka Streams'
    ``SessionWindows``: a record within ``gap`` of a key's open session
    extends it; one that bridges two sessions merges them (their aggregates
    combined with ``merge(earlier, later)``). A session is ``[start, end]``
    with ``end`` the event time of its last record (inclusive); it closes,
    and is emitted and forgotten, when stream time reaches ``end + gap +
    grace``: no record in time could extend it any more. A record that
    would start (or extend) only sessions already closed is late.

    State: ``("s", key)`` -> the key's open sessions, ``[[start, end,
    aggregate, highest timestamp], ...]`` in start order, plus the shared
    ``stream-time`` and ``next-close`` entries."""

    windows: SessionWindows
    grace_ms: int = attrs.field(validator=attrs.validators.ge(0))
    add: Callable[[Any, Any], Any]
    merge: Callable[[Any, Any], Any]
    initial: Callable[[], Any] | None = FIRST_VALUE

    def close_time(self, end: int) -> int:
        return end + self.windows.gap_ms + self.grace_ms

    def advance(self, state: StateLike, timestamp: int) -> list[WindowResult]:
        """Stream time moves to ``timestamp`` if later; returns the sessions
        this closes (in start order), whose state is deleted."""
        if not _reaches_next_close(state, timestamp):
            return []
        closed: list[WindowResult] = []
        remaining_next: int | None = None
        for key, sessions in list(state.items()):
            user_key = _session_key(key)
            if user_key is None:
                continue
            still_open = []
            for start, end, aggregate, highest in sessions:
                if self.close_time(end) <= timestamp:
                    closed.append(WindowResult(user_key, start, end, aggregate, highest))
                else:
                    still_open.append([start, end, aggregate, highest])
                    remaining_next = self.close_time(end) if remaining_next is None else min(remaining_next, self.close_time(end))
            if len(still_open) != len(sessions):
                if still_open:
                    state.put(key, still_open)
                else:
                    state.delete(key)
        _keep_next_close(state, remaining_next)
        return sorted(closed, key=lambda result: result.start)

    def update(self, state: StateLike, key, value, timestamp: int) -> Update:
        """Fold one record into its key's sessions (call ``advance`` with its
        timestamp first); the session it is now part of, or late."""
        gap = self.windows.gap_ms
        entry_key = (SESSION_TAG, key)
        sessions = state.get(entry_key) or []
        touching = [s for s in sessions if s[0] - gap <= timestamp <= s[1] + gap]
        stream_time = state.get(STREAM_TIME)
        if not touching and stream_time is not None and self.close_time(timestamp) <= stream_time:
            return Update((), True)
        aggregate = None
        for session_entry in touching:  # in start order: merge(earlier, later)
            aggregate = session_entry[2] if aggregate is None else self.merge(aggregate, session_entry[2])
        if aggregate is None:
            aggregate = value if self.initial is FIRST_VALUE else self.add(self.initial(), value)
        else:
            aggregate = self.add(aggregate, value)
        start = min([timestamp] + [s[0] for s in touching])
        end = max([timestamp] + [s[1] for s in touching])
        highest = max([timestamp] + [s[3] for s in touching])
        merged = [start, end, aggregate, highest]
        kept = [s for s in sessions if s not in touching] + [merged]
        kept.sort(key=lambda s: s[0])
        state.put(entry_key, kept)
        next_close = state.get(NEXT_CLOSE)
        if next_close is None or self.close_time(end) < next_close:
            state.put(NEXT_CLOSE, self.close_time(end))
        return Update((WindowResult(key, start, end, aggregate, highest),), False)


# -- sliding windows -----------------------------------------------------------------------------------

RECORDS_TAG = "r"
SCHEDULE_TAG = "due"
_CLOSE_WINDOW, _EXPIRE_RECORDS = 0, 1  # what a schedule entry does when due


def _schedule_order(entry: list) -> tuple[int, int, int]:
    """[due time, what, window start, key]: by time, then what, then start (never by key, whose types may not compare)."""
    return entry[0], entry[1], entry[2]


@attrs.frozen
class SlidingWindows:
    """Windows of a fixed length that the records place (build it with
    ``sliding``): two records share a window when their event times are at
    most ``difference_ms`` apart."""

    difference_ms: int = attrs.field(validator=attrs.validators.gt(0))

    def end(self, start: int) -> int:
        """The window's last millisecond (inclusive, as in Kafka Streams)."""
        return start + self.difference_ms


def sliding(difference) -> SlidingWindows:
    """Sliding windows of ``difference`` (a timedelta or milliseconds), like Kafka Streams' ``SlidingWindows``."""
    return SlidingWindows(milliseconds(difference, "a sliding window's time difference", positive=True))


@attrs.frozen
class SlidingAggregation:
    """Aggregate per (key, window) over sliding windows, with Kafka Streams'
    ``SlidingWindows`` semantics. Every window is ``[start, start + d]``
    (both ends inclusive, ``d`` the time difference) and exists because of
    a record: a record at ``t`` has its *left* window ``[t - d, t]``, and a
    *right* window ``[t + 1, t + 1 + d]`` as soon as a record of its key
    falls there. So each distinct set of records that fit within ``d`` of
    each other is one window, and only those: unlike a hopping window of
    advance 1 ms, no window is empty or repeats its neighbour. A window's
    aggregate is its records folded in arrival order. Starts may be
    negative (Kafka Streams, which cannot, clamps early records' windows
    to ``[0, d]`` instead).

    A window closes, and is emitted and forgotten, when stream time passes
    its end + grace (``start + d + grace + 1``). A record whose own left
    window has closed (stream time above ``t + grace``) is late and
    changes nothing.

    State: ``("w", start, key)`` -> ``[aggregate, highest timestamp]`` as
    for time windows; ``("r", key)`` -> the key's records still able to
    fall in a window not yet made, ``[[timestamp, value], ...]`` in arrival
    order (a record is kept until stream time passes ``t + d + grace``);
    and ``("due", n)`` -> what falls due in the n-th stretch of
    ``(d + grace + 1) // 16`` ms, ``[[time, 0, start, key]`` (close that
    window) or ``[time, 1, 0, key]`` (forget that key's expired
    records)``, ...]`` in time order, with ``next-close`` the first time
    of all: closing reads the due stretches, never the whole state."""

    windows: SlidingWindows
    grace_ms: int = attrs.field(validator=attrs.validators.ge(0))
    add: Callable[[Any, Any], Any]
    initial: Callable[[], Any] | None = FIRST_VALUE

    def close_time(self, start: int) -> int:
        return self.windows.end(start) + self.grace_ms + 1

    def _still_needed(self, timestamp: int, stream_time: int | None) -> bool:
        return stream_time is None or timestamp + self.windows.difference_ms + self.grace_ms >= stream_time

    def advance(self, state: StateLike, timestamp: int) -> list[WindowResult]:
        """Stream time moves to ``timestamp`` if later; returns the windows
        this closes (in start order), whose state is deleted, and forgets
        the records no window to come can hold. Reads only the schedule's
        due entries, never the whole state: sliding windows close at almost
        every record of a busy stream."""
        before = state.get(STREAM_TIME)
        if not _reaches_next_close(state, timestamp):
            return []
        size = self._bucket_ms()
        # Every entry was scheduled at a stream time <= before, hence falls due by this.
        latest_due = before + self.windows.difference_ms + self.grace_ms + 2
        closed: list[WindowResult] = []
        next_close = None
        for bucket in range(state.get(NEXT_CLOSE) // size, latest_due // size + 1):
            if next_close is not None:
                break
            bucket_key = (SCHEDULE_TAG, bucket)
            entries = state.get(bucket_key)
            if not entries:
                continue
            cut = bisect.bisect_right(entries, timestamp, key=lambda entry: entry[0])
            for _due, kind, start, key in entries[:cut]:
                self._fall_due(state, timestamp, kind, start, tuple(key) if isinstance(key, list) else key, closed)
            if cut == len(entries):
                state.delete(bucket_key)
            elif cut:
                state.put(bucket_key, entries[cut:])
            if cut < len(entries):
                next_close = entries[cut][0]
        _keep_next_close(state, next_close)
        return closed

    def _bucket_ms(self) -> int:
        """The schedule's entries are kept in buckets of this many ms (about
        16 buckets over a window's life), so a record reads and writes a
        sixteenth of it, not all."""
        return max(1, (self.windows.difference_ms + self.grace_ms + 1) // 16)

    def _fall_due(self, state: StateLike, stream_time: int, kind: int, start: int, key, closed: list[WindowResult]) -> None:
        if kind == _CLOSE_WINDOW:
            entry_key = (WINDOW_TAG, start, key)
            entry = state.get(entry_key)
            state.delete(entry_key)
            closed.append(WindowResult(key, start, self.windows.end(start), entry[0], entry[1]))
        else:
            records_key = (RECORDS_TAG, key)
            kept = [record for record in state.get(records_key) or [] if self._still_needed(record[0], stream_time)]
            if kept:
                state.put(records_key, kept)
            else:
                state.delete(records_key)

    def _schedule(self, state: StateLike, entries: list[list]) -> None:
        """Add [due time, what, start, key] entries to the schedule."""
        size = self._bucket_ms()
        buckets: dict[int, list] = {}
        for entry in entries:
            bucket = entry[0] // size
            if bucket not in buckets:
                buckets[bucket] = state.get((SCHEDULE_TAG, bucket)) or []
            bisect.insort(buckets[bucket], entry, key=_schedule_order)
        for bucket, listed in buckets.items():
            state.put((SCHEDULE_TAG, bucket), listed)
        next_close = state.get(NEXT_CLOSE)
        earliest = min(entry[0] for entry in entries)
        if next_close is None or earliest < next_close:
            state.put(NEXT_CLOSE, earliest)

    def update(self, state: StateLike, key, value, timestamp: int) -> Update:
        """Fold one record into the windows it is in, making those it
        brings into being (call ``advance`` with its timestamp first)."""
        d = self.windows.difference_ms
        stream_time = state.get(STREAM_TIME)
        if stream_time is not None and self.close_time(timestamp - d) <= stream_time:
            return Update((), True)
        records_key = (RECORDS_TAG, key)
        kept = [record for record in state.get(records_key) or [] if self._still_needed(record[0], stream_time)]
        due: list[list] = []
        if all(record[0] < timestamp for record in kept):  # the key's newest: its records expire after it
            due.append([timestamp + d + self.grace_ms + 1, _EXPIRE_RECORDS, 0, key])
        kept.append([timestamp, value])
        state.put(records_key, kept)
        times = {record[0] for record in kept}
        # The windows the record is in (its left window, the right windows
        # of records up to d + 1 before it, the left windows of records up
        # to d after it), and its own right window if a record falls there.
        starts = {timestamp - d} | {p + 1 for p in times if timestamp - d - 1 <= p < timestamp} | {u - d for u in times if timestamp < u <= timestamp + d}
        if any(timestamp < u <= timestamp + d + 1 for u in times):
            starts.add(timestamp + 1)
        changed: list[WindowResult] = []
        for start in sorted(starts):
            end = self.windows.end(start)
            entry_key = (WINDOW_TAG, start, key)
            entry = state.get(entry_key)
            if entry is None:
                inside = [record for record in kept if start <= record[0] <= end]
                aggregate = inside[0][1] if self.initial is FIRST_VALUE else self.add(self.initial(), inside[0][1])
                for _t, later in inside[1:]:
                    aggregate = self.add(aggregate, later)
                entry = [aggregate, max(record[0] for record in inside)]
                due.append([self.close_time(start), _CLOSE_WINDOW, start, key])
            elif start <= timestamp <= end:
                entry = [self.add(entry[0], value), max(entry[1], timestamp)]
            else:
                continue  # an existing window the record is not in
            state.put(entry_key, entry)
            changed.append(WindowResult(key, start, end, entry[0], entry[1]))
        if due:
            self._schedule(state, due)
        return Update(tuple(changed), False)
