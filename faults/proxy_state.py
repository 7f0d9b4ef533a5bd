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
- ``ResponseFramer``: follows the broker-to-client stream's frame boundaries,
  passing bytes on as they come except the responses it was told to hold,
  which it hands over whole (the fetch cut rewrites them).
- ``cut_fetch_response``: a Fetch response with each partition's records
  sliced by bytes the way Apache Kafka slices its log, so that it ends inside
  a record batch, re-framed (record sizes, frame size) so the client can
  parse it: ``"tail"`` cuts inside the last batch of a partition that has
  two or more (Kafka since KIP-74 always sends the first batch whole);
  ``"partition_max_bytes"`` slices at the request's per-partition limit
  exactly, as a broker before KIP-74 did (and Kafka still does for every
  partition after the first of a response): the request goes to the broker
  with each limit doubled (``FetchRequestSeen.widened``) so that there is
  something beyond the limit to cut.
"""

from __future__ import annotations

import random
import struct
from typing import TYPE_CHECKING, Callable

import attrs

from protocol import schema
from protocol.errors import FrameTooLargeError
from protocol.framing import FrameBuffer, RequestHeader, ServerConnection, encode_request, encode_response, response_header_version
from protocol.messages import FETCH_RESPONSE, ApiKey
from protocol.records import LOG_OVERHEAD, split_partial_tail

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
    "requests_cleared", "heal", "cut_fetches", "fetch_cuts_cleared",
})
FETCH_CUT_MODES = ("tail", "partition_max_bytes")
_SIZE_AND_CORRELATION = struct.Struct(">ii")


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


class ResponseFramer:
    """Follows a broker-to-client byte stream frame by frame.

    ``hold(correlation_id, context)`` asks for that response whole: ``feed``
    returns ``(context, frame)`` for it (size prefix included) once every
    byte is in. Every other byte goes on at once as ``(None, data)``, one
    piece per run of bytes, so a stream with nothing held is passed through
    chunk for chunk. A size prefix below 4 or above ``max_frame_bytes`` means
    the stream is not Kafka: from then on everything passes through."""

    def __init__(self, max_frame_bytes: int = MAX_REQUEST_BYTES):
        self.max_frame_bytes = max_frame_bytes
        self.framing_lost = False
        self._wanted: dict[int, object] = {}
        self._start = bytearray()  # the first 8 bytes of a frame (size, correlation id), while incomplete
        self._passing = 0  # bytes of the current frame still to pass through
        self._held: tuple[object, int] | None = None  # (context, whole frame size) of the frame being held
        self._frame = bytearray()

    def hold(self, correlation_id: int, context: object) -> None:
        self._wanted[correlation_id] = context

    def feed(self, data: bytes) -> list[tuple[object, bytes]]:
        out: list[tuple[object, bytes]] = []
        passed = bytearray()
        position, end = 0, len(data)
        while position < end:
            if self.framing_lost:
                passed += data[position:]
                break
            if self._passing:
                take = min(self._passing, end - position)
                passed += data[position : position + take]
                self._passing -= take
                position += take
                continue
            if self._held is not None:
                context, total = self._held
                take = min(total - len(self._frame), end - position)
                self._frame += data[position : position + take]
                position += take
                if len(self._frame) == total:
                    if passed:
                        out.append((None, bytes(passed)))
                        passed = bytearray()
                    out.append((context, bytes(self._frame)))
                    self._frame = bytearray()
                    self._held = None
                continue
            take = min(_SIZE_AND_CORRELATION.size - len(self._start), end - position)
            self._start += data[position : position + take]
            position += take
            if len(self._start) < _SIZE_AND_CORRELATION.size:
                break
            size, correlation_id = _SIZE_AND_CORRELATION.unpack(self._start)
            if size < 4 or size > self.max_frame_bytes:
                self.framing_lost = True
                passed += self._start
            elif correlation_id in self._wanted:
                self._held = (self._wanted.pop(correlation_id), SIZE_PREFIX.size + size)
                self._frame = bytearray(self._start)
            else:
                passed += self._start
                self._passing = SIZE_PREFIX.size + size - len(self._start)
            self._start = bytearray()
        if passed:
            out.append((None, bytes(passed)))
        return out

    def take_partial(self) -> bytes:
        """Bytes of a frame not yet passed on (at end of stream they go on as they are)."""
        rest = bytes(self._start) + bytes(self._frame)
        self._start, self._frame, self._held = bytearray(), bytearray(), None
        return rest


# ------------------------------------------------------------------ the fetch cut


INT32_MAX = 2**31 - 1


@attrs.frozen
class FetchRequestSeen:
    """What the cut needs to know of a Fetch request: the cut's mode when it
    was sent, its version and each partition's ``partition_max_bytes`` as the
    client asked (by topic name, or topic id from v13)."""

    mode: str
    api_version: int
    partition_max_bytes: dict
    widened: bytes | None = None  # the frame to send instead, limits doubled ("partition_max_bytes" mode)

    @classmethod
    def from_frame(cls, frame: bytes, mode: str) -> "FetchRequestSeen":
        """Read a Fetch request frame (size prefix included)."""
        connection = ServerConnection()
        connection.receive_data(frame)
        request = connection.next_request()
        limits = {}
        for topic in request.body["topics"]:
            name = topic.get("topic_id") if request.api_version >= 13 else topic.get("topic")
            for partition in topic["partitions"]:
                limits[(name, partition["partition"])] = partition["partition_max_bytes"]
                if mode == "partition_max_bytes":
                    partition["partition_max_bytes"] = min(INT32_MAX, 2 * partition["partition_max_bytes"])
        widened = None
        if mode == "partition_max_bytes":
            request.body["max_bytes"] = min(INT32_MAX, 2 * request.body.get("max_bytes", INT32_MAX))
            widened = encode_request(ApiKey.FETCH, request.api_version, request.correlation_id, request.client_id, request.body)
        return cls(mode, request.api_version, limits, widened)


@attrs.define
class FetchCutRule:
    mode: str  # one of FETCH_CUT_MODES
    remaining: int | None = None  # responses still to cut; None: until cleared


def _batch_starts(records) -> list[int]:
    """Positions of the batches in ``records``, which holds whole batches only."""
    starts, position = [], 0
    while position < len(records):
        starts.append(position)
        (length,) = SIZE_PREFIX.unpack_from(records, position + 8)
        position += length + LOG_OVERHEAD
    return starts


def cut_fetch_response(frame: bytes, request: FetchRequestSeen, rng: random.Random) -> tuple[bytes, list[dict]]:
    """``frame`` (a whole Fetch response, size prefix included) with each
    partition's records cut as ``request.mode`` says (see the module doc), and one
    ``{topic, partition, kept, dropped}`` per partition cut. Returns the frame
    unchanged when nothing was cut."""
    version = request.api_version
    _size, correlation_id = _SIZE_AND_CORRELATION.unpack_from(frame)
    position = _SIZE_AND_CORRELATION.size
    if response_header_version(ApiKey.FETCH, version) == 1:
        count, position = schema.read_uvarint(frame, position)
        for _ in range(count):
            _tag, position = schema.read_uvarint(frame, position)
            size, position = schema.read_uvarint(frame, position)
            position += size
    body, _ = schema.decode(FETCH_RESPONSE, version, frame, position, exact=False)
    cuts = []
    for topic in body["responses"]:
        name = topic.get("topic_id") if version >= 13 else topic.get("topic")
        for partition in topic["partitions"]:
            records = partition.get("records")
            if not records:
                continue
            if split_partial_tail(records)[1] is not None:
                continue  # already ends inside a batch
            if request.mode == "tail":
                starts = _batch_starts(records)
                if len(starts) < 2:
                    continue  # Kafka sends the first batch whole
                last = starts[-1]
                keep = last + rng.randint(1, len(records) - last - 1)
            else:
                keep = request.partition_max_bytes.get((name, partition["partition_index"]), len(records))
                if keep >= len(records):
                    continue
            partition["records"] = records[:keep]
            cuts.append({"topic": str(name), "partition": partition["partition_index"], "kept": keep, "dropped": len(records) - keep})
    if not cuts:
        return frame, cuts
    return bytes(encode_response(ApiKey.FETCH, version, correlation_id, body)), cuts


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
    bytes_read: int = 0  # = forwarded + dropped + still queued (+/- what cut_fetches resized)
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
    fetch_responses_cut: int = 0
    fetch_bytes_cut: int = 0  # records bytes the cut took out of responses

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
