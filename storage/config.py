"""Log (topic) configuration: one frozen value with Kafka's setting names.

``LogConfig.from_properties({"segment.bytes": "1048576", ...})`` validates and
converts; unknown names are refused with the list of known ones, so a typo in
a topic setting is an error rather than a silent default.
"""

from __future__ import annotations

import attrs

CLEANUP_DELETE = "delete"
CLEANUP_COMPACT = "compact"

FLUSH_GROUP = "group"
FLUSH_ALWAYS = "always"
FLUSH_OS = "os"
FLUSH_POLICIES = (FLUSH_GROUP, FLUSH_ALWAYS, FLUSH_OS)

DAY_MS = 24 * 3600 * 1000
INT32_MAX = 2**31 - 1  # index entries hold positions and relative offsets as int32


@attrs.frozen
class LogConfig:
    segment_bytes: int = attrs.field(default=1024 * 1024 * 1024, validator=[attrs.validators.ge(128), attrs.validators.le(INT32_MAX)])
    segment_ms: int = attrs.field(default=7 * DAY_MS, validator=attrs.validators.ge(1))
    segment_index_bytes: int = attrs.field(default=10 * 1024 * 1024, validator=[attrs.validators.ge(64), attrs.validators.le(INT32_MAX)])
    index_interval_bytes: int = attrs.field(default=4096, validator=[attrs.validators.ge(0), attrs.validators.le(INT32_MAX)])
    retention_ms: int = attrs.field(default=7 * DAY_MS, validator=attrs.validators.ge(-1))
    retention_bytes: int = attrs.field(default=-1, validator=attrs.validators.ge(-1))
    cleanup_policy: frozenset = frozenset({CLEANUP_DELETE})
    delete_retention_ms: int = attrs.field(default=DAY_MS, validator=attrs.validators.ge(0))
    min_compaction_lag_ms: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    min_cleanable_dirty_ratio: float = attrs.field(default=0.5, validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)])
    max_message_bytes: int = attrs.field(default=1024 * 1024 + 12, validator=attrs.validators.ge(64))
    flush_policy: str = attrs.field(default=FLUSH_GROUP, validator=attrs.validators.in_(FLUSH_POLICIES))
    flush_interval_ms: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    message_timestamp_type: str = attrs.field(default="CreateTime", validator=attrs.validators.in_(("CreateTime", "LogAppendTime")))
    producer_id_expiration_ms: int = attrs.field(default=DAY_MS, validator=attrs.validators.ge(1))
    # onceflow's own: zeros kept written ahead of small appends in the active
    # segment, so that their fsyncs need no journal commit (storage.segment); 0: none.
    segment_zeros_ahead_bytes: int = attrs.field(default=1024 * 1024, validator=[attrs.validators.ge(0), attrs.validators.le(INT32_MAX)])

    @property
    def compact(self) -> bool:
        return CLEANUP_COMPACT in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return CLEANUP_DELETE in self.cleanup_policy

    @property
    def max_index_entries(self) -> int:
        return self.segment_index_bytes // 8

    @classmethod
    def from_properties(cls, properties: dict | None = None) -> "LogConfig":
        values = {}
        for name, raw in (properties or {}).items():
            if name in _IGNORED:
                continue
            spec = _SETTINGS.get(name)
            if spec is None:
                raise ValueError(f"unknown topic setting {name!r}; known: {', '.join(sorted(_SETTINGS))}")
            field, convert = spec
            try:
                values[field] = convert(raw)
            except (TypeError, ValueError):
                raise ValueError(f"{name}={raw!r} is not a valid value") from None
        try:
            return cls(**values)
        except ValueError as error:
            message = str(error)
            for name, (field, _convert) in _SETTINGS.items():
                message = message.replace(f"'{field}'", f"{name}")
            raise ValueError(f"invalid topic setting: {message}") from None

    def to_properties(self) -> dict[str, str]:
        result = {}
        for name, (field, _convert) in _SETTINGS.items():
            value = getattr(self, field)
            if isinstance(value, frozenset):
                value = ",".join(sorted(value))
            result[name] = str(value)
        return result


def _cleanup_policy(raw) -> frozenset:
    parts = frozenset(p.strip() for p in str(raw).split(",") if p.strip())
    if not parts or not parts <= {CLEANUP_DELETE, CLEANUP_COMPACT}:
        raise ValueError(raw)
    return parts


_SETTINGS = {
    "segment.bytes": ("segment_bytes", int),
    "segment.ms": ("segment_ms", int),
    "segment.index.bytes": ("segment_index_bytes", int),
    "index.interval.bytes": ("index_interval_bytes", int),
    "retention.ms": ("retention_ms", int),
    "retention.bytes": ("retention_bytes", int),
    "cleanup.policy": ("cleanup_policy", _cleanup_policy),
    "delete.retention.ms": ("delete_retention_ms", int),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", int),
    "min.cleanable.dirty.ratio": ("min_cleanable_dirty_ratio", float),
    "max.message.bytes": ("max_message_bytes", int),
    "flush.policy": ("flush_policy", str),
    "flush.interval.ms": ("flush_interval_ms", int),
    "message.timestamp.type": ("message_timestamp_type", str),
    "producer.id.expiration.ms": ("producer_id_expiration_ms", int),
    "segment.zeros.ahead.bytes": ("segment_zeros_ahead_bytes", int),
}
# Kafka settings clients commonly send that have no meaning with one broker.
_IGNORED = {"min.insync.replicas", "unclean.leader.election.enable", "compression.type", "message.downconversion.enable"}


def defaults() -> dict[str, str]:
    return LogConfig().to_properties()
