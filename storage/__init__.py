"""The partition log on disk: segments (.log, .index, .timeindex), crash
recovery, retention, DeleteRecords, compaction, and topic-name validation.

Modules: ``log`` (PartitionLog, the API the broker uses: append, read,
wait_durable, offset_for_timestamp, retention, DeleteRecords, close),
``recovery`` (what opening a partition does after a stop: the checkpoint
file, the scan that truncates a torn tail, producer state rebuilt),
``group_commit`` (when appends become durable: group commit, flush.policy,
the failed state), ``segment`` (one segment's files), ``durable`` (the
DiskIO seam for fault injection and ``replace_file``, the one atomic and
durable way a file is rewritten), ``index`` (the sparse .index and
.timeindex, and the ``IndexBudget`` their owner passes in), ``cleaner``
(compaction and its crash-safe swap), ``config`` (LogConfig with Kafka's
setting names), ``names`` (topic names and partition directories),
``checksum`` (CRC-32C on the append and recovery paths), ``producer_state``
(idempotence, fencing, open transactions and their snapshots, which give the
last stable offset), ``txn_index`` (aborted transactions per segment) and
``dump_log`` (segment files printed as Kafka's DumpLogSegments prints them).
"""
