"""cancel_and_wait: the tasks finish, their cancellation ends there, the caller's never does."""

from __future__ import annotations

import asyncio

import pytest

from protocol.event_loop import loop_factory, uvloop_installed
from protocol.tasks import cancel_and_wait, every


def test_the_task_is_cancelled_and_its_cleanup_has_run_when_it_returns():
    async def scenario():
        cleaned = []

        async def worker():
            try:
                await asyncio.sleep(3600)
            finally:
                await asyncio.sleep(0.01)  # cleanup that itself waits
                cleaned.append(True)

        task = asyncio.create_task(worker())
        await asyncio.sleep(0)
        await cancel_and_wait(task, None)
        assert task.cancelled() and cleaned == [True]
        await cancel_and_wait(task)  # a finished task: nothing to do, nothing raised
        await cancel_and_wait()

    asyncio.run(scenario())


def test_the_callers_own_cancellation_is_never_swallowed():
    async def scenario():
        release = asyncio.Event()

        async def slow_to_stop():
            try:
                await asyncio.sleep(3600)
            finally:
                await release.wait()  # takes its time to finish

        task = asyncio.create_task(slow_to_stop())
        await asyncio.sleep(0)
        stopper = asyncio.create_task(cancel_and_wait(task))
        await asyncio.sleep(0.01)
        assert not stopper.done(), "it waits for the task to finish"
        stopper.cancel()  # whoever runs the stopper is being cancelled
        with pytest.raises(asyncio.CancelledError):
            await stopper
        assert stopper.cancelled()
        release.set()
        await asyncio.wait([task])
        assert task.cancelled()

    asyncio.run(scenario())


def test_a_task_that_had_failed_raises_in_its_owner():
    async def scenario():
        async def broken():
            raise LookupError("a bug in a background loop")

        async def asleep():
            await asyncio.sleep(3600)

        failed = asyncio.create_task(broken())
        await asyncio.sleep(0)
        with pytest.raises(LookupError, match="a bug"):
            await cancel_and_wait(failed, asyncio.create_task(asleep()))

        first, second = asyncio.create_task(broken()), asyncio.create_task(broken())
        await asyncio.sleep(0)
        with pytest.raises(ExceptionGroup) as raised:
            await cancel_and_wait(first, second)
        assert [type(e) for e in raised.value.exceptions] == [LookupError, LookupError]

    asyncio.run(scenario())


def test_owned_work_outlives_a_cancelled_caller_and_close_stops_it():
    from protocol.tasks import OwnedWork

    async def scenario():
        work = OwnedWork("test")
        gate = asyncio.Event()
        finished = []

        async def change():
            await gate.wait()
            finished.append(True)
            return "applied"

        caller = asyncio.create_task(work.run(change()))
        await asyncio.sleep(0)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller  # the caller loses its answer...
        assert len(work) == 1
        gate.set()
        await work.wait()
        assert finished == [True] and len(work) == 0  # ...the work ran to its end
        assert await work.run(change()) == "applied"

        cleaned = []

        async def endless():
            try:
                await asyncio.sleep(3600)
            finally:
                cleaned.append(True)

        work.start(endless())
        await asyncio.sleep(0)
        await work.close()
        assert cleaned == [True] and len(work) == 0

    asyncio.run(scenario())


def test_a_connection_server_owns_its_connections(caplog):
    """A bug serving one connection is logged and loses only that one;
    stop() cancels a connection under way and returns once it has closed."""
    from protocol.tasks import ConnectionServer

    async def scenario():
        closed = []

        async def serve(reader, writer):
            line = await reader.readline()
            if line == b"bug\n":
                raise RuntimeError("a bug")
            writer.write(b"hello\n")
            await writer.drain()
            try:
                await asyncio.sleep(3600)
            finally:
                closed.append(line)

        server = ConnectionServer(serve, host="127.0.0.1", port=0, limit=1024, name="test server")
        port = await server.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"bug\n")
        assert await reader.read() == b"", "the failed connection is closed"
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"hi\n")
        assert await reader.readline() == b"hello\n"
        assert server.open_connections == 1
        await server.stop()
        assert closed == [b"hi\n"] and server.open_connections == 0
        assert await reader.read() == b""
        writer.close()

    asyncio.run(scenario())
    assert "test server: serving" in caplog.text and "a bug" in caplog.text


def test_every_runs_its_step_on_time_through_a_failure_until_cancelled(caplog):
    """The periodic loop: a failing step is logged with the loop's name and
    the next step still runs; cancelling the task ends the loop."""
    steps = []

    async def step():
        steps.append(len(steps))
        if len(steps) == 2:
            raise RuntimeError("disk on fire")

    async def main():
        loop = asyncio.create_task(every(0.01, step, "test timers"))
        while len(steps) < 4:
            await asyncio.sleep(0.01)
        await cancel_and_wait(loop)
        return loop

    with caplog.at_level("ERROR", logger="protocol.tasks"):
        loop = asyncio.run(main())
    assert loop.cancelled() and steps[:4] == [0, 1, 2, 3]
    assert [record.getMessage() for record in caplog.records] == ["test timers failed"]


@pytest.mark.parametrize("event_loop", ["asyncio", pytest.param("uvloop", marks=pytest.mark.skipif(not uvloop_installed(), reason="no uvloop"))])
@pytest.mark.parametrize("pre_bound", [False, True], ids=["bound by the server", "listening_socket"])
def test_a_served_connection_has_nagle_off_however_the_listener_was_bound(pre_bound, event_loop):
    """Every accepted connection gets TCP_NODELAY, also on a socket from
    ``listening_socket`` (``onceflow broker`` binds with it), on either
    event loop the broker may run on: asyncio sets
    it only on sockets whose protocol is IPPROTO_TCP, and with Nagle on, a
    reply written in pieces waits for the client's delayed ACK (the copier's
    rate halved)."""
    import socket

    from protocol.tasks import ConnectionServer, listening_socket

    async def scenario():
        nodelay = asyncio.get_running_loop().create_future()

        async def serve(reader, writer):
            nodelay.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        sock = listening_socket("127.0.0.1", 0) if pre_bound else None
        server = ConnectionServer(serve, host="127.0.0.1", port=0, limit=1024, name="test server", sock=sock)
        port = await server.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            assert await asyncio.wait_for(nodelay, 10) != 0
        finally:
            writer.close()
            await server.stop()

    with asyncio.Runner(loop_factory=loop_factory(event_loop)) as runner:
        runner.run(scenario())
