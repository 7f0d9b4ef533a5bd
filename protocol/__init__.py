"""Kafka wire format: primitive types, request/response schemas, error codes,
framing, the RecordBatch v2 codec (with CRC-32C and control records), and
Kafka's key-to-partition hashes (``partitioning``).

As the lowest room it also holds the few runtime helpers every room above
shares, so that each exists once: ``clock`` (the one clock), ``tasks``
(``cancel_and_wait``) and ``loop_thread`` (an event loop on a thread of its
own: the sync clients, the embedded broker, the threaded fault proxy).

Depends only on the standard library, attrs and crcmod; every other room that
touches bytes on the wire or on disk uses this one codec.
"""
