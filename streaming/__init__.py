"""Stream processing on top of ``txn`` (not built yet).

Will hold the processor API and consume-transform-produce runner, SQLite state
stores changelogged to the log, and the Spark Structured Streaming source and
exactly-once sink.
"""
