"""How bytes reach the disk: the system calls the storage makes (``DiskIO``,
the seam tests and the fault harness replace to make a write or an fsync
fail) and the one way a small file's contents are replaced (``replace_file``).

``replace_file(path, data)`` leaves ``path`` holding either its old contents
or ``data``, never a mix, a prefix or nothing, whatever moment a crash (of the
process or of the machine) strikes, and once it returns the new contents
survive a machine crash:

1. write ``data`` to ``path + ".tmp"``;
2. fsync that file: otherwise the rename can reach the disk before the data
   (ext4 with delayed allocation and XFS both allow it), and a crash leaves
   ``path`` naming an empty or partly written file;
3. rename it over ``path``: a directory entry names the old inode or the new
   one, so a reader (and a crash) sees one or the other;
4. fsync the directory: the rename is a change to the directory, not to the
   file, and on Linux an fsync of the file does not make its new name
   durable (POSIX leaves it unspecified; ext4 and XFS persist a rename only
   with the journal commit a directory fsync forces). Without it a crash
   after an acknowledged replace can bring the old contents back: a log
   start offset that moves back (records deleted by DeleteRecords readable
   again), a producer-id block handed out twice, a topic created and then
   gone.

Every replaced file takes all four steps (checkpoint, producer snapshots,
index files, the topic registry, the producer-id mark), so no caller decides
again whether its file matters. Index files are the one case that could do
with less: they are derived data, and recovery rebuilds those of the segments
from the recovery point on. But the indexes of the segments below it are
trusted after a sanity check that cannot catch every stale index, and a
replace of an index (a torn trailing entry cut, entries truncated) happens
only in recovery, never on the produce path, so the one rule costs nothing a
user would measure. An index about to be rebuilt from its log is not replaced
at all: it is emptied in place and trusted only once its rebuilt entries and
the directory are fsynced (``storage.index``). A caller may leave step 4 to a
directory fsync of its own that follows at once (``sync_directory=False``),
so that several changes in one directory share one directory fsync.

A leftover ``*.tmp`` is an interrupted write (the original is intact);
``PartitionLog`` removes them when it opens.
"""

from __future__ import annotations

import errno
import os

TEMPORARY_SUFFIX = ".tmp"
_ZEROS = bytes(256 * 1024)


class DiskIO:
    """The system calls the log makes; replace methods to inject disk faults."""

    def open(self, path: str, flags: int) -> int:
        return os.open(path, flags, 0o644)

    def write(self, fd: int, data) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            if written <= 0:
                raise OSError(errno.EIO, "write made no progress")
            view = view[written:]

    def write_at(self, fd: int, data, position: int) -> None:
        """Write ``data`` at ``position`` of a file opened without O_APPEND
        (a segment's records, at its data end, which may lie inside zeros
        written ahead): a seek, then ``write``, so a seam that replaces
        ``write`` sees these writes too. The descriptor's file position is
        the loop's: no other thread writes through it."""
        os.lseek(fd, position, os.SEEK_SET)
        self.write(fd, data)

    def write_zeros(self, fd: int, position: int, length: int) -> None:
        """Write ``length`` zero bytes at ``position``: room written ahead of
        a segment's data (``storage.segment``), not data, so not through
        ``write`` (a seam that journals or fails data writes leaves these
        alone: nothing depends on them)."""
        while length > 0:
            written = os.pwrite(fd, memoryview(_ZEROS)[: min(length, len(_ZEROS))], position)
            if written <= 0:
                raise OSError(errno.EIO, "write made no progress")
            position += written
            length -= written

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def pread(self, fd: int, size: int, position: int) -> bytes:
        return os.pread(fd, size, position)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def close(self, fd: int) -> None:
        os.close(fd)

    def replace(self, source: str, target: str) -> None:
        os.replace(source, target)


def read_file(path: str, *, io: DiskIO) -> bytes:
    """The whole of ``path`` (FileNotFoundError if it is not there)."""
    fd = io.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        chunks, position = [], 0
        while position < size:
            chunk = io.pread(fd, size - position, position)
            if not chunk:
                break  # cut meanwhile
            chunks.append(chunk)
            position += len(chunk)
        return b"".join(chunks)
    finally:
        io.close(fd)


def append_file(path: str, data: bytes | bytearray | memoryview, *, io: DiskIO, fsync: bool = False) -> None:
    """Append ``data`` to ``path`` (created if missing), and fsync it if asked
    (an fsync with nothing to append still makes earlier appends durable)."""
    fd = io.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        if data:
            io.write(fd, data)
        if fsync:
            io.fsync(fd)
    finally:
        io.close(fd)


def empty_file(path: str, *, io: DiskIO) -> None:
    """Cut ``path`` to nothing (created if missing), in place and not durably."""
    fd = io.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        io.truncate(fd, 0)
    finally:
        io.close(fd)


def replace_file(path: str, data: bytes | bytearray | memoryview, *, io: DiskIO | None = None, sync_directory: bool = True) -> None:
    """Make ``data`` the contents of ``path``, atomically and durably (see the
    module's docstring). Raises OSError if any step fails; ``path`` then still
    holds its old contents and the temporary file is removed (best effort).

    ``sync_directory=False`` leaves step 4 to the caller, for one directory
    fsync after several changes in the same directory (a producer snapshot
    and the new segment of a roll): the caller must fsync the directory
    before anything relies on the new contents."""
    io = io or DiskIO()
    temporary = path + TEMPORARY_SUFFIX
    fd = io.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        try:
            io.write(fd, data)
            io.fsync(fd)
        finally:
            io.close(fd)
        io.replace(temporary, path)
    except BaseException:
        try:
            os.remove(temporary)
        except OSError:
            pass
        raise
    if sync_directory:
        fsync_directory(os.path.dirname(path) or ".", io=io)


def fsync_directory(directory: str, *, io: DiskIO | None = None) -> None:
    """Make the directory's entries (files created, renamed or removed in it)
    durable."""
    io = io or DiskIO()
    fd = io.open(directory, os.O_RDONLY)
    try:
        io.fsync(fd)
    finally:
        io.close(fd)
