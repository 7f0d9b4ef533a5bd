"""The broker's seam to ``storage``: how a partition log is opened from topic
properties, with the DiskIO and index budget the broker chose when it was
composed (``broker.broker``), and which topic settings exist (for validation
and DescribeConfigs)."""

from __future__ import annotations

from typing import Callable

from storage import recovery
from storage.config import LogConfig, defaults
from storage.durable import DiskIO
from storage.group_commit import FlushObserver, FsyncRounds
from storage.index import IndexBudget
from storage.log import PartitionLog


def partition_log_opener(*, io: DiskIO | None, index_budget: IndexBudget, flush_observer: FlushObserver | None = None,
                         fsync_rounds: FsyncRounds | None = None) -> Callable[[str, dict], PartitionLog]:
    """``open_log(path, properties)`` for the ``ReplicaManager``: every log of
    one broker writes through ``io`` (None: the real system calls), keeps
    its indexes within the broker's one ``index_budget``, shares its
    group-commit rounds with the others (``fsync_rounds``: one fsync round
    for every partition waiting, data and internal topics alike) and
    reports those rounds to ``flush_observer`` (the broker's metrics, or None)."""

    def open_partition_log(path: str, properties: dict) -> PartitionLog:
        partition_log = PartitionLog.open(path, LogConfig.from_properties(properties), io=io, index_budget=index_budget, fsync_rounds=fsync_rounds)
        partition_log.committer.observer = flush_observer
        return partition_log

    return open_partition_log


def reconfigure_partition_log(partition_log: PartitionLog, properties: dict) -> None:
    """An open log takes its topic's settings as altered (IncrementalAlterConfigs,
    AlterConfigs): the properties validated already, as a ``LogConfig``."""
    partition_log.update_config(LogConfig.from_properties(properties))


def partition_needs_recovery(path: str) -> bool:
    """A partition directory changed since it was last whole
    (``storage.recovery.needs_recovery``): the broker opens these at start,
    after a stop that was not clean."""
    return recovery.needs_recovery(path)


def partition_holds_data(path: str) -> bool:
    """Whether a partition directory may hold records
    (``storage.recovery.holds_data``): the coordinators replay only these at
    start; the rest of their internal partitions open when first written."""
    return recovery.holds_data(path)


def validate_log_properties(properties: dict) -> None:
    LogConfig.from_properties(properties)


def log_config_defaults() -> dict[str, str]:
    return defaults()
