"""protocol.allocator: freed buffers of a few MiB are reused, not faulted in again.

Each case runs in a child interpreter (the policy is per process and stays
once set): it allocates and frees buffers of 1-8 MiB, three alive at a time
as a broker's frames and fetches are, and reports its minor page faults.
"""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from protocol import allocator

CHURN = """
import random, resource, sys
if sys.argv[1] == "keep":
    from protocol.allocator import keep_freed_buffers
    assert keep_freed_buffers()
rng = random.Random(7)
for _ in range(20):  # warm up: the heap grows to its working size
    held = [bytearray(rng.randrange(1 << 20, 8 << 20)) for _ in range(3)]
    del held
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(100):
    held = [bytearray(rng.randrange(1 << 20, 8 << 20)) for _ in range(3)]
    del held
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the policy is glibc's mallopt")


def page_faults(policy: str) -> int:
    done = subprocess.run([sys.executable, "-c", CHURN, policy], capture_output=True, text=True, timeout=60, check=True)
    return int(done.stdout.strip())


@glibc_only
def test_buffers_of_a_few_mib_are_reused_once_the_policy_is_set():
    default, kept = page_faults("default"), page_faults("keep")
    # 300 buffers of 4.5 MiB on average: ~350,000 pages if each were new memory.
    assert default > 50_000, f"glibc's own policy faulted only {default} pages: the churn this guards against did not happen"
    assert kept < default / 20, f"{kept} page faults with the policy against {default} without"


@glibc_only
def test_the_policy_is_set_once_and_reports_itself():
    assert allocator.keep_freed_buffers() is True
    assert allocator.keep_freed_buffers() is True


def test_elsewhere_the_policy_is_not_claimed(monkeypatch):
    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("musl", "1.2"))
    assert allocator.keep_freed_buffers() is False


@pytest.mark.parametrize("size", [0, 1, 7, 64 << 10, 3 << 20])
def test_an_uninitialised_bytearray_has_the_size_asked_and_is_writable(size):
    buffer = allocator.uninitialised_bytearray(size)
    assert type(buffer) is bytearray and len(buffer) == size
    pattern = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    buffer[:] = pattern
    assert buffer == pattern
    view = memoryview(buffer)
    assert not view.readonly and view.nbytes == size
    view[size // 2 : size // 2 + 1] = b"\xff" if size else b""
    assert buffer[size // 2 : size // 2 + 1] == (b"\xff" if size else b"")
    del view
    buffer += b"tail"  # and it stays an ordinary bytearray: it can grow
    assert len(buffer) == size + 4 and buffer.endswith(b"tail")


def test_an_uninitialised_bytearray_is_a_zeroed_one_where_the_c_api_is_not_reachable(monkeypatch):
    monkeypatch.setattr(allocator, "_new_bytearray", None)
    assert allocator.uninitialised_bytearray(5) == bytearray(5)
    monkeypatch.setattr(allocator.ctypes, "pythonapi", None)
    assert allocator._bytearray_from_string_and_size() is None
