"""Kafka wire format: primitive types, request/response schemas, error codes,
and the RecordBatch v2 codec (with CRC-32C and control records).

Depends only on the standard library, attrs and crcmod; every other room that
touches bytes on the wire or on disk uses this one codec.
"""
