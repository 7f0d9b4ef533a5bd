"""Why an app stops other than being asked to: the exceptions ``App.run``
raises, each with the exit code ``onceflow run`` gives it."""

from __future__ import annotations


class StreamingError(Exception):
    exit_code = 1


class ProcessingError(StreamingError):
    """A record failed (deserialization or the processor raised) and the app
    runs with ``on_error="stop"``: nothing of the open transaction was
    committed; the record is the next one a restart reads."""

    exit_code = 2

    def __init__(self, message: str, *, topic: str, partition: int, offset: int):
        super().__init__(message)
        self.topic, self.partition, self.offset = topic, partition, offset


class InstanceFencedError(StreamingError):
    """Another producer took this instance's transactional id (its epoch was
    bumped): this instance may write nothing more and stopped."""

    exit_code = 3


class StateDirInUseError(StreamingError):
    """Another process holds the state directory's lock."""

    exit_code = 4


class TopicsMismatchError(StreamingError):
    """The cluster's topics do not fit the app (``streaming.topics``): a
    source missing, an internal topic with the wrong partition count or
    cleanup policy, or state the topology no longer names. Nothing was
    created or written."""

    exit_code = 5
