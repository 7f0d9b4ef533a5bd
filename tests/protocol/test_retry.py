"""protocol.retry without a socket or a real sleep: the waits a policy
computes, the deadline and tries it keeps, and which errors end the loops at once."""

import asyncio

import pytest

from protocol.retry import (
    RUNNER,
    Backoff,
    RetryPolicy,
    attempts,
    client_request,
    coordinator_busy,
    reconnect,
    retry,
    retry_blocking,
    spark_offset_requests,
)


class FakeTime:
    """A clock that moves only when the loop under test sleeps."""

    def __init__(self):
        self.now = 100.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep_blocking(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        self.sleep_blocking(seconds)


def failing(times: int, error: BaseException, result="done"):
    """An operation that raises ``error`` ``times`` times, then returns ``result``."""
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= times:
            raise error
        return result

    return call, calls


def test_the_waits_double_from_the_first_to_the_cap():
    policy = RetryPolicy(initial=0.02, max=0.25)
    assert [policy.delay(n) for n in range(1, 7)] == [0.02, 0.04, 0.08, 0.16, 0.25, 0.25]
    assert [RetryPolicy(initial=1.0, max=5.0, multiplier=3.0).delay(n) for n in (1, 2, 3)] == [1.0, 3.0, 5.0]


def test_jitter_shortens_a_wait_by_at_most_its_share():
    policy = RetryPolicy(initial=1.0, max=1.0, jitter=0.5)
    assert policy.delay(1, draw=lambda: 0.0) == 1.0
    assert policy.delay(1, draw=lambda: 0.999) == pytest.approx(0.5005)
    assert all(0.5 <= policy.delay(1) <= 1.0 for _ in range(100))


def test_a_policy_refuses_meaningless_values():
    for bad in ({"initial": -1, "max": 1}, {"initial": 1, "max": 1, "multiplier": 0.5}, {"initial": 1, "max": 1, "jitter": 1.5}, {"initial": 1, "max": 1, "tries": 0}):
        with pytest.raises(ValueError):
            RetryPolicy(**bad)


def test_the_named_policies():
    assert [client_request(100, 1000).delay(n) for n in (1, 2, 5)] == [0.1, 0.2, 1.0]
    assert coordinator_busy(1000).delay(1) == 0.02
    assert [reconnect(100, 1000).delay(n) for n in (1, 2, 3)] == [0.1, 0.2, 0.25]
    assert RUNNER.deadline is None and RUNNER.tries is None
    spark = spark_offset_requests(3, 1000)
    assert spark.tries == 4 and [spark.delay(n) for n in (1, 2, 3)] == [1.0, 1.0, 1.0]


def test_no_wait_ends_past_the_deadline_and_none_is_taken_at_it():
    time = FakeTime()
    backoff = Backoff(RetryPolicy(initial=0.4, max=10.0, deadline=1.0), clock=time)
    waits = []
    while (wait := backoff.failed()) is not None:
        waits.append(wait)
        time.now += wait
    assert waits == [0.4, pytest.approx(0.6)]  # 0.8 would end past the deadline: cut to end there
    assert time.now == pytest.approx(101.0)


def test_a_success_starts_the_waits_again_from_the_first():
    backoff = Backoff(RUNNER, clock=FakeTime())
    assert [backoff.failed() for _ in range(3)] == [0.02, 0.04, 0.08]
    backoff.succeeded()
    assert backoff.failed() == 0.02


def test_another_policys_waits_keep_this_ones_deadline():
    time = FakeTime()
    backoff = Backoff(RetryPolicy(initial=1.0, max=1.0, deadline=0.5), clock=time)
    assert backoff.failed(wait_policy=RetryPolicy(initial=0.02, max=1.0)) == 0.02
    time.now += 0.5
    assert backoff.failed(wait_policy=RetryPolicy(initial=0.02, max=1.0)) is None


def test_retry_blocking_tries_as_often_as_the_policy_says_then_raises_the_last_error():
    time = FakeTime()
    call, calls = failing(10, ConnectionError("refused"))
    told = []
    with pytest.raises(ConnectionError):
        retry_blocking(call, spark_offset_requests(2, 500), retriable=lambda e: isinstance(e, OSError),
                       on_failure=lambda error, backoff: told.append(backoff.tries), clock=time, sleep=time.sleep_blocking)
    assert len(calls) == 3 and time.waits == [0.5, 0.5] and told == [1, 2]
    call, calls = failing(2, ConnectionError("refused"))
    assert retry_blocking(call, spark_offset_requests(2, 500), retriable=lambda e: isinstance(e, OSError), clock=time, sleep=time.sleep_blocking) == "done"


def test_a_non_retriable_error_is_raised_at_once_by_every_loop():
    time = FakeTime()
    call, calls = failing(10, ValueError("bad input"))
    with pytest.raises(ValueError):
        retry_blocking(call, RUNNER, retriable=lambda e: isinstance(e, OSError), clock=time, sleep=time.sleep_blocking)

    async def operation():
        return call()

    with pytest.raises(ValueError):
        asyncio.run(retry(operation, Backoff(RUNNER, clock=time), retriable=lambda e: isinstance(e, OSError), sleep=time.sleep))

    async def in_place():
        async for attempt in attempts(RUNNER, retriable=lambda e: isinstance(e, OSError), clock=time, sleep=time.sleep):
            with attempt:
                raise ValueError("bad input")

    with pytest.raises(ValueError):
        asyncio.run(in_place())
    assert len(calls) == 2 and time.waits == []


def test_attempts_retry_in_place_until_the_block_passes():
    time = FakeTime()
    call, calls = failing(3, TimeoutError("slow"))

    async def run():
        async for attempt in attempts(RetryPolicy(initial=0.1, max=1.0, deadline=10.0), retriable=lambda e: isinstance(e, OSError), clock=time, sleep=time.sleep):
            with attempt:
                result = call()
        return result

    assert asyncio.run(run()) == "done"
    assert len(calls) == 4 and time.waits == [0.1, 0.2, 0.4]


def test_attempts_give_up_at_the_deadline_with_what_give_up_makes_of_the_last_error():
    time = FakeTime()

    class Exhausted(Exception):
        pass

    async def run():
        async for attempt in attempts(RetryPolicy(initial=0.4, max=0.4, deadline=1.0), retriable=lambda e: isinstance(e, OSError),
                                      give_up=lambda error, tries: Exhausted(f"{tries} tries: {error}"), clock=time, sleep=time.sleep):
            with attempt:
                raise ConnectionError("refused")

    with pytest.raises(Exhausted, match="4 tries: refused") as raised:
        asyncio.run(run())
    assert isinstance(raised.value.__cause__, ConnectionError)
    assert time.waits == [0.4, 0.4, pytest.approx(0.2)]


def test_retry_tells_each_failure_and_stops_when_asked():
    time = FakeTime()
    call, calls = failing(5, ConnectionError("down"))
    told = []

    async def operation():
        return call()

    backoff = Backoff(RUNNER, clock=time)
    with pytest.raises(ConnectionError):
        asyncio.run(retry(operation, backoff, retriable=lambda e: isinstance(e, OSError), on_failure=lambda error, b: told.append(b.failures),
                          stopping=lambda: len(calls) >= 2, sleep=time.sleep))
    assert told == [0, 1] and time.waits == [0.02, 0.04]
    assert asyncio.run(retry(operation, backoff, retriable=lambda e: isinstance(e, OSError), sleep=time.sleep)) == "done"
    assert backoff.failures == 0 and time.waits[2:] == [0.08, 0.16, 0.25]


def test_cancellation_is_never_retried():
    async def cancelled():
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(retry(cancelled, Backoff(RUNNER), retriable=lambda e: isinstance(e, Exception)))


def test_retry_awaits_what_a_plain_callable_returns():
    """``retry(lambda: coroutine())``: the lambda is not a coroutine function,
    and its coroutine is awaited, not handed back."""
    time = FakeTime()
    call, calls = failing(1, ConnectionError("refused"))

    async def request():
        return call()

    result = asyncio.run(retry(lambda: request(), Backoff(RUNNER, clock=time), retriable=lambda e: isinstance(e, ConnectionError), sleep=time.sleep))
    assert result == "done" and len(calls) == 2
