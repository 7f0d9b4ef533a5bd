"""Client configuration: one attrs class per client, validated on creation.

Each field is a Kafka client property in Python spelling (``linger_ms`` for
``linger.ms``); ``build(Config, options)`` accepts either spelling, so code
written for the Java client or confluent-kafka carries over:

    ProducerConfig.build({"bootstrap.servers": "localhost:9092", "transactional.id": "t1"})
    ProducerConfig.build(bootstrap_servers="localhost:9092", transactional_id="t1")

Unknown names are an error that lists them, never silently ignored. A config
is plain data and pickles, which is how Spark executors rebuild a client.
"""

from __future__ import annotations

import attrs

from protocol.compression import Compression
from protocol.properties import parse_bool
from txn.errors import ConfigError
from txn.security import SecurityConfig, is_security_option

# Bytes of a Produce request besides its one record batch's records (the
# request and batch headers, the topic name): what send_columns leaves free
# of max_request_size when cutting batches.
REQUEST_HEADROOM = 1024
COMPRESSIONS = {"none": Compression.NONE, "gzip": Compression.GZIP, "snappy": Compression.SNAPPY, "lz4": Compression.LZ4, "zstd": Compression.ZSTD}


def _positive(instance, attribute, value) -> None:
    if value is None or value <= 0:
        raise ConfigError(f"{attribute.name} must be positive, not {value!r}")


def _not_negative(instance, attribute, value) -> None:
    if value is None or value < 0:
        raise ConfigError(f"{attribute.name} must be >= 0, not {value!r}")


def _one_of(*choices):
    def check(instance, attribute, value) -> None:
        if value not in choices:
            raise ConfigError(f"{attribute.name} must be one of {', '.join(map(repr, choices))}, not {value!r}")

    return check


def _servers(value) -> tuple[str, ...]:
    if isinstance(value, str):
        value = value.split(",")
    servers = tuple(s.strip() for s in value if s.strip())
    if not servers:
        raise ConfigError("bootstrap_servers is required (host:port[,host:port...])")
    for server in servers:
        _host, sep, port = server.rpartition(":")
        if not sep or not port.isdigit():
            raise ConfigError(f"bootstrap server {server!r} is not host:port")
    return servers


def _acks(value) -> int:
    if value == "all":
        return -1
    value = int(value)
    if value not in (-1, 0, 1):
        raise ConfigError(f"acks must be all, -1, 0 or 1, not {value!r}")
    return value


def _compression(value) -> Compression:
    if isinstance(value, Compression):
        return value
    try:
        return COMPRESSIONS[str(value).lower()]
    except KeyError:
        raise ConfigError(f"compression_type must be one of {', '.join(COMPRESSIONS)}, not {value!r}") from None


def _strategies(value) -> tuple[str, ...]:
    if isinstance(value, str):
        value = value.split(",")
    names = tuple(v.strip() for v in value if v.strip())
    if not names:
        raise ConfigError("partition_assignment_strategy needs at least one assignor")
    return names


@attrs.frozen(kw_only=True)
class CommonConfig:
    bootstrap_servers: tuple[str, ...] = attrs.field(converter=_servers)
    client_id: str = "onceflow"
    request_timeout_ms: int = attrs.field(default=30_000, converter=int, validator=_positive)
    retry_backoff_ms: int = attrs.field(default=100, converter=int, validator=_not_negative)
    retry_backoff_max_ms: int = attrs.field(default=1_000, converter=int, validator=_not_negative)
    metadata_max_age_ms: int = attrs.field(default=300_000, converter=int, validator=_positive)
    # security.protocol, sasl.*, ssl.* (every spelling ``txn.security`` knows) land here.
    security: SecurityConfig = attrs.field(factory=SecurityConfig, validator=attrs.validators.instance_of(SecurityConfig))


@attrs.frozen(kw_only=True)
class ProducerConfig(CommonConfig):
    client_id: str = "onceflow-producer"
    transactional_id: str | None = None
    enable_idempotence: bool = attrs.field(default=True, converter=parse_bool)
    acks: int = attrs.field(default=-1, converter=_acks)
    linger_ms: int = attrs.field(default=5, converter=int, validator=_not_negative)
    # None: 16 KiB for single records (Kafka's default), 1 MiB for records sent as columns
    batch_size: int | None = attrs.field(default=None, converter=attrs.converters.optional(int), validator=attrs.validators.optional(_positive))
    compression_type: Compression = attrs.field(default=Compression.NONE, converter=_compression)
    max_in_flight_requests_per_connection: int = attrs.field(default=5, converter=int, validator=_positive)
    delivery_timeout_ms: int = attrs.field(default=120_000, converter=int, validator=_positive)
    transaction_timeout_ms: int = attrs.field(default=60_000, converter=int, validator=_positive)
    # The newest transaction protocol to use: 2 is KIP-890 part 2 (no
    # AddPartitionsToTxn/AddOffsetsToTxn, a new epoch from every EndTxn), used
    # where the broker finalizes the transaction.version feature at 2; 1 keeps
    # the classic protocol everywhere.
    transaction_version: int = attrs.field(default=2, converter=int, validator=_one_of(1, 2))
    max_request_size: int = attrs.field(default=1_048_576, converter=int, validator=_positive)
    buffer_memory: int = attrs.field(default=33_554_432, converter=int, validator=_positive)  # records sent as columns, not yet acknowledged
    max_block_ms: int = attrs.field(default=60_000, converter=int, validator=_not_negative)  # how long send_columns waits for buffer_memory

    def __attrs_post_init__(self) -> None:
        if self.idempotent:
            if self.acks != -1:
                raise ConfigError("an idempotent or transactional producer needs acks=all")
            if self.max_in_flight_requests_per_connection > 5:
                raise ConfigError("an idempotent producer allows at most 5 in-flight requests per partition")

    @property
    def idempotent(self) -> bool:
        return self.enable_idempotence or self.transactional_id is not None

    @property
    def records_batch_size(self) -> int:
        """``batch_size`` for single records (``send``): 16 KiB unless set."""
        return self.batch_size if self.batch_size is not None else 16_384

    @property
    def columns_batch_size(self) -> int:
        """``batch_size`` for records sent as columns (``send_columns``):
        1 MiB unless set, never more than ``max_request_size`` allows."""
        wanted = self.batch_size if self.batch_size is not None else 1_048_576
        return max(1, min(wanted, self.max_request_size - REQUEST_HEADROOM))


@attrs.frozen(kw_only=True)
class ConsumerConfig(CommonConfig):
    client_id: str = "onceflow-consumer"
    group_id: str | None = None
    group_instance_id: str | None = None
    isolation_level: str = attrs.field(default="read_committed", validator=_one_of("read_committed", "read_uncommitted"))
    auto_offset_reset: str = attrs.field(default="earliest", validator=_one_of("earliest", "latest", "none"))
    enable_auto_commit: bool = attrs.field(default=False, converter=parse_bool)
    auto_commit_interval_ms: int = attrs.field(default=5_000, converter=int, validator=_positive)
    fetch_min_bytes: int = attrs.field(default=1, converter=int, validator=_positive)
    fetch_max_bytes: int = attrs.field(default=52_428_800, converter=int, validator=_positive)
    max_partition_fetch_bytes: int = attrs.field(default=1_048_576, converter=int, validator=_positive)
    fetch_max_wait_ms: int = attrs.field(default=500, converter=int, validator=_not_negative)
    max_poll_records: int = attrs.field(default=500, converter=int, validator=_positive)
    session_timeout_ms: int = attrs.field(default=45_000, converter=int, validator=_positive)
    heartbeat_interval_ms: int = attrs.field(default=3_000, converter=int, validator=_positive)
    max_poll_interval_ms: int = attrs.field(default=300_000, converter=int, validator=_positive)
    partition_assignment_strategy: tuple[str, ...] = attrs.field(default=("range", "cooperative-sticky"), converter=_strategies)

    def __attrs_post_init__(self) -> None:
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ConfigError("heartbeat_interval_ms must be lower than session_timeout_ms")
        if self.enable_auto_commit and self.group_id is None:
            raise ConfigError("enable_auto_commit needs a group_id")

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == "read_committed"


@attrs.frozen(kw_only=True)
class AdminConfig(CommonConfig):
    client_id: str = "onceflow-admin"


def build(config_class, options: dict | None = None, **keywords):
    """A ``config_class`` from Kafka-style (``linger.ms``) or Python-style
    (``linger_ms``) names; an existing config passes through with overrides.
    Security settings (``security.protocol``, ``sasl.username``, ...) are
    gathered into one ``SecurityConfig``, over a ``security=`` value if given."""
    merged: dict = {}
    security_options: dict = {}
    for source in (options or {}, keywords):
        if isinstance(source, CommonConfig):
            source = attrs.asdict(source, recurse=False)
        for name, value in source.items():
            if is_security_option(name):
                security_options[name] = value
            else:
                merged[name.replace(".", "_").replace("-", "_")] = value
    if security_options or "security" in merged:
        base = merged.get("security")
        if base is not None and not isinstance(base, SecurityConfig):
            raise ConfigError(f"security must be a txn.security.SecurityConfig, not {type(base).__name__}")
        merged["security"] = SecurityConfig.build(security_options, base=base)
    known = {field.name for field in attrs.fields(config_class)}
    unknown = sorted(set(merged) - known)
    if unknown:
        raise ConfigError(f"unknown {config_class.__name__} option(s): {', '.join(unknown)}")
    try:
        return config_class(**merged)
    except TypeError as error:
        raise ConfigError(str(error)) from None
    except ValueError as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(str(error)) from None
