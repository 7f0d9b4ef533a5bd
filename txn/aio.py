"""The asyncio clients under the names users write: ``txn.aio.Producer``,
``txn.aio.Consumer``, ``txn.aio.Admin``, each an async context manager.

    async with txn.aio.Producer(bootstrap_servers=..., transactional_id="t") as producer:
        await producer.init_transactions()
        producer.begin_transaction()
        await producer.send("out", b"v")
        await producer.commit_transaction()
"""

from txn.admin import AsyncAdmin as Admin
from txn.consumer import AsyncConsumer as Consumer
from txn.producer import AsyncProducer as Producer
from txn.types import ConsumerRecord, GroupMetadata, OffsetAndMetadata, RecordMetadata, TopicPartition

__all__ = ["Admin", "Consumer", "ConsumerRecord", "GroupMetadata", "OffsetAndMetadata", "Producer", "RecordMetadata", "TopicPartition"]
