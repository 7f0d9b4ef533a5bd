"""The transaction coordinator (not built yet).

Will own the ``__transaction_state`` log, per-transactional-id metadata and its
state machine, producer-id allocation, two-phase commit with COMMIT/ABORT
markers, transaction timeouts, fencing, and recovery after a crash.
"""
