"""Which asyncio event loop a onceflow process runs on: uvloop's (libuv, in
C) where it is installed, asyncio's own otherwise, or the one a setting
names.

``onceflow broker`` asks ``loop_factory(name)`` for the loop of its
``event.loop`` setting (``broker.config``). Both loops run the same code:
what the broker relies on (start_server on an already listening socket,
signal handlers, run_in_executor, shield and cancellation, TCP_NODELAY on
accepted sockets) behaves alike on both, which
tests/onceflow/test_broker_event_loop.py checks on the real process. One
thing does not: uvloop reads a new connection before its handler runs, so
a server-side ``start_tls`` loses the ClientHello read ahead (uvloop issue
707); a broker with a TLS listener runs on asyncio.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable

UVLOOP = "uvloop"
ASYNCIO = "asyncio"
EVENT_LOOPS = (UVLOOP, ASYNCIO)


def uvloop_installed() -> bool:
    return importlib.util.find_spec(UVLOOP) is not None


def default_event_loop() -> str:
    """uvloop where it is installed (a plain dependency on Linux and macOS), else asyncio."""
    return UVLOOP if uvloop_installed() else ASYNCIO


def event_loop_name(value) -> str:
    """``value`` checked: one of ``EVENT_LOOPS``, and uvloop only where it can be imported."""
    name = str(value).strip().lower()
    if name not in EVENT_LOOPS:
        raise ValueError(f"event.loop must be one of {', '.join(EVENT_LOOPS)}, not {value!r}")
    if name == UVLOOP and not uvloop_installed():
        raise ValueError("event.loop=uvloop, but uvloop is not installed (pip install uvloop, or event.loop=asyncio)")
    return name


def running_event_loop() -> str:
    """The loop the caller runs on, read from the loop itself (not from a
    setting): what a process reports, so a choice cannot silently fall back."""
    module = type(asyncio.get_running_loop()).__module__
    return UVLOOP if module.split(".")[0] == UVLOOP else ASYNCIO


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """A new-loop function for ``asyncio.Runner(loop_factory=...)``."""
    if event_loop_name(name) == UVLOOP:
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop
