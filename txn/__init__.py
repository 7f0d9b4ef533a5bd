"""onceflow's own Kafka-protocol clients, in pure Python.

``Producer`` (idempotent by default, transactional with a
``transactional_id``), ``Consumer`` (read_committed by default; ``assign`` or
``subscribe`` to a consumer group) and ``Admin`` are synchronous facades over
the asyncio clients in ``txn.aio``. They talk to brokers only over the Kafka
wire protocol, so they work against any Kafka-compatible broker.

    from txn import Producer, Consumer, TopicPartition

    with Producer(bootstrap_servers="localhost:9092", transactional_id="copier-1") as producer:
        producer.init_transactions()
        with producer.transaction():
            producer.send("out", b"value", key=b"key")
"""

from txn.admin import Admin
from txn.config import AdminConfig, ConsumerConfig, ProducerConfig
from txn.consumer import Consumer
from txn.errors import (
    ApplicationRecoverableError,
    CommitFailedError,
    CommitOutcomeUnknownError,
    ConfigError,
    FatalError,
    InvalidConfigurationError,
    InvalidProducerEpochError,
    KafkaError,
    ProducerFencedError,
    RecordBatchTooLargeError,
    RetriableError,
    RetriesExhaustedError,
    TransactionAbortableError,
)
from txn.producer import Producer, TransactionHandle
from txn.types import ConsumerRecord, GroupMetadata, OffsetAndMetadata, RecordMetadata, TopicPartition

__all__ = [
    "Admin",
    "AdminConfig",
    "ApplicationRecoverableError",
    "CommitFailedError",
    "CommitOutcomeUnknownError",
    "ConfigError",
    "Consumer",
    "ConsumerConfig",
    "ConsumerRecord",
    "FatalError",
    "GroupMetadata",
    "InvalidConfigurationError",
    "InvalidProducerEpochError",
    "KafkaError",
    "OffsetAndMetadata",
    "Producer",
    "ProducerConfig",
    "ProducerFencedError",
    "RecordBatchTooLargeError",
    "RecordMetadata",
    "RetriableError",
    "RetriesExhaustedError",
    "TopicPartition",
    "TransactionAbortableError",
    "TransactionHandle",
]
