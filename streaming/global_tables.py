"""The runner's reader of global tables (``app.global_table``): one consumer
outside the group, assigned every partition of every global table's topic,
read_committed. ``restore`` reads each from the start to its end (the last
stable offset when it is asked) before the runner subscribes, so no record
is processed against a half-read table; ``catch_up`` applies what came
since, between polls. What a record does to a table is
``streaming.tables.GlobalStore.apply``."""

from __future__ import annotations

import logging
import time

from streaming.tables import GlobalStore
from txn.consumer import AsyncConsumer
from txn.errors import FatalError
from txn.types import TopicPartition

log = logging.getLogger("streaming.runner")

CATCH_UP_INTERVAL_SECONDS = 0.1  # how often, at most, the loop asks for new global records


class GlobalTableReader:
    def __init__(self, app, copies: dict[str, GlobalStore], client_options: dict):
        self.app = app
        self.copies = copies
        self.consumer = AsyncConsumer(app.bootstrap_servers, isolation_level="read_committed", **client_options)
        self.next_catch_up = 0.0

    async def restore(self, partition_counts: dict[str, int]) -> None:
        """Read every global table to its end; ``partition_counts`` are the cluster's topics."""
        missing = sorted(topic for topic in self.copies if topic not in partition_counts)
        if missing:
            raise FatalError(message=f"global table topic(s) {', '.join(missing)} do not exist: create them first")
        partitions = [TopicPartition(topic, p) for topic in sorted(self.copies) for p in range(partition_counts[topic])]
        self.consumer.assign(partitions)
        await self.consumer.seek_to_beginning(partitions)
        ends = await self.consumer.end_offsets(partitions)
        started, read = time.monotonic(), 0
        while True:
            behind = [tp for tp in partitions if await self.consumer.position(tp) < ends[tp]]
            if not behind:
                break
            if self.app.stopping:
                return
            read += self._apply(await self.consumer.poll(0.2))
        log.info("restored global table(s) %s: %d records in %.2f s (%s)", ", ".join(sorted(self.copies)), read, time.monotonic() - started,
                 ", ".join(f"{topic}: {len(copy)} keys" for topic, copy in sorted(self.copies.items())))

    async def catch_up(self) -> None:
        now = time.monotonic()
        if now < self.next_catch_up:
            return
        self.next_catch_up = now + CATCH_UP_INTERVAL_SECONDS
        self._apply(await self.consumer.poll(0))

    def _apply(self, records) -> int:
        copies = self.copies
        for raw in records:
            copies[raw.topic].apply(raw)
        return len(records)

    async def close(self) -> None:
        await self.consumer.close()
