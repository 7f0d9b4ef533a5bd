"""Kafka framing, sans-I/O: bytes in, requests (or responses) out.

Every Kafka message travels as ``size: int32`` followed by ``size`` bytes:
a request header then the request body, or a response header then the body.

Header versions (Kafka's rules):

    request header v1: api_key int16, api_version int16, correlation_id int32,
                       client_id nullable string (int16 length)
    request header v2: v1 + tagged fields              (flexible API versions)
    response header v0: correlation_id int32
    response header v1: v0 + tagged fields             (flexible API versions)

ApiVersions responses always use response header v0, so a client that does
not yet know what the broker speaks can read the answer.

``ServerConnection`` is the broker's side: ``receive_data(bytes)`` then call
``next_request()`` until it returns None. A size prefix that is negative or
above ``max_frame_size`` (``socket.request.max.bytes``) raises
``FrameTooLargeError`` as soon as the 4 bytes arrive, before anything is
buffered for it. A complete frame whose API or version we do not serve raises
``UnsupportedRequestError`` (the frame is consumed; the next one can follow).
``ClientConnection`` is the mirror image for clients.

``FrameBuffer`` is the one frame cutter under both (and under the fault
proxy, which forwards whole request frames); ``RequestHeader.peek`` reads a
request header without judging the rest of the frame, for code that only
routes frames.
"""

from __future__ import annotations

import collections
import struct

import attrs

from protocol import schema
from protocol.allocator import uninitialised_bytearray
from protocol.errors import FrameTooLargeError, MalformedFrameError, UnsupportedRequestError
from protocol.messages import APIS, ApiKey

DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024
# A frame at least this big that arrives in pieces is gathered in a
# bytearray of its own (``FrameBuffer``); smaller ones are sliced out of the
# shared buffer.
LARGE_FRAME_BYTES = 64 * 1024
RECEIVE_SCRATCH_BYTES = 256 * 1024  # what one receive into the scratch buffer takes at most

_SIZE = struct.Struct(">i")
_REQUEST_HEADER = struct.Struct(">hhi")
_CORRELATION = struct.Struct(">i")
_INT16 = struct.Struct(">h")


@attrs.frozen
class DecodedRequest:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: dict
    flexible: bool

    @property
    def api_name(self) -> str:
        return APIS[self.api_key].name


@attrs.frozen
class DecodedResponse:
    api_key: int
    api_version: int
    correlation_id: int
    body: dict


def response_header_version(api_key: int, api_version: int) -> int:
    if api_key == ApiKey.API_VERSIONS:
        return 0
    return 1 if APIS[api_key].response.is_flexible(api_version) else 0


@attrs.frozen
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None = None

    @classmethod
    def peek(cls, frame) -> "RequestHeader | None":
        """The header of a request frame (without its size prefix), or None
        when ``frame`` is too short for one. The client id is best effort:
        None when absent or not whole."""
        if len(frame) < _REQUEST_HEADER.size:
            return None
        api_key, api_version, correlation_id = _REQUEST_HEADER.unpack_from(frame)
        client_id = None
        start = _REQUEST_HEADER.size + _INT16.size
        if len(frame) >= start:
            (length,) = _INT16.unpack_from(frame, _REQUEST_HEADER.size)
            if 0 <= length and start + length <= len(frame):
                client_id = bytes(frame[start : start + length]).decode("utf-8", errors="replace")
        return cls(api_key, api_version, correlation_id, client_id)


class FrameBuffer:
    """Accumulates bytes and cuts complete frames out of them.

    A size prefix outside ``[min_frame_size, max_frame_size]`` raises
    ``FrameTooLargeError`` as soon as its 4 bytes are here (received in
    place: when the frames before it have been taken).

    A frame of at least ``large_frame_bytes`` (``LARGE_FRAME_BYTES``) that is not whole yet is
    gathered in a bytearray of its own, appended to as its bytes arrive,
    and handed out whole: no slice copies it out of the shared buffer. (Not
    a zero-filled ``bytearray(size)`` filled in place: zeroing fresh pages
    cost twice the CPU per 1 MiB frame.)

    Bytes can also be received in place (``receive_buffer``/``received``,
    an ``asyncio.BufferedProtocol``'s ``get_buffer``/``buffer_updated``): the
    socket writes into a scratch buffer, or, once a large frame's size is
    known, straight into that frame (allocated whole then, and not
    zero-filled, ``allocator.uninitialised_bytearray``: the frame is handed
    out only once the socket has written every byte of it; the bytes reach
    it with no copy at all, where read and fed they were copied three
    times on their way). Received so, frames are cut as their bytes
    arrive, not when they are asked for: the transport reads again before
    the task that takes the frames runs, and a large frame whose size
    prefix waited in the shared buffer would be read there whole and
    copied out again. A frame above ``in_place_max_bytes`` is gathered
    as its bytes come instead: a size prefix alone should not make a
    server allocate up to ``max_frame_size`` for a peer that may never send
    the rest."""

    def __init__(
        self, max_frame_size: int, *, min_frame_size: int = 0, large_frame_bytes: int = LARGE_FRAME_BYTES, in_place_max_bytes: int | None = None
    ):
        self.max_frame_size = max_frame_size
        self.min_frame_size = min_frame_size
        self.large_frame_bytes = large_frame_bytes
        self.in_place_max_bytes = in_place_max_bytes  # None: any frame up to max_frame_size
        self._buffer = bytearray()
        self._start = 0
        self._large: bytearray | None = None  # the large frame being gathered (without its size prefix)
        self._large_size = 0  # and the size it will have
        self._receiving = False  # bytes come through receive_buffer/received
        self._into: bytearray | None = None  # a large frame received in place, allocated whole
        self._into_filled = 0
        self._scratch: bytearray | None = None
        self._into_target = False  # the last receive_buffer was the rest of _into
        self._ready: collections.deque[memoryview] = collections.deque()  # frames cut as they were received, not yet taken
        self._ready_bytes = 0
        self._refused: FrameTooLargeError | None = None  # a size prefix refused as it was received, raised after the frames before it

    def receive_buffer(self) -> memoryview:
        """Where the socket's next bytes go: the rest of a large frame
        received in place, else the scratch buffer (``received`` feeds it)."""
        self._receiving = True
        if self._into is not None:
            self._into_target = True
            return memoryview(self._into)[self._into_filled :]
        self._into_target = False
        if self._scratch is None:
            self._scratch = bytearray(RECEIVE_SCRATCH_BYTES)
        return memoryview(self._scratch)

    def received(self, nbytes: int) -> None:
        """``nbytes`` were written where ``receive_buffer`` said; every
        frame they complete is cut now."""
        if self._into_target:
            self._into_filled += nbytes
            if self._into_filled == len(self._into):
                self._add_ready(memoryview(self._into))
                self._into = None
            return
        self.feed(memoryview(self._scratch)[:nbytes])
        while self._refused is None:
            try:
                frame = self._cut()
            except FrameTooLargeError as refusal:
                self._refused = refusal
                return
            if frame is None:
                return
            self._add_ready(frame)

    def _add_ready(self, frame: memoryview) -> None:
        self._ready.append(frame)
        self._ready_bytes += len(frame)

    def feed(self, data: bytes) -> None:
        if self._large is not None:
            # The shared buffer is empty while a large frame fills.
            take = min(len(data), self._large_size - len(self._large))
            self._large += memoryview(data)[:take]
            if take == len(data):
                return
            data = memoryview(data)[take:]
        if self._start and self._start >= len(self._buffer) // 2:
            del self._buffer[: self._start]
            self._start = 0
        self._buffer += data

    def next_frame(self) -> memoryview | None:
        if self._ready:
            frame = self._ready.popleft()
            self._ready_bytes -= len(frame)
            return frame
        if self._refused is not None:
            raise self._refused
        if self._receiving:
            return None  # every whole frame was cut as it arrived
        return self._cut()

    def _cut(self) -> memoryview | None:
        if self._large is not None:
            if len(self._large) < self._large_size:
                return None
            frame, self._large = memoryview(self._large), None
            return frame
        available = len(self._buffer) - self._start
        if available < 4:
            return None
        (size,) = _SIZE.unpack_from(self._buffer, self._start)
        if size < self.min_frame_size or size > self.max_frame_size:
            raise FrameTooLargeError(f"frame size {size} is outside {self.min_frame_size}..{self.max_frame_size}")
        begin = self._start + 4
        if available < 4 + size:
            if size >= self.large_frame_bytes:
                if self._receiving and (self.in_place_max_bytes is None or size <= self.in_place_max_bytes):
                    # Not zero-filled: every byte is written by the socket
                    # before ``received`` hands the frame out (when
                    # ``_into_filled`` reaches its size), and a frame cut short
                    # is never handed out.
                    self._into = uninitialised_bytearray(size)
                    self._into_filled = available - 4
                    self._into[: self._into_filled] = memoryview(self._buffer)[begin:]
                else:
                    self._large = self._buffer[begin:]
                    self._large_size = size
                self._buffer.clear()
                self._start = 0
            return None
        # One copy, into a frame of its own that is writable: the broker
        # patches offsets into a Produce request's batches in place and
        # writes those very bytes to the segment (no further copy).
        frame = memoryview(self._buffer[begin : begin + size])
        self._start = begin + size
        if self._start == len(self._buffer):
            self._buffer.clear()
            self._start = 0
        return frame

    @property
    def backlog(self) -> int:
        """Bytes received and not taken, but for a frame being received in
        place (allocated whole already) or gathered alone."""
        return self._ready_bytes + len(self._buffer) - self._start

    @property
    def has_whole_frame(self) -> bool:
        """A frame received in place is whole and waits to be taken."""
        return bool(self._ready)

    @property
    def buffered(self) -> int:
        ready = 4 * len(self._ready) + self._ready_bytes
        large = 4 + len(self._large) if self._large is not None else 0
        into = 4 + self._into_filled if self._into is not None else 0
        return ready + large + into + len(self._buffer) - self._start

    def take_buffered(self) -> bytes:
        """Whatever is buffered and not yet taken as a frame, removed from the buffer."""
        rest = b"".join(_SIZE.pack(len(frame)) + bytes(frame) for frame in self._ready)
        self._ready.clear()
        self._ready_bytes = 0
        if self._large is not None:
            rest += _SIZE.pack(self._large_size) + bytes(self._large)
            self._large = None
        if self._into is not None:
            rest += _SIZE.pack(len(self._into)) + bytes(self._into[: self._into_filled])
            self._into = None
        rest += bytes(self._buffer[self._start :])
        self._buffer.clear()
        self._start = 0
        return rest


def _read_header_client_id(frame, pos: int) -> tuple[str | None, int]:
    if pos + 2 > len(frame):
        raise MalformedFrameError("request header: client_id length is missing")
    (length,) = _INT16.unpack_from(frame, pos)
    pos += 2
    if length == -1:
        return None, pos
    if length < 0 or pos + length > len(frame):
        raise MalformedFrameError(f"request header: client_id length {length} is invalid")
    try:
        return str(frame[pos : pos + length], "utf-8"), pos + length
    except UnicodeDecodeError:
        raise MalformedFrameError("request header: client_id is not UTF-8") from None


def _skip_tagged_fields(frame, pos: int) -> int:
    count, pos = schema.read_uvarint(frame, pos)
    for _ in range(count):
        _tag, pos = schema.read_uvarint(frame, pos)
        size, pos = schema.read_uvarint(frame, pos)
        pos += size
        if pos > len(frame):
            raise MalformedFrameError("header tagged field runs past the end of the frame")
    return pos


class _ReceivesFrames:
    """Bytes in, on either side: fed (``receive_data``), or received in
    place (``receive_buffer``/``received``, ``protocol.frame_stream``)."""

    _frames: FrameBuffer

    def receive_data(self, data: bytes) -> None:
        self._frames.feed(data)

    def receive_buffer(self) -> memoryview:
        """``FrameBuffer.receive_buffer``: where the socket's next bytes go."""
        return self._frames.receive_buffer()

    def received(self, nbytes: int) -> None:
        self._frames.received(nbytes)

    @property
    def backlog_bytes(self) -> int:
        return self._frames.backlog

    @property
    def has_whole_frame(self) -> bool:
        return self._frames.has_whole_frame


class ServerConnection(_ReceivesFrames):
    """The broker's view of one connection's byte stream."""

    def __init__(
        self,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        supported_versions: dict[int, tuple[int, int]] | None = None,
        in_place_max_bytes: int | None = None,
    ):
        self._frames = FrameBuffer(max_frame_size, in_place_max_bytes=in_place_max_bytes)
        # api key -> (min, max) this side serves; default: everything the tables know.
        self.supported_versions = supported_versions or {
            key: (api.request.valid[0], api.request.valid[1]) for key, api in APIS.items()
        }

    @property
    def max_frame_size(self) -> int:
        return self._frames.max_frame_size

    @max_frame_size.setter
    def max_frame_size(self, size: int) -> None:
        # The broker raises it once a SASL connection has authenticated.
        self._frames.max_frame_size = size

    def discard_buffered(self) -> None:
        """Drop whatever was received and not taken (a connection about to close)."""
        self._frames.take_buffered()

    def next_frame(self) -> memoryview | None:
        """The next whole frame as it came, without decoding a header: a
        SASL token after a v0 SaslHandshake travels that way."""
        return self._frames.next_frame()

    def next_request(self) -> DecodedRequest | None:
        frame = self._frames.next_frame()
        if frame is None:
            return None
        if len(frame) < _REQUEST_HEADER.size:
            raise MalformedFrameError(f"request of {len(frame)} bytes is shorter than a request header")
        api_key, api_version, correlation_id = _REQUEST_HEADER.unpack_from(frame)
        supported = self.supported_versions.get(api_key)
        if supported is None or api_key not in APIS:
            raise UnsupportedRequestError(
                f"api key {api_key} is not supported", api_key=api_key, api_version=api_version, correlation_id=correlation_id
            )
        if not supported[0] <= api_version <= supported[1]:
            raise UnsupportedRequestError(
                f"{APIS[api_key].name} v{api_version} is not supported (we serve v{supported[0]}-v{supported[1]})",
                api_key=api_key,
                api_version=api_version,
                correlation_id=correlation_id,
            )
        client_id, pos = _read_header_client_id(frame, _REQUEST_HEADER.size)
        api = APIS[api_key]
        flexible = api.request.is_flexible(api_version)
        if flexible:
            pos = _skip_tagged_fields(frame, pos)
        # Like Kafka's own parser we ignore bytes after the body: librdkafka, for
        # one, sends a few more than the schema of Metadata v12 has.
        body, _ = schema.decode(api.request, api_version, frame, pos, exact=False)
        return DecodedRequest(api_key, api_version, correlation_id, client_id, body, flexible)

    def encode_response(self, request: DecodedRequest, body: dict) -> bytearray:
        return encode_response(request.api_key, request.api_version, request.correlation_id, body)

    def encode_response_parts(self, request: DecodedRequest, body: dict) -> list:
        return encode_response_parts(request.api_key, request.api_version, request.correlation_id, body)

    @property
    def buffered_bytes(self) -> int:
        return self._frames.buffered


def encode_response(api_key: int, api_version: int, correlation_id: int, body: dict) -> bytearray:
    """The whole frame (size prefix included). A bytearray, not bytes: a Fetch
    answer can be tens of MiB, and converting would copy it once more."""
    return _encode_response(bytearray(8), api_key, api_version, correlation_id, body)


def encode_response_parts(api_key: int, api_version: int, correlation_id: int, body: dict) -> list:
    """The whole frame as buffers to write in order: its large bytes values
    (a Fetch answer's records, each as it was read from the segment) are
    parts of their own, not copied into the frame (``schema.SpillingBuffer``)."""
    return _encode_response(schema.SpillingBuffer(8), api_key, api_version, correlation_id, body).parts()


def _encode_response(out: bytearray, api_key: int, api_version: int, correlation_id: int, body: dict) -> bytearray:
    _CORRELATION.pack_into(out, 4, correlation_id)
    if response_header_version(api_key, api_version) == 1:
        out.append(0)  # no tagged fields in the header
    schema.encode_into(out, APIS[api_key].response, api_version, body)
    _SIZE.pack_into(out, 0, _size_of(out) - 4)
    return out


def _size_of(out: bytearray) -> int:
    return out.total_size if isinstance(out, schema.SpillingBuffer) else len(out)


def encode_api_versions_fallback(correlation_id: int, body: dict) -> bytes:
    """The v0 ApiVersions response Kafka sends for a version it does not know."""
    return encode_response(ApiKey.API_VERSIONS, 0, correlation_id, body)


def encode_request(api_key: int, api_version: int, correlation_id: int, client_id: str | None, body: dict) -> bytes:
    return bytes(_encode_request(bytearray(4), api_key, api_version, correlation_id, client_id, body))


def encode_request_parts(api_key: int, api_version: int, correlation_id: int, client_id: str | None, body: dict) -> list:
    """The whole frame as buffers to write in order, a Produce request's
    large record sets as parts of their own (``schema.SpillingBuffer``)."""
    return _encode_request(schema.SpillingBuffer(4), api_key, api_version, correlation_id, client_id, body).parts()


def _encode_request(out: bytearray, api_key: int, api_version: int, correlation_id: int, client_id: str | None, body: dict) -> bytearray:
    api = APIS[api_key]
    out += _REQUEST_HEADER.pack(api_key, api_version, correlation_id)
    if client_id is None:
        out += _INT16.pack(-1)
    else:
        encoded = client_id.encode("utf-8")
        out += _INT16.pack(len(encoded)) + encoded
    if api.request.is_flexible(api_version):
        out.append(0)
    schema.encode_into(out, api.request, api_version, body)
    _SIZE.pack_into(out, 0, _size_of(out) - 4)
    return out


class ClientConnection(_ReceivesFrames):
    """A client's view: encodes requests, matches responses by correlation id."""

    def __init__(self, *, client_id: str | None = "onceflow", max_frame_size: int = DEFAULT_MAX_FRAME_SIZE):
        self.client_id = client_id
        self._frames = FrameBuffer(max_frame_size)
        self._in_flight: dict[int, tuple[int, int]] = {}
        self._next_correlation_id = 0

    def send_request(self, api_key: int, api_version: int, body: dict, *, expect_response: bool = True) -> tuple[int, bytes]:
        correlation_id = self._correlation_id_for(api_key, api_version, expect_response)
        return correlation_id, encode_request(api_key, api_version, correlation_id, self.client_id, body)

    def send_request_parts(self, api_key: int, api_version: int, body: dict, *, expect_response: bool = True) -> tuple[int, list]:
        """``send_request`` with the frame as buffers to write in order
        (``encode_request_parts``: large record sets are not copied)."""
        correlation_id = self._correlation_id_for(api_key, api_version, expect_response)
        return correlation_id, encode_request_parts(api_key, api_version, correlation_id, self.client_id, body)

    def _correlation_id_for(self, api_key: int, api_version: int, expect_response: bool) -> int:
        correlation_id = self._next_correlation_id
        self._next_correlation_id = (self._next_correlation_id + 1) & 0x7FFFFFFF
        if expect_response:
            self._in_flight[correlation_id] = (api_key, api_version)
        return correlation_id

    def next_response(self) -> DecodedResponse | None:
        frame = self._frames.next_frame()
        if frame is None:
            return None
        if len(frame) < 4:
            raise MalformedFrameError("response shorter than its header")
        (correlation_id,) = _CORRELATION.unpack_from(frame)
        expected = self._in_flight.pop(correlation_id, None)
        if expected is None:
            raise MalformedFrameError(f"response for unknown correlation id {correlation_id}")
        api_key, api_version = expected
        pos = 4
        if response_header_version(api_key, api_version) == 1:
            pos = _skip_tagged_fields(frame, pos)
        body, _ = schema.decode(APIS[api_key].response, api_version, frame, pos, exact=False)
        return DecodedResponse(api_key, api_version, correlation_id, body)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)
