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
segment (``.log``) write stop halfway and the process exit: a torn write made
by the broker itself rather than by a tool.

A power cut, across processes: a broker started with
``ONCEFLOW_FSYNC_JOURNAL`` naming a file uses ``FsyncJournalIO``, which
appends to that file, after each fsync returns, how long the file was when
the fsync began (what the machine can no longer lose), and each rename over
a file (``replace_file``: the target's durable length becomes the renamed
file's). After a SIGKILL, ``cut_power(data_dir, journal, rng)`` cuts every
segment file and every index file (``.index``, ``.timeindex``,
``.txnindex``: they go through the same ``DiskIO``) of every partition back
to a length between that and what was written (torn anywhere, or at a batch
or entry boundary): what a machine crash may leave, where a SIGKILL alone
leaves the page cache whole. Snapshots and checkpoints stay as written, and
a lost directory entry (a new file or directory vanishing whole) is not
modelled.
A segment's length counts its data only (``written_length``): the active
segment may run on with zeros written ahead of it (``storage.segment``),
which the journal does not count as written and a cut may leave in place
of a lost write; ``cut_zeros_ahead`` trims a stopped broker's segment to
its data before a test appends torn bytes by hand.
``lose_unsynced(journal, paths)`` is the cut's worst case for the files
named (every byte no fsync covered is gone) and keeps the others whole: the
power cut a test needs to reach one exact state (a transactional batch kept,
the ``__transaction_state`` record that named its partition lost).

``ONCEFLOW_KEEP_UNKNOWN_TRANSACTIONS=1`` starts a broker without the check
that aborts, at start, open transactions no transaction state names (what
such a power cut leaves): only to show what the check prevents.
``ONCEFLOW_KEEP_PRODUCER_OF_UNKNOWN_TRANSACTIONS=1`` starts one that
aborts those transactions but leaves their producer's own transaction
(and epoch) as the recovered state has it: only to show how its commit
then loses the answered batch, or is told it committed.
``ONCEFLOW_KEEP_ONGOING_TRANSACTIONS=1`` starts one (with
``transaction.durable.at.end``) that keeps, after an unclean stop, the
transactions left Ongoing instead of aborting them: only to show the hole
a power cut leaves in such a transaction once it commits.
``ONCEFLOW_KEEP_ENDED_EPOCHS=1`` starts one (with
``transaction.durable.at.end``) that keeps, after an unclean stop, the
epoch of every transactional id whose last transaction ended instead of
fencing it: only to show how a transaction the cut took back whole is then
committed with a hole, or told it committed.
"""

from __future__ import annotations

import errno
import json
import os
import random
import time
import uuid

import attrs

from faults import points
from storage.durable import DiskIO, replace_file
from storage.index import OFFSET_ENTRY, TIME_ENTRY
from storage.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX
from storage.txn_index import ENTRY_SIZE as TXN_ENTRY_SIZE

ENVIRONMENT_VARIABLE = "ONCEFLOW_DISK_FAULTS"
FSYNC_JOURNAL_VARIABLE = "ONCEFLOW_FSYNC_JOURNAL"
KEEP_UNKNOWN_TRANSACTIONS_VARIABLE = "ONCEFLOW_KEEP_UNKNOWN_TRANSACTIONS"
KEEP_ONGOING_TRANSACTIONS_VARIABLE = "ONCEFLOW_KEEP_ONGOING_TRANSACTIONS"
KEEP_ENDED_EPOCHS_VARIABLE = "ONCEFLOW_KEEP_ENDED_EPOCHS"
KEEP_PRODUCER_OF_UNKNOWN_VARIABLE = "ONCEFLOW_KEEP_PRODUCER_OF_UNKNOWN_TRANSACTIONS"
LEAVE_DECIDED_UNMARKED_VARIABLE = "ONCEFLOW_LEAVE_DECIDED_UNMARKED"
BOOT_ID_VARIABLE = "ONCEFLOW_BOOT_ID"
TORN_WRITE_POINT = "storage.torn_write"
ERRNOS = {"EIO": errno.EIO, "ENOSPC": errno.ENOSPC, "EDQUOT": errno.EDQUOT}
BATCH_LENGTH_OFFSET, BATCH_OVERHEAD = 8, 12  # a batch: base offset (8), length (4), then `length` bytes
# The files a power cut may cut, and the size of one whole entry of each (a
# segment's "entries" are its batches: see ``whole_entry_ends``).
INDEX_ENTRY_SIZES = {INDEX_SUFFIX: OFFSET_ENTRY.size, TIME_INDEX_SUFFIX: TIME_ENTRY.size, TXN_INDEX_SUFFIX: TXN_ENTRY_SIZE}


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


def data_end(path: str, starts: list[int]) -> int:
    """Where a segment's last whole batch (of ``starts``) ends: its data's
    end, short of the file's length when zeros were written ahead of it
    (``storage.segment``) and the broker stopped before cutting them."""
    if not starts:
        return 0
    with open(path, "rb") as file:
        file.seek(starts[-1] + BATCH_LENGTH_OFFSET)
        length = int.from_bytes(file.read(4), "big", signed=True)
    return starts[-1] + BATCH_OVERHEAD + length


def written_length(path: str) -> int:
    """How much of a segment or index file was written: its length, short
    of any zeros written ahead past a segment's data (what an fsync
    journal's durable length is compared with)."""
    length = os.path.getsize(path)
    if not path.endswith(LOG_SUFFIX):
        return length
    end = data_end(path, batch_starts(path))
    with open(path, "rb") as file:
        file.seek(end)
        rest = file.read()
    return end + len(rest.rstrip(b"\0"))  # bytes past the whole batches (a torn one), not the zeros


def cut_zeros_ahead(path: str) -> int:
    """Cut a stopped broker's segment back to its written data (any zeros
    written ahead of it gone), so that bytes appended by hand land where
    the broker's next write would have; the new length."""
    length = written_length(path)
    os.truncate(path, length)
    return length


def truncate_tail(partition_dir: str, rng: random.Random) -> Damage:
    """Cut the active segment somewhere inside its last batch (never at its start)."""
    path = active_segment(partition_dir)
    starts = batch_starts(path)
    if not starts:
        raise ValueError(f"{path} holds no whole batch to tear")
    last = starts[-1]
    size = data_end(path, starts)
    cut = rng.randrange(last + 1, size)
    os.truncate(path, cut)
    return Damage(path, cut, size, cut, last)


def flip_byte(partition_dir: str, rng: random.Random) -> Damage:
    """Flip one byte inside the active segment's last batch (after its length field)."""
    path = active_segment(partition_dir)
    starts = batch_starts(path)
    if not starts:
        raise ValueError(f"{path} holds no whole batch to corrupt")
    last = starts[-1]
    size = data_end(path, starts)
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

    def slow_fsyncs(self, delay: float, seconds: float = 3600.0) -> None:
        """Each fsync takes ``delay`` seconds longer (a slower device) for ``seconds``."""
        self._write({"fsync_delay": delay, "until": time.time() + seconds})

    def clear(self) -> None:
        self._write({})


class ControlledDiskIO(DiskIO):
    """The broker's side: system calls that fail while the control file says so."""

    CHECK_EVERY = 0.02  # seconds between looks at the control file

    def __init__(self, control_path: str):
        self.control_path = control_path
        self._state: dict = {}
        self._checked = 0.0
        self._version: tuple | None = None  # (inode, mtime, size) of the control file last read

    def _current(self) -> dict:
        now = time.monotonic()
        if now - self._checked >= self.CHECK_EVERY:
            self._checked = now
            try:
                status = os.stat(self.control_path)
                # The control file is replaced whole (a new inode each time):
                # two writes within the clock's coarse tick share an mtime.
                version = (status.st_ino, status.st_mtime_ns, status.st_size)
                if version != self._version:
                    with open(self.control_path) as file:
                        self._state = json.load(file)
                    self._version = version
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
        state = self._current()
        failure = state.get("fsync")
        if failure:
            raise OSError(ERRNOS[failure], f"injected {failure} on fsync")
        if state.get("fsync_delay"):
            time.sleep(state["fsync_delay"])  # a slower device: each fsync takes this much longer
        super().fsync(fd)


class TornWriteIO(DiskIO):
    """Dies halfway through a segment (``.log``) write at the armed hit of
    ``storage.torn_write``; other files' writes are not counted."""

    def __init__(self, inner: DiskIO):
        self.inner = inner

    def write(self, fd: int, data) -> None:
        action = points.reached(TORN_WRITE_POINT) if os.readlink(f"/proc/self/fd/{fd}").endswith(LOG_SUFFIX) else None
        if action is not None:
            view = memoryview(data)
            os.write(fd, view[: max(1, len(view) // 2)])
            points.fire(TORN_WRITE_POINT, action)
        self.inner.write(fd, data)

    def fsync(self, fd: int) -> None:
        self.inner.fsync(fd)


class FsyncJournalIO(DiskIO):
    """Appends "SIZE PATH" to the journal after each fsync of a file: SIZE
    is the file's length when the fsync began (bytes appended meanwhile,
    from the loop while a worker fsyncs, are not covered), or, for a file
    this process wrote through ``write``, where its written data ended then
    (a segment's zeros written ahead, ``DiskIO.write_zeros``, do not go
    through ``write``: what a cut past the data end takes is only zeros). The line is
    written before the fsync's caller learns it returned, so nothing is
    acknowledged that the journal does not cover. A truncation is journaled
    too ("SIZE PATH" with the new length, marked "T"): what lies past it is
    no longer durable, whatever an fsync covered before. One journal per
    broker run: a restart with the same journal would count the recovered
    files' old fsyncs."""

    def __init__(self, inner: DiskIO, journal_path: str):
        self.inner = inner
        self.journal = os.open(journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.data_ends: dict[int, int] = {}  # per descriptor written through ``write``: where its data ends

    def _note(self, line: str) -> None:
        data = line.encode()
        if os.write(self.journal, data) != len(data):  # O_APPEND: one line per write, whole
            raise OSError(errno.EIO, "fsync journal: short write")

    def open(self, path: str, flags: int) -> int:
        return self.inner.open(path, flags)

    def write(self, fd: int, data) -> None:
        self.inner.write(fd, data)
        end = os.lseek(fd, 0, os.SEEK_CUR)
        if end > self.data_ends.get(fd, 0):
            self.data_ends[fd] = end

    def pread(self, fd: int, size: int, position: int) -> bytes:
        return self.inner.pread(fd, size, position)

    def truncate(self, fd: int, size: int) -> None:
        self.inner.truncate(fd, size)
        if fd in self.data_ends:
            self.data_ends[fd] = min(self.data_ends[fd], size)
        self._note(f"T{size} {os.path.realpath(f'/proc/self/fd/{fd}')}\n")

    def close(self, fd: int) -> None:
        self.data_ends.pop(fd, None)
        self.inner.close(fd)

    def replace(self, source: str, target: str) -> None:
        source, target = (os.path.join(os.path.realpath(os.path.dirname(path) or "."), os.path.basename(path)) for path in (source, target))
        self.inner.replace(source, target)
        self._note(f"R{source}\0{target}\n")

    def fsync(self, fd: int) -> None:
        size = os.fstat(fd).st_size
        if fd in self.data_ends:
            size = min(size, self.data_ends[fd])
        self.inner.fsync(fd)
        self._note(f"{size} {os.path.realpath(f'/proc/self/fd/{fd}')}\n")


def durable_sizes(journal_path: str) -> dict[str, int]:
    """Per file (its real path), the longest length an fsync covered since
    its last truncation, or what the file renamed over it had (from
    ``FsyncJournalIO``'s journal)."""
    sizes: dict[str, int] = {}
    with open(journal_path, "rb") as journal:
        for line in journal:
            if not line.endswith(b"\n"):
                continue  # the process died writing it: that fsync's caller never went on
            if line.startswith(b"R"):
                source, target = line[1:-1].decode().split("\0")
                sizes[target] = sizes.pop(source, 0)
                continue
            size, path = line[:-1].decode().split(" ", 1)
            if size.startswith("T"):
                sizes[path] = min(int(size[1:]), sizes.get(path, 0))
            else:
                sizes[path] = max(int(size), sizes.get(path, 0))
    return sizes


def whole_entry_ends(path: str) -> list[int]:
    """The lengths at which a segment or index file ends on a whole batch or
    entry (its start excluded for a segment, as ``batch_starts``)."""
    if path.endswith(LOG_SUFFIX):
        return batch_starts(path)
    entry_size = INDEX_ENTRY_SIZES[os.path.splitext(path)[1]]
    return list(range(0, os.path.getsize(path) + 1, entry_size))


def cut_to_durable(durable_size: dict[str, int], directories, rng: random.Random) -> list[Damage]:
    """Cut every segment and index file in ``directories`` back to a length
    between its durable one (0 if never fsynced) and its written one: torn
    anywhere past what is durable, and as often at a batch or entry boundary
    (a page written back whole), where recovery finds nothing torn at all.
    Returns the files actually cut (a draw may keep a file whole)."""
    damage = []
    for directory in directories:
        for name in sorted(os.listdir(directory)):
            if not name.endswith(LOG_SUFFIX) and os.path.splitext(name)[1] not in INDEX_ENTRY_SIZES:
                continue
            path = os.path.join(directory, name)
            length, written = os.path.getsize(path), written_length(path)
            durable = durable_size.get(os.path.realpath(path), durable_size.get(path, 0))
            if written <= durable:
                continue
            starts = [position for position in whole_entry_ends(path) if position >= durable]
            cut = rng.choice(starts + [written]) if rng.random() < 0.5 else rng.randint(durable, written)
            if cut >= written:
                continue
            if written < length and rng.random() < 0.5:
                # Zeros were written ahead of the data: a write the cut
                # takes back over them leaves zeros, not a shorter file.
                with open(path, "r+b") as file:
                    file.seek(cut)
                    file.write(bytes(written - cut))
                damage.append(Damage(path, cut, length, length, durable))
            else:
                os.truncate(path, cut)
                damage.append(Damage(path, cut, length, cut, durable))
    return damage


def cut_power(data_dir: str, journal_path: str, rng: random.Random) -> list[Damage]:
    """After a SIGKILL of a broker that ran with ``FsyncJournalIO``: lose or
    tear what no fsync covered of the segment and index files in every
    partition directory of ``data_dir``."""
    directories = [os.path.join(data_dir, name) for name in sorted(os.listdir(data_dir)) if os.path.isdir(os.path.join(data_dir, name))]
    return cut_to_durable(durable_sizes(journal_path), directories, rng)


def lose_unsynced(journal_path: str, paths) -> list[Damage]:
    """After a SIGKILL of a broker that ran with ``FsyncJournalIO``: cut
    each segment or index file in ``paths`` back to exactly what an fsync
    covered (0 if none did); files not named stay as written."""
    durable_size = durable_sizes(journal_path)
    damage = []
    for path in paths:
        written = written_length(path)
        durable = durable_size.get(os.path.realpath(path), 0)
        if written > durable:
            os.truncate(path, durable)
            damage.append(Damage(path, durable, written, durable, durable))
    return damage


def keeps_unknown_transactions() -> bool:
    """Whether this broker was started without its check for open
    transactions no transaction state names (``KEEP_UNKNOWN_TRANSACTIONS_VARIABLE``)."""
    return os.environ.get(KEEP_UNKNOWN_TRANSACTIONS_VARIABLE) == "1"


def keeps_producer_of_unknown_transactions() -> bool:
    """Whether this broker was started without ending, at start, the
    transaction of a producer whose batch was found in no transaction
    (``KEEP_PRODUCER_OF_UNKNOWN_VARIABLE``)."""
    return os.environ.get(KEEP_PRODUCER_OF_UNKNOWN_VARIABLE) == "1"


def leaves_decided_unmarked() -> bool:
    """Whether this broker was started without committing, at start, the
    open transactions whose decided commit lost its markers
    (``LEAVE_DECIDED_UNMARKED_VARIABLE``)."""
    return os.environ.get(LEAVE_DECIDED_UNMARKED_VARIABLE) == "1"


def keeps_ongoing_transactions() -> bool:
    """Whether this broker was started without aborting, after an unclean
    stop, the transactions left Ongoing (``KEEP_ONGOING_TRANSACTIONS_VARIABLE``)."""
    return os.environ.get(KEEP_ONGOING_TRANSACTIONS_VARIABLE) == "1"


def keeps_ended_epochs() -> bool:
    """Whether this broker was started without fencing, after an unclean
    stop, the epochs of the ids whose last transaction ended
    (``KEEP_ENDED_EPOCHS_VARIABLE``)."""
    return os.environ.get(KEEP_ENDED_EPOCHS_VARIABLE) == "1"


def boot_id_from_environment() -> str | None:
    """The boot of the kernel a broker should believe it runs in
    (``BOOT_ID_VARIABLE``), or None for the kernel's own: a start after a
    simulated power cut names a new one (``after_power_cut``)."""
    return os.environ.get(BOOT_ID_VARIABLE) or None


def after_power_cut(env: dict | None = None) -> dict:
    """The environment of a broker started after a (simulated) power cut:
    ``env`` plus a boot id of a new boot, as the machine rebooted. Without
    it the broker sees the kernel's boot id unchanged and takes the stop for
    the process's alone (nothing in the page cache lost)."""
    return {**(env or {}), BOOT_ID_VARIABLE: f"power-cut-{uuid.uuid4()}"}


def io_from_environment() -> DiskIO | None:
    """The DiskIO a broker should use, per ``ONCEFLOW_DISK_FAULTS``,
    ``ONCEFLOW_FSYNC_JOURNAL`` and the ``storage.torn_write`` crash point
    (None: the real one)."""
    path = os.environ.get(ENVIRONMENT_VARIABLE)
    io = ControlledDiskIO(path) if path else None
    if points.is_armed(TORN_WRITE_POINT):
        io = TornWriteIO(io or DiskIO())
    journal = os.environ.get(FSYNC_JOURNAL_VARIABLE)
    if journal:
        io = FsyncJournalIO(io or DiskIO(), journal)
    return io
