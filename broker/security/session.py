"""Who is asking: the principal a connection authenticated as and where it
connects from.

``broker.server`` builds one ``Session`` per connection (replacing it when the
connection authenticates or re-authenticates) and passes it with every request
to the dispatcher, so authorisation, quotas and handlers all see the same
identity. A connection that has not authenticated (a PLAINTEXT or SSL listener
without client certificates) is ``User:ANONYMOUS``, as in Kafka.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs


@attrs.frozen
class KafkaPrincipal:
    """A principal in Kafka's ``Type:name`` form (``User:alice``)."""

    type: str
    name: str

    @classmethod
    def parse(cls, text: str) -> KafkaPrincipal:
        """``User:alice`` -> KafkaPrincipal("User", "alice"); the name may
        itself contain colons, the type may not be empty."""
        kind, separator, name = text.partition(":")
        if not separator or not kind or not name:
            raise ValueError(f"a principal is written Type:name (User:alice), not {text!r}")
        return cls(kind, name)

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"


ANONYMOUS = KafkaPrincipal("User", "ANONYMOUS")


@attrs.frozen
class Session:
    """One connection's identity: its principal, the address it connects
    from, and the listener (name and security protocol) it came in on."""

    principal: KafkaPrincipal = ANONYMOUS
    client_host: str = "127.0.0.1"
    listener: str = "PLAINTEXT"
    security_protocol: str = "PLAINTEXT"
    # Closes this connection (given why, for the log), as a network failure
    # would: answers not yet written are lost and the client reconnects.
    # Not part of the identity (two connections of one user are equal).
    close_connection: Callable[[str], None] | None = attrs.field(default=None, eq=False, repr=False)
    # True once the peer is gone (its end closed or reset), while requests it
    # sent may still be in flight (a JoinGroup held for its round).
    connection_gone: Callable[[], bool] = attrs.field(default=lambda: False, eq=False, repr=False)
