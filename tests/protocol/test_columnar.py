"""The columnar codec against the per-record one: every field, every codec,
control batches, aborted transactions, partial tails and damaged bytes.

The reference for decoding is what the consumer does today: the fetcher's
``fetched_partition`` over ``protocol/records.py``; the reference for
encoding is ``records.encode_batch``, byte for byte."""

import random
import struct

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from protocol import columnar, records
from protocol.columnar import HEADERS_TYPE, decode_fetched, encode_columns
from protocol.compression import Compression
from protocol.records import ControlType, CorruptRecordError, TimestampType, encode_batch, encode_control_batch, iter_batches
from txn.config import ConsumerConfig
from txn.errors import RecordBatchTooLargeError
from txn.fetcher import fetched_partition
from txn.types import TopicPartition

TP = TopicPartition("t", 0)
CODECS = list(Compression)

# 0..2**63-1: deltas between any two fit a varlong, up to its 10 bytes
timestamps = st.integers(0, 2**40) | st.sampled_from([0, 1, 2**31, 2**62, 2**63 - 1])
payloads = st.none() | st.binary(max_size=40) | st.sampled_from([b"", b"x" * 63, b"y" * 64, b"z" * 200, b"w" * 8192, b"v" * 70_000])
header_lists = st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=12)), max_size=3)
record_tuples = st.lists(st.tuples(payloads, payloads, st.just([]) | header_lists, timestamps), min_size=1, max_size=6)


@st.composite
def uniform_records(draw):
    """Batches whose records all take the same bytes (the decoder's fast
    path), or all but two, one a byte shorter and one a byte longer: the
    batch's length is the same, the fast path must not be taken."""
    count = draw(st.integers(16, 60))
    size = draw(st.integers(1, 300))
    key = draw(st.none() | st.just(b"k" * 4))
    timestamp = draw(st.integers(0, 2**40))
    sizes = [size] * count
    if draw(st.booleans()):
        shorter, longer = draw(st.lists(st.integers(1, count - 1), min_size=2, max_size=2, unique=True))
        sizes[shorter] -= 1
        sizes[longer] += 1
    return [(key, bytes([i % 256]) * sizes[i], [], timestamp) for i in range(count)]


@st.composite
def run_records(draw):
    """Batches of runs of equal-size records (what the decoder finds with
    numpy), runs of 1 to 300 records, sizes around where a record's length
    varint grows a byte: a size change anywhere, runs longer than the
    decoder's windows and its loop's stretch."""
    runs = draw(st.lists(st.tuples(st.integers(1, 300), st.integers(50, 70)), min_size=1, max_size=5))
    timestamp = draw(st.integers(0, 2**40))
    sizes = [size for length, size in runs for _ in range(length)]
    return [(None, bytes([i % 256]) * size, [], timestamp) for i, size in enumerate(sizes)]


same_size_runs = uniform_records() | run_records()


def rows_of(record_list):
    """(key, value, headers, timestamp) tuples as rows of FETCHED_SCHEMA, offsets from 0."""
    return [
        {"key": k, "value": v, "offset": i, "timestamp": t, "timestamp_type": 0, "headers": [{"key": hk, "value": hv} for hk, hv in h]}
        for i, (k, v, h, t) in enumerate(record_list)
    ]


def columns_of(record_list):
    return {
        "key": pa.array([r[0] for r in record_list], pa.binary()),
        "value": pa.array([r[1] for r in record_list], pa.binary()),
        "headers": pa.array([[{"key": k, "value": v} for k, v in r[2]] for r in record_list], HEADERS_TYPE),
        "timestamp": pa.array([r[3] for r in record_list], pa.int64()),
    }


# ---------------------------------------------------------------------------
# encoding


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    record_list=record_tuples | same_size_runs,
    base_offset=st.integers(0, 2**62),
    producer_id=st.integers(-1, 2**62),
    producer_epoch=st.integers(-1, 2**15 - 1),
    base_sequence=st.integers(-1, 2**31 - 1),
    is_transactional=st.booleans(),
    compression=st.sampled_from(CODECS),
    timestamp_type=st.sampled_from(list(TimestampType)),
    leader_epoch=st.integers(-1, 2**31 - 1),
)
def test_encoding_columns_gives_the_bytes_of_the_record_codec(
    record_list, base_offset, producer_id, producer_epoch, base_sequence, is_transactional, compression, timestamp_type, leader_epoch
):
    options = dict(
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        is_transactional=is_transactional,
        compression=compression,
        timestamp_type=timestamp_type,
        partition_leader_epoch=leader_epoch,
    )
    assert encode_columns(**columns_of(record_list), **options) == encode_batch(record_list, **options)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record_list=record_tuples | same_size_runs, compression=st.sampled_from(CODECS))
def test_decoding_what_was_encoded_gives_the_columns_back(record_list, compression):
    columns = columns_of(record_list)
    fetched = decode_fetched(encode_columns(**columns, compression=compression))
    decoded = fetched.columns
    assert decoded.schema == columnar.FETCHED_SCHEMA
    for name, column in columns.items():
        assert decoded.column(name).equals(column), name
    assert decoded.column("offset").to_pylist() == list(range(len(record_list)))
    assert fetched.end == len(record_list) and fetched.partial is None
    # and the decoded columns encode to the same bytes again
    again = encode_columns(**{name: decoded.column(name) for name in columns}, compression=compression)
    assert again == encode_columns(**columns, compression=compression)


def test_encoding_takes_string_keys_chunked_columns_and_no_keys_or_headers():
    as_records = [(None, b"a", [], 5), (None, None, [], 7)]
    assert encode_columns(value=[b"a", None], timestamp=[5, 7]) == encode_batch(as_records)
    chunked = pa.chunked_array([pa.array(["k1"]), pa.array(["k2"])])
    assert encode_columns(key=chunked, value=pa.array(["x", "y"]), timestamp=pa.array([1, 2])) == encode_batch(
        [(b"k1", b"x", [], 1), (b"k2", b"y", [], 2)]
    )
    stamps = pa.array([1_700_000_000_123], pa.timestamp("ms"))
    assert encode_columns(value=[b"v"], timestamp=stamps) == encode_batch([(None, b"v", [], 1_700_000_000_123)])


def test_records_of_one_size_laid_out_run_by_run_give_the_bytes_of_the_record_codec(monkeypatch):
    """The encoder's run-by-run layout (records of one size: rows of a byte
    matrix) against the record codec where its runs change: the offset
    delta's varint growing at 64 and 8192 records, timestamps equal or
    rising, keys all null or of one size, values of one size; from slices
    of longer columns (Arrow offsets that do not start at 0), after a
    bigger batch (the offset deltas built once and sliced); and a value
    column whose null slots hold bytes, which the general path takes."""
    laid_out = []
    by_runs = columnar._section_by_runs
    monkeypatch.setattr(columnar, "_section_by_runs", lambda *arguments: laid_out.append(by_runs(*arguments)) or laid_out[-1])
    count = 9000
    values = [b"%05d" % i + b"v" * 95 for i in range(count + 10)]
    keys = [b"key-%04d" % (i % 10_000) for i in range(count + 10)]
    for stamps in ([1_700_000_000_000] * (count + 10), [1_700_000_000_000 + i // 7 for i in range(count + 10)]):
        for key_column in (None, pa.array(keys)):
            for first, size in ((0, count), (10, 100), (3, 1), (5, 64), (1, 65)):
                rows = slice(first, first + size)
                expected = encode_batch([(None if key_column is None else keys[i], values[i], [], stamps[i]) for i in range(first, first + size)])
                given = dict(key=None if key_column is None else key_column[rows], value=pa.array(values)[rows], timestamp=pa.array(stamps)[rows])
                assert encode_columns(**given) == expected, (first, size)
                assert laid_out.pop() is not None, "laid out run by run"
    # framed again in place (a retry, an epoch bump): each framing is the record codec's batch
    batch = [(None, values[i], [], 1_700_000_000_000) for i in range(100)]
    encoded = columnar.encode_records(value=pa.array(values[:100]), timestamp=[1_700_000_000_000] * 100)
    assert laid_out.pop() is not None
    for producer_epoch, base_sequence in ((0, 0), (1, 100), (0, 0)):
        framing = dict(producer_id=7, producer_epoch=producer_epoch, base_sequence=base_sequence, is_transactional=True)
        assert bytes(columnar.frame_records(encoded, **framing)) == encode_batch(batch, **framing)
    # a null whose slot holds bytes (Arrow's offsets give the middle value 3 bytes)
    offsets = pa.array([0, 3, 6, 9], pa.int32())
    holding = pa.Array.from_buffers(pa.binary(), 3, [pa.array([True, False, True]).buffers()[1], offsets.buffers()[1], pa.py_buffer(b"abcXYZghi")], null_count=1)
    assert encode_columns(value=holding, timestamp=[1, 1, 1]) == encode_batch([(None, b"abc", [], 1), (None, None, [], 1), (None, b"ghi", [], 1)])
    assert laid_out.pop() is None, "left to the general path"

@st.composite
def run_layouts(draw):
    """Records the encoder lays out run by run, in every layout its rows
    take: keys null, empty or of one size, values null (tombstones), empty
    or of one size, timestamps all equal or rising by a step whose delta's
    varint grows a byte inside the batch, and counts on both sides of 64
    (where the offset delta's varint grows to 2 bytes)."""
    count = draw(st.integers(1, 300) | st.sampled_from([63, 64, 65, 128, 129]))
    key = draw(st.none() | st.just(b"") | st.binary(min_size=1, max_size=9))
    value_size = draw(st.none() | st.integers(0, 130))
    first_timestamp = draw(st.integers(0, 2**40))
    step = draw(st.sampled_from([0, 0, 1, 3, 200]))
    rng = random.Random(draw(st.integers(0, 2**16)))
    return [
        (key, None if value_size is None else rng.randbytes(value_size), [], first_timestamp + step * (i // 2))
        for i in range(count)
    ]


@settings(max_examples=300, deadline=None)
@given(record_list=run_layouts(), sliced=st.booleans())
def test_every_layout_of_records_laid_out_run_by_run_gives_the_bytes_of_the_record_codec(record_list, sliced):
    """Each field of a row (offset delta, timestamp delta, key, value) is
    copied as one value per row and the template's bytes between them as
    constants, the header count and the next record's first bytes as one:
    byte for byte the record codec's batch, from columns whose Arrow offsets
    start at 0 or not."""
    columns = columns_of(record_list)
    del columns["headers"]
    if sliced:  # the same records at the end of longer columns
        padding = columns_of([(b"pad", b"padding", [], 0)] * 3)
        columns = {name: pa.concat_arrays([padding[name], column])[3:] for name, column in columns.items()}
    if all(k is None for k, _, _, _ in record_list):
        columns["key"] = None
    laid_out = []
    by_runs = columnar._section_by_runs
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(columnar, "_section_by_runs", lambda *arguments: laid_out.append(by_runs(*arguments)) or laid_out[-1])
        assert encode_columns(**columns) == encode_batch(record_list)
    assert laid_out and laid_out[0] is not None, "laid out run by run"


@pytest.mark.parametrize("most_bytes", [4 << 20, 300, 0])
def test_stretches_kept_from_batch_to_batch_give_the_record_codec_bytes_every_time(monkeypatch, most_bytes):
    """The template's bytes around a run's offset deltas, kept with them
    between calls (``_KEPT_STRETCHES``), whatever came before: layouts
    alternating (value sizes, keys or none, timestamps equal or rising, so
    the offset deltas lie around a row boundary or between two copies),
    runs of different records, the values changing from call to call, and
    a bound on what is kept that keeps everything, one stretch at most, or
    nothing."""
    monkeypatch.setattr(columnar, "_KEPT_STRETCHES_MOST_BYTES", most_bytes)
    monkeypatch.setattr(columnar, "_KEPT_STRETCHES", {})
    layouts = [(count, size, keyed, rising) for count in (70, 300) for size in (100, 101) for keyed in (False, True) for rising in (False, True)]
    for round_ in range(2):
        for count, size, keyed, rising in layouts + [(9000, 100, False, False)]:
            record_list = [
                (b"k%03d" % (i % 1000) if keyed else None, bytes([(i + round_) % 256]) * size, [], 1_700_000_000_000 + (i // 3 if rising else 0))
                for i in range(count)
            ]
            columns = columns_of(record_list)
            del columns["headers"]
            if not keyed:
                columns["key"] = None
            assert encode_columns(**columns) == encode_batch(record_list), (round_, count, size, keyed, rising)
        if round_ == 0:
            kept_after_one_round = dict(columnar._KEPT_STRETCHES)
    assert all(kept.nbytes <= most_bytes for kept in columnar._KEPT_STRETCHES.values())
    if most_bytes == 4 << 20:  # the second round found every stretch kept by the first
        assert kept_after_one_round and columnar._KEPT_STRETCHES.keys() == kept_after_one_round.keys()
        assert all(columnar._KEPT_STRETCHES[identity] is kept for identity, kept in kept_after_one_round.items())


def test_encoding_refuses_what_the_record_codec_cannot_carry():
    with pytest.raises(ValueError, match="at least one record"):
        encode_columns(value=pa.array([], pa.binary()), timestamp=pa.array([], pa.int64()))
    with pytest.raises(ValueError, match="timestamp column has nulls"):
        encode_columns(value=[b"a"], timestamp=pa.array([None], pa.int64()))
    with pytest.raises(ValueError, match="differ in length"):
        encode_columns(key=[b"a", b"b"], value=[b"a"], timestamp=[1])
    with pytest.raises(TypeError, match="value column must be binary"):
        encode_columns(value=pa.array([1]), timestamp=[1])
    nameless = pa.array([[{"key": None, "value": b"v"}]], pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    with pytest.raises(ValueError, match="header key is null"):
        encode_columns(value=[b"a"], timestamp=[1], headers=nameless)


# ---------------------------------------------------------------------------
# decoding a fetched section: the fetcher's rules


@st.composite
def fetched_logs(draw):
    """A partition's log as a Fetch returns it: data and control batches of a
    few producers, compressed or not, some with LogAppendTime, gaps in the
    offsets (compaction), and the aborted-transactions list of the
    transactions whose marker is ABORT (and of open ones, by chance), with a
    stray entry or two."""
    producers = [1000, 1001]
    out = bytearray()
    offset = draw(st.integers(0, 2**40))
    open_since = {}  # producer -> first offset of its open transaction
    aborted = []
    for _ in range(draw(st.integers(1, 10))):
        producer = draw(st.sampled_from(producers))
        if draw(st.integers(0, 2)) == 0:
            if open_since and producer not in open_since:
                producer = draw(st.sampled_from(sorted(open_since)))  # mostly markers that end something
            kind = draw(st.sampled_from([ControlType.ABORT, ControlType.COMMIT]))
            batch = encode_control_batch(kind, producer_id=producer, producer_epoch=0, coordinator_epoch=0, timestamp=5, base_offset=offset)
            first = open_since.pop(producer, None)
            if kind == ControlType.ABORT and first is not None:
                aborted.append({"producer_id": producer, "first_offset": first, "marker": offset})
            offset += 1
        elif draw(st.integers(0, 9)) == 0:  # emptied by compaction: offsets kept, no records
            span = draw(st.integers(1, 3))
            batch = encode_batch([], base_offset=offset, allow_empty=True, last_offset_delta=span - 1, base_timestamp=5)
            offset += span
        else:
            record_list = draw(record_tuples | same_size_runs)
            transactional = draw(st.integers(0, 3)) > 0
            idempotent = draw(st.booleans())
            batch = encode_batch(
                record_list,
                base_offset=offset,
                producer_id=producer if transactional or idempotent else -1,
                producer_epoch=0 if transactional or idempotent else -1,
                base_sequence=0 if transactional or idempotent else -1,
                is_transactional=transactional,
                compression=draw(st.sampled_from(CODECS)),
                timestamp_type=draw(st.sampled_from(list(TimestampType))),
            )
            if transactional:
                open_since.setdefault(producer, offset)
            offset += len(record_list)
        out += batch
        offset += draw(st.sampled_from([0, 0, 0, 3]))
    aborted += [{"producer_id": p, "first_offset": o, "marker": 2**63} for p, o in open_since.items() if draw(st.booleans())]
    stray = st.builds(lambda p, o: {"producer_id": p, "first_offset": o, "marker": None}, st.sampled_from(producers), st.integers(0, offset))
    aborted += draw(st.lists(stray, max_size=2))
    return bytes(out), draw(st.permutations(aborted))


def reference_rows(data, aborted, *, read_committed: bool, start_offset: int):
    """What today's fetcher makes of a fetched section, as rows, and where it goes next."""
    config = ConsumerConfig(bootstrap_servers="unused:9092", isolation_level="read_committed" if read_committed else "read_uncommitted")
    fetched = fetched_partition(data, aborted, tp=TP, fetch_offset=start_offset, config=config)
    rows = [
        {
            "key": r.key,
            "value": r.value,
            "offset": r.offset,
            "timestamp": r.timestamp,
            "timestamp_type": int(r.offset in fetched.log_append_offsets),
            "headers": [{"key": h.key, "value": h.value} for h in r.headers],
        }
        for r in fetched.records
    ]
    return rows, fetched.end


def first_offset_of(data) -> int:
    return next(iter_batches(data))[1].base_offset


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    log=fetched_logs(),
    read_committed=st.booleans(),
    start_skip=st.just(0) | st.integers(0, 80),
    cut=st.sampled_from([None, None, "cut"]).flatmap(lambda cut: st.none() if cut is None else st.integers(0, 10**6)),
)
def test_decoding_a_fetch_keeps_what_the_fetcher_keeps(log, read_committed, start_skip, cut):
    data, aborted = log
    start_offset = first_offset_of(data) + start_skip
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    fetched = decode_fetched(data, aborted, read_committed=read_committed, start_offset=start_offset)
    assert fetched.columns.schema == columnar.FETCHED_SCHEMA
    whole_end, partial = records.split_partial_tail(data)
    assert fetched.partial == partial
    try:
        rows, end = reference_rows(data, aborted, read_committed=read_committed, start_offset=start_offset)
    except RecordBatchTooLargeError:  # nothing came whole: the caller reports it
        assert whole_end == 0 and fetched.columns.num_rows == 0 and fetched.end == start_offset
        return
    assert fetched.columns.to_pylist() == rows
    assert fetched.end == end


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(log=fetched_logs(), read_committed=st.booleans(), fetch_bytes=st.integers(1, 3000))
def test_fetches_cut_anywhere_add_up_to_the_whole_log(log, read_committed, fetch_bytes):
    """A consumer reading the log in fetches of at most ``fetch_bytes`` (each
    from the batch holding its position, cut like Kafka cuts: by bytes,
    through a batch) sees what one fetch of the whole log shows."""
    data, aborted = log
    aborted = [entry for entry in aborted if entry["marker"] is not None]
    batches = list(iter_batches(data))
    position = batches[0][1].base_offset
    whole = decode_fetched(data, aborted, read_committed=read_committed, start_offset=position)
    pieces = []
    while True:
        at = next((p for p, header in batches if header.next_offset > position), None)
        if at is None:
            break
        size = fetch_bytes
        while True:
            # the broker lists the aborted transactions the fetched range overlaps
            overlapping = [entry for entry in aborted if entry["marker"] >= position]
            fetched = decode_fetched(data[at : at + size], overlapping, read_committed=read_committed, start_offset=position)
            if fetched.end > position:
                break
            assert fetched.partial is not None and fetched.columns.num_rows == 0
            size *= 2  # what a consumer told the batch is too large must do
        pieces.append(fetched.columns)
        position = fetched.end
    assert pa.Table.from_batches(pieces, schema=columnar.FETCHED_SCHEMA).to_pylist() == whole.columns.to_pylist()
    assert position == whole.end


@st.composite
def alike_batches(draw):
    """Batches whose records mostly take one layout (the decoder reads such
    runs as byte matrices): one key length (or none) and value size per
    batch, timestamp deltas whose varints grow a byte somewhere or not, runs
    of 32 records and more, batches too short for a run (a producer's
    linger tail, whose records are read varint by varint), and twists that keep a record's size but not its
    layout (a key a byte longer and its value a byte shorter, a timestamp
    delta a byte wider and its value a byte shorter, a header in place of
    two value bytes; the record codec's bytes of each are those of the
    record it replaces, plus or minus nothing)."""
    out = bytearray()
    offset = draw(st.integers(0, 2**40))
    for _ in range(draw(st.integers(1, 3))):
        count = draw(st.integers(32, 300) | st.integers(1, 31))
        key = draw(st.sampled_from([None, b"", b"k" * 5, b"q" * 70]))
        size = draw(st.integers(3, 140))
        base = draw(st.integers(0, 2**40))
        step = draw(st.sampled_from([0, 1, 3, 70, 10_000, 2**35, -1]))
        if step == -1:  # from the base (the smallest) + 64 down to the base where the offset delta's varint grows: one size, two layouts
            stamps = [base + 64 * (i < 64) for i in range(count)]
        else:
            stamps = [base + (i * step if step < 2**35 else (i >= count // 2) * step) for i in range(count)]
        record_list = [(key, bytes([i % 256]) * size, [], stamps[i]) for i in range(count)]
        for index in draw(st.lists(st.integers(0, count - 1), max_size=3)):
            twisted_key, value, headers, timestamp = record_list[index]
            twist = draw(st.integers(0, 2))
            if twist == 0 and twisted_key is not None and len(value) > 1:
                record_list[index] = (twisted_key + b"+", value[:-1], headers, timestamp)
            elif twist == 1 and len(value) > 1:
                record_list[index] = (twisted_key, value[:-1], headers, timestamp + 64)
            elif len(value) > 2:
                record_list[index] = (twisted_key, value[:-2], [("", None)], timestamp)
        compression = draw(st.sampled_from([Compression.NONE, Compression.NONE, Compression.LZ4]))
        out += encode_batch(record_list, base_offset=offset, compression=compression, base_timestamp=min(stamp for *_, stamp in record_list))
        offset += count + draw(st.sampled_from([0, 5]))
    return bytes(out)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=alike_batches(), start_skip=st.integers(0, 400))
def test_records_laid_out_alike_decode_as_the_record_codec_decodes_them(data, start_skip):
    start_offset = first_offset_of(data) + start_skip
    rows, end = reference_rows(data, [], read_committed=True, start_offset=start_offset)
    fetched = decode_fetched(data, [], read_committed=True, start_offset=start_offset)
    assert fetched.columns.schema == columnar.FETCHED_SCHEMA
    assert fetched.columns.to_pylist() == rows
    assert fetched.end == end


def test_a_fetch_of_records_laid_out_alike_is_read_as_byte_matrices(monkeypatch):
    """The matrix path is taken (every record in a run: the binary columns
    are cut without record positions) and gives what the varint path gives."""
    data = b"".join(encode_batch([(None, b"%03d" % i * 30, [], 1000 + i // 7) for i in range(200)], base_offset=base) for base in (0, 200))
    taken = []
    monkeypatch.setattr(columnar, "_uniform_columns", lambda *a, f=columnar._uniform_columns: taken.append(1) or f(*a))
    by_matrix = decode_fetched(data).columns
    assert taken and by_matrix.num_rows == 400
    monkeypatch.setattr(columnar, "_MATRIX_MIN_RECORDS", 10**9)
    assert decode_fetched(data).columns.equals(by_matrix)
    assert len(taken) == 1


@pytest.mark.parametrize("twist", [None, "a longer value", "a header", "a null key"])
def test_a_fetch_with_records_outside_the_runs_is_read_as_byte_matrices_when_their_lengths_agree(monkeypatch, twist):
    """Records in no run (a batch too short for one, the few after a
    run where the offset delta's varint grows at 64) take the matrix path
    when their keys and values have the runs' lengths and they carry no
    headers: their values are gathered at their positions. A twisted one
    among them sends the fetch down the varint path. Both give the record
    codec's rows."""
    def batch(count, base, twisted=None):
        record_list = [(b"key", b"%03d" % (base + i) * 30, [], 1000 + i // 7) for i in range(count)]
        if twisted is not None:
            key, value, headers, timestamp = record_list[twisted]
            record_list[twisted] = {
                "a longer value": (key, value + b"!", headers, timestamp),
                "a header": (key, value, [("h", b"v")], timestamp),
                "a null key": (None, value, headers, timestamp),
            }[twist]
        return encode_batch(record_list, base_offset=base)

    data = batch(200, 0) + batch(7, 200, 3 if twist else None) + batch(70, 207) + batch(1, 277)
    taken = []
    monkeypatch.setattr(columnar, "_uniform_columns", lambda *a, f=columnar._uniform_columns: taken.append(1) or f(*a))
    fetched = decode_fetched(data)
    assert bool(taken) == (twist is None)
    rows, end = reference_rows(data, [], read_committed=True, start_offset=0)
    assert fetched.columns.to_pylist() == rows and fetched.end == end == 278
    assert decode_fetched(data, start_offset=203).columns.to_pylist() == rows[203:]


def test_an_empty_section_and_a_section_of_control_batches_give_no_rows():
    assert decode_fetched(b"", start_offset=7).columns.num_rows == 0
    assert decode_fetched(b"", start_offset=7).end == 7
    markers = encode_control_batch(ControlType.COMMIT, producer_id=3, producer_epoch=0, coordinator_epoch=0, timestamp=1, base_offset=9)
    fetched = decode_fetched(markers, [], start_offset=9)
    assert fetched.columns.num_rows == 0 and fetched.end == 10 and fetched.partial is None


def test_a_batch_emptied_by_compaction_moves_the_position_past_its_offsets():
    empty = encode_batch([], base_offset=5, allow_empty=True, last_offset_delta=2, base_timestamp=1)
    fetched = decode_fetched(empty, [], start_offset=5)
    assert fetched.columns.num_rows == 0 and fetched.end == 8
    fetched = decode_fetched(empty + encode_batch([(None, b"v", [], 1)], base_offset=8), [], start_offset=5)
    assert fetched.columns.column("offset").to_pylist() == [8] and fetched.end == 9


def test_aborted_records_are_kept_under_read_uncommitted_and_dropped_under_read_committed():
    data = encode_batch([(b"k", b"aborted", [], 1)], base_offset=0, producer_id=7, producer_epoch=0, base_sequence=0, is_transactional=True)
    data += encode_control_batch(ControlType.ABORT, producer_id=7, producer_epoch=0, coordinator_epoch=0, timestamp=2, base_offset=1)
    data += encode_batch([(b"k", b"later", [], 3)], base_offset=2, producer_id=7, producer_epoch=0, base_sequence=1, is_transactional=True)
    aborted = [{"producer_id": 7, "first_offset": 0}]
    assert decode_fetched(data, aborted, read_committed=True).columns.column("value").to_pylist() == [b"later"]
    assert decode_fetched(data, aborted, read_committed=False).columns.column("value").to_pylist() == [b"aborted", b"later"]


# ---------------------------------------------------------------------------
# damage: the same verdict as the record codec, and its message


def with_crc_fixed(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, records.CRC_OFFSET, records.crc32c(memoryview(batch)[records.ATTRIBUTES_OFFSET :]))
    return bytes(batch)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record_list=record_tuples | same_size_runs, edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=3))
def test_damaged_records_with_a_valid_crc_fail_as_the_record_codec_fails(record_list, edits):
    """Bytes changed inside the records (the CRC recomputed, as a buggy
    producer would send them): either both codecs read the same records or
    both raise CorruptRecordError with the same message."""
    batch = bytearray(encode_batch(record_list, base_offset=10))
    for where, byte in edits:
        batch[records.BATCH_HEADER_SIZE + where % (len(batch) - records.BATCH_HEADER_SIZE)] = byte
    data = with_crc_fixed(batch)
    try:
        rows, _end = reference_rows(data, [], read_committed=True, start_offset=10)
    except CorruptRecordError as expected:
        with pytest.raises(CorruptRecordError) as raised:
            decode_fetched(data, [], start_offset=10)
        assert str(raised.value) == str(expected)
        return
    assume(all(-(2**63) <= row["timestamp"] < 2**63 for row in rows))  # a 10-byte delta past int64 (see the module doc)
    assert decode_fetched(data, [], start_offset=10).columns.to_pylist() == rows


def test_a_crc_mismatch_is_reported_as_by_the_record_codec():
    batch = bytearray(encode_batch([(b"k", b"v", [], 1)]))
    batch[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="crc mismatch"):
        decode_fetched(bytes(batch))


def test_a_header_key_that_is_not_utf8_is_damage():
    batch = bytearray(encode_batch([(b"k", b"v", [("h", b"x")], 1)]))
    position = bytes(batch).rindex(b"h")
    batch[position] = 0xFF
    with pytest.raises(CorruptRecordError, match="utf-8"):
        decode_fetched(with_crc_fixed(batch))


def test_a_record_whose_fields_end_before_its_length_says_is_damage():
    batch = bytearray(encode_batch([(None, b"\x00\x00", [], 1)]))
    value_length = bytes(batch).rindex(bytes([4]) + b"\x00\x00")
    batch[value_length] = 2  # a one-byte value: the header count is read from the value's second byte
    with pytest.raises(CorruptRecordError, match="record fields end at byte"):
        rows, _end = reference_rows(with_crc_fixed(batch), [], read_committed=True, start_offset=0)
    with pytest.raises(CorruptRecordError, match="record fields end at byte"):
        decode_fetched(with_crc_fixed(batch))


def test_a_timestamp_delta_with_bits_past_64_lands_where_the_record_codec_puts_it():
    """A ten-byte varint whose last byte carries more than its lowest bit:
    records.read_varint keeps the extra bits; the sum with the base
    timestamp is still an int64, and the columns hold the same one."""
    batch = bytearray(encode_batch([(None, b"v", [], 2**63 - 1), (None, b"w", [], 0)]))
    delta = bytes(batch).rindex(b"\xff\x01\x02") + 1  # the 10-byte delta's last byte, then offset delta 1
    assert batch[delta - 8 : delta] == b"\xff" * 8
    batch[delta] = 0x03
    data = with_crc_fixed(batch)
    rows, _end = reference_rows(data, [], read_committed=True, start_offset=0)
    assert rows[1]["timestamp"] == -(2**63)
    assert decode_fetched(data).columns.to_pylist() == rows


def test_a_fetch_past_the_int32_offsets_of_a_binary_array_still_decodes(monkeypatch):
    """Offsets into a joined buffer beyond 2 GiB take the 64-bit path; shown
    here by lowering the limit, not with 2 GiB of data. A column whose own
    bytes exceed the limit is a clear error, not a wrapped offset."""
    record_list = [(b"k%d" % i, b"v" * 300, [("h", b"x")], i) for i in range(10)]
    data = encode_batch(record_list)
    expected = decode_fetched(data).columns
    monkeypatch.setattr(columnar, "_INT32_MAX", 3050)  # the values take 3000 bytes, end past 3100
    assert decode_fetched(data).columns.equals(expected)
    monkeypatch.setattr(columnar, "_INT32_MAX", 2900)
    with pytest.raises(ValueError, match="do not fit an Arrow binary column"):
        decode_fetched(data)


def test_damaged_compressed_data_and_an_unknown_codec_are_reported_as_by_the_record_codec():
    batch = bytearray(encode_batch([(b"k", b"v" * 50, [], 1)], compression=Compression.GZIP))
    batch[records.BATCH_HEADER_SIZE + 12] ^= 0xFF
    unknown = bytearray(encode_batch([(b"k", b"v", [], 1)]))
    unknown[records.ATTRIBUTES_OFFSET + 1] |= 0x07  # codec id 7
    for damaged in (with_crc_fixed(batch), with_crc_fixed(unknown)):
        with pytest.raises(CorruptRecordError) as expected:
            records.decode_batch(damaged)
        with pytest.raises(CorruptRecordError) as raised:
            decode_fetched(damaged)
        assert str(raised.value) == str(expected.value)


def test_a_batch_whose_sizes_fool_the_guess_and_whose_values_are_not_varints_decodes():
    """The decoder guesses record starts from the first record's size when a
    batch's total size agrees with it; here it agrees by chance (one value
    of 54 bytes, then as many of 52 as of 56), and the wrong guesses land
    inside values of bytes >= 0x80, which read as a varint longer than 10
    bytes: the batch is scanned instead, not refused as damaged (found by
    hypothesis)."""
    record_list = [(None, bytes([0]) * 54, [], 0)]
    record_list += [(None, bytes([i]) * 52, [], 0) for i in range(1, 67)]
    record_list += [(None, bytes([i]) * 56, [], 0) for i in range(67, 133)]
    fetched = decode_fetched(encode_batch(record_list))
    assert fetched.columns.column("value").to_pylist() == [value for _key, value, _headers, _ts in record_list]
    assert fetched.columns.column("offset").to_pylist() == list(range(133))
