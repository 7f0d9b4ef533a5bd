"""An asyncio event loop on a thread of its own, driven from synchronous code.

This is the one "loop on its own thread" of the house. Two kinds of owner use it:

- the synchronous client facades (``txn.Producer``, ``txn.Consumer``,
  ``txn.Admin``) run their async twin on a private loop and block on its
  results (``call``, ``run``), so they work from plain threads (Spark
  workers, scripts) and never touch the caller's own event loop;
- a service with an async ``start``/``stop`` (the embedded broker, the
  threaded fault proxy) is run by ``serve``: one task owns it from start to
  stop, so the service's own TaskGroups have a parent that lives as long as
  the service, and a failure of ``start`` (a bind error) reaches the caller
  of ``serve``.

The loop thread is the owner of last resort of every task on its loop:
``stop()`` stops the service, if any, then cancels and waits for whatever a
client left running (it was never closed, or its close timed out) before the
loop stops and closes, so no task is destroyed pending. A loop thread that is
never stopped is stopped the same way when the interpreter exits.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import threading
from typing import Awaitable, Callable

from protocol.tasks import cancel_and_wait

log = logging.getLogger(__name__)

_running: set["LoopThread"] = set()
_running_lock = threading.Lock()


class LoopThread:
    def __init__(self, name: str):
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._service: concurrent.futures.Future | None = None  # the task that owns a served service
        self._stop_service: asyncio.Event | None = None
        self._stopping = threading.Lock()  # one stop() at a time: a second one waits, then finds the loop closed
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

    def run(self, function, *args, **kwargs):
        """Run a plain function on the loop thread (state lives there)."""

        async def call():
            return function(*args, **kwargs)

        return self.call(call())

    def serve(self, start: Callable[[], Awaitable], stop: Callable[[], Awaitable]) -> None:
        """Start a service on the loop and return once ``start()`` has
        returned (its failure is raised here). One task awaits ``start()``,
        then waits until ``stop()`` of this thread (or until the service's
        own TaskGroup cancels it, after a child crashed), then awaits the
        service's ``stop()``."""
        if self._service is not None:
            raise RuntimeError(f"{self.name} already serves a service")
        started: concurrent.futures.Future = concurrent.futures.Future()
        self._service = self.submit(self._own_service(start, stop, started))
        try:
            started.result()
        except BaseException:
            self._service = None
            raise

    async def _own_service(self, start, stop, started: concurrent.futures.Future) -> None:
        self._stop_service = asyncio.Event()
        try:
            await start()
        except BaseException as error:
            started.set_exception(error)
            if isinstance(error, asyncio.CancelledError):
                raise
            return
        started.set_result(None)
        try:
            await self._stop_service.wait()
        finally:
            await stop()

    def stop(self, timeout: float = 10) -> None:
        """Stop the service (if any), cancel and wait for every task left on
        the loop, then stop and close it."""
        with _running_lock:
            _running.discard(self)
        with self._stopping:  # the atexit hook may stop a thread its owner is stopping too
            self._stop(timeout)

    def _stop(self, timeout: float) -> None:
        if self._thread.is_alive() and not self.loop.is_closed():
            service, self._service = self._service, None
            if service is not None:
                self.loop.call_soon_threadsafe(self._stop_service.set)
                try:
                    service.result(timeout)
                except concurrent.futures.TimeoutError:
                    log.warning("the service on %s did not stop within %s s", self.name, timeout)
                except BaseException as failure:  # it stopped, and says why it failed: as a thread's failure would be
                    log.error("the service on %s stopped with an error", self.name, exc_info=failure)
            leftovers = asyncio.run_coroutine_threadsafe(_cancel_remaining_tasks(), self.loop)
            try:
                leftovers.result(timeout)
            except concurrent.futures.TimeoutError:
                log.warning("tasks on %s did not finish within %s s of being cancelled", self.name, timeout)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive() and not self.loop.is_closed():
            self.loop.close()

    def is_alive(self) -> bool:
        return self._thread.is_alive()


async def _cancel_remaining_tasks() -> None:
    current = asyncio.current_task()
    remaining = [task for task in asyncio.all_tasks() if task is not current]
    try:
        await cancel_and_wait(*remaining)
    except Exception as failure:  # leftovers whose results nobody wants any more
        log.debug("tasks left on a stopping loop thread had failed: %r", failure)


@atexit.register
def _stop_every_loop_thread() -> None:
    """Loop threads never stopped: their tasks end before the process does."""
    with _running_lock:
        threads = list(_running)
    for thread in threads:
        thread.stop(timeout=2)
