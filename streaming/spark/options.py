"""The options of the ``onceflow`` Spark data source, parsed once and checked
the way Spark's Kafka connector checks them, so existing jobs port by
changing ``format("kafka")`` to ``format("onceflow")``.

The source's (``parse_source_options``) and the sink's (``SinkOptions``,
the streaming and the batch writer's), in one place as Spark's
KafkaSourceProvider holds both.

- Option names are Spark's, case-insensitive (PySpark hands them over
  lowercased). A source option we do not know is ignored, as Spark ignores
  it; a ``kafka.*`` option our clients do not know is an error naming it,
  because dropping, say, ``kafka.security.protocol=SSL`` would silently
  talk in plain text.
- ``kafka.*`` options lose their prefix and become our ``txn`` client
  configuration (``kafka.fetch.max.bytes`` -> ``ConsumerConfig.fetch_max_bytes``).
- Security settings are the Kafka client's (``kafka.security.protocol``,
  ``kafka.sasl.mechanism``, ``kafka.sasl.jaas.config`` with the PLAIN or
  SCRAM login module, ``kafka.ssl.truststore.location`` of type PEM,
  ``kafka.ssl.endpoint.identification.algorithm``) or librdkafka's
  (``kafka.sasl.username``, ``kafka.ssl.ca.location``, ...); they reach
  every client the driver and the executors open (``txn.security``).
- Options Spark forbids are refused with Spark's messages.
- Isolation is read_committed unless ``kafka.isolation.level`` says
  read_uncommitted (Spark's Kafka source defaults to the Kafka client's
  read_uncommitted; we do not, because only offsets below the last stable
  offset re-read the same rows).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re

import attrs

from protocol.names import is_legal_topic_name
from protocol.properties import parse_bool
from txn.config import AdminConfig, CommonConfig, ConsumerConfig, ProducerConfig, build
from txn.errors import ConfigError
from txn.security import is_security_option
from txn.types import TopicPartition

log = logging.getLogger(__name__)

EARLIEST, LATEST = -2, -1  # the special offsets of Spark's offset JSON
DEFAULT_MAX_TRIGGER_DELAY = "15m"
DEFAULT_POLL_TIMEOUT_MS = 120_000  # Spark's default, spark.network.timeout
ASSIGN_EXAMPLE = '{"topicA":[0,1],"topicB":[0,1]}'
OFFSETS_EXAMPLE = '{"topicA":{"0":23,"1":-1},"topicB":{"0":-2}}'
TIMESTAMPS_EXAMPLE = '{"topicA": {"0": 123456789, "1": 123456789}, "topicB": {"0": 123456789, "1": 123456789}}'
SUBSCRIPTION_KEYS = ("subscribe", "subscribepattern", "assign")
SUBSCRIPTION_NAMES = "subscribe, subscribePattern, assign"

# Kafka client properties Spark refuses, with its reasons.
FORBIDDEN_SOURCE_PARAMS = {
    "auto.offset.reset": (
        "Kafka option 'auto.offset.reset' is not supported. Instead set the source option 'startingOffsets' to 'earliest' or 'latest' "
        "to specify where to start. Structured Streaming manages which offsets are consumed internally, rather than relying on the "
        "kafkaConsumer to do it. Note that 'startingOffsets' only applies when a new Streaming query is started, and that resuming "
        "will always pick up from where the query left off."
    ),
    "key.deserializer": "Kafka option 'key.deserializer' is not supported as keys are deserialized as byte arrays with ByteArrayDeserializer. Use DataFrame operations to explicitly deserialize the keys.",
    "value.deserializer": "Kafka option 'value.deserializer' is not supported as values are deserialized as byte arrays with ByteArrayDeserializer. Use DataFrame operations to explicitly deserialize the values.",
    "enable.auto.commit": "Kafka option 'enable.auto.commit' is not supported",
    "interceptor.classes": "Kafka option 'interceptor.classes' is not supported",
}
FORBIDDEN_SINK_PARAMS = {
    "key.serializer": "Kafka option 'key.serializer' is not supported as keys are serialized with ByteArraySerializer.",
    "value.serializer": "Kafka option 'value.serializer' is not supported as value are serialized with ByteArraySerializer.",
}
# The executors' consumers read whole ranges into Arrow batches: larger polls
# and fetches than a record-at-a-time consumer's defaults (a kafka.* option wins).
SOURCE_CONSUMER_DEFAULTS = {"max.poll.records": "32768", "max.partition.fetch.bytes": str(8 << 20)}


# Java client tuning knobs a ported job may carry that mean nothing to our
# clients: accepted and dropped with one warning naming them. Security
# settings are never in this list: an unknown one stays an error.
IGNORED_JAVA_CLIENT_OPTIONS = frozenset({
    "retries", "max.block.ms", "buffer.memory", "default.api.timeout.ms", "receive.buffer.bytes", "send.buffer.bytes",
    "reconnect.backoff.ms", "reconnect.backoff.max.ms", "connections.max.idle.ms", "metric.reporters", "metrics.num.samples",
    "metrics.sample.window.ms", "metrics.recording.level", "client.dns.lookup", "socket.connection.setup.timeout.ms",
    "socket.connection.setup.timeout.max.ms", "partitioner.class", "partitioner.ignore.keys", "partitioner.adaptive.partitioning.enable",
    "check.crcs", "exclude.internal.topics", "allow.auto.create.topics", "client.rack", "group.id", "session.timeout.ms",
    "heartbeat.interval.ms", "partition.assignment.strategy", "max.poll.interval.ms",
})
_warned_ignored: set[str] = set()


class OptionError(ValueError):
    """A data source option is missing, malformed or not allowed (Spark
    raises IllegalArgumentException for the same cases)."""


# -- kafka.* -------------------------------------------------------------------------------------


def lowercase(options) -> dict[str, str]:
    """The options as a plain dict with lowercased keys (PySpark's
    CaseInsensitiveDict already lowercases; tests pass plain dicts)."""
    return {str(key).lower(): value for key, value in dict(options).items()}


def kafka_params(options) -> dict[str, str]:
    """``kafka.*`` options without their prefix: Kafka client properties."""
    return {key[len("kafka."):]: str(value) for key, value in lowercase(options).items() if key.startswith("kafka.")}


def reject_forbidden_source_params(params: dict[str, str]) -> None:
    for name, message in FORBIDDEN_SOURCE_PARAMS.items():
        if name in params:
            raise OptionError(message)


def reject_forbidden_sink_params(params: dict[str, str]) -> None:
    for name, message in FORBIDDEN_SINK_PARAMS.items():
        if name in params:
            raise OptionError(message)


def require_bootstrap_servers(params: dict[str, str], role: str) -> None:
    """``role``: "consumer" or "producer", as in Spark's message."""
    if not params.get("bootstrap.servers", "").strip():
        raise OptionError(f"Option 'kafka.bootstrap.servers' must be specified for configuring Kafka {role}")


def client_config(config_class: type[CommonConfig], params: dict[str, str], *, only_known: bool = False, **overrides) -> CommonConfig:
    """A ``txn`` client configuration from Kafka client properties.

    ``only_known`` drops the properties ``config_class`` has no field for
    (the driver's admin client gets the consumer's settings it understands:
    bootstrap servers, client id, timeouts); otherwise an unknown property
    is an ``OptionError`` naming it with its ``kafka.`` prefix."""
    known = {field.name for field in attrs.fields(config_class)}
    chosen: dict[str, str] = {}
    unknown, ignored = [], []
    for name, value in params.items():
        field = name.replace(".", "_").replace("-", "_")
        if name in IGNORED_JAVA_CLIENT_OPTIONS and not only_known:
            ignored.append(f"kafka.{name}")
        elif field in known or is_security_option(name):
            chosen[field] = value
        elif not only_known:
            unknown.append(f"kafka.{name}")
    warn_now = sorted(set(ignored) - _warned_ignored)
    if warn_now:
        _warned_ignored.update(warn_now)
        log.warning("Kafka option(s) %s mean nothing to onceflow's clients (Java client tuning): ignored", ", ".join(warn_now))
    if unknown:
        raise OptionError(
            f"Kafka option(s) {', '.join(sorted(unknown))} not supported by onceflow's {config_class.__name__} "
            f"(supported: {', '.join('kafka.' + f.replace('_', '.') for f in sorted(known - {'security'}))}, and the security settings)"
        )
    chosen.update({name: value for name, value in overrides.items() if value is not None})
    try:
        return build(config_class, chosen)
    except ConfigError as error:
        raise OptionError(f"invalid Kafka option: {error}") from None


# -- where to start and end ----------------------------------------------------------------------


@attrs.frozen
class Earliest:
    """The log start offset of every partition."""


@attrs.frozen
class Latest:
    """The end of every partition: the last stable offset under read_committed."""


@attrs.frozen
class SpecificOffsets:
    """Offsets per partition; -2 means earliest, -1 latest."""

    offsets: dict = attrs.field(hash=False)  # TopicPartition -> int


@attrs.frozen
class GlobalTimestamp:
    """The first offset at or after ``timestamp`` (ms) in every partition."""

    timestamp: int
    on_no_match: str = "error"  # "error" or "latest"


@attrs.frozen
class SpecificTimestamps:
    timestamps: dict = attrs.field(hash=False)  # TopicPartition -> ms
    on_no_match: str = "error"


OffsetLimit = Earliest | Latest | SpecificOffsets | GlobalTimestamp | SpecificTimestamps


def parse_partitions(text: str) -> tuple[TopicPartition, ...]:
    """``assign``: ``{"topicA":[0,1],"topicB":[2,4]}``."""
    try:
        parsed = json.loads(text)
        if not isinstance(parsed, dict):
            raise ValueError
        out = []
        for topic, partitions in parsed.items():
            if not isinstance(partitions, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in partitions):
                raise ValueError
            out += [TopicPartition(topic, p) for p in partitions]
        return tuple(out)
    except ValueError:
        raise OptionError(f"option 'assign' must be JSON naming each topic's partitions, e.g. {ASSIGN_EXAMPLE}; got {text!r}") from None


def _parse_partition_numbers(text: str, name: str, accepted: str) -> dict[TopicPartition, int]:
    try:
        parsed = json.loads(text)
        if not isinstance(parsed, dict):
            raise ValueError
        out = {}
        for topic, entries in parsed.items():
            if not isinstance(entries, dict):
                raise ValueError
            for partition, number in entries.items():
                if not isinstance(number, int) or isinstance(number, bool):
                    raise ValueError
                out[TopicPartition(topic, int(partition))] = number
        return out
    except ValueError:
        raise OptionError(f"option {name!r} must be {accepted}; got {text!r}") from None


def parse_partition_offsets(text: str, name: str = "startingOffsets") -> dict[TopicPartition, int]:
    """``startingOffsets``/``endingOffsets`` JSON: ``{"t":{"0":23,"1":-1}}``."""
    return _parse_partition_numbers(text, name, f"'earliest', 'latest' or JSON offsets per partition (-2 earliest, -1 latest), e.g. {OFFSETS_EXAMPLE}")


def parse_partition_timestamps(text: str, name: str = "startingOffsetsByTimestamp") -> dict[TopicPartition, int]:
    return _parse_partition_numbers(text, name, f"JSON timestamps (ms) per partition, e.g. {TIMESTAMPS_EXAMPLE}")


def offsets_to_json(offsets: dict[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """Spark's offset JSON shape: ``{topic: {"partition": offset}}``."""
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def offsets_from_json(value: dict) -> dict[TopicPartition, int]:
    """The inverse of ``offsets_to_json`` (Spark hands keys back as strings)."""
    return {TopicPartition(topic, int(partition)): int(offset) for topic, entries in value.items() for partition, offset in entries.items()}


OPTION_NAMES = {  # PySpark hands options over lowercased; messages use Spark's spelling
    "startingtimestamp": "startingTimestamp",
    "startingoffsetsbytimestamp": "startingOffsetsByTimestamp",
    "startingoffsets": "startingOffsets",
    "endingtimestamp": "endingTimestamp",
    "endingoffsetsbytimestamp": "endingOffsetsByTimestamp",
    "endingoffsets": "endingOffsets",
}


def offset_limit(options: dict[str, str], timestamp_key: str, by_timestamp_key: str, offsets_key: str, default: OffsetLimit) -> OffsetLimit:
    """Spark's precedence: a global timestamp, then timestamps per partition,
    then earliest/latest/JSON offsets, else ``default``."""
    strategy = options.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError(f"startingOffsetsByTimestampStrategy must be 'error' or 'latest', not {strategy!r}")
    if timestamp_key in options:
        text = str(options[timestamp_key]).strip()
        try:
            return GlobalTimestamp(int(text), strategy)
        except ValueError:
            raise OptionError(f"option {OPTION_NAMES[timestamp_key]!r} must be a timestamp in ms (a single long value); got {text!r}") from None
    if by_timestamp_key in options:
        return SpecificTimestamps(parse_partition_timestamps(str(options[by_timestamp_key]).strip(), OPTION_NAMES[by_timestamp_key]), strategy)
    if offsets_key in options:
        text = str(options[offsets_key]).strip()
        if text.lower() == "latest":
            return Latest()
        if text.lower() == "earliest":
            return Earliest()
        return SpecificOffsets(parse_partition_offsets(text, OPTION_NAMES[offsets_key]))
    return default


# -- the source's options -----------------------------------------------------------------------


@attrs.frozen
class Subscription:
    """Exactly one of Spark's three ways to name what to read."""

    kind: str  # "subscribe", "subscribepattern" or "assign"
    topics: tuple[str, ...] = ()
    pattern: str = ""
    partitions: tuple[TopicPartition, ...] = ()

    def matches(self, topic: str) -> bool:
        if self.kind == "subscribe":
            return topic in self.topics
        if self.kind == "subscribepattern":
            return re.fullmatch(self.pattern, topic) is not None
        return any(tp.topic == topic for tp in self.partitions)

    def __str__(self) -> str:
        if self.kind == "subscribe":
            return f"subscribe={','.join(self.topics)}"
        if self.kind == "subscribepattern":
            return f"subscribePattern={self.pattern}"
        return f"assign={','.join(map(str, self.partitions))}"


@attrs.frozen
class SourceOptions:
    bootstrap_servers: str
    subscription: Subscription
    starting: OffsetLimit
    ending: OffsetLimit  # batch reads only; Latest for streams
    consumer: ConsumerConfig  # for executors (and the isolation level the driver lists offsets at)
    admin: AdminConfig  # for the driver
    include_headers: bool = False
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    fetch_offset_num_retries: int = 3
    fetch_offset_retry_interval_ms: int = 1000

    @property
    def isolation_level(self) -> str:
        return self.consumer.isolation_level


def parse_bool_option(options: dict, key: str, default: bool, name: str) -> bool:
    """A boolean option, read as every room reads one (``protocol.properties.parse_bool``:
    ``true``/``false`` in any case); anything else is an ``OptionError`` naming ``name``."""
    if key not in options:
        return default
    try:
        return parse_bool(options[key], name)
    except ValueError as error:
        raise OptionError(str(error)) from None


def parse_long(options: dict, key: str, name: str, *, default: int | None = None, positive: bool = False, at_least: int | None = None) -> int | None:
    if key not in options:
        return default
    text = str(options[key]).strip()
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"{name} must be a whole number, not {text!r}") from None
    if positive and value <= 0:
        raise OptionError(f"{name} must be positive")
    if at_least is not None and value < at_least:
        raise OptionError(f"{name} must be {at_least} or more, not {value}")
    return value


TIME_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str, name: str) -> int:
    """Spark's time strings: ``15m``, ``10s``, ``250ms``, ``1h``; no unit means ms."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", str(text).lower())
    if not match or match.group(2) not in ("", *TIME_UNITS_MS):
        raise OptionError(f"{name} must be a duration such as 15m, 30s or 500ms, not {text!r}")
    return int(int(match.group(1)) * TIME_UNITS_MS.get(match.group(2) or "ms"))


def parse_subscription(options: dict[str, str]) -> Subscription:
    given = [key for key in SUBSCRIPTION_KEYS if key in options]
    if not given:
        raise OptionError(f"One of the following options must be specified for Kafka source: {SUBSCRIPTION_NAMES}. See the docs for more details.")
    if len(given) > 1:
        raise OptionError(f"Only one of the following options can be specified for Kafka source: {SUBSCRIPTION_NAMES}. See the docs for more details.")
    kind = given[0]
    value = str(options[kind])
    if kind == "assign":
        if not value.strip().startswith("{"):
            raise OptionError(f"No topicpartitions to assign as specified value for option 'assign' is '{value}'")
        return Subscription(kind, partitions=parse_partitions(value.strip()))
    if kind == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise OptionError(f"No topics to subscribe to as specified value for option 'subscribe' is '{value}'")
        return Subscription(kind, topics=topics)
    pattern = value.strip()
    if not pattern:
        raise OptionError(f"Pattern to subscribe is empty as specified value for option 'subscribePattern' is '{value}'")
    try:
        re.compile(pattern)
    except re.error as error:
        raise OptionError(f"subscribePattern {pattern!r} is not a valid (Python) regular expression: {error}") from None
    return Subscription(kind, pattern=pattern)


def parse_source_options(options, *, streaming: bool | None) -> SourceOptions:
    """Check and parse a source's options (``streaming`` False: ``spark.read``;
    None: not known yet, as in ``DataSource.schema()`` at ``load()``, where
    every check that does not depend on the kind of query runs, so a typo
    fails at ``load()`` rather than when the query starts)."""
    options = lowercase(options)
    params = kafka_params(options)
    if streaming:
        if "endingoffsets" in options:
            raise OptionError("ending offset not valid in streaming queries")
        if "endingoffsetsbytimestamp" in options or "endingtimestamp" in options:
            raise OptionError("ending timestamp not valid in streaming queries")
    subscription = parse_subscription(options)
    min_partitions = parse_long(options, "minpartitions", "minPartitions", positive=True)
    max_records = parse_long(options, "maxrecordsperpartition", "maxRecordsPerPartition", positive=True)
    reject_forbidden_source_params(params)
    require_bootstrap_servers(params, "consumer")
    max_offsets = parse_long(options, "maxoffsetspertrigger", "maxOffsetsPerTrigger", positive=True)
    min_offsets = parse_long(options, "minoffsetspertrigger", "minOffsetsPerTrigger", positive=True)
    if max_offsets is not None and min_offsets is not None and min_offsets > max_offsets:
        raise OptionError(f"The value of minOffsetPerTrigger({min_offsets}) is higher than the maxOffsetsPerTrigger({max_offsets}).")
    starting = offset_limit(options, "startingtimestamp", "startingoffsetsbytimestamp", "startingoffsets", Earliest() if streaming is False else Latest())
    ending: OffsetLimit = Latest()
    if streaming is None:
        ending = offset_limit(options, "endingtimestamp", "endingoffsetsbytimestamp", "endingoffsets", Latest())
    if streaming is False:
        if isinstance(starting, Latest):
            raise OptionError("starting offset can't be latest for batch queries on Kafka")
        if isinstance(starting, SpecificOffsets):
            for tp, offset in starting.offsets.items():
                if offset == LATEST:
                    raise OptionError(f"startingOffsets for {tp} can't be latest for batch queries on Kafka")
        ending = offset_limit(options, "endingtimestamp", "endingoffsetsbytimestamp", "endingoffsets", Latest())
        if isinstance(ending, Earliest):
            raise OptionError("ending offset can't be earliest for batch queries on Kafka")
        if isinstance(ending, SpecificOffsets):
            for tp, offset in ending.offsets.items():
                if offset == EARLIEST:
                    raise OptionError(f"ending offset for {tp} can't be earliest for batch queries on Kafka")
        _check_range(starting, ending)
    # Executors read exactly what the driver planned: no group offsets, no resets.
    consumer = client_config(ConsumerConfig, {**SOURCE_CONSUMER_DEFAULTS, **params}, auto_offset_reset="none")
    admin = client_config(AdminConfig, params, only_known=True)
    return SourceOptions(
        bootstrap_servers=params["bootstrap.servers"],
        subscription=subscription,
        starting=starting,
        ending=ending,
        consumer=consumer,
        admin=admin,
        include_headers=parse_bool_option(options, "includeheaders", False, "includeHeaders"),
        fail_on_data_loss=parse_bool_option(options, "failondataloss", True, "failOnDataLoss"),
        max_offsets_per_trigger=max_offsets,
        min_offsets_per_trigger=min_offsets,
        max_trigger_delay_ms=parse_duration_ms(options.get("maxtriggerdelay", DEFAULT_MAX_TRIGGER_DELAY), "maxTriggerDelay"),
        min_partitions=min_partitions,
        max_records_per_partition=max_records,
        poll_timeout_ms=parse_long(options, "kafkaconsumer.polltimeoutms", "kafkaConsumer.pollTimeoutMs", default=DEFAULT_POLL_TIMEOUT_MS, positive=True),
        fetch_offset_num_retries=parse_long(options, "fetchoffset.numretries", "fetchOffset.numRetries", default=3, at_least=0),
        fetch_offset_retry_interval_ms=parse_long(options, "fetchoffset.retryintervalms", "fetchOffset.retryIntervalMs", default=1000, at_least=0),
    )


def _check_range(starting: OffsetLimit, ending: OffsetLimit) -> None:
    """Spark's checkOffsetLimitValidity: same partitions on both sides, start <= end."""
    if isinstance(starting, SpecificOffsets) and isinstance(ending, SpecificOffsets):
        pairs = (starting.offsets, ending.offsets, "offset")
    elif isinstance(starting, SpecificTimestamps) and isinstance(ending, SpecificTimestamps):
        pairs = (starting.timestamps, ending.timestamps, "timestamp")
    else:
        return
    start, end, what = pairs
    if set(start) != set(end):
        raise OptionError(
            f"The specified start and end partitions differ: start {', '.join(map(str, sorted(start)))}; end {', '.join(map(str, sorted(end)))}"
        )
    for tp, first in start.items():
        if first >= 0 and end[tp] >= 0 and first > end[tp]:
            raise OptionError(f"The specified starting {what} {first} is greater than the ending {what} {end[tp]} for {tp}")


# -- the sink's options -------------------------------------------------------------------------

EXACTLY_ONCE, AT_LEAST_ONCE = "exactly_once", "at_least_once"
DEFAULT_TRANSACTION_TIMEOUT_MS = 900_000
# Besides Spark's own refusals (FORBIDDEN_SINK_PARAMS), what the sink sets itself.
FORBIDDEN_SINK_OWNED_PARAMS = {
    "transactional.id": "Kafka option 'transactional.id' is not supported: set transactionalIdPrefix, the sink names one transactional id per task",
    "enable.idempotence": "Kafka option 'enable.idempotence' is not supported: the sink's producers are always idempotent (deliveryGuarantee chooses transactions)",
}


@attrs.frozen
class SinkOptions:
    kafka_params: dict = attrs.field(eq=False)  # Kafka client properties (kafka.* without the prefix)
    topic: str | None
    delivery_guarantee: str
    transactional_id_prefix: str | None
    decision_topic: str | None
    commit_offsets_to_group: str | None
    checkpoint_location: str | None
    crash_point_hook: str | None
    txn_app_id: str | None = None  # batch writes: the application whose versions are written once each
    txn_version: int | None = None
    decision_topic_replication_factor: int = -1  # -1: the broker's default.replication.factor
    decision_topic_min_insync_replicas: int | None = None

    @property
    def exactly_once(self) -> bool:
        return self.delivery_guarantee == EXACTLY_ONCE

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka_params["bootstrap.servers"]

    @classmethod
    def parse(cls, options, *, batch_write: bool = False) -> "SinkOptions":
        """From Spark's options (a case-insensitive mapping of strings);
        every problem is an ``OptionError`` raised here, on the driver.
        ``batch_write``: for ``df.write`` (a job, not a query: no checkpoint;
        ``txnAppId``/``txnVersion`` name it for idempotence)."""
        lowered = lowercase(options)
        params = kafka_params(lowered)
        require_bootstrap_servers(params, "producer")
        reject_forbidden_sink_params(params)
        for name, message in FORBIDDEN_SINK_OWNED_PARAMS.items():
            if name in params:
                raise OptionError(message)
        params.setdefault("transaction.timeout.ms", str(DEFAULT_TRANSACTION_TIMEOUT_MS))
        guarantee = str(lowered.get("deliveryguarantee", EXACTLY_ONCE)).lower()
        if guarantee not in (EXACTLY_ONCE, AT_LEAST_ONCE):
            raise OptionError(f"deliveryGuarantee must be {EXACTLY_ONCE} or {AT_LEAST_ONCE}, not {guarantee!r}")
        prefix = lowered.get("transactionalidprefix") or None
        checkpoint = lowered.get("checkpointlocation") or None
        app_id, version = lowered.get("txnappid") or None, parse_long(lowered, "txnversion", "txnVersion", at_least=0)
        if (app_id is None) != (version is None):
            raise OptionError("txnAppId and txnVersion go together: the application's name and this write's version (in foreachBatch, the batch id)")
        if app_id is not None and not batch_write:
            raise OptionError("txnAppId and txnVersion are options of batch writes (df.write, as in foreachBatch); a streaming query is named by its checkpoint")
        if guarantee == EXACTLY_ONCE and not prefix and batch_write:
            prefix = "onceflow-" + hashlib.sha256(app_id.encode()).hexdigest()[:16] if app_id is not None else "onceflow-batch"
        if guarantee == EXACTLY_ONCE and not prefix:
            if checkpoint is None:
                raise OptionError(
                    "deliveryGuarantee=exactly_once needs option 'transactionalIdPrefix' (a name unique to this query: its "
                    "transactions and its decision record are named after it) or a checkpointLocation option to derive one "
                    "from; deliveryGuarantee=at_least_once needs neither"
                )
            prefix = default_prefix(checkpoint)
        decision_topic = lowered.get("decisiontopic") or (f"onceflow.decisions.{prefix}" if prefix else None)
        if guarantee == EXACTLY_ONCE and not is_legal_topic_name(decision_topic):
            raise OptionError(f"decision topic {decision_topic!r} is not a legal topic name: use letters, digits, '.', '_' and '-' in transactionalIdPrefix, or set decisionTopic")
        group = lowered.get("commitoffsetstogroup") or None
        if group is not None:
            if guarantee != EXACTLY_ONCE:
                raise OptionError("commitOffsetsToGroup needs deliveryGuarantee=exactly_once (the offsets commit in the batch's transactions)")
            if checkpoint is None:
                raise OptionError(
                    "commitOffsetsToGroup needs .option('checkpointLocation', ...) on this writeStream: the sink reads the batch's "
                    "source end offsets from the checkpoint's offset log"
                )
        replication = parse_long(lowered, "decisiontopicreplicationfactor", "decisionTopicReplicationFactor", default=-1)
        if replication == 0 or replication < -1:
            raise OptionError(f"decisionTopicReplicationFactor must be -1 (the broker's default) or positive, not {replication}")
        min_insync = parse_long(lowered, "decisiontopicmininsyncreplicas", "decisionTopicMinInsyncReplicas", positive=True)
        if min_insync is not None and replication != -1 and min_insync > replication:
            raise OptionError(f"decisionTopicMinInsyncReplicas ({min_insync}) cannot exceed decisionTopicReplicationFactor ({replication})")
        parsed = cls(
            params, lowered.get("topic") or None, guarantee, prefix, decision_topic, group, checkpoint, lowered.get("crashpointhook") or None,
            app_id, version, replication, min_insync,
        )
        parsed.producer_config(transactional_id=prefix and f"{prefix}-check")  # unknown or bad kafka.* settings fail here
        return parsed

    def producer_config(self, transactional_id: str | None = None) -> ProducerConfig:
        return client_config(ProducerConfig, self.kafka_params, transactional_id=transactional_id)

    def admin_config(self) -> AdminConfig:
        return client_config(AdminConfig, self.kafka_params, only_known=True)

    def consumer_config(self) -> ConsumerConfig:
        """The decision reader's: read_committed, so a decision counts only
        once the driver's transaction that wrote it committed."""
        return client_config(ConsumerConfig, self.kafka_params, only_known=True, isolation_level="read_committed")


def default_prefix(checkpoint_location: str) -> str:
    """``transactionalIdPrefix`` when none is given: stable for a checkpoint
    (a query's identity in Spark) and different for every other, so a job
    ported from ``format("kafka")`` needs no new option. Moving or renaming
    the checkpoint changes it: set the option to keep a query's name."""
    path = checkpoint_location[len("file:"):] if checkpoint_location.startswith("file:") else checkpoint_location
    if "://" not in path:
        path = os.path.abspath(path)
    return "onceflow-" + hashlib.sha256(path.encode()).hexdigest()[:16]


