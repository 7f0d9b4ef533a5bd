"""Named crash points: places in the broker and clients where a test may kill
the process (or raise) on the Nth time execution passes.

    faults.point("coordinator.after_prepare_commit")

Disarmed (the default) a point costs one global lookup and a truth test.
Armed through the environment before the process starts::

    ONCEFLOW_CRASH_POINTS="coordinator.after_prepare_commit@1:exit,txn.before_commit@3:raise"

or in-process with ``arm(name, hit=1, action="exit"|"raise")``. "exit" ends
the process at once with ``os._exit(CRASH_EXIT_CODE)`` (no cleanup, no flush,
as SIGKILL would); "raise" raises ``CrashPointReached``.
"""

from __future__ import annotations

import os
import sys

ENVIRONMENT_VARIABLE = "ONCEFLOW_CRASH_POINTS"
CRASH_EXIT_CODE = 86


class CrashPointReached(Exception):
    pass


_armed: dict[str, list] = {}  # name -> [hits remaining, action]


def arm(name: str, *, hit: int = 1, action: str = "exit") -> None:
    if action not in ("exit", "raise"):
        raise ValueError(f"crash point action must be exit or raise, not {action!r}")
    if hit < 1:
        raise ValueError("hit counts from 1")
    _armed[name] = [hit, action]


def disarm_all() -> None:
    _armed.clear()


def parse(spec: str) -> dict[str, tuple[int, str]]:
    """``name[@hit][:action]`` entries separated by commas."""
    result = {}
    for entry in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = entry.partition(":")
        name, _, hit = name.partition("@")
        result[name] = (int(hit) if hit else 1, action or "exit")
    return result


def point(name: str) -> None:
    if not _armed:
        return
    entry = _armed.get(name)
    if entry is None:
        return
    entry[0] -= 1
    if entry[0] > 0:
        return
    del _armed[name]
    if entry[1] == "raise":
        raise CrashPointReached(name)
    sys.stderr.write(f"onceflow: crash point {name} reached; exiting\n")
    sys.stderr.flush()
    os._exit(CRASH_EXIT_CODE)


for _name, (_hit, _action) in parse(os.environ.get(ENVIRONMENT_VARIABLE, "")).items():
    arm(_name, hit=_hit, action=_action)
