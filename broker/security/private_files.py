"""Files only the broker's user may read: the credential store and the ACLs.

``replace_private_file`` is ``storage.durable.replace_file`` (atomic and
durable) with the new file created mode 0600 before a byte is written to
it, so neither the temporary file nor its replacement is ever readable by
another user, whatever the umask. ``tighten`` takes group and other access
away from a file an earlier version wrote world-readable.
"""

from __future__ import annotations

import os
import stat

from storage.durable import DiskIO, replace_file

PRIVATE_MODE = 0o600


class _PrivateFiles:
    """A ``DiskIO`` (or a test's faulty one) whose created files are 0600."""

    def __init__(self, inner: DiskIO):
        self._inner = inner

    def open(self, path: str, flags: int) -> int:
        fd = self._inner.open(path, flags)
        if flags & os.O_CREAT:
            # fchmod, not the open's mode: a temporary file left by a crash
            # keeps its old mode when opened again.
            os.fchmod(fd, PRIVATE_MODE)
        return fd

    def __getattr__(self, name):
        return getattr(self._inner, name)


def replace_private_file(path: str, data: bytes, *, io: DiskIO | None = None) -> None:
    replace_file(path, data, io=_PrivateFiles(io or DiskIO()))


def tighten(path: str) -> None:
    """Remove group and other permissions from ``path`` if it has any."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        os.chmod(path, mode & 0o700)
