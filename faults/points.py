"""Named crash points: places in the broker and clients where a test may kill
the process (or raise) on the Nth time execution passes.

The rooms that have crash points never import this module: each takes a
``crash_point(name)`` callable (a no-op by default) from whoever composes it.
The broker's composition (``broker.broker.FaultSeams.from_environment``) and
the harness's workloads pass ``point`` from here:

    point("coordinator.after_prepare_commit")

Points compiled in, by room:

- broker: ``coordinator.after_prepare_commit`` /
  ``coordinator.after_prepare_abort`` (the decision is durable),
  ``coordinator.decision_appended`` (with ``transaction.durable.at.end``:
  a commit's decision appended, its round with the data not yet run),
  ``coordinator.seal_appended`` (the same for a seal's record),
  ``coordinator.markers_partial`` (markers reached some partitions),
  ``coordinator.before_complete`` (Complete not yet appended: an abort's
  markers durable, a commit's not yet appended), ``coordinator.complete_appended`` (a commit's markers and
  Complete appended, the markers not yet durable), ``replicas.topics_registering`` /
  ``replicas.topic_registered`` (CreateTopics before and after its registry
  write, before the partition directories), ``groupcoord.after_pending_offsets``
  (a transactional offset commit is written, pending), ``storage.torn_write``
  (half of a batch reaches the segment, then the process dies: ``faults.disk``);
- the log cleaner's swap (``storage.cleaner``, given the broker's by its
  housekeeping): ``cleaner.cleaned_written``, ``cleaner.note_written``,
  ``cleaner.swap_renamed.<suffix>`` and ``cleaner.swap_renamed``,
  ``cleaner.old_renamed.<suffix>``, ``cleaner.old_renamed_deleted``,
  ``cleaner.live_renamed.<suffix>``, ``cleaner.note_removed``;
- our client: ``txn.before_commit`` (records produced, EndTxn not yet sent);
- the runner: ``streaming.after_commit_before_store_apply`` (the transaction
  committed, the local state store not yet updated);
- the Spark sink (``streaming.spark.crashpoints``, through its
  ``crashPointHook`` option): ``spark_sink.task_before_handle``,
  ``spark_sink.before_decision``, ``spark_sink.after_decision``,
  ``spark_sink.after_commit`` and ``spark_sink.after_all_commits``.

Disarmed (the default) a point costs one global lookup and a truth test.
Armed through the environment before the process starts::

    ONCEFLOW_CRASH_POINTS="coordinator.after_prepare_commit@1:exit,txn.before_commit@3:raise"

or in-process with ``arm(name, hit=1, action="exit"|"raise")``. "exit" ends
the process at once with ``os._exit(CRASH_EXIT_CODE)`` (no cleanup, no flush,
as SIGKILL would); "raise" raises ``CrashPointReached``.
"""

from __future__ import annotations

import logging
import os

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


def is_armed(name: str) -> bool:
    return name in _armed


def reached(name: str) -> str | None:
    """Count one pass through ``name``: its action ("exit" or "raise") when
    this is the armed hit, else None. For points that must do something of
    their own first (a torn write writes half a batch), then call ``fire``."""
    if not _armed:
        return None
    entry = _armed.get(name)
    if entry is None:
        return None
    entry[0] -= 1
    if entry[0] > 0:
        return None
    del _armed[name]
    return entry[1]


def fire(name: str, action: str) -> None:
    if action == "raise":
        raise CrashPointReached(name)
    # Through logging (whose handlers flush each line), so that a process
    # logging JSON says this in JSON too.
    logging.getLogger(__name__).critical("onceflow: crash point %s reached; exiting", name, extra={"crash_point": name})
    os._exit(CRASH_EXIT_CODE)


def point(name: str) -> None:
    if not _armed:
        return
    action = reached(name)
    if action is not None:
        fire(name, action)


for _name, (_hit, _action) in parse(os.environ.get(ENVIRONMENT_VARIABLE, "")).items():
    arm(_name, hit=_hit, action=_action)
