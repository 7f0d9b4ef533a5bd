"""Disk faults: damage a stopped broker's files, or make a running broker's
writes and fsyncs fail for a while.

Offline (the broker is down, e.g. after a SIGKILL):

- ``truncate_tail(partition_dir, rng)`` cuts the active segment at a random
  byte inside its last batch, as a torn write leaves it;
- ``flip_byte(partition_dir, rng)`` flips one byte of the active segment's
  last batch, as a bad sector would.

Online, across processes: a broker started with ``ONCEFLOW_DISK_FAULTS``
naming a control file uses ``ControlledDiskIO`` for its logs (the broker's
composition calls ``io_from_environment`` once and passes the DiskIO down); the harness
writes the file through ``DiskFaultControl`` (``fail_writes(errno, seconds)``,
``fail_fsyncs``, ``tear_next_write``, ``clear``). A failing write first writes
half its bytes (the worst case for a log); a log whose write or fsync failed
refuses appends until the broker restarts and recovers it, which is what
Kafka does with a failed log directory.

The ``storage.torn_write`` crash point (``faults.points``) makes the Nth
segment write stop halfway and the process exit: a torn write made by the
broker itself rather than by a tool.
"""

from __future__ import annotations

import errno
import json
import os
import random
import time

import attrs

from faults import points
from storage.durable import DiskIO, replace_file

ENVIRONMENT_VARIABLE = "ONCEFLOW_DISK_FAULTS"
TORN_WRITE_POINT = "storage.torn_write"
ERRNOS = {"EIO": errno.EIO, "ENOSPC": errno.ENOSPC, "EDQUOT": errno.EDQUOT}
BATCH_LENGTH_OFFSET, BATCH_OVERHEAD = 8, 12  # a batch: base offset (8), length (4), then `length` bytes


# -- offline damage -----------------------------------------------------------------------------


def active_segment(partition_dir: str) -> str:
    logs = sorted(name for name in os.listdir(partition_dir) if name.endswith(".log"))
    if not logs:
        raise FileNotFoundError(f"no segment in {partition_dir}")
    return os.path.join(partition_dir, logs[-1])


def batch_starts(path: str) -> list[int]:
    """Byte positions of the whole batches in a segment file."""
    starts, position = [], 0
    with open(path, "rb") as file:
        data = file.read()
    while position + BATCH_OVERHEAD <= len(data):
        length = int.from_bytes(data[position + BATCH_LENGTH_OFFSET : position + BATCH_OVERHEAD], "big", signed=True)
        if length <= 0 or position + BATCH_OVERHEAD + length > len(data):
            break
        starts.append(position)
        position += BATCH_OVERHEAD + length
    return starts


@attrs.frozen
class Damage:
    path: str
    position: int  # first byte changed or cut
    size_before: int
    size_after: int
    last_intact_batch_end: int  # everything before this is untouched


def truncate_tail(partition_dir: str, rng: random.Random) -> Damage:
    """Cut the active segment somewhere inside its last batch (never at its start)."""
    path = active_segment(partition_dir)
    size = os.path.getsize(path)
    starts = batch_starts(path)
    if not starts:
        raise ValueError(f"{path} holds no whole batch to tear")
    last = starts[-1]
    cut = rng.randrange(last + 1, size)
    os.truncate(path, cut)
    return Damage(path, cut, size, cut, last)


def flip_byte(partition_dir: str, rng: random.Random) -> Damage:
    """Flip one byte inside the active segment's last batch (after its length field)."""
    path = active_segment(partition_dir)
    size = os.path.getsize(path)
    starts = batch_starts(path)
    if not starts:
        raise ValueError(f"{path} holds no whole batch to corrupt")
    last = starts[-1]
    where = rng.randrange(last + BATCH_OVERHEAD, size)
    with open(path, "r+b") as file:
        file.seek(where)
        byte = file.read(1)[0]
        file.seek(where)
        file.write(bytes([byte ^ (1 << rng.randrange(8))]))
    return Damage(path, where, size, size, last)


# -- online faults --------------------------------------------------------------------------------


class DiskFaultControl:
    """The harness's side: writes what the broker's disk should do now."""

    def __init__(self, path: str):
        self.path = path
        self.clear()

    def _write(self, state: dict) -> None:
        # Atomic: the broker polls the file and must never read half of it.
        replace_file(self.path, json.dumps(state).encode())

    def fail_writes(self, error: str = "ENOSPC", seconds: float = 1.0) -> None:
        self._write({"write": error, "until": time.time() + seconds})

    def fail_fsyncs(self, error: str = "EIO", seconds: float = 1.0) -> None:
        self._write({"fsync": error, "until": time.time() + seconds})

    def clear(self) -> None:
        self._write({})


class ControlledDiskIO(DiskIO):
    """The broker's side: system calls that fail while the control file says so."""

    CHECK_EVERY = 0.02  # seconds between looks at the control file

    def __init__(self, control_path: str):
        self.control_path = control_path
        self._state: dict = {}
        self._checked = 0.0
        self._mtime = 0.0

    def _current(self) -> dict:
        now = time.monotonic()
        if now - self._checked >= self.CHECK_EVERY:
            self._checked = now
            try:
                mtime = os.stat(self.control_path).st_mtime
                if mtime != self._mtime:
                    with open(self.control_path) as file:
                        self._state = json.load(file)
                    self._mtime = mtime
            except (OSError, ValueError):
                self._state = {}
        state = self._state
        if state and time.time() > state.get("until", 0):
            return {}
        return state

    def write(self, fd: int, data) -> None:
        failure = self._current().get("write")
        if failure:
            view = memoryview(data)
            os.write(fd, view[: len(view) // 2])
            raise OSError(ERRNOS[failure], f"injected {failure} on write")
        super().write(fd, data)

    def fsync(self, fd: int) -> None:
        failure = self._current().get("fsync")
        if failure:
            raise OSError(ERRNOS[failure], f"injected {failure} on fsync")
        super().fsync(fd)


class TornWriteIO(DiskIO):
    """Dies halfway through a write at the armed hit of ``storage.torn_write``."""

    def __init__(self, inner: DiskIO):
        self.inner = inner

    def write(self, fd: int, data) -> None:
        action = points.reached(TORN_WRITE_POINT)
        if action is not None:
            view = memoryview(data)
            os.write(fd, view[: max(1, len(view) // 2)])
            points.fire(TORN_WRITE_POINT, action)
        self.inner.write(fd, data)

    def fsync(self, fd: int) -> None:
        self.inner.fsync(fd)


def io_from_environment() -> DiskIO | None:
    """The DiskIO a broker should use, per ``ONCEFLOW_DISK_FAULTS`` and the
    ``storage.torn_write`` crash point (None: the real one)."""
    path = os.environ.get(ENVIRONMENT_VARIABLE)
    io = ControlledDiskIO(path) if path else None
    if points.is_armed(TORN_WRITE_POINT):
        io = TornWriteIO(io or DiskIO())
    return io
