"""The window arithmetic and the windowed aggregation of streaming.windows,
against a dict-backed state and against a plain recomputation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.windows import NEXT_CLOSE, STREAM_TIME, WindowedAggregation, Windows, close_time, hopping, tumbling
from tests.helpers import DictState
from tests.helpers import recompute_windowed_sums as recompute


def test_tumbling_puts_each_timestamp_in_exactly_one_window():
    windows = tumbling(10_000)
    assert windows == Windows(10_000, 10_000)
    assert windows.starts_containing(0) == [0]
    assert windows.starts_containing(9_999) == [0]
    assert windows.starts_containing(10_000) == [10_000]
    assert windows.starts_containing(123_456) == [120_000]


def test_hopping_puts_a_timestamp_in_size_over_advance_windows():
    windows = hopping(10_000, 5_000)
    assert windows.starts_containing(12_000) == [5_000, 10_000]
    assert windows.starts_containing(10_000) == [5_000, 10_000]
    assert windows.starts_containing(9_999) == [0, 5_000]
    assert windows.starts_containing(3_000) == [0]  # no negative starts
    assert hopping(10_000, 3_000).starts_containing(20_000) == [12_000, 15_000, 18_000]


def test_bad_window_definitions_are_refused():
    with pytest.raises(ValueError, match="advance"):
        hopping(5_000, 10_000)
    with pytest.raises(ValueError, match="positive"):
        tumbling(0)
    with pytest.raises(ValueError, match=">= 0"):
        tumbling(1_000).starts_containing(-5)


def test_a_window_closes_at_end_plus_grace_of_stream_time():
    counting = WindowedAggregation(tumbling(10_000), grace_ms=2_000, add=lambda a, v: a + 1, initial=lambda: 0)
    state = DictState()
    for ts in (1_000, 9_000, 11_000):
        assert counting.advance(state, ts) == []
        counting.update(state, "k", None, ts)
    assert state.get(NEXT_CLOSE) == close_time(counting.windows, 2_000, 0) == 12_000
    # Out of order but within grace: still counted in window 0.
    assert counting.advance(state, 5_000) == []
    assert counting.update(state, "k", None, 5_000).late is False
    closed = counting.advance(state, 12_000)
    assert [(r.key, r.start, r.end, r.aggregate, r.timestamp) for r in closed] == [("k", 0, 10_000, 3, 9_000)]
    assert state.get(STREAM_TIME) == 12_000
    # Later than end + grace: dropped, reported late, the closed window is not reopened.
    update = counting.update(state, "k", None, 9_500)
    assert update.late is True and update.changed == ()
    assert counting.advance(state, 30_000)[0].aggregate == 1  # window 10 s held only the 11 s record


def test_reduce_starts_from_the_first_value():
    maximum = WindowedAggregation(tumbling(1_000), grace_ms=0, add=max)
    state = DictState()
    for ts, value in ((100, 3), (200, 7), (300, 5)):
        maximum.advance(state, ts)
        maximum.update(state, "k", value, ts)
    assert [r.aggregate for r in maximum.advance(state, 1_000)] == [7]


def test_tuple_and_bytes_free_keys_survive_the_json_state():
    counting = WindowedAggregation(tumbling(1_000), grace_ms=0, add=lambda a, v: a + v, initial=lambda: 0)
    state = DictState()
    counting.advance(state, 10)
    counting.update(state, ("a", 1), 2, 10)
    counting.update(state, 7, 3, 10)
    results = counting.advance(state, 1_000)
    assert {r.key: r.aggregate for r in results} == {("a", 1): 2, 7: 3}


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(1, 40),
    advance_divisor=st.integers(1, 4),
    grace=st.integers(0, 30),
    records=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 200), st.integers(1, 9)), max_size=60),
)
def test_windowed_sums_equal_a_plain_recomputation(size, advance_divisor, grace, records):
    advance = max(1, size // advance_divisor)
    summing = WindowedAggregation(Windows(size, advance), grace_ms=grace, add=lambda a, v: a + v, initial=lambda: 0)
    state = DictState()
    finals, late = {}, 0
    for index, (key, ts, value) in enumerate(records):
        for result in summing.advance(state, ts):
            assert (result.key, result.start) not in finals, "a window emitted twice"
            assert result.end == result.start + size
            finals[(result.key, result.start)] = (result.aggregate, index)
        late += summing.update(state, key, value, ts).late
    expected_finals, expected_open, expected_late = recompute(records, size, advance, grace)
    assert finals == expected_finals
    assert late == expected_late
    still_open = {(entry_key[2], entry_key[1]): entry[0] for entry_key, entry in state.items() if isinstance(entry_key, tuple)}
    assert still_open == expected_open
    if expected_open:
        assert state.get(NEXT_CLOSE) == min(start + size + grace for _key, start in expected_open)
    else:
        assert state.get(NEXT_CLOSE) is None


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 100), advance=st.integers(1, 100), ts=st.integers(0, 10_000))
def test_starts_containing_matches_a_scan(size, advance, ts):
    if advance > size:
        with pytest.raises(ValueError):
            Windows(size, advance)
        return
    expected = [s for s in range(0, ts + 1) if s % advance == 0 and s <= ts < s + size]
    assert Windows(size, advance).starts_containing(ts) == expected


def test_durations_are_timedeltas_or_milliseconds_one_unit_everywhere():
    from datetime import timedelta

    assert tumbling(timedelta(minutes=1)) == tumbling(60_000) == Windows(60_000, 60_000)
    assert hopping(timedelta(seconds=10), timedelta(seconds=5)) == hopping(10_000, 5_000)
    with pytest.raises(TypeError, match="timedelta or a number of milliseconds"):
        tumbling("10s")
    with pytest.raises(ValueError, match="positive"):
        tumbling(timedelta(0))


# -- session windows ------------------------------------------------------------------------------


def sessions_of(timestamps: list[int], gap: int) -> list[tuple[int, int, int]]:
    """(start, end, count) of the sessions of ``timestamps``: sorted, cut where two are more than ``gap`` apart."""
    found: list[list[int]] = []
    for t in sorted(timestamps):
        if found and t - found[-1][1] <= gap:
            found[-1][1] = t
            found[-1][2] += 1
        else:
            found.append([t, t, 1])
    return [tuple(s) for s in found]


def test_a_record_bridging_two_sessions_merges_them():
    from streaming.windows import SessionAggregation, session

    counting = SessionAggregation(session(10_000), grace_ms=20_000, add=lambda a, v: a + 1, merge=lambda a, b: a + b, initial=lambda: 0)
    state = DictState()
    for t in (0, 5_000, 30_000):
        counting.advance(state, t)
        counting.update(state, "k", None, t)
    assert state.get(("s", "k")) == [[0, 5_000, 2, 5_000], [30_000, 30_000, 1, 30_000]]
    # 15 s is 10 s after 5 s (within the gap) and 15 s before 30 s (not): it extends the first.
    counting.advance(state, 15_000)
    (extended,) = counting.update(state, "k", None, 15_000).changed
    assert (extended.start, extended.end, extended.aggregate) == (0, 15_000, 3)
    counting.update(state, "k", None, 22_000)  # within 10 s of 15 s and of 30 s: one session of five
    assert state.get(("s", "k")) == [[0, 30_000, 5, 30_000]]
    assert counting.advance(state, 59_999) == []
    (closed,) = counting.advance(state, 60_000)  # end 30 s + gap 10 s + grace 20 s
    assert (closed.key, closed.start, closed.end, closed.aggregate) == ("k", 0, 30_000, 5)
    assert state.get(("s", "k")) is None and state.get(NEXT_CLOSE) is None
    assert counting.update(state, "k", None, 29_000).late, "it could only join a closed session"


@settings(max_examples=60, deadline=None)
@given(gap=st.integers(1, 20), records=st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 200)), max_size=40))
def test_sessions_equal_a_plain_recomputation_when_nothing_is_late(gap, records):
    from streaming.windows import SessionAggregation, SessionWindows

    # A grace longer than the input's whole span: nothing is late, so
    # arrival order must not matter and the sessions are those of the sorted times.
    counting = SessionAggregation(SessionWindows(gap), grace_ms=1_000, add=lambda a, v: a + 1, merge=lambda a, b: a + b, initial=lambda: 0)
    state = DictState()
    for key, t in records:
        counting.advance(state, t)
        assert not counting.update(state, key, None, t).late
    closed = counting.advance(state, 10**6)
    for key in "ab":
        got = sorted((r.start, r.end, r.aggregate) for r in closed if r.key == key)
        assert got == sessions_of([t for k, t in records if k == key], gap)


# -- sliding windows ------------------------------------------------------------------------------


def collecting_sliding(difference: int, grace: int):
    """Sliding windows whose aggregate is the list of their values in arrival order."""
    from streaming.windows import SlidingAggregation, SlidingWindows

    return SlidingAggregation(SlidingWindows(difference), grace_ms=grace, add=lambda values, v: values + [v], initial=list)


def test_sliding_windows_are_the_distinct_sets_of_records_within_the_difference():
    from streaming.windows import sliding

    assert sliding(10) == collecting_sliding(10, 0).windows
    collecting = collecting_sliding(10, grace=100)
    state = DictState()
    for t in (10, 15, 30):
        collecting.advance(state, t)
        collecting.update(state, "k", t, t)
    # Left windows [0, 10], [5, 15], [20, 30]; 15 falls in 10's right window [11, 21]; nothing falls in 15's or 30's.
    closed = collecting.advance(state, 1_000)
    assert [(r.start, r.end, r.aggregate, r.timestamp) for r in closed] == [(0, 10, [10], 10), (5, 15, [10, 15], 15), (11, 21, [15], 15), (20, 30, [30], 30)]
    assert set(state.data) == {STREAM_TIME}, "windows, kept records and next-close all gone"


def test_a_sliding_window_closes_after_its_end_plus_grace_and_a_record_past_it_is_late():
    collecting = collecting_sliding(10, grace=5)
    state = DictState()
    collecting.advance(state, 100)
    (own,) = collecting.update(state, "k", "a", 100).changed
    assert (own.start, own.end) == (90, 100)
    assert collecting.advance(state, 103) == []
    update = collecting.update(state, "k", "b", 98)  # within grace: joins [90, 100], makes [88, 98] and its right window [99, 109]
    assert [(r.start, r.aggregate) for r in update.changed] == [(88, ["b"]), (90, ["a", "b"]), (99, ["a"])]
    assert collecting.advance(state, 103) == [], "98's window [88, 98] is open up to its end + grace"
    assert [(r.start, r.end, r.aggregate) for r in collecting.advance(state, 104)] == [(88, 98, ["b"])]
    assert collecting.update(state, "k", "c", 98).late, "stream time 104 is past 98 + grace"
    assert collecting.update(state, "k", "d", 100).late is False
    assert [r.start for r in collecting.advance(state, 106)] == [90]
    update = collecting.update(state, "k", "late", 100)
    assert update.late and update.changed == ()


def recompute_sliding(records, difference, grace):
    """The plain definition, independent of the module: stream time is the
    running maximum; a record counts unless stream time (with it) is past
    its time + grace; a key's windows are [t - d, t] for each of its
    records and [t + 1, t + 1 + d] for each record t with another of the
    key in (t, t + d + 1]; a window holds the key's counted records in it,
    in arrival order, and is emitted at the first record that brings stream
    time past its end + grace."""
    stream_time = None
    counted = []  # (index, key, t, value)
    times_at = []
    late = 0
    for index, (key, t, value) in enumerate(records):
        stream_time = t if stream_time is None else max(stream_time, t)
        times_at.append(stream_time)
        if stream_time > t + grace:
            late += 1
        else:
            counted.append((index, key, t, value))
    windows = set()
    for _i, key, t, _v in counted:
        windows.add((key, t - difference))
        if any(k == key and t < u <= t + difference + 1 for _j, k, u, _w in counted):
            windows.add((key, t + 1))
    finals, still_open = {}, {}
    for key, start in windows:
        values = [v for _i, k, t, v in counted if k == key and start <= t <= start + difference]
        emitted = next((i for i, st in enumerate(times_at) if st > start + difference + grace), None)
        if emitted is None:
            still_open[(key, start)] = values
        else:
            finals[(key, start)] = (values, emitted)
    return finals, still_open, late


@settings(max_examples=150, deadline=None)
@given(
    difference=st.integers(1, 30),
    grace=st.integers(0, 30),
    records=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 150), st.integers(1, 9)), max_size=50),
)
def test_sliding_windows_equal_a_plain_recomputation(difference, grace, records):
    collecting = collecting_sliding(difference, grace)
    state = DictState()
    finals, late = {}, 0
    for index, (key, t, value) in enumerate(records):
        for result in collecting.advance(state, t):
            assert (result.key, result.start) not in finals, "a window emitted twice"
            assert result.end == result.start + difference
            finals[(result.key, result.start)] = (result.aggregate, index)
        late += collecting.update(state, key, value, t).late
    expected_finals, expected_open, expected_late = recompute_sliding(records, difference, grace)
    assert finals == expected_finals
    assert late == expected_late
    still_open = {(entry_key[2], entry_key[1]): entry[0] for entry_key, entry in state.items() if isinstance(entry_key, tuple) and entry_key[0] == "w"}
    assert still_open == expected_open
    collecting.advance(state, 10**6)
    assert set(state.data) == {STREAM_TIME}, "every window closed, every record and schedule entry forgotten"
