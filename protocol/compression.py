"""Record-batch compression codecs (the three low bits of a batch's attributes).

none and gzip are always available (gzip from the standard library). snappy,
lz4 and zstd come from the one optional dependency ``cramjam`` (install the
``onceflow[compression]`` extra); when it is missing, using those codecs raises
``UnsupportedCompressionError`` naming the codec and the fix.

Kafka frames the codecs the way the Java client does: gzip is a gzip member,
lz4 is the LZ4 *frame* format, zstd a zstd frame, and snappy is raw snappy
(librdkafka and the Java client also accept the xerial-framed snappy that old
clients produce, so decompression accepts both).
"""

from __future__ import annotations

import enum
import gzip
import struct
import zlib


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class UnsupportedCompressionError(Exception):
    """A codec we cannot run here (unknown id, or cramjam is not installed)."""


try:  # optional: snappy, lz4 and zstd
    import cramjam as _cramjam
except ImportError:  # pragma: no cover - exercised only without the extra
    _cramjam = None

# xerial snappy framing: magic, version, compatible version, then
# (int32 length, chunk) pairs. Old Java clients wrote it; we only read it.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_INT32 = struct.Struct(">i")


def _require_cramjam(codec: Compression):
    if _cramjam is None:
        raise UnsupportedCompressionError(
            f"compression codec {codec.name.lower()} needs the optional package "
            f"cramjam (pip install 'onceflow[compression]')"
        )
    return _cramjam


def codec_from_id(codec_id: int) -> Compression:
    try:
        return Compression(codec_id)
    except ValueError:
        raise UnsupportedCompressionError(f"unknown compression codec id {codec_id}") from None


def compress(codec: Compression, data: bytes) -> bytes:
    if codec == Compression.NONE:
        return bytes(data)
    if codec == Compression.GZIP:
        return gzip.compress(data, compresslevel=6, mtime=0)
    cramjam = _require_cramjam(codec)
    if codec == Compression.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == Compression.LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise UnsupportedCompressionError(f"unknown compression codec {codec!r}")


def decompress(codec: Compression, data: bytes | memoryview) -> bytes:
    """Decompress ``data``; damaged input raises ``ValueError`` with the codec name."""
    if codec == Compression.NONE:
        return bytes(data)
    try:
        if codec == Compression.GZIP:
            return zlib.decompress(bytes(data), wbits=47)  # gzip or zlib header
        cramjam = _require_cramjam(codec)
        if codec == Compression.SNAPPY:
            raw = bytes(data)
            if raw.startswith(_XERIAL_MAGIC):
                return _decompress_xerial(cramjam, raw)
            return bytes(cramjam.snappy.decompress_raw(raw))
        if codec == Compression.LZ4:
            return bytes(cramjam.lz4.decompress(bytes(data)))
        if codec == Compression.ZSTD:
            return bytes(cramjam.zstd.decompress(bytes(data)))
    except UnsupportedCompressionError:
        raise
    except Exception as exc:  # each library raises its own type; unify them
        raise ValueError(f"{codec.name.lower()} data does not decompress: {exc}") from exc
    raise UnsupportedCompressionError(f"unknown compression codec {codec!r}")


def _decompress_xerial(cramjam, raw: bytes) -> bytes:
    position = 16  # magic (8) + version (4) + compatible version (4)
    chunks = []
    while position < len(raw):
        if position + 4 > len(raw):
            raise ValueError("xerial snappy chunk length is truncated")
        (length,) = _INT32.unpack_from(raw, position)
        position += 4
        if length < 0 or position + length > len(raw):
            raise ValueError("xerial snappy chunk overruns the data")
        chunks.append(bytes(cramjam.snappy.decompress_raw(raw[position : position + length])))
        position += length
    return b"".join(chunks)
