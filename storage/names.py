"""Topic names and the partition directories they become.

Topic names come from users (CreateTopics, auto-creation on Metadata), and a
partition's directory is ``<topic>-<partition>`` under the data directory, so
a name is validated before it is ever joined to a path, by Kafka's rule
(``protocol.names``: ``[a-zA-Z0-9._-]``, 1 to 249 characters, not ``.`` or
``..``): with that alphabet no name can contain a path separator
(``partition_dir_name``). ``parse_partition_dir`` reads back only the names
``partition_dir_name`` writes, so the broker, which removes at start the
partition directories no topic owns, never takes another directory for one.
"""

from __future__ import annotations

from protocol.names import InvalidTopicError, validate_topic_name


def partition_dir_name(topic: str, partition: int) -> str:
    validate_topic_name(topic)
    if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
        raise ValueError(f"partition must be a non-negative integer, not {partition!r}")
    return f"{topic}-{partition}"


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
