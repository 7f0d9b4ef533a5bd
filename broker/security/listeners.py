"""Listeners, Kafka style: where the broker listens, with which security
protocol, and which address each listener advertises. Parsing only, no I/O.

    listeners=PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9093
    advertised.listeners=SASL_SSL://broker.example.com:9093
    listener.security.protocol.map=INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL

A listener's name is its security protocol unless
``listener.security.protocol.map`` maps a custom name to one. A bare
``HOST:PORT`` (what ``--listen`` always accepted) is one PLAINTEXT listener.
A listener missing from ``advertised.listeners`` advertises the address it
binds (its bound port when it asked for port 0).

A client learns brokers' addresses from Metadata, FindCoordinator and
DescribeCluster; it gets those of the listener it connected on
(``AdvertisedEndpoints.address_for``), as in Kafka, so a client that came in
through SASL_SSL is never sent to the PLAINTEXT port.
"""

from __future__ import annotations

import attrs

PLAINTEXT = "PLAINTEXT"
SSL = "SSL"
SASL_PLAINTEXT = "SASL_PLAINTEXT"
SASL_SSL = "SASL_SSL"
SECURITY_PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
TLS_PROTOCOLS = frozenset({SSL, SASL_SSL})
SASL_PROTOCOLS = frozenset({SASL_PLAINTEXT, SASL_SSL})
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class ListenerError(ValueError):
    """A listener setting that cannot be used (said in the message)."""


@attrs.frozen
class Listener:
    """One address the broker binds, with its name and security protocol."""

    name: str
    security_protocol: str
    host: str
    port: int
    advertised_host: str | None = None
    advertised_port: int | None = None

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in TLS_PROTOCOLS

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in SASL_PROTOCOLS

    @property
    def is_loopback(self) -> bool:
        return self.host in LOOPBACK_HOSTS or self.host.startswith("127.")

    def advertised(self, bound_port: int | None = None) -> tuple[str, int]:
        """The address clients are told for this listener."""
        port = self.advertised_port or bound_port or self.port
        return (self.advertised_host or self.host, port)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


def parse_protocol_map(text: str | None) -> dict[str, str]:
    """``INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL`` -> {"INTERNAL": "PLAINTEXT", ...};
    the protocols map to themselves unless overridden."""
    mapping = {protocol: protocol for protocol in SECURITY_PROTOCOLS}
    for entry in _split(text or ""):
        name, separator, protocol = entry.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not separator or not name or protocol not in SECURITY_PROTOCOLS:
            raise ListenerError(
                f"listener.security.protocol.map wants NAME:PROTOCOL pairs (PROTOCOL one of {', '.join(SECURITY_PROTOCOLS)}), not {entry!r}"
            )
        mapping[name] = protocol
    return mapping


def parse_address(text: str, *, default_host: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[::1]:PORT`` or ``:PORT`` (the default host)."""
    host, separator, port = text.strip().rpartition(":")
    if not separator or not port.isdigit() or int(port) > 65535:
        raise ListenerError(f"wants HOST:PORT, not {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or default_host, int(port)


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _parse_entries(text: str, setting: str, protocol_map: dict[str, str], default_host: str) -> list[tuple[str, str, str, int]]:
    entries = []
    for entry in _split(text):
        if "://" not in entry:
            # The single HOST:PORT form --listen always took: one PLAINTEXT listener.
            host, port = parse_address(entry, default_host=default_host)
            entries.append((PLAINTEXT, PLAINTEXT, host, port))
            continue
        name, _, address = entry.partition("://")
        name = name.strip().upper()
        protocol = protocol_map.get(name)
        if protocol is None:
            raise ListenerError(
                f"{setting}: listener {name!r} is neither a security protocol ({', '.join(SECURITY_PROTOCOLS)}) "
                "nor named in listener.security.protocol.map"
            )
        try:
            host, port = parse_address(address, default_host=default_host)
        except ListenerError as error:
            raise ListenerError(f"{setting}: {entry!r}: {error}") from None
        entries.append((name, protocol, host, port))
    names = [entry[0] for entry in entries]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ListenerError(f"{setting}: each listener name may appear once; repeated: {', '.join(duplicates)}")
    return entries


def parse_listeners(
    text: str,
    *,
    advertised: str | None = None,
    protocol_map: str | None = None,
    default_host: str = "127.0.0.1",
) -> tuple[Listener, ...]:
    """The listeners of ``listeners`` (with ``advertised.listeners`` and
    ``listener.security.protocol.map``), in the order given; the first is the
    one ``Broker.bootstrap`` names."""
    mapping = parse_protocol_map(protocol_map)
    entries = _parse_entries(text, "listeners", mapping, default_host)
    if not entries:
        raise ListenerError("listeners: at least one listener is needed")
    ports = [port for _, _, _, port in entries if port != 0]
    repeated = sorted({port for port in ports if ports.count(port) > 1})
    if repeated:
        raise ListenerError(f"listeners: two listeners cannot bind the same port ({', '.join(map(str, repeated))})")
    advertised_by_name = {}
    for name, _protocol, host, port in _parse_entries(advertised or "", "advertised.listeners", mapping, default_host):
        advertised_by_name[name] = (host, port)
    known = {entry[0] for entry in entries}
    unknown = sorted(set(advertised_by_name) - known)
    if unknown:
        raise ListenerError(f"advertised.listeners names {', '.join(unknown)}, which listeners does not define")
    listeners = []
    for name, protocol, host, port in entries:
        advertised_host, advertised_port = advertised_by_name.get(name, (None, None))
        listeners.append(Listener(name, protocol, host, port, advertised_host, advertised_port or None))
    return tuple(listeners)


@attrs.frozen
class AdvertisedEndpoints:
    """The address each listener advertises, once the ports are bound."""

    by_listener: dict = attrs.field(converter=dict)  # listener name -> (host, port)
    default: str = PLAINTEXT

    def address_for(self, session=None) -> tuple[str, int]:
        """The address of the listener ``session`` came in on (the first
        listener's for a request without one, such as a test's)."""
        name = getattr(session, "listener", None)
        address = self.by_listener.get(name)
        return address if address is not None else self.by_listener[self.default]


def advertised_address(advertised, session=None) -> tuple[str, int]:
    """What a handler puts in its answer: ``advertised`` is either one
    ``(host, port)`` (a handler built without listeners, in tests) or the
    broker's ``AdvertisedEndpoints``."""
    if isinstance(advertised, AdvertisedEndpoints):
        return advertised.address_for(session)
    return advertised
