"""Numbers the Kafka protocol gives a meaning to inside request and response
fields, by Kafka's names, for the broker and the clients alike (API keys are
``protocol.messages.ApiKey``, error codes ``protocol.errors.ErrorCode``).
"""

from __future__ import annotations

from enum import IntEnum


class IsolationLevel(IntEnum):
    """``isolation_level`` of Fetch and ListOffsets (Kafka's ``IsolationLevel``)."""

    READ_UNCOMMITTED = 0  # up to the high watermark
    READ_COMMITTED = 1  # up to the last stable offset, aborted transactions listed


class CoordinatorType(IntEnum):
    """``key_type`` of FindCoordinator (Kafka's ``FindCoordinatorRequest.CoordinatorType``)."""

    GROUP = 0
    TRANSACTION = 1


class ConfigResourceType(IntEnum):
    """``resource_type`` of DescribeConfigs and (Incremental)AlterConfigs (Kafka's ``ConfigResource.Type``)."""

    TOPIC = 2
    BROKER = 4


class OffsetSpec(IntEnum):
    """The special ``timestamp`` values of a ListOffsets request (Kafka's
    ``ListOffsetsRequest`` constants): which offset to answer instead of the
    one for a time."""

    LATEST = -1  # the end (high watermark, or the last stable offset under read_committed)
    EARLIEST = -2  # the log start offset
    MAX_TIMESTAMP = -3  # the record with the largest timestamp (KIP-734)
    EARLIEST_LOCAL = -4  # KIP-405; one tier here, so the log start offset
    LATEST_TIERED = -5  # KIP-1005; nothing is tiered here
