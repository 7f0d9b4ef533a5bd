"""The event-loop thread behind each synchronous client facade.

The clients are asyncio at the core; ``Producer``, ``Consumer`` and
``Admin`` run their async twin on a private loop in a daemon thread and
block on its results, so they work from plain threads (Spark workers,
scripts) and never touch the caller's own event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading


class LoopThread:
    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

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

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()
