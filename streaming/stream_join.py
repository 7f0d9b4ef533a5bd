"""A windowed stream-stream join, sans I/O: two co-partitioned streams'
records of one key meet when their timestamps are at most ``within`` apart
(``stream.join(other, joiner, within=timedelta(seconds=5))``, and
``left_join``). The state lives in anything store-shaped (the dataflow
layer gives it a changelogged store; the tests a dict).

Time is stream time: the highest timestamp seen on the partition, over both
streams (they are met in timestamp order, ``streaming.picking``). A record
is *late*, dropped and counted (``late_records_dropped``), when every
partner it could have had is already gone: its timestamp + ``within`` +
``grace`` is before stream time. A record is kept until no record that is
not late could still be its partner: until stream time passes its timestamp
+ 2 x ``within`` + ``grace``.

Each joined pair is emitted once, when its second record comes, as
``joiner(left_value, right_value)`` with the key and the later of the two
timestamps. A left join also emits each left record that found no partner,
once it is sure none can come (when it expires), as ``joiner(left_value,
None)`` stamped with its own timestamp, as Kafka Streams does since 3.1
(no early "no match" that a later match contradicts). Expired records are
swept when stream time passes the next expiry, at most once per ``within``
(so a left join's unmatched record may come up to ``within`` after it
expired).

State layout (keys tuples or strings, values JSON):

| key | value |
| --- | --- |
| ``"stream-time"`` | the highest timestamp seen |
| ``"next-sweep"`` | when the next sweep is due (stream time) |
| ``("L", key)`` / ``("R", key)`` | ``[[timestamp, offset, value, matched], ...]`` the side's kept records of ``key`` |
"""

from __future__ import annotations

from typing import Any, Callable

STREAM_TIME = "stream-time"
NEXT_SWEEP = "next-sweep"
LEFT, RIGHT = "L", "R"


class WindowedJoin:
    def __init__(self, within_ms: int, grace_ms: int, joiner: Callable[[Any, Any], Any], left_join: bool):
        self.within_ms = within_ms
        self.grace_ms = grace_ms
        self.joiner = joiner
        self.left_join = left_join
        self.keep_ms = 2 * within_ms + grace_ms

    def advance(self, state, timestamp: int) -> list[tuple[Any, Any, int]]:
        """Stream time moves to ``timestamp`` if later; the left join's
        unmatched records this expires, as (key, value, timestamp)."""
        seen = state.get(STREAM_TIME)
        if seen is not None and timestamp <= seen:
            return []
        state.put(STREAM_TIME, timestamp)
        due = state.get(NEXT_SWEEP)
        if due is None or timestamp < due:
            return []
        return self._sweep(state, timestamp)

    def _sweep(self, state, now: int) -> list[tuple[Any, Any, int]]:
        out = []
        earliest = None
        for stored_key, entries in list(state.items()):
            if not isinstance(stored_key, tuple):
                continue
            side, key = stored_key
            kept = []
            for entry in entries:
                timestamp, _offset, value, matched = entry
                if timestamp + self.keep_ms < now:
                    if side == LEFT and self.left_join and not matched:
                        out.append((key, self.joiner(value, None), timestamp))
                else:
                    kept.append(entry)
                    earliest = timestamp if earliest is None else min(earliest, timestamp)
            if len(kept) != len(entries):
                if kept:
                    state.put(stored_key, kept)
                else:
                    state.delete(stored_key)
        if earliest is None:
            state.delete(NEXT_SWEEP)
        else:
            state.put(NEXT_SWEEP, max(earliest + self.keep_ms + 1, now + max(self.within_ms, 1)))
        out.sort(key=lambda result: result[2])
        return out

    def add(self, state, side: str, key, value, timestamp: int, offset: int) -> tuple[list[tuple[Any, Any, int]], bool]:
        """A record of ``side`` (LEFT or RIGHT): the pairs it completes, as
        (key, joined value, timestamp), and whether it was late (dropped)."""
        now = state.get(STREAM_TIME, timestamp)
        if timestamp + self.within_ms + self.grace_ms < now:
            return [], True
        other_side = RIGHT if side == LEFT else LEFT
        others = state.get((other_side, key)) or []
        out = []
        matched = False
        changed = False
        for entry in others:
            other_timestamp, _offset, other_value, _matched = entry
            if abs(other_timestamp - timestamp) <= self.within_ms:
                matched = True
                if side == LEFT:
                    out.append((key, self.joiner(value, other_value), max(timestamp, other_timestamp)))
                else:
                    out.append((key, self.joiner(other_value, value), max(timestamp, other_timestamp)))
                    if not entry[3]:
                        entry[3] = changed = True
        if changed:
            state.put((other_side, key), others)
        own = state.get((side, key)) or []
        own.append([timestamp, offset, value, matched])
        state.put((side, key), own)
        due = state.get(NEXT_SWEEP)
        expiry = timestamp + self.keep_ms + 1
        if due is None or expiry < due:
            state.put(NEXT_SWEEP, expiry)
        return out, False
