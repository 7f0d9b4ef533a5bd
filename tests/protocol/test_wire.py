"""The wire layer: every version of every API round-trips, frames split
anywhere decode the same, and garbage only ever raises MalformedFrameError."""

from __future__ import annotations

import random
import struct
import uuid
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import allocator, schema
from protocol.errors import ErrorCode, FrameTooLargeError, MalformedFrameError, UnsupportedRequestError
from protocol.framing import ClientConnection, FrameBuffer, ServerConnection, encode_request, encode_request_parts, encode_response, encode_response_parts
from protocol.messages import APIS, ApiKey

PRIMITIVE_SAMPLES = {
    schema.BOOL: lambda r: r.random() < 0.5,
    schema.INT8: lambda r: r.randint(-128, 127),
    schema.INT16: lambda r: r.randint(-(2**15), 2**15 - 1),
    schema.UINT16: lambda r: r.randint(0, 2**16 - 1),
    schema.INT32: lambda r: r.randint(-(2**31), 2**31 - 1),
    schema.INT64: lambda r: r.randint(-(2**63), 2**63 - 1),
    schema.FLOAT64: lambda r: r.choice([0.0, 1.5, -2.25, 1e300]),
    schema.STRING: lambda r: r.choice(["", "a", "topic-1", "ünïcødé", "x" * 300]),
    schema.BYTES: lambda r: r.randbytes(r.randint(0, 40)),
    schema.RECORDS: lambda r: r.randbytes(r.randint(0, 80)),
    schema.UUID: lambda r: uuid.UUID(int=r.getrandbits(128)),
}


def sample(kind, version: int, rng: random.Random, nullable: bool = False, depth: int = 0):
    if nullable and rng.random() < 0.2:
        return None
    if isinstance(kind, schema.ArrayOf):
        return [sample(kind.element, version, rng, depth=depth + 1) for _ in range(rng.randint(0, 3 if depth < 2 else 1))]
    if isinstance(kind, schema.Struct):
        value = {}
        for field in kind.fields:
            if schema.in_range(version, field.versions) or (flexible_version(kind, version) and schema.in_range(version, field.tagged)):
                value[field.name] = sample(field.type, version, rng, schema.in_range(version, field.nullable), depth)
        return value
    return PRIMITIVE_SAMPLES[kind](rng)


_FLEXIBLE_CONTEXT = {"flexible": False}


def flexible_version(_kind, _version) -> bool:
    return _FLEXIBLE_CONTEXT["flexible"]


def normalize(value):
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, memoryview):
        return bytes(value)
    return value


CASES = [
    (api.name, side_name, version)
    for api in APIS.values()
    for side_name in ("request", "response")
    for version in range(getattr(api, side_name).valid[0], getattr(api, side_name).valid[1] + 1)
]


@pytest.mark.parametrize("api_name,side,version", CASES, ids=[f"{a}-{s}-v{v}" for a, s, v in CASES])
def test_every_version_round_trips(api_name, side, version):
    api = next(a for a in APIS.values() if a.name == api_name)
    message = getattr(api, side)
    rng = random.Random(f"{api_name}{side}{version}")
    _FLEXIBLE_CONTEXT["flexible"] = message.is_flexible(version)
    for _ in range(5):
        value = sample(message.body, version, rng)
        data = schema.encode(message, version, value)
        decoded, end = schema.decode(message, version, data)
        assert end == len(data)
        assert normalize(decoded) == normalize(value)
        assert schema.encode(message, version, decoded) == data


def test_sparse_values_take_defaults():
    api = APIS[ApiKey.METADATA]
    data = schema.encode(api.response, 1, {"brokers": [{"node_id": 1, "host": "h", "port": 9}]})
    decoded, _ = schema.decode(api.response, 1, data)
    assert decoded["controller_id"] == -1
    assert decoded["brokers"][0]["rack"] is None
    assert decoded["topics"] == []


def test_known_bytes_of_a_metadata_v1_request():
    # size, api_key 3, version 1, correlation 9, client id "probe", topics null
    frame = struct.pack(">ihhih5si", 19, 3, 1, 9, 5, b"probe", -1)
    connection = ServerConnection()
    connection.receive_data(frame)
    request = connection.next_request()
    assert (request.api_key, request.api_version, request.correlation_id, request.client_id) == (3, 1, 9, "probe")
    assert request.body["topics"] is None


def _sample_frames():
    rng = random.Random(7)
    frames = []
    for key in (0, 1, 3, 18, 22):
        api = APIS[key]
        for version in (api.request.valid[0], api.request.valid[1]):
            frames.append(encode_request(key, version, len(frames), "client", sample(api.request.body, version, rng)))
    return frames


def test_whole_and_byte_at_a_time_give_the_same_requests():
    frames = _sample_frames()
    stream = b"".join(frames)
    whole = ServerConnection()
    whole.receive_data(stream)
    requests_whole = []
    while (request := whole.next_request()) is not None:
        requests_whole.append(request)
    trickle = ServerConnection()
    requests_trickle = []
    for byte in stream:
        trickle.receive_data(bytes([byte]))
        while (request := trickle.next_request()) is not None:
            requests_trickle.append(request)
    assert len(requests_whole) == len(frames)
    assert [normalize(r.body) for r in requests_whole] == [normalize(r.body) for r in requests_trickle]


def test_oversized_and_negative_frames_rejected_before_buffering():
    connection = ServerConnection(max_frame_size=1000)
    connection.receive_data(struct.pack(">i", 1001))
    with pytest.raises(FrameTooLargeError):
        connection.next_request()
    connection = ServerConnection(max_frame_size=1000)
    connection.receive_data(struct.pack(">i", -1))
    with pytest.raises(FrameTooLargeError):
        connection.next_request()


def test_unsupported_version_is_reported_and_the_stream_continues():
    connection = ServerConnection(supported_versions={ApiKey.API_VERSIONS: (0, 3), ApiKey.METADATA: (0, 12)})
    connection.receive_data(encode_request(ApiKey.API_VERSIONS, 4, 1, "c", {}) + encode_request(ApiKey.API_VERSIONS, 3, 2, "c", {}))
    with pytest.raises(UnsupportedRequestError) as info:
        connection.next_request()
    assert (info.value.api_key, info.value.api_version, info.value.correlation_id) == (18, 4, 1)
    assert connection.next_request().correlation_id == 2


def test_client_matches_responses_by_correlation_id():
    client = ClientConnection(client_id="me")
    correlation_id, frame = client.send_request(ApiKey.API_VERSIONS, 3, {"client_software_name": "x", "client_software_version": "1"})
    server = ServerConnection()
    server.receive_data(frame)
    request = server.next_request()
    assert request.body["client_software_name"] == "x"
    body = {"error_code": 0, "api_keys": [{"api_key": 0, "min_version": 3, "max_version": 11}], "throttle_time_ms": 0}
    client.receive_data(server.encode_response(request, body))
    response = client.next_response()
    assert response.correlation_id == correlation_id
    assert response.body["api_keys"] == body["api_keys"]


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 90), min_size=1, max_size=6),
    chunks=st.lists(st.integers(1, 70), min_size=1, max_size=8),
    large_frame_bytes=st.integers(0, 100),
)
def test_frames_received_into_buffers_of_their_own_come_out_whole_and_in_order(sizes, chunks, large_frame_bytes):
    """Frames cut from a stream fed in chunks of any sizes are the frames
    sent, in order, whether a big one goes into a buffer of its own or not;
    what is buffered of a frame not yet whole is handed back as it came."""
    frames = [bytes([index]) * size for index, size in enumerate(sizes)]
    stream = b"".join(struct.pack(">i", len(frame)) + frame for frame in frames)
    buffer = FrameBuffer(1000, large_frame_bytes=large_frame_bytes)
    cut, position, step = [], 0, 0
    while position < len(stream):
        piece = stream[position : position + chunks[step % len(chunks)]]
        position += len(piece)
        step += 1
        buffer.feed(piece)
        while (frame := buffer.next_frame()) is not None:
            assert isinstance(frame, memoryview) and not frame.readonly  # the broker patches frames in place
            cut.append(bytes(frame))
        assert buffer.buffered == position - sum(4 + len(frame) for frame in cut)
        if position < len(stream) and step == 2:
            rest = buffer.take_buffered()
            assert rest == stream[sum(4 + len(frame) for frame in cut) : position]
            assert buffer.buffered == 0
            buffer.feed(rest)
    assert cut == frames


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 90), min_size=1, max_size=6),
    chunks=st.lists(st.integers(1, 70), min_size=1, max_size=8),
    large_frame_bytes=st.integers(0, 100),
    cut_every=st.integers(1, 4),
    in_place_max_bytes=st.none() | st.integers(0, 100),
)
def test_frames_received_in_place_come_out_whole_and_in_order(sizes, chunks, large_frame_bytes, cut_every, in_place_max_bytes):
    """Bytes written where ``receive_buffer`` says (as a BufferedProtocol's
    socket reads write them), at most as many as a read of each chunk's size
    takes, come out as the frames sent, in order, whether the frames are cut
    after every read or only now and then (a large frame complete and not
    yet cut, the next bytes go to the scratch buffer), and whether a large
    frame is received in place or, above ``in_place_max_bytes``, gathered."""
    frames = [bytes([index]) * size for index, size in enumerate(sizes)]
    stream = b"".join(struct.pack(">i", len(frame)) + frame for frame in frames)
    buffer = FrameBuffer(1000, large_frame_bytes=large_frame_bytes, in_place_max_bytes=in_place_max_bytes)
    cut, position, step = [], 0, 0
    while position < len(stream):
        target = buffer.receive_buffer()
        assert len(target) > 0
        size = min(len(target), chunks[step % len(chunks)], len(stream) - position)
        target[:size] = stream[position : position + size]
        position += size
        step += 1
        buffer.received(size)
        if step % cut_every == 0 or position == len(stream):
            while (frame := buffer.next_frame()) is not None:
                assert isinstance(frame, memoryview) and not frame.readonly
                cut.append(bytes(frame))
        assert buffer.buffered == position - sum(4 + len(frame) for frame in cut)
    assert cut == frames


def test_a_large_frame_is_received_in_place_and_what_follows_it_is_not_lost():
    """Once a large frame's size is known, the socket's bytes go straight
    into the frame handed out (no copy); bytes read after it is whole but
    before it is cut go to the scratch buffer, and the frames after it
    come out after it."""
    large = bytes(range(256)) * 400
    stream = struct.pack(">i", len(large)) + large + struct.pack(">i", 3) + b"abc" + struct.pack(">i", 1) + b"z"
    buffer = FrameBuffer(1 << 20, large_frame_bytes=1024)
    targets, position = [], 0
    while position < len(stream):
        target = buffer.receive_buffer()
        size = min(len(target), 1000, len(stream) - position)
        target[:size] = stream[position : position + size]
        targets.append(target.obj)
        position += size
        buffer.received(size)
        if position < len(large):
            assert buffer.next_frame() is None  # the read loop looks after each read, as the client's does
    first = buffer.next_frame()
    assert bytes(first) == large and any(first.obj is obj for obj in targets)
    assert bytes(buffer.next_frame()) == b"abc" and bytes(buffer.next_frame()) == b"z" and buffer.next_frame() is None


def test_a_size_prefix_above_the_in_place_limit_reserves_nothing_until_its_bytes_come():
    """A server's framing receives a frame in place only up to
    ``in_place_max_bytes``: a peer that announces 50 MiB and sends 10 bytes
    costs 10 bytes, not a 50 MiB buffer; the frame still arrives whole."""
    buffer = FrameBuffer(64 << 20, large_frame_bytes=1024, in_place_max_bytes=1 << 20)
    announced = 50 << 20
    head = struct.pack(">i", announced) + b"0123456789"
    target = buffer.receive_buffer()
    target[: len(head)] = head
    buffer.received(len(head))
    assert buffer.next_frame() is None
    assert buffer._into is None and len(buffer._large) == 10  # gathered as it comes, nothing reserved ahead
    assert len(buffer.receive_buffer()) < 1 << 20  # and the next read goes to the scratch buffer, not into a frame
    body = random.Random(3).randbytes(announced - 10)
    for start in range(0, len(body), 1 << 18):
        target = buffer.receive_buffer()
        piece = body[start : start + len(target)]
        target[: len(piece)] = piece
        buffer.received(len(piece))
    frame = buffer.next_frame()
    assert frame is not None and len(frame) == announced and bytes(frame[:10]) == b"0123456789" and bytes(frame[10:]) == body


POISON = 0xA5


def _poisoned_bytearray(size: int) -> bytearray:
    """Stands in for ``uninitialised_bytearray``: what the memory held
    before, made visible (a byte handed out before the socket wrote it
    shows as POISON)."""
    return bytearray([POISON]) * size


def _frames_without_poison(rng: random.Random, sizes: list[int]) -> list[bytes]:
    return [rng.randbytes(size).replace(bytes([POISON]), b"\x5a") for size in sizes]


@st.composite
def _streams_and_cuts(draw):
    """Frames of mixed sizes (most above the in-place bound) and the
    positions where the socket's reads end: any, plus, drawn apart, some
    frame boundaries exactly (a read that ends a frame, or its size prefix)."""
    sizes = draw(st.lists(st.integers(0, 300), min_size=1, max_size=6))
    frames = _frames_without_poison(random.Random(draw(st.integers(0, 1 << 16))), sizes)
    stream = b"".join(struct.pack(">i", len(frame)) + frame for frame in frames)
    boundaries, end = [], 0
    for frame in frames:
        boundaries += [end + 4, end + 4 + len(frame)]
        end += 4 + len(frame)
    anywhere = draw(st.sets(st.integers(1, len(stream) - 1), max_size=40)) if len(stream) > 1 else set()
    at_boundaries = draw(st.sets(st.sampled_from(boundaries)))
    return frames, stream, sorted(anywhere | at_boundaries | {len(stream)})


@settings(max_examples=300, deadline=None)
@given(case=_streams_and_cuts(), poisoned=st.booleans(), cut_every=st.integers(1, 3))
def test_a_frame_received_in_place_is_handed_out_only_once_every_byte_of_it_came(case, poisoned, cut_every):
    """Large frames are received in place into buffers that are not
    zero-filled (``allocator.uninitialised_bytearray``, or here a poisoned
    one that shows any byte the socket did not write): whatever the reads'
    sizes, every frame handed out is, at that moment, byte-equal to the
    frame sent."""
    frames, stream, read_ends = case
    allocate = _poisoned_bytearray if poisoned else allocator.uninitialised_bytearray
    with mock.patch("protocol.framing.uninitialised_bytearray", allocate):
        buffer = FrameBuffer(1000, large_frame_bytes=16)
        handed_out, position, step = [], 0, 0
        for read_end in read_ends:
            while position < read_end:  # one read may take several of the socket's pieces' worth when the target is short
                target = buffer.receive_buffer()
                size = min(len(target), read_end - position)
                target[:size] = stream[position : position + size]
                position += size
                buffer.received(size)
                step += 1
                if step % cut_every == 0 or position == len(stream):
                    while (frame := buffer.next_frame()) is not None:
                        assert bytes(frame) == frames[len(handed_out)], f"frame {len(handed_out)} handed out before all of it came"
                        handed_out.append(bytes(frame))
    assert handed_out == frames


@settings(max_examples=200, deadline=None)
@given(case=_streams_and_cuts(), cut_at=st.floats(0, 1, exclude_max=True), poisoned=st.booleans())
def test_a_connection_cut_in_the_middle_of_a_frame_hands_that_frame_out_never(case, cut_at, poisoned):
    """The peer stops (closes, or the connection breaks) anywhere: the
    frames handed out are exactly those whole before the cut, and what is
    left (``take_buffered``, as the fault proxy and a closing broker take
    it) is the bytes that came and nothing the socket did not write."""
    frames, stream, read_ends = case
    cut = int(cut_at * len(stream))
    allocate = _poisoned_bytearray if poisoned else allocator.uninitialised_bytearray
    with mock.patch("protocol.framing.uninitialised_bytearray", allocate):
        buffer = FrameBuffer(1000, large_frame_bytes=16)
        position = 0
        for read_end in [end for end in read_ends if end < cut] + [cut]:
            while position < read_end:
                target = buffer.receive_buffer()
                size = min(len(target), read_end - position)
                target[:size] = stream[position : position + size]
                position += size
                buffer.received(size)
        handed_out = []
        while (frame := buffer.next_frame()) is not None:
            handed_out.append(bytes(frame))
    whole, end = [], 0
    for frame in frames:
        if end + 4 + len(frame) > cut:
            break
        whole.append(frame)
        end += 4 + len(frame)
    assert handed_out == whole
    assert buffer.buffered == cut - end
    assert buffer.take_buffered() == stream[end:cut]


def test_a_client_receives_a_fetch_answer_of_many_mib_whole():
    server = ServerConnection()
    client = ClientConnection()
    correlation_id, request = client.send_request(ApiKey.FETCH, 12, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 30, "isolation_level": 1, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 30, "log_start_offset": -1, "current_leader_epoch": -1}]}],
    })
    server.receive_data(request)
    records = random.Random(7).randbytes(3 * (1 << 20) + 5)
    answer = {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [{"topic": "t", "partitions": [{
        "partition_index": 0, "error_code": 0, "high_watermark": 9, "last_stable_offset": 9, "log_start_offset": 0,
        "aborted_transactions": [], "preferred_read_replica": -1, "records": records}]}]}
    stream = bytes(server.encode_response(server.next_request(), answer))
    responses = []
    for start in range(0, len(stream), 65_531):
        client.receive_data(stream[start : start + 65_531])
        while (response := client.next_response()) is not None:
            responses.append(response)
    assert len(responses) == 1
    assert responses[0].correlation_id == correlation_id
    assert bytes(responses[0].body["responses"][0]["partitions"][0]["records"]) == records


@pytest.mark.parametrize("sizes", [[0], [schema.SPILL_BYTES - 1], [schema.SPILL_BYTES], [3 << 20, 17, schema.SPILL_BYTES + 1, 0]])
def test_frames_in_parts_are_the_frames_with_their_large_records_left_where_they_are(sizes):
    """A Fetch answer's and a Produce request's record sets of at least
    SPILL_BYTES are parts of their own (the very objects: not copied), and
    the parts joined are byte for byte the frame encoded whole."""
    rng = random.Random(len(sizes))
    sets = [rng.randbytes(size) for size in sizes]
    answer = {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [{"topic": "t", "partitions": [{
        "partition_index": index, "error_code": 0, "high_watermark": 9, "last_stable_offset": 9, "log_start_offset": 0,
        "aborted_transactions": [{"producer_id": 4, "first_offset": 2}], "preferred_read_replica": -1, "records": records}
        for index, records in enumerate(sets)]}]}
    produce = {"transactional_id": "tx", "acks": -1, "timeout_ms": 1000, "topic_data": [{"name": "t", "partition_data": [
        {"index": index, "records": records} for index, records in enumerate(sets)]}]}
    for whole, parts in (
        (encode_response(ApiKey.FETCH, 12, 5, answer), encode_response_parts(ApiKey.FETCH, 12, 5, answer)),
        (encode_response(ApiKey.FETCH, 4, 5, answer), encode_response_parts(ApiKey.FETCH, 4, 5, answer)),
        (encode_request(ApiKey.PRODUCE, 9, 6, "c", produce), encode_request_parts(ApiKey.PRODUCE, 9, 6, "c", produce)),
        (encode_request(ApiKey.PRODUCE, 3, 6, None, produce), encode_request_parts(ApiKey.PRODUCE, 3, 6, None, produce)),
    ):
        assert b"".join(bytes(part) for part in parts) == bytes(whole)
        large = [records for records in sets if len(records) >= schema.SPILL_BYTES]
        assert [part for part in parts if any(part is records for records in large)] == large
        assert len(parts) == 1 if not large else len(large) < len(parts) <= 2 * len(large) + 1


def test_error_codes_have_kafka_numbers():
    assert ErrorCode.CONCURRENT_TRANSACTIONS == 51 and ErrorCode.CONCURRENT_TRANSACTIONS.is_retriable
    assert ErrorCode.PRODUCER_FENCED == 90 and not ErrorCode.PRODUCER_FENCED.is_retriable
    assert ErrorCode.UNSTABLE_OFFSET_COMMIT == 88


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_random_frames_only_raise_protocol_errors(body):
    connection = ServerConnection(max_frame_size=10_000)
    connection.receive_data(struct.pack(">i", len(body)) + body)
    try:
        connection.next_request()
    except (MalformedFrameError, UnsupportedRequestError):
        pass


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 255), st.sampled_from(range(len(_sample_frames()))))
def test_mutated_real_frames_only_raise_protocol_errors(position, value, which):
    frame = bytearray(_sample_frames()[which])
    position = 4 + position % max(1, len(frame) - 4)
    frame[position] = value
    connection = ServerConnection()
    connection.receive_data(bytes(frame))
    try:
        connection.next_request()
    except (MalformedFrameError, UnsupportedRequestError):
        pass


def test_truncated_bodies_are_malformed():
    frame = _sample_frames()[0]
    for cut in range(12, len(frame) - 1):
        body = frame[4:cut]
        connection = ServerConnection()
        connection.receive_data(struct.pack(">i", len(body)) + body)
        with pytest.raises(MalformedFrameError):
            connection.next_request()


def test_produce_batches_are_appended_from_the_request_frame_without_a_copy(tmp_path):
    """The frame is writable, so the log patches offsets into the request's own
    bytes and writes them: the batch is copied once (out of the socket buffer)."""
    from protocol.records import Record, encode_batch
    from storage.log import PartitionLog

    batch = encode_batch([Record(offset=0, timestamp=1_700_000_000_000, key=None, value=b"v" * 100)])
    request = encode_request(ApiKey.PRODUCE, 9, 7, "test", {
        "acks": -1, "timeout_ms": 1000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": batch}]}],
    })
    connection = ServerConnection()
    connection.receive_data(request)
    decoded = connection.next_request()
    records = decoded.body["topic_data"][0]["partition_data"][0]["records"]
    assert isinstance(records, memoryview) and not records.readonly
    log = PartitionLog.open(str(tmp_path))
    log.append(encode_batch([Record(offset=0, timestamp=1_700_000_000_000, key=None, value=b"first")]))
    info = log.append(records)
    assert info.first_offset == 1
    assert struct.unpack_from(">q", records, 0)[0] == 1, "the request's own bytes carry the assigned offset"
    log.close()


def _large_produce_request(correlation_id: int, value_bytes: int) -> bytes:
    from protocol.records import Record, encode_batch

    batch = encode_batch([Record(offset=0, timestamp=1_700_000_000_000, key=None, value=bytes([correlation_id % 256]) * value_bytes)])
    return encode_request(ApiKey.PRODUCE, 9, correlation_id, "test", {
        "acks": -1, "timeout_ms": 1000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": batch}]}],
    })


@pytest.mark.parametrize("piece", [1, 3, 4096, 65_536, 100_000, 262_144])
def test_large_frames_in_pieces_give_the_requests_whole_frames_give(piece):
    """Frames above LARGE_FRAME_BYTES are gathered apart from the shared
    buffer: cut anywhere (inside a size prefix, across two frames), small and
    large ones mixed, they decode as when they arrive whole, writable."""
    from protocol.framing import LARGE_FRAME_BYTES

    frames = [_large_produce_request(0, 10), _large_produce_request(1, 3 * LARGE_FRAME_BYTES), _large_produce_request(2, LARGE_FRAME_BYTES),
              _large_produce_request(3, 100), _large_produce_request(4, 300_000)]
    stream = b"".join(frames)
    pieces = ServerConnection()
    decoded = []
    for start in range(0, len(stream), piece):
        pieces.receive_data(stream[start : start + piece])
        while (request := pieces.next_request()) is not None:
            decoded.append(request)
    assert pieces.buffered_bytes == 0
    assert [r.correlation_id for r in decoded] == [0, 1, 2, 3, 4]
    for request, frame in zip(decoded, frames):
        whole = ServerConnection()
        whole.receive_data(frame)
        records = request.body["topic_data"][0]["partition_data"][0]["records"]
        assert bytes(records) == bytes(whole.next_request().body["topic_data"][0]["partition_data"][0]["records"])
        assert isinstance(records, memoryview) and not records.readonly


def test_a_large_frame_in_pieces_is_copied_once():
    """A 4 MiB Produce arriving in 256 KiB reads (the server's) is copied into a buffer of its
    own size once: the broker's memory for it stays near one frame (a shared
    buffer grown read by read, then sliced, held about two)."""
    import tracemalloc

    frame = _large_produce_request(0, 4 << 20)
    connection = ServerConnection()
    tracemalloc.start()
    try:
        for start in range(0, len(frame), 256 << 10):
            connection.receive_data(frame[start : start + (256 << 10)])
            request = connection.next_request()  # as the server asks after each read
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert request is not None and request.correlation_id == 0
    assert peak < 1.3 * len(frame), f"peak {peak} bytes for a frame of {len(frame)}"


def test_what_is_buffered_of_a_large_frame_is_handed_back_whole():
    """``take_buffered`` (the fault proxy passes bytes on raw) gives back every
    byte of a large frame not yet whole, its size prefix included."""
    from protocol.framing import FrameBuffer

    frame = _large_produce_request(5, 200_000)
    frames = FrameBuffer(1 << 30)
    frames.feed(frame[:100_000])
    assert frames.next_frame() is None
    frames.feed(frame[100_000:150_000])
    assert frames.buffered == 150_000
    assert frames.take_buffered() == frame[:150_000]
    assert frames.buffered == 0 and frames.next_frame() is None


@pytest.mark.parametrize("api_name,side,version", CASES, ids=[f"{a}-{s}-v{v}" for a, s, v in CASES])
def test_every_cut_of_every_message_is_malformed_and_names_where(api_name, side, version):
    """Fixed-size fields and arrays of them are read straight by their
    ``struct.Struct``: a body cut anywhere still raises only
    ``MalformedFrameError``, naming the message and, inside a struct, the
    field where the bytes ran out."""
    api = next(a for a in APIS.values() if a.name == api_name)
    message = getattr(api, side)
    rng = random.Random(f"cut{api_name}{side}{version}")
    _FLEXIBLE_CONTEXT["flexible"] = message.is_flexible(version)
    data = schema.encode(message, version, sample(message.body, version, rng))
    for cut in range(len(data)):
        with pytest.raises(MalformedFrameError) as raised:
            schema.decode(message, version, data[:cut])
        assert str(raised.value).startswith(f"{message.name} v{version}: ")
        if cut == 0 and any(schema.in_range(version, field.versions) and not schema.in_range(version, field.tagged) for field in message.body.fields):
            assert "." in str(raised.value).split(": ", 1)[1]  # "<Struct>.<field>: ..."
