"""Topic names and the partition directories they become.

Topic names come from users (CreateTopics, auto-creation on Metadata), and a
partition's directory is ``<topic>-<partition>`` under the data directory, so
a name is validated before it is ever joined to a path: Kafka's legal
characters ``[a-zA-Z0-9._-]``, 1 to 249 characters, and not ``.`` or ``..``.
With that alphabet no name can contain a path separator, and
``partition_path()`` checks the result stays inside the data directory anyway.
"""

from __future__ import annotations

import os
import re

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")  # used with fullmatch: "$" would let a trailing newline through


class InvalidTopicError(ValueError):
    """A topic name Kafka would refuse (INVALID_TOPIC_EXCEPTION)."""


def validate_topic_name(name) -> str:
    if not isinstance(name, str) or name == "":
        raise InvalidTopicError("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be '{name}'")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(f"topic name is {len(name)} characters; the limit is {MAX_TOPIC_NAME_LENGTH}")
    if not _LEGAL.fullmatch(name):
        bad = sorted({c for c in name if not _LEGAL.fullmatch(c)})
        raise InvalidTopicError(
            f"topic name {name!r} has illegal characters {''.join(bad)!r}; allowed are ASCII letters, digits, '.', '_' and '-'"
        )
    return name


def partition_dir_name(topic: str, partition: int) -> str:
    validate_topic_name(topic)
    if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
        raise ValueError(f"partition must be a non-negative integer, not {partition!r}")
    return f"{topic}-{partition}"


def partition_path(data_dir: str, topic: str, partition: int) -> str:
    root = os.path.realpath(data_dir)
    path = os.path.realpath(os.path.join(root, partition_dir_name(topic, partition)))
    if os.path.dirname(path) != root:
        raise InvalidTopicError(f"topic {topic!r} resolves outside the data directory")
    return path


def parse_partition_dir(name: str) -> tuple[str, int] | None:
    topic, sep, partition = name.rpartition("-")
    # Only the canonical form partition_dir_name() writes: ASCII digits, no
    # leading zero ("t-012" or "t-١٢" would name a directory no topic owns).
    if not sep or not (partition.isascii() and partition.isdigit()) or str(int(partition)) != partition:
        return None
    try:
        validate_topic_name(topic)
    except InvalidTopicError:
        return None
    return topic, int(partition)
