"""Which topic names are legal: Kafka's rule, once for every room.

A legal name is 1 to 249 of Kafka's characters ``[a-zA-Z0-9._-]`` and is not
``.`` or ``..`` (a broker answers anything else INVALID_TOPIC_EXCEPTION).
The broker validates every name a user sends before it becomes a partition
directory (``storage.names``); clients check names they derive themselves
(the Spark sink's decision topic) before asking the broker.
"""

from __future__ import annotations

import re

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")  # used with fullmatch: "$" would let a trailing newline through


class InvalidTopicError(ValueError):
    """A topic name Kafka would refuse (INVALID_TOPIC_EXCEPTION)."""


def validate_topic_name(name) -> str:
    """``name`` if it is a legal topic name, else ``InvalidTopicError`` saying why."""
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


def is_legal_topic_name(name) -> bool:
    try:
        validate_topic_name(name)
    except InvalidTopicError:
        return False
    return True
