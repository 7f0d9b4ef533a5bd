"""The clock's two readings, real and manual."""

import time

import pytest

from protocol.clock import Clock, ManualClock


def test_the_real_clock_reads_the_machines_clocks():
    clock = Clock()
    before_wall, before_monotonic = time.time() * 1000, time.monotonic()
    wall, monotonic = clock.wall_ms(), clock.monotonic()
    assert isinstance(wall, int) and before_wall - 1 <= wall <= time.time() * 1000 + 1
    assert before_monotonic <= monotonic <= time.monotonic()


def test_a_manual_clock_moves_only_when_told_and_both_readings_together():
    clock = ManualClock()
    wall, monotonic = clock.wall_ms(), clock.monotonic()
    time.sleep(0.01)
    assert (clock.wall_ms(), clock.monotonic()) == (wall, monotonic)
    clock.advance(1.5)
    assert (clock.wall_ms() - wall, clock.monotonic() - monotonic) == (1500, 1.5)
    with pytest.raises(ValueError):
        clock.advance(-1)
