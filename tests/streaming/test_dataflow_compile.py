"""How the dataflow layer compiles a chain into processors, and what those
processors do, driven record by record without a broker (the broker and
runner tests are test_dataflow_broker.py)."""

from __future__ import annotations

import zlib

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streaming.dataflow import LATE_METRIC, Stream
from streaming.serde import INTERNAL_FORMAT
from streaming.serde import decode_internal as _decode_internal
from streaming.serde import encode_internal as _encode_internal
from streaming.windows import hopping, tumbling
from tests.helpers import DictState


@attrs.frozen
class Record:
    key: object
    value: object
    topic: str = "in"
    partition: int = 0
    offset: int = 0
    timestamp: int = 0
    headers: tuple = ()


class Registry:
    """Collects what ``Stream.to`` registers, as ``streaming.App`` would."""

    application_id = "app"

    def __init__(self):
        self.processors: list[dict] = []
        self.internal_topics: dict[str, str] = {}

    def processor(self, **options):
        def register(fn):
            self.processors.append({**options, "fn": fn})
            return fn

        return register

    def run(self):
        self.ran = True

    def stream(self, topic, key_format="bytes", value_format="bytes"):
        return Stream(self, topic, key_format=key_format, value_format=value_format)


class Context:
    def __init__(self, stores: dict, record: Record, sink: str, out: list, metrics: dict):
        self._stores, self._record, self._sink, self._out, self._metrics = stores, record, sink, out, metrics

    def store(self, name):
        return self._stores.setdefault((name, self._record.partition), DictState())

    def emit(self, key, value, topic=None, headers=None, timestamp=None):
        self._out.append((topic or self._sink, key, value, self._record.timestamp if timestamp is None else timestamp))

    def count(self, name, n=1):
        self._metrics[name] = self._metrics.get(name, 0) + n


def drive(registry: Registry, records: list[Record], partitions: int = 2):
    """Run every record through the registered processors, feeding internal
    topics (partitioned by a hash of the encoded key) to the processors that
    read them; returns (sink records, metrics)."""
    stores, metrics, final = {}, {}, []
    queue = list(records)
    while queue:
        record = queue.pop(0)
        for processor in registry.processors:
            if processor["source"] != record.topic:
                continue
            out: list = []
            processor["fn"](record, Context(stores, record, processor["sink"], out, metrics))
            for topic, key, value, timestamp in out:
                if "-repartition-" in topic:
                    assert processor["sink_key_format"] == INTERNAL_FORMAT
                    encoded_key = _encode_internal(key)
                    partition = zlib.crc32(encoded_key) % partitions
                    queue.append(Record(_decode_internal(encoded_key), _decode_internal(_encode_internal(value)), topic, partition, 0, timestamp))
                else:
                    final.append((topic, key, value, timestamp))
    return final, metrics


def test_a_stateless_chain_is_one_processor_and_passes_keys_and_timestamps():
    registry = Registry()
    stream = (registry.stream("in", key_format="str", value_format="str")
             .filter(lambda line: line != "skip")
             .flat_map(str.split)
             .map(str.upper)
             .map(lambda key, value: f"{key}:{value}", with_key=True)
             .to("out"))
    assert isinstance(stream, Stream), ".to() returns the stream, so a chain can go on"
    assert [p["name"] for p in registry.processors] == stream.processor_names("out") == ["in-to-out"]
    processor = registry.processors[0]
    assert (processor["source"], processor["sink"], processor["stores"]) == ("in", "out", [])
    assert (processor["key_format"], processor["sink_value_format"]) == ("str", "auto"), "a sink's format follows the values, not the source"
    out, _ = drive(registry, [Record("k", "a b", timestamp=5), Record("j", "skip", timestamp=6), Record("i", "c", timestamp=7)])
    assert out == [("out", "k", "k:A", 5), ("out", "k", "k:B", 5), ("out", "i", "i:C", 7)]


def test_key_by_then_count_goes_through_a_repartition_topic():
    registry = Registry()
    (registry.stream("in", value_format="str")
             .flat_map(str.split)
             .key_by(lambda word: word)
             .count()
             .to("counts", key_format="str", value_format="json"))
    assert [p["name"] for p in registry.processors] == ["in-to-counts-0", "in-to-counts-1"]
    first, second = registry.processors
    assert first["sink"] == second["source"] == "app-in-to-counts-repartition-0"
    assert first["stores"] == [] and second["stores"] == ["in-to-counts-count-0"]
    assert registry.internal_topics == {"app-in-to-counts-repartition-0": "in"}  # created, partitioned like "in", before run
    assert (second["sink"], second["sink_key_format"], second["sink_value_format"]) == ("counts", "str", "json")
    lines = ["a b a", "b c", "a"]
    out, _ = drive(registry, [Record(None, line, partition=i % 2) for i, line in enumerate(lines)], partitions=3)
    final: dict = {}
    for _topic, word, count, _ts in out:
        assert count == final.get(word, 0) + 1  # each word's counts arrive in order, one by one
        final[word] = count
    assert final == {"a": 3, "b": 2, "c": 1}


def test_aggregate_without_key_by_stays_one_processor_and_refuses_a_none_key():
    registry = Registry()
    (registry.stream("payments", key_format="str", value_format="json")
     .aggregate({"total": 0}, lambda agg, payment: {"total": agg["total"] + payment["amount"]}, store="balances")
     .map(lambda agg: agg["total"])
     .to("balances"))
    assert len(registry.processors) == 1 and registry.processors[0]["stores"] == ["balances"]
    out, _ = drive(registry, [Record("a", {"amount": 5}, "payments"), Record("b", {"amount": 1}, "payments"), Record("a", {"amount": -2}, "payments")])
    assert [(key, value) for _t, key, value, _ts in out] == [("a", 5), ("b", 1), ("a", 3)]
    with pytest.raises(ValueError, match="None key"):
        drive(registry, [Record(None, {"amount": 1}, "payments")])


def test_reduce_keeps_the_first_value_as_the_aggregate():
    registry = Registry()
    registry.stream("in", value_format="json").reduce(max).to("out")
    out, _ = drive(registry, [Record("k", 3), Record("k", 9), Record("k", 4)])
    assert [value for *_x, value, _ts in out] == [3, 9, 9]


def test_window_results_are_emitted_at_close_and_late_records_counted():
    registry = Registry()
    registry.stream("clicks", key_format="str").window(tumbling(10_000), grace=2_000).count().to("per-window", value_format="json")
    records = [Record("u", b"", "clicks", timestamp=ts) for ts in (1_000, 9_000, 11_000, 5_000, 12_000, 9_999, 25_000)]
    out, metrics = drive(registry, records)
    # 5 s is within grace (stream time 11 s < 10 + 2); 9.999 s comes after stream time 12 s closed [0, 10).
    assert [(key, value, ts) for _t, key, value, ts in out] == [
        ("u", {"start": 0, "end": 10_000, "value": 3}, 9_000),
        ("u", {"start": 10_000, "end": 20_000, "value": 2}, 12_000),
    ]
    assert metrics == {LATE_METRIC: 1}


def test_emit_update_emits_every_change_of_a_hopping_window():
    registry = Registry()
    registry.stream("in", key_format="str", value_format="json").window(hopping(10_000, 5_000), emit="update").aggregate(0, lambda a, v: a + v).to("out")
    out, _ = drive(registry, [Record("k", 1, timestamp=6_000), Record("k", 2, timestamp=12_000)])
    assert [(value["start"], value["value"]) for *_x, value, _ts in out] == [(0, 1), (5_000, 1), (5_000, 3), (10_000, 2)]


def test_windowed_count_after_key_by_closes_by_the_repartition_partitions_stream_time():
    registry = Registry()
    (registry.stream("lines", value_format="str").flat_map(str.split).key_by(lambda w: w)
     .window(tumbling(1_000)).count().to("counts", key_format="str", value_format="json"))
    assert registry.processors[1]["stores"] == ["lines-to-counts-count-0"]
    out, _ = drive(registry, [Record(None, line, "lines", timestamp=ts) for line, ts in (("a a b", 100), ("a", 900), ("a b", 5_000))], partitions=1)
    assert sorted((key, value["value"]) for _t, key, value, _ts in out) == [("a", 3), ("b", 1)]


def test_bad_window_arguments_are_refused():
    stream = Registry().stream("in")
    with pytest.raises(ValueError, match="emit"):
        stream.window(tumbling(1_000), emit="sometimes")
    with pytest.raises(ValueError, match="grace"):
        stream.window(tumbling(1_000), grace=-1)
    with pytest.raises(TypeError, match="tumbling"):
        stream.window(60)


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text() | st.binary() | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=3) | st.tuples(children, children) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=8,
)


@given(values)
def test_values_cross_a_repartition_topic_with_their_types(value):
    assert _decode_internal(_encode_internal(value)) == value
    assert _encode_internal(value) == _encode_internal(_decode_internal(_encode_internal(value)))


def test_a_value_that_cannot_cross_a_repartition_topic_is_an_error():
    with pytest.raises(TypeError, match="repartition"):
        _encode_internal({1: "int keys are not JSON"})
    with pytest.raises(TypeError, match="set"):
        _encode_internal({"a", "b"})
