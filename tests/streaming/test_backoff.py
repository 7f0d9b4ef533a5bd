"""streaming.backoff: the runner's waits between tries after a broker failure."""

from streaming.backoff import RetryDelay


def test_the_delay_starts_short_doubles_to_its_cap_and_resets_after_a_success():
    delay = RetryDelay()
    assert [delay.next() for _ in range(6)] == [0.02, 0.04, 0.08, 0.16, 0.25, 0.25]
    delay.reset()
    assert delay.next() == 0.02


def test_each_operation_has_its_own_delay():
    poll, restore = RetryDelay(), RetryDelay(first=0.1, cap=0.3)
    poll.next()
    poll.next()
    assert restore.next() == 0.1 and restore.next() == 0.2 and restore.next() == 0.3
    assert poll.next() == 0.08
