"""Broker configuration: one attrs value with Kafka's property names.

``BrokerConfig.from_properties({...})`` takes Kafka-style dotted names (as a
``server.properties`` file or ``--config key=value`` flags give them); every
other room receives the typed fields, never the raw dictionary.
"""

from __future__ import annotations

import os

import attrs

from broker.security.listeners import PLAINTEXT, Listener, parse_listeners
from protocol.event_loop import ASYNCIO, UVLOOP, default_event_loop, event_loop_name
from protocol.properties import parse_bool

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9092
DEFAULT_DATA_DIR = "./onceflow-data"

_INT_SETTINGS = {
    "node.id": "node_id",
    "num.partitions": "num_partitions",
    "socket.request.max.bytes": "socket_request_max_bytes",
    "connections.max.inflight.requests": "max_inflight_requests_per_connection",
    "fetch.max.bytes": "fetch_max_bytes",
    "message.max.bytes": "message_max_bytes",
    "log.retention.check.interval.ms": "retention_check_interval_ms",
    "transaction.state.log.num.partitions": "transaction_state_partitions",
    "transaction.max.timeout.ms": "transaction_max_timeout_ms",
    "transactional.id.expiration.ms": "transactional_id_expiration_ms",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "transaction_abort_interval_ms",
    "transaction.offset.commit.stall.ms": "transaction_offset_commit_stall_ms",
    "transaction.version": "transaction_version",
    "offsets.topic.num.partitions": "offsets_topic_partitions",
    "group.initial.rebalance.delay.ms": "group_initial_rebalance_delay_ms",
    "group.min.session.timeout.ms": "group_min_session_timeout_ms",
    "group.max.session.timeout.ms": "group_max_session_timeout_ms",
    "offsets.retention.minutes": "offsets_retention_minutes",
    "offsets.retention.check.interval.ms": "offsets_retention_check_interval_ms",
    "quota.window.num": "quota_window_num",
    "quota.window.size.seconds": "quota_window_size_seconds",
    "connections.max.reauth.ms": "connections_max_reauth_ms",
    "max.connections": "max_connections",
    "max.connections.per.ip": "max_connections_per_ip",
    "sasl.server.max.receive.size": "sasl_server_max_receive_size",
    "connections.authentication.timeout.ms": "authentication_timeout_ms",
    "connection.failed.authentication.delay.ms": "failed_authentication_delay_ms",
}
_LISTENER_SETTINGS = ("listeners", "advertised.listeners", "listener.security.protocol.map")
SSL_CLIENT_AUTH = ("none", "requested", "required")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
UNLIMITED = 2**31 - 1


def _mechanisms(value) -> tuple[str, ...]:
    names = value.split(",") if isinstance(value, str) else list(value)
    mechanisms = tuple(dict.fromkeys(name.strip().upper() for name in names if name.strip()))
    unknown = [name for name in mechanisms if name not in SASL_MECHANISMS]
    if unknown or not mechanisms:
        raise ValueError(f"sasl.enabled.mechanisms must name some of {', '.join(SASL_MECHANISMS)}, not {value!r}")
    return mechanisms


def _client_auth(value) -> str:
    text = str(value).strip().lower()
    if text not in SSL_CLIENT_AUTH:
        raise ValueError(f"ssl.client.auth must be one of {', '.join(SSL_CLIENT_AUTH)}, not {value!r}")
    return text


_BOOL_SETTINGS = {
    "auto.create.topics.enable": "auto_create_topics",
    "allow.everyone.if.no.acl.found": "allow_everyone_if_no_acl_found",
    "transaction.durable.at.end": "transaction_durable_at_end",
}

# ``authorizer.class.name``: Kafka's two ACL authorizers (so a copied
# server.properties works) or onceflow's short name; empty: no authorizer.
ACL_AUTHORIZER = "acl"
AUTHORIZER_NAMES = {"": "", ACL_AUTHORIZER: ACL_AUTHORIZER, "kafka.security.authorizer.AclAuthorizer": ACL_AUTHORIZER, "org.apache.kafka.metadata.authorizer.StandardAuthorizer": ACL_AUTHORIZER}


def _parse_authorizer(value) -> str:
    name = str(value).strip()
    if name not in AUTHORIZER_NAMES:
        raise ValueError(f"authorizer.class.name must be acl (or Kafka's AclAuthorizer/StandardAuthorizer class name), or empty for none, not {value!r}")
    return AUTHORIZER_NAMES[name]


def _tls_needs_asyncio(config: BrokerConfig, event_loop: str) -> None:
    """uvloop 0.23 loses what a client sent before the server's start_tls
    (uvloop issue 707): a TLS client's ClientHello, read ahead on accept, so
    its handshake hangs until the authentication timeout. Refused, not hung."""
    if event_loop == UVLOOP and config.tls_listeners:
        names = ", ".join(listener.name for listener in config.tls_listeners)
        raise ValueError(f"event.loop=uvloop cannot serve TLS listeners ({names}) yet: its start_tls loses the client's first bytes; use event.loop=asyncio")


@attrs.frozen
class BrokerConfig:
    data_dir: str = DEFAULT_DATA_DIR
    host: str = DEFAULT_HOST
    port: int = attrs.field(default=DEFAULT_PORT, validator=attrs.validators.and_(attrs.validators.ge(0), attrs.validators.le(65535)))
    # Host and port put in Metadata responses; defaults to what we bind.
    advertised_host: str | None = None
    advertised_port: int | None = None
    node_id: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    cluster_id: str | None = None
    auto_create_topics: bool = True
    num_partitions: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    socket_request_max_bytes: int = attrs.field(default=100 * 1024 * 1024, validator=attrs.validators.ge(1024))
    max_inflight_requests_per_connection: int = attrs.field(default=64, validator=attrs.validators.ge(1))
    # Kafka's default is 55 MiB, sized for zero-copy sends; here an answer is
    # built in memory, so a smaller cap keeps the broker's peak memory low
    # (and measured faster: benchmarks/memory.py).
    fetch_max_bytes: int = attrs.field(default=8 * 1024 * 1024, validator=attrs.validators.ge(1024))
    message_max_bytes: int = attrs.field(default=1024 * 1024 + 12, validator=attrs.validators.ge(64))
    retention_check_interval_ms: int = attrs.field(default=300_000, validator=attrs.validators.ge(10))
    transaction_state_partitions: int = attrs.field(default=50, validator=attrs.validators.ge(1))
    transaction_max_timeout_ms: int = attrs.field(default=900_000, validator=attrs.validators.ge(1))
    transactional_id_expiration_ms: int = attrs.field(default=7 * 24 * 3600 * 1000, validator=attrs.validators.ge(1))
    transaction_abort_interval_ms: int = attrs.field(default=10_000, validator=attrs.validators.ge(10))
    # onceflow's own: a producer whose AddOffsetsToTxn was answered and that
    # sends neither TxnOffsetCommit nor EndTxn within this long has that
    # connection closed, once, which wakes a librdkafka stuck on a stale
    # group coordinator (broker.offset_commit_watch); 0: never. Above the
    # gap of a healthy client on a loaded machine (200 closed some), far
    # below the stall it ends (the transaction's timeout).
    transaction_offset_commit_stall_ms: int = attrs.field(default=1000, validator=attrs.validators.ge(0))
    # The finalized level of Kafka's ``transaction.version`` feature (ApiVersions):
    # 2 offers KIP-890 part 2 (Produce v12, TxnOffsetCommit v5, EndTxn v5 with
    # its epoch bump) to clients that know it; 0 or 1 offers only the classic
    # protocol (Produce up to v11, EndTxn and TxnOffsetCommit up to v4).
    transaction_version: int = attrs.field(default=2, validator=[attrs.validators.ge(0), attrs.validators.le(2)])
    # onceflow's own: a transactional Produce or TxnOffsetCommit is answered
    # once appended, and EndTxn(commit) makes the transaction's data durable
    # in its decision's fsync round (one round per transaction on the
    # client's path); after an unclean stop in a new boot of the machine every
    # unsealed transaction left Ongoing is aborted (its acknowledged bytes may
    # be gone; a crash of the process alone loses none). False: each of those requests
    # waits for its own fsync (docs/concepts/transactions.md says why it is
    # not the default yet: an unsealed transaction open at a power cut is
    # aborted, which some clients treat as fatal).
    transaction_durable_at_end: bool = False
    offsets_topic_partitions: int = attrs.field(default=50, validator=attrs.validators.ge(1))
    group_initial_rebalance_delay_ms: int = attrs.field(default=3000, validator=attrs.validators.ge(0))
    group_min_session_timeout_ms: int = attrs.field(default=6000, validator=attrs.validators.ge(1))
    group_max_session_timeout_ms: int = attrs.field(default=1_800_000, validator=attrs.validators.ge(1))
    offsets_retention_minutes: int = attrs.field(default=7 * 24 * 60, validator=attrs.validators.ge(1))
    offsets_retention_check_interval_ms: int = attrs.field(default=600_000, validator=attrs.validators.ge(10))
    # Client quotas are measured over quota.window.num samples of quota.window.size.seconds (Kafka's defaults).
    quota_window_num: int = attrs.field(default=11, validator=attrs.validators.ge(2))
    quota_window_size_seconds: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    # Security (broker.security). Empty listeners: one PLAINTEXT listener on
    # host:port (advertising advertised_host/advertised_port), as before.
    listeners: tuple = attrs.field(default=(), converter=tuple)
    # TLS for SSL and SASL_SSL listeners: PEM files (certificate chain, key,
    # and the CAs client certificates are checked against).
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_cafile: str | None = None
    ssl_client_auth: str = attrs.field(default="none", converter=_client_auth)
    sasl_enabled_mechanisms: tuple = attrs.field(default=SASL_MECHANISMS, converter=_mechanisms)
    # KIP-368: 0 means sessions never expire (no re-authentication needed).
    connections_max_reauth_ms: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    max_connections: int = attrs.field(default=UNLIMITED, validator=attrs.validators.ge(1))
    max_connections_per_ip: int = attrs.field(default=UNLIMITED, validator=attrs.validators.ge(1))
    # The largest frame a connection may send before it has authenticated
    # (Kafka's sasl.server.max.receive.size, 512 KiB).
    sasl_server_max_receive_size: int = attrs.field(default=524288, validator=attrs.validators.ge(1024))
    # onceflow's own: a connection on a TLS or SASL listener that has not
    # finished its TLS handshake and SASL authentication by then is closed.
    authentication_timeout_ms: int = attrs.field(default=10_000, validator=attrs.validators.ge(1))
    # Kafka's: a failed login is answered (and closed) this much later, to
    # slow down password guessing.
    failed_authentication_delay_ms: int = attrs.field(default=100, validator=attrs.validators.ge(0))
    # Authorisation (broker.security): "" (nothing checked) or "acl".
    authorizer: str = ""
    super_users: frozenset = attrs.field(factory=frozenset, converter=frozenset)
    allow_everyone_if_no_acl_found: bool = False
    # onceflow's own: the event loop ``onceflow broker`` runs on, uvloop
    # (where installed: less CPU per request) or asyncio; asyncio where a
    # listener uses TLS (see _tls_needs_asyncio). The embedded broker runs on
    # its host's loop thread, whatever this says.
    event_loop: str = attrs.field(
        default=attrs.Factory(lambda config: ASYNCIO if config.tls_listeners else default_event_loop(), takes_self=True),
        converter=event_loop_name, validator=lambda config, _attribute, name: _tls_needs_asyncio(config, name),
    )
    # Defaults for topic (log) settings, in Kafka's names: segment.bytes, flush.policy, ...
    log_defaults: dict = attrs.field(factory=dict)

    @property
    def advertised(self) -> tuple[str, int]:
        return (self.advertised_host or self.host, self.advertised_port or self.port)

    @property
    def tls_listeners(self) -> tuple[Listener, ...]:
        return tuple(listener for listener in self.effective_listeners if listener.uses_tls)

    @property
    def effective_listeners(self) -> tuple[Listener, ...]:
        """The listeners to bind: ``listeners``, or the one PLAINTEXT listener
        that ``host``/``port`` (and ``advertised_*``) describe."""
        if self.listeners:
            return self.listeners
        return (Listener(PLAINTEXT, PLAINTEXT, self.host, self.port, self.advertised_host, self.advertised_port),)

    @classmethod
    def from_properties(cls, properties: dict, **fields) -> BrokerConfig:
        """Build from Kafka-style names; unknown names that are topic settings go to log_defaults."""
        values = dict(fields)
        log_defaults = dict(values.pop("log_defaults", {}) or {})
        listener_settings = {}
        for name, raw in properties.items():
            if name in _LISTENER_SETTINGS:
                listener_settings[name] = str(raw)
            elif name == "sasl.enabled.mechanisms":
                values["sasl_enabled_mechanisms"] = _mechanisms(raw)
            elif name == "ssl.client.auth":
                values["ssl_client_auth"] = _client_auth(raw)
            elif name in _INT_SETTINGS:
                try:
                    values[_INT_SETTINGS[name]] = int(raw)
                except ValueError:
                    raise ValueError(f"{name} must be an integer, not {raw!r}") from None
            elif name in _BOOL_SETTINGS:
                values[_BOOL_SETTINGS[name]] = parse_bool(raw, name)
            elif name == "log.dirs" or name == "log.dir":
                values["data_dir"] = str(raw)
            elif name == "authorizer.class.name":
                values["authorizer"] = _parse_authorizer(raw)
            elif name == "super.users":
                from broker.security.acls import AuthorizerSettings

                values["super_users"] = AuthorizerSettings.parse_super_users(str(raw))
            elif name == "cluster.id":
                values["cluster_id"] = str(raw)
            elif name == "event.loop":
                values["event_loop"] = raw
            elif name.startswith("log."):
                # Broker-level topic defaults: log.segment.bytes -> segment.bytes
                log_defaults[name[len("log.") :]] = raw
            else:
                log_defaults[name] = raw
        if isinstance(values.get("listeners"), str):  # EmbeddedBroker(listeners="SASL_SSL://...")
            listener_settings.setdefault("listeners", values.pop("listeners"))
        if "listeners" in listener_settings:
            listeners = parse_listeners(
                listener_settings["listeners"],
                advertised=listener_settings.get("advertised.listeners"),
                protocol_map=listener_settings.get("listener.security.protocol.map"),
            )
            values["listeners"] = listeners
        elif listener_settings:
            raise ValueError(f"{', '.join(sorted(listener_settings))} need listeners as well")
        if values.get("listeners"):
            first = values["listeners"][0]
            # host/port name the first listener (what bootstrap and logs show).
            values["host"], values["port"] = first.host, first.port
            if values.get("advertised_host") or values.get("advertised_port"):
                # The one --advertise of a command line applies to the first listener.
                first = attrs.evolve(
                    first,
                    advertised_host=first.advertised_host or values.get("advertised_host"),
                    advertised_port=first.advertised_port or values.get("advertised_port"),
                )
                values["listeners"] = (first, *values["listeners"][1:])
        return cls(log_defaults=log_defaults, **values)

    def with_data_dir(self, data_dir: str) -> BrokerConfig:
        return attrs.evolve(self, data_dir=os.path.abspath(data_dir))
