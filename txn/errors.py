"""The error taxonomy of onceflow's clients, as KIP-1050 groups Kafka's errors.

Every broker error code a client can meet falls in one class, and the class
says what the caller does about it:

| class | meaning | who handles it |
| --- | --- | --- |
| retriable | transient (leader moved, coordinator loading, timeout, connection lost) | the client, with bounded backoff, until ``delivery_timeout_ms``; only then surfaces as ``RetriesExhaustedError`` |
| abortable | this transaction cannot commit, the producer is fine | the caller aborts and goes on (``TransactionAbortableError``) |
| application-recoverable | this producer instance is dead (fenced, epoch stale) | the caller closes it and builds a new one (``ProducerFencedError``, ...) |
| invalid-configuration | authorization or configuration refused by the broker | the caller fixes configuration (``InvalidConfigurationError``) |
| fatal | anything else; the client cannot go on | ``FatalError`` |

``CommitOutcomeUnknownError`` is the case Jepsen found in Kafka's clients:
EndTxn(commit) was sent and no answer came. The transaction may have
committed; aborting now could hit the *next* transaction, so the producer
refuses to go on and must be re-initialized (``init_transactions`` resolves
the outcome: the coordinator completes the commit it decided on).
"""

from __future__ import annotations

from protocol.errors import ErrorCode, error_name


class KafkaError(Exception):
    """An error answered by a broker (``code``) or found by the client (code 0)."""

    def __init__(self, code: int = 0, context: str = "", *, message: str | None = None):
        self.code = ErrorCode(code) if code in ErrorCode._value2member_map_ else code
        self.context = context
        text = message if message is not None else error_name(code)
        super().__init__(f"{context}{': ' if context else ''}{text}")

    @property
    def retriable(self) -> bool:
        return isinstance(self.code, ErrorCode) and self.code.is_retriable


class RetriableError(KafkaError):
    """A transient error; raised to the caller only once retries ran out."""


class RetriesExhaustedError(RetriableError):
    """A retriable error kept happening until the delivery timeout."""


class BufferExhaustedError(RetriableError):
    """Records waiting to be sent filled ``buffer_memory`` for ``max_block_ms``:
    the brokers take them slower than they come (nothing was queued)."""


class TransactionAbortableError(KafkaError):
    """The open transaction cannot commit: abort it and continue."""


class ApplicationRecoverableError(KafkaError):
    """This producer instance can do nothing more: close it and start a new one."""


class ProducerFencedError(ApplicationRecoverableError):
    """Another instance with the same transactional id took over."""


class InvalidProducerEpochError(ApplicationRecoverableError):
    """The broker knows a newer epoch of this producer id."""


class InvalidConfigurationError(KafkaError):
    """The broker refused on authorization or configuration grounds."""


class FatalError(KafkaError):
    """The client cannot go on."""


class RecordBatchTooLargeError(FatalError):
    """A fetch brought back only part of the first record batch: nothing
    whole fits in what the consumer asked for, and fetching again would
    bring back the same part (``max.partition.fetch.bytes`` is too small)."""


class CommitOutcomeUnknownError(FatalError):
    """EndTxn(commit) was sent but its answer never came: never abort after it."""


class CommitFailedError(KafkaError):
    """An offset commit was refused because the group moved on (this member
    was fenced or a rebalance is running); poll again and commit what the
    new assignment holds."""


class ConfigError(ValueError):
    """A client configuration value is missing, unknown or invalid."""


ABORTABLE = {
    ErrorCode.TRANSACTION_ABORTABLE,
    ErrorCode.ILLEGAL_GENERATION,
    ErrorCode.UNKNOWN_MEMBER_ID,
    ErrorCode.REBALANCE_IN_PROGRESS,
    ErrorCode.FENCED_INSTANCE_ID,
    ErrorCode.UNKNOWN_PRODUCER_ID,
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
    ErrorCode.INVALID_RECORD,
    ErrorCode.MESSAGE_TOO_LARGE,
    ErrorCode.RECORD_LIST_TOO_LARGE,
    ErrorCode.INVALID_TIMESTAMP,
    ErrorCode.CORRUPT_MESSAGE,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.INVALID_TOPIC_EXCEPTION,
}
APPLICATION_RECOVERABLE = {
    ErrorCode.PRODUCER_FENCED: ProducerFencedError,
    ErrorCode.INVALID_PRODUCER_EPOCH: InvalidProducerEpochError,
}
INVALID_CONFIGURATION = {
    ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    ErrorCode.INVALID_TRANSACTION_TIMEOUT,
    ErrorCode.INVALID_CONFIG,
    ErrorCode.INVALID_REQUIRED_ACKS,
}


def classify(code: int, context: str = "", *, in_transaction: bool = False) -> KafkaError:
    """The exception for a broker error ``code`` (see the table above).

    Outside a transaction there is nothing to abort, so an abortable code is
    an ordinary ``FatalError`` for that one request (the record fails, the
    producer goes on)."""
    known = ErrorCode(code) if code in ErrorCode._value2member_map_ else None
    if known is not None and known.is_retriable:
        return RetriableError(code, context)
    if known in APPLICATION_RECOVERABLE:
        return APPLICATION_RECOVERABLE[known](code, context)
    if known in INVALID_CONFIGURATION:
        return InvalidConfigurationError(code, context)
    if in_transaction and known in ABORTABLE:
        return TransactionAbortableError(code, context)
    return FatalError(code, context)


# A transient failure, as a caller above the clients (a runner, a sink, a
# command) meets it: a retriable broker error (``RetriesExhaustedError`` once
# a client's own retries ran out) or a connection lost, refused or timed out
# (``OSError``: ConnectionError and TimeoutError are OSErrors). Such a
# caller backs off and tries again; anything else is not transient.
TRANSIENT_ERRORS = (RetriableError, OSError)

# Any failure of a request through a client: an error the broker answered or
# the client found (``KafkaError``), or the network's (``OSError``). For a
# caller that reports or works around every failure alike (an explanation
# that must not raise, a request retried on a new connection whatever went wrong).
CLIENT_FAILURES = (KafkaError, OSError)

# The group codes that say this member was fenced out of the generation it
# acted in: it rejoins (and its transaction, if any, aborts).
GROUP_FENCING = frozenset({ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION, ErrorCode.FENCED_INSTANCE_ID})


def is_retriable(error: BaseException) -> bool:
    """Whether the client should retry after ``error``."""
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    return isinstance(error, RetriableError) and not isinstance(error, RetriesExhaustedError)
