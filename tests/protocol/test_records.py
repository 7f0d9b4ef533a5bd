"""RecordBatch v2 codec: round trips, byte compatibility, and damage reporting."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import records as rec
from protocol.compression import Compression, UnsupportedCompressionError
from protocol.records import (
    BATCH_HEADER_SIZE,
    ControlType,
    CorruptRecordError,
    Header,
    Record,
    decode_batch,
    decode_control_record,
    encode_batch,
    encode_control_batch,
    encode_one_record_batch,
    iter_batches,
    read_batch_header,
    set_base_offset,
    split_partial_tail,
)

int64 = st.integers(-(2**63), 2**63 - 1)
timestamps = st.integers(0, 2**41)
nullable_bytes = st.none() | st.binary(max_size=64)
headers = st.lists(st.tuples(st.text(max_size=10), nullable_bytes), max_size=3)
records_strategy = st.lists(st.tuples(nullable_bytes, nullable_bytes, headers, timestamps), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(
    records=records_strategy,
    base_offset=st.integers(0, 2**62),
    producer_id=st.integers(-1, 2**62),
    producer_epoch=st.integers(-1, 2**15 - 1),
    base_sequence=st.integers(-1, 2**31 - 1),
    is_transactional=st.booleans(),
    compression=st.sampled_from(list(Compression)),
    timestamp_type=st.sampled_from(list(rec.TimestampType)),
    leader_epoch=st.integers(-1, 2**31 - 1),
)
def test_every_field_round_trips(
    records, base_offset, producer_id, producer_epoch, base_sequence, is_transactional, compression, timestamp_type, leader_epoch
):
    data = encode_batch(
        records,
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        is_transactional=is_transactional,
        compression=compression,
        timestamp_type=timestamp_type,
        partition_leader_epoch=leader_epoch,
    )
    batch = decode_batch(data)
    header = batch.header
    assert header.size == len(data)
    assert header.base_offset == base_offset
    assert header.partition_leader_epoch == leader_epoch
    assert header.producer_id == producer_id
    assert header.producer_epoch == producer_epoch
    assert header.base_sequence == base_sequence
    assert header.is_transactional == is_transactional
    assert not header.is_control
    assert header.compression == compression
    assert header.timestamp_type == timestamp_type
    assert header.record_count == len(records)
    assert header.last_offset == base_offset + len(records) - 1
    assert header.max_timestamp == max(r[3] for r in records)
    for index, (record, (key, value, hdrs, timestamp)) in enumerate(zip(batch.records, records)):
        assert record.offset == base_offset + index
        assert (record.key, record.value, record.timestamp) == (key, value, timestamp)
        assert record.headers == tuple(Header(k, v) for k, v in hdrs)


def test_delete_horizon_attribute_round_trips():
    data = encode_batch([(b"k", None, (), 5_000)], delete_horizon_ms=9_000)
    batch = decode_batch(data)
    assert batch.header.has_delete_horizon
    assert batch.header.delete_horizon_ms == 9_000
    assert batch.records[0].timestamp == 5_000


def test_records_keep_absolute_offsets_with_gaps():
    kept = [Record(offset=103, timestamp=1, key=b"a", value=b"1"), Record(offset=107, timestamp=2, key=b"b", value=b"2")]
    batch = decode_batch(encode_batch(kept, base_offset=100))
    assert [r.offset for r in batch.records] == [103, 107]
    assert batch.header.last_offset == 107


@pytest.mark.parametrize("kind", list(ControlType))
def test_control_records(kind):
    data = encode_control_batch(kind, producer_id=42, producer_epoch=3, coordinator_epoch=7, timestamp=123)
    batch = decode_batch(data)
    assert batch.header.is_control and batch.header.is_transactional
    assert (batch.header.producer_id, batch.header.producer_epoch) == (42, 3)
    marker = decode_control_record(batch.records[0])
    assert (marker.type, marker.coordinator_epoch, marker.version) == (kind, 7, 0)


@settings(max_examples=200, deadline=None)
@given(key=st.none() | st.binary(max_size=200), value=st.none() | st.binary(max_size=200), timestamp=int64)
def test_one_record_batch_is_byte_equal_to_the_general_encoder(key, value, timestamp):
    assert encode_one_record_batch(key, value, timestamp) == encode_batch([(key, value, (), timestamp)])


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(list(ControlType)), producer_id=int64, producer_epoch=st.integers(-(2**15), 2**15 - 1),
       coordinator_epoch=st.integers(-(2**31), 2**31 - 1), timestamp=int64, base_offset=int64, leader_epoch=st.integers(-(2**31), 2**31 - 1))
def test_control_batch_is_what_the_general_encoder_writes(kind, producer_id, producer_epoch, coordinator_epoch, timestamp, base_offset, leader_epoch):
    general = encode_batch([(struct.pack(">hh", 0, kind), struct.pack(">hi", 0, coordinator_epoch), (), timestamp)], base_offset=base_offset,
                           producer_id=producer_id, producer_epoch=producer_epoch, is_transactional=True, is_control=True,
                           partition_leader_epoch=leader_epoch)
    assert encode_control_batch(kind, producer_id=producer_id, producer_epoch=producer_epoch, coordinator_epoch=coordinator_epoch,
                                timestamp=timestamp, base_offset=base_offset, partition_leader_epoch=leader_epoch) == general


def test_offset_patch_keeps_crc_valid():
    data = bytearray(encode_batch([(b"k", b"v", (), 1)] * 3))
    set_base_offset(data, 0, 1_000_000, partition_leader_epoch=9)
    header = read_batch_header(data)
    assert (header.base_offset, header.partition_leader_epoch, header.last_offset) == (1_000_000, 9, 1_000_002)
    assert [r.offset for r in decode_batch(data).records] == [1_000_000, 1_000_001, 1_000_002]


def test_byte_identical_to_kafka_python_builder():
    """The real kafka-python client's batch builder and ours produce the same bytes."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=1, producer_id=99, producer_epoch=2, base_sequence=10, batch_size=1 << 20
    )
    rows = [(b"key-%d" % i, b"value-%d" % i, [("h", b"x")], 1_700_000_000_000 + i) for i in range(5)]
    for offset, (key, value, hdrs, ts) in enumerate(rows):
        builder.append(offset, timestamp=ts, key=key, value=value, headers=hdrs)
    theirs = bytes(builder.build())
    # kafka-python writes partition leader epoch 0 where the Java client writes -1.
    ours = encode_batch(
        rows, producer_id=99, producer_epoch=2, base_sequence=10, is_transactional=True, partition_leader_epoch=0
    )
    assert theirs == ours
    assert decode_batch(theirs) == decode_batch(ours)


@pytest.mark.parametrize("codec", list(Compression)[1:], ids=lambda c: c.name.lower())
def test_decodes_compressed_batches_of_aiokafka(codec):
    """aiokafka's batch builder (a real client's encoder) compresses; we decode."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, int(codec), 0, -1, -1, -1, 1 << 20)
    for offset in range(20):
        builder.append(offset, timestamp=1000 + offset, key=b"k%d" % offset, value=b"payload " * 20, headers=[])
    batch = decode_batch(bytes(builder.build()))
    assert batch.header.compression == codec
    assert [r.key for r in batch.records] == [b"k%d" % i for i in range(20)]
    assert all(r.value == b"payload " * 20 for r in batch.records)


def test_missing_codec_library_names_the_codec(monkeypatch):
    from protocol import compression

    monkeypatch.setattr(compression, "_cramjam", None)
    with pytest.raises(UnsupportedCompressionError, match="zstd.*cramjam"):
        encode_batch([(b"k", b"v", (), 1)], compression=Compression.ZSTD)


def _sample() -> bytes:
    return encode_batch([(b"key-%d" % i, b"value" * i, [("h", b"v")], 1000 + i) for i in range(4)], base_offset=50)


def test_crc_mismatch_says_where_and_what():
    data = bytearray(_sample())
    data[-3] ^= 0xFF
    with pytest.raises(CorruptRecordError) as info:
        read_batch_header(data)
    error = info.value
    assert error.offset == 50 and error.position == 0
    assert error.expected_crc is not None and error.expected_crc != error.actual_crc
    assert "crc" in str(error)


def test_every_truncation_is_a_clear_error():
    data = _sample()
    for cut in range(len(data)):
        with pytest.raises(CorruptRecordError, match="truncated|below the minimum"):
            read_batch_header(data[:cut])


@settings(max_examples=300, deadline=None)
@given(position=st.integers(0, 200), value=st.integers(0, 255))
def test_flipped_bytes_never_escape_as_other_errors(position, value):
    data = bytearray(_sample())
    position %= len(data)
    data[position] = value
    try:
        decode_batch(data, verify_crc=False)
        decode_batch(data)
    except CorruptRecordError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_are_corrupt_not_a_crash(data):
    try:
        list(iter_batches(data))
        decode_batch(data, verify_crc=False)
    except CorruptRecordError:
        pass


def test_iter_batches_stops_at_damage_after_good_batches():
    good = _sample() + _sample()
    torn = good + _sample()[:-1]
    seen = []
    with pytest.raises(CorruptRecordError, match="truncated") as info:
        for position, header in iter_batches(torn):
            seen.append(position)
    assert seen == [0, len(_sample())]
    assert info.value.position == len(good)


def test_split_partial_tail_at_every_cut_of_a_fetched_section():
    """A fetched section cut at any byte (as Apache Kafka's log slicing may
    cut it): the whole batches before the cut count, the rest is the partial
    batch, with its base offset once 8 bytes of it arrived and its size once
    its length field did."""
    batches = [encode_batch([(b"k", b"v" * size, (), 1000)], base_offset=10 * number) for number, size in enumerate((5, 300, 40))]
    data = b"".join(batches)
    starts = [0, len(batches[0]), len(batches[0]) + len(batches[1])]
    for cut in range(len(data) + 1):
        whole_end, partial = split_partial_tail(data[:cut])
        inside = max(start for start in starts if start <= cut) if cut < len(data) else len(data)
        assert whole_end == inside
        if cut in starts or cut == len(data):
            assert partial is None
            continue
        number = starts.index(inside)
        assert (partial.position, partial.available) == (inside, cut - inside)
        assert partial.base_offset == (10 * number if cut - inside >= 8 else None)
        assert partial.size == (len(batches[number]) if cut - inside >= 12 else None)
        # Damage and cuts stay apart: where the log sees a cut, it is damage.
        with pytest.raises(CorruptRecordError, match="truncated"):
            list(iter_batches(data[:cut]))


def test_split_partial_tail_reports_a_length_below_the_minimum_as_damage():
    data = bytearray(_sample() + _sample())
    struct.pack_into(">i", data, len(_sample()) + 8, 10)
    with pytest.raises(CorruptRecordError, match="below the minimum") as info:
        split_partial_tail(data)
    assert info.value.position == len(_sample())


def test_wrong_magic_is_reported():
    data = bytearray(_sample())
    data[16] = 1
    with pytest.raises(CorruptRecordError, match="magic 1"):
        read_batch_header(data, verify_crc=False)


def test_header_size_matches_kafka():
    assert BATCH_HEADER_SIZE == 61
    assert rec.LOG_OVERHEAD == 12
    assert struct.calcsize(">qiibIh") == rec.ATTRIBUTES_OFFSET + 2


def test_hardware_and_table_crc32c_agree():
    """The codec takes the crc32c package's CPU instruction when installed,
    crcmod otherwise: both must give Kafka's CRC-32C."""
    import os

    import crc32c as hardware
    import crcmod.predefined

    from protocol import records

    table = crcmod.predefined.mkCrcFun("crc-32c")
    assert table(b"123456789") == hardware.crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C
    for size in (0, 1, 7, 64, 1000, 65537):
        data = os.urandom(size)
        assert table(data) == hardware.crc32c(data) == records.crc32c(data)
    assert records.HARDWARE_CRC
