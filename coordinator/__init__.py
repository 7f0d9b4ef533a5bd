"""The transaction coordinator, sans I/O except for the producer-id mark.

- ``state``: the transaction states and the one table of their transitions
  (``transition()`` rejects what the table lacks);
- ``metadata``: ``TxnMetadata``, the frozen per-transactional-id value that
  is written to ``__transaction_state`` before it is applied;
- ``coordinator``: ``TransactionCoordinator`` (InitProducerId with epoch
  bumps and fencing, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn as a
  two-phase commit, timeouts, expiry, and ``recover()`` finishing whatever a
  crash left in a Prepare state), driving a state-log writer, a marker writer,
  a producer-id allocator and a crash-point callable that are passed in;
- ``txn_log``: the ``__transaction_state`` record layout (Kafka's
  TransactionLogKey/Value) and the partition of a transactional id;
- ``producer_ids``: producer ids reserved in durable blocks, never reused.

The broker (``broker.transactions``) gives it the logs, the marker writes and
the crash point; this package imports only ``protocol`` and ``storage``.
"""
