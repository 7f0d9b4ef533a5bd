"""State stores: what a processor reads and writes (``Store``, no I/O) and the
SQLite file that keeps a store's committed contents between runs
(``StoreFile``, through aiosqlite).

One store is one (store name, input partition) shard: the runner opens a
``Store`` for every store of a processor and every input partition number it
is assigned, and the processor's ``ctx.store(name)`` is the shard of the
record's partition.

Three layers, newest first, answer a read:

1. the writes of the record being processed (thrown away if the processor
   raises, so a failed record leaves no trace in the store);
2. the writes of the open transaction (``pending``): sent to the changelog
   at commit, applied to the committed layer and SQLite only once the Kafka
   transaction has committed;
3. the committed contents, held in memory (a dict of encoded key -> encoded
   value) and mirrored in the SQLite file.

Reads are served from memory because the processor is a plain function that
must not await; the whole committed contents of the assigned shards are
therefore in memory (about 100-200 bytes per small key and value), and SQLite
is what makes a restart fast: it holds the contents together with the
changelog offset they reflect, so a restart reads only the changelog's tail.

Keys: ``str``, ``bytes``, ``int`` (64-bit), or tuples/lists of ``None``,
``bool``, ``int``, ``float``, ``str``, ``bytes`` and nested tuples/lists. A
key is encoded to bytes so that byte order is the key order (``encode_key``):
one tag byte per element (None < False < True < int < float < str < bytes <
tuple), ints and floats as 8 order-preserving big-endian bytes, strings and
bytes with NUL escaped as ``00 FF`` and ended by ``00``. ``items()`` yields
keys in that order (within one type: natural order; ``"a" < "ab" < "b"``,
``(1, "x") < (2, "a")``), and the changelog's record keys are these bytes, so
compaction keeps one record per store key. A list key comes back as a tuple.

Values: anything JSON can hold; stored as compact JSON, so a value read back
is what ``json.loads(json.dumps(value))`` gives (tuples become lists), in this
transaction and after a restart alike. Every ``get`` decodes afresh, so a
caller mutating what it got or put cannot change the store behind its back.

The SQLite file (``StoreFile``), one per shard::

    entries(key BLOB PRIMARY KEY, value BLOB NOT NULL)   -- encoded key -> JSON value
    position(id = 0, changelog TEXT, partition INT, next_offset INT)

``next_offset`` is the changelog offset to read next: everything before it is
reflected in ``entries``. Entries and position change together in one SQLite
transaction, so the file is always a consistent snapshot of some prefix of
the changelog. (WAL journal, ``synchronous=NORMAL``: a power cut may lose the
newest commits of the file, which only puts it behind the changelog.)
"""

from __future__ import annotations

import os
import sqlite3
import struct

import aiosqlite
import attrs

from streaming.serde import json_bytes, json_value

# -- keys -------------------------------------------------------------------------------------------

TAG_NONE, TAG_FALSE, TAG_TRUE = 0x01, 0x02, 0x03
TAG_INT, TAG_FLOAT = 0x10, 0x11
TAG_STR, TAG_BYTES, TAG_TUPLE = 0x20, 0x21, 0x30
END = b"\x00"
INT_BIAS = 1 << 63
INT64 = struct.Struct(">Q")
FLOAT64 = struct.Struct(">d")


class StoreError(ValueError):
    """A key or value a store cannot hold."""


def _escaped(data: bytes) -> bytes:
    return data.replace(b"\x00", b"\x00\xff") + END


def _encode_element(value, out: bytearray) -> None:
    if value is None:
        out.append(TAG_NONE)
    elif value is True:
        out.append(TAG_TRUE)
    elif value is False:
        out.append(TAG_FALSE)
    elif isinstance(value, int):
        if not -INT_BIAS <= value < INT_BIAS:
            raise StoreError(f"int keys must fit in 64 bits, not {value}")
        out.append(TAG_INT)
        out += INT64.pack(value + INT_BIAS)
    elif isinstance(value, float):
        if value != value:
            raise StoreError("NaN cannot be a key (it equals nothing)")
        bits = bytearray(FLOAT64.pack(value))
        if bits[0] & 0x80:  # negative: invert everything so larger magnitudes sort first
            bits = bytearray(b ^ 0xFF for b in bits)
        else:
            bits[0] |= 0x80
        out.append(TAG_FLOAT)
        out += bits
    elif isinstance(value, str):
        out.append(TAG_STR)
        out += _escaped(value.encode("utf-8"))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        out.append(TAG_BYTES)
        out += _escaped(bytes(value))
    elif isinstance(value, (tuple, list)):
        out.append(TAG_TUPLE)
        for element in value:
            _encode_element(element, out)
        out += END
    else:
        raise StoreError(f"a store key is str, bytes, int or a tuple of those (and None, bool, float), not {type(value).__name__}")


def encode_key(key) -> bytes:
    """The order-preserving bytes of a store key (see the module doc)."""
    if type(key) is str:  # the common case, without the general walk
        return b"\x20" + key.encode("utf-8").replace(b"\x00", b"\x00\xff") + END
    if key is None or isinstance(key, (bool, float)):
        raise StoreError(f"a store key is str, bytes, int or a tuple, not {type(key).__name__}")
    out = bytearray()
    _encode_element(key, out)
    return bytes(out)


def _unescape(data: bytes, position: int) -> tuple[bytes, int]:
    out = bytearray()
    while True:
        end = data.index(b"\x00", position)
        out += data[position:end]
        if end + 1 < len(data) and data[end + 1] == 0xFF:
            out.append(0)
            position = end + 2
        else:
            return bytes(out), end + 1


def _decode_element(data: bytes, position: int):
    tag = data[position]
    position += 1
    if tag == TAG_NONE:
        return None, position
    if tag == TAG_FALSE:
        return False, position
    if tag == TAG_TRUE:
        return True, position
    if tag == TAG_INT:
        return INT64.unpack_from(data, position)[0] - INT_BIAS, position + 8
    if tag == TAG_FLOAT:
        bits = bytearray(data[position : position + 8])
        if bits[0] & 0x80:
            bits[0] &= 0x7F
        else:
            bits = bytearray(b ^ 0xFF for b in bits)
        return FLOAT64.unpack(bytes(bits))[0], position + 8
    if tag == TAG_STR:
        raw, position = _unescape(data, position)
        return raw.decode("utf-8"), position
    if tag == TAG_BYTES:
        return _unescape(data, position)
    if tag == TAG_TUPLE:
        items = []
        while data[position] != 0:
            item, position = _decode_element(data, position)
            items.append(item)
        return tuple(items), position + 1
    raise StoreError(f"unknown key tag 0x{tag:02x}")


def decode_key(data: bytes):
    value, position = _decode_element(data, 0)
    if position != len(data):
        raise StoreError(f"{len(data) - position} bytes left over after a key")
    return value


def encode_value(value) -> bytes:
    try:
        return json_bytes(value)
    except (TypeError, ValueError, RecursionError) as error:
        raise StoreError(f"a store value must be JSON-able: {error}") from None


def decode_value(data: bytes):
    return json_value(data)


# -- the store a processor sees -----------------------------------------------------------------------


@attrs.define(eq=False)
class Store:
    """One shard of a named store: ``get``, ``put``, ``delete``, ``items``.

    The runner drives the layers (``end_record``, ``take_pending``,
    ``apply_committed``, ``discard_pending``); a processor only reads and
    writes."""

    name: str
    partition: int
    committed: dict = attrs.field(factory=dict)  # encoded key -> encoded value
    next_offset: int = 0  # the changelog offset ``committed`` reaches
    pending: dict = attrs.field(factory=dict)  # encoded key -> encoded value, or None (deleted)
    record_writes: dict = attrs.field(factory=dict)

    # -- what a processor calls -------------------------------------------------------------------

    def get(self, key, default=None):
        encoded = encode_key(key)
        if encoded in self.record_writes:
            found = self.record_writes[encoded]
        elif encoded in self.pending:
            found = self.pending[encoded]
        else:
            found = self.committed.get(encoded)
        return default if found is None else json_value(found)

    def put(self, key, value) -> None:
        if value is None:
            raise StoreError("a store value cannot be None (use delete)")
        self.record_writes[encode_key(key)] = encode_value(value)

    def delete(self, key) -> None:
        self.record_writes[encode_key(key)] = None

    def __contains__(self, key) -> bool:
        return self.get(key) is not None

    def items(self):
        """Every (key, value) visible now, in key order (see the module doc)."""
        merged = dict(self.committed)
        merged.update(self.pending)
        merged.update(self.record_writes)
        for encoded in sorted(merged):
            value = merged[encoded]
            if value is not None:
                yield decode_key(encoded), json_value(value)

    def __len__(self) -> int:
        return sum(1 for _ in self.items())

    # -- what the runner calls ---------------------------------------------------------------------

    def end_record(self, ok: bool) -> bool:
        """Keep (``ok``) or drop the current record's writes; whether it wrote."""
        if not self.record_writes:
            return False
        if ok:
            self.pending.update(self.record_writes)
        self.record_writes.clear()
        return ok

    def apply_committed(self, changes: dict, next_offset: int) -> None:
        """The changelog has committed ``changes`` up to ``next_offset``."""
        committed = self.committed
        for key, value in changes.items():
            if value is None:
                committed.pop(key, None)
            else:
                committed[key] = value
        self.next_offset = next_offset

    def take_pending(self) -> dict:
        pending, self.pending = self.pending, {}
        return pending

    def discard_pending(self) -> None:
        self.pending = {}
        self.record_writes.clear()

    def reset(self, next_offset: int) -> None:
        """Forget everything (a rebuild from the changelog follows)."""
        self.committed = {}
        self.discard_pending()
        self.next_offset = next_offset


# -- the SQLite file ------------------------------------------------------------------------------------------

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS position (id INTEGER PRIMARY KEY CHECK (id = 0), changelog TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL);
"""


class StoreFile:
    """A shard's committed contents and changelog position in SQLite."""

    def __init__(self, path: str, changelog: str, partition: int):
        self.path = path
        self.changelog = changelog
        self.partition = partition
        self._db: aiosqlite.Connection | None = None
        self.discarded_reason: str | None = None  # why the file was thrown away on open, if it was

    async def open(self, *, load: bool = True) -> tuple[dict, int]:
        """Open (or create) the file: its (contents, next_offset), contents
        left empty unless ``load``. A file that is unreadable or belongs to
        another changelog is deleted and started afresh (the changelog
        rebuilds it), with ``discarded_reason`` set."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        try:
            return await self._open(load)
        except sqlite3.DatabaseError as error:
            await self._close_quietly()
            self.discarded_reason = f"unreadable ({error})"
        except _OtherChangelog as error:
            await self._close_quietly()
            self.discarded_reason = str(error)
        for suffix in ("", "-wal", "-shm", "-journal"):
            try:
                os.remove(self.path + suffix)
            except FileNotFoundError:
                pass
        return await self._open(load)

    async def _open(self, load: bool) -> tuple[dict, int]:
        self._db = await aiosqlite.connect(self.path, isolation_level=None)
        await self._db.execute("PRAGMA journal_mode=WAL")
        await self._db.execute("PRAGMA synchronous=NORMAL")
        await self._db.executescript(SCHEMA)
        async with self._db.execute("SELECT changelog, partition, next_offset FROM position WHERE id = 0") as cursor:
            row = await cursor.fetchone()
        if row is None:
            await self._db.execute("INSERT INTO position VALUES (0, ?, ?, 0)", (self.changelog, self.partition))
            return {}, 0
        if (row[0], row[1]) != (self.changelog, self.partition):
            raise _OtherChangelog(f"it holds {row[0]}-{row[1]}, not {self.changelog}-{self.partition}")
        if not load:
            return {}, row[2]
        async with self._db.execute("SELECT key, value FROM entries") as cursor:
            contents = {bytes(key): bytes(value) for key, value in await cursor.fetchall()}
        return contents, row[2]

    async def apply(self, changes: dict, next_offset: int) -> None:
        """Upsert and delete ``changes`` and move the position, atomically."""
        db = self._db
        await db.execute("BEGIN")
        try:
            upserts = [(key, value) for key, value in changes.items() if value is not None]
            deletes = [(key,) for key, value in changes.items() if value is None]
            if upserts:
                await db.executemany("INSERT INTO entries (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value", upserts)
            if deletes:
                await db.executemany("DELETE FROM entries WHERE key = ?", deletes)
            await db.execute("UPDATE position SET next_offset = ? WHERE id = 0", (next_offset,))
            await db.execute("COMMIT")
        except BaseException:
            await db.execute("ROLLBACK")
            raise

    async def clear(self, next_offset: int) -> None:
        """Empty the file and set its position (before a rebuild)."""
        db = self._db
        await db.execute("BEGIN")
        await db.execute("DELETE FROM entries")
        await db.execute("UPDATE position SET next_offset = ? WHERE id = 0", (next_offset,))
        await db.execute("COMMIT")

    async def close(self) -> None:
        if self._db is not None:
            db, self._db = self._db, None
            await db.close()

    async def _close_quietly(self) -> None:
        try:
            await self.close()
        except Exception:
            self._db = None


class _OtherChangelog(Exception):
    pass
