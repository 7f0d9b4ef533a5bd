"""How onceflow tries again after a failure: the one shape of a retry
policy, the one loop that runs an operation under it, and the named policy
of each kind of caller.

- ``RetryPolicy`` (a value): the first wait, the cap of one wait, the
  multiplier between waits, the jitter, an overall deadline and a number of
  tries. ``delay(failures)`` is pure arithmetic.
- ``Backoff`` (one operation's tries): how many failed in a row, when the
  first started, whether the next wait may be taken (never past the
  deadline: a wait that would end after it is cut to end there, for one last
  try). Sans-I/O: it reads the time from the clock it is given and sleeps
  never.
- The loops (tenacity's ``AsyncRetrying``/``Retrying``, driven by a
  ``Backoff``): ``attempts`` for a block retried in place (``async for attempt
  in attempts(...): with attempt: ...``, the clients' requests), ``retry``
  for an awaitable operation, ``retry_blocking`` for a synchronous one. Each
  raises a non-retriable error at once, and ends with the last error (or
  what ``give_up`` makes of it) once the policy says no more.

The named policies, one per kind of caller:

| policy | caller | first wait | cap | deadline / tries |
| --- | --- | --- | --- | --- |
| ``client_request`` | a client's request (``txn.cluster``), a produce batch (``txn.sender``), a fetch or group round | ``retry_backoff_ms`` | ``retry_backoff_max_ms`` | the call's own (request or delivery timeout) |
| ``coordinator_busy`` | the same request answered CONCURRENT_TRANSACTIONS / COORDINATOR_LOAD_IN_PROGRESS | 20 ms | ``retry_backoff_max_ms`` | as the request's |
| ``reconnect`` | the same request after a lost or refused connection | ``retry_backoff_ms`` | 250 ms | as the request's |
| ``COORDINATOR_COMPLETION`` | the transaction coordinator writing markers and Complete after a decision | 50 ms | 2 s | none: the decision stands |
| ``RUNNER`` | the runner's poll, rewind and store restore | 20 ms | 250 ms | none: until the app stops |
| ``spark_offset_requests`` | the Spark source's offset and metadata requests | ``fetchOffset.retryIntervalMs``, fixed | the same | ``fetchOffset.numRetries`` + 1 tries |

Why it lives in ``protocol``: the coordinator, the clients and the runner
all retry, and ``protocol`` is the one room each of them may import (as the
clock and the task helpers do). Which errors are worth a retry is each
caller's taxonomy (``txn.errors`` for the clients), passed in as
``retriable``.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Awaitable, Callable, TypeVar

import attrs
import tenacity

T = TypeVar("T")

# A coordinator busy for a moment (finishing the previous transaction's
# markers, loading its log after a restart) clears in tens of milliseconds:
# asked again after this (as Kafka's producer retries AddPartitionsToTxn).
COORDINATOR_BUSY_FIRST_WAIT_S = 0.02
# A connection that failed (the broker is down or restarting) is tried again
# at most this long after the last try: a refused connect costs the broker
# nothing, and a longer wait is only time lost after it is back (a client
# whose waits had grown to retry_backoff_max_ms came back up to a second
# after the broker did).
RECONNECT_MAX_WAIT_S = 0.25


@attrs.frozen
class RetryPolicy:
    """When to try an operation again: ``initial`` seconds after the first
    failure, ``multiplier`` times longer after each further one, never more
    than ``max`` seconds; each wait shortened by up to ``jitter`` of itself
    (0: none), so that many callers failed together do not return together;
    no try started past ``deadline`` seconds after the first (None: no
    deadline) and at most ``tries`` tries in all (None: no limit)."""

    initial: float = attrs.field(validator=attrs.validators.ge(0))
    max: float = attrs.field(validator=attrs.validators.ge(0))
    multiplier: float = attrs.field(default=2.0, validator=attrs.validators.ge(1))
    jitter: float = attrs.field(default=0.0, validator=[attrs.validators.ge(0), attrs.validators.le(1)])
    deadline: float | None = None
    tries: int | None = attrs.field(default=None, validator=attrs.validators.optional(attrs.validators.ge(1)))

    def delay(self, failures: int, draw: Callable[[], float] = random.random) -> float:
        """The wait after the ``failures``-th failure in a row (1 for the
        first); ``draw`` gives the jitter's share, in [0, 1)."""
        wait = min(self.initial * self.multiplier ** (failures - 1), self.max)
        return wait * (1 - self.jitter * draw()) if self.jitter else wait

    def within(self, deadline: float | None) -> RetryPolicy:
        """This policy with an overall ``deadline`` of the caller's."""
        return attrs.evolve(self, deadline=deadline)


@attrs.define
class Backoff:
    """The tries of one operation under ``policy``: ``failures`` in a row
    since the last success, the first try ``started`` (on ``clock``)."""

    policy: RetryPolicy
    clock: Callable[[], float] = time.monotonic
    started: float = attrs.field(default=attrs.Factory(lambda self: self.clock(), takes_self=True))
    failures: int = 0
    tries: int = 0

    def failed(self, wait_policy: RetryPolicy | None = None) -> float | None:
        """Count a failed try; the wait before the next, or None when the
        policy allows no more (tries used up, or the deadline reached). The
        wait is cut to end at the deadline. ``wait_policy``: another policy's
        waits for this failure (the deadline and tries stay this one's)."""
        self.failures += 1
        self.tries += 1
        policy = self.policy
        if policy.tries is not None and self.tries >= policy.tries:
            return None
        wait = (wait_policy or policy).delay(self.failures)
        if policy.deadline is None:
            return wait
        left = self.started + policy.deadline - self.clock()
        return min(wait, left) if left > 0 else None

    def succeeded(self) -> None:
        """A try worked: the next failure waits the first wait again."""
        self.failures = 0


def _engine(backoff: Backoff, retriable, sleep, *, wait_policy=None, on_failure=None, stopping=None, give_up=None) -> dict:
    """tenacity's hooks for one operation under ``backoff``: retry on a
    ``retriable`` error after the wait ``backoff`` gives (``wait_policy(error)``'s
    waits when given), stop when it gives none, and after a wait when
    ``stopping()``; the last error raised (``give_up(error, tries)`` raised
    from it, when given). ``on_failure(error, backoff)`` hears of each
    failure another try follows. """
    decided: dict = {"attempt": 0}

    def decide(state: tenacity.RetryCallState) -> float | None:
        """The wait after this failed attempt (None: no more), decided once
        whichever of tenacity's ``wait`` and ``stop`` asks first."""
        if decided["attempt"] != state.attempt_number:
            decided["attempt"] = state.attempt_number
            error = decided["error"] = state.outcome.exception()
            decided["wait"] = backoff.failed(wait_policy(error) if wait_policy is not None else None)
            if decided["wait"] is not None and on_failure is not None:
                on_failure(error, backoff)
        return decided["wait"]

    def exhausted(state: tenacity.RetryCallState):
        error = state.outcome.exception()
        if give_up is None:
            raise error
        raise give_up(error, backoff.tries) from error

    if asyncio.iscoroutinefunction(sleep):
        async def sleep_then_look(seconds: float) -> None:
            await sleep(seconds)
            if stopping is not None and stopping():
                raise decided["error"]
    else:
        def sleep_then_look(seconds: float) -> None:
            sleep(seconds)

    return {
        "retry": tenacity.retry_if_exception(retriable),
        "wait": lambda state: decide(state) or 0.0,
        "stop": lambda state: decide(state) is None,
        "sleep": sleep_then_look,
        "retry_error_callback": exhausted,
    }


def attempts(
    policy: RetryPolicy,
    *,
    retriable: Callable[[BaseException], bool],
    wait_policy: Callable[[BaseException], RetryPolicy] | None = None,
    give_up: Callable[[BaseException, int], BaseException] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> tenacity.AsyncRetrying:
    """Tries of a block retried in place::

        async for attempt in attempts(policy, retriable=...):
            with attempt:
                response = await request()

    A ``retriable`` error is swallowed and the block runs again after the
    policy's wait (``wait_policy(error)``'s, when given); any other error
    leaves the loop at once. When the policy allows no more tries, the last
    error is raised (``give_up(error, tries)``, when given, is raised from it)."""
    return tenacity.AsyncRetrying(**_engine(Backoff(policy, clock), retriable, sleep, wait_policy=wait_policy, give_up=give_up))


async def retry(
    operation: Callable[[], Awaitable[T]],
    backoff: Backoff,
    *,
    retriable: Callable[[BaseException], bool],
    on_failure: Callable[[BaseException, Backoff], None] | None = None,
    stopping: Callable[[], bool] = lambda: False,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """``await operation()`` until it returns, under ``backoff`` (which the
    caller may keep across calls: a poll retried once per turn of its loop).
    After each ``retriable`` failure ``on_failure(error, backoff)`` is told
    (``backoff.failures`` still counts the earlier ones), then the wait;
    the error is raised when the policy allows no more tries or, after the
    wait, ``stopping()``."""
    def retriable_and_told(error: BaseException) -> bool:  # told of every failure, the last one too
        if not retriable(error):
            return False
        if on_failure is not None:
            on_failure(error, backoff)
        return True

    # The first try runs outside tenacity: most operations (the
    # coordinator's markers, once per transaction) succeed at once, and
    # tenacity's set-up costs more than the try. A failed first try is handed
    # to tenacity as its own first attempt, so what follows is the same.
    try:
        result = await operation()
    except BaseException as error:
        first_failure: BaseException | None = error
    else:
        backoff.succeeded()
        return result

    async def attempt() -> T:  # a coroutine function: tenacity calls a plain one (a lambda) without awaiting it
        nonlocal first_failure
        if first_failure is not None:
            failure, first_failure = first_failure, None
            raise failure
        return await operation()

    result = await tenacity.AsyncRetrying(**_engine(backoff, retriable_and_told, sleep, stopping=stopping))(attempt)
    backoff.succeeded()
    return result


def retry_blocking(
    call: Callable[[], T],
    policy: RetryPolicy,
    *,
    retriable: Callable[[BaseException], bool],
    on_failure: Callable[[BaseException, Backoff], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()`` until it returns, as ``retry`` does, for synchronous
    callers; ``on_failure`` is told of a failure only when another try follows."""
    return tenacity.Retrying(**_engine(Backoff(policy, clock), retriable, sleep, on_failure=on_failure))(call)


# -- the named policies ------------------------------------------------------------------------


def client_request(retry_backoff_ms: int, retry_backoff_max_ms: int) -> RetryPolicy:
    """A client's request, a produce batch, a fetch or group round: Kafka's
    ``retry.backoff.ms`` doubling up to ``retry.backoff.max.ms``; the caller
    adds its deadline (``within``)."""
    return RetryPolicy(initial=retry_backoff_ms / 1000, max=retry_backoff_max_ms / 1000)


def coordinator_busy(retry_backoff_max_ms: int) -> RetryPolicy:
    """A request a coordinator answered it was busy for a moment: from
    ``COORDINATOR_BUSY_FIRST_WAIT_S``, doubling to the client's cap."""
    return RetryPolicy(initial=COORDINATOR_BUSY_FIRST_WAIT_S, max=retry_backoff_max_ms / 1000)


def reconnect(retry_backoff_ms: int, retry_backoff_max_ms: int) -> RetryPolicy:
    """A request whose connection failed: the client's waits, capped at
    ``RECONNECT_MAX_WAIT_S``."""
    return RetryPolicy(initial=retry_backoff_ms / 1000, max=min(retry_backoff_max_ms / 1000, RECONNECT_MAX_WAIT_S))


# The coordinator completing a decided transaction (markers, then Complete):
# the decision stands, so it never gives up (a restart would try again too).
COORDINATOR_COMPLETION = RetryPolicy(initial=0.05, max=2.0)

# The runner's poll, rewind and store restore: short at first, so a broker
# that is back is picked up within tens of milliseconds, doubling to a cap,
# so a broker that stays down is not asked in a busy loop; no deadline (the
# app's stop ends it).
RUNNER = RetryPolicy(initial=0.02, max=0.25)


def spark_offset_requests(num_retries: int, retry_interval_ms: int) -> RetryPolicy:
    """Spark's ``fetchOffset.numRetries`` / ``fetchOffset.retryIntervalMs``:
    a fixed wait, ``num_retries`` tries after the first."""
    interval = retry_interval_ms / 1000
    return RetryPolicy(initial=interval, max=interval, multiplier=1.0, tries=num_retries + 1)
