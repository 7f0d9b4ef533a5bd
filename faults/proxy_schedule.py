"""Fault schedules for the proxy: a seeded, reproducible list of timed fault
actions (``random_schedule``) and the players that apply one to a proxy,
from a thread (``run_schedule``, on a ``ThreadedFaultProxy``) or on the
proxy's loop (``run_schedule_async``, on a ``FaultProxy``)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import TYPE_CHECKING, Iterable, NamedTuple

from faults.proxy_state import BOTH, DOWNSTREAM, UPSTREAM
from protocol.messages import ApiKey

if TYPE_CHECKING:
    from faults.proxy import FaultProxy, ThreadedFaultProxy


class ScheduledAction(NamedTuple):
    at: float  # seconds from the start of the run
    action: str  # a FaultProxy method name
    args: dict  # its keyword arguments


# What run_schedule may call: every fault and its clearing, nothing else.
SCHEDULE_ACTIONS = frozenset({
    "cut", "refuse", "blackhole", "delay", "hold", "release", "delay_connection",
    "clear_connection_delays", "delay_requests", "drop_requests", "clear_requests", "heal",
})
SCHEDULE_KINDS = ("blackhole", "cut", "delay", "delay_connection", "delay_requests", "drop_requests", "hold", "refuse")
# Requests worth delaying or dropping in a transactional workload.
TRANSACTIONAL_API_KEYS = (ApiKey.PRODUCE, ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN, ApiKey.TXN_OFFSET_COMMIT)


def random_schedule(
    seed: int | str,
    duration: float,
    kinds: Iterable[str] = ("blackhole", "cut", "delay", "hold", "refuse"),
    *,
    quiet_seconds: tuple[float, float] = (0.5, 3.0),
    fault_seconds: tuple[float, float] = (0.2, 2.0),
    api_keys: tuple[int, ...] = TRANSACTIONAL_API_KEYS,
) -> list[ScheduledAction]:
    """Fault episodes, one at a time, separated by quiet spells, within
    ``duration`` seconds; every fault is cleared by the end. The same seed and
    arguments always give the same list (``kinds`` order does not matter).

    Episodes: ``cut`` (one action); ``refuse``, ``blackhole``, ``delay``,
    ``hold``, ``delay_requests``, ``drop_requests`` and ``delay_connection``
    (an accept index among the first four connections) are applied, then
    cleared after a while.
    """
    chosen = sorted(set(kinds))
    unknown = set(chosen) - set(SCHEDULE_KINDS)
    if unknown or not chosen:
        raise ValueError(f"kinds must be a non-empty subset of {SCHEDULE_KINDS}, unknown: {sorted(unknown)}")
    rng = random.Random(seed)
    schedule: list[ScheduledAction] = []

    def at(seconds: float) -> float:
        return round(min(seconds, duration), 3)

    now = rng.uniform(*quiet_seconds)
    while now < duration:
        kind = rng.choice(chosen)
        end = now + rng.uniform(*fault_seconds)
        direction = rng.choice((UPSTREAM, DOWNSTREAM, BOTH))
        if kind == "cut":
            schedule.append(ScheduledAction(at(now), "cut", {}))
            end = now
        elif kind == "refuse":
            schedule += [ScheduledAction(at(now), "refuse", {"on": True}), ScheduledAction(at(end), "refuse", {"on": False})]
        elif kind == "blackhole":
            schedule += [
                ScheduledAction(at(now), "blackhole", {"direction": direction, "on": True}),
                ScheduledAction(at(end), "blackhole", {"direction": direction, "on": False}),
            ]
        elif kind == "delay":
            seconds = round(rng.uniform(0.01, 0.5), 3)
            jitter = round(rng.uniform(0.0, 0.2), 3) if rng.random() < 0.5 else 0.0
            schedule += [
                ScheduledAction(at(now), "delay", {"direction": direction, "seconds": seconds, "jitter": jitter}),
                ScheduledAction(at(end), "delay", {"direction": direction, "seconds": 0.0, "jitter": 0.0}),
            ]
        elif kind == "hold":
            schedule += [ScheduledAction(at(now), "hold", {"direction": direction}), ScheduledAction(at(end), "release", {"direction": direction})]
        elif kind in ("delay_requests", "drop_requests"):
            api_key = rng.choice(api_keys)
            args = {"api_key": api_key, "times": rng.choice((None, 1, 2))}
            if kind == "delay_requests":
                args["seconds"] = round(rng.uniform(0.1, 2.0), 3)
            schedule += [ScheduledAction(at(now), kind, args), ScheduledAction(at(end), "clear_requests", {"api_key": api_key})]
        else:  # delay_connection
            args = {"match": rng.randrange(4), "seconds": round(rng.uniform(0.1, 1.0), 3), "direction": direction}
            schedule += [ScheduledAction(at(now), "delay_connection", args), ScheduledAction(at(end), "clear_connection_delays", {})]
        now = end + rng.uniform(*quiet_seconds)
    return schedule


def _check_schedule(schedule: Iterable[ScheduledAction]) -> list[ScheduledAction]:
    items = [ScheduledAction(*item) for item in schedule]
    for item in items:
        if item.action not in SCHEDULE_ACTIONS:
            raise ValueError(f"not a schedule action: {item.action!r}")
    return sorted(items, key=lambda item: item.at)


def run_schedule(proxy: ThreadedFaultProxy, schedule: Iterable[ScheduledAction], *, stop: threading.Event | None = None) -> int:
    """Apply each action at its time (seconds after the call); blocks until the
    last one. Setting ``stop`` ends early. Returns how many actions ran."""
    items = _check_schedule(schedule)
    stop = stop or threading.Event()
    started = time.monotonic()
    applied = 0
    for item in items:
        if stop.wait(max(0.0, started + item.at - time.monotonic())):
            break
        getattr(proxy, item.action)(**item.args)
        applied += 1
    return applied


async def run_schedule_async(proxy: FaultProxy, schedule: Iterable[ScheduledAction]) -> int:
    """``run_schedule`` for a ``FaultProxy`` on the running loop."""
    items = _check_schedule(schedule)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for item in items:
        await asyncio.sleep(max(0.0, started + item.at - loop.time()))
        getattr(proxy, item.action)(**item.args)
    return len(items)
