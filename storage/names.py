"""Topic names and the partition directories they become.

Topic names come from users (CreateTopics, auto-creation on Metadata), and a
partition's directory is ``<topic>-<partition>`` under the data directory, so
a name is validated before it is ever joined to a path, by Kafka's rule
(``protocol.names``: ``[a-zA-Z0-9._-]``, 1 to 249 characters, not ``.`` or
``..``). With that alphabet no name can contain a path separator, and
``partition_path()`` checks the result stays inside the data directory anyway.
"""

from __future__ import annotations

import os

from protocol.names import InvalidTopicError, validate_topic_name


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
