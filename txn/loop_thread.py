"""The event-loop thread behind each synchronous client facade.

The clients are asyncio at the core; ``Producer``, ``Consumer`` and
``Admin`` run their async twin on a private loop in a daemon thread and
block on its results, so they work from plain threads (Spark workers,
scripts) and never touch the caller's own event loop.

The loop thread is the owner of last resort of every task on its loop:
``stop()`` cancels and waits for whatever a client left running (it was
never closed, or its close timed out) before the loop stops and closes, so
no task is destroyed pending. A client that is never closed is stopped the
same way when the interpreter exits.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import threading

from protocol.tasks import cancel_and_wait

log = logging.getLogger(__name__)

_running: set["LoopThread"] = set()
_running_lock = threading.Lock()


class LoopThread:
    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()
        with _running_lock:
            _running.add(self)

    def call(self, coroutine, timeout: float | None = None):
        """Run ``coroutine`` on the loop and wait for its result."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no result within {timeout} s") from None

    def submit(self, coroutine) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def run(self, function, *args):
        """Run a plain function on the loop thread (state lives there)."""

        async def call():
            return function(*args)

        return self.call(call())

    def stop(self, timeout: float = 10) -> None:
        """Cancel and wait for every task left on the loop, then stop and close it."""
        with _running_lock:
            _running.discard(self)
        if self._thread.is_alive() and not self.loop.is_closed():
            leftovers = asyncio.run_coroutine_threadsafe(_cancel_remaining_tasks(), self.loop)
            try:
                leftovers.result(timeout)
            except concurrent.futures.TimeoutError:
                log.warning("tasks on %s did not finish within %s s of being cancelled", self._thread.name, timeout)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive() and not self.loop.is_closed():
            self.loop.close()


async def _cancel_remaining_tasks() -> None:
    current = asyncio.current_task()
    remaining = [task for task in asyncio.all_tasks() if task is not current]
    try:
        await cancel_and_wait(*remaining)
    except Exception as failure:  # a client's leftovers, whose results nobody wants any more
        log.debug("tasks left on a stopping client loop had failed: %r", failure)


@atexit.register
def _stop_every_loop_thread() -> None:
    """Clients that were never closed: their tasks end before the process does."""
    with _running_lock:
        threads = list(_running)
    for thread in threads:
        thread.stop(timeout=2)
