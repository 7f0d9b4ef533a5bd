"""protocol.frame_stream over real sockets, on asyncio's loop and uvloop's
(the broker's): frames arrive whole and in order, a server's receiver stops
reading while its task does not ask and loses nothing when it reads again,
and the writer's drain waits while the peer does not read."""

from __future__ import annotations

import asyncio
import random
import struct

import pytest

from protocol.frame_stream import FrameReceiver
from protocol.framing import RECEIVE_SCRATCH_BYTES, ServerConnection


def _loops():
    yield pytest.param(asyncio.new_event_loop, id="asyncio")
    try:
        import uvloop
    except ImportError:
        return
    yield pytest.param(uvloop.new_event_loop, id="uvloop")


def run(new_loop, main):
    loop = new_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(main(), 60))
    finally:
        loop.close()


async def serve_one(pause_above: int | None, **framing_options):
    """A listener whose one connection is a server-side ``FrameReceiver``;
    returns the port and a future of (receiver, writer)."""
    loop = asyncio.get_running_loop()
    accepted = loop.create_future()
    server = await loop.create_server(
        lambda: FrameReceiver(
            ServerConnection(**framing_options), pause_above=pause_above, on_connected=lambda r, w: accepted.set_result((r, w)), server_side=True
        ),
        "127.0.0.1",
        0,
    )
    return server, server.sockets[0].getsockname()[1], accepted


def request_frames(count: int, seed: int) -> list[bytes]:
    """Request-shaped frames (ApiVersions v0 headers, correlation id i) of
    sizes from a few bytes to 300 KiB: some in place, some sliced."""
    rng = random.Random(seed)
    frames = []
    for index in range(count):
        size = rng.choice((0, 7, 900, 70_000, 300_000))
        frames.append(struct.pack(">hhih", 18, 0, index, -1) + rng.randbytes(size))
    return frames


def stream_of(frames: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(frame)) + frame for frame in frames)


@pytest.mark.parametrize("new_loop", list(_loops()))
def test_frames_sent_in_any_pieces_arrive_whole_and_in_order(new_loop):
    frames = request_frames(120, seed=5)

    async def main():
        server, port, accepted = await serve_one(pause_above=1 << 20)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        receiver, server_writer = await accepted

        async def take_all():
            got = []
            while await receiver.arrived():
                while (frame := receiver.framing.next_frame()) is not None:
                    got.append(bytes(frame))
            return got

        taking = asyncio.ensure_future(take_all())
        stream = stream_of(frames)
        rng = random.Random(11)
        position = 0
        while position < len(stream):  # pieces cut anywhere, a frame's size prefix too
            step = rng.randint(1, 200_000)
            writer.write(stream[position : position + step])
            position += step
            if rng.random() < 0.3:
                await writer.drain()
        writer.write_eof()
        assert await taking == frames
        writer.close()
        server_writer.close()
        server.close()

    run(new_loop, main)


@pytest.mark.parametrize("new_loop", list(_loops()))
def test_a_server_receiver_stops_reading_while_its_task_does_not_ask_and_loses_nothing(new_loop):
    """The task takes nothing for a while (a throttled connection, one at its
    in-flight limit): the receiver stops reading once ``pause_above`` bytes
    wait uncut, the rest stays in the sockets (the client's writes back
    up), and when the task asks again every frame comes, in order."""
    frames = request_frames(400, seed=9)
    pause_above = 256 << 10

    async def main():
        server, port, accepted = await serve_one(pause_above=pause_above)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        stream = stream_of(frames)
        writer.write(stream)  # ~40 MiB: far more than the sockets' buffers hold
        receiver, server_writer = await accepted
        for _ in range(50):
            await asyncio.sleep(0.02)  # the loop turns: whatever the transport would read, it reads now
        held = receiver.framing.buffered_bytes
        assert held <= pause_above + RECEIVE_SCRATCH_BYTES + 300_100  # stopped: at most one read past the bound, and one frame in place
        assert writer.transport.get_write_buffer_size() > len(stream) // 2  # the rest waits on the client's side
        got = []
        while len(got) < len(frames) and await receiver.arrived():
            while (frame := receiver.framing.next_frame()) is not None:
                got.append(bytes(frame))
            assert receiver.framing.backlog_bytes <= pause_above + RECEIVE_SCRATCH_BYTES
        assert got == frames
        writer.close()
        server_writer.close()
        server.close()

    run(new_loop, main)


@pytest.mark.parametrize("new_loop", list(_loops()))
def test_the_writer_on_a_receiver_drains_only_once_the_peer_reads(new_loop):
    """``StreamWriter.drain`` on the receiver waits while the peer does not
    read (its flow control is the receiver's own), returns once it does,
    and fails once the peer is gone."""

    async def main():
        server, port, accepted = await serve_one(pause_above=None)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        receiver, server_writer = await accepted
        server_writer.write(b"x" * (32 << 20))
        drained = asyncio.ensure_future(server_writer.drain())
        await asyncio.sleep(0.2)
        assert not drained.done()  # the client reads nothing yet
        total = 0
        while total < 32 << 20:
            total += len(await reader.read(1 << 20))
        await asyncio.wait_for(drained, 10)
        server_writer.write(b"y" * (32 << 20))
        writer.transport.abort()  # the peer vanishes with our bytes unread
        with pytest.raises(ConnectionError):
            for _ in range(100):
                await server_writer.drain()
                await asyncio.sleep(0.02)
                server_writer.write(b"z" * (1 << 20))
        assert not await receiver.arrived()
        server.close()

    run(new_loop, main)
