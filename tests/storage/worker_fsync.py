"""A disk seam for the storage tests of fsyncs on worker threads: such an
fsync can be held until the test releases it, and closing a descriptor
under it is recorded (the hazard of closing a file a worker still fsyncs)."""

from __future__ import annotations

import threading

from storage.segment import DiskIO


class HoldableWorkerFsync(DiskIO):
    """While ``hold`` is set, fsyncs on worker threads wait for ``release``;
    a descriptor closed while a worker fsyncs it is recorded."""

    def __init__(self, *, hold: bool = False):
        self.hold = threading.Event()
        if hold:
            self.hold.set()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.in_fsync: set[int] = set()
        self.closed_during_fsync: list[int] = []
        self.fsync_errors: list[OSError] = []
        self.lock = threading.Lock()

    def fsync(self, fd):
        if self.hold.is_set() and threading.current_thread() is not threading.main_thread():
            with self.lock:
                self.in_fsync.add(fd)
            self.entered.set()
            try:
                assert self.release.wait(10), "the test never released the fsync"
                super().fsync(fd)
            except OSError as error:
                self.fsync_errors.append(error)
                raise
            finally:
                with self.lock:
                    self.in_fsync.discard(fd)
            return
        super().fsync(fd)

    def close(self, fd):
        with self.lock:
            if fd in self.in_fsync:
                self.closed_during_fsync.append(fd)
        super().close(fd)

