"""``storage.durable.replace_file``: the old contents or the new, never a
mix, and the new ones durable when it returns (file fsync before the rename,
directory fsync after), through the DiskIO seam and a real SIGKILL."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys

import pytest

from storage.durable import DiskIO, fsync_directory, replace_file
from tests.conftest import REPO


class RecordingDiskIO(DiskIO):
    """Notes every call (and, through ``os.replace``, the rename) in order."""

    def __init__(self, calls):
        self.calls = calls
        self.names = {}

    def open(self, path, flags):
        fd = super().open(path, flags)
        self.names[fd] = "directory" if os.path.isdir(path) else os.path.basename(path)
        return fd

    def write(self, fd, data):
        self.calls.append(("write", self.names[fd]))
        super().write(fd, data)

    def fsync(self, fd):
        self.calls.append(("fsync", self.names[fd]))
        super().fsync(fd)


class FailingDiskIO(DiskIO):
    def __init__(self, *, write_errno=None, fsync_errno=None):
        self.write_errno, self.fsync_errno = write_errno, fsync_errno

    def write(self, fd, data):
        if self.write_errno:
            os.write(fd, bytes(data)[: len(data) // 2])  # half of it, as a full disk leaves it
            raise OSError(self.write_errno, "injected")
        super().write(fd, data)

    def fsync(self, fd):
        if self.fsync_errno:
            raise OSError(self.fsync_errno, "injected")
        super().fsync(fd)


def test_replaces_the_contents_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "checkpoint"
    replace_file(str(path), b"first\n")
    replace_file(str(path), b"second, longer\n")
    assert path.read_bytes() == b"second, longer\n"
    replace_file(str(path), b"")
    assert path.read_bytes() == b""
    assert sorted(os.listdir(tmp_path)) == ["checkpoint"]


def test_the_file_is_fsynced_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    calls = []
    real_replace = os.replace

    def recording_replace(source, destination):
        calls.append(("rename", os.path.basename(source), os.path.basename(destination)))
        real_replace(source, destination)

    monkeypatch.setattr(os, "replace", recording_replace)
    replace_file(str(tmp_path / "mark"), b"next-block-start 1000\n", io=RecordingDiskIO(calls))
    assert calls == [("write", "mark.tmp"), ("fsync", "mark.tmp"), ("rename", "mark.tmp", "mark"), ("fsync", "directory")]


def test_without_sync_directory_the_caller_fsyncs_the_directory(tmp_path):
    calls = []
    io = RecordingDiskIO(calls)
    replace_file(str(tmp_path / "snapshot"), b"state", io=io, sync_directory=False)
    assert ("fsync", "directory") not in calls and (tmp_path / "snapshot").read_bytes() == b"state"
    fsync_directory(str(tmp_path), io=io)
    assert calls[-1] == ("fsync", "directory")


@pytest.mark.parametrize("failure", [{"fsync_errno": errno.EIO}, {"write_errno": errno.ENOSPC}], ids=["fsync-EIO", "write-ENOSPC"])
def test_a_failing_disk_leaves_the_old_contents(tmp_path, failure):
    path = tmp_path / "topics.json"
    replace_file(str(path), b'{"topics": {"kept": 1}}')
    with pytest.raises(OSError) as raised:
        replace_file(str(path), b'{"topics": {"kept": 1, "new": 2}}', io=FailingDiskIO(**failure))
    assert raised.value.errno == next(iter(failure.values()))
    assert path.read_bytes() == b'{"topics": {"kept": 1}}'
    assert sorted(os.listdir(tmp_path)) == ["topics.json"], "the temporary file is removed"


def test_a_failing_directory_fsync_is_reported(tmp_path):
    """The data reached the file, but its name may not be durable: the caller
    must hear of it (nothing may rely on the new contents)."""

    class DirectoryFsyncFails(DiskIO):
        def open(self, path, flags):
            fd = super().open(path, flags)
            self.directory_fd = fd if os.path.isdir(path) else getattr(self, "directory_fd", None)
            return fd

        def fsync(self, fd):
            if fd == self.directory_fd:
                raise OSError(errno.EIO, "injected")
            super().fsync(fd)

    with pytest.raises(OSError):
        replace_file(str(tmp_path / "checkpoint"), b"recovery-point 7\n", io=DirectoryFsyncFails())


KILLED_HALFWAY = r"""
import os, signal, sys
sys.path.insert(0, {repo!r})
from storage.durable import DiskIO, replace_file

class DiesBeforeTheRename(DiskIO):
    def fsync(self, fd):
        super().fsync(fd)
        os.kill(os.getpid(), signal.SIGKILL)  # the new data is written and synced, not yet renamed

replace_file({path!r}, b"new contents that must not appear", io=DiesBeforeTheRename())
"""


def test_a_process_killed_before_the_rename_leaves_the_old_contents(tmp_path):
    path = tmp_path / "checkpoint"
    replace_file(str(path), b"old contents\n")
    child = subprocess.run([sys.executable, "-c", KILLED_HALFWAY.format(repo=REPO, path=str(path))], capture_output=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert path.read_bytes() == b"old contents\n"
    assert (tmp_path / "checkpoint.tmp").exists(), "the interrupted write's temporary is what a log removes when it opens"


def test_a_log_removes_a_temporary_left_by_a_killed_replace(tmp_path):
    from storage.log import PartitionLog

    log = PartitionLog.open(str(tmp_path))
    log.close()
    (tmp_path / "checkpoint.tmp").write_bytes(b"recovery-point 99")
    reopened = PartitionLog.open(str(tmp_path))
    assert not (tmp_path / "checkpoint.tmp").exists() and reopened.log_end_offset == 0
    reopened.close()
