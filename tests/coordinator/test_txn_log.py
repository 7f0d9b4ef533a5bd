"""``__transaction_state`` values: the hand-written encoder against the
generic schema codec it replaces on the hot path, byte for byte, over
generated metadata of both versions (tagged fields included: Kafka's and
onceflow's own ``data_ends``, its exactness flag and ``committed_ends``)."""

from __future__ import annotations

import uuid

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.metadata import NO_PRODUCER_ID, TRANSACTION_VERSION_2, TopicPartition, TxnMetadata
from coordinator.state import TxnState
from coordinator.txn_log import DATA_ENDS_EXACT_TAG, VALUE_SCHEMA, decode_value, encode_value, encode_value_by_schema
from protocol import schema

int16 = st.integers(-(2**15), 2**15 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
# Topic names of every length class of a compact string's varint (0..127 bytes, then 2 bytes of length).
topics = st.text(max_size=3) | st.text(min_size=120, max_size=140) | st.sampled_from(["t", "orders", "__consumer_offsets", "été-ß"])
producer_ids = st.just(NO_PRODUCER_ID) | int64
topic_ids = st.none() | st.builds(uuid.UUID, int=st.integers(0, 2**128 - 1))

metadata_values = st.builds(
    TxnMetadata,
    transactional_id=st.text(max_size=8),
    producer_id=int64,
    producer_epoch=int16,
    timeout_ms=int32,
    state=st.sampled_from(list(TxnState)),
    partitions=st.frozensets(st.builds(TopicPartition, topics, int32), max_size=6),
    last_update_ms=int64,
    start_ms=int64,
    previous_producer_id=producer_ids,
    next_producer_id=producer_ids,
    transaction_version=st.sampled_from([0, 1, TRANSACTION_VERSION_2]) | int16,
    data_ends=st.lists(st.tuples(topics, int32, int64), max_size=3).map(tuple),
    data_ends_are_log_ends=st.booleans(),
    committed_ends=st.lists(st.tuples(topics, int32, int64, topic_ids), max_size=3).map(tuple),
)


@settings(max_examples=400, deadline=None)
@given(metadata_values)
def test_value_is_byte_equal_to_the_generic_codec(metadata):
    assert encode_value(metadata) == encode_value_by_schema(metadata)


@settings(max_examples=200, deadline=None)
@given(metadata_values)
def test_value_round_trips(metadata):
    decoded = decode_value(metadata.transactional_id, encode_value(metadata))
    assert (decoded.producer_id, decoded.producer_epoch, decoded.timeout_ms, decoded.state, decoded.partitions, decoded.last_update_ms,
            decoded.start_ms, decoded.data_ends, decoded.data_ends_are_log_ends) == (
        metadata.producer_id, metadata.producer_epoch, metadata.timeout_ms, metadata.state, metadata.partitions, metadata.last_update_ms,
        metadata.start_ms, metadata.data_ends, metadata.data_ends_are_log_ends and bool(metadata.data_ends))
    assert [end[:3] for end in decoded.committed_ends] == [end[:3] for end in metadata.committed_ends]


def test_both_versions_and_every_tag_are_exercised():
    """The shapes a transaction writes (a record of version 0, and one of
    version 1 carrying each tagged field), each equal to the generic codec's."""
    partitions = frozenset({TopicPartition("t", 1), TopicPartition("t", 0), TopicPartition("a", 5)})
    classic = TxnMetadata("tx", 7, 1, 60_000, TxnState.ONGOING, partitions, 1_700_000_000_000, 1_700_000_000_000)
    tagged = TxnMetadata("tx", 7, 1, 60_000, TxnState.COMPLETE_COMMIT, frozenset(), 1_700_000_000_001, -1, previous_producer_id=3,
                         next_producer_id=9, transaction_version=TRANSACTION_VERSION_2, data_ends=(("t", 0, 12),),
                         committed_ends=(("t", 0, 13, uuid.UUID(int=5)), ("u", 2, 4, None)))
    for metadata in (classic, tagged):
        assert encode_value(metadata) == encode_value_by_schema(metadata)
    assert encode_value(classic)[:2] == b"\x00\x00" and encode_value(tagged)[:2] == b"\x00\x01"


def test_a_value_out_of_range_is_a_value_error_as_before():
    metadata = TxnMetadata("tx", 2**63, 0, 60_000)
    with pytest.raises(ValueError):
        encode_value_by_schema(metadata)
    with pytest.raises(ValueError):
        encode_value(metadata)


def test_data_ends_are_read_as_exact_only_with_the_flag_a_record_of_before_lacks():
    """A decision names where its producer's data ends, with a flag (tag
    10002) that says so; a record of before names its logs' ends under the
    same tag (10000) and no flag, and is read as such
    (``data_ends_are_log_ends``). The flag is a tag of its own, so a
    reader of before (the schema without it) reads the exact ends as the
    ends it knew."""
    exact = TxnMetadata("tx", 7, 1, 60_000, TxnState.PREPARE_COMMIT, frozenset({TopicPartition("t", 0)}), 1, 1, data_ends=(("t", 0, 12),))
    old = attrs.evolve(exact, data_ends_are_log_ends=True)
    for metadata, flagged in ((exact, True), (old, False)):
        body, _ = schema.decode(VALUE_SCHEMA, 1, encode_value(metadata), 2, exact=False)
        assert body["onceflow_data_ends_exact"] is flagged
        decoded = decode_value("tx", encode_value(metadata))
        assert (decoded.data_ends, decoded.data_ends_are_log_ends) == ((("t", 0, 12),), not flagged)
    before = attrs.evolve(VALUE_SCHEMA, body=attrs.evolve(VALUE_SCHEMA.body, fields=tuple(f for f in VALUE_SCHEMA.body.fields if f.tag != DATA_ENDS_EXACT_TAG)))
    body, _ = schema.decode(before, 1, encode_value(exact), 2, exact=False)
    assert [(end["topic"], end["partition"], end["end_offset"]) for end in body["onceflow_data_ends"]] == [("t", 0, 12)]
