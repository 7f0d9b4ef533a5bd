"""LoopThread: blocking calls onto a loop of its own, and a service served
from start to stop by one owning task (the embedded broker's and the
threaded fault proxy's shape)."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest

from protocol.loop_thread import LoopThread
from tests.helpers import wait_for


class Service:
    """A service shaped like the broker: start() enters a TaskGroup whose
    children run until stop() leaves it."""

    def __init__(self, child=None):
        self.events: list[str] = []
        self.child = child or (lambda: asyncio.sleep(3600))
        self.threads: set[int] = set()

    async def start(self) -> None:
        self.threads.add(threading.get_ident())
        self.scope = contextlib.AsyncExitStack()
        tasks = await self.scope.enter_async_context(asyncio.TaskGroup())
        self.task = tasks.create_task(self.child())
        self.events.append("started")

    async def stop(self) -> None:
        self.threads.add(threading.get_ident())
        self.task.cancel()
        try:
            await self.scope.aclose()
        finally:
            self.events.append("stopped")


def test_call_and_run_execute_on_the_loop_thread():
    thread = LoopThread("test-loop")
    try:
        caller = threading.get_ident()

        async def where():
            return threading.get_ident()

        assert thread.call(where()) != caller
        assert thread.run(threading.get_ident) == thread.call(where())
        assert thread.run(lambda a, b=0: a + b, 2, b=3) == 5
        with pytest.raises(TimeoutError):
            thread.call(asyncio.sleep(5), timeout=0.05)
    finally:
        thread.stop()
    assert not thread.is_alive() and thread.loop.is_closed()


def test_serve_runs_the_service_until_stop_on_the_loop_thread():
    service = Service()
    thread = LoopThread("test-service")
    thread.serve(service.start, service.stop)
    assert service.events == ["started"]
    assert not service.task.done(), "the service's TaskGroup child lives on after start() returned"
    thread.stop()
    assert service.events == ["started", "stopped"]
    assert service.task.cancelled()
    assert service.threads == {thread._thread.ident}
    assert not thread.is_alive()


def test_a_start_failure_reaches_the_caller_and_nothing_is_stopped():
    stopped = []

    async def start():
        raise OSError("address already in use")

    async def stop():
        stopped.append(True)

    thread = LoopThread("test-failed-start")
    with pytest.raises(OSError, match="address already in use"):
        thread.serve(start, stop)
    thread.stop()
    assert stopped == [] and not thread.is_alive()


def test_a_crashed_child_stops_the_service_through_its_owner(caplog):
    """The service's TaskGroup cancels its parent when a child fails: that
    parent is the task serve() started, which then runs the service's stop()."""

    async def crash():
        await asyncio.sleep(0.01)
        raise RuntimeError("a background loop crashed")

    service = Service(child=crash)
    thread = LoopThread("test-crash")
    thread.serve(service.start, service.stop)
    wait_for(lambda: "stopped" in service.events, what="the service's stop", interval=0.01)
    thread.stop()  # the failure is logged, not raised again
    assert service.events == ["started", "stopped"]
    assert any("stopped with an error" in record.message for record in caplog.records)


def test_a_second_service_on_one_thread_is_refused():
    service = Service()
    thread = LoopThread("test-one-service")
    try:
        thread.serve(service.start, service.stop)
        with pytest.raises(RuntimeError, match="already serves"):
            thread.serve(service.start, service.stop)
    finally:
        thread.stop()
    assert service.events == ["started", "stopped"]
