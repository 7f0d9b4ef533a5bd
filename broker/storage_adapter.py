"""The broker's seam to ``storage``: how a partition log is opened from topic
properties (and with which DiskIO: the real one, or the fault harness's),
and which topic settings exist (for validation and DescribeConfigs)."""

from __future__ import annotations

from faults.disk import io_from_environment
from storage.config import LogConfig, defaults
from storage.log import PartitionLog

# The fault harness may make this broker's disk fail (ONCEFLOW_DISK_FAULTS).
DISK_IO = io_from_environment()


def open_partition_log(path: str, properties: dict) -> PartitionLog:
    return PartitionLog.open(path, LogConfig.from_properties(properties), io=DISK_IO)


def validate_log_properties(properties: dict) -> None:
    LogConfig.from_properties(properties)


def log_config_defaults() -> dict[str, str]:
    return defaults()
