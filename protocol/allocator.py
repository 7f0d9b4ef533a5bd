"""The process's buffer policy: how buffers of a MiB or more are allocated
and what glibc's malloc does with them once freed.

A onceflow process moves records in buffers of about a MiB: a request or
response frame read in place (``protocol.framing``), a fetch's records read
from a segment, a batch of encoded records. Each lives for one request and
is freed. glibc's malloc serves such a size with ``mmap`` (above its
threshold, 128 KiB at start) or from the heap, whose free top it gives back
to the kernel once it passes a second threshold; either way the next
buffer of that size is new memory: the kernel faults it in page by page
and zeroes every page, and takes it back again at the free. Measured on the
Spark sink's path (1M rows of 100 B through one broker process): the
broker took 12,000-14,000 page faults per million rows, and a profile of
it spent ~15% of its CPU faulting, zeroing and unmapping those pages.

``keep_freed_buffers()`` raises both thresholds (``mallopt``; setting them
also stops glibc adjusting them on its own), so buffers up to
``MMAP_THRESHOLD_BYTES`` come from the heap and a freed one stays there,
ready for the next, until the heap's free top passes ``TRIM_THRESHOLD_BYTES``.
The broker calls it at start; the Spark source and sink call it in the
executor's Python worker that reads or writes (their frames and batches
are the same sizes). The price: a process keeps up to that much freed
memory instead of returning it.

Only with glibc (``platform.libc_ver``); elsewhere (musl, macOS) it does
nothing and says so. pyarrow allocates through its own pool (mimalloc or
jemalloc), which this does not touch.

``uninitialised_bytearray(size)`` is a bytearray whose bytes are not set:
``bytearray(size)`` zero-fills, a memset of the whole buffer that is pure
waste for a frame received in place, whose every byte the socket writes
before it is handed out (``protocol.framing.FrameBuffer``; the memset was 8%
of the broker's user-space CPU on the Spark sink's path). Only for a buffer
whose every byte is written before any is read: what it holds until then is
whatever the memory held before (freed buffers of this same process). Where
CPython's C API is not reachable through ``ctypes.pythonapi`` (another
interpreter) it falls back to ``bytearray(size)``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

# glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

# glibc's cap for the mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX):
# a larger value is refused. Frames read in place reach 16 MiB
# (broker.server.IN_PLACE_FRAME_BYTES).
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 64 << 20

_applied: bool | None = None


def _bytearray_from_string_and_size():
    """CPython's ``PyByteArray_FromStringAndSize``, which with a NULL string
    allocates ``size`` bytes and leaves them as they are; None elsewhere."""
    try:
        function = ctypes.pythonapi.PyByteArray_FromStringAndSize
    except AttributeError:  # no pythonapi (not CPython) or no such function
        return None
    function.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
    # A NULL result raises the error it set (MemoryError when malloc fails;
    # CPython 3.11 may then also print a spurious SystemError as it frees
    # the half-made object, as bytearray(size) would not: frames are capped
    # well below sizes malloc refuses).
    function.restype = ctypes.py_object
    return function


_new_bytearray = _bytearray_from_string_and_size()


def uninitialised_bytearray(size: int) -> bytearray:
    """A bytearray of ``size`` bytes whose contents are not set (see the
    module's doc: only for a buffer written whole before it is read)."""
    if _new_bytearray is None or size <= 0:
        return bytearray(size)
    return _new_bytearray(None, size)


def keep_freed_buffers() -> bool:
    """Set the policy once per process; whether it is in force (False where
    the C library is not glibc or refused a setting)."""
    global _applied
    if _applied is None:
        _applied = _set_thresholds()
    return _applied


def _set_thresholds() -> bool:
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt answers 1 on success, 0 on a refused value.
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
