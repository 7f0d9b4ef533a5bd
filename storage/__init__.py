"""The partition log on disk: segments (.log, .index, .timeindex), crash
recovery, retention, DeleteRecords, compaction, and topic-name validation.

Later: producer-state snapshots, the .txnindex, and the last stable offset.
"""
