"""Connection limits at the edge: how many connections the broker holds in
all and per client address (Kafka's ``max.connections`` and
``max.connections.per.ip``). Counting only, no I/O: ``broker.server`` asks
``try_open`` before serving a new connection and closes it at once (logged)
when the answer is a refusal, and calls ``closed`` when a connection ends.
One limiter is shared by every listener of a broker.
"""

from __future__ import annotations

import collections

import attrs


@attrs.define(kw_only=True)
class ConnectionLimiter:
    max_connections: int
    max_connections_per_ip: int
    total: int = attrs.field(default=0, init=False)
    _per_ip: collections.Counter = attrs.field(factory=collections.Counter, init=False)

    def try_open(self, ip: str) -> str | None:
        """Count a new connection from ``ip``, or say why it is refused."""
        if self.total >= self.max_connections:
            return f"max.connections ({self.max_connections}) reached"
        if self._per_ip[ip] >= self.max_connections_per_ip:
            return f"max.connections.per.ip ({self.max_connections_per_ip}) reached for {ip}"
        self.total += 1
        self._per_ip[ip] += 1
        return None

    def closed(self, ip: str) -> None:
        self.total -= 1
        self._per_ip[ip] -= 1
        if self._per_ip[ip] <= 0:
            del self._per_ip[ip]
