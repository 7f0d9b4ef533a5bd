"""The store's sans-I/O parts (key encoding and order, the three layers) and
its SQLite file (atomic apply with the changelog position, a file of another
changelog or an unreadable file thrown away)."""

from __future__ import annotations

import asyncio
import random
import sqlite3

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streaming.serde import SerializationError, resolve
from streaming.store import SCHEMA, Store, StoreError, StoreFile, decode_key, encode_key, encode_value
from tests.streaming.runner_support import sqlite_state

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.text(), st.binary())
elements = st.recursive(scalars, lambda inner: st.tuples(inner, inner) | st.lists(inner, max_size=3).map(tuple), max_leaves=6)
keys = st.one_of(st.text(), st.binary(), st.integers(-(2**63), 2**63 - 1), st.lists(elements, max_size=4).map(tuple))


@given(keys)
def test_every_key_round_trips(key):
    assert decode_key(encode_key(key)) == key


@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=2))
def test_int_keys_sort_numerically(values):
    assert sorted(values, key=encode_key) == sorted(values)


@given(st.lists(st.text(), min_size=2))
def test_str_keys_sort_by_code_point(values):
    assert sorted(values, key=encode_key) == sorted(values)


@given(st.lists(st.binary(), min_size=2))
def test_bytes_keys_sort_by_bytes_even_with_nuls(values):
    assert sorted(values, key=encode_key) == sorted(values)


@given(st.lists(st.tuples(st.text(max_size=3), st.integers(-1000, 1000), st.floats(-1e6, 1e6)), min_size=2))
def test_tuple_keys_sort_element_by_element(values):
    assert sorted(values, key=encode_key) == sorted(values)


def test_types_sort_in_a_fixed_order_and_bad_keys_are_refused():
    assert encode_key(5) < encode_key("a") < encode_key(b"a") < encode_key(("a",))
    assert encode_key("a") < encode_key("a\x00") < encode_key("ab") < encode_key("b")
    assert decode_key(encode_key(["x", 1])) == ("x", 1)  # lists come back as tuples
    for bad in (None, 1.5, True, {"a": 1}, 2**63, ("x", float("nan"))):
        with pytest.raises(StoreError):
            encode_key(bad)


def test_reads_see_the_record_then_the_transaction_then_the_committed_layer():
    store = Store("s", 0, {encode_key("a"): encode_value(1), encode_key("b"): encode_value(2)}, next_offset=10)
    store.put("a", 5)
    assert store.get("a") == 5  # the record's own write
    store.end_record(True)
    store.put("a", 6)
    store.delete("b")
    store.put("c", {"x": [1, 2]})
    assert store.get("a") == 6 and store.get("b") is None and store.get("b", "gone") == "gone"
    assert list(store.items()) == [("a", 6), ("c", {"x": [1, 2]})]
    store.end_record(False)  # the processor raised: this record's writes vanish
    assert store.get("a") == 5 and store.get("b") == 2 and store.get("c") is None
    assert store.pending == {encode_key("a"): encode_value(5)}
    assert store.committed[encode_key("a")] == encode_value(1)  # nothing committed before the Kafka commit


def test_committed_apply_moves_the_position_and_discard_forgets_the_transaction():
    store = Store("s", 0, {}, next_offset=0)
    store.put("a", 1)
    store.put("b", 2)
    store.end_record(True)
    changes = store.take_pending()
    store.apply_committed(changes, 7)
    assert store.next_offset == 7 and dict(store.items()) == {"a": 1, "b": 2}
    store.delete("a")
    store.end_record(True)
    store.discard_pending()  # an abort
    assert dict(store.items()) == {"a": 1, "b": 2}
    store.delete("a")
    store.end_record(True)
    store.apply_committed(store.take_pending(), 9)
    assert dict(store.items()) == {"b": 2}


def test_values_are_json_and_a_caller_cannot_change_them_behind_the_store():
    store = Store("s", 0)
    value = {"list": [1, 2], "tuple": (3, 4)}
    store.put("k", value)
    value["list"].append(99)
    assert store.get("k") == {"list": [1, 2], "tuple": [3, 4]}
    got = store.get("k")
    got["list"].clear()
    assert store.get("k")["list"] == [1, 2]
    with pytest.raises(StoreError):
        store.put("k", {1, 2})
    with pytest.raises(StoreError):
        store.put("k", None)


def test_items_come_in_key_order_across_layers():
    rng = random.Random(4)
    store = Store("s", 0, {encode_key(i): encode_value(i) for i in range(0, 100, 2)})
    for i in rng.sample(range(100), 30):
        store.put(i, -i)
    store.end_record(True)
    for i in rng.sample(range(100), 10):
        store.delete(i)
    keys_seen = [k for k, _ in store.items()]
    assert keys_seen == sorted(keys_seen) and len(keys_seen) == len(set(keys_seen))


def test_formats_by_name_and_pair():
    assert resolve("str").serialize("é") == "é".encode() and resolve("str").deserialize(b"x") == "x"
    assert resolve("json").deserialize(resolve("json").serialize({"a": [1]})) == {"a": [1]}
    assert resolve("bytes").serialize(b"x") == b"x" and resolve("json").serialize(None) is None
    upper = resolve((lambda s: s.upper().encode(), lambda b: b.decode().lower()))
    assert upper.serialize("ab") == b"AB" and upper.deserialize(b"AB") == "ab"
    with pytest.raises(SerializationError):
        resolve("json").deserialize(b"{not json")
    with pytest.raises(SerializationError):
        resolve("str").deserialize(b"\xff")
    with pytest.raises(SerializationError):
        resolve("bytes").serialize("text")
    with pytest.raises(ValueError):
        resolve("yaml")


def test_sqlite_file_keeps_contents_with_their_position(tmp_path):
    async def scenario():
        path = str(tmp_path / "stores" / "s-0.sqlite")
        file = StoreFile(path, "app-s-changelog", 0)
        assert await file.open() == ({}, 0)
        await file.apply({b"a": b"1", b"b": b"2"}, 5)
        await file.apply({b"a": None, b"c": b"3"}, 9)
        await file.close()
        again = StoreFile(path, "app-s-changelog", 0)
        assert await again.open() == ({b"b": b"2", b"c": b"3"}, 9)
        assert again.discarded_reason is None
        position_only = StoreFile(path, "app-s-changelog", 0)
        assert await position_only.open(load=False) == ({}, 9)  # a shard still in memory needs only the position
        await position_only.close()
        await again.clear(4)
        await again.close()
        cleared = StoreFile(path, "app-s-changelog", 0)
        assert await cleared.open() == ({}, 4)
        await cleared.close()

    asyncio.run(scenario())


def test_sqlite_file_of_another_changelog_or_unreadable_is_started_afresh(tmp_path):
    async def scenario():
        path = str(tmp_path / "s-0.sqlite")
        file = StoreFile(path, "app-s-changelog", 0)
        await file.open()
        await file.apply({b"a": b"1"}, 5)
        await file.close()
        other = StoreFile(path, "other-s-changelog", 0)
        assert await other.open() == ({}, 0)
        assert other.discarded_reason == "it holds app-s-changelog-0, not other-s-changelog-0"
        await other.close()
        with open(path, "r+b") as handle:  # garbage over the header
            handle.write(b"this is not a database file" * 10)
        broken = StoreFile(path, "other-s-changelog", 0)
        assert await broken.open() == ({}, 0)
        assert "unreadable" in broken.discarded_reason
        await broken.close()

    asyncio.run(scenario())


def test_sqlite_file_killed_before_its_schema_opens_empty_at_offset_zero(tmp_path):
    """SIGKILL between creating the file and writing its first position
    row leaves an empty file, one with only its journal mode, or one with
    empty tables: each opens as a new store."""

    async def scenario():
        empty = tmp_path / "s-0.sqlite"
        empty.touch()
        wal_only = tmp_path / "s-1.sqlite"
        db = sqlite3.connect(wal_only)
        db.execute("PRAGMA journal_mode=WAL")
        db.close()
        tables_only = tmp_path / "s-2.sqlite"  # killed between the schema and the first position row
        db = sqlite3.connect(tables_only)
        db.executescript(SCHEMA)
        db.close()
        for partition, path in enumerate((empty, wal_only, tables_only)):
            file = StoreFile(str(path), "app-s-changelog", partition)
            assert await file.open() == ({}, 0)
            assert file.discarded_reason is None
            await file.apply({b"a": b"1"}, 3)
            await file.close()
            again = StoreFile(str(path), "app-s-changelog", partition)
            assert await again.open() == ({b"a": b"1"}, 3)
            await again.close()

    asyncio.run(scenario())


def test_the_chaos_checker_reads_a_store_killed_before_its_first_position_as_the_runner_does(tmp_path):
    """The runner chaos test's reader of state dirs agrees with StoreFile
    on the three shapes a kill during creation leaves: offset 0, empty."""
    stores = tmp_path / "stores"
    stores.mkdir()
    (stores / "balances-0.sqlite").touch()
    db = sqlite3.connect(stores / "balances-1.sqlite")
    db.execute("PRAGMA journal_mode=WAL")
    db.close()
    db = sqlite3.connect(stores / "balances-2.sqlite")
    db.executescript(SCHEMA)
    db.close()
    assert sqlite_state(str(tmp_path)) == {0: (0, {}), 1: (0, {}), 2: (0, {})}
