"""The fault proxy's sans-I/O part: what a fault is, what the proxy counts
and logs, and how a client's byte stream is cut into Kafka requests.

- Directions: ``"upstream"`` (client to broker), ``"downstream"`` (broker to
  client) or ``"both"``.
- Fault settings per direction (``DirectionFaults``), per connection
  (``ConnectionDelay``) and per request API (``RequestRule``).
- Counters (``ProxyCounters``) and the event log's entries (``ProxyEvent``,
  ``FAULT_EVENT_KINDS``) for the harness's timeline.
- ``KafkaRequestFramer``: cuts the client-to-broker stream into whole request
  frames with ``protocol.framing``'s frame buffer (the one Kafka framer of the
  house) and, when the stream turns out not to be Kafka, passes it through
  unframed; ``client_id_is`` picks connections by their first request.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Callable

import attrs

from protocol.errors import FrameTooLargeError
from protocol.framing import FrameBuffer, RequestHeader

if TYPE_CHECKING:
    from faults.proxy import ProxiedConnection

UPSTREAM = "upstream"
DOWNSTREAM = "downstream"
BOTH = "both"
DIRECTIONS = (UPSTREAM, DOWNSTREAM)

# Kafka's socket.request.max.bytes default; a larger "size" means the stream is not Kafka.
MAX_REQUEST_BYTES = 100 * 1024 * 1024
SIZE_PREFIX = struct.Struct(">i")
# A request frame starts: int32 size (of what follows), int16 api_key,
# int16 api_version, int32 correlation_id: a smaller size is not Kafka.
MIN_REQUEST_BODY_BYTES = 8

# Event kinds that record a fault being applied or cleared (the rest record
# what happened to connections and requests).
FAULT_EVENT_KINDS = frozenset({
    "cut", "refuse", "refuse_cleared", "blackhole", "blackhole_cleared",
    "delay", "delay_cleared", "hold", "release", "delay_connection",
    "connection_delays_cleared", "delay_requests", "drop_requests",
    "requests_cleared", "heal",
})


def directions(direction: str) -> tuple[str, ...]:
    if direction == BOTH:
        return DIRECTIONS
    if direction in DIRECTIONS:
        return (direction,)
    raise ValueError(f"direction must be upstream, downstream or both, not {direction!r}")


# ------------------------------------------------------------------ Kafka request framing


class KafkaRequestFramer:
    """Cuts a client-to-broker byte stream into whole request frames.

    ``feed(data)`` returns ``(header, frame)`` pairs (the frame with its size
    prefix, as it goes on the wire) for the frames completed so far. A size
    prefix outside ``[8, max_frame_bytes]`` means the stream is not Kafka (or
    is corrupt): framing is lost for good, and from then on ``feed`` passes
    bytes through as ``(None, data)``.
    """

    def __init__(self, max_frame_bytes: int = MAX_REQUEST_BYTES):
        self._frames = FrameBuffer(max_frame_bytes, min_frame_size=MIN_REQUEST_BODY_BYTES)
        self.framing_lost = False

    def feed(self, data: bytes) -> list[tuple[RequestHeader | None, bytes]]:
        if self.framing_lost:
            return [(None, bytes(data))] if data else []
        self._frames.feed(data)
        pieces = []
        while True:
            try:
                body = self._frames.next_frame()
            except FrameTooLargeError:
                self.framing_lost = True
                pieces.append((None, self._frames.take_buffered()))
                break
            if body is None:
                break
            pieces.append((RequestHeader.peek(body), SIZE_PREFIX.pack(len(body)) + body))
        return pieces

    def take_partial(self) -> bytes:
        """The bytes of an incomplete frame (at end of stream they go on as they are)."""
        return self._frames.take_buffered()


def client_id_is(client_id: str) -> Callable[[bytes], bool]:
    """A ``delay_connection`` predicate: the connection's first request was sent
    with this Kafka ``client.id``."""

    def matches(first_request: bytes) -> bool:
        header = RequestHeader.peek(first_request[SIZE_PREFIX.size :])
        return header is not None and header.client_id == client_id

    return matches


# ------------------------------------------------------------------ faults, counters, events


@attrs.define
class DirectionFaults:
    blackholed: bool = False
    held: bool = False
    delay_seconds: float = 0.0
    jitter_seconds: float = 0.0


@attrs.frozen
class ConnectionDelay:
    """Delay the connections ``match`` picks: an int is an accept index
    (0 is the first connection this proxy accepted), a callable gets the
    connection's first request (size prefix included) and returns a bool."""

    match: int | Callable[[bytes], bool]
    seconds: float
    direction: str = BOTH

    def matches(self, connection: "ProxiedConnection") -> bool:
        if isinstance(self.match, int):
            return connection.index == self.match
        return connection.first_request is not None and bool(self.match(connection.first_request))


@attrs.define
class RequestRule:
    api_key: int
    action: str  # "delay" or "drop"
    seconds: float = 0.0
    remaining: int | None = None  # requests still to act on; None: until cleared


@attrs.define
class DirectionCounters:
    bytes_read: int = 0  # = forwarded + dropped + still queued
    bytes_forwarded: int = 0
    chunks_forwarded: int = 0
    bytes_dropped: int = 0
    chunks_dropped: int = 0


@attrs.define
class ProxyCounters:
    upstream: DirectionCounters = attrs.field(factory=DirectionCounters)
    downstream: DirectionCounters = attrs.field(factory=DirectionCounters)
    connections_accepted: int = 0
    connections_refused: int = 0
    connections_cut: int = 0
    connections_failed: int = 0  # the target could not be reached
    requests_seen: int = 0
    requests_delayed: int = 0
    requests_dropped: int = 0

    def direction(self, name: str) -> DirectionCounters:
        return self.upstream if name == UPSTREAM else self.downstream


@attrs.frozen
class ProxyEvent:
    at: float  # seconds, from the proxy's clock (time.time by default)
    kind: str
    detail: dict = attrs.field(factory=dict)

    @property
    def is_fault(self) -> bool:
        return self.kind in FAULT_EVENT_KINDS
