"""The broker's seam to ``storage``: how a partition log is opened from topic
properties, and which topic settings exist (for validation and DescribeConfigs)."""

from __future__ import annotations

from storage.config import LogConfig, defaults
from storage.log import PartitionLog


def open_partition_log(path: str, properties: dict) -> PartitionLog:
    return PartitionLog.open(path, LogConfig.from_properties(properties))


def validate_log_properties(properties: dict) -> None:
    LogConfig.from_properties(properties)


def log_config_defaults() -> dict[str, str]:
    return defaults()
