"""onceflow's own Kafka-protocol clients (not built yet).

Will hold the idempotent and transactional producer, the read_committed
consumer with consumer groups, and an admin client, with sync and asyncio
APIs. Talks only over the wire, so it works against any Kafka broker.
"""
