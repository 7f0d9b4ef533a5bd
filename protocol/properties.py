"""Kafka's configuration text, read one way in every room: a boolean setting
(``parse_bool``) and a Java properties file (``parse_properties``), as
Kafka's own tools read ``server.properties`` and ``--command-config``.
"""

from __future__ import annotations


def parse_bool(value, name: str | None = None) -> bool:
    """A boolean setting: a Python bool, or ``true``/``false`` in any case
    with spaces around (as Kafka's ConfigDef reads a BOOLEAN). Anything else
    raises ValueError, naming the setting if ``name`` is given."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if isinstance(value, str) else None
    if text not in ("true", "false"):
        raise ValueError(f"{name} must be true or false, not {value!r}" if name else f"expected true or false, not {value!r}")
    return text == "true"


def parse_properties(text: str, *, source: str | None = None) -> dict[str, str]:
    """A Java properties file's ``key=value`` (or ``key: value``) lines, keys
    and values stripped; blank lines and those starting with ``#`` or ``!``
    are comments. A line without a separator after a key raises ValueError
    naming its number (``source:N``, given the file's name as ``source``)."""
    properties = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        separators = [index for index in (line.find("="), line.find(":")) if index > 0]
        if not separators:
            raise ValueError(f"{source}:{number}: expected key=value" if source else f"line {number}: expected key=value")
        split = min(separators)
        properties[line[:split].strip()] = line[split + 1 :].strip()
    return properties
