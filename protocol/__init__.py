"""The lowest room: the Kafka wire format, and the few pieces every room
above shares so that each exists once.

The wire format: primitive types and request/response schemas (``schema``,
``messages``), error codes (``errors``), constants, framing, the RecordBatch
v2 codec with CRC-32C and control records (``records``) and its columnar
twin over Arrow (``columnar``), compression codecs, Kafka's key-to-partition
hashes (``partitioning``), the ACL values the ACL APIs carry (``acls``) and
SCRAM's arithmetic and message syntax (``scram``); Kafka's rules for legal
topic names (``names``) and for configuration text, booleans and properties
files (``properties``).

Runtime pieces shared by the broker, the clients and the runner: ``clock``
(the one clock), ``tasks`` (``cancel_and_wait``, ``OwnedWork``), ``retry``
(the retry policies, one per kind of caller, and the loop that runs them),
``loop_thread`` (an event loop on a thread of its own: the sync clients, the
embedded broker, the threaded fault proxy) and ``metrics_http`` (the small
HTTP server of a Prometheus scrape endpoint).

Depends only on the standard library, attrs and crcmod (numpy and pyarrow for
``columnar``, cramjam for the optional codecs); every other room that
touches bytes on the wire or on disk uses this one codec.
"""
